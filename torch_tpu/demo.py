"""The demo: a small GPT-style character language model trained on "tpu".

    python -m torch_tpu.demo [--steps N] [--device tpu] [--mode strict|debug|fused|compile]
                             [--compare-cpu] [--out loss.png]

Trains on a corpus of simple generated sentences shipped with the package
(torch_tpu/data/tiny_corpus.txt, written by `generate_corpus`), shows a
progress bar with the loss and steps/s, prints a greedy sample and writes the
loss curve as a PNG. `make demo` runs it with --compare-cpu.
"""

import argparse
import copy
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS_PATH = Path(__file__).parent / "data" / "tiny_corpus.txt"
MODES = ("strict", "debug", "fused", "compile")


# ---------------------------------------------------------------------------
# Corpus: tiny stories from a small grammar, deterministic in the seed.


def generate_corpus(seed: int = 0, n_chars: int = 24_000) -> str:
    """Short stories of simple sentences: enough structure for a tiny model to learn in a few hundred steps."""
    rng = random.Random(seed)
    names = ["tom", "anna", "ben", "lily", "sam", "mia", "max", "zoe"]
    animals = ["cat", "dog", "bird", "fox", "frog", "duck", "bear", "fish"]
    adjectives = ["little", "big", "red", "happy", "sleepy", "kind", "small", "brave"]
    places = ["the park", "the garden", "the house", "the forest", "the river", "the barn"]
    things = ["ball", "box", "kite", "hat", "cake", "book", "boat", "apple"]
    verbs = ["found", "saw", "liked", "had", "made", "took"]
    feelings = ["happy", "sad", "tired", "glad", "hungry"]

    def sentence(name: str, animal: str) -> str:
        kind = rng.randrange(6)
        if kind == 0:
            return f"{name} {rng.choice(verbs)} a {rng.choice(adjectives)} {rng.choice(things)}."
        if kind == 1:
            return f"the {animal} went to {rng.choice(places)}."
        if kind == 2:
            return f"{name} and the {animal} played in {rng.choice(places)}."
        if kind == 3:
            return f"the {animal} was {rng.choice(feelings)}."
        if kind == 4:
            return f"{name} gave the {animal} a {rng.choice(things)}."
        return f"then {name} went home."

    stories = []
    size = 0
    while size < n_chars:
        name, animal = rng.choice(names), rng.choice(animals)
        lines = [f"once upon a time there was a {rng.choice(adjectives)} {animal}."]
        lines.append(f"{name} saw the {animal} in {rng.choice(places)}.")
        lines += [sentence(name, animal) for _ in range(rng.randrange(2, 5))]
        lines.append("the end.")
        story = " ".join(lines) + "\n"
        stories.append(story)
        size += len(story)
    return "".join(stories)


def load_corpus() -> str:
    return CORPUS_PATH.read_text(encoding="ascii")


class CharTokenizer:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


# ---------------------------------------------------------------------------
# The model: a GPT in plain PyTorch.


