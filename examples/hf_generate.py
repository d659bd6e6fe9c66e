"""Generate text with a Hugging Face Llama on "tpu", in a chosen mode.

    python examples/hf_generate.py --mode strict                 # eager, default (dynamic) KV cache
    python examples/hf_generate.py --mode fused                  # eager, each token's ops run as one program
    python examples/hf_generate.py --mode compile                # static KV cache, decoding step compiled
    python examples/hf_generate.py --model hf_finetune_model     # the model examples/hf_finetune.py saved

Without --model the Llama has random weights (seeded), so the text is noise;
with a model from hf_finetune.py it continues the corpus's stories. In compile
mode transformers compiles the decoding step itself (on a "tpu" model with the
static cache it uses torch.compile(backend="tpu")): one graph for every
token. The run prints the text, tokens/s of a second, warm call, and the
programs compiled.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import transformers
from hf_finetune import make_llama

import torch_tpu
from torch_tpu.demo import CharTokenizer, load_corpus


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["strict", "fused", "compile"], default="strict")
    p.add_argument("--model", type=Path, help="a directory saved by hf_finetune.py (default: random weights)")
    p.add_argument("--prompt", default="once upon a time")
    p.add_argument("--new-tokens", type=int, default=60)
    p.add_argument("--sample", action="store_true", help="sample (temperature 0.8) instead of greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="tpu")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    if args.model:
        tok = CharTokenizer("")
        tok.chars = json.loads((args.model / "chars.json").read_text())
        tok.index = {c: i for i, c in enumerate(tok.chars)}
        model = transformers.LlamaForCausalLM.from_pretrained(args.model)
    else:
        tok = CharTokenizer(load_corpus())
        model = make_llama(tok.vocab_size, args.seed)
    model = model.to(args.device).eval()
    prompt = tok.encode(args.prompt)[None].to(args.device)
    kwargs = {"max_new_tokens": args.new_tokens, "do_sample": args.sample, "pad_token_id": 0}
    if args.sample:
        kwargs.update(temperature=0.8, top_k=0)
    if args.mode == "compile":
        kwargs["cache_implementation"] = "static"
    torch_tpu.set_eager_mode("fused" if args.mode == "fused" else "strict")

    for run in ("cold", "warm"):
        torch.manual_seed(args.seed)
        before = torch_tpu.metrics().get("compiles", 0)
        start = time.perf_counter()
        out = model.generate(prompt, **kwargs).cpu()
        seconds = time.perf_counter() - start
        new = out.shape[1] - prompt.shape[1]
        compiled = torch_tpu.metrics().get("compiles", 0) - before
        print(f"{run}: {new} tokens in {seconds:.2f} s, {new / seconds:.1f} tokens/s, {compiled} programs compiled")
    print(repr(tok.decode(out[0].tolist())))


if __name__ == "__main__":
    main()
