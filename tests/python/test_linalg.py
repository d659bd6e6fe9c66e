"""Matrix factorizations and solves (csrc/lowering/factorizations.cpp), against
CPU with the fallback off: values, batching and broadcasting, singular and
non-positive-definite inputs (info and PyTorch's own errors), autograd."""

import pytest
import torch
from conftest import compare_fn

import torch_tpu

TOL = {"atol": 1e-4, "rtol": 1e-4}


def spd(*batch, n=4):
    a = torch.randn(*batch, n, n)
    return a @ a.mT + n * torch.eye(n)


def same(fn, *inputs, tol=TOL):
    """fn's outputs (a tensor or a tuple of them) on tpu and CPU, fallback off."""
    expected = fn(*inputs)
    with torch_tpu.set_fallback("error"):
        actual = fn(*[x.to("tpu") for x in inputs])
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for a, e in zip(actual, expected, strict=True):
        assert a.device.type == "tpu" and a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape)
        torch.testing.assert_close(a.cpu(), e, **tol)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    a = spd(3)
    same(lambda x: torch.linalg.cholesky_ex(x, upper=upper), a)
    same(lambda x: torch.cholesky(x, upper=upper), a[0])
    factor = torch.linalg.cholesky(a, upper=upper)
    b = torch.randn(3, 4, 2)
    same(lambda f, y: torch.cholesky_solve(y, f, upper=upper), factor, b)
    same(lambda f: torch.cholesky_inverse(f, upper=upper), factor[1])


def test_cholesky_of_a_matrix_that_is_not_positive_definite():
    a = -spd(2)
    # info: the failing minor, as LAPACK reports it (L past it differs: LAPACK stops there)
    same(lambda x: torch.linalg.cholesky_ex(x).info, a[:1])
    with pytest.raises(RuntimeError, match="not positive-definite"):
        torch.linalg.cholesky(a.to("tpu"))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_solve_triangular(left, upper, unit):
    a = torch.randn(2, 1, 4, 4) + 4 * torch.eye(4)  # broadcast against b's batch
    b = torch.randn(3, 4, 5) if left else torch.randn(3, 5, 4)
    same(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left, unitriangular=unit), a, b)


@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve(transpose):
    a, b = torch.randn(3, 4, 4) + 4 * torch.eye(4), torch.randn(3, 4, 2)
    same(lambda y, x: torch.triangular_solve(y, x, upper=False, transpose=transpose), b, a)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 5, 3), (2, 3, 5)])
def test_lu_factor_and_unpack(shape):
    a = torch.randn(*shape)
    same(torch.linalg.lu_factor_ex, a)
    same(torch.linalg.lu, a)
    same(lambda x: torch.lu_unpack(*torch.linalg.lu_factor(x)), a)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    a, b = torch.randn(3, 4, 4), torch.randn(3, 4, 2)
    lu, pivots = torch.linalg.lu_factor(a)
    same(lambda f, p, y: torch.linalg.lu_solve(f, p, y, left=left, adjoint=adjoint), lu, pivots, b if left else b.mT)


def test_solve_inverse_and_determinants():
    a = torch.randn(3, 4, 4)
    same(torch.linalg.solve, a, torch.randn(3, 4, 2))
    same(torch.linalg.solve, a, torch.randn(3, 4))  # a batch of vectors
    same(torch.linalg.solve, a[0], torch.randn(2, 3, 4, 1))  # A broadcast over B's batch
    same(lambda x, y: torch.linalg.solve(x, y, left=False), a, torch.randn(3, 2, 4))
    same(torch.linalg.inv, a)
    same(torch.linalg.det, a)
    same(torch.linalg.slogdet, a)


def test_singular_matrices():
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    same(torch.linalg.det, singular)
    same(torch.linalg.slogdet, singular)
    same(torch.linalg.lu_factor_ex, torch.zeros(2, 3, 3))  # info: the first zero pivot
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.inv(singular.to("tpu"))


