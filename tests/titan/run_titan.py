"""TorchTitan's trainer on "tpu" (or on CPU, the reference), through a small adapter.

    torchrun --nproc_per_node=2 tests/titan/run_titan.py --device tpu -- \
        --module llama3 --config llama3_debugmodel --parallelism.data_parallel_shard_degree 2 ...

Everything after ``--`` goes to TorchTitan's own command line (``torchtitan.train``).
The adapter, in the manner of Ascend's torchtitan adaptation, does only this:

* device: TorchTitan picks its device with ``torch._utils._get_available_device_type()``,
  which finds ``torch.tpu`` (torch_tpu is loaded at ``import torch``); its
  process-group backend comes from ``Backend.default_device_backend_map["tpu"] ==
  "tpu"``. Nothing to patch there. For ``--device cpu`` (which TorchTitan does not
  offer) torch_tpu is not loaded and ``device_type``/``device_module`` are set to
  "cpu" and a ``torch.cpu`` wrapper with the few memory queries TorchTitan asks for.
* attention: TorchTitan's language models only offer FlexAttention (or CUDA varlen),
  and torch refuses ``flex_attention`` on any device but CUDA/CPU/HPU/MPS (and it
  has only an Inductor lowering). With ``--attention sdpa`` the block-causal
  packed-document mask TorchTitan builds (the same ``mask_mod``) is materialized
  as a dense boolean mask and fed to ``F.scaled_dot_product_attention`` instead,
  which is the same math (tests/titan/check_attention.py checks it against
  FlexAttention). The CPU reference needs it too: torch 2.13's ``flex_attention``
  has no backward on CPU ("FlexAttention does not support backward on CPU"), so
  ``--attention flex`` (TorchTitan's stock FlexAttention) cannot train anywhere here.
* torch 2.13: ``torch.distributed.set_timeout`` (newer torch) is the private
  ``_set_pg_timeout`` here; and on CPU, Gloo has no ``ReduceOp.PREMUL_SUM``, which
  FSDP2 uses for TorchTitan's gradient divide factor 1, so the CPU reference reduces
  with a plain SUM (``set_force_sum_reduction_for_comms``), the same numbers.
* compile: TorchTitan refuses a non-Inductor compile backend for a model that uses
  FlexAttention; with ``--attention sdpa`` there is none left, so the backend named
  by ``--compile.backend`` (``tpu``) compiles each TransformerBlock and the loss.
"""

import argparse
import os
import sys


def _parse():
    argv = sys.argv[1:]
    if "--" in argv:
        i = argv.index("--")
        ours, titan = argv[:i], argv[i + 1 :]
    else:
        ours, titan = argv, []
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["tpu", "cpu"], required=True)
    p.add_argument("--attention", choices=["sdpa", "flex"], default="sdpa")
    p.add_argument("--losses", help="append {step, loss, grad_norm} JSON lines here")
    return p.parse_args(ours), titan


if __name__ == "__main__":
    ARGS, TITAN_ARGS = _parse()
    if ARGS.device == "cpu":
        # The reference: plain torch on CPU, torch_tpu not loaded at all.
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402


def _cpu_device_module():
    import types

    m = types.ModuleType("titan_cpu_device")
    for name in ("is_available", "synchronize", "current_stream", "stream", "Stream", "Event"):
        if hasattr(torch.cpu, name):
            setattr(m, name, getattr(torch.cpu, name))
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.set_device = lambda device: None
    m.get_device_name = lambda device=None: "cpu"
    m.get_device_properties = lambda device=None: types.SimpleNamespace(
        name="cpu", total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    )
    m.memory_stats = lambda device=None: {}
    m.reset_peak_memory_stats = lambda device=None: None
    m.empty_cache = lambda: None
    return m


def _patch_device(device):
    import torchtitan.tools.utils as tu

    if device == "cpu":
        tu.device_type, tu.device_module = "cpu", _cpu_device_module()
    # Everything else in TorchTitan imports these names from torchtitan.tools.utils,
    # so this runs before any other torchtitan module is imported.
    assert tu.device_type == device, (tu.device_type, device)
    if device == "cpu":
        import torchtitan.distributed.fsdp as tfsdp

        # TorchTitan sets FSDP's gradient divide factor to 1, which FSDP2 turns
        # into a ReduceOp.PREMUL_SUM(1.0) reduce-scatter: Gloo has no PREMUL_SUM.
        # A plain SUM is the same reduction.
        stock = tfsdp.disable_fsdp_gradient_division

        def disable_fsdp_gradient_division(model):
            stock(model)
            for module in model.modules():
                if isinstance(module, tfsdp.FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)

        tfsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division


def patch_attention():
    import torch.nn.functional as F
    import torchtitan.distributed.compile as tcompile
    import torchtitan.models.common.decoder as decoder
    from torch.distributed.tensor import DTensor
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    def dense_attention_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, **_):
        # [B, 1, Q, KV] booleans: the mask_mod FlexAttention's BlockMask is built from.
        return create_mask(mask_mod, B, 1 if H is None else H, Q_LEN, KV_LEN, device=device)

    def forward(
        self,
        q_BLNH,
        k_BLNH,
        v_BLNH,
        *,
        attention_masks,
        score_mod=None,
        scale=None,
        enable_gqa=False,
        out_transform=None,
        **kwargs,
    ):
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("score_mod/out_transform need FlexAttention")
        if isinstance(attention_masks, DTensor):
            # spmd_backend=full_dtensor: attention runs in local_map on the local
            # batch shard; the mask, built from the positions DTensor, follows it.
            attention_masks = attention_masks.to_local()
        out_BNLH = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=attention_masks,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out_BNLH.transpose(1, 2)

    decoder.create_attention_mask = dense_attention_mask
    FlexAttention.forward = forward
    # No FlexAttention region left for TorchTitan to route to Inductor.
    tcompile._maybe_regional_inductor_backend = lambda model, backend: backend


def _patch_torch_gaps():
    import torch.distributed as dist

    # TorchTitan 0.3.0 shortens the process groups' timeouts after the first step
    # with torch.distributed.set_timeout, which torch 2.13 has only as the private
    # _set_pg_timeout (same arguments).
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout


def _record_losses(path):
    """Also write each step's loss and grad norm at full precision (rank 0)."""
    import json

    from torchtitan.components.metrics import MetricsProcessor

    stock = MetricsProcessor.log

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        if int(os.environ.get("RANK", "0")) == 0:
            with open(path, "a") as f:
                rec = {"step": step, "loss": float(global_avg_loss), "grad_norm": float(grad_norm)}
                f.write(json.dumps(rec) + "\n")
        return stock(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)

    MetricsProcessor.log = log


def main():
    _patch_torch_gaps()
    _patch_device(ARGS.device)
    if ARGS.attention == "sdpa":
        patch_attention()
    elif ARGS.device == "tpu":
        raise SystemExit("FlexAttention does not run on tpu: use --attention sdpa")
    if ARGS.losses:
        _record_losses(ARGS.losses)
    from torchtitan.train import main as titan_main

    sys.argv = [sys.argv[0]] + TITAN_ARGS
    titan_main()
    if ARGS.losses and ARGS.device == "tpu" and int(os.environ.get("RANK", "0")) == 0:
        import json

        import torch_tpu

        # The runtime's counters: graphs torch.compile(backend="tpu") compiled, programs run.
        with open(ARGS.losses + ".tpu_metrics.json", "w") as f:
            json.dump(torch_tpu.metrics(), f, default=str)


if __name__ == "__main__":
    main()
