"""The structured trace: with TORCH_TRACE=<dir> (PyTorch's switch, read by
tlparse; TORCH_TPU_TRACE=<dir> sets it up too) every program torch_tpu compiles or loads from the disk cache is an
artifact in PyTorch's trace log: its family (the op, "fused" or "graph"), how
it was obtained and in how long, the eager mode, what a Fused window holds and
why it was flushed, the user's source lines that ran it, the program key and
the StableHLO."""

from __future__ import annotations

import atexit
import os
import traceback


def _user_frames() -> str:
    frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename and "/torch_tpu/" not in f.filename]
    return "\n".join(f"#   {f.filename}:{f.lineno} in {f.name}" for f in frames[-6:])


def _note(family: str, key: str, mlir: str, how: str, context: str, ms: float) -> None:
    from torch._logging import trace_structured

    from torch_tpu import _C

    name = "torch_tpu_" + "".join(c if c.isalnum() else "_" for c in family)[:80]
    text = (
        f"# torch_tpu program {family}: {how} in {ms:.1f} ms, {_C.get_eager_mode()} mode\n"
        + (f"# {context}\n" if context else "")
        + f"# run from:\n{_user_frames()}\n# key: {key}\n{mlir}"
    )
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "string"},
        payload_fn=lambda: text,
        expect_trace_id=False,
    )


def _trace_to(directory: str) -> None:
    """PyTorch's trace log into `directory`, as if TORCH_TRACE had been set before torch was imported."""
    from torch._logging import _internal

    os.environ["TORCH_TRACE"] = directory
    for handler in list(_internal.trace_log.handlers):
        if isinstance(handler, _internal.LazyTraceHandler):
            _internal.trace_log.removeHandler(handler)
    _internal.LOG_TRACE_HANDLER = None
    _internal._init_logs()


def install() -> None:
    """Writes program entries into PyTorch's structured trace when TORCH_TRACE
    (or TORCH_TPU_TRACE, torch_tpu's name for it) is set."""
    if os.environ.get("TORCH_TPU_TRACE") and not os.environ.get("TORCH_TRACE"):
        _trace_to(os.environ["TORCH_TPU_TRACE"])
    if os.environ.get("TORCH_TRACE"):
        from torch_tpu import _C

        _C._set_program_listener(_note)
        atexit.register(_C._set_program_listener, None)  # released while Python still runs
