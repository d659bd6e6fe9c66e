"""Fine-tune a small Hugging Face Llama on "tpu".

The model is a `transformers.LlamaForCausalLM` built from a config (random
weights, seeded; nothing is downloaded), trained as a character-level language
model on the corpus of simple stories that ships with torch_tpu
(torch_tpu/data/tiny_corpus.txt). The training loop is plain PyTorch and
transformers: the only line that names the device is `.to(device)`.

    python examples/hf_finetune.py --steps 200            # Strict eager
    python examples/hf_finetune.py --steps 200 --mode compile   # or --mode fused

It shows a progress bar with the loss, writes the loss curve to a PNG, saves
the model (`save_pretrained`) and its characters, prints a greedy sample, and
examples/hf_generate.py --model DIR generates from the saved model.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

import torch_tpu
from torch_tpu.demo import CharTokenizer, batches, load_corpus, plot

CONTEXT = 64


def make_llama(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 64) -> transformers.LlamaForCausalLM:
    """A small Llama with random weights drawn on CPU from `seed` (the same on every device)."""
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * CONTEXT,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", default="tpu")
    p.add_argument(
        "--mode", choices=["strict", "fused", "compile"], default="strict", help="Strict or Fused eager, or compile"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("hf_finetune_loss.png"), help="the loss plot")
    p.add_argument("--save", type=Path, default=Path("hf_finetune_model"), help="where the model is saved")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    text = load_corpus()
    tok = CharTokenizer(text)
    data = tok.encode(text)
    model = make_llama(tok.vocab_size, args.seed).to(args.device).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"corpus: {len(text)} chars, vocab {tok.vocab_size}; LlamaForCausalLM, {n_params:,} parameters")
    print(f"device: {args.device}, mode: {args.mode}, {args.steps} steps of {args.batch} x {CONTEXT} chars")

    forward = torch.compile(model, backend="tpu") if args.mode == "compile" else model
    if args.device == "tpu":
        torch_tpu.set_eager_mode("fused" if args.mode == "fused" else "strict")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # reading a loss waits for the device: read every 10 steps
    start = time.perf_counter()
    bar = tqdm(total=args.steps, unit="step", dynamic_ncols=True)
    for x, _ in batches(data, args.steps, args.batch, CONTEXT, args.seed):
        x = x.to(args.device)
        loss = forward(input_ids=x, labels=x).loss  # transformers shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        pending.append(loss.detach())
        if len(pending) == 10 or len(losses) + len(pending) == args.steps:
            losses += torch.stack(pending).cpu().tolist()
            bar.update(len(pending))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            pending = []
    bar.close()
    seconds = time.perf_counter() - start
    m = torch_tpu.metrics()
    print(
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {seconds:.1f} s "
        f"({args.steps / seconds:.1f} steps/s; {m.get('compiles', 0)} programs compiled)"
    )

    plot({f"{args.device} {args.mode}": losses}, args.out, f"LlamaForCausalLM ({n_params:,} params), tiny corpus")
    print(f"loss curve: {args.out}")

    model.eval()
    prompt = tok.encode("once upon a time")[None].to(args.device)
    # The static KV cache keeps every decoding step's shapes the same, so each
    # op compiles once (a growing cache would compile new shapes every token);
    # in compile mode transformers compiles the decoding step with backend "tpu".
    static = {"cache_implementation": "static", "disable_compile": args.mode != "compile"}
    out = model.generate(prompt, max_new_tokens=80, do_sample=False, **static)
    print("sample:", tok.decode(out[0].tolist()))

    model.cpu().save_pretrained(args.save)
    (args.save / "chars.json").write_text(json.dumps(tok.chars))
    print(f"model: {args.save}")


if __name__ == "__main__":
    main()
