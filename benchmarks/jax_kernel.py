"""A kernel written in JAX (torch_tpu.jax_op) against the same computation
written in PyTorch, on tpu, per mode: first call (lowering by JAX, compile)
and warm call (median, each call awaited), with their ratio.

The computation is RMSNorm over [rows, 512] float32 with a weight. The disk
cache is off, so a first call compiles.

    python benchmarks/jax_kernel.py [--rows N] [--iters N]
"""

import os

os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")  # before torch loads torch_tpu: first calls compile

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import torch_tpu  # noqa: E402

EPS = 1e-6


def rms_norm_jax(x, w):
    return x * jnp.reciprocal(jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)) * w


def rms_norm_torch(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def timed_ms(fn) -> float:
    t0 = time.perf_counter()
    out = fn()  # kept until the device is done: a Fused window whose results are dead never runs
    torch.tpu.synchronize()
    del out
    return (time.perf_counter() - t0) * 1e3


def median_us(fn, iters: int) -> float:
    for _ in range(10):
        fn()
    torch.tpu.synchronize()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        out = fn()
        torch.tpu.synchronize()
        del out
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def measure(mode: str, rows: int, iters: int) -> tuple:
    """One mode in this process: (first jax_op ms, first torch ms, warm jax_op us, warm torch us)."""
    x = torch.randn(rows, 512).to("tpu")
    w = torch.randn(512).to("tpu")
    x.add_(0)
    torch.tpu.synchronize()
    op = torch_tpu.jax_op("bench::rms_norm", rms_norm_jax)
    jax_fn, torch_fn = op, rms_norm_torch
    if mode == "compile":
        jax_fn = torch.compile(lambda a, b: op(a, b), backend="tpu", fullgraph=True)
        torch_fn = torch.compile(rms_norm_torch, backend="tpu", fullgraph=True)
    with torch_tpu.set_eager_mode("strict" if mode == "compile" else mode):
        first_jax = timed_ms(lambda: jax_fn(x, w))
        first_torch = timed_ms(lambda: torch_fn(x, w))
        warm_jax = median_us(lambda: jax_fn(x, w), iters)
        warm_torch = median_us(lambda: torch_fn(x, w), iters)
        torch.testing.assert_close(jax_fn(x, w).cpu(), torch_fn(x, w).cpu(), rtol=1e-5, atol=1e-5)
    return first_jax, first_torch, warm_jax, warm_torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--mode", help="measure one mode in this process and print it as JSON")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.rows, args.iters)))
        return

    rows = []
    for mode in ("strict", "debug", "fused", "compile"):  # each in a fresh process: first calls compile
        cmd = [sys.executable, __file__, "--mode", mode, "--rows", str(args.rows), "--iters", str(args.iters)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append((mode, *json.loads(out.strip().splitlines()[-1])))

    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads; torch {torch.__version__}")
    print(f"device:  {torch.tpu.get_device_name()}")
    print(f"RMSNorm float32[{args.rows}, 512]; warm: median of {args.iters} awaited calls\n")
    print(
        f"| {'mode':<8} | {'jax_op first ms':>15} | {'torch first ms':>14} | {'jax_op warm us':>14} "
        f"| {'torch warm us':>13} | {'warm jax / torch':>16} |"
    )
    print(f"|{'-' * 10}|{'-' * 16}:|{'-' * 15}:|{'-' * 15}:|{'-' * 14}:|{'-' * 17}:|")
    for mode, fj, ft, wj, wt in rows:
        print(f"| {mode:<8} | {fj:>15.1f} | {ft:>14.1f} | {wj:>14.1f} | {wt:>13.1f} | {wj / wt:>16.2f} |")


if __name__ == "__main__":
    main()
