"""torch_tpu.explain(): a short report of what the run cost and what to change,
read from the runtime's metrics (csrc/runtime: compiles::<op>, what changed at
each family's last compile, fallback::<op> with its first call site, Fused
flush reasons, transfers) and torch.compile's recompile reasons."""

from __future__ import annotations

import torch_tpu

# What each Fused flush reason means for the user, and what to do about it.
_FLUSH_ADVICE = {
    "host_read": "a value is read on the host (.item(), .cpu(), print, a Python if on a tensor) inside the loop: "
    "keep it on the device, or read it once per step",
    "size_read": "Python reads .shape of a data-dependent result (nonzero, masked_select, x[mask]): "
    "use the result on the device, or nonzero_static",
    "fallback": "an op without a tpu lowering ran on the CPU (see the fallback section)",
    "window_limit": "a window reached TORCH_TPU_FUSED_WINDOW ops: call torch_tpu.mark_step() per step",
    "device": "ops alternate between devices: keep one step on one device",
}


def _compile_advice(change: str) -> str:
    """What to do about a family that compiles again, from the key part that changed ("i5 -> i6")."""
    before = change.split(": ", 1)[-1].split(" -> ")[0]
    if "[" in change:
        return (
            "a size changes between calls: torch_tpu.mark_dynamic(t, dim, max=...) on the input "
            "(TORCH_TPU_DYNAMIC=auto, the default, bounds a dim of copies to tpu only after 3 sizes)"
        )
    if before[:1] in ("i", "d") and before[1:2] in "-0123456789.":
        return "a Python number argument changes: pass it as a 0-d tensor, or keep it constant"
    return "the op's arguments change between calls"


def explain(min_compiles: int = 3, top: int = 8, device_trace: list | None = None) -> str:
    """The report as text: ops on the CPU fallback with where they were called,
    programs compiled at least `min_compiles` times and what changed, Fused
    flush reasons by count, host-device transfers, torch.compile recompiles;
    one suggestion per finding. With `device_trace` (the runtime's trace:
    `python -m torch_tpu explain` records one), the programs that took the most
    device time."""
    from torch_tpu import _C

    m = torch_tpu.metrics()
    lines = ["torch_tpu.explain()", ""]
    findings = 0

    fallbacks = sorted(
        ((k.split("::", 1)[1], v) for k, v in m.items() if k.startswith("fallback::")), key=lambda x: -x[1]
    )
    sites = _C._fallback_call_sites()
    lines.append(f"CPU fallback: {m.get('fallbacks', 0)} calls")
    for op, n in fallbacks[:top]:
        findings += 1
        lines.append(f"  {op}: {n} calls, first from {sites.get(op) or '(no Python frame)'}")
        lines.append(
            f"    -> no tpu lowering: add a rule in csrc/lowering/ (grep 'LOWERING(\"{op}'), or move it off the loop"
        )

    compiles = sorted(
        ((k.split("::", 1)[1], v) for k, v in m.items() if k.startswith("compiles::") and v >= min_compiles),
        key=lambda x: -x[1],
    )
    changes = _C._compile_changes()
    lines.append("")
    lines.append(f"Compiles: {m.get('compiles', 0)} programs, {m.get('compile_us', 0) / 1e6:.1f} s")
    for family, n in compiles[:top]:
        findings += 1
        change = changes.get(family, "")
        lines.append(f"  {family}: compiled {n} times" + (f"; last change {change}" if change else ""))
        if family == "fused":
            lines.append(
                "    -> Fused windows differ from each other: sizes that change (see the ops above), or no "
                "torch_tpu.mark_step() per step"
            )
        elif family == "graph":
            lines.append("    -> torch.compile graphs compile again: see the recompiles below")
        else:
            lines.append(f"    -> {_compile_advice(change)}")

    flushes = sorted(
        ((k[len("fused_flush_") :], v) for k, v in m.items() if k.startswith("fused_flush_")), key=lambda x: -x[1]
    )
    if flushes:
        lines.append("")
        lines.append(f"Fused flushes: {m.get('fused_flushes', 0)}, {m.get('fused_ops_per_flush_mean', 0):.1f} ops each")
        for reason, n in flushes[:top]:
            advice = _FLUSH_ADVICE.get(reason)
            lines.append(f"  {reason}: {n}")
            if advice and reason not in ("mark_step", "synchronize", "exit") and n > 1:
                findings += 1
                lines.append(f"    -> {advice}")

    lines.append("")
    to_dev, to_host = m.get("bytes_to_device", 0), m.get("bytes_to_host", 0)
    lines.append(
        f"Transfers: {m.get('transfers_to_device', 0)} to device ({to_dev / 2**20:.1f} MiB), "
        f"{m.get('transfers_to_host', 0)} to host ({to_host / 2**20:.1f} MiB)"
    )
    if m.get("transfers_to_host", 0) > 100:
        findings += 1
        lines.append("    -> many host reads: each waits for the device; read values once per step")

    reasons = m.get("recompile_reasons", [])
    if reasons:
        lines.append("")
        lines.append(f"torch.compile recompiles: {len(reasons)}")
        for r in reasons[:top]:
            findings += 1
            lines.append(f"  {r.get('function') or '?'}: {r.get('reason') or '?'}")
        lines.append("    -> a changing size: torch._dynamo.mark_dynamic(t, dim) or torch.compile(dynamic=True)")

    if device_trace:
        per_family: dict[str, list] = {}
        for name, _device, ns in device_trace:
            entry = per_family.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += ns
        total = sum(ns for _, ns in per_family.values()) or 1
        lines.append("")
        lines.append(f"Device time: {total / 1e6:.1f} ms in {len(device_trace)} program runs; the most:")
        for name, (n, ns) in sorted(per_family.items(), key=lambda x: -x[1][1])[:top]:
            lines.append(f"  {name}: {ns / 1e6:.1f} ms ({100 * ns / total:.0f}%) in {n} runs")

    lines.append("")
    lines.append(
        f"{findings} finding(s)."
        + ("" if device_trace else " Device time per program: python -m torch_tpu explain, or torch.profiler.")
    )
    return "\n".join(lines)
