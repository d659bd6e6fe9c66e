"""Data movement and indexing lowerings, each compared against CPU PyTorch.

Every test runs with the CPU fallback off, so a missing rule fails instead of
silently running on CPU.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, compare_fn

import torch_tpu


@pytest.fixture(autouse=True)
def no_fallback():
    with torch_tpu.set_fallback("error"):
        yield


def tpu(t):
    return t.to("tpu")


def same(fn, *args, **tol):
    """fn on tpu copies of args vs fn on the CPU args."""
    out = fn(*[tpu(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert_same(out, fn(*args), **tol)


def rand(*shape):
    return torch.randn(*shape)


def ints(*shape):
    return torch.randint(-50, 50, shape)


# ------------------------------------------------------------------ shape ops


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim):
    a, b = rand(2, 3), rand(2, 3)
    same(lambda a, b: torch.cat([a, b, a], dim), a, b)


def test_cat_promotes_and_skips_legacy_empty():
    a, b = ints(2, 3), rand(1, 3)
    same(lambda a, b, e: torch.cat([a, e, b]), a, b, torch.empty(0))
    same(lambda a, b: torch.cat([a.bool(), b > 0], 0), a, b)
    same(lambda a, b: torch.stack([a, b[0].expand(2, 3).long()], -1), a, b)


def test_cat_out_and_empty_result():
    a = rand(2, 3)
    out = tpu(torch.empty(4, 3))
    torch.cat([tpu(a), tpu(a)], out=out)
    assert_same(out, torch.cat([a, a]))
    same(lambda a: torch.cat([a[:, :0], a[:, :0]], 1), a)


@pytest.mark.parametrize("dims", [[0], [-1], [0, 2], []])
def test_flip(dims):
    same(lambda x: x.flip(dims), rand(2, 3, 4))


def test_flip_int_and_bool():
    x = ints(3, 4)
    same(lambda x: x.flip(1), x)
    same(lambda x: (x > 0).flip(0), x)


@pytest.mark.parametrize(("shifts", "dims"), [(1, 0), (-2, 1), (7, -1), ((1, 2), (0, 1)), (5, None), (0, 0)])
def test_roll(shifts, dims):
    same(lambda x: x.roll(shifts, dims), rand(3, 4))


@pytest.mark.parametrize("diagonal", [0, 1, -1, 5, -5])
@pytest.mark.parametrize("op", ["triu", "tril"])
def test_triangles(op, diagonal):
    same(lambda x: getattr(x, op)(diagonal), rand(2, 3, 4))
    same(lambda x: getattr(x, op)(diagonal), ints(4, 3))


def test_triangle_inplace_on_a_transposed_view():
    base = rand(3, 4)
    x, y = tpu(base), base.clone()
    x.t().triu_(1)
    y.t().triu_(1)
    assert_same(x, y)


@pytest.mark.parametrize("pad", [(1, 2), (1, -1), (-1, -2, 2, 0), (0, 0, 0, 0, 1, 1), (2, 1, -1, 3)])
def test_constant_pad(pad):
    same(lambda x: torch.nn.functional.pad(x, pad, value=2.5), rand(2, 3, 4))
    same(lambda x: torch.constant_pad_nd(x, pad, 7), ints(2, 3, 4))


@pytest.mark.parametrize("repeats", [(2, 1), (1, 3), (2, 2, 2), (0, 1)])
def test_repeat(repeats):
    same(lambda x: x.repeat(*repeats), rand(2, 3))
    same(lambda x: (x > 0).repeat(*repeats), ints(2, 3))


# ------------------------------------------------------------------ index_select, gather, scatter


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim):
    x = rand(3, 4, 5)
    idx = torch.tensor([2, 0, 2, 1])
    same(lambda x, i: x.index_select(dim, i), x, idx)
    same(lambda x, i: x.index_select(dim, i.int()), ints(3, 4, 5), idx)
    same(lambda x, i: x.index_select(dim, i), x, torch.tensor(1))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = rand(3, 4)
    idx = torch.randint(0, x.shape[dim], (2, 3))
    same(lambda x, i: x.gather(dim, i), x, idx)
    same(lambda x, i: x.gather(dim, i), ints(3, 4), idx)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_src_value_add(dim):
    x, src = rand(3, 4), rand(3, 4)
    # Distinct targets along dim, so replacing is deterministic.
    idx = torch.argsort(torch.rand(3, 4), dim=dim).narrow(dim, 0, 2)
    same(lambda x, i, s: x.scatter(dim, i, s), x, idx, src)
    same(lambda x, i: x.scatter(dim, i, -3.0), x, idx)
    dup = torch.randint(0, x.shape[dim], (3, 2))
    same(lambda x, i, s: x.scatter_add(dim, i, s), x, dup, src)
    same(lambda x, i, s: x.scatter_add(dim, i, s), ints(3, 4), dup, ints(3, 4))


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_legacy_reduce(reduce):
    x, src = rand(3, 4), rand(3, 4)
    idx = torch.randint(0, 3, (2, 4))
    same(lambda x, i, s: x.scatter(0, i, s, reduce=reduce), x, idx, src)
    same(lambda x, i: x.scatter(0, i, 2.0, reduce=reduce), x, idx)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce(reduce, include_self):
    x, src = rand(4, 3), rand(5, 3)
    idx = torch.randint(0, 4, (5, 3))
    same(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src)
    xi, si = ints(4, 3), ints(5, 3)
    same(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self), xi, idx, si)


def test_scatter_reduce_mean_is_native():
    x, src, idx = rand(4, 3), rand(5, 3), torch.randint(0, 4, (5, 3))
    with torch_tpu.set_fallback("error"):
        out = tpu(x).scatter_reduce(0, tpu(idx), tpu(src), "mean")
    assert_same(out, x.scatter_reduce(0, idx, src, "mean"))


def test_scatter_inplace_on_a_view():
    base = rand(4, 6)
    x, y = tpu(base), base.clone()
    idx = torch.tensor([[0, 2], [1, 0]])
    x[1:3, ::2].scatter_(1, tpu(idx), 9.0)
    y[1:3, ::2].scatter_(1, idx, 9.0)
    assert_same(x, y)
    x.t().scatter_add_(0, tpu(idx), tpu(torch.ones(2, 2)))
    y.t().scatter_add_(0, idx, torch.ones(2, 2))
    assert_same(x, y)


@pytest.mark.parametrize("dim", [0, -1])
def test_index_fill(dim):
    x = rand(3, 4)
    idx = torch.tensor([0, -1])
    same(lambda x, i: x.index_fill(dim, i, 5.0), x, idx)
    same(lambda x, i, v: x.index_fill(dim, i, v), x, idx, torch.tensor(-2.0))
    base = rand(3, 5)
    y, z = tpu(base), base.clone()
    y[:, 1:].index_fill_(1, tpu(idx), 0.5)
    z[:, 1:].index_fill_(1, idx, 0.5)
    assert_same(y, z)


# ------------------------------------------------------------------ advanced indexing


@pytest.mark.parametrize(
    "key",
    [
        lambda i, j: (i,),
        lambda i, j: (slice(None), i),
        lambda i, j: (i, j),
        lambda i, j: (i[:, None], j),  # broadcasting index tensors
        lambda i, j: (slice(None), i, j),  # adjacent: the result keeps dim 0 first
        lambda i, j: (i, slice(None), j),  # not adjacent: the index dims go first
        lambda i, j: (Ellipsis, i),
        lambda i, j: (torch.tensor(-1), i),  # 0-d index, negative indices wrap
        lambda i, j: (-i - 1,),
    ],
)
def test_index(key):
    x = rand(3, 4, 5)
    i, j = torch.tensor([0, 2, 1]), torch.tensor([1, 0, 2])
    out = tpu(x)[tuple(tpu(k) if isinstance(k, torch.Tensor) else k for k in key(i, j))]
    assert_same(out, x[key(i, j)])
    xi = ints(3, 4, 5)
    assert_same(tpu(xi)[tuple(tpu(k) if isinstance(k, torch.Tensor) else k for k in key(i, j))], xi[key(i, j)])


def test_index_with_int32_and_list_indices():
    x = rand(4, 3)
    assert_same(tpu(x)[tpu(torch.tensor([3, 0]).int())], x[torch.tensor([3, 0]).int()])
    assert_same(tpu(x)[[3, 0, 3]], x[[3, 0, 3]])
    idx = torch.tensor([2, 0])  # index tensors on the CPU are uploaded, as CUDA does
    assert_same(tpu(x)[idx], x[idx])
    y, z = tpu(x), x.clone()
    y[idx] = 1.0
    z[idx] = 1.0
    assert_same(y, z)


def test_bool_mask_indexing_runs_on_the_device():
    # Each mask becomes its nonzero() coordinates (one sync), then int indexing.
    x = rand(3, 4)
    mask = x > 0
    assert_same(tpu(x)[tpu(mask)], x[mask])
    assert_same(tpu(x)[:, tpu(mask[0])], x[:, mask[0]])
    assert_same(tpu(x)[tpu(mask[:, 0]), 1:], x[mask[:, 0], 1:])
    assert_same(tpu(x)[tpu(mask & False)], x[mask & False])
    y, z = x.clone(), tpu(x)
    y[mask] = 0.0
    z[tpu(mask)] = 0.0
    assert_same(z, y)
    y[y < 0.5] += 2.0
    z[z < 0.5] += 2.0
    assert_same(z, y)


def test_bool_mask_of_the_wrong_shape_raises_index_error():
    with pytest.raises(IndexError, match="shape of the mask"):
        tpu(rand(3, 4))[torch.ones(4, dtype=torch.bool, device="tpu")]


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    x = rand(3, 4, 5)
    i, j = torch.tensor([0, 2]), torch.tensor([-1, 1])
    for key, values in [
        ((i,), rand(2, 4, 5)),
        ((i,), torch.tensor(3.0)),
        ((i, j), rand(5)),  # broadcast over the trailing dim
        ((None, i, j), rand(3, 2)),
        ((i, None, j), rand(2, 4)),  # not adjacent: index dims first
        ((i[:, None], j[None, :]), rand(2, 2, 5)),
    ]:
        put = torch.ops.aten.index_put  # takes None entries, unlike Tensor.index_put
        out = put(tpu(x), [tpu(k) if k is not None else None for k in key], tpu(values), accumulate)
        assert_same(out, put(x, list(key), values, accumulate))


def test_index_put_accumulates_duplicates_and_setitem_on_views():
    x = rand(5)
    idx = torch.tensor([1, 1, 3, 1])
    vals = rand(4)
    assert_same(tpu(x).index_put((tpu(idx),), tpu(vals), True), x.index_put((idx,), vals, True))
    base = rand(4, 6)
    y, z = tpu(base), base.clone()
    y.t()[tpu(torch.tensor([0, 5]))] = 7.0
    z.t()[torch.tensor([0, 5])] = 7.0
    assert_same(y, z)
    y[1:, ::2][tpu(torch.tensor([0, 2])), tpu(torch.tensor([1, 2]))] += 1.0
    z[1:, ::2][torch.tensor([0, 2]), torch.tensor([1, 2])] += 1.0
    assert_same(y, z)
    yi, zi = tpu(torch.zeros(4, dtype=torch.long)), torch.zeros(4, dtype=torch.long)
    yi.index_put_((tpu(torch.tensor([2, 2])),), tpu(torch.tensor([5, 6])), accumulate=True)
    zi.index_put_((torch.tensor([2, 2]),), torch.tensor([5, 6]), accumulate=True)
    assert_same(yi, zi)


def test_masked_fill():
    x = rand(3, 4)
    m = torch.rand(3, 4) > 0.5
    same(lambda x, m: x.masked_fill(m, -1.5), x, m)
    same(lambda x, m: x.masked_fill(m, torch.tensor(2.0)), x, m)
    same(lambda x, m: x.masked_fill(m[0], 0.0), x, m)  # broadcast mask
    same(lambda x, m: x.masked_fill(m, 7), ints(3, 4), m)
    same(lambda x, m: x.masked_fill(m, True), ints(3, 4) > 0, m)
    base = rand(4, 3)
    y, z = tpu(base), base.clone()
    y.t().masked_fill_(tpu(m), 9.0)
    z.t().masked_fill_(m, 9.0)
    assert_same(y, z)


def test_embedding_and_backward():
    weight = rand(10, 4)
    idx = torch.tensor([[1, 3, 1], [9, 0, 3]])
    same(lambda w, i: torch.nn.functional.embedding(i, w), weight, idx)
    for padding_idx, scale in [(None, False), (3, False), (None, True), (1, True)]:
        w_cpu = weight.clone().requires_grad_()
        w_tpu = tpu(weight).requires_grad_()
        grad = rand(2, 3, 4)
        torch.nn.functional.embedding(idx, w_cpu, padding_idx=padding_idx, scale_grad_by_freq=scale).backward(grad)
        torch.nn.functional.embedding(tpu(idx), w_tpu, padding_idx=padding_idx, scale_grad_by_freq=scale).backward(
            tpu(grad)
        )
        assert_same(w_tpu.grad, w_cpu.grad)


# ------------------------------------------------------------------ out-of-range indices


OUT_OF_RANGE_OPS = [
    lambda x, i: x.index_select(0, i),
    lambda x, i: x.gather(0, i[:, None].expand(2, 4)),
    lambda x, i: x[i],
    lambda x, i: x.index_put((i,), torch.tensor(1.0, device=x.device)),
    lambda x, i: x.scatter(0, i[:, None].expand(2, 4), 1.0),
    lambda x, i: torch.nn.functional.embedding(i, x),
    lambda x, i: x.index_add(0, i, torch.ones(2, 4, device=x.device)),
    lambda x, i: x.index_copy(0, i, torch.ones(2, 4, device=x.device)),
]


def cpu_error(op, x, i):
    with pytest.raises((IndexError, RuntimeError)) as e:
        op(x, i)
    return e.type


@pytest.mark.parametrize("op", OUT_OF_RANGE_OPS)
def test_out_of_range_index_raises_at_the_next_host_read(op):
    # XLA clamps gathers and drops scattered updates; the device-side range
    # check surfaces at the next host read (Strict), as CUDA's does, with the
    # class CPU raises (IndexError, or RuntimeError for gather and scatter).
    x, i = rand(3, 4), torch.tensor([0, 3])
    with pytest.raises(cpu_error(op, x, i), match="out of (range|bounds)") as e:
        op(tpu(x), tpu(i)).cpu()
    assert e.type is cpu_error(op, x, i)
    assert (tpu(x) + 1).cpu().shape == (3, 4)  # the process stays usable


@pytest.mark.parametrize("op", OUT_OF_RANGE_OPS)
def test_out_of_range_index_raises_at_the_op_in_debug_mode(op):
    x, i = rand(3, 4), torch.tensor([0, 3])
    with torch_tpu.set_eager_mode("debug"), pytest.raises(cpu_error(op, x, i), match="out of (range|bounds)") as e:
        op(tpu(x), tpu(i))
    assert e.type is cpu_error(op, x, i)


def test_negative_indices_in_range_do_not_raise():
    x = rand(3, 4)
    i = torch.tensor([-1, -3])
    assert_same(tpu(x)[tpu(i)], x[i])
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag(mode, padding_idx):
    """F.embedding_bag forward and backward (an empty bag, padding, per-sample
    weights for sum, include_last_offset), and the auxiliary outputs the
    backward reads: each index's bag, the bag sizes, the rows of the maxima."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 3, generator=g)
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])
    psw = torch.rand(8, generator=g) if mode == "sum" else None

    def fn(w, *extra):
        on = dict(device=w.device)
        out = F.embedding_bag(indices.to(**on), w, offsets.to(**on), mode=mode, padding_idx=padding_idx,
                              per_sample_weights=extra[0] if extra else None)  # fmt: skip
        last = F.embedding_bag(indices.to(**on), w, torch.tensor([0, 3, 3, 8], **on), mode=mode,
                               padding_idx=padding_idx, include_last_offset=True)  # fmt: skip
        return torch.cat([out, last])

    compare_fn(fn, weight, *([psw] if psw is not None else []), grad_args=(0,))
    code = {"sum": 0, "mean": 1, "max": 2}[mode]
    expected = torch.ops.aten._embedding_bag(
        weight, indices, offsets, False, code, False, None, False, padding_idx or -1
    )
    with torch_tpu.set_fallback("error"):
        actual = torch.ops.aten._embedding_bag(
            weight.to("tpu"), indices.to("tpu"), offsets.to("tpu"), False, code, False, None, False, padding_idx or -1
        )
    assert torch.equal(actual[1].cpu(), torch.tensor([0, 0, 0, 2, 2, 2, 3, 3]))  # CPU leaves it empty for plain sum
    assert torch.equal(actual[2].cpu(), expected[2])
    if mode == "max":
        assert torch.equal(actual[3].cpu(), expected[3])


