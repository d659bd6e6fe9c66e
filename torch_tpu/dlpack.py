"""Zero-copy interop: tpu tensors to and from DLPack, JAX and numpy.

On the CPU plugin a tpu tensor's buffer is host memory: `to_dlpack(t)` lets
numpy, JAX or torch read it in place (read-only: the consumer sees the value
at export; later writes to `t` make a new buffer), and `from_dlpack(x)` runs
on x's memory (never written, never donated; the producer may be deleted
first). Other plugins' memory is not host memory: there these copy through
the host, and metrics count it (interop_copies, against
interop_zero_copy_exports / interop_zero_copy_imports). PyTorch's
`Tensor.__dlpack__` has no hook for a PrivateUse1 device (it raised for tpu
tensors): ours answers for tpu tensors, so np.from_dlpack(t) and
jax.dlpack.from_dlpack(t) work. PyTorch ignores DLPack's read-only flag:
torch.from_dlpack(t) gives a CPU tensor over t's buffer that must not be written.
"""

from __future__ import annotations

import torch

from torch_tpu import _C

__all__ = ["to_dlpack", "from_dlpack", "cpu_view", "to_jax", "from_jax"]


def _zero_copy() -> bool:
    return _C.platform_name() == "cpu"


def _copied(n: int = 1) -> None:
    _C._count_metric("interop_copies", n)


class _Export:
    """A DLPack producer over a tpu tensor's value (what to_dlpack returns)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: the CPU plugin's memory

    def __dlpack__(self, stream=None, *, max_version=None, dl_device=None, copy=None):
        if copy:
            return self._tensor.cpu().__dlpack__(max_version=max_version)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return _C._export_dlpack(self._tensor, versioned)


def to_dlpack(tensor: torch.Tensor):
    """`tensor` as a DLPack producer (an object with __dlpack__): in place on the
    CPU plugin, a host copy elsewhere."""
    if tensor.device.type != "tpu":
        raise TypeError(f"torch_tpu.to_dlpack: needs a tpu tensor, got one on {tensor.device}")
    if not _zero_copy():
        _copied()
        return tensor.cpu()
    return _Export(tensor)


def from_dlpack(producer, device: torch.device | str | int | None = None) -> torch.Tensor:
    """A tpu tensor over `producer`'s memory (an object with __dlpack__, such as
    a numpy or JAX array or a CPU tensor), without a copy where the memory is
    host memory, dense and aligned and the plugin is the CPU one; else a copy."""
    index = torch.device("tpu", torch.tpu.current_device()) if device is None else torch.device(device)
    if isinstance(index, torch.device) and index.type != "tpu":
        raise ValueError(f"torch_tpu.from_dlpack: device must be a tpu device, not {index}")
    idx = index.index if index.index is not None else torch.tpu.current_device()
    if not hasattr(producer, "__dlpack__"):
        raise TypeError(f"torch_tpu.from_dlpack: {type(producer).__name__} is not a DLPack producer (no __dlpack__)")
    if _zero_copy() and producer.__dlpack_device__()[0] == 1:
        try:
            capsule = producer.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer before DLPack 1.0
            capsule = producer.__dlpack__()
        tensor = _C._import_dlpack(capsule, idx)
        if tensor is not None:
            return tensor
    _copied()
    return torch.from_dlpack(producer).to(torch.device("tpu", idx))


def cpu_view(tensor: torch.Tensor):
    """A read-only numpy array of `tensor`'s value: in place on the CPU plugin
    (writing to it raises), a read-only host copy elsewhere."""
    import numpy as np

    if tensor.dtype == torch.bfloat16:
        raise TypeError("torch_tpu.cpu_view: numpy has no bfloat16; use to_jax or tensor.cpu()")
    array = np.from_dlpack(to_dlpack(tensor))
    array.flags.writeable = False
    return array


def to_jax(tensor: torch.Tensor):
    """`tensor` as a JAX array: in place on the CPU plugin, a copy elsewhere."""
    from torch_tpu.jax_ops import _jax

    jax = _jax()
    with jax.enable_x64(True):  # else JAX narrows int64 / float64 (by a copy)
        return jax.dlpack.from_dlpack(to_dlpack(tensor))


def from_jax(array, device: torch.device | str | int | None = None) -> torch.Tensor:
    """A JAX array as a tpu tensor: in place on the CPU plugin (the array may be
    deleted first), a copy elsewhere."""
    return from_dlpack(array, device)


_TORCH_DLPACK = torch.Tensor.__dlpack__
_TORCH_DLPACK_DEVICE = torch.Tensor.__dlpack_device__


def _tensor_dlpack(self, *args, **kwargs):
    if self.device.type == "tpu":
        return to_dlpack(self).__dlpack__(*args, **kwargs)
    return _TORCH_DLPACK(self, *args, **kwargs)


def _tensor_dlpack_device(self):
    return (1, 0) if self.device.type == "tpu" else _TORCH_DLPACK_DEVICE(self)


torch.Tensor.__dlpack__ = _tensor_dlpack
torch.Tensor.__dlpack_device__ = _tensor_dlpack_device
