"""Conformance against PyTorch's ModuleInfo database (torch.testing's module_db).

Every module's sample constructions and inputs, in float32 and bfloat16 (a
float32 ModuleInfo cast with .to(torch.bfloat16): module_db lists bfloat16 for
almost none), run forward and backward on "tpu" with the CPU fallback off and
on CPU, from the same initial parameters: outputs, input gradients and
parameter gradients are compared. As in test_opinfo.py, a sample that needs
an op without a rule is "uncovered" (not claimed), one that draws random
numbers (dropout) is counted apart, and a bfloat16 result that differs from
CPU's is judged again against the float32 computation from the same
bfloat16 values, rounded once.

`make test` runs the first SAMPLES[dtype] inputs of each module;
TORCH_TPU_MODULEINFO_SAMPLES=all (`make opinfo`) runs every one.
"""

import copy
import os

import pytest
import torch
from test_opinfo import classify, compare, random_draws, tally
from torch.testing._internal.common_modules import module_db

import torch_tpu

SAMPLES = {torch.float32: 2, torch.bfloat16: 1}
if os.environ.get("TORCH_TPU_MODULEINFO_SAMPLES"):
    _n = os.environ["TORCH_TPU_MODULEINFO_SAMPLES"]
    SAMPLES = {d: (1 << 30 if _n == "all" else int(_n)) for d in SAMPLES}

