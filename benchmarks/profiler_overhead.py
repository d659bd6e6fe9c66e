"""What torch.profiler costs on tpu: a loop of small ops (Strict) and of Fused
steps, timed without a profile, under torch.profiler (CPU + PrivateUse1
activities: every program traced, each execution waiting for its outputs),
medians of 5 runs, in one process.

    python benchmarks/profiler_overhead.py
"""

import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_tpu


def loop(x, steps=50):
    for _ in range(steps):
        x = torch.tanh(x @ x * 0.01 + 1)
    return x.sum().item()


def timed(fn, profiled):
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        if profiled:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
                fn()
        else:
            fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1e3


def main():
    x = torch.randn(128, 128, device="tpu")
    print("| mode | no profile, ms | torch.profiler, ms | ratio |")
    print("|---|---|---|---|")
    for mode in ("strict", "fused"):
        with torch_tpu.set_eager_mode(mode):
            loop(x)  # compiled before timing
            plain, traced = timed(lambda: loop(x), False), timed(lambda: loop(x), True)
        print(f"| {mode} | {plain:.1f} | {traced:.1f} | {traced / plain:.2f}x |")


if __name__ == "__main__":
    main()
