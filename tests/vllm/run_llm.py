"""Runs vLLM's offline LLM once and prints what it generated as JSON (one
process per engine: vLLM keeps global state). Also HF generate as reference.

    python run_llm.py '{"model": DIR, "platform": "tpu"|"cpu"|"hf", "prompts": [...], ...}'
"""

import json
import os
import sys


def batches(cfg):
    """The prompts, as batches given to generate() one after the other."""
    return cfg["batches"] if "batches" in cfg else [cfg["prompts"]]


def hf_generate(cfg):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    outs = []
    prompts = [p for batch in batches(cfg) for p in batch]
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=cfg["max_tokens"], do_sample=False, eos_token_id=None)
        outs.append({"tokens": out[0, ids.shape[1] :].tolist(), "cached": 0})
    return outs


def vllm_generate(cfg):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if cfg["platform"] == "cpu":
        os.environ["TORCH_TPU_VLLM"] = "0"  # vLLM's own CPU platform
    if "eager_mode" in cfg:
        os.environ["TORCH_TPU_EAGER_MODE"] = cfg["eager_mode"]
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=cfg["model"],
        max_model_len=cfg.get("max_model_len", 256),
        max_num_batched_tokens=cfg.get("max_num_batched_tokens", 128),
        max_num_seqs=cfg.get("max_num_seqs", 8),
        kv_cache_memory_bytes=16 << 20,
        dtype="float32",
        enforce_eager=cfg.get("enforce_eager", True),
        enable_prefix_caching=cfg.get("prefix_caching", False),
        enable_chunked_prefill=cfg.get("chunked_prefill", True),
        async_scheduling=cfg.get("async_scheduling"),  # None: vLLM's choice (on)
        seed=0,
    )
    from vllm.platforms import current_platform

    params = SamplingParams(max_tokens=cfg["max_tokens"], temperature=0, ignore_eos=True)
    if cfg["platform"] == "tpu":
        import torch_tpu

        torch_tpu.reset_metrics()  # compiles from here on: after the engine's start and warm-up
    outs = []
    for batch in batches(cfg):
        for o in llm.generate(batch, params, use_tqdm=False):
            outs.append({"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens or 0})
    result = {
        "platform": type(current_platform).__name__,
        "outputs": outs,
        "async_scheduling": llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
    }
    if cfg["platform"] == "tpu":
        import torch_tpu

        result["eager_mode"] = torch_tpu.get_eager_mode()
        result["compiles_after_start"] = torch_tpu.metrics().get("compiles", 0)
    return result


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    result = hf_generate(cfg) if cfg["platform"] == "hf" else vllm_generate(cfg)
    print("RESULT " + json.dumps(result), flush=True)