def test_bad_advanced_indices_raise_cpus_errors():
    # PyTorch's test_indexing.py checks these error types and messages; the
    # general kernel raises them before any program is built.
    cases = [
        (IndexError, "for dimension with size 0", lambda d: torch.empty(10, 0, device=d)[:, [0, 1]]),
        (IndexError, "shape mismatch", lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]]),
        (IndexError, "shape mismatch", lambda d: torch.zeros(5, 5, device=d).__setitem__(([0, 1], [0, 1, 2]), 0)),
        (IndexError, "must be long, int, byte or bool", lambda d: torch.ones(3, device=d)[torch.ones(1, device=d)]),
        (IndexError, None, lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...]),
    ]
    for error, match, fn in cases:
        with pytest.raises(error, match=match):
            fn("cpu")
        with torch_tpu.set_fallback("error"), pytest.raises(error, match=match):
            fn("tpu")
    a = torch.arange(4, device="tpu")
    for value in ([], [1, 2, 3]):
        with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[\d\] cannot be broadcast"):
            a[a > -1] = torch.tensor(value).to("tpu")
            torch.tpu.synchronize()  # in Fused mode the mask's count is on the device: raised here


def test_uint8_masks_warn_as_on_cpu():
    v = torch.randn(5, 7, 3)
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)
    with pytest.warns(UserWarning, match="indexing with dtype torch.uint8 is now deprecated"):
        got = v.to("tpu")[mask.to("tpu")]
    assert torch.equal(got.cpu(), v[mask.bool()])


def test_masked_assignment_in_a_scripted_function():
    # TorchScript passes index_put_'s Tensor?[] indices as a plain list.
    def fill_small(x):
        x[x < 50] = 1.0
        return x

    scripted = torch.jit.script(fill_small)
    data = torch.arange(100, dtype=torch.float)
    with torch_tpu.set_fallback("error"):
        got = scripted(data.clone().to("tpu")).cpu()
    assert torch.equal(got, fill_small(data.clone()))
