"""TorchTitan's Llama debug model on "tpu" against TorchTitan on CPU (`make test-titan`).

Every run is ``torchrun --nproc_per_node=2 tests/titan/run_titan.py`` on TorchTitan's
own ``--module llama3 --config llama3_debugmodel`` (6 layers, dim 256, vocab 2048,
AdamW lr 8e-4, warmup 2, 10 steps), with a shorter sequence and batch for 2 CPU
cores (``--training.seq_len 256 --training.local_batch_size 2``), a fixed seed,
the same data (tests/titan/make_dataset.py) and the same initial weights: a seed
checkpoint TorchTitan writes on CPU (``--checkpoint.create_seed_checkpoint``), which
every run loads (``--checkpoint.initial_load_path``). The CPU runs are the
reference (Gloo); each tpu run must give the same loss and gradient norm at every
step, within ATOL + RTOL * |reference|.

    python tests/titan/compare.py [--only fsdp,fsdp-compile,tp,tp-compile] [--steps N]

Exit status 1 if any loss differs by more than the tolerance (or a run fails).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "build", "titan-run")
HERE = os.path.join(ROOT, "tests", "titan")

# |loss_tpu - loss_cpu| must stay within ATOL + RTOL * |loss_cpu| at every step, and
# so must the gradient norm (AdamW and the clipping at norm 1 would hide a gradient
# off by a constant factor from the loss curve; not from the norm). Both
# sides are float32; what differs is the order of float sums (XLA's dot/reduce vs
# ATen's, collectives), which AdamW's early normalized steps carry forward: over 10
# steps the two curves agree to about 1e-4 relative. A wrong gradient, reduction or
# optimizer step moves the curve by far more (steps 2-10 fall by 0.3-0.9 each).
ATOL, RTOL = 1e-4, 5e-4

PARALLEL = {
    "fsdp": ["--parallelism.data_parallel_shard_degree", "2"],
    "tp": [
        "--parallelism.data_parallel_shard_degree",
        "1",
        "--parallelism.tensor_parallel_degree",
        "2",
    ],
}

# name: (parallelism, device, extra TorchTitan args, reference run)
RUNS = {
    "fsdp-cpu": ("fsdp", "cpu", [], None),
    "fsdp-tpu": ("fsdp", "tpu", [], "fsdp-cpu"),
    "fsdp-compile-tpu": (
        "fsdp",
        "tpu",
        ["--compile.enable", "--compile.backend", "tpu"],
        "fsdp-cpu",
    ),
    "tp-cpu": ("tp", "cpu", [], None),
    "tp-tpu": ("tp", "tpu", [], "tp-cpu"),
    # Model and loss: under TP the vocab-parallel loss does an index_put through a bool mask.
    "tp-compile-tpu": (
        "tp",
        "tpu",
        ["--compile.enable", "--compile.backend", "tpu"],
        "tp-cpu",
    ),
}
GROUPS = {
    "fsdp": ["fsdp-cpu", "fsdp-tpu"],
    "fsdp-compile": ["fsdp-cpu", "fsdp-compile-tpu"],
    "tp": ["tp-cpu", "tp-tpu"],
    "tp-compile": ["tp-cpu", "tp-compile-tpu"],
}


def common_args(steps):
    return [
        "--module",
        "llama3",
        "--config",
        "llama3_debugmodel",
        "--hf_assets_path",
        os.path.join(HERE, "assets", "tokenizer"),
        "--dataloader.dataset_path",
        os.path.join(OUT, "c4_local"),
        "--training.seq_len",
        "256",
        "--training.local_batch_size",
        "2",
        "--training.steps",
        str(steps),
        "--debug.seed",
        "42",
        # torch 2.13's FSDP2 cannot take the default spmd_types parameters (README).
        "--parallelism.spmd_backend",
        "partial_dtensor",
    ]


def env():
    e = dict(os.environ)
    e["HF_DATASETS_CACHE"] = os.path.join(OUT, "hf")
    e["HF_HUB_OFFLINE"] = "1"
    e.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return e


def launch(name, device, args, nproc, log):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        os.path.join(HERE, "run_titan.py"),
        "--device",
        device,
        *args,
    ]
    t = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT).returncode
    dt = time.time() - t
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{name} failed (exit {rc}); log {log}:\n{tail}")
    return dt


def seed_checkpoint(steps):
    """TorchTitan's own seed checkpoint, written once on CPU, loaded by every run."""
    subprocess.run(
        [sys.executable, os.path.join(HERE, "make_dataset.py"), os.path.join(OUT, "c4_local")],
        check=True,
    )
    path = os.path.join(OUT, "seed", "checkpoint", "step-0")
    if os.path.isdir(path):
        return path
    args = [
        "--",
        *common_args(steps),
        "--checkpoint.enable",
        "--checkpoint.create_seed_checkpoint",
        "--dump_folder",
        os.path.join(OUT, "seed"),
    ]
    launch("seed", "cpu", args, 1, os.path.join(OUT, "seed.log"))
    return path


def run(name, steps, seed):
    parallel, device, extra, _ = RUNS[name]
    dump = os.path.join(OUT, name)
    subprocess.run(["rm", "-rf", dump], check=True)
    os.makedirs(dump)
    losses = os.path.join(dump, "losses.jsonl")
    args = [
        "--losses",
        losses,
        "--",
        *common_args(steps),
        *PARALLEL[parallel],
        "--checkpoint.enable",
        "--checkpoint.load_only",
        "--checkpoint.initial_load_path",
        seed,
        "--dump_folder",
        dump,
        *extra,
    ]
    dt = launch(name, device, args, 2, os.path.join(dump, "run.log"))
    with open(losses) as f:
        recs = [json.loads(line) for line in f]
    if [r["step"] for r in recs] != list(range(1, steps + 1)):
        raise SystemExit(f"{name}: logged steps {[r['step'] for r in recs]}")
    curve = " ".join(f"{r['loss']:.5f}" for r in recs)
    print(f"{name:18s} {dt:6.1f}s  losses {curve}", flush=True)
    if "--compile.enable" in extra:
        # Rank 0's graphs that torch.compile(backend="tpu") compiled (forward and backward).
        with open(losses + ".tpu_metrics.json") as f:
            graphs = json.load(f).get("graph_compile_ms", {})
        print(f"{'':18s} {len(graphs)} graphs compiled by the tpu backend")
        if not graphs:
            raise SystemExit(f"{name}: nothing was compiled by the tpu backend")
    return recs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="fsdp,fsdp-compile,tp,tp-compile")
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    names = []
    for g in a.only.split(","):
        names += [n for n in GROUPS[g] if n not in names]
    seed = seed_checkpoint(a.steps)
    results = {n: run(n, a.steps, seed) for n in names}
    ok = True
    for n in names:
        ref = RUNS[n][3]
        if ref is None:
            continue
        for key in ("loss", "grad_norm"):
            worst_abs = worst_rel = 0.0
            for got, want in zip(results[n], results[ref], strict=True):
                d = abs(got[key] - want[key])
                worst_abs, worst_rel = max(worst_abs, d), max(worst_rel, d / abs(want[key]))
                if d > ATOL + RTOL * abs(want[key]):
                    ok = False
                    print(f"  {n} step {got['step']}: {key} {got[key]!r} vs {ref} {want[key]!r}")
            print(f"{n} vs {ref}: max |d{key}| {worst_abs:.2e}, max rel {worst_rel:.2e}")
    print("PASS" if ok else f"FAIL (tolerance {ATOL} + {RTOL} * |loss|)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
