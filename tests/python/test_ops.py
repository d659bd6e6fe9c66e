"""The skeleton's ops through the general eager path, compared against CPU PyTorch."""

import pytest
import torch
from conftest import assert_same

import torch_tpu


def both(*tensors):
    return [t.to("tpu") for t in tensors], list(tensors)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize(
    "dtypes", [(torch.float32, torch.float32), (torch.int32, torch.float32), (torch.int64, torch.int64)]
)
def test_binary_tensor_broadcasting_and_promotion(op, dtypes):
    a = (torch.randn(3, 4) * 10).to(dtypes[0])
    b = (torch.randn(4) * 10).to(dtypes[1])
    if op == "div":
        b = torch.where(b == 0, torch.ones_like(b), b)
    (ta, tb), (ca, cb) = both(a, b)
    fn = getattr(torch, op)
    assert_same(fn(ta, tb), fn(ca, cb))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_scalar(op):
    a = torch.arange(6, dtype=torch.int64).view(2, 3)
    fn = getattr(torch, op)
    for scalar in (2, 2.5):
        assert_same(fn(a.to("tpu"), scalar), fn(a, scalar))


def test_add_alpha_and_scalar_tensor():
    a, b = torch.randn(5), torch.randn(5)
    assert_same(torch.add(a.to("tpu"), b.to("tpu"), alpha=3), torch.add(a, b, alpha=3))
    assert_same(torch.sub(a.to("tpu"), b.to("tpu"), alpha=0.5), torch.sub(a, b, alpha=0.5))
    assert_same(a.to("tpu") * torch.tensor(2.0), a * torch.tensor(2.0))  # cpu 0-d scalar tensor


def test_div_rounding_modes():
    a = torch.tensor([-7, -6, 5, 7])
    b = torch.tensor([2, 4, -3, 3])
    for mode in (None, "trunc", "floor"):
        assert_same(torch.div(a.to("tpu"), b.to("tpu"), rounding_mode=mode), torch.div(a, b, rounding_mode=mode))
        assert_same(
            torch.div(a.float().to("tpu"), b.float().to("tpu"), rounding_mode=mode),
            torch.div(a.float(), b.float(), rounding_mode=mode),
        )


@pytest.mark.parametrize(
    "op",
    [
        torch.neg,
        torch.exp,
        torch.relu,
        torch.tanh,
        torch.sigmoid,
        torch.abs,
        torch.sin,
        torch.cos,
        torch.floor,
        torch.ceil,
    ],
)
def test_unary(op):
    a = torch.randn(4, 5)
    assert_same(op(a.to("tpu")), op(a))


def test_mm_matmul_linear():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert_same(torch.mm(a.to("tpu"), b.to("tpu")), torch.mm(a, b), rtol=1e-5, atol=1e-5)
    assert_same(a.to("tpu") @ b.to("tpu"), a @ b, rtol=1e-5, atol=1e-5)
    x, y = torch.randn(2, 3, 5), torch.randn(5, 7)
    assert_same(torch.matmul(x.to("tpu"), y.to("tpu")), torch.matmul(x, y), rtol=1e-5, atol=1e-5)
    w, bias = torch.randn(6, 5), torch.randn(6)
    out = torch.nn.functional.linear(x.to("tpu"), w.to("tpu"), bias.to("tpu"))
    assert_same(out, torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean(dim, keepdim):
    a = torch.randn(3, 4)
    if dim is None:
        assert_same(a.to("tpu").sum(), a.sum())
        assert_same(a.to("tpu").mean(), a.mean())
        return
    assert_same(a.to("tpu").sum(dim, keepdim=keepdim), a.sum(dim, keepdim=keepdim))
    assert_same(a.to("tpu").mean(dim, keepdim=keepdim), a.mean(dim, keepdim=keepdim))


def test_sum_of_ints_and_bools_promotes_like_cpu():
    a = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    assert_same(a.to("tpu").sum(0), a.sum(0))
    m = torch.tensor([True, False, True])
    assert_same(m.to("tpu").sum(), m.sum())


def test_out_variants():
    a, b = torch.randn(3), torch.randn(3)
    out = torch.empty(0, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    assert_same(out, a + b)
    m = torch.empty(2, 2, device="tpu")
    torch.mm(torch.ones(2, 3, device="tpu"), torch.ones(3, 2, device="tpu"), out=m)
    assert m.cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_second_call_with_same_key_compiles_nothing():
    # Each result is kept and synchronized: Fused mode compiles at the flush.
    a = torch.randn(7, 3).to("tpu")
    r = torch.mul(a, a)
    torch.tpu.synchronize()
    before = torch_tpu.metrics()["compiles"]
    for _ in range(5):
        r = torch.mul(a, a)
        torch.tpu.synchronize()
    assert torch_tpu.metrics()["compiles"] == before
    r = torch.mul(torch.randn(8, 3).to("tpu"), 2.0)  # a new shape compiles once
    torch.tpu.synchronize()
    assert torch_tpu.metrics()["compiles"] == before + 1
    assert r.shape == (8, 3)


def test_debug_mode_gives_same_results():
    a = torch.randn(4, 4)
    before = torch_tpu.get_eager_mode()  # strict, or debug under `make test-debug`
    with torch_tpu.set_eager_mode("debug"):
        assert torch_tpu.get_eager_mode() == "debug"
        assert_same(torch.exp(a.to("tpu")) + 1, torch.exp(a) + 1)
    assert torch_tpu.get_eager_mode() == before


@pytest.mark.parametrize("op", [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge])
def test_comparisons_promote_like_cpu(op):
    a = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    b = torch.tensor([2.5, 2.0, 7.0])
    assert_same(op(a.to("tpu"), b.to("tpu")), op(a, b))  # int vs float: compared as float
    assert_same(op(a.to("tpu"), 2.5), op(a, 2.5))  # Python float scalar
    assert_same(op(a.to("tpu"), 3), op(a, 3))
    assert_same(op(b.to("tpu"), torch.tensor(2)), op(b, torch.tensor(2)))  # cpu 0-d tensor


def test_where_maximum_minimum_log_rsqrt():
    a, b = torch.rand(3, 4) + 0.5, torch.rand(4) + 0.5
    assert_same(torch.where(a.to("tpu") > 1, a.to("tpu"), b.to("tpu")), torch.where(a > 1, a, b))
    assert_same(torch.where(a.to("tpu") > 1, a.to("tpu"), 0.0), torch.where(a > 1, a, 0.0))
    assert_same(torch.maximum(a.to("tpu"), b.to("tpu")), torch.maximum(a, b))
    assert_same(torch.minimum(a.to("tpu"), b.to("tpu")), torch.minimum(a, b))
    assert_same(torch.log(a.to("tpu")), torch.log(a))
    assert_same(torch.rsqrt(a.to("tpu")), torch.rsqrt(a))
