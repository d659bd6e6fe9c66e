"""torch_tpu's vLLM platform plugin: vLLM serves models on the "tpu" device.

vLLM finds it through the `vllm.platform_plugins` entry point (pyproject.toml)
and calls `register()`; one active out-of-tree platform wins over vLLM's own.
TORCH_TPU_VLLM=0 turns it off. Without vLLM installed nothing here is imported.
"""

import os


def register() -> str | None:
    """vLLM's plugin hook: the platform class to use, or None to stay out."""
    if os.environ.get("TORCH_TPU_VLLM", "1") == "0":
        return None
    # Before vLLM reads them: model runner v1 (v2 needs Triton), spawned engine
    # processes (a child forked after the parent used tpu cannot use it).
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    # vLLM pads its batches to its own token buckets (platform.token_buckets):
    # the copies' sizes vary by design, and bounding them again (the default,
    # TORCH_TPU_DYNAMIC=auto) would pad what is padded already.
    os.environ.setdefault("TORCH_TPU_DYNAMIC", "marked")
    from torch_tpu import _C

    _C._set_dynamic(os.environ["TORCH_TPU_DYNAMIC"])
    return "torch_tpu.vllm.platform.TpuPlatform"
