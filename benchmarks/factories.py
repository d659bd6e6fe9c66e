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


def synchronized_us(fn) -> float:
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.tpu.synchronize()
    return (time.perf_counter() - t0) * 1e6


def median_us(fn, iters: int) -> float:
    for _ in range(10):
        fn()
    return statistics.median(synchronized_us(fn) for _ in range(iters))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    print(f"| {'float32 elements':>16} | {'torch.zeros on tpu us':>21} | {'upload of as many zeros us':>26} |")
    print(f"|{'-' * 18}|{'-' * 23}|{'-' * 28}|")
    for numel in (1 << 12, 1 << 20, 1 << 22):
        host = torch.zeros(numel)
        # Not alternated call by call: alternated, the same torch.zeros measured 1.2-3.2 ms at 4 Mi.
        zeros = median_us(lambda: torch.zeros(numel, device="tpu"), args.iters)  # noqa: B023
        upload = median_us(lambda: host.to("tpu"), args.iters)  # noqa: B023
        print(f"| {numel:>16} | {zeros:>21.1f} | {upload:>26.1f} |")


if __name__ == "__main__":
    main()