def test_gradients():
    compare_fn(torch.linalg.solve, torch.randn(3, 4, 4), torch.randn(3, 4, 2), tol={"atol": 1e-3, "rtol": 1e-3})
    compare_fn(torch.linalg.cholesky, spd(2), tol={"atol": 1e-3, "rtol": 1e-3})
    compare_fn(torch.linalg.det, torch.randn(2, 3, 3), tol={"atol": 1e-3, "rtol": 1e-3})
    compare_fn(lambda a: torch.linalg.det(a.mT), torch.randn(2, 3, 3), tol={"atol": 1e-3, "rtol": 1e-3})
    compare_fn(lambda a: torch.linalg.slogdet(a).logabsdet, torch.randn(2, 3, 3), tol={"atol": 1e-3, "rtol": 1e-3})
    compare_fn(torch.linalg.inv, torch.randn(3, 3) + 3 * torch.eye(3), tol={"atol": 1e-3, "rtol": 1e-3})


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 6), (2, 1, 4, 4)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(shape, mode):
    same(lambda x: torch.linalg.qr(x, mode=mode), torch.randn(*shape))


def test_geqrf_householder_product_and_ormqr():
    a = torch.randn(2, 5, 3)
    same(torch.geqrf, a)
    packed, tau = torch.geqrf(a)
    same(torch.linalg.householder_product, packed, tau)
    same(torch.linalg.householder_product, packed, tau[..., :2])  # fewer reflectors than columns
    for left, transpose in [(True, False), (True, True), (False, False), (False, True)]:
        other = torch.randn(2, 5, 4) if left else torch.randn(2, 4, 5)
        same(lambda p, t, o, lf=left, tr=transpose: torch.ormqr(p, t, o, left=lf, transpose=tr), packed, tau, other)


def test_qr_gradient():
    compare_fn(lambda a: torch.linalg.qr(a)[1], torch.randn(5, 3), tol={"atol": 1e-3, "rtol": 1e-3})


def reconstruct(u, s, vh):
    k = s.shape[-1]
    return u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :]


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 3), (2, 3, 5), (6, 1), (0, 3), (2, 0, 0)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(shape, full):
    """Singular values as CPU's; vectors unique up to sign, so checked by
    magnitude, orthonormality (the completion of a full U included) and by
    reconstructing A."""
    a = torch.randn(*shape)
    with torch_tpu.set_fallback("error"):
        u, s, vh = (x.cpu() for x in torch.linalg.svd(a.to("tpu"), full_matrices=full))
    uc, sc, vhc = torch.linalg.svd(a, full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (uc.shape, sc.shape, vhc.shape)
    torch.testing.assert_close(s, sc, **TOL)
    torch.testing.assert_close(reconstruct(u, s, vh), a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(u.mT @ u, torch.eye(u.shape[-1]).expand(*u.shape[:-2], -1, -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(vh @ vh.mT, torch.eye(vh.shape[-2]).expand(*vh.shape[:-2], -1, -1), atol=1e-5, rtol=0)
    k = s.shape[-1]
    torch.testing.assert_close(u[..., :k].abs(), uc[..., :k].abs(), **TOL)


def test_svd_of_rank_deficient_matrices_is_orthonormal():
    for a in (torch.zeros(3, 3), torch.ones(4, 2)):
        with torch_tpu.set_fallback("error"):
            u, s, vh = (x.cpu() for x in torch.linalg.svd(a.to("tpu")))
        torch.testing.assert_close(s, torch.linalg.svdvals(a), **TOL)
        torch.testing.assert_close(u.mT @ u, torch.eye(u.shape[-1]), atol=1e-5, rtol=0)
        torch.testing.assert_close(reconstruct(u, s, vh), a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(uplo):
    a = torch.randn(3, 5, 5)  # not symmetric: only the named triangle is read
    with torch_tpu.set_fallback("error"):
        w, v = (x.cpu() for x in torch.linalg.eigh(a.to("tpu"), UPLO=uplo))
    wc, vc = torch.linalg.eigh(a, UPLO=uplo)
    torch.testing.assert_close(w, wc, **TOL)
    torch.testing.assert_close(v.abs(), vc.abs(), **TOL)
    same(lambda x: torch.linalg.eigvalsh(x, UPLO=uplo), a)


def test_svd_and_eigh_gradients():
    tol = {"atol": 1e-3, "rtol": 1e-3}
    compare_fn(torch.linalg.svdvals, torch.randn(4, 3), tol=tol)
    compare_fn(lambda a: torch.linalg.eigvalsh(a + a.mT), torch.randn(4, 4), tol=tol)
    compare_fn(torch.linalg.pinv, torch.randn(3, 4), tol=tol)


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 3), (2, 3, 5)])
def test_lstsq(driver, shape):
    a = torch.randn(*shape)
    b = torch.randn(*shape[:-1], 2)
    same(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver=driver)), a, b)
    same(lambda x, y: torch.linalg.lstsq(x, y, driver=driver).solution, a, b[..., 0])  # a vector b


