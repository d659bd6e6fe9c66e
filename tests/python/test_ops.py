"""The skeleton's ops through the general eager path, compared against CPU PyTorch."""

import pytest
import torch
from conftest import assert_same, compare_fn

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


def _values(dtype, shape=(5, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 3
        x.view(-1)[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
        return x.to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "fn",
    [torch.logaddexp, torch.logaddexp2, torch.fmax, torch.fmin, torch.copysign, torch.heaviside,
     lambda a, b: torch.rsub(a, b, alpha=2), lambda a, b: torch.copysign(a, -2.0), lambda a, b: torch.sinc(a)],
    ids=["logaddexp", "logaddexp2", "fmax", "fmin", "copysign", "heaviside", "rsub", "copysign_scalar", "sinc"],
)  # fmt: skip
def test_binary_ops_lowered_natively(fn, dtype):
    a, b = _values(dtype, seed=1), _values(dtype, seed=2)
    b.view(-1)[4:8] = torch.tensor([float("inf"), 0.0, float("nan"), -0.0])  # equal infinities, NaN on either side
    a.view(-1)[4:6] = torch.tensor([float("inf"), 0.0])
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {}
    no_grad = fn is torch.heaviside  # PyTorch has no derivative for it
    compare_fn(fn, a, b, tol={**tol, "equal_nan": True}, grad_args=() if no_grad else None)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_shifts_and_integer_ops_lowered_natively(dtype):
    a = torch.randint(0, 100, (5, 6)).to(dtype) if dtype == torch.uint8 else _values(dtype)
    s = torch.tensor([0, 1, 3, 7, 9, 2]).to(dtype)  # 9: past uint8's width
    compare_fn(lambda x, y: x << y, a, s)
    compare_fn(lambda x, y: x >> y, a, s)
    compare_fn(lambda x, y: torch.bitwise_left_shift(x, 2) + torch.bitwise_right_shift(x, 1), a, s)
    compare_fn(lambda x, y: torch.fmax(x, y) - torch.fmin(x, y), a, s)
    compare_fn(lambda x, y: torch.count_nonzero(x, dim=1) + torch.count_nonzero(x), a, s)
    compare_fn(lambda x, y: torch.trace(x), a, s)
    compare_fn(lambda x, y: torch.rsub(x, y, alpha=3), a, s)


def test_linear_algebra_and_indexing_ops_lowered_natively():
    m, v, c = _values(torch.float32, (4, 6), 3).nan_to_num(), torch.randn(6), torch.randn(4)
    compare_fn(lambda c, m, v: torch.addmv(c, m, v, beta=0.5, alpha=2), c, m, v, tol={"rtol": 1e-5, "atol": 1e-5})
    nan_self = {"rtol": 1e-5, "atol": 1e-5, "equal_nan": True}  # ignored by the product; its grad is NaN on CPU too
    compare_fn(lambda c, m, v: torch.addmv(c * float("nan"), m, v, beta=0), c, m, v, tol=nan_self)
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    compare_fn(lambda a, b: torch.linalg.cross(a, b, dim=1), a, b, tol={"rtol": 1e-6, "atol": 1e-6})
    compare_fn(lambda a: torch.nn.functional.glu(a, dim=1), torch.randn(3, 8, 2), tol={"rtol": 1e-6, "atol": 1e-6})
    compare_fn(lambda a: torch.trace(a), torch.randn(5, 3), tol={"rtol": 1e-6, "atol": 1e-6})
    idx = torch.tensor([[0, -1], [23, -24]])
    compare_fn(lambda a, i: torch.take(a, i), torch.randn(4, 6), idx)
    put = torch.tensor([[1, -1], [1, 5]])  # a repeated index: accumulated
    compare_fn(lambda a, i, s: (a * 1.0).put_(i, s, accumulate=True), torch.randn(2, 3), put, torch.randn(2, 2))
    compare_fn(lambda a, i, s: a.put(i[:, :1], s[:, :1]), torch.randn(2, 3), put, torch.randn(2, 2))


def test_take_out_of_range_raises():
    import torch_tpu

    with torch_tpu.set_fallback("error"), pytest.raises(IndexError, match="out of range"):
        torch.take(torch.zeros(2, 3, device="tpu"), torch.tensor([6], device="tpu")).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize(
    "shape,pad",
    [((2, 3, 7), (2, 3)), ((2, 3, 7), (-1, 2)), ((1, 2, 5, 6), (1, 2, 3, 0)), ((1, 1, 3, 4, 5), (1, 1, 2, 2, 0, 2))],
)
def test_reflection_and_replication_padding(mode, shape, pad, dtype):
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}  # CPU adds bf16 gradients in bf16
    compare_fn(lambda x: torch.nn.functional.pad(x, pad, mode=mode), torch.randn(shape).to(dtype), tol=tol)


def test_order_statistics_and_searches_lowered_natively():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g)
    nan = x.clone()
    nan[1, 3] = nan[1, 5] = float("nan")  # median returns the first NaN, nanmedian skips them
    seq, batched = torch.sort(torch.randn(10, generator=g))[0], torch.sort(torch.randn(3, 10, generator=g), -1)[0]
    values = torch.randn(3, 4, generator=g)
    values[0, 0] = float("nan")  # a NaN value goes after everything
    unsorted = torch.randn(10, generator=g)
    cases = [
        lambda d: torch.kthvalue(x.to(d), 3, dim=1),
        lambda d: torch.kthvalue(nan.to(d), 4, dim=1, keepdim=True),
        lambda d: torch.median(nan.to(d), dim=1),
        lambda d: torch.median(nan.to(d)),
        lambda d: torch.median(x.to(d), dim=0),
        lambda d: torch.nanmedian(nan.to(d), dim=1),
        lambda d: torch.nanmedian(nan.to(d)),
        lambda d: torch.searchsorted(seq.to(d), values.to(d)),
        lambda d: torch.searchsorted(seq.to(d), values.to(d), side="right", out_int32=True),
        lambda d: torch.searchsorted(batched.to(d), values.to(d), right=True),
        lambda d: torch.searchsorted(seq.to(d), 0.3),
        lambda d: torch.searchsorted(unsorted.to(d), values.to(d), sorter=torch.argsort(unsorted).to(d)),
        lambda d: torch.bucketize(values.to(d), seq.to(d), right=True),
        lambda d: torch.bucketize(torch.tensor([1, 5, 9]).to(d), torch.tensor([0, 5, 10]).to(d), out_int32=True),
    ]
    with torch_tpu.set_fallback("error"):
        for i, case in enumerate(cases):
            want, got = case("cpu"), case("tpu")
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for w, t in zip(want, got, strict=True):
                torch.testing.assert_close(t.cpu(), w, rtol=0, atol=0, equal_nan=True, msg=f"case {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,size",
    [
        ((2, 3, 7, 5), (3, 2)),
        ((3, 7, 9), (4, 5)),
        ((1, 2, 5, 6, 7), (2, 3, 4)),
        ((2, 5, 11), (4,)),
        ((1, 1, 4, 6), (8, 9)),
    ],
)
def test_adaptive_average_pooling_of_any_size(shape, size, dtype):
    pool = {1: torch.nn.functional.adaptive_avg_pool1d, 2: torch.nn.functional.adaptive_avg_pool2d}.get(
        len(size), torch.nn.functional.adaptive_avg_pool3d
    )
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
    compare_fn(lambda x: pool(x, size), torch.randn(shape).to(dtype), tol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,size", [((2, 3, 7, 5), (3, 2)), ((1, 2, 5, 6, 7), (2, 3, 4)), ((2, 5, 11), (4,)), ((1, 1, 4, 6), (8, 9))]
)
def test_adaptive_max_pooling_values_indices_and_gradient(shape, size, dtype):
    pool = {1: torch.nn.functional.adaptive_max_pool1d, 2: torch.nn.functional.adaptive_max_pool2d}.get(
        len(size), torch.nn.functional.adaptive_max_pool3d
    )
    x = torch.randn(shape).to(dtype)
    x.view(-1)[3] = x.view(-1)[5] = float("nan")  # the last NaN of a window wins, as in CPU's scan
    x.view(-1)[7] = float("-inf")
    with torch_tpu.set_fallback("error"):
        assert torch.equal(pool(x.to("tpu"), size, return_indices=True)[1].cpu(), pool(x, size, return_indices=True)[1])
    compare_fn(lambda x: pool(x, size), x, tol={"equal_nan": True})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 3, 6, 7), {"kernel_size": 2}),
        ((1, 2, 7, 8), {"kernel_size": (2, 3), "dilation": (2, 1), "padding": 1, "stride": (2, 3)}),
        ((3, 5, 5), {"kernel_size": 3, "padding": 2, "stride": 2}),
    ],
)
def test_unfold_and_fold(shape, kw, dtype):  # im2col and col2im, each the other's gradient
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
    compare_fn(lambda x: torch.nn.functional.unfold(x, **kw), torch.randn(shape).to(dtype), tol=tol)
    cols = torch.nn.functional.unfold(torch.randn(shape), **kw)
    compare_fn(lambda c: torch.nn.functional.fold(c, shape[-2:], **kw), cols.to(dtype), tol=tol)


