"""Where a Fused training step's time goes: the demo GPT's step (forward,
cross-entropy, backward, AdamW, loss.item()) split at its host-visible
points, medians over the steps after a warm-up, and the Strict step of the
same model in the same process as the baseline.

    python benchmarks/fused_step.py [--steps 20] [--warmup 5]

Recording a phase dispatches its ops through PyTorch (autograd included)
into the window; the optimizer step records AdamW's ops and flushes the
window (launches it); loss.item() waits for the device to run it.
"""

import argparse
import statistics
import time

import torch

import torch_tpu
from torch_tpu import demo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    model = demo.GPT(demo.GPTConfig(vocab_size=65, dropout=0.0)).to("tpu").train()
    opt = demo.make_optimizer(model, 3e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(65, (32, 32), generator=g).to("tpu")
    y = torch.randint(65, (32, 32), generator=g).to("tpu")
    phases = ["forward (record)", "backward (record)", "optimizer (record) + flush", "loss.item() (device)", "step"]
    samples = {k: [] for k in phases}
    with torch_tpu.set_eager_mode("fused"):
        for i in range(a.warmup + a.steps):
            t = [time.perf_counter()]
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            opt.step()
            t.append(time.perf_counter())
            loss.item()
            t.append(time.perf_counter())
            if i >= a.warmup:
                for k, (t0, t1) in zip(phases, [*zip(t, t[1:], strict=False), (t[0], t[-1])], strict=True):
                    samples[k].append((t1 - t0) * 1e3)
        ops = torch_tpu.metrics().get("fused_ops_max", 0)
    strict = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if i >= a.warmup:
            strict.append((time.perf_counter() - t0) * 1e3)
    step = statistics.median(samples["step"])
    print(f"demo GPT (2 layers, d 64, context 32, batch 32), AdamW; {ops} ops per window")
    print("| Fused step phase | median ms | share of the step |")
    print("|---|---|---|")
    for k in phases:
        m = statistics.median(samples[k])
        print(f"| {k} | {m:.2f} | {m / step:.0%} |")
    print(f"| Strict step (baseline) | {statistics.median(strict):.2f} | {statistics.median(strict) / step:.2f}x |")


if __name__ == "__main__":
    main()
