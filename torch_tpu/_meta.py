"""Meta kernels that PyTorch writes for CUDA's limits where "tpu" has none.

`_grouped_mm` (mixture-of-experts layers; Hugging Face calls it on "tpu"):
torch's meta kernel accepts only bfloat16, the dtype of CUDA's kernel, though
its CPU kernel takes any float. On "tpu" every float dtype lowers, so the
output shape is computed here for float16/float32 inputs of one dtype on the
meta device (what the eager kernel asks) and for fake "tpu"/"cpu" tensors
(what torch.compile traces); everything else goes to torch's own kernel,
with its own checks. Torch's kernel is registered twice, at the dispatcher's
Meta key and as the op's Python-dispatcher kernel (what tracing uses): ours
replaces both.
"""

import torch
from torch._meta_registrations import _create_grouped_mm_output_tensor, device_hint, meta_grouped_mm

_LIB = torch.library.Library("aten", "IMPL", "Meta")


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    fake = isinstance(mat_a, torch._subclasses.FakeTensor)
    ours = device_hint(mat_a) in ("tpu", "cpu") if fake else mat_a.device.type == "meta"
    if not ours or mat_a.dtype not in (torch.float16, torch.float32) or mat_b.dtype != mat_a.dtype:
        return meta_grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
    torch._check(
        mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
        lambda: f"_grouped_mm: operands must be 2-D or 3-D, got {mat_a.dim()}-D and {mat_b.dim()}-D",
    )
    torch._check(
        mat_a.size(-1) == mat_b.size(-2) or (mat_a.dim() == 2 and mat_b.dim() == 2),
        lambda: f"_grouped_mm: contraction sizes differ, {tuple(mat_a.shape)} and {tuple(mat_b.shape)}",
    )
    torch._check(
        offs is not None or (mat_a.dim() == 3 and mat_b.dim() == 3),
        lambda: "_grouped_mm: a 2-D operand needs offs",
    )
    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


def _replace_meta(op: torch._ops.OpOverload, fn) -> None:
    _LIB.impl(op.__name__.split(".")[0], fn)
    op.py_kernels.pop(torch._C.DispatchKey.Meta, None)
    op.py_impl(torch._C.DispatchKey.Meta)(fn)


_replace_meta(torch.ops.aten._grouped_mm.default, _grouped_mm)