@dataclass
class GPTConfig:
    vocab_size: int
    context: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for y in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))  # GPT-2's scaled residual init

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_new: int) -> list[int]:
        """Greedy decoding over a sliding window of exactly `context` tokens: one shape, so one compile per op."""
        window = prompt[-self.cfg.context :].view(1, -1)
        assert window.shape[1] == self.cfg.context, "the prompt must be at least `context` tokens long"
        out = []
        for _ in range(n_new):
            logits, _ = self(window)
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)
            window = torch.cat([window[:, 1:], nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1).view(-1).tolist()


# ---------------------------------------------------------------------------
# Training.


def make_model(vocab_size: int, seed: int, dropout: float, **sizes) -> GPT:
    """Weights are initialized on CPU from the seed, so every device starts from the same ones."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, dropout=dropout, **sizes))


def batches(data: torch.Tensor, steps: int, batch_size: int, context: int, seed: int):
    """The same (inputs, targets) sequence for every device: drawn on CPU from its own generator."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(len(data) - context - 1, (batch_size,), generator=g)
        x = torch.stack([data[s : s + context] for s in starts.tolist()])
        y = torch.stack([data[s + 1 : s + context + 1] for s in starts.tolist()])
        yield x, y


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def train(
    model: GPT,
    data: torch.Tensor,
    device: str,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: bool = True,
    desc: str = "",
    compile: bool = False,
    compile_update: bool = True,
) -> list[float]:
    """Trains `model` in place on `device`; returns the loss of every step. With `compile`, the
    forward (and with it the backward) and the update (gradient clipping and the AdamW step)
    run through torch.compile(backend="tpu"); `compile_update=False` keeps the update eager."""
    from tqdm import tqdm

    model.to(device).train()
    forward = torch.compile(model, backend="tpu") if compile else model
    opt = make_optimizer(model, lr)

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    update = torch.compile(clip_and_step, backend="tpu") if compile and compile_update else clip_and_step
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # device losses not read yet: reading syncs, so read every few steps
    bar = tqdm(total=steps, desc=desc, unit="step", disable=not progress, dynamic_ncols=True)
    for x, y in batches(data, steps, batch_size, model.cfg.context, seed):
        x, y = x.to(device), y.to(device)
        _, loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        update()
        pending.append(loss.detach())
        if len(pending) == 10 or len(losses) + len(pending) == steps:
            losses += torch.stack(pending).cpu().tolist()
            bar.update(len(pending))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            pending = []
    bar.close()
    return losses


def plot(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ["-", "--", ":"]
    for i, (label, losses) in enumerate(curves.items()):
        ax.plot(range(1, len(losses) + 1), losses, styles[i % len(styles)], label=label, linewidth=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/char)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tpu.demo",
        description=(
            "Train a small GPT-style character language model on the bundled corpus of simple sentences, "
            "show the loss and steps/s, print a greedy sample and write the loss curve."
        ),
        epilog=(
            "Weights are initialized on CPU from --seed and copied to each device, and batches are drawn on CPU "
            "from the seed, so the tpu and CPU runs see the same weights and data. --compare-cpu trains with "
            "dropout 0: a device's random stream differs from CPU's by design, so with dropout on the curves "
            "would differ by the dropout masks, not by the backend."
        ),
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--device", default="tpu", help='device to train on (default "tpu")')
    parser.add_argument(
        "--mode",
        default="strict",
        help="on tpu: strict (eager, async, default), debug (eager, every op awaited), fused (eager, "
        "each step recorded and run as one program) or compile (the model's forward and backward "
        "through torch.compile(backend='tpu'), then clipping and AdamW as a second compiled function)",
    )
    parser.add_argument("--compare-cpu", action="store_true", help="also train on CPU and plot both curves")
    parser.add_argument(
        "--out", type=Path, default=Path("demo_loss.png"), help="loss-curve PNG (default demo_loss.png)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout (0 with --compare-cpu)")
    parser.add_argument("--sample-chars", type=int, default=120, help="length of the greedy sample")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.mode not in MODES:
        parser.error(f"--mode must be one of {', '.join(MODES)} (got {args.mode!r})")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.compare_cpu:
        args.dropout = 0.0
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch_tpu

    text = load_corpus()
    tok = CharTokenizer(text)
    data = tok.encode(text)
    cpu_model = make_model(tok.vocab_size, args.seed, args.dropout)
    model = copy.deepcopy(cpu_model)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = model.cfg
    print(
        f"corpus: {len(text)} chars, vocab {tok.vocab_size}; model: GPT {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.n_heads} heads, context {cfg.context}, {n_params} parameters, dropout {cfg.dropout}"
    )
    on_tpu = torch.device(args.device).type == "tpu"
    if on_tpu:
        print(f"device: {args.device} ({torch.tpu.get_device_name()}), eager mode {args.mode}")
        torch_tpu.reset_metrics()

    curves = {}
    t0 = time.perf_counter()
    compile_mode = args.mode == "compile"
    with torch_tpu.set_eager_mode("strict" if compile_mode else args.mode):
        losses = train(
            model,
            data,
            args.device,
            args.steps,
            args.batch_size,
            args.lr,
            args.seed,
            not args.no_progress,
            compile=compile_mode,
        )
    elapsed = time.perf_counter() - t0
    curves[f"{args.device} ({args.mode})" if on_tpu else args.device] = losses
    print(f"{args.device}: {args.steps} steps in {elapsed:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    if on_tpu:
        m = torch_tpu.metrics()
        fallbacks = {k.split("::", 1)[1]: v for k, v in m.items() if k.startswith("fallback::") and v}
        print(f"compiles: {m.get('compiles', 0)}, device executions: {m.get('executions', 0)}")
        if fallbacks:
            print("ran on the CPU fallback: " + ", ".join(f"{k} ({v}x)" for k, v in sorted(fallbacks.items())))

    prompt = text[: cfg.context]
    model.eval()
    sample = tok.decode(model.generate(tok.encode(prompt).to(args.device), args.sample_chars))
    print(f"sample (greedy, after {args.steps} steps):\n  {prompt}|{sample}")

    status = 0
    if args.compare_cpu:
        t0 = time.perf_counter()
        cpu_losses = train(
            cpu_model, data, "cpu", args.steps, args.batch_size, args.lr, args.seed, not args.no_progress
        )
        print(f"cpu: {args.steps} steps in {time.perf_counter() - t0:.1f} s")
        curves["cpu"] = cpu_losses
        diff = max(abs(a - b) for a, b in zip(losses, cpu_losses, strict=True))
        # Float32 sums in another order drift a little over hundreds of Adam steps; a backend bug drifts far more.
        tol = 1e-2
        ok = diff <= tol
        verdict = "matches" if ok else "DIFFERS"
        print(f"max |{args.device} - cpu| loss over {args.steps} steps: {diff:.2e} ({verdict}, tol {tol})")
        status = 0 if ok else 1

    plot(curves, args.out, f"GPT ({n_params} params) on the tiny corpus")
    print(f"loss curve: {args.out}")
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