def test_max_unpool_places_values_at_their_indices():
    f = torch.nn.functional

    def unpooled(x):
        v, i = f.max_pool2d(x, 2, return_indices=True)
        return f.max_unpool2d(v, i, 2, output_size=(7, 9)) * 3

    def unpooled3d(x):
        v, i = f.max_pool3d(x, 2, return_indices=True)
        return f.max_unpool3d(v, i, 2)

    compare_fn(unpooled, torch.randn(2, 3, 6, 8))
    compare_fn(unpooled3d, torch.randn(1, 2, 4, 4, 6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logcumsumexp(dtype):
    x = torch.randn(4, 9) * 5
    x[1, 2:4] = float("-inf")  # -inf stays -inf until a number comes
    x[2, 0] = float("inf")
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    compare_fn(lambda x: torch.logcumsumexp(x, 1), x.to(dtype), tol=tol, grad_args=())
    compare_fn(lambda x: torch.logcumsumexp(x, 0), torch.randn(6, 3).to(dtype), tol=tol)  # and its gradient


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, float("inf")])
def test_renorm(p):
    x = torch.randn(4, 5, 3) * 3
    compare_fn(lambda x: torch.renorm(x, p, 1, 2.0), x, tol={"rtol": 1e-5, "atol": 1e-5})


