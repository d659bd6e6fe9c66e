"""Every supported dtype through representative ops, against CPU PyTorch."""

import pytest
import torch
from conftest import assert_same

import torch_tpu

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


def sample(dtype, shape=(4, 5)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 100 if dtype == torch.uint8 else 50, shape, generator=g).to(dtype)


def tol(dtype):
    return {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.bfloat16, torch.float16) else {}


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_roundtrip_and_elementwise(dtype):
    a, b = sample(dtype), sample(dtype).flip(0)
    with torch_tpu.set_fallback("error"):
        assert torch.equal(a.to("tpu").cpu(), a)
        if dtype != torch.bool:
            assert_same(a.to("tpu") + b.to("tpu"), a + b, **tol(dtype))
            assert_same(a.to("tpu") * 2, a * 2, **tol(dtype))
            assert_same(torch.maximum(a.to("tpu"), b.to("tpu")), torch.maximum(a, b))
        assert_same(a.to("tpu") == b.to("tpu"), a == b)
        assert_same(torch.where(a.to("tpu") > b.to("tpu"), a.to("tpu"), b.to("tpu")), torch.where(a > b, a, b))
        assert_same(a.to("tpu").sum(0), a.sum(0), **tol(dtype))
        assert_same(a.to("tpu").t().contiguous(), a.t().contiguous())


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_math(dtype):
    a = sample(dtype)
    with torch_tpu.set_fallback("error"):
        assert_same(torch.exp(a.to("tpu") / 4), torch.exp(a / 4), **tol(dtype))
        assert_same(torch.relu(a.to("tpu")), torch.relu(a))
        assert_same(torch.softmax(a.to("tpu"), -1), torch.softmax(a, -1), **tol(dtype))
        assert_same(a.to("tpu") @ a.to("tpu").t(), a @ a.t(), **({"atol": 0.5, "rtol": 2e-2} if tol(dtype) else {}))
        assert_same(a.to("tpu").mean(1), a.mean(1), **tol(dtype))


@pytest.mark.parametrize("dtype", INTS)
def test_int_division_and_conversion(dtype):
    a, b = sample(dtype), sample(dtype).clamp(min=1)
    with torch_tpu.set_fallback("error"):
        assert_same(torch.div(a.to("tpu"), b.to("tpu"), rounding_mode="floor"), torch.div(a, b, rounding_mode="floor"))
        assert_same(a.to("tpu") / b.to("tpu"), a / b)
        assert_same(a.to("tpu").float(), a.float())
        assert_same(a.to("tpu").to(torch.bool), a.to(torch.bool))


def test_bool_scalar_reads():
    assert bool(torch.tensor([1.0], device="tpu")) is True
    assert torch.tensor(3, device="tpu").item() == 3
    assert torch.tensor([[1, 2]], dtype=torch.int16, device="tpu").tolist() == [[1, 2]]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_wide_unsigned_dtypes(dtype):
    """uint16 / uint32 / uint64 (PyTorch's barebones unsigned dtypes): storage,
    printing, casts, the values past the signed range, and the ops CPU
    implements for them; the rest raise CPU's own error."""
    top = {torch.uint16: 65535, torch.uint32: 2**32 - 1, torch.uint64: 2**63 + 5}[dtype]
    x = torch.tensor([0, 1, 7, 300, top], dtype=dtype)
    t = x.to("tpu")
    assert torch.equal(t.cpu(), x) and t[4].item() == top
    assert " ".join(repr(t).split()).replace(" device='tpu:0',", "") == " ".join(repr(x).split())
    signed = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}[dtype]
    with torch_tpu.set_fallback("error"):
        for fn in (
            lambda a: a * 3,
            lambda a: a.sum(),
            lambda a: a.float(),
            lambda a: a & 6,
            lambda a: a.view(signed),
            lambda a: torch.cat([a, a])[3:],
            lambda a: a.to(torch.int64),
            lambda a: torch.arange(5).to(a.device).to(dtype),
        ):
            assert_same(fn(t), fn(x))
        with pytest.raises(RuntimeError, match="not implemented for"):
            (t + t).cpu()  # as on CPU: add has no kernel for these dtypes


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8(dtype):
    """float8 storage and casts bit for bit as CPU's (e4m3fn saturating at 448,
    subnormals, ties to even), and the float8 matmul _scaled_mm (per-tensor and
    row-wise scales, bias, a float8 result with scale_result)."""
    values = [0.0, -0.0, 1, 2, -3.5, 448, 464, 479, 1e-3, 0.3, 17, -240, 2**-9, 2**-10, 57344, 1e5, float("inf")]
    v = torch.tensor(values + [-x for x in values[2:]])
    g = torch.Generator().manual_seed(0)
    with torch_tpu.set_fallback("error"):
        for source in (v, torch.randn(1000, generator=g) * 30):
            for wide in (torch.float32, torch.bfloat16, torch.float16):
                x = source.to(wide)
                assert torch.equal(x.to("tpu").to(dtype).cpu().view(torch.uint8), x.to(dtype).view(torch.uint8))
        f8 = v.to(dtype)
        t = f8.to("tpu")
        assert torch.equal(t.cpu().view(torch.uint8), f8.view(torch.uint8))
        assert_same(t.float(), f8.float())
        assert torch.equal(torch.cat([t, t]).cpu().view(torch.uint8), torch.cat([f8, f8]).view(torch.uint8))
        a = (torch.randn(16, 32, generator=g) * 4).to(dtype)
        b = (torch.randn(16, 32, generator=g) * 4).to(torch.float8_e4m3fn).t()
        cases = [
            (torch.tensor(0.5), torch.tensor(2.0), dict(out_dtype=torch.float32)),
            (torch.rand(16, 1, generator=g), torch.rand(1, 16, generator=g), dict(out_dtype=torch.float32)),
            (
                torch.tensor(0.5),
                torch.tensor(2.0),
                dict(bias=torch.randn(16, generator=g).bfloat16(), out_dtype=torch.bfloat16),
            ),
            (torch.tensor(0.5), torch.tensor(2.0), dict(out_dtype=torch.float8_e4m3fn, scale_result=torch.tensor(4.0))),
        ]
        for scale_a, scale_b, kw in cases:
            expected = torch._scaled_mm(a, b, scale_a, scale_b, **kw)
            on_tpu = {k: w.to("tpu") if isinstance(w, torch.Tensor) else w for k, w in kw.items()}
            actual = torch._scaled_mm(a.to("tpu"), b.to("tpu"), scale_a.to("tpu"), scale_b.to("tpu"), **on_tpu)
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=1e-5, atol=1e-5)
