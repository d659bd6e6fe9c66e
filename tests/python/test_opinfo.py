"""Conformance against PyTorch's own OpInfo database (the judge is PyTorch's data).

For every OpInfo and each of float32, bfloat16, int64 and complex64 it
supports on CPU, its sample inputs are run on "tpu" with the CPU fallback
turned off and on CPU, and the outputs are compared with
torch.testing.assert_close's tolerances for the dtype. A sample that needs an
op with no lowering (or a dtype tpu refuses) is "uncovered" (not claimed); an
OpInfo with no covered sample is skipped with what it lacks. Covered samples
must match, or the OpInfo is an xfail with its reason in KNOWN_FAILURES.

`make test` runs the first SAMPLES[dtype] samples of each OpInfo;
TORCH_TPU_OPINFO_SAMPLES=all (`make opinfo`) runs every sample, the
measurement the README reports. The totals print at the end of the session,
per dtype, and go to build/opinfo_summary.json.
"""

import json
import os
import re

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_tpu

# The first samples of each OpInfo per dtype in `make test`: a few OpInfos have
# thousands (max_pool2d has ~3700) and each covered sample compiles a program.
# TORCH_TPU_OPINFO_SAMPLES (a number, or "all") and TORCH_TPU_OPINFO_DTYPES
# ("float32,int64") narrow or widen the run: the Fused pass of `make test`
# runs float32 only, `make opinfo` every sample.
SAMPLES = {torch.float32: 10, torch.bfloat16: 3, torch.int64: 3, torch.complex64: 1}
if os.environ.get("TORCH_TPU_OPINFO_SAMPLES"):
    _n = os.environ["TORCH_TPU_OPINFO_SAMPLES"]
    SAMPLES = {d: (1 << 30 if _n == "all" else int(_n)) for d in SAMPLES}
if os.environ.get("TORCH_TPU_OPINFO_DTYPES"):
    _keep = os.environ["TORCH_TPU_OPINFO_DTYPES"].split(",")
    SAMPLES = {d: n for d, n in SAMPLES.items() if str(d).removeprefix("torch.") in _keep}

# Outputs that are random or uninitialized: no value to compare.
NONDETERMINISTIC = re.compile(
    r"^(bernoulli|normal|uniform|multinomial|rand.*|empty.*|new_empty.*|nn\.functional\.(.*dropout.*|rrelu)"
    r"|randint.*|cauchy|exponential|geometric|log_normal|.*_like_random|torch\._refs\..*)$"
)

# (OpInfo name, dtype) -> why its covered samples do not all match yet.
TIES = (
    "indices of equal values: CPU's unstable sort returns them in an order of its own (tpu's sort is stable); "
    "the values match"
)
STATS_DTYPE = "mean / rstd / running stats come out float32 for bfloat16 input, as on CUDA (CPU returns bfloat16)"
KNOWN_FAILURES: dict[tuple[str, torch.dtype], str] = {
    **{
        ("tensor_split", d): "the sample's tensor_indices_or_sections must stay on CPU; the harness moves every "
        "tensor to tpu"
        for d in (torch.float32, torch.bfloat16, torch.int64, torch.complex64)
    },
    **{(name, torch.bfloat16): TIES for name in ("sort", "argsort", "topk")},
    **{(name, torch.int64): TIES for name in ("topk", "kthvalue")},
    **{
        (name, torch.bfloat16): STATS_DTYPE
        for name in ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update")
    },
    **{
        (f"nn.functional.linear_cross_entropy.{variant}", torch.bfloat16): "a few samples (2 of 161 for chunked) "
        "differ from CPU's and from the float32 reference by ~2%; not investigated yet"
        for variant in ("chunked_none", "chunked")
    },
}

# XLA's dot accumulates in another order than CPU's BLAS: float32 sums of
# products differ in the last bits, complex64 (float32 parts) too (PyTorch's own CUDA OpInfo runs override
# these tolerances too).
TOLERANCE = {
    name: {"atol": 5e-5, "rtol": 5e-5}
    for name in (
        "matmul",
        "__rmatmul__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "einsum",
        "inner",
        "tensordot",
        "nn.functional.scaled_dot_product_attention",
        "nn.functional.multi_head_attention_forward",
    )
}
# Convolutions sum over channels x window in yet another order.
TOLERANCE.update(
    {f"nn.functional.{name}": {"atol": 2e-4, "rtol": 1e-4} for name in ("conv1d", "conv2d", "conv3d")}
    | {f"nn.functional.conv_transpose{d}d": {"atol": 2e-4, "rtol": 1e-4} for d in (1, 2, 3)}
)
# XLA's FFT (DUCC) and CPU's (pocketfft) factor the transform differently.
TOLERANCE.update({o.name: {"atol": 1e-4, "rtol": 5e-5} for o in op_db if o.name.startswith("fft.")})

