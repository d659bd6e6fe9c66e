"""Reductions, scans and sorting through their lowering rules, compared against CPU PyTorch.

Every test runs with the CPU fallback off, so an op without a rule fails here.
"""

import pytest
import torch
from conftest import assert_same

import torch_tpu

nan, inf = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def no_fallback():
    with torch_tpu.set_fallback("error"):
        yield


def check(fn, *tensors, **tol):
    """fn on tpu copies of the tensors vs fn on the tensors; fn may return a tuple."""
    got = fn(*[t.to("tpu") for t in tensors])
    want = fn(*tensors)
    if isinstance(want, torch.Tensor):
        got, want = (got,), (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w, equal_nan=True, **tol)


def with_nans():
    x = torch.randn(4, 5)
    x[1, 2] = nan
    x[3, 0] = nan
    x[3, 4] = nan
    return x


INTS = torch.tensor([[3, -7, 3, 0], [2, 2, 9, -1], [5, 5, 5, 5]])
TIES = torch.tensor([[1.0, 4.0, 4.0, 0.0, 4.0], [-2.0, -2.0, 7.0, 7.0, -3.0]])
DIMS = [0, 1, -1, (0, 1), (), None]


def dims_kw(dim):
    return {} if dim is None else {"dim": dim}


# ---------------------------------------------------------------- amax, amin, max, min


@pytest.mark.parametrize("op", [torch.amax, torch.amin])
@pytest.mark.parametrize("dim", [0, 1, -1, (0, 1), ()])
@pytest.mark.parametrize("keepdim", [False, True])
def test_amax_amin(op, dim, keepdim):
    for x in (torch.randn(4, 5), with_nans(), INTS, INTS > 2):
        check(lambda t: op(t, dim=dim, keepdim=keepdim), x)


def test_amax_3d_and_infinities():
    check(lambda t: torch.amax(t, dim=(0, 2)), torch.randn(3, 4, 5))
    check(lambda t: torch.amin(t, dim=-2, keepdim=True), torch.randn(3, 4, 5))
    x = torch.tensor([[-inf, -inf], [inf, 1.0]])
    check(lambda t: torch.amax(t, 1), x)
    check(lambda t: torch.amin(t, 1), x)


@pytest.mark.parametrize("op", [torch.max, torch.min])
def test_max_min_full(op):
    for x in (torch.randn(3, 4), with_nans(), INTS, INTS > 2, torch.tensor(2.5)):
        check(op, x)


@pytest.mark.parametrize("op", [torch.max, torch.min])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim_values_and_first_index(op, dim, keepdim):
    for x in (torch.randn(4, 5), with_nans(), TIES, INTS, INTS > 2):
        check(lambda t: op(t, dim, keepdim), x)


def test_max_dim_nan_gives_first_nan_index():
    x = torch.tensor([[1.0, nan, 3.0, nan], [nan, nan, -1.0, 2.0], [-inf, -inf, -inf, -inf]])
    for op in (torch.max, torch.min):
        v, i = op(x.to("tpu"), 1)
        ev, ei = op(x, 1)
        assert i.cpu().tolist() == ei.tolist() == [1, 0, 0]
        torch.testing.assert_close(v.cpu(), ev, equal_nan=True)


def test_max_dim_out_variant_and_0d():
    x = torch.randn(3, 4)
    values, indices = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.max(x.to("tpu"), 1, out=(values, indices))
    ev, ei = torch.max(x, 1)
    assert_same(values, ev)
    assert_same(indices, ei)
    check(lambda t: torch.max(t, 0), torch.tensor(1.5))
    check(lambda t: torch.min(t, -1, keepdim=True), torch.tensor(1.5))


@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(op, dim, keepdim):
    for x in (torch.randn(4, 5), with_nans(), TIES, INTS):
        check(lambda t: op(t, dim=dim, keepdim=keepdim), x)


def test_argmax_0d_and_3d():
    check(torch.argmax, torch.tensor(3.0))
    check(lambda t: torch.argmin(t, 0), torch.tensor(3.0))
    check(lambda t: torch.argmax(t, 1), torch.randn(2, 6, 3))


def test_errors_like_cpu():
    # PyTorch's meta kernels accept these; its CPU kernels raise, and so do we.
    cases = [
        (lambda t: torch.max(t[:0], 0), torch.randn(2, 3)),
        (lambda t: torch.min(t[:0]), torch.randn(2, 3)),
        (lambda t: torch.argmax(t[:, :0], 1), torch.randn(2, 3)),
        (lambda t: torch.argmax(t[:0]), torch.randn(2, 3)),
        (torch.argmax, torch.tensor([True, False])),
        (torch.var, torch.tensor([1, 2, 3])),
    ]
    for fn, x in cases:
        with pytest.raises((RuntimeError, IndexError)):
            fn(x)
        with pytest.raises((RuntimeError, IndexError)):
            fn(x.to("tpu"))


