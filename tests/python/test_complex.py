"""complex64 and complex128 on tpu: storage, copies, printing, arithmetic,
reductions, products, the views between complex and real (view_as_real,
.real / .imag, conj), complex Python numbers and autograd, against CPU.

Ops whose rules are not written for complex values (lowering/complex.cpp
lists those that are) run on the CPU fallback, or raise with the fallback off.
"""

import pytest
import torch

import torch_tpu


def pair(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, dtype=dtype, generator=g)
    return x, x.to("tpu")


def close(actual, expected, **kw):
    assert actual.device.type == "tpu", actual.device
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual.cpu(), expected, **kw)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_round_trip_and_printing(dtype):
    c, t = pair(3, 4, dtype=dtype)
    assert torch.equal(t.cpu(), c)
    assert " ".join(repr(t).split()).replace(", device='tpu:0'", "") == " ".join(repr(c).split())
    assert t[1, 2].item() == c[1, 2].item()


UNARY = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "reciprocal": torch.reciprocal,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "abs": torch.abs,
    "sgn": torch.sgn,
    "angle": torch.angle,
    "conj_physical": torch.conj_physical,
    "square": torch.square,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "sum": torch.sum,
    "mean_dim": lambda x: x.mean(1),
    "prod_dim": lambda x: x.prod(0),
    "cumsum": lambda x: x.cumsum(1),
    "var": lambda x: x.var(1),
    "std_mean": lambda x: torch.std_mean(x, 0),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=1),
    "reflection_pad": lambda x: torch.nn.functional.pad(x[None], (2, 1), mode="reflect"),
    "flip": lambda x: x.flip(0),
    "transposed_copy": lambda x: x.t().contiguous(),
    "sinc": torch.sinc,
    "silu": torch.nn.functional.silu,
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "trace": lambda x: torch.trace(x[:, :4]),
    "matrix_exp": lambda x: torch.linalg.matrix_exp(x[:, :4]),
    "count_nonzero": lambda x: torch.count_nonzero(x * (x.real > 0), 1),
    "any": lambda x: (x * (x.real > 0)).any(0),
    "linspace": lambda x: torch.linspace(1 + 2j, -3j, 7, device=x.device),
    "logspace": lambda x: torch.logspace(1 + 2j, -3j, 7, base=2.0, device=x.device),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_cpu_natively(name):
    c, t = pair(4, 5)
    with torch_tpu.set_fallback("error"):
        out = UNARY[name](t)
    expected = UNARY[name](c)
    for o, e in zip(out, expected, strict=True) if isinstance(out, tuple) else [(out, expected)]:
        close(o, e, rtol=1e-5, atol=1e-5)