# complex64 powers go through exp(b * log(a)) in float32 parts: a few ulps apart.
COMPLEX_TOLERANCE = {name: {"atol": 1e-5, "rtol": 1e-5} for name in ("pow", "__rpow__", "float_power")}

# What the backend refuses by design, with a clear error: not a claimed op.
UNSUPPORTED = re.compile(r"dtype torch\.\w+ is not supported on tpu|Sparse\w*tpu|sparse tensors")
# Sparse layouts are out of scope (issue 14): such samples are counted apart.
SPARSE = re.compile(r"Sparse\w*tpu|sparse tensors")

COUNTS = (
    "passed",
    "passed_against_wider",
    "failed",
    "uncovered",
    "random",
    "sparse",
    "ops_covered",
    "ops_failed",
    "ops_uncovered",
)
SUMMARY: dict[torch.dtype, dict[str, int]] = {d: dict.fromkeys(COUNTS, 0) for d in SAMPLES}
MISSING_LOWERINGS: dict[torch.dtype, dict[str, int]] = {d: {} for d in SAMPLES}


def to_tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def is_cpu_device(x) -> bool:
    return (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu")


def compare(actual, expected, path="output", tolerance=None):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"{path}: result is on {actual.device}, not tpu"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        torch.testing.assert_close(
            actual.cpu(), expected, equal_nan=True, msg=lambda m: f"{path}: {m}", **(tolerance or {})
        )
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: {len(actual)} outputs != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, f"{path}[{i}]", tolerance)
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, nan_ok=True), f"{path}: {actual} != {expected}"
    else:
        assert actual == expected, f"{path}: {actual} != {expected}"


def missing_op(error: Exception):
    """The aten op a sample lacks, or the unsupported feature it needs; None for a real failure."""
    m = re.search(r"torch_tpu: (aten::\S+) has no tpu lowering", str(error))
    if m:
        return m.group(1)
    m = UNSUPPORTED.search(str(error))
    return f"unsupported: {m.group(0)}" if m else None


def random_draws() -> int:
    """Random keys the tpu generators have handed out (a wrapper_set_seed op restores the state itself)."""
    return torch_tpu.metrics().get("random_keys", 0)


def has_tensor(sample) -> bool:
    values = [sample.input, *sample.args, *sample.kwargs.values()]
    flat = [v for x in values for v in (x if isinstance(x, (list, tuple)) else [x])]
    return any(isinstance(v, torch.Tensor) for v in flat)


# A result that differs from CPU's is judged a second time, against the op
# computed in a wider dtype from the same inputs and rounded once: float32 for
# bfloat16 samples (what CUDA and tpu compute; several CPU bfloat16 kernels
# round partial results, e.g. sums in adaptive pooling), float64 for float32
# and int64 ones (CPU's float32 special functions, polygamma near its poles,
# are off by 1e-5 where tpu's match float64), complex128 for complex64 ones
# (CPU's complex64 matrix_exp is 1.5e-6 off where tpu's is 5e-8).
WIDER = {
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
    torch.int64: torch.float64,
    torch.complex64: torch.complex128,
}


def wider_reference(opinfo, sample, dtype, expected):
    """The sample on CPU in WIDER[dtype], outputs cast back to `expected`'s dtypes (None if it fails)."""
    if dtype not in WIDER or not (dtype.is_floating_point or dtype.is_complex or opinfo.promotes_int_to_float):
        return None  # integer math: no wider float reference
    wide_dtype = WIDER[dtype]

    def up(t):
        return t.clone().to(wide_dtype) if isinstance(t, torch.Tensor) and t.dtype == dtype else t

    def down(t, like):
        if isinstance(t, torch.Tensor) and isinstance(like, torch.Tensor):
            return t.to(like.dtype)
        if isinstance(t, (list, tuple)) and isinstance(like, (list, tuple)) and len(t) == len(like):
            return type(t)(down(x, y) for x, y in zip(t, like, strict=True))
        return t

    try:
        wide = sample.transform(up)
        return down(opinfo(wide.input, *wide.args, **wide.kwargs), expected)
    except Exception:
        return None


