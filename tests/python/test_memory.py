"""Device memory accounting (torch.tpu.memory_*), out-of-memory errors, and no growth in a training loop."""

import os

import pytest
import torch

import torch_tpu  # noqa: F401


def test_accounting_rises_and_falls():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    stats = torch.tpu.memory_stats()
    x = torch.empty(1024, device="tpu")
    after = torch.tpu.memory_stats()
    assert torch.tpu.memory_allocated() - before == 4096
    assert after["allocated_bytes.all.current"] - stats["allocated_bytes.all.current"] == 4096
    assert after["allocation.all.current"] - stats["allocation.all.current"] == 1
    assert after["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.allocated"] == 4096
    y = x + 1  # an op's output is a storage too
    assert torch.tpu.memory_allocated() - before == 8192
    del x, y
    assert torch.tpu.memory_allocated() == before
    end = torch.tpu.memory_stats()
    assert end["allocated_bytes.all.freed"] - stats["allocated_bytes.all.freed"] == 8192
    assert end["allocation.all.current"] == stats["allocation.all.current"]


def test_views_do_not_allocate():
    x = torch.zeros(256, device="tpu")
    before = torch.tpu.memory_allocated()
    v = x.view(16, 16)[2:, 3:].t()
    v.add_(1)
    assert torch.tpu.memory_allocated() == before
    del x, v


def test_peak_and_reset():
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_allocated() == base
    x = torch.empty(1 << 18, device="tpu")  # 1 MiB
    del x
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() == base + (1 << 20)
    assert torch.tpu.memory_stats()["allocated_bytes.all.peak"] == base + (1 << 20)
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_memory_stats_reserved_and_info():
    stats = torch.tpu.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocation.all.current",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "num_ooms",
    ):
        assert key in stats, key
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    free, total = torch.tpu.mem_get_info()
    assert total == stats["capacity_bytes"] > 0
    assert 0 <= free <= total
    if torch_tpu._C.platform_name() == "cpu" and "TORCH_TPU_MEMORY_LIMIT" not in os.environ:
        # The CPU plugin reports no memory statistics: the capacity is the machine's RAM.
        assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    torch.tpu.empty_cache()  # nothing cached: accepted, changes nothing
    assert torch.tpu.memory_stats()["allocated_bytes.all.current"] == stats["allocated_bytes.all.current"]


def test_torch_accelerator_memory_calls():
    # vLLM and other libraries reach the allocator through torch.accelerator: the same numbers.
    acc = torch.accelerator
    assert acc.current_accelerator().type == "tpu"
    acc.synchronize()
    base = acc.memory_allocated()
    assert base == torch.tpu.memory_allocated()
    x = torch.empty(1 << 16, device="tpu")  # 256 KiB
    assert acc.memory_allocated() - base == 1 << 18
    assert acc.memory_reserved() >= acc.memory_allocated()
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_stats()["allocated_bytes.all.current"]
    assert stats["allocated_bytes.large_pool.current"] == stats["allocated_bytes.all.current"]
    assert stats["allocated_bytes.small_pool.current"] == 0
    free, total = acc.get_memory_info()
    assert (free, total) == torch.tpu.mem_get_info()
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == acc.memory_allocated()
    del x
    acc.empty_cache()
    assert acc.memory_allocated() == base
    assert acc.max_memory_allocated() == base + (1 << 18)


def test_pinned_host_memory():
    # pin_memory and torch.accelerator's host calls (vLLM's shutdown calls empty_host_cache).
    x = torch.arange(1000.0).pin_memory()
    assert x.is_pinned() and not torch.ones(3).is_pinned()
    assert torch.empty(8, pin_memory=True).is_pinned()
    torch.accelerator.empty_host_cache()
    torch.testing.assert_close(x.to("tpu", non_blocking=True).cpu(), torch.arange(1000.0))


def test_out_of_memory_raises_and_recovers():
    before = torch.tpu.memory_allocated()
    ooms = torch.tpu.memory_stats()["num_ooms"]
    _, total = torch.tpu.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(10**13, device="tpu")
    message = str(info.value)
    assert "tried to allocate 40000000000000 bytes" in message
    assert f"holds {total} bytes" in message
    assert "TORCH_TPU_MEMORY_LIMIT" in message
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.memory_stats()["num_ooms"] == ooms + 1
    # The process stays usable.
    x = torch.arange(10.0, device="tpu")
    assert (x * 2).sum().item() == 90.0
    with pytest.raises(torch.OutOfMemoryError):
        torch.ones(10**13, dtype=torch.uint8, device="tpu")
    with pytest.raises(torch.OutOfMemoryError):
        x.expand(10**12, 10).contiguous()  # an op's output, not a factory


def test_resize_out_of_memory_leaves_tensor_intact():
    x = torch.arange(4.0, device="tpu")
    with pytest.raises(torch.OutOfMemoryError):
        x.resize_(10**13)
    assert x.shape == (4,)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_memory_limit_env(run_python):
    code = (
        "import torch, torch_tpu\n"
        "assert torch.tpu.mem_get_info()[1] == 1000000\n"
        "x = torch.empty(200000, device='tpu')\n"  # 800 kB fits
        "try:\n"
        "    torch.empty(100000, device='tpu')\n"  # 400 kB more does not
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', e)\n"
    )
    result = run_python(code, TORCH_TPU_MEMORY_LIMIT="1000000")
    assert result.returncode == 0, result.stderr
    assert "OOM" in result.stdout and "tried to allocate 400000 bytes" in result.stdout
    assert "holds 1000000 bytes" in result.stdout
    bad = run_python("import torch, torch_tpu; torch.empty(1, device='tpu')", TORCH_TPU_MEMORY_LIMIT="lots")
    assert bad.returncode != 0
    assert "TORCH_TPU_MEMORY_LIMIT='lots' is not a positive number of bytes" in bad.stderr


# Steps of the training loop and the RSS growth allowed after warm-up. About
# 6-11 s on the 2-core dev machine (measured), growth 0.2 MB; the bound is far above the noise
# of the allocator (a few MB) and far below a leak of one small tensor per
# step (2,000 steps x ~70 kB of parameters and gradients = ~140 MB).
STEPS, WARMUP, RSS_GROWTH_BOUND = 2000, 200, 32 << 20

# In a fresh interpreter: what earlier tests leave behind (Dynamo's compiled
# graphs hold optimizer state until they are collected) must not count.
TRAINING_LOOP = f"""
import gc, os, torch, torch_tpu

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(16, 32).to("tpu")
y = torch.randint(0, 10, (16,)).to("tpu")
for step in range({STEPS}):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step == 0:
        first_loss = loss.item()
    if step == {WARMUP}:
        torch.tpu.synchronize()
        gc.collect()
        allocated, rss = torch.tpu.memory_allocated(), rss_bytes()
torch.tpu.synchronize()
gc.collect()
print(first_loss, loss.item(), allocated, torch.tpu.memory_allocated(), rss_bytes() - rss)
"""


def test_training_loop_does_not_grow(run_python):
    result = run_python(TRAINING_LOOP)
    assert result.returncode == 0, result.stderr
    first_loss, last_loss, allocated, final_allocated, rss_growth = map(float, result.stdout.split())
    assert last_loss < first_loss
    assert final_allocated == allocated
    assert rss_growth < RSS_GROWTH_BOUND, rss_growth / 2**20