BINARY = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
    "eq": lambda a, b: a == b,
    "mm": lambda a, b: a @ b.T,
    "mm_conj_transpose": lambda a, b: a @ b.mH,  # a conjugate view reaches mm with its bit set
    "vdot": lambda a, b: torch.vdot(a.flatten(), b.flatten()),
    "where": lambda a, b: torch.where(a.real > 0, a, b),
    "cat": lambda a, b: torch.cat([a, b], 1),
    "complex_number": lambda a, b: a * (2 - 1j) + 1j,
    "addmm_complex_alpha": lambda a, b: torch.addmm(a[:, :4], a, b.T, beta=0.5j, alpha=1 + 1j),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3 - 0.6j),
    "lerp_tensor": lambda a, b: torch.lerp(a, b, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_matches_cpu_natively(name):
    (a, ta), (b, tb) = pair(4, 4, seed=1), pair(4, 4, seed=2)
    with torch_tpu.set_fallback("error"):
        out = BINARY[name](ta, tb)
    close(out, BINARY[name](a, b), rtol=2e-5, atol=2e-5)


def test_type_promotion():
    c, t = pair(3)
    d = torch.randn(3, dtype=torch.float64)
    with torch_tpu.set_fallback("error"):
        close(t + d.to("tpu"), c + d)  # complex64 with float64 is complex128
        close(t * 2.5, c * 2.5)
        close(t.to(torch.complex128), c.to(torch.complex128))
        close(torch.arange(3, device="tpu") + 1j, torch.arange(3) + 1j)
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        close(t.to(torch.float32), c.to(torch.float32))


def test_views_between_complex_and_real_share_storage():
    c, t = pair(4)
    for x in (c, t):
        r = torch.view_as_real(x)
        r[:, 1].mul_(-1)  # conjugates x in place through its float view
        x.imag.add_(1)
        x.real[0] = 7
    close(t, c)
    close(torch.view_as_real(t), torch.view_as_real(c))
    back = torch.view_as_complex(torch.view_as_real(t))
    back.mul_(1j)
    c.mul_(1j)
    close(t, c)


def test_building_complex_values():
    re, im = torch.randn(5), torch.randn(5)
    with torch_tpu.set_fallback("error"):
        close(torch.complex(re.to("tpu"), im.to("tpu")), torch.complex(re, im))
        close(torch.polar(re.abs().to("tpu"), im.to("tpu")), torch.polar(re.abs(), im))
        z = torch.zeros(3, dtype=torch.complex64, device="tpu")
        z.fill_(1 - 2j)
        close(z, torch.full((3,), 1 - 2j))
        close(torch.full((2, 2), 3j, device="tpu"), torch.full((2, 2), 3j))


def test_conjugate_views():
    c, t = pair(3, 3)
    assert t.conj().is_conj()
    with torch_tpu.set_fallback("error"):
        close(t.conj().resolve_conj(), c.conj().resolve_conj())
        close(t.conj() * 2, c.conj() * 2)
        dst_c, dst_t = torch.zeros_like(c), torch.zeros_like(t)
        dst_c.conj().copy_(c)  # a write through a conjugate view stores the conjugate
        dst_t.conj().copy_(t)
        close(dst_t, dst_c)
        neg_c, neg_t = torch.zeros_like(c), torch.zeros_like(t)
        neg_c._neg_view().copy_(c.conj())
        neg_t._neg_view().copy_(t.conj())
        close(neg_t, neg_c)


def test_autograd():
    c, t = pair(6)
    xs = [c.clone().requires_grad_(), t.clone().requires_grad_()]
    for x in xs:
        (x * x.conj() + x.exp()).abs().sum().backward()
    close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-5)


def test_ops_without_complex_rules_fall_back_or_raise():
    c, t = pair(4, 4)
    # atan has a rule, for real values only.
    close(torch.atan(t), torch.atan(c), rtol=1e-5, atol=1e-5)  # on the CPU fallback
    with torch_tpu.set_fallback("error"), pytest.raises(RuntimeError, match="no rule for complex values"):
        torch.atan(t)


FFT = {
    "fft": lambda t: torch.fft.fft(t),
    "fft_dim1_n5": lambda t: torch.fft.fft(t, n=5, dim=1),
    "ifft_ortho": lambda t: torch.fft.ifft(t, norm="ortho"),
    "fft2": lambda t: torch.fft.fft2(t),
    "fftn_forward_4d": lambda t: torch.fft.fftn(t.reshape(2, 2, 6, 8), norm="forward"),  # 4 dims: one at a time
    "rfft": lambda t: torch.fft.rfft(t.real),
    "irfft_odd": lambda t: torch.fft.irfft(torch.fft.rfft(t.real[..., :7]), n=7),
    "rfft2": lambda t: torch.fft.rfft2(t.real),
    "irfftn": lambda t: torch.fft.irfftn(torch.fft.rfftn(t.real), s=t.shape),
    "hfft": lambda t: torch.fft.hfft(t),
    "ihfft": lambda t: torch.fft.ihfft(t.real),
}


@pytest.mark.parametrize("name", sorted(FFT))
def test_fft_matches_cpu_natively(name):
    c, t = pair(4, 6, 8)
    with torch_tpu.set_fallback("error"):
        out = FFT[name](t)
    close(out, FFT[name](c), rtol=1e-4, atol=1e-4)