def run_samples(opinfo, dtype):
    """(passed, failures, uncovered ops) over the OpInfo's samples of `dtype`."""
    passed, failures, uncovered = 0, [], []
    tolerance = TOLERANCE.get(opinfo.name) if dtype in (torch.float32, torch.complex64) else None
    if dtype == torch.complex64:
        tolerance = COMPLEX_TOLERANCE.get(opinfo.name, tolerance)
    summary = SUMMARY[dtype]
    for i, sample in enumerate(opinfo.sample_inputs("cpu", dtype)):
        if i >= SAMPLES[dtype]:
            break
        if not has_tensor(sample) and "device" not in sample.kwargs:
            continue  # a factory call that makes a CPU tensor: nothing runs on tpu
        expected_sample = sample.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
        try:
            expected = opinfo(expected_sample.input, *expected_sample.args, **expected_sample.kwargs)
        except Exception:
            continue  # PyTorch itself rejects this sample on CPU: nothing to compare
        try:
            tpu_sample = sample.transform(to_tpu)  # a dtype tpu refuses fails here
            if "device" in tpu_sample.kwargs:  # factories: make the tensor on tpu
                tpu_sample.kwargs["device"] = "tpu"
            tpu_args = ["tpu" if is_cpu_device(a) else a for a in tpu_sample.args]  # x.to("cpu", ...) samples
            draws = random_draws()
            with torch_tpu.set_fallback("error"):
                actual = opinfo(tpu_sample.input, *tpu_args, **tpu_sample.kwargs)
            if random_draws() > draws:
                # It drew random numbers (dropout_p > 0): the device's stream is
                # not CPU's by design; test_random.py checks distributions.
                summary["random"] += 1
                continue
            # As PyTorch's test_compare_cpu: outputs that are unique only up to
            # sign or a basis (svd, eigh, qr of rank-deficient input) are
            # compared through the sample's own normalization.
            process = sample.output_process_fn_grad
            try:
                compare(process(actual), process(expected), tolerance=tolerance)
            except AssertionError:
                reference = wider_reference(opinfo, sample, dtype, expected)
                if reference is None:
                    raise
                compare(process(actual), process(reference), tolerance=tolerance)
                summary["passed_against_wider"] += 1
            passed += 1
        except Exception as e:  # an error CPU did not raise, or a mismatch
            if SPARSE.search(str(e)):
                summary["sparse"] += 1
                continue
            classify(e, i, failures, uncovered)
    return passed, failures, uncovered


def classify(error, i, failures, uncovered):
    """Sample i's error: an op without a rule (uncovered, not claimed) or a failure."""
    op = missing_op(error) if isinstance(error, (NotImplementedError, TypeError, RuntimeError)) else None
    if op is None:
        failures.append(f"sample {i}: {type(error).__name__}: {str(error)[:300]}")
    else:
        uncovered.append(op)


def tally(summary, missing, passed, failures, uncovered):
    """Adds one OpInfo's (or module's) samples to its dtype's totals."""
    summary["passed"] += passed
    summary["failed"] += len(failures)
    summary["uncovered"] += len(uncovered)
    for op in uncovered:
        missing[op] = missing.get(op, 0) + 1


def opinfo_id(opinfo):
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


CASES = [(d, o) for d in SAMPLES for o in op_db if d in o.supported_dtypes("cpu")]


@pytest.mark.parametrize(
    "dtype,opinfo", CASES, ids=[f"{str(d).removeprefix('torch.')}-{opinfo_id(o)}" for d, o in CASES]
)
def test_opinfo(dtype, opinfo):
    name = opinfo_id(opinfo)
    if NONDETERMINISTIC.match(opinfo.name):
        pytest.skip("random or uninitialized output: no value to compare")
    passed, failures, uncovered = run_samples(opinfo, dtype)
    summary = SUMMARY[dtype]
    tally(summary, MISSING_LOWERINGS[dtype], passed, failures, uncovered)
    if passed == 0 and not failures:
        summary["ops_uncovered"] += 1
        pytest.skip(f"not covered: needs {sorted(set(uncovered))[:3]}" if uncovered else f"no {dtype} samples")
    summary["ops_covered"] += 1
    if failures:
        summary["ops_failed"] += 1
        if (name, dtype) in KNOWN_FAILURES:
            pytest.xfail(KNOWN_FAILURES[(name, dtype)])
        pytest.fail(f"{len(failures)} of {passed + len(failures)} covered samples differ:\n" + "\n".join(failures[:5]))


def pytest_sessionfinish_summary():
    lines, report = [], {}
    for dtype, s in SUMMARY.items():
        covered, total = s["passed"] + s["failed"], s["passed"] + s["failed"] + s["uncovered"]
        if not total:
            continue
        name = str(dtype).removeprefix("torch.")
        lines.append(
            f"OpInfo {name}: {s['passed']} samples passed, {s['failed']} failed, {s['uncovered']} uncovered "
            f"({s['passed'] / total:.1%} of all, {s['passed'] / max(covered, 1):.1%} of covered), "
            f"{s['random']} random and {s['sparse']} sparse-layout (not compared), "
            f"{s['passed_against_wider']} passed against the wider-dtype "
            f"reference; OpInfos covered {s['ops_covered']} "
            f"(with failures {s['ops_failed']}), not covered {s['ops_uncovered']}"
        )
        top = sorted(MISSING_LOWERINGS[dtype].items(), key=lambda kv: -kv[1])[:40]
        report[name] = {**s, "pass_rate_of_all": s["passed"] / total, "top_missing_lowerings": top}
    os.makedirs("build", exist_ok=True)
    with open("build/opinfo_summary.json", "w") as f:
        json.dump({"samples_per_opinfo": {str(d): n for d, n in SAMPLES.items()}, **report}, f, indent=1)
    return "\n".join(lines)
