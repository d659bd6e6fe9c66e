"""Printing a tpu tensor formats a CPU copy of its values.

PyTorch does the same for xla/lazy devices: the formatter runs a dozen small
ops (masked_select, abs, min, max, ceil...) that would each compile a program.
The suffixes (device, dtype, grad_fn) still come from the tpu tensor itself.
A real tensor printed while a fake mode traces (torch.compile's logs print a
graph's tensor constants) is formatted outside that mode: under it, the
formatter's masked_select would have no data.
"""

import sys

import torch
import torch._tensor_str as _tensor_str

_original_str = _tensor_str._str


def _str(self, *, tensor_contents=None):
    if (
        tensor_contents is None
        and self.device.type == "tpu"
        and self.layout == torch.strided
        and self.numel() > 0
        and not self.is_meta
        and not _is_fake(self)
    ):
        with torch._subclasses.fake_tensor.unset_fake_temporarily(), torch.no_grad():
            cpu = self.detach().cpu()
            if cpu.dtype in (torch.float16, torch.bfloat16):
                cpu = cpu.float()
            tensor_contents = _tensor_str._tensor_str(cpu, len("tensor("))
    return _original_str(self, tensor_contents=tensor_contents)


def _is_fake(t) -> bool:
    """A FakeTensor (torch.compile's tracing, its logs) has no values to copy; PyTorch prints it as "..."."""
    fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")  # only loaded once tracing has started
    return fake_tensor is not None and isinstance(t, fake_tensor.FakeTensor)


_tensor_str._str = _str