def test_equal_reads_one_bool():
    def t(values):
        return torch.tensor(values).to("tpu")

    with torch_tpu.set_fallback("error"):
        assert torch.equal(t([1, 2]), t([1.0, 2.0]))  # promoted, as eq
        assert not torch.equal(t([1, 2]), t([1, 3]))
        assert not torch.equal(t([float("nan")]), t([float("nan")]))
        assert not torch.equal(torch.ones(2, 3, device="tpu"), torch.ones(3, 2, device="tpu"))
        assert torch.equal(torch.ones(0, device="tpu"), torch.ones(0, device="tpu"))
        with pytest.raises(RuntimeError, match="different devices"):
            torch.equal(t([1]), torch.tensor([1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self, dtype):
    x = (torch.randn(5, 3) * 4).to(dtype)
    source = (torch.randn(4, 3) * 4).to(dtype)
    index = torch.tensor([0, 4, 0, 2])  # row 0 twice, rows 1 and 3 untouched
    compare_fn(
        lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self),
        x, index, source, tol={"rtol": 1e-6, "atol": 1e-6}, grad_args=(),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 2, 4, 6), {"scale_factor": 2}),
        ((2, 1, 5, 7), {"size": (3, 9), "align_corners": True}),
        ((1, 3, 3, 4), {"scale_factor": (1.7, 2.3)}),
    ],
)
def test_bicubic_upsampling(shape, kw, dtype):
    tol = {"rtol": 1.6e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    compare_fn(
        lambda x: torch.nn.functional.interpolate(x, mode="bicubic", **kw), torch.randn(shape).to(dtype), tol=tol
    )


def test_triangle_indices():
    with torch_tpu.set_fallback("error"):
        for rows, cols, offset in [(4, 5, 0), (3, 3, -1), (5, 2, 2), (0, 3, 0)]:
            for f in (torch.tril_indices, torch.triu_indices):
                assert torch.equal(f(rows, cols, offset, device="tpu").cpu(), f(rows, cols, offset))


def test_linspace_logspace_and_baddbmm():
    with torch_tpu.set_fallback("error"):
        for args, kw in [
            ((0, 1, 7), {}),
            ((-3, 10, 6), {"dtype": torch.int64}),
            ((2, 3, 1), {}),
            ((1.5, -2.25, 11), {}),
        ]:
            assert torch.equal(torch.linspace(*args, device="tpu", **kw).cpu(), torch.linspace(*args, **kw))
        for args, kw in [((0, 2, 5), {"base": 3.0}), ((-1, 1, 7), {}), ((0, 3, 4), {"dtype": torch.int64, "base": 2})]:
            torch.testing.assert_close(torch.logspace(*args, device="tpu", **kw).cpu(), torch.logspace(*args, **kw))
    x, b1, b2 = torch.randn(3, 4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    compare_fn(lambda x, a, b: torch.baddbmm(x, a, b, beta=0.5, alpha=2), x, b1, b2, tol={"rtol": 1e-5, "atol": 1e-5})


def test_linspace_logspace_bit_exact_in_bfloat16_and_complex():
    # bfloat16 rounds every step as CPU's scalar formula does (the index too,
    # past 256); complex logspace's start and end change every call, so they
    # become program inputs, which must stay double for complex128.
    with torch_tpu.set_fallback("error"):
        for a, b, n in [(-97.3, 41.6, 600), (0.1, 3.7, 7), (-1.3, 2.7, 1)]:
            for kw in [{"dtype": torch.bfloat16}, {"dtype": torch.float16}]:
                assert torch.equal(torch.linspace(a, b, n, device="tpu", **kw).cpu(), torch.linspace(a, b, n, **kw))
        for a, b, n, base in [(-1.3, 2.7, 7, 10.0), (2.09, -3.3, 1, 10.0), (-4.1, 4.9, 300, 2.0)]:
            kw = {"dtype": torch.bfloat16}
            want = torch.logspace(a, b, n, base, **kw)
            assert torch.equal(torch.logspace(a, b, n, base, device="tpu", **kw).cpu(), want)
        for k in range(4):
            a, b = complex(1.1 + 0.1 * k, -0.3), complex(-0.7, 1.9 - 0.2 * k)
            for n in (1, 2, 9):
                for f in (torch.linspace, torch.logspace):
                    for dtype, tol in [(torch.complex64, 2e-6), (torch.complex128, 1e-14)]:
                        want = f(a, b, n, dtype=dtype)
                        torch.testing.assert_close(
                            f(a, b, n, dtype=dtype, device="tpu").cpu(), want, rtol=tol, atol=tol
                        )


def test_polygamma_zeta_and_nextafter():
    x = torch.tensor([-8.478, -3.5, -2.2, -1.0, 0.0, 0.3, 1.0, 1.7, 2.5, 10.0])  # poles, negatives, small x
    with torch_tpu.set_fallback("error"):
        for n in range(4):
            actual, expected = torch.polygamma(n, x.to("tpu")).cpu(), torch.polygamma(n, x.double())
            finite = expected.abs() < 1e12  # CPU's trigamma at -1 is a huge finite number, tpu's inf
            torch.testing.assert_close(actual[finite], expected[finite].float(), rtol=1e-5, atol=1e-5)
            assert (actual[~finite].abs() == float("inf")).all() or n == 0
        s, q = torch.tensor([2.0, 3.0, 1.5, 0.5, 1.0, 5.0, 0.0]), torch.tensor([-0.5, 1.0, 2.0, 3.0, 4.0, -3.0, -4.0])
        assert_same(torch.special.zeta(s.to("tpu"), q.to("tpu")), torch.special.zeta(s, q), equal_nan=True)
        a, b = torch.tensor([1.0, 0.0, -0.0, 1.0, float("inf")]), torch.tensor([2.0, 1.0, -1.0, 0.0, 0.0])
        assert torch.equal(torch.nextafter(a.to("tpu"), b.to("tpu")).cpu(), torch.nextafter(a, b))


def test_gcd_lcm_cummax_cummin_nonzero_static():
    a, b = torch.tensor([12, -18, 0, 0, 7, 2**40]), torch.tensor([18, 12, 5, 0, -21, 2**20])
    compare_fn(torch.gcd, a, b)
    compare_fn(torch.lcm, a[:5], b[:5])
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 2.0, 5.0], [0.0, -1.0, 0.0, 4.0, float("nan"), float("nan")]])
    with torch_tpu.set_fallback("error"):
        for f in (torch.cummax, torch.cummin):
            for dim in (0, 1):
                v, i = f(x.to("tpu"), dim)
                ve, ie = f(x, dim)
                assert_same(v, ve, equal_nan=True)
                assert torch.equal(i.cpu(), ie), (f, dim, i.cpu(), ie)
        ints = torch.tensor([3, 1, 3, 2, 3])
        assert torch.equal(torch.cummax(ints.to("tpu"), 0).indices.cpu(), torch.cummax(ints, 0).indices)
        m = torch.tensor([[0, 1, 0], [2, 0, 3]])
        for size in (0, 2, 3, 6):
            expected = torch.nonzero_static(m, size=size, fill_value=-7)
            assert torch.equal(torch.nonzero_static(m.to("tpu"), size=size, fill_value=-7).cpu(), expected)


