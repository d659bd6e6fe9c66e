"""Hugging Face Llama on "tpu": training step time and generation speed.

The model is examples/hf_finetune.py's LlamaForCausalLM (random weights,
seeded; character vocabulary of the bundled corpus). Two rows, one column per
execution path, all measured in the same run:

- train step, median ms: forward with labels (the loss), backward,
  clip_grad_norm_, AdamW step, then a synchronize; batch x context tokens.
- generate, tokens/s: greedy `model.generate` of --new-tokens tokens after a
  --prompt-tokens prompt, batch 1, median of --gen-runs warm calls. Eager
  paths use the default dynamic KV cache; compiled paths the static cache
  (CPU inductor: `model.forward = torch.compile(model.forward)` as the
  transformers docs show; tpu compile: transformers compiles the decoding
  step itself with backend "tpu" on a "tpu" model).

The compiled paths compile the model's forward and backward; the optimizer
step stays eager.

    python benchmarks/hf.py [--steps N] [--batch N] [--context N] [--new-tokens N] [--paths a,b] [--threads N]
"""

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import torch_tpu
from torch_tpu import demo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from hf_finetune import make_llama  # noqa: E402

PATHS = ["CPU eager", "CPU inductor", "tpu Strict", "tpu Fused", "tpu compile"]
if torch.cuda.is_available():  # on a GPU machine (scripts/gpu_check.sh): torch's own CUDA paths beside ours
    PATHS += ["CUDA eager", "CUDA inductor"]


class NotAvailable(Exception):
    pass


def device_of(path):
    return "cpu" if path.startswith("CPU") else "cuda" if path.startswith("CUDA") else "tpu"


def enter(path):
    """Switches to the path's eager mode; raises NotAvailable where it does not exist."""
    torch._dynamo.reset()
    if path == "tpu Fused":
        try:
            torch_tpu.set_eager_mode("fused")
        except (ValueError, RuntimeError) as e:
            raise NotAvailable(str(e)) from e
    else:
        torch_tpu.set_eager_mode("strict")


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def train_ms(path, base, args):
    device = device_of(path)
    model = copy.deepcopy(base).to(device).train()
    forward = {"CPU inductor": "inductor", "CUDA inductor": "inductor", "tpu compile": "tpu"}.get(path)
    run = torch.compile(model, backend=forward) if forward else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(base.config.vocab_size, (args.batch, args.context), generator=g).to(device)

    def step():
        loss = run(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)

    for _ in range(args.warmup):  # compiles happen here
        step()
    samples = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def generate_tokens_per_s(path, base, args):
    device = device_of(path)
    model = copy.deepcopy(base).to(device).eval()
    kwargs = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    if path in ("CPU inductor", "CUDA inductor"):
        model.forward = torch.compile(model.forward, backend="inductor")
        kwargs["cache_implementation"] = "static"
    elif path == "tpu compile":
        kwargs["cache_implementation"] = "static"
    prompt = torch.randint(base.config.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    model.generate(prompt, **kwargs)  # compiles happen here
    samples = []
    for _ in range(args.gen_runs):
        t0 = time.perf_counter()
        out = model.generate(prompt, **kwargs)
        sync(device)
        samples.append(time.perf_counter() - t0)
    assert out.shape[1] == args.prompt_tokens + args.new_tokens
    return args.new_tokens / statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed training steps per path (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps first (compiles)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--gen-runs", type=int, default=3, help="timed generate calls per path (median)")
    p.add_argument("--paths", help=f"comma-separated columns (default all: {', '.join(PATHS)})")
    p.add_argument("--threads", type=int, help="CPU PyTorch's intra-op threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = args.paths.split(",") if args.paths else PATHS
    transformers.logging.set_verbosity_error()

    vocab = demo.CharTokenizer(demo.load_corpus()).vocab_size
    base = make_llama(vocab, seed=0)
    params = sum(t.numel() for t in base.parameters())
    rows = {"train step, median ms": {}, "generate, tokens/s": {}}
    compiles = {}
    for path in paths:
        try:
            enter(path)
        except NotAvailable:
            for row in rows.values():
                row[path] = None
            continue
        try:
            before = torch_tpu.metrics().get("compiles", 0)
            rows["train step, median ms"][path] = train_ms(path, base, args)
            rows["generate, tokens/s"][path] = generate_tokens_per_s(path, base, args)
            compiles[path] = torch_tpu.metrics().get("compiles", 0) - before
        finally:
            torch_tpu.set_eager_mode("strict")

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
        f"load {load}; tpu = XLA CPU PJRT plugin"
    )
    print(
        f"model: LlamaForCausalLM, {params:,} parameters; train batch {args.batch} x {args.context} tokens; "
        f"generate {args.new_tokens} tokens after {args.prompt_tokens}, batch 1"
    )
    print("| | " + " | ".join(paths) + " |")
    print("|---|" + "---|" * len(paths))
    for name, row in rows.items():
        cells = ["n/a" if row.get(path) is None else f"{row[path]:.1f}" for path in paths]
        print(f"| {name} | " + " | ".join(cells) + " |")
    tpu_compiles = ", ".join(f"{path} {n}" for path, n in compiles.items() if path.startswith("tpu"))
    print(f"programs compiled (warm-up included): {tpu_compiles}")


if __name__ == "__main__":
    main()
