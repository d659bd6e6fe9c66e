"""Makes a tiny random Llama- or Qwen2-shaped model with its own tokenizer, for
tests, benchmarks and examples where no model hub can be reached:

    python -m torch_tpu.vllm.tiny_model /tmp/tiny-llama --arch llama
"""

import argparse
import os

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A tensor on the tpu device is computed by XLA. "
    "Hello world, how are you today? Tell me a story about a small robot who learns to paint. "
    "PyTorch models run on TPUs without rewriting them: change the device and run. 0123456789"
)

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(out_dir: str, vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_model(out_dir: str, arch: str = "llama", seed: int = 0, layers: int = 2, hidden: int = 64) -> str:
    """A random model of `arch` ("llama" or "qwen2"), float32, saved with its tokenizer in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    os.makedirs(out_dir, exist_ok=True)
    tokenizer = make_tokenizer(out_dir)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: greedy tokens vary instead of repeating one
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(out_dir)
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    print(make_model(args.out_dir, args.arch, layers=args.layers, hidden=args.hidden))


if __name__ == "__main__":
    main()
