"""torch.tpu streams and events, and UntypedStorage.resize_ (what FSDP2 and DDP use)."""

import threading

import pytest
import torch

import torch_tpu


def test_streams_are_named_per_device_and_thread():
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream(device=1, priority=-1)
    assert isinstance(s1, torch.tpu.Stream) and s1.stream_id != s2.stream_id
    assert s1.device == torch.device("tpu", 0) and s2.device == torch.device("tpu", 1)
    assert torch.tpu.current_stream() == torch.tpu.default_stream() and torch.tpu.default_stream().stream_id == 0
    with torch.tpu.stream(s1):
        assert torch.tpu.current_stream() == s1
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.tpu.current_stream()))
        t.start()
        t.join()
        assert seen[0].stream_id == 0  # the current stream is per thread
        x = torch.ones(3, device="tpu") * 2  # work on any stream is ordered by its data
    assert torch.tpu.current_stream().stream_id == 0
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    s1.wait_stream(torch.tpu.current_stream())
    s1.synchronize()
    assert s1.query()


def test_events_complete_with_the_work_recorded_before_them():
    x = torch.randn(256, 256, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    y = x
    for _ in range(5):
        y = y @ x
    end.record()
    assert end.query()  # a timing event waited for its work at record()
    assert start.elapsed_time(end) > 0
    e = torch.tpu.Event()
    z = y.sum()
    e.record()
    e.synchronize()
    assert e.query()
    torch.tpu.current_stream().wait_event(e)
    torch.testing.assert_close(z.cpu(), y.cpu().sum(), rtol=1e-4, atol=0)
    assert isinstance(e, torch.tpu.Event) and not isinstance(torch.Event(device="cpu"), torch.tpu.Event)
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        e.elapsed_time(end)


def test_a_fused_window_is_waited_for_by_events_and_synchronize():
    # The window's results move into the placeholders the tensors hold, and
    # those are what synchronize and events wait for (a first version waited
    # for the results, which die at the flush: synchronize returned at once).
    x = torch.randn(1024, 1024, device="tpu")
    with torch_tpu.set_eager_mode("fused"):
        y = x
        for _ in range(12):  # ~26 GFLOP: far longer than the record-to-query gap
            y = torch.tanh(y @ x)
        e = torch.tpu.Event()
        e.record()  # flushes the window and launches it
        assert not e.query()
        torch.tpu.synchronize()
        assert e.query()
    torch.testing.assert_close(y.cpu(), y.cpu())


def test_non_blocking_copy_to_pinned_memory_completes_with_an_event():
    x = torch.arange(1 << 16, dtype=torch.float32, device="tpu") * 3
    host = x.to("cpu", non_blocking=True)  # started, not awaited, as CUDA does into pinned memory
    rows = x[5:9].to("cpu", non_blocking=True)  # a view: read densely first
    assert host.is_pinned() and rows.is_pinned()
    done = torch.tpu.Event()
    done.record()
    done.synchronize()
    assert done.query()
    torch.testing.assert_close(host, torch.arange(1 << 16, dtype=torch.float32) * 3)
    assert rows.tolist() == [15.0, 18.0, 21.0, 24.0]
    into = torch.empty(4, dtype=torch.int64, pin_memory=True)
    into.copy_(torch.tensor([7, 8, 9, 10], device="tpu"), non_blocking=True)
    torch.tpu.synchronize()  # waits for host copies too
    assert into.tolist() == [7, 8, 9, 10]
    converted = torch.empty(2, dtype=torch.float64, pin_memory=True)  # a dtype change: copied at once
    converted.copy_(torch.tensor([1.5, 2.5], device="tpu"), non_blocking=True)
    assert converted.tolist() == [1.5, 2.5]


def test_a_failed_check_surfaces_at_the_event_after_a_non_blocking_copy():
    bad = torch.arange(3.0, device="tpu")[torch.tensor([0, 5], device="tpu")]
    host = bad.to("cpu", non_blocking=True)
    done = torch.tpu.Event()
    done.record()
    with pytest.raises(IndexError, match="out of bounds"):
        done.synchronize()
    assert host.shape == (2,)
    assert torch.ones(2, device="tpu").cpu().tolist() == [1.0, 1.0]  # reported once; the process goes on


def test_a_host_read_waits_for_the_checks_launched_before_its_value_only():
    # Strict mode (each op its own launch): reading a value launched before a
    # failing op does not wait for it; the failure surfaces at the next read of
    # a later value or at synchronize. In Fused mode both are in one window.
    early = torch.ones(2, device="tpu") * 2
    bad = torch.arange(3.0, device="tpu")[torch.tensor([4], device="tpu")]
    if torch_tpu.get_eager_mode() == "strict":
        assert early.tolist() == [2.0, 2.0]
    with pytest.raises(IndexError, match="out of bounds"):
        torch.tpu.synchronize()
    del bad


def test_storage_resize_keeps_contents_and_accounts_memory():
    t = torch.arange(4.0, device="tpu")
    storage = t.untyped_storage()
    before = torch.tpu.memory_allocated()
    storage.resize_(32)  # grow: the old bytes kept, the new ones zeros
    assert storage.nbytes() == 32 and torch.tpu.memory_allocated() == before + 16
    view = torch.empty(0, device="tpu").set_(storage, 0, (8,))
    assert view.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    storage.resize_(8)  # shrink: the prefix kept
    assert torch.empty(0, device="tpu").set_(storage, 0, (2,)).cpu().tolist() == [0.0, 1.0]
    storage.resize_(0)  # free (FSDP2 after its all-gather)
    assert storage.nbytes() == 0 and torch.tpu.memory_allocated() == before - 16
    storage.resize_(16)  # and allocate again: written before it is read
    refilled = torch.empty(0, device="tpu").set_(storage, 0, (4,))
    refilled.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    assert t.cpu().tolist() == [5.0, 6.0, 7.0, 8.0]  # the original tensor sees the same storage


def test_set_device_checks_the_range():
    with pytest.raises((IndexError, ValueError), match="out of range"):
        torch.tpu.set_device(torch.tpu.device_count())
