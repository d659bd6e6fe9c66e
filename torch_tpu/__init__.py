"""torch_tpu: a native PyTorch backend for TPUs built on OpenXLA.

`import torch` loads it (autoload entry point); then `device="tpu"` works.
Every op is lowered to StableHLO, compiled by XLA and run through a PJRT
plugin chosen by PJRT_DEVICE (CPU by default, CUDA, TPU).
"""


def _autoload() -> None:
    """Entry point of the `torch.backends` group: importing this package is the work.

    Defined before `import torch`: importing torch_tpu first makes torch's
    autoload look this up on the partially initialized package.
    """


import atexit  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from torch_tpu import _C  # noqa: E402

_C._set_search_paths([p for p in sys.path if p])
_C._register_kernels()

from torch_tpu import _trace  # noqa: E402

_trace.install()  # TORCH_TRACE: programs in PyTorch's structured trace (tlparse)

if torch._C._get_privateuse1_backend_name() != "tpu":
    torch.utils.rename_privateuse1_backend("tpu")

from torch_tpu import tpu as _tpu_module  # noqa: E402

torch._register_device_module("tpu", _tpu_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
# bfloat16 is the TPU's native low precision (PyTorch's default for a
# PrivateUse1 backend is float16). The setting is per thread, like autocast
# state: this sets it for the importing thread.
torch.set_autocast_dtype("tpu", torch.bfloat16)

# _meta: float _grouped_mm shapes (see the module); _printing: tpu tensor printing;
# distributed: the "tpu" c10d backend (init_process_group("cpu:gloo,tpu:tpu")).
from torch_tpu import _meta, _printing, distributed  # noqa: E402, F401

# Zero-copy interop with numpy, JAX and other DLPack libraries (torch_tpu/dlpack.py).
from torch_tpu.dlpack import cpu_view, from_dlpack, from_jax, to_dlpack, to_jax  # noqa: E402, F401

__all__ = [
    "mark_dynamic",
    "mark_step",
    "metrics",
    "reset_metrics",
    "set_eager_mode",
    "get_eager_mode",
    "set_fallback",
    "get_fallback",
    "registered_lowerings",
    "jax_op",
    "explain",
    "to_dlpack",
    "from_dlpack",
    "to_jax",
    "from_jax",
    "cpu_view",
]


def metrics() -> dict:
    """Counters of the runtime: compiles, cache_hits, executions, transfers, and
    (once torch.compile(backend="tpu") has run) its graphs: graph_compile_ms (per
    graph, keyed "<Dynamo compile id> <forward|backward|inference>"), graph cache
    hits (graph_cache_hits_memory, graph_cache_hits_disk) and misses, recompiles
    and recompile_reasons (the guard that failed, per recompile).

    Fused mode adds fused_flushes, fused_flush_<reason> per kind of flush,
    fused_ops (recorded), fused_ops_max and fused_ops_per_flush_mean,
    fused_window_compiles and fused_window_hits (windows compiled or found in
    the cache) and fused_recompiles (a compile for an op sequence already
    compiled with another wiring: a steady loop has none).
    """
    m = dict(_C.metrics())
    compile_module = sys.modules.get("torch_tpu._compile")  # loaded by the first torch.compile
    if compile_module is not None:
        m.update(compile_module._metrics())
    if m.get("fused_flushes"):
        m["fused_ops_per_flush_mean"] = m["fused_ops"] / m["fused_flushes"]
    return m


def mark_dynamic(tensor: torch.Tensor, dim: int, max: int | None = None) -> torch.Tensor:
    """Declares that `dim` of the tpu tensor `tensor` varies in size, up to `max`.

    The tensor is padded to a bucket (the smallest power of two that holds its
    size, at most `max`; TORCH_TPU_DYNAMIC_BUCKETS="64,128,512" chooses the
    buckets), and the ops that read it and the tensors they make compile one
    program per bucket instead of one per size. Results, printing and copies to
    the host see the real elements only. Returns `tensor`. A size above `max`
    raises; TORCH_TPU_DYNAMIC=off makes this a check only.
    """
    _C._mark_dynamic(tensor, dim, max)
    return tensor


def mark_step() -> None:
    """Runs what Fused mode has recorded so far as one program (a no-op in other modes).

    Fused mode also flushes by itself at host reads, synchronize, after every
    optimizer step on tpu, at a window limit (TORCH_TPU_FUSED_WINDOW ops) and at exit.
    """
    if _C._initialized():
        _C._flush("mark_step")


def _flush_after_optimizer_step(optimizer, args, kwargs) -> None:
    # A training step ends here: flushing aligns fused windows with steps, so
    # a steady loop runs the same windows (and compiles nothing) every step.
    # Inside a graph Dynamo traces there is no window, and a call into _C
    # would break the graph (the update would compile as pieces).
    if torch.compiler.is_compiling() or not _C._initialized() or _C.get_eager_mode() != "fused":
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.device.type == "tpu":
                _C._flush("optimizer_step")
                return


_optimizer_hook = None


def _hook_optimizer_steps() -> None:
    """Registered once Fused mode is first chosen (torch.optim is not imported before)."""
    global _optimizer_hook
    if _optimizer_hook is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _optimizer_hook = register_optimizer_step_post_hook(_flush_after_optimizer_step)


if os.environ.get("TORCH_TPU_EAGER_MODE") == "fused":
    _hook_optimizer_steps()


@atexit.register
def _flush_at_exit() -> None:
    if _C._initialized() and _C.get_eager_mode() == "fused":
        try:
            _C._flush("exit")
        except Exception as e:  # the process is ending: report, do not raise
            print(f"torch_tpu: the last fused window failed at exit: {e}", file=sys.stderr)


def reset_metrics() -> None:
    _C.reset_metrics()
    compile_module = sys.modules.get("torch_tpu._compile")
    if compile_module is not None:
        compile_module._reset_metrics()


def get_eager_mode() -> str:
    return _C.get_eager_mode()


class _EagerModeContext(contextlib.AbstractContextManager):
    def __init__(self, previous: str, previous_check_nan: bool):
        self._previous = previous
        self._previous_check_nan = previous_check_nan

    def __exit__(self, *exc):
        _C.set_eager_mode(self._previous)
        _C.set_check_nan(self._previous_check_nan)
        return False


def set_eager_mode(mode: str, check_nan: bool | None = None) -> _EagerModeContext:
    """Selects the eager mode: "strict" (one program per op, async; the default),
    "debug" (every op awaited, errors raised at the op with its name, shapes and
    dtypes) or "fused" (ops recorded and run as one program at the next host
    read, synchronize, optimizer step or mark_step). Switching flushes first.

    check_nan=True makes debug mode also raise when an op produces NaN or Inf
    (default: TORCH_TPU_DEBUG_CHECK_NAN=1). Also a context manager:
    `with torch_tpu.set_eager_mode("debug"): ...` restores the previous mode.
    """
    previous, previous_check_nan = _C.get_eager_mode(), _C.get_check_nan()
    _C.set_eager_mode(mode)
    if mode == "fused":
        _hook_optimizer_steps()
    if check_nan is not None:
        _C.set_check_nan(check_nan)
    return _EagerModeContext(previous, previous_check_nan)


class _FallbackContext(contextlib.AbstractContextManager):
    def __init__(self, previous: str):
        self._previous = previous

    def __exit__(self, *exc):
        _C.set_fallback(self._previous)
        return False


def set_fallback(mode: str) -> _FallbackContext:
    """What an op without a lowering does: "cpu" (run on CPU, warn once) or "error" (raise).

    Also a context manager that restores the previous setting. The default comes
    from TORCH_TPU_FALLBACK (cpu unless set to error).
    """
    previous = _C.get_fallback()
    _C.set_fallback(mode)
    return _FallbackContext(previous)


def get_fallback() -> str:
    return _C.get_fallback()


def registered_lowerings() -> list:
    """The aten ops (overload names) with a lowering rule."""
    return list(_C.registered_lowerings())


def cache_info() -> dict:
    """The persistent compilation cache: its directory, entries, bytes and size limit.

    Set by TORCH_TPU_CACHE_DIR (default ~/.cache/torch_tpu; "off" disables it) and
    TORCH_TPU_CACHE_LIMIT (bytes, default 4 GiB; least recently used entries go first).
    Hits, misses and writes are in metrics() as disk_cache_*.
    """
    return dict(_C.cache_info())


def cache_entries() -> list:
    """Per entry of the persistent cache: file, what it holds (the op or kind of
    program, "index of ..." for a program's index), bytes, compile_ms, hits
    (loads by any process) and age_s (since last use)."""
    return list(_C.cache_entries())


@contextlib.contextmanager
def cache_only(enabled: bool = True):
    """Within the block, a program that is in neither the in-memory nor the
    persistent compilation cache raises (naming the program) instead of
    compiling: a production warm start proves it compiles nothing.
    TORCH_TPU_CACHE_ONLY=1 sets it for the whole process."""
    before = _C._cache_only()
    _C._set_cache_only(enabled)
    try:
        yield
    finally:
        _C._set_cache_only(before)


def cache_clear() -> int:
    """Removes every entry of the persistent compilation cache; returns how many."""
    return _C.cache_clear()


def explain(min_compiles: int = 3, device_trace: list | None = None) -> str:
    """A short report of the run so far, for a person: ops on the CPU fallback and
    where they were called, programs compiled `min_compiles` times or more and
    what changed, Fused flush reasons, transfers, torch.compile recompiles; a
    suggestion per finding (torch_tpu/_explain.py). `python -m torch_tpu explain
    script.py` prints it after running a script, with the programs that took
    the most device time."""
    from torch_tpu._explain import explain as report

    return report(min_compiles, device_trace=device_trace)


def jax_op(name: str, fn, static_argnums=()):
    """`fn`, a JAX function, as the torch op `name` ("namespace::name"), run on tpu
    tensors in every eager mode and under torch.compile (torch_tpu/jax_ops.py).
    JAX is imported on first use: pip install 'torch_tpu[jax]'."""
    from torch_tpu.jax_ops import jax_op as make

    return make(name, fn, static_argnums)


def __getattr__(name: str):
    if name == "pallas":  # imported on first use: it needs nothing until a kernel is defined
        import importlib

        return importlib.import_module("torch_tpu.pallas")
    raise AttributeError(f"module 'torch_tpu' has no attribute '{name}'")
