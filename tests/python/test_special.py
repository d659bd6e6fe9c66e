"""torch.special's functions lowered in csrc/lowering/special.cpp (orthogonal
polynomials, Bessel functions) against CPU with the fallback off, over the
points where PyTorch's kernels branch: the ends of [-1, 1], negative, zero and
non-finite degrees, and both sides of every switch between methods."""

import math

import pytest
import torch

import torch_tpu

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

BESSEL = [
    "i0",
    "i0e",
    "i1",
    "i1e",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "spherical_bessel_j0",
]

EDGES = [0.0, 0.5, -0.5, 1.0, -1.0, 1e-3, math.nan, math.inf, -math.inf]
TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def same(name, fn, *cpu_args, dtype, tol=None):
    with torch_tpu.set_fallback("error"):
        tpu = fn(*[a.to("tpu") for a in cpu_args]).cpu()
    tol = tol or TOL[dtype]
    torch.testing.assert_close(tpu, fn(*cpu_args), equal_nan=True, msg=lambda m: f"{name}: {m}", **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial(name, dtype):
    # Not x = NaN: several of PyTorch's kernels return an uninitialized value
    # there for n >= 2 (the loop stops on NaN before its first step); ours is NaN.
    x = torch.cat([torch.linspace(-3, 3, 25), torch.tensor([e for e in EDGES if e == e] + [1.5, -1.5, 0.75])])
    n = torch.tensor([-2.0, -1, 0, 1, 2, 3, 5, 6, 7, 8, 9, 12, 2.7, math.nan, math.inf, -math.inf])
    grid = [t.contiguous().to(dtype) for t in torch.broadcast_tensors(x[:, None], n[None])]
    # float32: the closed forms near y = +-1 (x = 1e-3 shifted) amplify one
    # ulp of acos to a few ulps of the result, on CPU as here.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else None
    same(name, getattr(torch.special, name), *grid, dtype=dtype, tol=tol)
    # Degree 200: 200 roundings (or the closed form's 200 theta) apart from
    # CPU's order of operations, within a looser tolerance.
    # Not near y = -1 (x = 1e-3 shifted), where sin(201 theta) / sin(theta) is
    # ill-conditioned (0.1% apart in float32).
    fn, x = getattr(torch.special, name), x[x != 1e-3].to(dtype)
    with torch_tpu.set_fallback("error"):
        tpu = fn(x.to("tpu"), 200).cpu()
    rtol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(tpu, fn(x, 200), rtol=rtol, atol=rtol, equal_nan=True)


def test_polynomial_int_inputs_and_scalars():
    x, n = torch.tensor([-2, 0, 1, 3]), torch.tensor([3, -1, 4, 0])
    same("chebyshev_polynomial_t", torch.special.chebyshev_polynomial_t, x, n, dtype=torch.float32)
    same("legendre n=3", lambda x: torch.special.legendre_polynomial_p(x, 3), x.float(), dtype=torch.float32)
    same("hermite x=0.5", lambda n: torch.special.hermite_polynomial_h(0.5, n), n.float(), dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", BESSEL)
def test_bessel(name, dtype):
    switches = [0.4999, 0.5, 0.999, 1.0, 1.001, 19.99, 20.0, 20.01, 88.0, 700.0, 1e5]
    x = torch.cat([torch.linspace(-40, 40, 321), torch.tensor(EDGES + switches + [-s for s in switches])]).to(dtype)
    fn = getattr(torch.special, name)
    if name.startswith("bessel_") and dtype == torch.float64:
        # PyTorch's own float64 J0/J1/Y0/Y1 are off by up to 1e-7 (near x = 5;
        # its rational approximations): the reference for finite x is mpmath.
        import mpmath

        exact_fn = mpmath.besselj if name[-2] == "j" else mpmath.bessely
        exact_points = x.isfinite() & ((x > 0) | (name[-2] == "j"))
        middle = x[exact_points]
        with torch_tpu.set_fallback("error"):
            tpu = fn(middle.to("tpu")).cpu()
        exact = torch.tensor([float(exact_fn(int(name[-1]), float(v))) for v in middle], dtype=dtype)
        torch.testing.assert_close(tpu, exact, rtol=1e-12, atol=1e-14)  # x = 1e5: the phase x - pi/4 rounds
        x = x[~exact_points]
    same(name, fn, x, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfcx_log_ndtr_ndtri(dtype):
    """Both sides of every switch (erfcx's continued fraction from 2, log_ndtr's
    branch at -1), exp(x^2) overflowing, and ndtri down to p = 1e-37."""
    x = torch.cat([torch.linspace(-30, 30, 241), torch.tensor([-1.0001, 1.99, 2.01, 1e10, -9.3, -9.4] + EDGES)])
    p = torch.cat([torch.linspace(0, 1, 101), torch.logspace(-37, -1, 37), torch.tensor([0.4999, 0.5001, -0.1, 1.1])])
    same("erfcx", torch.special.erfcx, x.to(dtype), dtype=dtype)
    same("log_ndtr", torch.special.log_ndtr, x.to(dtype), dtype=dtype)
    same("ndtri", torch.special.ndtri, p.to(dtype), dtype=dtype)


def test_assert_async():
    with torch_tpu.set_fallback("error"):
        torch._assert_async(torch.tensor(2.0, device="tpu"))
        token = torch.ops.aten._functional_assert_async.msg(
            torch.tensor(1, device="tpu"), "x", torch.empty(0, device="tpu")
        )
        assert token.device.type == "tpu" and token.numel() == 0
        with pytest.raises(RuntimeError, match="my message"):
            torch.ops.aten._assert_async.msg(torch.tensor(False, device="tpu"), "my message")
            torch.tpu.synchronize()
        with pytest.raises(RuntimeError, match="single nonzero value"):
            torch._assert_async(torch.tensor(0, device="tpu"))
            torch.tpu.synchronize()
    assert torch.ones(2, device="tpu").sum().item() == 2  # the process goes on


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_incomplete_gamma(name):
    """float32 against CPU, from small a to a ~ x ~ 300 (where a log x rounds)
    and the boundary values; float64 against mpmath (PyTorch's own float64 is
    1e-10 off near a ~ x ~ 200)."""
    import mpmath

    g = torch.Generator().manual_seed(0)
    a = torch.cat([torch.rand(200, generator=g) * 10, torch.rand(60, generator=g) * 300])
    x = torch.cat([torch.rand(200, generator=g) * 12, a[200:] * (0.8 + 0.4 * torch.rand(60, generator=g))])
    edges_a = torch.tensor([0.0, 0.0, 1, 2, 1e-3, math.inf, 5, math.inf, -1, 3, math.nan])
    edges_x = torch.tensor([1.0, 0, 0, math.inf, 2, 3, math.inf, math.inf, 1, -2, 1])
    fn = getattr(torch, name)
    same(name, fn, torch.cat([a, edges_a]), torch.cat([x, edges_x]), dtype=torch.float32)
    a64, x64 = a[::4].double(), x[::4].double()
    with torch_tpu.set_fallback("error"):
        tpu = fn(a64.to("tpu"), x64.to("tpu")).cpu()
    exact = [
        mpmath.gammainc(u, 0 if name == "igamma" else v, v if name == "igamma" else mpmath.inf, regularized=True)
        for u, v in zip(a64.tolist(), x64.tolist(), strict=True)
    ]
    torch.testing.assert_close(
        tpu, torch.tensor([float(e) for e in exact], dtype=torch.float64), rtol=1e-12, atol=1e-14
    )
