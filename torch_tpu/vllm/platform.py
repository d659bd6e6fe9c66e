"""The vLLM platform for torch_tpu's "tpu" device (vllm.platforms.interface.Platform)."""

import os

import torch
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

import torch_tpu

# vLLM looks attention backends up by name: ours takes the CUSTOM slot, in every process.
register_backend(AttentionBackendEnum.CUSTOM, "torch_tpu.vllm.attention.TpuAttentionBackend")

# Token counts a compiled step is padded to (and compiled for at start-up):
# powers of two up to max_num_batched_tokens, which is the last bucket.
MIN_BUCKET = 8


def token_buckets(max_tokens: int) -> list[int]:
    buckets, b = [], MIN_BUCKET
    while b < max_tokens:
        buckets.append(b)
        b *= 2
    return buckets + [max_tokens]


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "tpu"
    device_type = "tpu"
    dispatch_key = "PrivateUse1"  # vLLM's own custom ops register their kernels under it
    dist_backend = "gloo"
    device_control_env_var = "TORCH_TPU_VISIBLE_DEVICES"
    simple_compile_backend = "tpu"
    supported_quantization: list[str] = []

    @classmethod
    def get_compile_backend(cls) -> str:
        return "torch_tpu.vllm.compiler.TpuCompiler"

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        return "torch_tpu.vllm.attention.TpuAttentionBackend"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch_tpu._C.device_name()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.tpu.mem_get_info(device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True  # attention stays one op in vLLM's graphs: they are cut around it

    @classmethod
    def import_kernels(cls) -> None:
        pass  # no vllm._C: every kernel vLLM needs here is ours or plain aten

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from torch_tpu.vllm.worker import compute_slot_mapping

        register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping})

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode

        if vllm_config.speculative_config is not None:
            raise NotImplementedError(
                "torch_tpu's vLLM platform: speculative decoding is not supported yet; leave speculative_config unset"
            )
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torch_tpu.vllm.worker.TpuWorker"
        if hasattr(vllm_config, "kernel_config"):
            vllm_config.kernel_config.enable_jit_warmup = False
        cache = vllm_config.cache_config
        if cache.block_size is None:
            cache.block_size = 16
        compilation = vllm_config.compilation_config
        compilation.cudagraph_capture_sizes = []
        if compilation.mode == CompilationMode.VLLM_COMPILE:
            compilation.backend = "tpu"  # not inductor: get_compile_backend's adaptor
            max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
            compilation.compile_sizes = token_buckets(max_tokens)
            passes = compilation.pass_config
            for name in vars(passes) if hasattr(passes, "__dict__") else []:
                if name.startswith("fuse_") or name == "enable_qk_norm_rope_fusion":
                    setattr(passes, name, False)  # CUDA kernels' fusions
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
