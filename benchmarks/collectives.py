"""Bus bandwidth of all_reduce and all_gather on the "tpu" process group, 4 KB to 64 MB.

Rows per size: transport A (XLA collective programs) over 4 devices as
threads of one process; transport B (host staging through gloo) across 2
processes under torchrun; and the baseline of the same run, gloo on CPU
tensors across the same 2 processes. Bus bandwidth as nccl-tests defines it:
all_reduce moves 2(n-1)/n of the bytes per rank, all_gather (n-1)/n of the
output. Medians of --iters timed calls after warmup.

Then a DDP training step over the 4 devices as thread ranks (XLA transport),
ms per step in one run: Strict mode (each bucket's all-reduce its own
program), Fused mode with every collective flushing the window, Fused mode
with the all-reduces inside the step's window, and torch.compile of the DDP
model (compiled pieces, all-reduces eager between them); the baseline is
Strict.

    python benchmarks/collectives.py [--iters N] [--max-mb 64] [--ddp-only]
"""

import argparse
import functools
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


DDP_RUNS = [  # (row, eager mode, collectives inside Fused windows, torch.compile)
    ("Strict: a program per bucket all-reduce", "strict", True, False),
    ("Fused, each collective flushes the window", "fused", False, False),
    ("Fused, all-reduces inside the step's window", "fused", True, False),
    ("torch.compile (Strict), all-reduces between the pieces", "strict", True, True),
]


def ddp_steps(iters: int) -> list:
    """(row, ms per step, program launches per step) of each DDP_RUNS entry: a
    launch over the 4 devices (a collective, a window holding collectives) counts once."""
    import copy

    from torch.nn.parallel import DistributedDataParallel

    import torch_tpu
    from torch_tpu.distributed import run_threads

    os.environ["TORCH_TPU_COLLECTIVES"] = "xla"
    ranks, width, batch, warmup = 4, 512, 64, 3
    layers = [m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    base = torch.nn.Sequential(*layers, torch.nn.Linear(width, 64))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(ranks, batch, width, generator=g), torch.randn(ranks, batch, 64, generator=g)

    def body(rank, compiled):
        model = DistributedDataParallel(copy.deepcopy(base).to("tpu"), bucket_cap_mb=1)
        step = torch.compile(model, backend="tpu") if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        xs, ys = x[rank].to("tpu"), y[rank].to("tpu")
        samples = []
        for i in range(warmup + iters):
            if i == warmup:
                dist.barrier()
                executions = torch_tpu.metrics()["executions"]
            t0 = time.perf_counter()
            torch.nn.functional.mse_loss(step(xs), ys).backward()
            opt.step()
            opt.zero_grad()
            torch.tpu.synchronize()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples[warmup:]), torch_tpu.metrics()["executions"] - executions

    rows = []
    for name, mode, inside, compiled in DDP_RUNS:
        previous = torch_tpu._C._set_fused_collectives(inside)
        try:
            with torch_tpu.set_eager_mode(mode):
                seconds, executions = run_threads(functools.partial(body, compiled=compiled), world_size=ranks)[0]
        finally:
            torch_tpu._C._set_fused_collectives(previous)
        rows.append((name, seconds * 1e3, executions / iters))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--max-mb", type=int, default=64)
    p.add_argument("--ddp-only", action="store_true", help="only the DDP step rows")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.ddp_only:
        return print_ddp(ddp_steps(args.iters), args.iters)

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
    print()
    print_ddp(ddp_steps(args.iters), args.iters)


def print_ddp(rows, iters: int) -> None:
    print(
        "DDP step: 4 x (Linear 512x512 + ReLU) + Linear 512x64, batch 64 per rank, SGD, bucket_cap_mb=1, "
        f"4 thread ranks (XLA transport); medians of {iters} steps after 3"
    )
    print("| run | ms per step | vs Strict | program launches per step, 4 ranks |")
    print("|---|---:|---:|---:|")
    for name, ms, programs in rows:
        print(f"| {name} | {ms:.1f} | {rows[0][1] / ms:.2f}x | {programs:.1f} |")


def torch_tpu_platform() -> str:
    import torch_tpu

    return f"{torch_tpu._C.device_name()} ({torch_tpu._C.plugin_api_version()})"


if __name__ == "__main__":
    main()
