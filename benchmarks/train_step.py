"""Training step time: median milliseconds per step, and the first step's seconds.

One step = forward with the loss, backward, clip_grad_norm_, AdamW step, then
a synchronize (so the time is the device's, not the launch's). Columns are
execution paths measured in the same run; the ratio is to CPU PyTorch eager.
The compiled paths (torch.compile with inductor on CPU, with "tpu") compile
two functions: the model's forward with the loss (its backward through
AOTAutograd) and the update (clip_grad_norm_ and AdamW). The first step
(compiles included) is reported beside the steady one.

Workloads (rows): the demo GPT at three sizes (gpt512: 4 layers, d 512,
context 256, where compute is not tiny), one nn.TransformerEncoderLayer(128,
4, 256), and a ResNet-18 (BasicBlocks [2, 2, 2, 2], 64..512 channels,
batch norm) on 32x32 images.

    python benchmarks/train_step.py [--steps N] [--warmup N] [--sizes demo,wide,encoder] [--threads N]
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
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import demo


class WithLoss(nn.Module):
    """A model whose forward(x, y) returns (output, loss), as the demo GPT's does."""

    def __init__(self, model: nn.Module, loss: Callable):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x, y):
        out = self.model(x)
        return out, self.loss(out, y)


def basic_block(c_in: int, c_out: int, stride: int) -> nn.Module:
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c_out)
            self.skip = (
                nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                if stride != 1 or c_in != c_out
                else nn.Identity()
            )

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(h)) + self.skip(x))

    return Block()


def resnet18(classes: int = 10) -> nn.Module:
    layers, c = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [basic_block(c, c_out, stride), basic_block(c_out, c_out, 1)]
        c = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


@dataclass
class Workload:
    """A row: `build(vocab)` makes the model (CPU, seeded), `batch(g)` its inputs and targets."""

    label: str
    build: Callable[[int], nn.Module]
    batch: Callable[[torch.Generator, int], tuple[torch.Tensor, torch.Tensor]]


def gpt(n_layers, d_model, n_heads, context, batch):
    def build(vocab):
        return demo.make_model(
            vocab, seed=0, dropout=0.0, n_layers=n_layers, d_model=d_model, n_heads=n_heads, context=context
        )

    def make_batch(g, vocab):
        return torch.randint(vocab, (batch, context), generator=g), torch.randint(vocab, (batch, context), generator=g)

    return Workload(f"GPT {n_layers}L d{d_model} ctx{context} b{batch}", build, make_batch)


def encoder(batch=16, seq=64):
    def build(vocab):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        return WithLoss(layer, F.mse_loss)

    def make_batch(g, vocab):
        return torch.randn(batch, seq, 128, generator=g), torch.randn(batch, seq, 128, generator=g)

    return Workload(f"TransformerEncoderLayer(128, 4, 256) b{batch} seq{seq}", build, make_batch)


def resnet(batch=16):
    def build(vocab):
        torch.manual_seed(0)
        return WithLoss(resnet18(), F.cross_entropy)

    def make_batch(g, vocab):
        return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(10, (batch,), generator=g)

    return Workload(f"ResNet-18 32x32 b{batch}", build, make_batch)


WORKLOADS = {
    "demo": gpt(n_layers=2, d_model=64, n_heads=4, context=32, batch=32),  # what `make demo` trains
    "wide": gpt(n_layers=4, d_model=128, n_heads=4, context=64, batch=16),
    "gpt512": gpt(n_layers=4, d_model=512, n_heads=8, context=256, batch=8),
    "encoder": encoder(),
    "resnet18": resnet(),
}