# ---------------------------------------------------------------- prod, var, std


def test_prod():
    x = torch.rand(3, 4) + 0.5
    check(torch.prod, x)
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            for y in (x, INTS):
                check(lambda t, d=dim, k=keepdim: torch.prod(t, d, keepdim=k), y)
    check(torch.prod, INTS.to(torch.int32))  # int32 -> int64
    check(torch.prod, INTS > -5)  # bool -> int64
    check(lambda t: torch.prod(t, 1, dtype=torch.float64), x)
    check(lambda t: torch.prod(t, 0), with_nans())


@pytest.mark.parametrize("op", [torch.var, torch.std])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("correction", [None, 0, 1, 2.5])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_std(op, dim, correction, keepdim):
    x = torch.randn(4, 6) * 3 + 1
    check(lambda t: op(t, **dims_kw(dim), correction=correction, keepdim=keepdim), x)


def test_var_std_edge_cases():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "degrees of freedom is <= 0"
        check(lambda t: torch.var(t, correction=3), torch.tensor([1.0, 2.0]))  # inf
        check(lambda t: torch.var(t, 0), torch.tensor([[1.0, 2.0]]))  # nan (0/0)
    check(lambda t: torch.std(t, 1), with_nans())
    check(lambda t: torch.var(t, unbiased=False), torch.randn(5, 3))
    check(lambda t: torch.std(t, (0, 2), True), torch.randn(3, 4, 5))


def test_var_mean_std_mean():
    x = torch.randn(4, 6)
    check(lambda t: torch.var_mean(t, 1), x)
    check(lambda t: torch.std_mean(t, (0, 1), correction=0, keepdim=True), x)
    check(torch.var_mean, x)


def test_low_precision_accumulates_in_float32():
    x = torch.randn(256) * 0.1 + 100
    for dtype in (torch.bfloat16, torch.float16):
        y = x.to(dtype)
        check(torch.var, y)
        check(torch.std, y)
        check(lambda t: torch.logsumexp(t, 0), y)
        check(lambda t: torch.cumsum(t, 0), y[:32])
        check(lambda t, d=dtype: torch.cumsum(t.float(), 0, dtype=d), y[:32])
        # CPU multiplies in the low-precision type, one rounding per step; we
        # accumulate in float32 (one rounding at the end), like float32 CPU does.
        p = (torch.rand(8) + 0.5).to(dtype)
        assert_same(torch.prod(p.to("tpu")), torch.prod(p.float()).to(dtype))
        assert_same(torch.prod(p.to("tpu"), 0, dtype=torch.float32), torch.prod(p.float()))


# ---------------------------------------------------------------- any, all


@pytest.mark.parametrize("op", [torch.any, torch.all])
def test_any_all(op):
    xs = [
        torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 3.0, -1.0]]),
        torch.tensor([[nan, 0.0], [0.0, 0.0]]),
        INTS,
        INTS > 0,
        torch.tensor([[0, 3], [1, 1]], dtype=torch.uint8),  # uint8 in, uint8 out
        torch.ones(3, 4) > 0,
    ]
    for x in xs:
        check(op, x)
        for dim in (0, 1, -1):
            check(lambda t, d=dim: op(t, d), x)
            check(lambda t, d=dim: op(t, d, keepdim=True), x)
        check(lambda t: op(t, dim=(0, 1)), x)
        check(lambda t: op(t, dim=(0, 1), keepdim=True), x)
        check(lambda t: op(t, dim=()), x)  # no dimension: elementwise


def test_any_all_empty():
    check(torch.any, torch.empty(0))
    check(torch.all, torch.empty(0))
    check(lambda t: torch.any(t, 0), torch.empty(0, 3))


# ---------------------------------------------------------------- logsumexp, nansum, mean


