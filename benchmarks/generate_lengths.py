"""Hugging Face generate() over prompts of many lengths: how many programs it
compiles per mode, with the prompt ids static, mark_dynamic'ed, or copied
under TORCH_TPU_DYNAMIC=auto (issue 16, item 5). "compile" runs the model's
forward under torch.compile(backend="tpu", dynamic=True) (prefill and
decoding steps traced with symbolic lengths; generate()'s own ops eager, in
Strict mode).

    python benchmarks/generate_lengths.py [--lengths 20] [--modes strict,fused,compile] [--ids static,marked,auto]
                                          [--buckets 128]

Each run is a fresh process with an empty compilation cache: a 1-layer Llama
(hidden 32), greedy, 4 new tokens, the dynamic cache, prompt lengths 3, 6, 9,
...; tokens are compared with CPU's. The table gives the programs compiled
(XLA compiles: op programs in Strict, windows in Fused, graph and eager op
programs in compile), the most for one program family, the compiles per prompt length and the total time.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch, torch_tpu
import transformers as hf
count, ids_kind = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
cfg = hf.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
cpu = hf.LlamaForCausalLM(cfg).eval()
tpu = hf.LlamaForCausalLM(cfg).eval()
tpu.load_state_dict(cpu.state_dict())
tpu = tpu.to("tpu")
if sys.argv[3] == "compile":
    tpu.forward = torch.compile(tpu.forward, backend="tpu", dynamic=True)
per_length, same, start = [], True, time.perf_counter()
for n in [3 + 3 * i for i in range(count)]:
    ids = torch.randint(1, 128, (1, n))
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    want = cpu.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    t = ids.to("tpu")
    if ids_kind == "marked":
        t = torch_tpu.mark_dynamic(t, 1, max=128)
    before = torch_tpu.metrics().get("compiles", 0)
    got = tpu.generate(t, attention_mask=torch.ones_like(t), **kw).cpu()
    per_length.append(torch_tpu.metrics().get("compiles", 0) - before)
    same &= torch.equal(got, want)
m = torch_tpu.metrics()
families = {k: v for k, v in m.items() if k.startswith("compiles::")}
top = max(families.items(), key=lambda kv: kv[1]) if families else ("-", 0)
print(json.dumps({"compiles": m.get("compiles", 0), "top": [top[0][len("compiles::"):], top[1]],
                  "per_length": per_length, "same": same, "seconds": time.perf_counter() - start}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, default=20)
    ap.add_argument("--modes", default="strict,fused,compile")
    ap.add_argument("--ids", default="static,marked,auto")
    ap.add_argument("--buckets", default="", help="TORCH_TPU_DYNAMIC_BUCKETS (default: powers of two)")
    args = ap.parse_args()
    print("| mode | ids | programs | most for one family | compiles per length | s | tokens = CPU |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        for ids in args.ids.split(","):
            with tempfile.TemporaryDirectory() as cache:
                eager = "strict" if mode == "compile" else mode
                env = dict(os.environ, TORCH_TPU_EAGER_MODE=eager, TORCH_TPU_CACHE_DIR=cache)
                env["TORCH_TPU_DYNAMIC"] = "auto" if ids == "auto" else "marked"
                if args.buckets:
                    env["TORCH_TPU_DYNAMIC_BUCKETS"] = args.buckets
                out = subprocess.run(
                    [sys.executable, "-W", "ignore", "-c", CHILD, str(args.lengths), ids, mode],
                    env=env,
                    capture_output=True,
                    text=True,
                )
            if out.returncode != 0:
                print(f"| {mode} | {ids} | failed: {out.stderr.strip().splitlines()[-1]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {mode} | {ids} | {r['compiles']} | {r['top'][1]} ({r['top'][0]}) | "
                f"{' '.join(map(str, r['per_length']))} | {r['seconds']:.0f} | {r['same']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
