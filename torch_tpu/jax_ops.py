"""Kernels written in JAX, called on tpu tensors in every mode (torch_tpu.jax_op).

JAX is a lowering front end only: it turns the function into StableHLO for
the plugin in use; our runtime compiles and runs it with its own client (JAX
never opens the device). The function's module becomes functions of ours
(csrc/lowering/foreign.cpp), so Strict runs it as its own program, Fused fuses
it with the ops around it, and torch.compile makes it a node of the graph's
program. The op is one torch custom op per name, `ns::name(Tensor[] inputs,
str signature) -> Tensor[]`: `signature` names one lowering (which function,
its static arguments, the input types) by a hash of its StableHLO, so the
program caches' keys are exact across processes. Autograd runs `jax.vjp`
as two more lowerings of the same op: a forward that also returns the
residuals, and a backward from them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_tpu import _C

__all__ = ["jax_op", "JaxOp"]

# Custom-call targets a lowered function may hold, per platform: what the
# plugin itself implements. Anything else (LAPACK FFI targets of CPU jaxlib,
# host callbacks of jax.debug.print) is refused before it reaches the compiler.
ALLOWED_CUSTOM_CALLS = {
    "cpu": frozenset(),
    "cuda": frozenset({"__gpu$xla.gpu.triton"}),
    "tpu": frozenset({"tpu_custom_call"}),
}


def _jax():
    try:
        return importlib.import_module("jax")
    except ImportError as e:
        raise ImportError(
            "torch_tpu.jax_op needs JAX to lower its function: pip install 'torch_tpu[jax]' (or pip install jax)."
        ) from e


def _platform() -> str:
    name = _C.platform_name().lower()
    return "cuda" if name in ("cuda", "gpu", "rocm") else name


_TORCH_TO_JAX = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
_JAX_TO_TORCH = {v: k for k, v in _TORCH_TO_JAX.items()}


def _jax_dtype(dtype: torch.dtype, op: str):
    if dtype not in _TORCH_TO_JAX:
        raise TypeError(f"{op}: JAX has no dtype for {dtype}; pass one of {sorted(map(str, _TORCH_TO_JAX))}.")
    return _jax().numpy.dtype(_TORCH_TO_JAX[dtype])


def _torch_dtype(dtype, op: str) -> torch.dtype:
    name = str(dtype)
    if name not in _JAX_TO_TORCH:
        raise TypeError(f"{op}: the function returns a {name} array, which has no torch dtype.")
    return _JAX_TO_TORCH[name]


@dataclasses.dataclass
class _Lowering:
    """One signature of an op: the module's functions renamed by content, the
    one to call, the result types, and the jitted function (CPU tensors run it)."""

    entry: str
    functions: list[tuple[str, str]]
    results: list[tuple[torch.dtype, list[int]]]
    flat_fn: Callable


_LOWERINGS: dict[str, _Lowering] = {}  # by signature string
_LOCK = threading.Lock()


def _custom_call_targets(module) -> list[str]:
    targets = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "stablehlo.custom_call":
                        targets.append(str(inner.attributes["call_target_name"]).strip('"'))
                    visit(inner.operation)

    visit(module.operation)
    return targets


def _lower(op: str, flat_fn: Callable, avals: list) -> tuple[str, _Lowering]:
    """`flat_fn` (arrays in, a list of arrays out) lowered for this plugin's
    platform: its signature string and lowering."""
    jax = _jax()
    from jax._src.lib.mlir import ir

    platform = _platform()
    try:
        with jax.enable_x64(True):  # else int64 / float64 become 32-bit
            lowered = jax.jit(flat_fn, keep_unused=True).trace(*avals).lower(lowering_platforms=(platform,))
            out_avals = jax.eval_shape(flat_fn, *avals)
    except Exception as e:
        raise _lowering_error(op, avals, e) from e
    module = lowered.compiler_ir("stablehlo")
    for target in _custom_call_targets(module):
        if target not in ALLOWED_CUSTOM_CALLS.get(platform, frozenset()):
            hint = (
                " A Pallas kernel runs on the CPU plugin with pallas_call(..., interpret=True)."
                if target in ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu")
                else " Write it with jax.numpy / lax ops the plugin compiles itself."
            )
            raise RuntimeError(
                f"{op}: the JAX function lowers for platform '{platform}' to custom_call @{target}, which "
                f"this plugin cannot run (allowed here: {sorted(ALLOWED_CUSTOM_CALLS.get(platform, ())) or 'none'})."
                + hint
            )
    text = module.operation.get_asm(print_generic_op_form=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    functions, renames = [], {}
    with module.context:
        for f in module.body.operations:
            old = ir.StringAttr(f.attributes["sym_name"]).value
            renames[old] = f"jax_{digest}_{old}"
        for old, new in renames.items():
            ir.SymbolTable.replace_all_symbol_uses(old, new, module.operation)
        for f in module.body.operations:
            old = ir.StringAttr(f.attributes["sym_name"]).value
            f.attributes["sym_name"] = ir.StringAttr.get(renames[old])
            f.attributes["sym_visibility"] = ir.StringAttr.get("private")
            for attr in ("arg_attrs", "res_attrs"):  # JAX's result names and layouts: not ours
                if attr in f.attributes:
                    del f.attributes[attr]
            functions.append((renames[old], f.operation.get_asm(print_generic_op_form=True)))
    results = [(_torch_dtype(a.dtype, op), [int(s) for s in a.shape]) for a in jax.tree_util.tree_leaves(out_avals)]
    signature = f"{op}:{digest}"
    return signature, _Lowering(renames["main"], functions, results, jax.jit(flat_fn))


def _lowering_error(op: str, avals, e: Exception) -> RuntimeError:
    inputs = ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)
    return RuntimeError(
        f"{op}: JAX could not lower the function for platform '{_platform()}' and inputs ({inputs}): {e}"
    )


def _lowerer(statics: str, types) -> tuple:
    """What csrc/python/foreign.cpp calls on a cache miss: the lowering named by `statics`."""
    lowering = _LOWERINGS.get(statics)
    if lowering is None:
        raise RuntimeError(
            f"torch_tpu: no JAX lowering {statics} in this process: a jax_op's signature comes from calling it "
            "through its Python wrapper first (a graph saved by another process cannot name it)."
        )
    return lowering.entry, lowering.functions, lowering.results


def _fingerprint(value) -> str:
    """A static argument's part of the lowering key: hashable and stable."""
    try:
        hash(value)
    except TypeError as e:
        raise TypeError(f"a static argument must be hashable (a number, string, tuple), not {type(value)}") from e
    return repr(value)


