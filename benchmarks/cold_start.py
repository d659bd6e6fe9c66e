"""Time to the first training step of the demo GPT, in a fresh process, with an
empty compilation cache (cold) and with the cache the cold run left (warm).

    python benchmarks/cold_start.py [--runs 3]

Each run is a new interpreter: import torch (which loads torch_tpu), build the
model, run 3 training steps (the first compiles every op's program; the 3rd is
the first with Adam's changing scalars as inputs), synchronize. The table
reports the median over runs of the time from interpreter start to the end of
step 3, and its parts: the imports, torch._dynamo's import (torch.optim makes
it at an optimizer's first use, on any device: timed apart, before the steps),
and the steps.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = """
import time, json
t0 = time.perf_counter()
import torch, torch_tpu
from torch_tpu import demo
t_import = time.perf_counter()
# torch.optim imports torch._dynamo at an optimizer's first use, on any device:
# timed on its own here, so that "the 3 steps" are the steps.
import torch._dynamo
t_dynamo = time.perf_counter()
tok = demo.CharTokenizer(demo.load_corpus())
data = tok.encode(demo.load_corpus())
model = demo.make_model(tok.vocab_size, seed=0, dropout=0.0)
losses = demo.train(model, data, "tpu", steps=3, batch_size=32, lr=3e-3, seed=0, progress=False)
torch.tpu.synchronize()
t_end = time.perf_counter()
m = torch_tpu.metrics()
print(json.dumps({
    "import_s": t_import - t0, "dynamo_s": t_dynamo - t_import, "steps_s": t_end - t_dynamo,
    "compiles": m.get("compiles", 0),
    "disk_hits": m.get("disk_cache_hits", 0) + m.get("disk_index_hits", 0),
    "compile_s": m.get("compile_us", 0) / 1e6, "disk_load_s": m.get("disk_load_us", 0) / 1e6,
}))
"""


def run_child(cache_dir: str) -> dict:
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["total_s"] = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="torch_tpu_cold_") as cache_dir:
            cold.append(run_child(cache_dir))
            warm.append(run_child(cache_dir))
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print("demo GPT, 3 training steps in a fresh process; median of", args.runs, "runs\n")
    print(
        "| cache | process start to step 3 done, s | import torch, torch_tpu, s | torch._dynamo import, s "
        "| the 3 steps, s | compiles | disk cache hits | compiling, s | loading from disk, s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in (("cold (empty)", cold), ("warm (from the cold run)", warm)):
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cells = [
            f"{med['total_s']:.2f}",
            f"{med['import_s']:.2f}",
            f"{med['dynamo_s']:.2f}",
            f"{med['steps_s']:.2f}",
            f"{med['compiles']:.0f}",
            f"{med['disk_hits']:.0f}",
            f"{med['compile_s']:.2f}",
            f"{med['disk_load_s']:.2f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    c = statistics.median(r["steps_s"] for r in cold)
    w = statistics.median(r["steps_s"] for r in warm)
    ct = statistics.median(r["total_s"] for r in cold)
    wt = statistics.median(r["total_s"] for r in warm)
    print(f"\nwarm vs cold: steps {c / w:.1f}x sooner, whole process {ct / wt:.1f}x sooner")


if __name__ == "__main__":
    main()
