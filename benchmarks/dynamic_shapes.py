"""A transformer training loop over random sequence lengths: exact static shapes
vs bounded shapes (torch_tpu.mark_dynamic), in Strict and Fused eager modes and
under torch.compile (the loss compiled, the optimizer eager in Strict mode;
static: dynamic=False, a graph per length; bounded: the marked inputs make
Dynamo's graph symbolic from the second length on).

    python benchmarks/dynamic_shapes.py [--steps 50] [--max-len 512] [--modes strict,fused,compile]

Each run is a fresh process with an empty compilation cache: the same model,
seed and lengths (uniform in 1..max-len), AdamW, loss.item() every step. The
table gives the total time, the programs compiled (all XLA compiles, of which
Fused windows; programs built for padded shapes; Dynamo's graphs), the padding (padded elements of
the ops' padded outputs over their real elements), and the largest difference
between the static and bounded runs' losses.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch_tpu
steps, max_len, mode, bounded = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
V, H, HEADS, BATCH = 256, 64, 4, 4

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.mlp = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))
    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        heads = lambda t: t.view(b, n, HEADS, H // HEADS).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        a = torch.softmax(q @ k.transpose(-2, -1) / (H // HEADS) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, H))
        return x + self.mlp(self.ln2(x))

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(V, H), Block(), Block(), nn.LayerNorm(H), nn.Linear(H, V)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
lengths = torch.randint(1, max_len + 1, (steps,), generator=g).tolist()
def loss_of(x, y):
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
if mode == "compile":
    torch._dynamo.config.cache_size_limit = 1000  # static: a graph per length, none run eagerly
    loss_of = torch.compile(loss_of, backend="tpu", dynamic=None if bounded else False)
else:
    torch_tpu.set_eager_mode(mode)
torch_tpu.reset_metrics()
losses = []
t0 = time.perf_counter()
for n in lengths:
    ids = torch.randint(0, V, (BATCH, n + 1), generator=g)
    x, y = ids[:, :-1].contiguous().to("tpu"), ids[:, 1:].contiguous().to("tpu")
    if bounded:
        torch_tpu.mark_dynamic(x, 1, max=max_len)
        torch_tpu.mark_dynamic(y, 1, max=max_len)
    loss = loss_of(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
seconds = time.perf_counter() - t0
m = torch_tpu.metrics()
exact = {k[len("bounded_exact::"):]: v for k, v in m.items() if k.startswith("bounded_exact::")}
print(json.dumps({"seconds": seconds, "losses": losses, "compiles": m.get("compiles", 0),
                  "windows": m.get("fused_window_compiles", 0), "bucket_programs": m.get("bucket_compiles", 0),
                  "graphs": len(m.get("graph_compile_ms", {})), "dynamo_recompiles": m.get("recompiles", 0),
                  "padding": m.get("padded_elements", 0) / max(m.get("bounded_real_elements", 0), 1), "exact": exact}))
"""


def run(steps: int, max_len: int, mode: str, bounded: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        # marked: the static run keeps exact shapes (the default, auto, would bound the copies' length)
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache, TORCH_TPU_DYNAMIC="marked")
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(steps), str(max_len), mode, "1" if bounded else "0"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--modes", default="strict,fused,compile")
    a = p.parse_args()
    print(f"{a.steps} steps, lengths 1..{a.max_len}, batch 4, a 2-block transformer (hidden 64), AdamW")
    print(
        "| mode | shapes | total s | ratio | XLA compiles | of which windows | padded-shape programs | "
        "graph programs | padding | max loss diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in a.modes.split(","):
        static = run(a.steps, a.max_len, mode, False)
        bounded = run(a.steps, a.max_len, mode, True)
        diff = max(abs(x - y) for x, y in zip(static["losses"], bounded["losses"], strict=True))
        for name, r in (("static", static), ("bounded", bounded)):
            print(
                f"| {mode} | {name} | {r['seconds']:.1f} | {r['seconds'] / static['seconds']:.2f}x | "
                f"{r['compiles']} | {r['windows']} | {r['bucket_programs']} | {r['graphs']} | {r['padding']:.0%} | "
                f"{diff if name == 'bounded' else 0:.2e} |"
            )
        if bounded["exact"]:
            print(f"  {mode}: ops that read exact shapes: {bounded['exact']}")


if __name__ == "__main__":
    main()
