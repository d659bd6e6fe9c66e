"""Decorators for kernels written in JAX or Pallas (TorchTPU's names):

    @torch_tpu.pallas.custom_jax_kernel
    def rms_norm(x, w): ...          # a jnp function, now a torch op

A Pallas kernel (pl.pallas_call inside the function) lowers to Mosaic on TPU
and to Triton on GPU; on the CPU plugin it needs pallas_call(..., interpret=True).
"""

from __future__ import annotations

from collections.abc import Callable

from torch_tpu.jax_ops import JaxOp, jax_op

__all__ = ["custom_jax_kernel", "custom_kernel"]


def custom_jax_kernel(fn: Callable | None = None, *, name: str | None = None, static_argnums=()) -> JaxOp:
    """`fn` as the torch op "torch_tpu_kernels::<name or fn's name>" (see torch_tpu.jax_op)."""

    def wrap(f):
        return jax_op(name if name and "::" in name else f"torch_tpu_kernels::{name or f.__name__}", f, static_argnums)

    return wrap(fn) if fn is not None else wrap


# A Pallas kernel is a JAX function that calls pl.pallas_call: the same op.
custom_kernel = custom_jax_kernel