@dataclass
class Path:
    """An execution path: a column of the table. `prepare(model, update)` returns the forward and
    update functions to time, or None if the path is not available."""

    name: str
    device: str
    prepare: Callable[[nn.Module, Callable], tuple[Callable, Callable] | None]


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
if torch.cuda.is_available():  # on a GPU machine (scripts/gpu_check.sh): torch's own CUDA paths beside ours
    PATHS += [Path("CUDA eager", "cuda", eager), Path("CUDA inductor", "cuda", compiled("inductor"))]


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def time_steps(path: Path, base_model: nn.Module, work: Workload, vocab: int, steps: int, warmup: int):
    """(first step s, median step ms) of `path`, or None where the path is not available."""
    model = copy.deepcopy(base_model).to(path.device).train()
    opt = demo.make_optimizer(model, 3e-3)

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    fns = path.prepare(model, clip_and_step)
    if fns is None:
        return None
    fn, update = fns
    x, y = (t.to(path.device) for t in work.batch(torch.Generator().manual_seed(0), vocab))

    def step():
        _, loss = fn(x, y)  # the forward computes the loss (in the compiled graph where compiled)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        update()
        sync(path.device)

    try:
        t0 = time.perf_counter()
        step()  # compiles happen here
        first = time.perf_counter() - t0
        for _ in range(warmup - 1):
            step()
        samples = []
        compiles = torch_tpu.metrics().get("compiles", 0)
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            samples.append((time.perf_counter() - t0) * 1e3)
        if path.device == "tpu":
            COMPILES_PER_STEP[work.label, path.name] = (torch_tpu.metrics().get("compiles", 0) - compiles) / steps
    finally:
        torch_tpu.set_eager_mode("strict")
    return first, statistics.median(samples)


COMPILES_PER_STEP: dict[tuple[str, str], float] = {}  # (size, path) -> compiles per timed step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="timed steps per path (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first, the first one timed apart")
    parser.add_argument("--sizes", default="demo,wide,encoder", help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--threads", type=int, help="CPU eager's intra-op threads (default: torch's)")
    parser.add_argument("--paths", help=f"comma-separated columns (default all: {', '.join(p.name for p in PATHS)})")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.paths:
        wanted = args.paths.split(",")
        PATHS[:] = [p for p in PATHS if p.name in wanted or p is BASELINE]

    vocab = demo.CharTokenizer(demo.load_corpus()).vocab_size
    names = args.sizes.split(",")
    results, params, fallbacks = {}, {}, {}  # (name, path name) -> (first s, median ms); name -> ...
    for name in names:
        work = WORKLOADS[name]
        base = work.build(vocab)
        params[name] = sum(p.numel() for p in base.parameters())
        torch_tpu.reset_metrics()
        for path in PATHS:
            results[name, path.name] = time_steps(path, base, work, vocab, args.steps, max(args.warmup, 1))
        fallbacks[name] = sorted(k.split("::", 1)[1] for k, v in torch_tpu.metrics().items() if "fallback::" in k and v)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load {load}"
    )
    print(f"torch:   {torch.__version__}")
    print(f"device:  {torch.tpu.get_device_name()}, PJRT C API {torch_tpu._C.plugin_api_version()}")
    print(
        "step:    forward with the loss + backward + clip_grad_norm_ + AdamW, synchronized; "
        f"median of {args.steps}; first: the first step (compiles included), s\n"
    )
    cols = [p.name for p in PATHS]
    header = (
        ["model", "params"]
        + [f"{c} ms" for c in cols]
        + [f"{c} x CPU" for c in cols if c != BASELINE.name]
        + ["Fused x Strict", "compile x Fused", "compile x inductor"]
        + [f"{c} first s" for c in cols]
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")

    def ratio(name, slow, fast):  # how many times faster `fast` is than `slow`
        a, b = results.get((name, slow)), results.get((name, fast))
        return f"{a[1] / b[1]:.2f}" if a and b else "n/a"

    for name in names:
        base_ms = results[name, BASELINE.name][1]
        got = [results.get((name, c)) for c in cols]
        cells = [WORKLOADS[name].label, f"{params[name]:,}"] + [f"{r[1]:.2f}" if r else "n/a" for r in got]
        cells += [f"{r[1] / base_ms:.2f}" if r else "n/a" for c, r in zip(cols, got, strict=True) if c != BASELINE.name]
        cells += [
            ratio(name, "tpu Strict", "tpu Fused"),
            ratio(name, "tpu Fused", "tpu compile"),
            ratio(name, "CPU inductor", "tpu compile"),
        ]
        cells += [f"{r[0]:.1f}" if r else "n/a" for r in got]
        print("| " + " | ".join(cells) + " |")
    for (label, path), n in COMPILES_PER_STEP.items():
        if n:  # a steady loop should compile nothing after warm-up
            print(f"\n{label}, {path}: {n:.1f} compiles per timed step")
    for name in names:
        if fallbacks[name]:
            print(f"\n{WORKLOADS[name].label}: ops on the CPU fallback: {', '.join(fallbacks[name])}")


if __name__ == "__main__":
    main()
