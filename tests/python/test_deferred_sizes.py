"""Data-dependent ops in Fused windows: nonzero, masked_select and x[mask]
keep their count on the device and their result padded (deferred sizes), so
the window goes on; the host waits only when a size is read.

Each test compares with CPU PyTorch and checks through the metrics how many
windows ran (fused_flushes) and why they flushed (fused_flush_<reason>).
"""

import pytest
import torch
from conftest import assert_same
from conftest import metric_delta as delta

import torch_tpu


def window_of(fn, *cpu_inputs):
    """Runs fn on tpu copies of the inputs in one Fused window (closed by
    mark_step) and on CPU: returns (tpu results, CPU results, metrics before)."""
    tpu_inputs = [x.to("tpu") for x in cpu_inputs]
    torch_tpu.mark_step()
    before = torch_tpu.metrics()
    out = fn(*tpu_inputs)
    torch_tpu.mark_step()
    return out, fn(*cpu_inputs), before


def detection_loss(x, scores):
    """What a detector's loss does: keep the boxes above a threshold, their
    indices, sums and means over the kept ones, a masked assignment."""
    keep = scores > 0.3
    idx = torch.nonzero(keep)
    kept = torch.masked_select(scores, keep)
    rows = x[keep]  # [count, 4]
    y = x.clone()
    y[scores < 0.1] = torch.zeros((), device=x.device)  # masked assignment: no count needed
    return (
        kept.sum() + kept.mean() * 2,
        (rows * 0.5 + 1).sum(0),
        idx.sum(0),
        (kept > 0.5).any(),
        y.sum(),
    )


def test_a_window_with_nonzero_and_masked_select_stays_one_window(fused):
    torch.manual_seed(1)
    x, scores = torch.randn(64, 4), torch.rand(64)
    out, ref, before = window_of(detection_loss, x, scores)
    assert delta(before, "fused_flushes") == 1  # the mark_step: nothing waited for a count
    assert delta(before, "fused_flush_size_read") == 0
    assert delta(before, "fused_flush_data_dependent") == 0
    assert delta(before, "deferred_counts") == 3
    for a, b in zip(out, ref, strict=True):
        assert_same(a, b, atol=1e-5, rtol=1e-5)
    assert delta(before, "deferred_size_reads") == 0  # the results above were scalars or static


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])  # no element kept, some, all
def test_deferred_results_match_cpu_when_read(fused, p):
    x = torch.randn(5, 7)
    keep = torch.rand(5, 7) < p
    t, k = x.to("tpu"), keep.to("tpu")
    before = torch_tpu.metrics()
    i, v, r = torch.nonzero(k), torch.masked_select(t, k), t[k[:, 0]]
    s = (v.sum(), v.mean())
    assert delta(before, "fused_flushes") == 0
    assert i.shape == torch.nonzero(keep).shape  # reading a size waits for the count: one flush
    assert delta(before, "fused_flush_size_read") == 1
    assert_same(i, torch.nonzero(keep))
    assert_same(v, torch.masked_select(x, keep))
    assert_same(r, x[keep[:, 0]])
    torch.testing.assert_close(s[0].cpu(), torch.masked_select(x, keep).sum())
    torch.testing.assert_close(s[1].cpu(), torch.masked_select(x, keep).mean(), equal_nan=True)  # nan for none


def test_reading_a_size_in_python_learns_it_once(fused):
    x = torch.arange(12.0).reshape(3, 4)
    v = torch.masked_select(x.to("tpu"), x.to("tpu") > 4.5)
    w = v * 3  # same deferred size
    before = torch_tpu.metrics()
    assert len(v) == 7 and v.numel() == 7 and v.dim() == 1
    assert w.shape == (7,)  # the count was read once for both
    assert delta(before, "deferred_size_reads") == 1
    assert str(w.cpu()) == str(torch.masked_select(x, x > 4.5) * 3)
    assert w.tolist() == (torch.masked_select(x, x > 4.5) * 3).tolist()


def test_ops_that_need_the_count_learn_it_and_stay_exact(fused):
    x = torch.randn(40)
    t = x.to("tpu")
    for threshold in (0.5, 10.0):  # some kept; none kept (max of no elements raises, as on CPU)
        v, ref = t[t > threshold], x[x > threshold]
        if ref.numel():
            assert_same(v.max(), ref.max())
            assert_same(torch.cat([v, v * 2]), torch.cat([ref, ref * 2]))
            assert_same(v[1:], ref[1:])
            assert_same(v.sort().values, ref.sort().values)
        else:
            with pytest.raises((RuntimeError, IndexError)):
                v.max()
                torch.tpu.synchronize()
    assert torch_tpu.metrics().get("deferred_size_reads", 0) >= 1


def test_lists_of_deferred_tensors_learn_them(fused):
    x = torch.randn(20)
    t = x.to("tpu")
    v, w, a = t[t > 0], t[t < 0], t[t > 0.5]  # none of them read yet
    assert_same(torch.cat([v, w]), torch.cat([x[x > 0], x[x < 0]]))
    assert_same(torch.stack([a, a * 2]), torch.stack([x[x > 0.5], x[x > 0.5] * 2]))


def test_in_place_and_nonzero_as_tuple(fused):
    x = torch.randn(4, 6)
    t = x.to("tpu")
    v = t[t > 0]
    v.mul_(2).add_(1)
    ref = x[x > 0] * 2 + 1
    assert_same(v, ref)
    for a, b in zip(torch.nonzero(t > 0, as_tuple=True), torch.nonzero(x > 0, as_tuple=True), strict=True):
        assert_same(a, b)


