"""Bus bandwidth of all_reduce and all_gather on the "tpu" process group, 4 KB to 64 MB.

Rows per size: transport A (XLA collective programs) over 4 devices as
threads of one process; transport B (host staging through gloo) across 2
processes under torchrun; and the baseline of the same run, gloo on CPU
tensors across the same 2 processes. Bus bandwidth as nccl-tests defines it:
all_reduce moves 2(n-1)/n of the bytes per rank, all_gather (n-1)/n of the
output. Medians of --iters timed calls after warmup.

    python benchmarks/collectives.py [--iters N] [--max-mb 64]
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def bus_gbps(op: str, nbytes: int, ranks: int, seconds: float) -> float:
    factor = 2 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
    return nbytes * factor / seconds / 1e9


def time_op(op: str, t: torch.Tensor, out: torch.Tensor, iters: int, sync) -> float:
    def call():
        if op == "all_reduce":
            dist.all_reduce(t)
        else:
            dist.all_gather_into_tensor(out, t)
        sync()

    for _ in range(3):
        call()
    dist.barrier()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(device: str, sizes, iters: int, ranks: int) -> dict:
    """Seconds per call for each (op, bytes), in this rank."""
    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
    result = {}
    for nbytes in sizes:
        n = nbytes // 4
        t = torch.ones(n, device=device)
        out = torch.empty(n * ranks, device=device)
        for op in ("all_reduce", "all_gather"):
            result[f"{op} {nbytes}"] = time_op(op, t, out, iters, sync)
    return result


def worker(args) -> None:
    """One torchrun rank: transport B on tpu tensors, then gloo on CPU tensors."""
    dist.init_process_group("cpu:gloo,tpu:tpu")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    sizes = [s for s in SIZES if s <= args.max_mb << 20]
    rows = {"host": measure("tpu", sizes, args.iters, ranks), "gloo": measure("cpu", sizes, args.iters, ranks)}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def threads(args) -> dict:
    from torch_tpu.distributed import run_threads

    sizes = [s for s in SIZES if s <= args.max_mb << 20]
    os.environ["TORCH_TPU_COLLECTIVES"] = "xla"
    return run_threads(lambda rank: measure("tpu", sizes, args.iters, 4), world_size=4)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--max-mb", type=int, default=64)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    xla = threads(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", __file__, "--worker", "--out", out, "--iters", str(args.iters),
               "--max-mb", str(args.max_mb)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "TORCH_TPU_COLLECTIVES": "host"})
        with open(out) as f:
            procs = json.load(f)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; plugin {torch_tpu_platform()}; medians of {args.iters}"
    )
    print("| op | size | A: XLA, 4 devices GB/s | B: host staging, 2 procs GB/s | gloo CPU, 2 procs GB/s | B / gloo |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in xla:
        op, nbytes = key.split()
        nbytes = int(nbytes)
        a = bus_gbps(op, nbytes, 4, xla[key])
        b = bus_gbps(op, nbytes, 2, procs["host"][key])
        g = bus_gbps(op, nbytes, 2, procs["gloo"][key])
        size = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
        print(f"| {op} | {size} | {a:.3g} | {b:.3g} | {g:.3g} | {b / g:.2f} |")


def torch_tpu_platform() -> str:
    import torch_tpu

    return f"{torch_tpu._C.device_name()} ({torch_tpu._C.plugin_api_version()})"


if __name__ == "__main__":
    main()