@pytest.mark.parametrize("dim", [0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(dim, keepdim):
    check(lambda t: torch.logsumexp(t, dim, keepdim), torch.randn(4, 5) * 50)
    check(lambda t: torch.logsumexp(t, dim, keepdim), with_nans())


def test_logsumexp_is_stable_and_handles_infinities():
    check(lambda t: torch.logsumexp(t, 0), torch.tensor([1000.0, 1000.0, -1000.0]))
    x = torch.tensor([[-inf, -inf], [inf, 1.0], [-inf, 2.0], [inf, inf]])
    check(lambda t: torch.logsumexp(t, 1), x)
    check(lambda t: torch.logsumexp(t, 0), INTS)  # ints -> float32


@pytest.mark.parametrize("dim", [0, 1, -1, (0, 1), None])
@pytest.mark.parametrize("keepdim", [False, True])
def test_nansum(dim, keepdim):
    check(lambda t: torch.nansum(t, **dims_kw(dim), keepdim=keepdim), with_nans())
    check(lambda t: torch.nansum(t, **dims_kw(dim), keepdim=keepdim), INTS)
    check(lambda t: torch.nansum(t, **dims_kw(dim), keepdim=keepdim, dtype=torch.float64), with_nans())


def test_empty_dim_list_where_meta_and_cpu_disagree_is_refused():
    # nansum(dim=()) reduces everything on CPU but nothing for the meta kernel;
    # logsumexp(dim=()) raises on CPU. Neither may return a different answer.
    x = torch.randn(3, 4).to("tpu")
    with pytest.raises(RuntimeError, match=r"nansum with dim=\(\)"):
        torch.nansum(x, dim=())
    with pytest.raises(RuntimeError, match=r"logsumexp with dim=\(\)"):
        torch.logsumexp(x, dim=())


def test_mean_without_dim():
    check(torch.mean, torch.randn(3, 4))
    check(lambda t: torch.mean(t, dtype=torch.float64), torch.randn(3, 4))
    check(torch.mean, torch.tensor(2.0))
    check(lambda t: t.sum(0), torch.tensor(2.0))  # 0-d with dim 0


# ---------------------------------------------------------------- cumsum, cumprod


@pytest.mark.parametrize("op", [torch.cumsum, torch.cumprod])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_cumprod(op, dim):
    check(lambda t: op(t, dim), torch.randn(5, 7))
    check(lambda t: op(t, dim), torch.randint(-3, 4, (5, 7)))
    check(lambda t: op(t, dim), torch.randint(-3, 4, (5, 7), dtype=torch.int32))  # -> int64
    check(lambda t: op(t, dim), torch.randn(5, 7) > 0)  # bool -> int64
    check(lambda t: op(t, dim, dtype=torch.float64), torch.randn(5, 7))
    check(lambda t: op(t, dim), with_nans()[:, :5])


@pytest.mark.parametrize("n", [1, 2, 3, 8, 100, 1000])
def test_cumsum_lengths(n):
    check(lambda t: torch.cumsum(t, 0), torch.randn(n), atol=1e-4, rtol=1e-5)
    check(lambda t: torch.cumsum(t, 0), torch.arange(n))
    check(lambda t: torch.cumprod(t, 0), torch.rand(n) * 0.2 + 0.9, rtol=1e-4, atol=1e-6)


def test_cumsum_3d_inplace_0d_and_empty():
    check(lambda t: torch.cumsum(t, 1), torch.randn(3, 9, 4))
    x = torch.randn(4, 6)
    t = x.to("tpu")
    t.cumsum_(1)
    assert_same(t, x.cumsum(1))
    check(lambda t: torch.cumsum(t, 0), torch.tensor(3.0))
    check(lambda t: torch.cumprod(t, -1), torch.tensor(3))
    check(lambda t: torch.cumsum(t, 0), torch.empty(0, 3))
    check(lambda t: torch.cumsum(t, 0, dtype=torch.bfloat16), torch.randn(16))  # rounds x to bf16 first


# ---------------------------------------------------------------- sort, argsort, topk


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable(dim, descending):
    xs = [
        torch.randn(5, 6),
        with_nans(),
        torch.tensor([[3.0, 1.0, 3.0, -0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0, -inf, inf]]),  # ties, signed zero
        torch.randint(-3, 3, (4, 8)),
        torch.randint(0, 2, (4, 8)) > 0,
    ]
    for x in xs:
        check(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), x)
        check(lambda t: torch.argsort(t, dim=dim, descending=descending, stable=True), x)


def test_sort_nan_order():
    x = torch.tensor([3.0, nan, 1.0, nan, -1.0, inf, -inf])
    for descending in (False, True):
        v, i = torch.sort(x.to("tpu"), descending=descending, stable=True)
        ev, ei = torch.sort(x, descending=descending, stable=True)
        assert i.cpu().tolist() == ei.tolist()
        torch.testing.assert_close(v.cpu(), ev, equal_nan=True)


def test_sort_default_distinct_values_and_0d():
    # sort without stable=True may order ties either way: compare on distinct values.
    x = torch.randperm(40).float().view(5, 8)
    check(lambda t: torch.sort(t), x)
    check(lambda t: torch.sort(t, 0, descending=True), x)
    check(lambda t: torch.argsort(t, 1), x)
    check(lambda t: torch.sort(t, stable=True), torch.tensor(2.0))
    check(torch.msort, x)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_topk(largest, dim):
    x = torch.randperm(42).float().view(6, 7)  # distinct: topk's order among ties is unspecified
    for k in (0, 1, 3, 6):
        check(lambda t, k=k: torch.topk(t, k, dim=dim, largest=largest), x)
    check(lambda t: torch.topk(t, 2, dim=dim, largest=largest), torch.randperm(42).view(6, 7))


def test_topk_nan_is_largest():
    x = torch.tensor([3.0, nan, 1.0, -1.0, 7.0])
    for largest in (True, False):
        v, i = torch.topk(x.to("tpu"), 2, largest=largest)
        ev, ei = torch.topk(x, 2, largest=largest)
        assert i.cpu().tolist() == ei.tolist()
        torch.testing.assert_close(v.cpu(), ev, equal_nan=True)


def test_rules_are_registered():
    ops = set(torch_tpu.registered_lowerings())
    for op in [
        "aten::amax",
        "aten::amin",
        "aten::max",
        "aten::min",
        "aten::max.dim",
        "aten::min.dim",
        "aten::argmax",
        "aten::argmin",
        "aten::prod",
        "aten::prod.dim_int",
        "aten::var.correction",
        "aten::std.correction",
        "aten::any",
        "aten::any.dim",
        "aten::any.dims",
        "aten::all",
        "aten::all.dim",
        "aten::all.dims",
        "aten::logsumexp",
        "aten::nansum",
        "aten::mean",
        "aten::cumsum",
        "aten::cumprod",
        "aten::sort.stable",
        "aten::sort",
        "aten::topk",
    ]:
        assert op in ops, op


def test_histogram_and_histogramdd():
    """torch.histogram / histogramdd without a host sync: bin counts, edges
    (the data's range, widened when it is one value), weights, density, explicit
    edges, out-of-range and edge values; NaN data without a range raises as on CPU."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    x[:3] = torch.tensor([5.0, -5.0, 0.0])
    w = torch.rand(1000, generator=g)
    pts = torch.randn(200, 3, generator=g)
    cases = [
        lambda a, w: torch.histogram(a, 7),
        lambda a, w: torch.histogram(a, 10, range=(-1.0, 2.0), weight=w, density=True),
        lambda a, w: torch.histogram(a, torch.tensor([-3.0, -1.0, 0.0, 0.5, 5.0], device=a.device)),
        lambda a, w: torch.histogram(a[3:4], 4),  # one value: the range widens by 1/2 each way
        lambda a, w: torch.histogramdd(a[:999].reshape(333, 3), [3, 4, 5], weight=w[:333], density=True),
    ]
    with torch_tpu.set_fallback("error"):
        for fn in cases:
            for actual, expected in zip(fn(x.to("tpu"), w.to("tpu")), fn(x, w), strict=True):
                for a, e in zip(
                    actual if isinstance(actual, (list, tuple)) else [actual],
                    expected if isinstance(expected, (list, tuple)) else [expected],
                    strict=True,
                ):
                    torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-6)
        edges = [torch.tensor([-2.0, 0.0, 2.0]), torch.tensor([-1.0, 1.0]), torch.tensor([-3.0, -1.0, 1.0, 3.0])]
        expected = torch.histogramdd(pts, edges).hist
        actual = torch.histogramdd(pts.to("tpu"), [e.to("tpu") for e in edges]).hist
        torch.testing.assert_close(actual.cpu(), expected)
        with pytest.raises(RuntimeError, match="not finite"):
            torch.histogram(torch.tensor([1.0, float("nan")], device="tpu"), 3).hist.cpu()


def test_all_any_out_dtypes_as_on_cpu():
    # A float out= tensor is refused with CPU's message; a uint8 one tests the
    # input converted to uint8 (0.5 counts as zero), as CPU's legacy path does.
    x = torch.tensor([[0.5, 2.0, 3.0], [1.5, 0.25, 4.0]])
    for fn, name in ((torch.all, "all"), (torch.any, "any")):
        with pytest.raises(RuntimeError, match=f"{name} only supports bool tensor for result"):
            fn(x.to("tpu"), 0, out=torch.empty(3, device="tpu"))
        for dim in (0, 1):
            expected = fn(x, dim, out=torch.empty(0, dtype=torch.uint8))
            with torch_tpu.set_fallback("error"):
                actual = fn(x.to("tpu"), dim, out=torch.empty(0, dtype=torch.uint8, device="tpu"))
            assert torch.equal(actual.cpu(), expected)