# Convolutions and matmuls sum in another order than CPU's kernels.
TOLERANCE = {torch.float32: {"atol": 2e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}

# Module name -> why its covered samples do not all match yet.
# The bfloat16 ones past make test's first sample (TORCH_TPU_MODULEINFO_SAMPLES=all, at b9263f1): a few
# elements per failing sample past the 2e-2 tolerance against both CPU's bfloat16 and the float32 judge, in
# stacks of ops each rounded to bfloat16 (gates, attention, chunked loss); not investigated further yet.
_BF16_NOISE = "bfloat16: a few elements past 2e-2 against CPU and the float32 judge (per-op rounding through {}); "
KNOWN_FAILURES: dict[tuple[str, torch.dtype], str] = {
    ("nn.TransformerEncoder", torch.bfloat16): "in this harness the output is 0.04 off the float32 reference "
    "(CPU's bfloat16: 0.009); run alone, tpu's and CPU's bfloat16 outputs are equal (0.015 off): not understood yet",
    ("nn.GRU", torch.bfloat16): _BF16_NOISE.format("the gates") + "22 of 857 samples",
    ("nn.GRUCell", torch.bfloat16): _BF16_NOISE.format("the gates") + "1 of 39 samples",
    ("nn.Transformer", torch.bfloat16): _BF16_NOISE.format("six layers") + "23 of 67 samples",
    ("nn.TransformerDecoderLayer", torch.bfloat16): _BF16_NOISE.format("attention") + "9 of 64 samples",
    ("nn.TransformerEncoderLayer", torch.bfloat16): _BF16_NOISE.format("attention") + "1 of 2 samples",
    ("nn.LinearCrossEntropyLoss", torch.bfloat16): _BF16_NOISE.format("the chunked loss") + "4 of 16 samples",
}

COUNTS = ("passed", "passed_against_float32", "failed", "uncovered", "random", "modules_covered", "modules_failed")
SUMMARY: dict[torch.dtype, dict[str, int]] = {d: dict.fromkeys(COUNTS, 0) for d in SAMPLES}
MISSING_LOWERINGS: dict[torch.dtype, dict[str, int]] = {d: {} for d in SAMPLES}


def leaves(x):
    """The tensors of a (nested) output, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in leaves(v)]
    return []


def prepared(value, dtype, device, compute=None):
    """A forward argument for one run: floating tensors cast to `dtype` (then to
    `compute`, for the wider judge), fresh leaves that require grad."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.is_floating_point():
            t = t.to(dtype).to(compute or dtype)
        t = t.to(device)
        if t.is_floating_point():
            t.requires_grad_(True)
        return t
    if isinstance(value, (list, tuple)):
        return type(value)(prepared(v, dtype, device, compute) for v in value)
    if isinstance(value, dict):
        return {k: prepared(v, dtype, device, compute) for k, v in value.items()}
    return value


def run(module, sample, dtype, device, compute=None):
    """(outputs, gradients of the inputs and parameters) of one forward and
    backward; with `compute`, the `dtype` values computed in that wider dtype."""
    args = prepared(sample.forward_input.args, dtype, device, compute)
    kwargs = prepared(sample.forward_input.kwargs, dtype, device, compute)
    out = module(*args, **kwargs)
    outs = [o for o in leaves(out) if o.requires_grad]
    if outs:
        # Fixed, non-uniform output gradients (the same on both devices).
        g = torch.Generator().manual_seed(0)
        grads = [torch.randn(o.shape, generator=g) for o in outs]
        grads = [(r.to(dtype) if compute else r).to(o.dtype).to(device) for r, o in zip(grads, outs, strict=True)]
        torch.autograd.backward(outs, grads)
    inputs = [t for t in leaves((args, kwargs)) if t.requires_grad]
    return out, [t.grad for t in inputs], [p.grad for p in module.parameters()]


def construct(module_info, sample, dtype):
    torch.manual_seed(0)
    module = module_info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    return module.to(dtype).train()


def run_samples(module_info, dtype):
    """(passed, failures, uncovered ops) over the module's samples of `dtype`."""
    passed, failures, uncovered = 0, [], []
    summary = SUMMARY[dtype]
    samples = module_info.module_inputs_func(
        module_info, device="cpu", dtype=torch.float32, requires_grad=True, training=True
    )
    for i, sample in enumerate(samples[: SAMPLES[dtype]]):
        if sample.forward_input is None:
            continue
        try:
            cpu_module = construct(module_info, sample, dtype)
            expected = run(cpu_module, sample, dtype, "cpu")
        except Exception:
            continue  # PyTorch itself rejects this sample on CPU (a bfloat16 kernel CPU lacks)
        try:
            tpu_module = copy.deepcopy(construct(module_info, sample, dtype)).to("tpu")
            draws = random_draws()
            with torch_tpu.set_fallback("error"):
                actual = run(tpu_module, sample, dtype, "tpu")
            if random_draws() > draws:
                summary["random"] += 1
                continue
            try:
                compare(actual, expected, tolerance=TOLERANCE[dtype])
            except AssertionError:
                if dtype != torch.bfloat16:
                    raise
                # CPU's bfloat16 kernels round partial results: judge against float32
                # from the same bfloat16 parameters, inputs and output gradients, rounded once.
                wide = run(construct(module_info, sample, dtype).float(), sample, dtype, "cpu", compute=torch.float32)
                rounded = [t.to(dtype) if isinstance(t, torch.Tensor) else t for t in leaves(wide)]
                flat = leaves(actual)
                assert len(flat) == len(rounded), "a different number of outputs and gradients"
                compare(flat, rounded, tolerance=TOLERANCE[dtype])
                summary["passed_against_float32"] += 1
            passed += 1
        except Exception as e:
            classify(e, i, failures, uncovered)
    return passed, failures, uncovered


CASES = [(d, m) for d in SAMPLES for m in module_db if torch.float32 in m.dtypes]


@pytest.mark.parametrize(
    "dtype,module_info", CASES, ids=[f"{str(d).removeprefix('torch.')}-{m.name}" for d, m in CASES]
)
def test_module(dtype, module_info):
    passed, failures, uncovered = run_samples(module_info, dtype)
    summary = SUMMARY[dtype]
    tally(summary, MISSING_LOWERINGS[dtype], passed, failures, uncovered)
    if passed == 0 and not failures:
        pytest.skip(f"not covered: needs {sorted(set(uncovered))[:3]}" if uncovered else "no sample ran on CPU")
    summary["modules_covered"] += 1
    if failures:
        summary["modules_failed"] += 1
        if (module_info.name, dtype) in KNOWN_FAILURES:
            pytest.xfail(KNOWN_FAILURES[(module_info.name, dtype)])
        pytest.fail(f"{len(failures)} of {passed + len(failures)} covered samples differ:\n" + "\n".join(failures[:5]))


def summary_lines():
    lines = []
    for dtype, s in SUMMARY.items():
        total = s["passed"] + s["failed"] + s["uncovered"]
        if not total:
            continue
        top = sorted(MISSING_LOWERINGS[dtype].items(), key=lambda kv: -kv[1])[:8]
        lines.append(
            f"ModuleInfo {str(dtype).removeprefix('torch.')}: {s['passed']} samples passed "
            f"({s['passed_against_float32']} against float32), {s['failed']} failed, {s['uncovered']} uncovered "
            f"({s['passed'] / total:.1%} of all), {s['random']} random (not compared); modules covered "
            f"{s['modules_covered']} (with failures {s['modules_failed']}); most missing: {top}"
        )
    return lines
