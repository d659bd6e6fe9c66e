"""A factory on tpu (torch.zeros) against the upload of the same bytes: what a
fresh storage cost before its program stopped reading it (README, "How an
eager op runs"). Median microseconds of synchronized calls, Strict mode.

    TORCH_TPU_DYNAMIC=marked python benchmarks/factories.py [--iters N]
"""

import argparse
import statistics
import time

import torch

import torch_tpu  # noqa: F401 - registers the tpu device


def medians_us(fns, iters: int) -> list[float]:
    """Median microseconds of each of `fns`, synchronized, alternated call by
    call so that a slow spell of this shared machine hits them alike."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(iters):
        for fn, times in zip(fns, samples, strict=True):
            torch.tpu.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.tpu.synchronize()
            times.append((time.perf_counter() - t0) * 1e6)
    return [statistics.median(times) for times in samples]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    print(f"| {'float32 elements':>16} | {'torch.zeros on tpu us':>21} | {'upload of as many zeros us':>26} |")
    print(f"|{'-' * 18}|{'-' * 23}|{'-' * 28}|")
    for numel in (1 << 12, 1 << 20, 1 << 22):
        host = torch.zeros(numel)
        zeros, upload = medians_us(
            [lambda: torch.zeros(numel, device="tpu"), lambda: host.to("tpu")],  # noqa: B023
            args.iters,
        )
        print(f"| {numel:>16} | {zeros:>21.1f} | {upload:>26.1f} |")


if __name__ == "__main__":
    main()