def rounded_float32_reference(fn, *inputs):
    return fn(*[x.float() if x.dtype == torch.bfloat16 else x for x in inputs]).to(torch.bfloat16)


@pytest.mark.parametrize(
    "name,fn,inputs",
    [
        # 1 + erf(x) near -1: rounding each step in bfloat16 lost a third of the value
        ("gelu", torch.nn.functional.gelu, (torch.tensor([-2.765625, -3.5, 0.5, 2.0]),)),
        ("lerp", lambda a, b: torch.lerp(a, b, 0.4), (torch.tensor([4.15625, 1.0]), torch.tensor([-6.25, 3.0]))),
        (
            "baddbmm",
            lambda x, a, b: torch.baddbmm(x, a, b, alpha=0.7),
            (torch.randn(2, 3, 4), torch.randn(2, 3, 16) * 4, torch.randn(2, 16, 4) * 4),
        ),
        ("addr", lambda x, a, b: torch.addr(x, a, b, beta=0.5), (torch.randn(3, 4), torch.randn(3), torch.randn(4))),
        ("conv_transpose2d", torch.nn.functional.conv_transpose2d, (torch.randn(2, 8, 5, 5), torch.randn(8, 3, 3, 3))),
        ("group_norm", lambda x: torch.nn.functional.group_norm(x, 2), (torch.randn(2, 4, 6) * 3 + 5,)),
        ("softplus", torch.nn.functional.softplus, (torch.randn(16) * 4,)),
    ],
)
def test_bfloat16_ops_round_once_like_cuda(name, fn, inputs):
    """In bfloat16, tpu computes as CUDA does: in float32, rounded once at the end."""
    inputs = [x.to(torch.bfloat16) for x in inputs]
    with torch_tpu.set_fallback("error"):
        actual = fn(*[x.to("tpu") for x in inputs]).cpu()
    torch.testing.assert_close(actual, rounded_float32_reference(fn, *inputs), rtol=8e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce(reduce, initial):
    data = torch.tensor([[1.0, 2.0], [3.0, -4.0], [5.0, 6.0], [float("nan"), 1.0], [0.5, 0.25]])
    kw = {"initial": initial} if initial is not None else {}
    with torch_tpu.set_fallback("error"):
        for segments in ({"lengths": torch.tensor([2, 0, 2, 1])}, {"offsets": torch.tensor([0, 2, 2, 4, 5])}):
            expected = torch.segment_reduce(data, reduce, **segments, **kw)
            tpu_segments = {k: v.to("tpu") for k, v in segments.items()}
            assert_same(torch.segment_reduce(data.to("tpu"), reduce, **tpu_segments, **kw), expected, equal_nan=True)
        # Batched segments along axis 1: lengths [2, 3] over data [2, 4, 3].
        batched = torch.arange(24.0).reshape(2, 4, 3).sin()
        lengths = torch.tensor([[1, 3, 0], [2, 0, 2]])
        for segments in (
            {"lengths": lengths},
            {"offsets": torch.cat([torch.zeros(2, 1, dtype=torch.long), lengths.cumsum(1)], 1)},
        ):
            expected = torch.segment_reduce(batched, reduce, axis=1, **segments, **kw)
            tpu_segments = {k: v.to("tpu") for k, v in segments.items()}
            actual = torch.segment_reduce(batched.to("tpu"), reduce, axis=1, **tpu_segments, **kw)
            torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_hash_tensor_and_empty_inputs():
    x = torch.randn(4, 5)
    with torch_tpu.set_fallback("error"):
        for t in (x, x.double(), (x * 100).long(), (x * 10).to(torch.int8), x > 0, (x.abs() * 50).to(torch.uint8)):
            assert torch.equal(torch.hash_tensor(t.to("tpu")).cpu(), torch.hash_tensor(t))
            assert torch.equal(
                torch.hash_tensor(t.to("tpu"), 1, keepdim=True).cpu(), torch.hash_tensor(t, 1, keepdim=True)
            )
        empty = torch.randn(2, 4, 0)
        for a, e in zip(
            torch.native_group_norm(empty.to("tpu"), None, None, 2, 4, 0, 2, 1e-5),
            torch.native_group_norm(empty, None, None, 2, 4, 0, 2, 1e-5),
            strict=True,
        ):
            torch.testing.assert_close(a.cpu(), e, equal_nan=True)
        assert torch.equal(torch.histc(torch.tensor([]).to("tpu"), bins=4).cpu(), torch.histc(torch.tensor([]), bins=4))
        lu, pivots = torch.randn(2, 3, 0), torch.zeros(2, 0, dtype=torch.int32)  # P is the 3x3 identity
        for a, e in zip(torch.lu_unpack(lu.to("tpu"), pivots.to("tpu")), torch.lu_unpack(lu, pivots), strict=True):
            assert a.shape == e.shape and torch.equal(a.cpu(), e)


def test_unfold_backward():
    x = torch.randn(3, 10, 4)
    for dim, size, step in [(1, 3, 2), (1, 4, 4), (1, 2, 5), (2, 2, 1), (0, 3, 1), (-1, 4, 3)]:
        compare_fn(lambda t, d=dim, n=size, s=step: t.unfold(d, n, s) * 1.5, x)


def test_matrix_exp():
    # Norms from tiny to ones that need squaring, batched, float32 and float64.
    a = torch.randn(5, 4, 4) * torch.tensor([1e-3, 0.5, 3.0, 8.0, 0.0]).view(5, 1, 1)
    for dtype, tol in [(torch.float32, 1e-5), (torch.float64, 1e-12)]:
        compare_fn(torch.linalg.matrix_exp, a.to(dtype), tol={"atol": tol, "rtol": tol})
    compare_fn(torch.linalg.matrix_exp, torch.randn(3, 3) * 2, tol={"atol": 1e-4, "rtol": 1e-5})


def test_torch_norm_overloads():
    x = torch.randn(3, 4, 5)
    for p in (None, 1, 2, 3.5, float("inf")):
        compare_fn(lambda t, p=p: torch.norm(t, p=p, dim=(1, 2)), x, tol={"atol": 1e-5, "rtol": 1e-5})
    compare_fn(lambda t: torch.norm(t), x, tol={"atol": 1e-5, "rtol": 1e-5})
    compare_fn(lambda t: torch.norm(t, 2, 0, True, dtype=torch.float64), x, tol={"atol": 1e-5, "rtol": 1e-5})


def test_cdist_every_p_and_mode():
    """p picks the formula: it stays a compile-time value however many values it takes."""
    x1, x2 = torch.randn(2, 5, 3), torch.randn(2, 30, 3)
    for mode in ("use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist", "use_mm_for_euclid_dist_if_necessary"):
        for p in (1.0, 2.0, 0.0, 3.0, float("inf"), 0.5):
            compare_fn(lambda a, b, p=p, m=mode: torch.cdist(a, b, p, m), x1, x2, tol={"atol": 1e-4, "rtol": 1e-4})


def test_in_place_forms_of_other_overloads_run_natively():
    """pow_.Scalar is pow.Tensor_Scalar's in-place form, __ilshift__ is __lshift__'s: lowered, not the fallback."""
    cases = [
        lambda x: x.pow_(2),
        lambda x: x.pow_(torch.full_like(x, 0.5)),
        lambda x: x.floor_divide_(torch.full_like(x, 2)),
    ]
    for fn in cases:
        c, t = torch.arange(1.0, 7.0), torch.arange(1.0, 7.0, device="tpu")
        with torch_tpu.set_fallback("error"):
            fn(t)
        fn(c)
        assert_same(t, c)
    c, t = torch.arange(6), torch.arange(6, device="tpu")
    with torch_tpu.set_fallback("error"):
        t <<= 2
        t >>= 1
    c <<= 2
    c >>= 1
    assert_same(t, c)


# CPU-only fused forms PyTorch's own passes emit (_add_relu, _addmm_activation,
# _stack) and scatter_reduce's "mean", without the fallback.
@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: torch.ops.aten._add_relu(a, b, alpha=2),
        lambda a, b: torch.ops.aten._add_relu(a, 0.25),
        lambda a, b: torch.ops.aten._stack([a, b], 1),
        lambda a, b: torch.ops.aten._addmm_activation(a.new_ones(4), a, b.t(), beta=0.5, use_gelu=True),
        lambda a, b: torch.ops.aten._addmm_activation(a.new_ones(4, 4), a, b.t()),
    ],
    ids=["add_relu", "add_relu_scalar", "stack", "addmm_gelu", "addmm_relu"],
)
def test_fused_cpu_forms(fn):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    compare_fn(fn, a, b, tol=dict(rtol=1e-5, atol=1e-6), grad_args=())  # no derivatives in PyTorch


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_mean(dtype, include_self):
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    index = torch.tensor([[0, 0, 1], [1, 0, 1]])
    src = torch.tensor([[-7, 2, 3], [4, -5, 6]], dtype=dtype)
    expected = x.scatter_reduce(1, index, src, "mean", include_self=include_self)
    with torch_tpu.set_fallback("error"):
        actual = x.to("tpu").scatter_reduce(1, index.to("tpu"), src.to("tpu"), "mean", include_self=include_self)
    assert_same(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_frexp(dtype):
    """Exact mantissas and exponents, subnormals included (XLA's CPU flushes
    them in arithmetic, so the rule reads bits), and 0, -0, inf kept."""
    g = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 1.0, 3.0, -5.5, 1e-40, -1e-45, float("inf"), -float("inf"), 2**-126, 2**-127, 3.4e38]
    x = torch.cat([torch.tensor(special), torch.randn(500, generator=g) * 1e3, torch.randn(50, generator=g) * 1e-39])
    x = x.to(dtype)
    mantissa, exponent = torch.frexp(x)
    with torch_tpu.set_fallback("error"):
        m, e = torch.frexp(x.to("tpu"))
    assert torch.equal(m.cpu(), mantissa) and torch.equal(torch.signbit(m.cpu()), torch.signbit(mantissa))
    assert torch.equal(e.cpu(), exponent)


