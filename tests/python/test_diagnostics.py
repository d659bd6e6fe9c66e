"""What a user looks at when a run is slow: torch_tpu.explain() (and
`python -m torch_tpu explain`), per-op compile counts with what changed,
and TORCH_TPU_DUMP_ON_MISS."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import metric_delta

import torch_tpu

_SCRIPT = """
import torch, torch_tpu, warnings
warnings.simplefilter("ignore")

def special(x):
    return torch.special.airy_ai(x)  # no tpu lowering: the CPU fallback

special(torch.rand(3).to("tpu"))
with torch_tpu.set_eager_mode("fused"):
    for n in range(3, 9):
        x = torch.randn(n).to("tpu")
        total = (x * 3).sum().item()  # a host read per step
"""


def test_explain_names_fallbacks_recompiles_and_flushes(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(_SCRIPT)
    r = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "explain", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        # marked: the script's changing sizes compile a program each (auto would bound them)
        env={
            **os.environ,
            "TORCH_TPU_CACHE_DIR": "off",
            "TORCH_TPU_EAGER_MODE": "strict",
            "TORCH_TPU_DYNAMIC": "marked",
        },
    )
    assert r.returncode == 0, r.stderr
    report = r.stderr[r.stderr.index("torch_tpu.explain()") :]
    assert "aten::special_airy_ai" in report and "user_script.py" in report and "in special" in report, report
    assert "fused: compiled 6 times" in report and "Fused windows differ" in report, report
    assert "host_read: 6" in report and ".item()" in report, report
    assert "Device time:" in report and "  fused: " in report and "aten::special_airy_ai" in report, report


def test_compile_counts_per_op_and_what_changed(static_shapes):
    before = torch_tpu.metrics()
    with torch_tpu.set_eager_mode("strict"):  # each op its own program
        for n in (11, 12, 13):
            torch.ones(n, 7).to("tpu").neg()
    assert metric_delta(before, "compiles::aten::neg") >= 3
    change = torch_tpu._C._compile_changes()["aten::neg"]
    assert "f32[12,7]" in change and "f32[13,7]" in change, change
    assert "aten::neg" in torch_tpu.explain()


def test_dump_on_miss_writes_every_compiled_program(run_python, tmp_path):
    code = "import torch, torch_tpu\nx = torch.arange(6.0).to('tpu')\n(x.exp() * 2).cpu()\n"
    r = run_python(
        code, TORCH_TPU_DUMP_ON_MISS=str(tmp_path / "dump"), TORCH_TPU_CACHE_DIR="off", TORCH_TPU_EAGER_MODE="strict"
    )
    assert r.returncode == 0, r.stderr
    files = {p.name.split("-")[0]: p.read_text() for p in (tmp_path / "dump").iterdir()}
    assert "aten__exp" in files and "aten__mul.Tensor" in files, sorted(files)
    assert (
        files["aten__exp"].startswith("// torch_tpu program key: aten::exp|")
        and "module @torch_tpu" in files["aten__exp"]
    )


def test_cache_entries_have_compile_time_and_hits(run_python, tmp_path):
    env = {"TORCH_TPU_CACHE_DIR": str(tmp_path), "TORCH_TPU_EAGER_MODE": "strict"}
    code = "import torch, torch_tpu\n(torch.arange(5.0).to('tpu').exp()).cpu()\n"
    for _ in range(3):  # one compile, then two processes that load it
        r = run_python(code, **env)
        assert r.returncode == 0, r.stderr
    r = run_python("import torch_tpu, json\nprint(json.dumps(torch_tpu.cache_entries()))", **env)
    entries = {e["what"]: e for e in __import__("json").loads(r.stdout.splitlines()[-1])}
    assert entries["aten::exp"]["hits"] == 2 and entries["aten::exp"]["compile_ms"] > 0, entries
    assert entries["index of aten::exp"]["hits"] == 2
    cli = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "cache", "info", "--entries"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert cli.returncode == 0 and "aten::exp" in cli.stdout and "compile ms" in cli.stdout, cli.stdout + cli.stderr
    r = run_python("import torch_tpu\nprint(torch_tpu.cache_clear())", **env)
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".info", ".hits")]  # sidecars go with their entries


def test_gpu_check_dry_run_writes_a_report(tmp_path):
    """scripts/gpu_check.sh's own steps on the CPU plugin (`make gpu-check-dry` runs them all)."""
    root = __import__("pathlib").Path(__file__).parents[2]
    report = tmp_path / "report.md"
    r = subprocess.run(
        ["bash", str(root / "scripts" / "gpu_check.sh"), "--dry-run", "--skip-build", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GPU_CHECK_STEPS": "doctor,explain", "PYTHON": sys.executable},
    )
    text = report.read_text()
    assert r.returncode == 0, text
    assert "PJRT_DEVICE=CPU, dry run" in text and "9 of 9 checks passed" in text, text
    assert "doctor: exit 0" in text and "explain (what the run cost): exit 0" in text and "failed steps: 0" in text


KINETO = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.skipif(not KINETO, reason="PyTorch's PrivateUse1 profiler registry is new in torch 2.13")
def test_torch_profiler_gives_each_op_its_device_time(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64, device="tpu")
    with torch_tpu.set_eager_mode("strict"):
        (x @ x).relu().sum().item()  # compiled before the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        with torch_tpu.set_eager_mode("strict"):  # a program per op
            for _ in range(3):
                y = (x @ x).relu().sum()
            y.item()
        with torch_tpu.set_eager_mode("fused"):
            (x * 2 + 1).sum().item()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert [e.name for e in kernels[:3]] == ["tpu: aten::mm", "tpu: aten::relu", "tpu: aten::sum"]
    assert len([e for e in kernels if e.name == "tpu: aten::mm"]) == 3
    assert "tpu: fused" in {e.name for e in kernels}  # a Fused window is one program
    assert all(e.device_time_total > 0 for e in kernels)
    ops = {e.key: e for e in prof.key_averages()}
    assert ops["aten::mm"].self_device_time_total > 0  # the op's own row: its programs' device time
    assert "Self TPU" in prof.key_averages().table(row_limit=5)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    mm = [e for e in events if e.get("cat") == "kernel" and e["name"] == "tpu: aten::mm"]
    assert len(mm) == 3 and all(e["dur"] > 0 and int(e["args"]["bytes out"]) == 64 * 64 * 4 for e in mm), mm
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert ops and all(abs(k["ts"] - o["ts"]) < 1e6 for k, o in zip(mm, ops, strict=True)), (mm, ops)  # one clock (us)


_TRACED = """
import torch, torch_tpu
x = torch.arange(6.0).to("tpu")
(x.exp() * 2).cpu()
with torch_tpu.set_eager_mode("fused"):
    (x * 3 + 1).sum().item()
"""


@pytest.mark.parametrize("switch", ["TORCH_TRACE", "TORCH_TPU_TRACE"])
def test_structured_trace_holds_every_program_and_tlparse_renders_it(tmp_path, switch):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_TRACE", "TORCH_TPU_TRACE")}
    env.update({switch: str(tmp_path / "trace"), "TORCH_TPU_CACHE_DIR": "off", "TORCH_TPU_EAGER_MODE": "strict"})
    r = subprocess.run([sys.executable, "-c", _TRACED], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    (log,) = (tmp_path / "trace").iterdir()
    text = log.read_text()
    assert "# torch_tpu program aten::exp: compiled in" in text and "strict mode" in text, text[:2000]
    assert "#   <string>:4 in <module>" in text  # the user's line that ran it
    assert "Fused window of 3 ops, flushed by host_read: aten::mul.Tensor aten::add.Tensor aten::sum" in text
    assert "stablehlo.exponential" in text
    tlparse = os.path.join(os.path.dirname(sys.executable), "tlparse")
    out = subprocess.run(
        [tlparse, str(log), "-o", str(tmp_path / "report"), "--no-browser"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    index = (tmp_path / "report" / "index.html").read_text()
    assert "torch_tpu_aten__exp" in index and "torch_tpu_fused" in index
