"""Training step time of the demo GPT: median milliseconds per step.

One step = forward, cross-entropy, backward, clip_grad_norm_, AdamW step,
then a synchronize (so the time is the device's, not the launch's). Columns
are execution paths measured in the same run; the ratio is to CPU PyTorch
eager. The compiled paths (torch.compile with inductor on CPU, with "tpu")
compile two functions: the model's forward (its backward through
AOTAutograd) and the update (clip_grad_norm_ and AdamW).

    python benchmarks/train_step.py [--steps N] [--warmup N] [--sizes demo,wide] [--threads N]
"""

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import torch_tpu
from torch_tpu import demo

# Model sizes (rows). "demo" is what `make demo` trains.
SIZES = {
    "demo": dict(n_layers=2, d_model=64, n_heads=4, context=32, batch=32),
    "wide": dict(n_layers=4, d_model=128, n_heads=4, context=64, batch=16),
}


@dataclass
class Path:
    """An execution path: a column of the table. `prepare(model, update)` returns the forward and
    update functions to time, or None if the path is not available."""

    name: str
    device: str
    prepare: Callable[[demo.GPT, Callable], tuple[Callable, Callable] | None]


def eager(model, update):
    return model, update


def tpu_mode(mode):
    def prepare(model, update):
        try:
            torch_tpu.set_eager_mode(mode)
        except (ValueError, RuntimeError, NotImplementedError):  # a mode not built yet
            return None
        return model, update

    return prepare


def compiled(backend):
    def prepare(model, update):
        torch._dynamo.reset()
        return torch.compile(model, backend=backend), torch.compile(update, backend=backend)

    return prepare


# Columns, in order.
BASELINE = Path("CPU eager", "cpu", eager)
PATHS = [
    BASELINE,
    Path("CPU inductor", "cpu", compiled("inductor")),
    Path("tpu Strict", "tpu", tpu_mode("strict")),
    Path("tpu Fused", "tpu", tpu_mode("fused")),
    Path("tpu compile", "tpu", compiled("tpu")),
]


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()


def median_step_ms(path: Path, base_model: demo.GPT, size: dict, steps: int, warmup: int) -> float | None:
    model = copy.deepcopy(base_model).to(path.device).train()
    opt = demo.make_optimizer(model, 3e-3)

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    fns = path.prepare(model, clip_and_step)
    if fns is None:
        return None
    fn, update = fns
    g = torch.Generator().manual_seed(0)
    vocab, ctx, batch = model.cfg.vocab_size, size["context"], size["batch"]
    x = torch.randint(vocab, (batch, ctx), generator=g).to(path.device)
    y = torch.randint(vocab, (batch, ctx), generator=g).to(path.device)

    def step():
        _, loss = fn(x, y)  # the model's forward computes the cross-entropy (in the compiled graph where compiled)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        update()
        sync(path.device)

    try:
        for _ in range(warmup):  # compiles happen here
            step()
        samples = []
        compiles = torch_tpu.metrics().get("compiles", 0)
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            samples.append((time.perf_counter() - t0) * 1e3)
        if path.device == "tpu":
            COMPILES_PER_STEP[size["name"], path.name] = (torch_tpu.metrics().get("compiles", 0) - compiles) / steps
    finally:
        torch_tpu.set_eager_mode("strict")
    return statistics.median(samples)


COMPILES_PER_STEP: dict[tuple[str, str], float] = {}  # (size, path) -> compiles per timed step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="timed steps per path (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiles)")
    parser.add_argument("--sizes", default="demo,wide", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--threads", type=int, help="CPU eager's intra-op threads (default: torch's)")
    parser.add_argument("--paths", help=f"comma-separated columns (default all: {', '.join(p.name for p in PATHS)})")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.paths:
        wanted = args.paths.split(",")
        PATHS[:] = [p for p in PATHS if p.name in wanted or p is BASELINE]

    vocab = demo.CharTokenizer(demo.load_corpus()).vocab_size
    results = {}  # (size, path name) -> ms
    for name in args.sizes.split(","):
        size = SIZES[name]
        sizes = {k: size[k] for k in ("n_layers", "d_model", "n_heads", "context")}
        size["name"] = name
        base = demo.make_model(vocab, seed=0, dropout=0.0, **sizes)
        size["params"] = sum(p.numel() for p in base.parameters())
        torch_tpu.reset_metrics()
        for path in PATHS:
            results[name, path.name] = median_step_ms(path, base, size, args.steps, args.warmup)
        size["fallbacks"] = sorted(
            k.split("::", 1)[1] for k, v in torch_tpu.metrics().items() if "fallback::" in k and v
        )

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load {load}"
    )
    print(f"torch:   {torch.__version__}")
    print(f"device:  {torch.tpu.get_device_name()}, PJRT C API {torch_tpu._C.plugin_api_version()}")
    print(
        f"step:    forward + cross_entropy + backward + clip_grad_norm_ + AdamW, synchronized; median of {args.steps}\n"
    )
    cols = [p.name for p in PATHS]
    header = ["model", "params"] + [f"{c} ms" for c in cols] + [f"{c} x CPU" for c in cols if c != BASELINE.name]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name in args.sizes.split(","):
        s = SIZES[name]
        label = f"{name}: {s['n_layers']}L d{s['d_model']} ctx{s['context']} b{s['batch']}"
        base_ms = results[name, BASELINE.name]
        ms = [results.get((name, c)) for c in cols]
        cells = [label, f"{s['params']:,}"] + [f"{v:.2f}" if v is not None else "n/a" for v in ms]
        cells += [
            f"{v / base_ms:.2f}" if v is not None else "n/a"
            for c, v in zip(cols, ms, strict=True)
            if c != BASELINE.name
        ]
        print("| " + " | ".join(cells) + " |")
    for (name, path), n in COMPILES_PER_STEP.items():
        if n:  # a steady loop should compile nothing after warm-up
            print(f"\n{name}, {path}: {n:.1f} compiles per timed step")
    for name in args.sizes.split(","):
        if SIZES[name]["fallbacks"]:
            print(f"\n{name}: ops on the CPU fallback: {', '.join(SIZES[name]['fallbacks'])}")


if __name__ == "__main__":
    main()
