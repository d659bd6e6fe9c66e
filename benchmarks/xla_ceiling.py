"""How fast can any XLA program run this training step on this machine?

Issue 17 asks Fused eager to be 2x Strict. Fused runs a step as one XLA
program, so its floor is what the XLA compiler's backend makes of the step,
not our recording. This script measures that floor without torch_tpu in the
way: train_step.py's training step (forward with the loss, backward,
clip_grad_norm_, AdamW) of the demo GPT, the wider GPT and the
TransformerEncoderLayer, written in JAX and run as one `jax.jit` program with
its parameters and optimizer state donated, the best case an XLA frontend
can give the compiler. Beside it, in the same process: CPU PyTorch eager
(one thread), tpu Strict and tpu Fused (the same paths as train_step.py),
and Strict and Fused with one host read per 20 steps instead of a
synchronize per step.
The JAX step starts from the torch model's weights; its first loss is
checked against CPU PyTorch's.

Also: one matmul of each of the step's shapes, plain and with a transposed
operand (the backward's weight gradients), in JAX's XLA and in PyTorch.

    python benchmarks/xla_ceiling.py [--steps N] [--sizes demo,wide,encoder]
"""

import argparse
import copy
import os
import platform
import statistics
import time

import numpy as np
import torch
import train_step  # benchmarks/, the script's folder

import torch_tpu
from torch_tpu import demo


def ln(h, p, prefix):
    import jax.numpy as jnp

    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + 1e-5) * p[prefix + ".weight"] + p[prefix + ".bias"]


def linear(h, p, prefix, bias=True):
    out = h @ p[prefix + ".weight"].T
    return out + p[prefix + ".bias"] if bias else out


def attention(q, k, v, causal):
    """softmax(q k^T / sqrt(dh)) v over [b, heads, t, dh]."""
    import jax
    import jax.numpy as jnp

    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        t = q.shape[2]
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jax.nn.softmax(s, -1) @ v


def gpt_loss(model):
    """The demo GPT's forward with its cross-entropy loss, over a dict of its parameters."""
    import jax
    import jax.numpy as jnp

    n_layers, n_heads = len(model.blocks), model.blocks[0].attn.n_heads

    def loss(p, x, y):
        b, t = x.shape
        h = p["tok_emb.weight"][x] + p["pos_emb.weight"][:t]
        d = h.shape[-1]
        for i in range(n_layers):
            q = f"blocks.{i}."
            qkv = linear(ln(h, p, q + "ln1"), p, q + "attn.qkv")
            heads = [z.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, -1)]
            o = attention(*heads, causal=True).transpose(0, 2, 1, 3).reshape(b, t, d)
            h = h + linear(o, p, q + "attn.proj")
            m = jax.nn.gelu(linear(ln(h, p, q + "ln2"), p, q + "mlp.0"), approximate=False)
            h = h + linear(m, p, q + "mlp.2")
        logits = ln(h, p, "ln_f") @ p["tok_emb.weight"].T
        return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), y[..., None], -1).mean()

    return loss


def encoder_loss(model):
    """nn.TransformerEncoderLayer (post-norm, ReLU, batch_first) with the MSE loss."""
    import jax
    import jax.numpy as jnp

    n_heads = model.model.self_attn.num_heads

    def loss(p, x, y):
        b, t, d = x.shape
        qkv = x @ p["model.self_attn.in_proj_weight"].T + p["model.self_attn.in_proj_bias"]
        heads = [z.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, -1)]
        o = attention(*heads, causal=False).transpose(0, 2, 1, 3).reshape(b, t, d)
        h = ln(x + linear(o, p, "model.self_attn.out_proj"), p, "model.norm1")
        f = linear(jax.nn.relu(linear(h, p, "model.linear1")), p, "model.linear2")
        return ((ln(h + f, p, "model.norm2") - y) ** 2).mean()

    return loss


def jax_step(model: torch.nn.Module, loss_fn):
    """The training step (loss, backward, clip_grad_norm_(1.0), AdamW) as one jitted JAX function
    (params, m, v, t, x, y) -> (params, m, v, t, loss), with params and optimizer state donated."""
    import jax
    import jax.numpy as jnp

    params = {k: jnp.asarray(v.detach().numpy()) for k, v in model.named_parameters()}
    lr, b1, b2, eps, wd = 3e-3, 0.9, 0.999, 1e-8, 0.01  # demo.make_optimizer's AdamW

    def step(p, m, v, t, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        norm = jnp.sqrt(sum(jnp.sum(gi * gi) for gi in jax.tree.leaves(g)))
        g = jax.tree.map(lambda gi: gi * jnp.minimum(1.0, 1.0 / (norm + 1e-6)), g)
        t = t + 1
        m = jax.tree.map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = jax.tree.map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)

        def update(pi, mi, vi):
            pi = pi * (1 - lr * wd)
            return pi - lr * (mi / (1 - b1**t)) / (jnp.sqrt(vi / (1 - b2**t)) + eps)

        return jax.tree.map(update, p, m, v), m, v, t, loss

    zeros = [jax.tree.map(jnp.zeros_like, params) for _ in range(2)]
    return jax.jit(step, donate_argnums=(0, 1, 2)), [params, *zeros, jnp.float32(0)]