class JaxOp:
    """A torch op whose body is `fn`, a JAX function: call it with tpu tensors
    (or CPU tensors, run by JAX on the CPU) in any pytree; static_argnums name
    positional arguments that are Python values (part of the lowering's key)."""

    def __init__(self, name: str, fn: Callable, static_argnums: tuple[int, ...] = ()):
        if "::" not in name:
            raise ValueError(f"jax_op: name '{name}' must be 'namespace::name'")
        self.name, self.fn, self.static_argnums = name, fn, tuple(static_argnums)
        self._signatures: dict[Any, tuple] = {}
        self._op = _define(name)
        _C._register_foreign_op(name, _lowerer)
        if (backend := sys.modules.get("torch_tpu._compile")) is not None:
            backend._lowered_ops.cache_clear()  # torch.compile's graphs lower it from now on
        functools.update_wrapper(self, fn)
        # torch.compile puts the call in its graph as it is (Dynamo cannot trace
        # JAX); AOTAutograd then traces it with fake tensors into the op.
        torch._dynamo.allow_in_graph(self)

    # ---- arguments: tensors become the op's inputs, everything else is static
    def _split(self, args, kwargs):
        jax = _jax()
        dynamic = [a for i, a in enumerate(args) if i not in self.static_argnums]
        static = tuple(_fingerprint(args[i]) for i in self.static_argnums if i < len(args))
        leaves, tree = jax.tree_util.tree_flatten((dynamic, kwargs))
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        constants = tuple(None if isinstance(x, torch.Tensor) else x for x in leaves)
        if not tensors:
            raise ValueError(f"{self.name}: needs at least one tensor argument (it decides the device)")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise RuntimeError(f"{self.name}: tensors on several devices: {sorted(map(str, devices))}")
        # The static values themselves, not `args`: a lowering keeps its layout, and must not keep the tensors.
        statics = {i: args[i] for i in self.static_argnums if i < len(args)}
        return tensors, (tree, constants, static, [_fingerprint(c) for c in constants], len(args), statics)

    def _call_fn(self, arrays, layout):
        """fn called with `arrays` where the tensors were."""
        jax = _jax()
        tree, constants, _, _, n_args, statics = layout
        it = iter(arrays)
        leaves = [next(it) if c is None else c for c in constants]
        dynamic, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
        dynamic = iter(dynamic)
        full = [statics[i] if i in statics else next(dynamic) for i in range(n_args)]
        return self.fn(*full, **kwargs)

    def _signature(self, kind: str, tensors, layout, extra=()):
        """The signature string of this call's lowering of `kind` (primal, fwd,
        bwd), lowered on first use; and its bookkeeping."""
        jax = _jax()
        shapes = tuple((t.dtype, tuple(int(s) for s in t.shape)) for t in tensors)
        key = (kind, repr(layout[0]), tuple(layout[3]), layout[2], shapes, extra)
        with _LOCK:
            hit = self._signatures.get(key)
        if hit is not None:
            return hit
        avals = [jax.ShapeDtypeStruct(s, _jax_dtype(d, self.name)) for d, s in shapes]
        if kind == "primal":

            def flat_fn(*arrays):
                return jax.tree_util.tree_leaves(self._call_fn(arrays, layout))

            try:
                with jax.enable_x64(True):
                    out_shape = jax.eval_shape(lambda *a: self._call_fn(a, layout), *avals)
            except Exception as e:
                raise _lowering_error(self.name, avals, e) from e
            out_tree = jax.tree_util.tree_structure(out_shape)
            info = {"out_tree": out_tree}
        elif kind == "fwd":
            diff = [i for i, t in enumerate(tensors) if t.dtype.is_floating_point or t.dtype.is_complex]
            if not diff:
                raise RuntimeError(f"{self.name}: no floating-point input to differentiate")

            def forward(*arrays):
                def of_diff(*d):
                    full = list(arrays)
                    for i, x in zip(diff, d, strict=True):
                        full[i] = x
                    return self._call_fn(full, layout)

                return jax.vjp(of_diff, *[arrays[i] for i in diff])

            try:
                with jax.enable_x64(True):
                    out_shape, vjp_shape = jax.eval_shape(forward, *avals)
            except Exception as e:
                raise _lowering_error(self.name, avals, e) from e
            out_tree = jax.tree_util.tree_structure(out_shape)
            res_leaves, res_tree = jax.tree_util.tree_flatten(vjp_shape)

            def flat_fn(*arrays):
                out, vjp = forward(*arrays)
                return jax.tree_util.tree_leaves(out) + jax.tree_util.tree_leaves(vjp)

            outs = jax.tree_util.tree_leaves(out_shape)
            info = {"out_tree": out_tree, "res_tree": res_tree, "n_res": len(res_leaves), "diff": diff, "outs": outs}
        else:  # bwd: extra = (the fwd signature's key); inputs: residuals, then the float outputs' gradients
            fwd = self._signatures[extra][1]
            n_res, res_tree, out_tree_f, outs = fwd["n_res"], fwd["res_tree"], fwd["out_tree"], fwd["outs"]

            def flat_fn(*arrays):
                vjp = jax.tree_util.tree_unflatten(res_tree, arrays[:n_res])
                grads = iter(arrays[n_res:])
                cotangents = [  # an integer output's cotangent is float0
                    next(grads) if _differentiable(o.dtype) else jax.numpy.zeros(o.shape, jax.dtypes.float0)
                    for o in outs
                ]
                return list(vjp(jax.tree_util.tree_unflatten(out_tree_f, cotangents)))

            info = {}
        signature, lowering = _lower(self.name, flat_fn, avals)
        with _LOCK:
            _LOWERINGS[signature] = lowering
            self._signatures[key] = (signature, info, key)
        return self._signatures[key]

    def __call__(self, *args, **kwargs):
        jax = _jax()
        tensors, layout = self._split(args, kwargs)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if not needs_grad:
            signature, info, _ = self._signature("primal", tensors, layout)
            outs = self._op(tensors, signature)
            return jax.tree_util.tree_unflatten(info["out_tree"], outs)
        outs = _JaxFunction.apply(self, layout, *tensors)
        _, info, _ = self._signature("fwd", tensors, layout)
        return jax.tree_util.tree_unflatten(info["out_tree"], list(outs))