def test_leading_dims_mask_and_dtypes(fused):
    x = torch.randint(-5, 5, (3, 4, 2), dtype=torch.int32)
    m = torch.rand(3, 4) > 0.4
    assert_same(x.to("tpu")[m.to("tpu")], x[m])
    b = torch.rand(3, 4, 2) > 0.5
    assert_same(b.to("tpu")[m.to("tpu")], b[m])
    assert_same((x.to("tpu")[m.to("tpu")] + 1).sum(0), (x[m] + 1).sum(0))


def test_autograd_through_masked_select_and_mask_index(fused):
    x = torch.randn(5, 3, requires_grad=True)
    keep = torch.rand(5) > 0.3
    t = x.detach().to("tpu").requires_grad_()
    (t[keep.to("tpu")].pow(2).sum() + torch.masked_select(t, t > 0).sum()).backward()
    (x[keep].pow(2).sum() + torch.masked_select(x, x > 0).sum()).backward()
    assert_same(t.grad, x.grad)


def test_strict_mode_keeps_counting_first():
    x = torch.randn(8)
    with torch_tpu.set_eager_mode("strict"):
        before = torch_tpu.metrics()
        v = torch.masked_select(x.to("tpu"), x.to("tpu") > 0)
        assert delta(before, "deferred_counts") == 0
        assert_same(v, torch.masked_select(x, x > 0))


def test_masked_assignment_with_a_device_value_needs_no_count():
    x = torch.randn(6, 5)
    ref = x.clone()
    ref[ref > 0] = 2.5
    with torch_tpu.set_eager_mode("strict"):
        t = x.to("tpu")
        torch.tpu.synchronize()
        before = torch_tpu.metrics()
        t[t > 0] = torch.tensor(2.5, device="tpu")
        assert delta(before, "fused_flush_data_dependent") == 0
        assert_same(t, ref)
    i = torch.randint(0, 9, (6,))
    ref_i = i.clone()
    ref_i[ref_i > 4] = 7
    ti = i.to("tpu")
    ti[ti > 4] = torch.tensor(7, device="tpu")
    assert_same(ti, ref_i)
    # A device value of another dtype: index_put_'s dtype error, as with a CUDA value.
    with pytest.raises(RuntimeError, match="source and destination dtypes match"):
        ti[ti > 4] = torch.tensor(7.9, device="tpu")


def masked_assignments(x, mask, rows, row, column):
    """x[mask] = values of every shape index_put_ broadcasts: one row for all
    selected rows, a row per selected row, a column per selected row; and the
    functional index_put."""
    a, b, c = x.clone(), x.clone(), x.clone()
    a[mask] = row  # [4]: the same row everywhere
    b[mask] = rows  # [count, 4]
    c[mask] = column  # [count, 1]
    d = x.index_put((mask,), row.unsqueeze(0))  # [1, 4]
    return a, b, c, d


def test_masked_assignment_of_a_tensor_needs_no_count(fused):
    torch.manual_seed(0)
    x, mask = torch.randn(8, 4), torch.rand(8) > 0.5
    count = int(mask.sum())
    out, ref, before = window_of(
        masked_assignments,
        x,
        mask,
        torch.randn(count, 4),
        torch.randn(4),
        torch.randn(count, 1),
    )
    assert delta(before, "fused_flushes") == 1  # the mark_step: no count was read
    assert delta(before, "fused_flush_size_read") == 0 and delta(before, "fused_flush_data_dependent") == 0
    for a, b in zip(out, ref, strict=True):
        assert_same(a, b)


def test_masked_assignment_of_the_wrong_number_of_rows_raises_at_the_sync(fused):
    x, mask = torch.zeros(6, 3), torch.arange(6) % 2 == 0  # 3 rows selected
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[mask] = torch.ones(2, 3)  # CPU raises at once
    t = x.to("tpu")
    t[mask.to("tpu")] = torch.ones(2, 3, device="tpu")  # the count is on the device: raised at the sync
    with pytest.raises(RuntimeError, match=r"value tensor of shape \[2, 3\] .*selects n != 2 rows"):
        torch.tpu.synchronize()
    t = x.to("tpu")  # the process goes on
    t[mask.to("tpu")] = torch.ones(3, 3, device="tpu")
    assert t.sum().item() == 9


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_unique_along_a_dim_keeps_its_count_on_the_device(fused, consecutive, dim):
    torch.manual_seed(dim)
    x = torch.randint(0, 2, (3, 6, 2))  # rows repeat along every dim
    fn = torch.unique_consecutive if consecutive else torch.unique

    def uniques(t):
        values, inverse, counts = fn(t, dim=dim, return_inverse=True, return_counts=True)
        return values, inverse, counts, values.sum(), (counts * 2).sum()  # the sums run on the padding

    out, ref, before = window_of(uniques, x)
    assert delta(before, "fused_flushes") == 1 and delta(before, "fused_flush_data_dependent") == 0
    assert delta(before, "deferred_size_reads") == 0
    for a, b in zip(out, ref, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("consecutive", [False, True])
def test_unique_keeps_its_count_on_the_device(fused, consecutive):
    x = torch.randint(0, 6, (30,))
    fn = torch.unique_consecutive if consecutive else torch.unique
    out, ref, before = window_of(lambda t: fn(t, return_inverse=True, return_counts=True), x)
    assert delta(before, "fused_flushes") == 1 and delta(before, "fused_flush_data_dependent") == 0
    for a, b in zip(out, ref, strict=True):
        assert_same(a, b)
    values, inverse, counts = fn(x.to("tpu"), return_inverse=True, return_counts=True)
    assert_same((values * counts).sum(), (ref[0] * ref[2]).sum())  # on the padding, no read
