"""Where one synchronized training step's time goes, per path: the host's
forward, backward and update calls, then the wait for the device.

    python benchmarks/step_parts.py [--size demo|wide|encoder|...] [--path compile|fused|strict] [--steps N]

Same step as train_step.py (forward with the loss, backward, clip_grad_norm_,
AdamW). Prints the medians (ms) and the runtime counters per step
(launches, uploads, host reads): a compiled step and a Fused step both run one
program, so their difference is the host's part.
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

import torch_tpu
from torch_tpu import demo

sys.path.insert(0, str(Path(__file__).parent))
from train_step import WORKLOADS  # noqa: E402

PARTS = ["forward", "backward", "update", "device wait", "step"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="demo", choices=list(WORKLOADS))
    parser.add_argument("--path", default="compile", choices=["compile", "fused", "strict"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    work, vocab = WORKLOADS[args.size], 65
    model = copy.deepcopy(work.build(vocab)).to("tpu").train()
    opt = demo.make_optimizer(model, 3e-3)

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    if args.path == "compile":
        forward, update = torch.compile(model, backend="tpu"), torch.compile(clip_and_step, backend="tpu")
    else:
        torch_tpu.set_eager_mode(args.path)
        forward, update = model, clip_and_step
    x, y = (t.to("tpu") for t in work.batch(torch.Generator().manual_seed(0), vocab))
    times = {k: [] for k in PARTS}

    def step(record: bool):
        t = [time.perf_counter()]
        _, loss = forward(x, y)
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        update()
        t.append(time.perf_counter())
        torch.tpu.synchronize()
        t.append(time.perf_counter())
        if record:
            for k, a, b in zip(PARTS[:4], t[:-1], t[1:], strict=True):
                times[k].append((b - a) * 1e3)
            times["step"].append((t[-1] - t[0]) * 1e3)

    for _ in range(args.warmup):
        step(False)
    before = dict(torch_tpu.metrics())
    for _ in range(args.steps):
        step(True)
    after = torch_tpu.metrics()
    counters = ["executions", "transfers_to_device", "transfers_to_host", "fused_flushes", "fused_ops"]
    print(f"{work.label}, {args.path}, median of {args.steps} steps after {args.warmup}")
    print("| " + " | ".join(f"{k} ms" for k in PARTS) + " | " + " | ".join(f"{c}/step" for c in counters) + " |")
    print("|" + "---|" * (len(PARTS) + len(counters)))
    medians = [f"{statistics.median(times[k]):.2f}" for k in PARTS]
    per_step = [f"{(after.get(c, 0) - before.get(c, 0)) / args.steps:g}" for c in counters]
    print("| " + " | ".join(medians + per_step) + " |")


if __name__ == "__main__":
    main()