class _JaxFunction(torch.autograd.Function):
    """Autograd of a JaxOp: the forward lowering returns the outputs and
    jax.vjp's residuals; the backward lowering takes the residuals and the
    outputs' gradients."""

    @staticmethod
    def forward(ctx, op: JaxOp, layout, *tensors):
        signature, info, key = op._signature("fwd", tensors, layout)
        flat = op._op(list(tensors), signature)
        n_out = len(flat) - info["n_res"]
        outs = flat[:n_out]
        ctx.op, ctx.layout, ctx.fwd_key, ctx.diff = op, layout, key, info["diff"]
        ctx.n_inputs = len(tensors)
        ctx.outs = [(o.shape, o.dtype, o.device) for o in outs]
        ctx.save_for_backward(*flat[n_out:])
        ctx.mark_non_differentiable(*[o for o in outs if not _differentiable(o.dtype)])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        cotangents = [
            (g if g is not None else torch.zeros(shape, dtype=dtype, device=device)).contiguous()
            for g, (shape, dtype, device) in zip(grads, ctx.outs, strict=True)
            if _differentiable(dtype)
        ]
        inputs = list(ctx.saved_tensors) + cotangents
        signature, _, _ = ctx.op._signature("bwd", inputs, ctx.layout, extra=ctx.fwd_key)
        grads_in = ctx.op._op(inputs, signature)
        out = [None] * ctx.n_inputs
        for i, g in zip(ctx.diff, grads_in, strict=True):
            out[i] = g
        return (None, None, *out)


