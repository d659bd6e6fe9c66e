"""Views share storage: reads see through (sizes, strides, offset), and a write
through any alias is seen by every other, exactly as on CPU."""

import torch
from conftest import assert_same


def run_both(fn):
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    c, t = base.clone(), base.to("tpu")
    rc, rt = fn(c), fn(t)
    return (c, rc), (t, rt)


def check(fn):
    (c, rc), (t, rt) = run_both(fn)
    assert_same(t, c)
    if isinstance(rc, torch.Tensor):
        assert_same(rt, rc)


def test_view_ops_read():
    check(lambda x: x.view(3, 8))
    check(lambda x: x.reshape(2, 12))
    check(lambda x: x.transpose(0, 1))
    check(lambda x: x.permute(1, 0))
    check(lambda x: x[1:3, ::2])
    check(lambda x: x.select(1, 2))
    check(lambda x: x[2])
    check(lambda x: x[:, 1:2].expand(4, 5))
    check(lambda x: x.t().reshape(24))  # reshape of a non-contiguous view copies
    check(lambda x: x.unsqueeze(0).squeeze(0).narrow(1, 2, 3))


def test_inplace_on_views_is_seen_by_every_alias():
    def row(x):
        x[1].add_(1)

    def column(x):
        x[:, 2].mul_(-1)

    def transposed(x):
        x.t()[3].sub_(100)

    def strided(x):
        x[::2, 1::3].add_(torch.ones(2, 2, device=x.device))

    def chained(x):
        v = x.view(6, 4)
        v[1:3].add_(5)
        x.add_(1)

    for fn in (row, column, transposed, strided, chained):
        check(fn)


def test_alias_sees_write_through_other_alias():
    x = torch.zeros(2, 3, device="tpu")
    y = x.view(6)
    x[0, 1].fill_(7)
    assert y.cpu().tolist() == [0, 7, 0, 0, 0, 0]
    y[4:].add_(2)
    assert x.cpu().tolist() == [[0, 7, 0], [0, 2, 2]]


def test_inplace_broadcast_error_is_pytorchs():
    x = torch.zeros(3, device="tpu")
    try:
        x.add_(torch.ones(2, 3, device="tpu"))
    except RuntimeError as e:
        assert "doesn't match the broadcast shape" in str(e)
    else:
        raise AssertionError("expected an error")


def test_set_shares_storage_with_the_source():
    src = torch.arange(6.0, device="tpu")
    x = torch.empty(0, device="tpu")
    x.set_(src)
    x.add_(1)
    assert src.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = torch.empty(0, device="tpu").set_(src.untyped_storage(), 2, (2, 2), (1, 2))
    assert y.cpu().tolist() == [[3.0, 5.0], [4.0, 6.0]]
    y.mul_(10)
    assert src.cpu().tolist() == [1.0, 2.0, 30.0, 40.0, 50.0, 60.0]
    z = torch.empty(3, device="tpu").set_()
    assert z.shape == (0,)


def math_views(dev):
    """Negative views (x._neg_view(): the values are the negated stored ones) read,
    copied both ways and written through, as PyTorch's device-generic tests use them."""
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    n = x._neg_view()
    out = {"read": n + 1, "t": n.t() * 2, "slice": n[1:, ::2].sum(0), "mm": n @ x.t(), "double": n._neg_view() * 1}
    out["item"] = torch.tensor(n[1, 2].item())
    out["to_cpu"] = n.cpu().resolve_neg()
    y = x.clone()
    y._neg_view().add_(1)
    y._neg_view()[0] = 5
    out["written"] = y
    torch.mul(x, 2, out=(z := x.clone())._neg_view())
    out["out="] = z
    src = torch.randn(10, 10, generator=torch.Generator().manual_seed(0)).to(dev).t()
    (d1 := torch.empty(10, 10, device=dev))._neg_view().copy_(src)  # crashed the process (endless recursion)
    (d2 := torch.empty(10, 10, device=dev)).copy_(src._neg_view())
    (d3 := torch.empty(10, 10, device=dev)._neg_view()).copy_(src._neg_view())
    (h := torch.empty(10, 10)._neg_view()).copy_(src)  # into a host negative view
    out.update(copy_into_neg=d1, copy_from_neg=d2, neg_to_neg=d3.resolve_neg(), host_neg=h.resolve_neg())
    return {k: v.cpu() for k, v in out.items()}


def test_negative_views_match_cpu():
    want, got = math_views("cpu"), math_views("tpu")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


def test_a_slice_of_an_untyped_storage_raises_instead_of_crashing():
    import pytest

    s = torch.arange(6.0, device="tpu").untyped_storage()
    assert s[4] == torch.arange(6.0).untyped_storage()[4]  # element access of the storage itself works
    with pytest.raises(RuntimeError, match=r"slice of an UntypedStorage \(storage\[a:b\]\)"):
        s[4:8][0]  # was a floating point exception
    with pytest.raises(RuntimeError, match="slice of an UntypedStorage"):
        s[0:8].cpu()
    assert (torch.ones(2, device="tpu") + 1).tolist() == [2.0, 2.0]  # the process stays usable


def test_blocked_views_read_and_written_without_gather_or_scatter():
    """A view whose dims step over whole blocks of each other (q, k and v of one
    fused projection, a column, every other row, as_strided with gaps) is read
    with a slice, a reshape and a transpose, not a gather of every element, and
    written with a dynamic_update_slice, not a scatter; k and v end past the
    storage's last block. Overlapping views still gather."""
    import torch_tpu

    def qkv(x):  # x: [b, t, 3 * h * dh]
        return [z.view(3, 5, 2, 4).transpose(1, 2) for z in x.split(8, -1)]

    cases = [
        (lambda: torch.randn(3, 5, 24), qkv),
        (lambda: torch.randn(3, 5, 24, dtype=torch.complex64), qkv),
        (lambda: torch.randint(-9, 9, (3, 5, 24)), qkv),
        (lambda: torch.randn(3, 5, 24) > 0, qkv),
        (lambda: torch.randn(7, 6), lambda x: [x[:, 2], x[::2], x[1::3, ::2], x[:, 1::2].t()]),
        (lambda: torch.randn(40), lambda x: [torch.as_strided(x, (3, 4), (10, 2), 1)]),
    ]
    mlir = []
    torch_tpu._C._set_program_listener(lambda family, key, text, how, context, ms: mlir.append(text))
    try:
        for make, views in cases:
            x = make()
            for got, want in zip(views(x.to("tpu")), views(x), strict=True):
                assert_same(got.contiguous(), want.contiguous())
        assert mlir and not any("gather" in text for text in mlir)
        for make, views in cases:  # writes through them: no scatter
            x = make()
            t = x.to("tpu")
            for got, want in zip(views(t), views(x), strict=True):
                got.copy_(got.flip(0) if got.dtype != torch.bool else ~got)
                want.copy_(want.flip(0) if want.dtype != torch.bool else ~want)
            assert_same(t, x)
        assert not any("scatter" in text for text in mlir)
        x = torch.randn(9)
        assert_same(torch.as_strided(x.to("tpu"), (3, 3), (1, 1)) + 0, torch.as_strided(x, (3, 3), (1, 1)) + 0)
        assert any("gather" in text for text in mlir)  # overlapping: still one gather
    finally:
        torch_tpu._C._set_program_listener(None)
