"""unique and unique_consecutive on the device (one sync for the size) against CPU."""

import pytest
import torch
from conftest import assert_same

import torch_tpu

NAN = float("nan")

INPUTS = {
    "ints": torch.tensor([[3, 1, 2], [1, 3, 3], [0, -5, 2]]),
    "floats": torch.tensor([2.5, -1.0, 2.5, 0.0, -0.0, 7.0, -1.0]),
    "nan": torch.tensor([2.0, NAN, 1.0, NAN, 2.0, 1.0]),
    "bool": torch.tensor([True, False, True, True]),
    "all_equal": torch.full((5, 2), 4, dtype=torch.int32),
    "one": torch.tensor([9.0]),
    "scalar": torch.tensor(3),
    "empty": torch.zeros(0, 3),
    "bf16": torch.tensor([1.5, 0.5, 1.5, 2.0], dtype=torch.bfloat16),
    "uint8": torch.tensor([200, 3, 200, 7], dtype=torch.uint8),
    "runs": torch.tensor([1, 1, 2, 2, 2, 1, 3, 3, 1]),
    "random": torch.randint(0, 20, (4, 50), generator=torch.Generator().manual_seed(0)),
}


def check(tpu_out, cpu_out):
    tpu_out = tpu_out if isinstance(tpu_out, tuple) else (tpu_out,)
    cpu_out = cpu_out if isinstance(cpu_out, tuple) else (cpu_out,)
    assert len(tpu_out) == len(cpu_out)
    for a, b in zip(tpu_out, cpu_out, strict=True):
        assert_same(a, b, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("return_inverse", [False, True])
@pytest.mark.parametrize("return_counts", [False, True])
def test_unique(name, return_inverse, return_counts):
    x = INPUTS[name]
    torch_tpu.reset_metrics()
    with torch_tpu.set_fallback("error"):
        out = torch.unique(x.to("tpu"), return_inverse=return_inverse, return_counts=return_counts)
    check(out, torch.unique(x, return_inverse=return_inverse, return_counts=return_counts))
    assert not any(k.startswith("fallback::") for k in torch_tpu.metrics())


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("return_inverse", [False, True])
@pytest.mark.parametrize("return_counts", [False, True])
def test_unique_consecutive(name, return_inverse, return_counts):
    x = INPUTS[name]
    with torch_tpu.set_fallback("error"):
        out = torch.unique_consecutive(x.to("tpu"), return_inverse=return_inverse, return_counts=return_counts)
    check(out, torch.unique_consecutive(x, return_inverse=return_inverse, return_counts=return_counts))


def test_unique_unsorted_is_sorted_like_cpu():
    x = INPUTS["random"]
    with torch_tpu.set_fallback("error"):
        out = torch.unique(x.to("tpu"), sorted=False, return_counts=True)
    check(out, torch.unique(x, sorted=True, return_counts=True))


def test_unique_one_sync():
    """One host read for the size: the count of the groups, nothing else."""
    x = INPUTS["random"].to("tpu")
    torch.tpu.synchronize()
    torch_tpu.reset_metrics()
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    assert torch_tpu.metrics().get("transfers_to_host", 0) == 1
    assert values.device.type == inverse.device.type == counts.device.type == "tpu"


def test_unique_inverse_reconstructs_input():
    x = INPUTS["nan"].to("tpu")
    values, inverse = torch.unique(x, return_inverse=True)
    assert_same(values[inverse], INPUTS["nan"], equal_nan=True)


@pytest.mark.parametrize("dim", [0, 1])
def test_unique_dim_matches_cpu(dim):
    """unique(dim=...) and unique_consecutive(dim=...) run on the CPU fallback (rows compared whole)."""
    x = torch.tensor([[1, 2, 1], [1, 2, 1], [0, 5, 0]])
    check(
        torch.unique(x.to("tpu"), dim=dim, return_inverse=True, return_counts=True),
        torch.unique(x, dim=dim, return_inverse=True, return_counts=True),
    )
    check(
        torch.unique_consecutive(x.to("tpu"), dim=dim, return_counts=True),
        torch.unique_consecutive(x, dim=dim, return_counts=True),
    )
