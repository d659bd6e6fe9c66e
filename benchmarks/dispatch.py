"""Per-op dispatch cost of eager mode: a tiny add, median microseconds.

Rows: torch_tpu eager (Strict, Debug, and Fused, where an op is only
recorded into the window: its recording cost), the bare PJRT execute of the same
executable (the floor our dispatch adds to), and CPU PyTorch eager. Ratios
are against the bare execute, measured in the same process.

    python benchmarks/dispatch.py [--iters N]
"""

import argparse
import platform
import statistics
import time

import torch

import torch_tpu


def median_us(fn, iters: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()

    a_cpu, b_cpu = torch.randn(8), torch.randn(8)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    torch.add(a, b)
    torch.tpu.synchronize()

    rows = []
    strict = median_us(lambda: torch.add(a, b), args.iters)
    torch.tpu.synchronize()
    with torch_tpu.set_eager_mode("debug"):
        debug = median_us(lambda: torch.add(a, b), args.iters)
    with torch_tpu.set_eager_mode("fused"):
        fused = median_us(lambda: torch.add(a, b), args.iters)
    bare = torch_tpu._C._bare_execute_median_us(a, b, args.iters)
    cpu = median_us(lambda: torch.add(a_cpu, b_cpu), args.iters)
    rows.append(("tpu eager add, Strict (async launch)", strict))
    rows.append(("tpu eager add, Debug (awaited)", debug))
    rows.append(("tpu eager add, Fused (recorded)", fused))
    rows.append(("bare PJRT execute, same executable", bare))
    rows.append(("CPU PyTorch eager add", cpu))

    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads; torch {torch.__version__}")
    print(f"device:  {torch.tpu.get_device_name()}, PJRT C API {torch_tpu._C.plugin_api_version()}")
    print(f"tensor:  float32[8], {args.iters} iterations, median\n")
    print(f"| {'what':<40} | {'median us':>9} | {'x bare execute':>14} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 16}|")
    for name, us in rows:
        print(f"| {name:<40} | {us:>9.1f} | {us / bare:>14.2f} |")


if __name__ == "__main__":
    main()
