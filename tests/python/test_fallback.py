"""Ops without a lowering run on CPU, keep aliasing and in-place semantics, and are counted."""

import warnings

import torch
from conftest import assert_same

import torch_tpu


def airy_fallbacks() -> int:
    # special_airy_ai (no rule yet) is composite over its out= overload, which is what falls back.
    return sum(v for k, v in torch_tpu.metrics().items() if k.startswith("fallback::aten::special_airy_ai"))


def test_fallback_matches_cpu_and_is_counted():
    x = torch.rand(4, 5) + 0.1
    before = airy_fallbacks()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = torch.special.airy_ai(x.to("tpu"))
    assert_same(out, torch.special.airy_ai(x))
    assert airy_fallbacks() == before + 1


def test_fallback_warns_once_per_op():
    x = torch.rand(3).to("tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.special.airy_ai(x)
        torch.special.airy_ai(x)
    messages = [str(w.message) for w in caught if "aten::special_airy_ai" in str(w.message)]
    assert len(messages) <= 1  # 0 when an earlier test already warned in this process


def test_fallback_inplace_on_a_view_is_seen_by_aliases():
    base_cpu = torch.rand(4, 6)
    base = base_cpu.to("tpu")
    view, view_cpu = base[1:3, ::2], base_cpu[1:3, ::2]
    view.lgamma_()
    view_cpu.lgamma_()
    assert_same(base, base_cpu)


def test_fallback_data_dependent_and_out_ops():
    x_cpu = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    x = x_cpu.to("tpu")
    assert_same(torch.nonzero(x), torch.nonzero(x_cpu))
    assert_same(x[x > 0.5], x_cpu[x_cpu > 0.5])
    out = torch.empty(0, device="tpu")
    torch.erfinv(x / 4, out=out)
    assert_same(out, torch.erfinv(x_cpu / 4))


def test_nonzero_and_masked_select_run_on_device_with_one_sync():
    cases = [
        torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]]),
        torch.tensor([0, 0, 0]),
        torch.arange(24).view(2, 3, 4) % 3,
        torch.tensor([True, False, True]),
        torch.tensor(5.0),
    ]
    with torch_tpu.set_fallback("error"):
        for c in cases:
            before = torch_tpu.metrics().get("transfers_to_host", 0)
            assert_same(torch.nonzero(c.to("tpu")), torch.nonzero(c))
            assert torch_tpu.metrics()["transfers_to_host"] - before <= 2  # the count, and the result read
        x = torch.randn(3, 4)
        m = x > 0.2
        assert_same(torch.masked_select(x.to("tpu"), m.to("tpu")), torch.masked_select(x, m))
        row = torch.tensor([True, False, False, True])  # broadcast mask
        assert_same(torch.masked_select(x.to("tpu"), row.to("tpu")), torch.masked_select(x, row))
        assert_same(
            torch.masked_select(x.to("tpu"), torch.zeros(3, 4, dtype=torch.bool, device="tpu")),
            torch.masked_select(x, torch.zeros(3, 4, dtype=torch.bool)),
        )
        assert_same(torch.argwhere(x.to("tpu") > 0), torch.argwhere(x > 0))
