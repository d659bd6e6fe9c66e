"""XLA options per execution path: compile time and step time of the demo
GPT's training step (forward, cross-entropy, backward, AdamW) for each set
of options, in Strict and Fused eager modes and under torch.compile.

    python benchmarks/xla_options.py [--steps 10] [--paths strict,fused,compile]
        [--options "default;xla_backend_optimization_level=0;..."]

Each (options, path) pair runs in a fresh process with an empty compilation
cache and TORCH_TPU_XLA_OPTIONS set to the options ("default": unset, the
per-path defaults). Columns: the first step (almost all of it compiling),
the time XLA spent compiling over the run, the median step after it, and
the largest difference of the last loss against the default options' run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, statistics, sys, time
import torch
import torch_tpu
from torch_tpu import demo
path, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = demo.GPT(demo.GPTConfig(vocab_size=65, dropout=0.0)).to("tpu").train()
opt = demo.make_optimizer(model, 3e-3)
fn = torch.compile(model, backend="tpu") if path == "compile" else model
if path != "compile":
    torch_tpu.set_eager_mode(path)
g = torch.Generator().manual_seed(0)
x = torch.randint(model.cfg.vocab_size, (32, 32), generator=g).to("tpu")
y = torch.randint(model.cfg.vocab_size, (32, 32), generator=g).to("tpu")
def step():
    _, loss = fn(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()
t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
m = torch_tpu.metrics()
print(json.dumps({"first_s": first, "compile_s": m.get("compile_us", 0) / 1e6,
                  "step_ms": statistics.median(times) * 1e3, "loss": loss}))
"""


def run(path: str, options: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache)
        env.pop("TORCH_TPU_XLA_OPTIONS", None)
        if options != "default":
            env["TORCH_TPU_XLA_OPTIONS"] = options
        out = subprocess.run(
            [sys.executable, "-c", CHILD, path, str(steps)], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--paths", default="strict,fused,compile")
    p.add_argument(
        "--options",
        default="default;xla_backend_optimization_level=0;xla_backend_optimization_level=1;"
        "xla_llvm_disable_expensive_passes=true",
    )
    a = p.parse_args()
    print("demo GPT (2 layers, d 64, context 32, batch 32), AdamW; fresh process and cache per row")
    print("| path | TORCH_TPU_XLA_OPTIONS | first step s | XLA compile s | step ms | loss diff vs default |")
    print("|---|---|---|---|---|---|")
    for path in a.paths.split(","):
        base = None
        for options in a.options.split(";"):
            r = run(path, options, a.steps)
            base = base or r
            print(
                f"| {path} | {options} | {r['first_s']:.2f} | {r['compile_s']:.2f} | {r['step_ms']:.1f} | "
                f"{abs(r['loss'] - base['loss']):.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
