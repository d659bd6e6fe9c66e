"""The registration census: every aten op PyTorch expects a backend to implement is
lowered, out of scope for a stated reason, or on the reviewed gap list
(census_gaps.txt). A new gap fails this test, and so does a listed op that has
since been lowered, so the list stays the truth.

"Expected" is what a backend must provide itself: the ops PyTorch 2.13 gives a
CPU kernel and no CompositeImplicitAutograd one (a composite op decomposes into
others on any device). "Lowered" means tpu has a kernel for it: a rule in
csrc/lowering (through the general kernel) or an explicit one.
"""

import re
from pathlib import Path

import pytest
import torch

import torch_tpu  # noqa: F401  (registers the tpu kernels)

# Gaps by design: (pattern, reason).
SCOPE = [
    (r"sparse|_csr|_coo|to_dense|_nested|nested_|jagged", "sparse layouts and nested tensors: out of scope"),
    (
        r"quantize|fake_quant|::q_|_per_channel|_per_tensor|fbgemm|int4pack|int8pack|_dyn_quant|_int_mm|"
        r"choose_qparams|fused_moving_avg_obs|_make_per_",
        "quantized tensors and CPU weight packing: tpu has no quantized dtypes",
    ),
    (
        r"mkldnn|onednn|_for_cpu|slow_conv|thnn_conv|_nnpack|_slow_conv2d",
        "CPU's own kernels below an op tpu lowers whole (convolution, attention)",
    ),
    (r"::_foobar|::_test_|_functorch_fallback", "PyTorch's own test ops"),
    (r"from_file|_make_dep_token|is_set_to", "host-side or identity ops with nothing to lower"),
]

GAP_FILE = Path(__file__).with_name("census_gaps.txt")


def census():
    """(expected, lowered, gaps): sorted aten op overload names."""
    c = torch._C
    expected, lowered = [], []
    for name in sorted(n for n in c._dispatch_get_all_op_names() if n.startswith("aten::")):
        if c._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            continue
        if not c._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            continue
        expected.append(name)
        if c._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            lowered.append(name)
    gaps = sorted(set(expected) - set(lowered))
    return expected, lowered, gaps


def listed_gaps():
    """{op: the section of census_gaps.txt it is listed under}."""
    listed, section = {}, None
    for line in GAP_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        assert section, f"{GAP_FILE.name}: {line} is listed before any [reason]"
        listed[line] = section
    return listed


COUNTS = {}


@pytest.mark.skipif(not torch.__version__.startswith("2.13"), reason="the census and its gap list are PyTorch 2.13's")
def test_every_expected_op_is_lowered_out_of_scope_or_a_listed_gap():
    expected, lowered, gaps = census()
    out_of_scope = [g for g in gaps if any(re.search(p, g) for p, _ in SCOPE)]
    unexplained = [g for g in gaps if g not in out_of_scope]
    listed = listed_gaps()
    new = sorted(set(unexplained) - set(listed))
    stale = sorted(set(listed) - set(unexplained))
    COUNTS.update(expected=len(expected), lowered=len(lowered), out_of_scope=len(out_of_scope), gaps=len(unexplained))
    assert not new, f"ops PyTorch expects with no tpu kernel, not in {GAP_FILE.name} (lower or list them): {new}"
    assert not stale, f"listed in {GAP_FILE.name} but no longer gaps (lowered, or gone from PyTorch): remove {stale}"


def summary_lines():
    if not COUNTS:
        return []
    c = COUNTS
    return [
        f"Census: {c['expected']} aten ops with a CPU kernel and no composite one; {c['lowered']} lowered on tpu, "
        f"{c['out_of_scope']} out of scope, {c['gaps']} gaps listed ({c['gaps'] / c['expected']:.1%})"
    ]