def test_filling_a_fresh_tensor_uploads_nothing():
    """zeros, ones, full and fill_ overwrite the whole storage without reading
    it: their programs take no buffer for it, so the never-written storage
    gets no zero bytes from the host first (on a TPU, an upload of the whole
    tensor over PCIe for torch.zeros)."""
    x = torch.arange(12.0).to("tpu")
    makers = {
        "zeros": lambda: torch.zeros(3, 4, device="tpu"),
        "ones_like": lambda: torch.ones_like(x),
        "full": lambda: torch.full((2, 6), 2.5, device="tpu"),
        "empty().fill_": lambda: torch.empty(12, device="tpu").fill_(7),
        "empty().zero_": lambda: torch.empty(12, device="tpu", dtype=torch.int64).zero_(),
        "empty().copy_": lambda: torch.empty(12, device="tpu").copy_(x * 2),
    }
    expected = {
        "zeros": torch.zeros(3, 4),
        "ones_like": torch.ones(12),
        "full": torch.full((2, 6), 2.5),
        "empty().fill_": torch.full((12,), 7.0),
        "empty().zero_": torch.zeros(12, dtype=torch.int64),
        "empty().copy_": torch.arange(12.0) * 2,
    }
    for name, make in makers.items():
        make().cpu()  # compiled, the Scalar uploaded once
        before = torch_tpu.metrics().get("bytes_to_device", 0)
        y = make()
        assert torch_tpu.metrics().get("bytes_to_device", 0) == before, name
        assert_same(y, expected[name])
    # A storage that is read before any write still reads as zeros.
    assert_same(torch.empty(5, device="tpu").add_(1), torch.ones(5))


def test_a_scalar_value_is_uploaded_once():
    """A Python number is a program input (a learning rate changes each step);
    the same value comes back every step, so it is uploaded once and kept."""
    x = torch.arange(6.0).to("tpu")
    (x * 0.37 + 0.25).cpu()
    before = torch_tpu.metrics().get("transfers_to_device", 0)
    for _ in range(5):
        y = x * 0.37 + 0.25
    assert torch_tpu.metrics().get("transfers_to_device", 0) == before
    assert_same(y, torch.arange(6.0) * 0.37 + 0.25)
    z = x * 0.38  # a new value: one upload
    assert torch_tpu.metrics().get("transfers_to_device", 0) == before + 1
    assert_same(z, torch.arange(6.0) * 0.38)
