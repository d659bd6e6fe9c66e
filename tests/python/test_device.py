"""The tpu device as PyTorch sees it: autoload, device module, factories, copies, printing."""

import os
import subprocess
import sys

import pytest
import torch

import torch_tpu


def test_import_torch_alone_makes_tpu_usable(run_python):
    code = (
        "import torch; x = torch.arange(6., device='tpu').view(2, 3); x[1].add_(1); "
        "print(x.cpu().tolist(), 'torch_tpu' in __import__('sys').modules)"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[0.0, 1.0, 2.0], [4.0, 5.0, 6.0]] True"


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    name = torch.tpu.get_device_name()
    assert name.startswith(torch_tpu._C.platform_name())
    torch.tpu.synchronize()
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0


def test_device_properties():
    props = torch.tpu.get_device_properties(0)
    assert props.index == 0 and props.name == torch_tpu._C.device_kind(0)
    assert props.platform == torch_tpu._C.platform_name()
    assert props.total_memory == torch.tpu.mem_get_info(0)[1] > 0
    assert isinstance(props.attributes, dict)
    assert "total_memory=" in repr(props)
    last = torch.tpu.device_count() - 1
    assert torch.tpu.get_device_properties(f"tpu:{last}").index == last
    with pytest.raises(ValueError, match="device 99 is out of range"):
        torch.tpu.get_device_properties(99)


def test_factories_match_cpu():
    for make in (
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.ones(4, dtype=torch.int32, device=d),
        lambda d: torch.full((2, 2), 3.5, device=d),
        lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(1.0, 4.0, 0.5, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.tensor([True, False], device=d),
    ):
        t, c = make("tpu"), make("cpu")
        assert t.device.type == "tpu"
        assert t.dtype == c.dtype and t.shape == c.shape
        assert torch.equal(t.cpu(), c)


def test_copies_across_devices_dtypes_and_strides():
    c = torch.randn(3, 4)
    t = c.to("tpu")
    assert torch.equal(t.cpu(), c)
    assert torch.equal(t.to(torch.float64).cpu(), c.to(torch.float64))
    assert torch.equal(t.t().cpu(), c.t())  # non-contiguous read
    dst = torch.empty(4, 3, device="tpu")
    dst.copy_(c.t())  # cpu strided -> tpu
    assert torch.equal(dst.cpu(), c.t())
    host = torch.empty(4, 3, dtype=torch.float64)
    host.copy_(t.t())  # tpu strided -> cpu with dtype change
    assert torch.equal(host, c.t().double())
    same = torch.zeros(4, device="tpu")
    same.copy_(torch.arange(4, device="tpu"))  # tpu -> tpu with int -> float
    assert same.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_item_tolist_and_printing():
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="tpu")
    assert t[1, 0].item() == 3.0
    assert t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    text = repr(t)
    assert "device='tpu:0'" in text and "1.5000" in text
    assert "dtype=torch.int32" in repr(torch.ones(2, dtype=torch.int32, device="tpu"))


def test_memory_accounting():
    before = torch.tpu.memory_allocated()
    t = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_allocated() - before == 4096
    del t
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 4096


def test_every_device_runs_programs():
    """Programs are portable: each runs on the device its tensors live on."""
    n = torch.tpu.device_count()
    assert n >= 2, "the CPU plugin makes 4 devices by default"
    for i in range(n):
        x = torch.arange(4.0, device=f"tpu:{i}")
        y = (x * 2).sum()
        assert y.device == torch.device("tpu", i) and y.item() == 12.0
    last = torch.ones(3, device=f"tpu:{n - 1}")
    assert torch.equal(last.to("tpu:0").cpu(), torch.ones(3))
    try:
        last + torch.ones(3, device="tpu:0")
    except RuntimeError as e:
        assert "same device" in str(e)
    else:
        raise AssertionError("mixing devices must raise")


def test_device_count_option(run_python):
    r = run_python(
        "import torch; print(torch.tpu.device_count(), torch.ones(1, device='tpu:7').add(1).item())",
        TORCH_TPU_NUM_DEVICES="8",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "8 2.0"


FORK_SCRIPT = """
import multiprocessing as mp

import torch

import torch_tpu


def use_tpu(q):
    try:
        q.put(("ok", (torch.ones(3, device="tpu") + 1).cpu().tolist(), torch.tpu._is_in_bad_fork()))
    except RuntimeError as e:
        q.put(("error", str(e), torch.tpu._is_in_bad_fork()))


def run(method):
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=use_tpu, args=(q,))
    p.start()
    result = q.get(timeout=100)
    p.join(timeout=100)
    return result, p.exitcode


if __name__ == "__main__":
    print("before", run("fork"))
    y = torch.ones(2, device="tpu") * 3
    print("after", run("fork"))
    print("spawn", run("spawn"))
    print("parent", (y + 1).cpu().tolist())
"""


def test_fork_after_use_raises_instead_of_hanging(tmp_path):
    # The PJRT plugin's threads do not survive fork(): a child forked after the
    # parent used tpu gets a clear error (never a hang); spawn and a fork before
    # first use work, and the parent stays usable. (A file: spawn re-imports __main__.)
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["before"] == "(('ok', [2.0, 2.0, 2.0], False), 0)"
    assert "'error'" in lines["after"] and "'spawn' method" in lines["after"] and "True), 0)" in lines["after"]
    assert lines["spawn"] == "(('ok', [2.0, 2.0, 2.0], False), 0)"
    assert lines["parent"] == "[4.0, 4.0]"


def test_doctor_checks_the_installation_and_names_what_to_do():
    env = {**os.environ}
    ok = subprocess.run([sys.executable, "-m", "torch_tpu", "doctor"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "9 of 9 checks passed" in ok.stdout and "StableHLO" in ok.stdout
    env["TORCH_TPU_CACHE_DIR"] = "/proc/no_such_folder/cache"  # unwritable: one failed row, the others still run
    bad = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "doctor"], capture_output=True, text=True, timeout=300, env=env
    )
    assert bad.returncode == 1
    assert "FAIL  cache" in bad.stdout and "do: point TORCH_TPU_CACHE_DIR" in bad.stdout
    assert "8 of 9 checks passed" in bad.stdout