JAX_LOSSES = {"demo": gpt_loss, "wide": gpt_loss, "gpt512": gpt_loss, "encoder": encoder_loss}


def time_jax(model, loss_fn, x, y, steps, warmup):
    import jax.numpy as jnp

    fn, state = jax_step(model, loss_fn)
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    t0 = time.perf_counter()
    *state, loss = fn(*state, xj, yj)
    first_loss = float(loss)
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        *state, loss = fn(*state, xj, yj)
    loss.block_until_ready()
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        *state, loss = fn(*state, xj, yj)
        loss.block_until_ready()
        samples.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(samples), first_loss


def pipelined_ms(base, work, vocab, mode, steps=20, rounds=3):
    """ms per step of `steps` steps with one host read at the end (a loop that logs its loss every `steps`
    steps): the host records step k+1 while the device runs step k. Best of `rounds`."""
    model = copy.deepcopy(base).to("tpu").train()
    opt = demo.make_optimizer(model, 3e-3)
    x, y = (t.to("tpu") for t in work.batch(torch.Generator().manual_seed(0), vocab))
    torch_tpu.set_eager_mode(mode)
    try:

        def step():
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        for _ in range(5):
            step()
        torch.tpu.synchronize()
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = step()
            loss.item()
            best = min(best, (time.perf_counter() - t0) / steps * 1e3)
        return best
    finally:
        torch_tpu.set_eager_mode("strict")


def matmul_table(reps=200):
    """Per matmul shape of the demo GPT's step: JAX's XLA and PyTorch (one thread), in microseconds."""
    import jax
    import jax.numpy as jnp

    def best_of(f, *a):
        f(*a).block_until_ready()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                out = f(*a)
            out.block_until_ready()
            best = min(best, (time.perf_counter() - t0) / reps)
        return best * 1e6

    def torch_best(f):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                f()
            best = min(best, (time.perf_counter() - t0) / reps)
        return best * 1e6

    rows = []
    for m, k, n in [(1024, 64, 192), (1024, 64, 256), (1024, 256, 64), (1024, 64, 64)]:
        a, b = torch.randn(m, k), torch.randn(k, n)
        at = a.t().contiguous()
        ja, jb, jat = (jnp.asarray(t.numpy()) for t in (a, b, at))
        plain = best_of(jax.jit(lambda a, b: a @ b), ja, jb)
        trans = best_of(jax.jit(lambda at, b: at.T @ b), jat, jb)
        rows.append(
            ((m, k, n), plain, trans, torch_best(lambda a=a, b=b: a @ b), torch_best(lambda at=at, b=b: at.t() @ b))
        )
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", default="demo,wide,encoder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TORCH_TPU_DYNAMIC", "marked")
    import jax

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"torch {torch.__version__} (1 thread); jax {jax.__version__} on {jax.devices()[0].platform}")
    vocab = 64
    print()
    print(
        "| model | CPU eager ms | tpu Strict ms | tpu Fused ms | JAX jit (one XLA program) ms | Strict / 2 ms "
        "| Fused x Strict | JAX x Strict | Strict, Fused ms, sync every 20 steps | loss JAX - CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        work = train_step.WORKLOADS[size]
        base = work.build(vocab)
        x, y = work.batch(torch.Generator().manual_seed(0), vocab)
        times = {}
        for path in train_step.PATHS:
            if path.name in ("CPU eager", "tpu Strict", "tpu Fused"):
                times[path.name] = train_step.time_steps(path, base, work, vocab, args.steps, args.warmup)[1]
        _, cpu_loss = base(x, y)
        _, jax_ms, jax_loss = time_jax(base, JAX_LOSSES[size](base), x, y, args.steps, args.warmup)
        strict, fused = times["tpu Strict"], times["tpu Fused"]
        piped = [pipelined_ms(base, work, vocab, mode) for mode in ("strict", "fused")]
        print(
            f"| {work.label} | {times['CPU eager']:.2f} | {strict:.2f} | {fused:.2f} | {jax_ms:.2f} | "
            f"{strict / 2:.2f} | {strict / fused:.2f} | {strict / jax_ms:.2f} | "
            f"{piped[0]:.2f}, {piped[1]:.2f} ({piped[0] / piped[1]:.2f}x) | {jax_loss - float(cpu_loss.detach()):.1e} |"
        )
    print()
    print("| matmul m x k x n | JAX a@b us | JAX a.T@b us | torch a@b us | torch a.T@b us |")
    print("|---|---|---|---|---|")
    for shape, plain, trans, tplain, ttrans in matmul_table():
        print(f"| {' x '.join(map(str, shape))} | {plain:.0f} | {trans:.0f} | {tplain:.0f} | {ttrans:.0f} |")


if __name__ == "__main__":
    main()