def test_lstsq_of_a_rank_deficient_matrix():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    b = torch.tensor([[1.0], [2.0], [2.0]])
    same(lambda x, y: (torch.linalg.lstsq(x, y).solution, torch.linalg.lstsq(x, y).rank), a, b)
    compare_fn(
        lambda x, y: torch.linalg.lstsq(x, y).solution,
        torch.randn(5, 3),
        torch.randn(5, 2),
        tol={"atol": 1e-3, "rtol": 1e-3},
    )


def test_complex_factorizations_and_solves():
    # Conjugates where real code transposes: LU pivots on |re| + |im| as LAPACK
    # does, Householder QR with complex tau, Cholesky of a Hermitian matrix,
    # solves with A^H, and determinants with unit complex signs.
    torch.manual_seed(0)
    c64 = torch.complex64
    a, b = torch.randn(3, 4, 4, dtype=c64), torch.randn(3, 4, 2, dtype=c64)
    h = a @ a.mH + 4 * torch.eye(4)
    same(torch.linalg.lu_factor_ex, a)
    factor, pivots = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        same(lambda f, y, adj=adjoint: torch.linalg.lu_solve(f, pivots.to(f.device), y, adjoint=adj), factor, b)
        same(
            lambda f, y, adj=adjoint: torch.linalg.lu_solve(f, pivots.to(f.device), y, left=False, adjoint=adj),
            factor,
            b.mT,
        )
    for fn in (torch.linalg.solve, lambda x, y: torch.linalg.solve(x, y.mT, left=False)):
        same(fn, a, b)
    for fn in (torch.linalg.inv, torch.linalg.det, torch.linalg.slogdet, torch.linalg.lu):
        same(fn, a)
    same(torch.linalg.cholesky_ex, h)
    lower = torch.linalg.cholesky(h)
    same(lambda f, y: torch.cholesky_solve(y, f), lower, b)
    same(lambda f, y: torch.cholesky_solve(y, f, upper=True), lower.mH, b)
    same(torch.cholesky_inverse, lower[0])
    t = torch.triu(a) + 3 * torch.eye(4)
    same(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), t, b)
    same(lambda x, y: torch.triangular_solve(y, x, transpose=True), t, b)
    same(torch.linalg.qr, a)
    same(torch.geqrf, a)
    packed, tau = torch.geqrf(a)
    same(torch.linalg.householder_product, packed, tau)
    for left in (True, False):
        for transpose in (False, True):
            same(lambda x, tt, y, lf=left, tr=transpose: torch.ormqr(x, tt, y, left=lf, transpose=tr), packed, tau, a)


@pytest.mark.parametrize("shape", [(3, 5, 4), (3, 4, 6)])
def test_complex_svd_eigh_and_lstsq(shape):
    torch.manual_seed(0)
    m = torch.randn(*shape, dtype=torch.complex64)
    with torch_tpu.set_fallback("error"):
        u, s, vh = torch.linalg.svd(m.to("tpu"), full_matrices=False)
        torch.testing.assert_close(((u * s.unsqueeze(-2).to(u.dtype)) @ vh).cpu(), m, **TOL)
        torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(m), **TOL)
        u, _, _ = torch.linalg.svd(m.to("tpu"))
        torch.testing.assert_close((u.mH @ u).cpu(), torch.eye(shape[1], dtype=m.dtype).expand_as(u.cpu()), **TOL)
        h = m @ m.mH
        w, v = torch.linalg.eigh(h.to("tpu"))
        torch.testing.assert_close(w.cpu(), torch.linalg.eigvalsh(h), **TOL)
        torch.testing.assert_close(((v * w.unsqueeze(-2).to(v.dtype)) @ v.mH).cpu(), h, **TOL)
    tall = m if shape[1] > shape[2] else m.mT
    same(lambda x, y: torch.linalg.lstsq(x, y).solution, tall, torch.randn(3, tall.shape[1], 2, dtype=m.dtype))
    same(torch.linalg.pinv, m)