def _differentiable(dtype) -> bool:
    """A float or complex dtype (torch's or JAX's): what gradients flow through."""
    if isinstance(dtype, torch.dtype):
        return dtype.is_floating_point or dtype.is_complex
    return _jax().numpy.issubdtype(dtype, _jax().numpy.inexact)


_LIBRARIES: dict[str, torch.library.Library] = {}


def _define(name: str):
    """The torch op `name(Tensor[] inputs, str signature) -> Tensor[]`, with a
    fake kernel (the lowering's result types) and a CPU kernel (JAX on the CPU)."""
    ns, opname = name.split("::", 1)
    if ns not in _LIBRARIES:
        _LIBRARIES[ns] = torch.library.Library(ns, "FRAGMENT")
    lib = _LIBRARIES[ns]
    try:
        lib.define(f"{opname}(Tensor[] inputs, str signature) -> Tensor[]")
    except RuntimeError as e:
        raise RuntimeError(f"jax_op: an op named {name} exists already; give this function another name") from e

    def fake(inputs, signature):
        lowering = _LOWERINGS[signature]
        device = inputs[0].device
        return [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in lowering.results]

    def cpu(inputs, signature):
        jax = _jax()
        lowering = _LOWERINGS[signature]
        with jax.enable_x64(True):
            outs = lowering.flat_fn(*[jax.numpy.asarray(_to_numpy(t)) for t in inputs])
        return [_from_numpy(o, dtype) for o, (dtype, _) in zip(outs, lowering.results, strict=True)]

    lib.impl(opname, cpu, "CPU")
    torch.library.register_fake(name, fake, lib=lib)
    return getattr(getattr(torch.ops, ns), opname).default


def _to_numpy(t: torch.Tensor):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype) -> torch.Tensor:
    import numpy as np

    a = np.asarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def jax_op(name: str, fn: Callable, static_argnums: tuple[int, ...] = ()) -> JaxOp:
    """`fn`, a JAX function, as the torch op `name` ("namespace::name"): call the
    result with tensors (pytrees of them) on tpu in any mode or under
    torch.compile, or on the CPU. Gradients come from jax.vjp (a jax.custom_vjp
    rule is used when fn has one)."""
    return JaxOp(name, fn, static_argnums)
