"""python -m torch_tpu cache {info,clear}: manage the persistent compilation cache.
python -m torch_tpu doctor: check the installation, one row per check, and what to do for each failure."""

import argparse
import os
import sys

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # no plugin load needed for the cache

import torch_tpu  # noqa: E402


def _version(values) -> str:
    return ".".join(str(v) for v in values) if isinstance(values, list) else str(values)


def _checks():
    """(name, function returning the result's text, what to do when it raises)."""
    import subprocess
    import tempfile
    import time

    import torch

    def plugin():
        attrs = torch_tpu._C.plugin_attributes()
        versions = [_version(attrs.get(k, "?")) for k in ("stablehlo_minimum_version", "stablehlo_current_version")]
        hlo = f"StableHLO {versions[0]}..{versions[1]}"
        return (
            f"{torch_tpu._C.plugin_path()}: {torch_tpu._C.platform_name()} {torch_tpu._C.platform_version()}, "
            f"PJRT C API {torch_tpu._C.plugin_api_version()}, {hlo}"
        )

    def devices():
        n = torch.tpu.device_count()
        assert n > 0, "the plugin reports no device"
        props = [torch.tpu.get_device_properties(i) for i in range(n)]
        return f"{n} x {props[0].name}, {props[0].total_memory / 2**30:.1f} GiB each"

    def cache():
        info = torch_tpu.cache_info()
        if not info["enabled"]:
            return "disabled (TORCH_TPU_CACHE_DIR=off)"
        os.makedirs(info["dir"], exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=info["dir"], prefix=".doctor") as f:
            f.write(b"ok")  # writable
        return f"{info['dir']}: {info['entries']} entries, {info['bytes'] / 2**20:.1f} MiB"

    def op_on_every_device():
        for i in range(torch.tpu.device_count()):
            got = (torch.arange(4.0, device=f"tpu:{i}") * 2 + 1).cpu().tolist()
            assert got == [1.0, 3.0, 5.0, 7.0], f"tpu:{i} computed {got}"
        return f"(arange * 2 + 1) right on {torch.tpu.device_count()} devices"

    def compile_program():
        n = 1000 + int(time.time() * 1000) % 997  # a shape no cache holds
        t0 = time.perf_counter()
        got = torch.ones(n, device="tpu").cumsum(0)[-1].item()
        assert got == n, f"cumsum of {n} ones gave {got}"
        return f"a new program compiled and ran in {time.perf_counter() - t0:.2f} s"

    def fused():
        x = torch.randn(16, 16)
        with torch_tpu.set_eager_mode("fused"):
            y = torch.softmax(x.to("tpu") @ x.to("tpu").T, -1).sum(0).cpu()
        torch.testing.assert_close(y, torch.softmax(x @ x.T, -1).sum(0), rtol=1e-4, atol=1e-5)
        return "a window matches CPU"

    def compiled():
        x = torch.randn(8, 8)
        f = torch.compile(lambda a: torch.relu(a @ a).sum(1), backend="tpu")
        torch.testing.assert_close(f(x.to("tpu")).cpu(), torch.relu(x @ x).sum(1), rtol=1e-4, atol=1e-5)
        return "torch.compile(backend='tpu') matches CPU"

    def autoload():
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
        code = "import torch; print(torch.ones(2, device='tpu').sum().item())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "2.0", out.stderr.strip().splitlines()[-1:]
        return "`import torch` alone makes device='tpu' work"

    return [
        ("torch", lambda: f"{torch.__version__} (torch_tpu built against it imports)", "pip install torch==2.13.0"),
        ("plugin", plugin, "set PJRT_DEVICE (CPU, CUDA, TPU) or TORCH_TPU_PLUGIN_PATH to a PJRT plugin"),
        (
            "devices",
            devices,
            "check the accelerator is visible (nvidia-smi, TPU runtime) and not held by another process",
        ),
        ("cache", cache, "point TORCH_TPU_CACHE_DIR at a writable folder, or =off"),
        ("op", op_on_every_device, "run the failing device alone (TORCH_TPU_EAGER_MODE=debug) and report it"),
        ("compile", compile_program, "the XLA compiler failed: check TORCH_TPU_XLA_OPTIONS and the plugin version"),
        ("fused", fused, "TORCH_TPU_EAGER_MODE=strict works around it; report the failure"),
        ("torch.compile", compiled, "use eager mode meanwhile; report the failure"),
        ("autoload", autoload, "pip install the torch_tpu wheel (its torch.backends entry point), or import torch_tpu"),
    ]


def doctor() -> int:
    rows, failed = [], 0
    try:
        checks = _checks()
    except Exception as e:  # torch itself does not import
        print(f"FAIL  torch: {type(e).__name__}: {e}\n      do: pip install torch==2.13.0")
        return 1
    for name, check, fix in checks:
        try:
            rows.append(("ok", name, check(), ""))
        except Exception as e:  # every failure is a row, and the next check still runs
            failed += 1
            rows.append(
                ("FAIL", name, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}", fix)
            )
    width = max(len(r[1]) for r in rows)
    for status, name, result, fix in rows:
        print(f"{status:4}  {name:{width}}  {result}")
        if fix:
            print(f"{'':4}  {'':{width}}  do: {fix}")
    print(f"\n{len(rows) - failed} of {len(rows)} checks passed")
    return 1 if failed else 0


def run_and_explain(script: str, script_args: list) -> int:
    """Runs `script` as __main__ with its arguments, then prints the report (also when it fails)."""
    import runpy

    from torch_tpu import _C

    sys.argv = [script, *script_args]
    code = 0
    _C._start_trace()  # device time per program (each execution waits for its outputs)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        print(torch_tpu.explain(device_trace=_C._stop_trace()), file=sys.stderr)
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu")
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser("cache", help="the persistent compilation cache (TORCH_TPU_CACHE_DIR)")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--entries", action="store_true", help="info: one line per entry (compile time, hits)")
    commands.add_parser("doctor", help="check the installation: plugin, devices, cache, a program, Fused, compile")
    explain = commands.add_parser("explain", help="run a script, then print torch_tpu.explain()'s report")
    explain.add_argument("script")
    explain.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    if args.command == "explain":
        return run_and_explain(args.script, args.args)
    if args.action == "info":
        info = torch_tpu.cache_info()
        if not info["enabled"]:
            print("compilation cache: disabled (TORCH_TPU_CACHE_DIR=off)")
            return 0
        print(f"compilation cache: {info['dir']}")
        print(f"  entries: {info['entries']}")
        size, limit = info["bytes"] / 2**20, info["limit_bytes"] / 2**20
        print(f"  size:    {size:.1f} MiB of {limit:.0f} MiB (TORCH_TPU_CACHE_LIMIT)")
        if args.entries:
            entries = sorted(torch_tpu.cache_entries(), key=lambda e: (-e["hits"], -e["compile_ms"]))
            print(f"  {'hits':>6} {'compile ms':>10} {'KiB':>8} {'last used':>10}  what")
            for e in entries:
                print(
                    f"  {e['hits']:>6} {e['compile_ms']:>10.1f} {e['bytes'] / 1024:>8.1f} "
                    f"{e['age_s']:>9}s  {e['what'] or '(written before per-entry statistics)'}"
                )
    else:
        print(f"removed {torch_tpu.cache_clear()} entries from {torch_tpu.cache_info()['dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
