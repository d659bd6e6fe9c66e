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
    """One host read for the size: the count of the groups, nothing else (in
    Fused mode the count stays on the device until the size is read)."""
    x = INPUTS["random"].to("tpu")
    torch.tpu.synchronize()
    torch_tpu.reset_metrics()
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    deferred = torch_tpu.get_eager_mode() == "fused"
    assert torch_tpu.metrics().get("transfers_to_host", 0) == (0 if deferred else 1)
    assert values.device.type == inverse.device.type == counts.device.type == "tpu"
    assert values.shape == counts.shape == torch.unique(INPUTS["random"]).shape
    assert torch_tpu.metrics().get("transfers_to_host", 0) == 1


def test_unique_inverse_reconstructs_input():
    x = INPUTS["nan"].to("tpu")
    values, inverse = torch.unique(x, return_inverse=True)
    assert_same(values[inverse], INPUTS["nan"], equal_nan=True)


DIM_INPUTS = {
    "ints": torch.tensor([[1, 2, 1], [1, 2, 1], [0, 5, 0], [1, 2, 1], [0, 5, 1]]),
    "floats": torch.tensor([[1.0, 0.0], [0.0, 2.0], [-0.0, 2.0], [1.0, -1.5], [0.0, 2.0]]),
    "nan_row": torch.tensor([[1.0, NAN], [0.0, 2.0], [0.0, 2.0]]),
    "bool": torch.tensor([[True, False], [True, False], [False, False], [False, True]]),
    "three_d": torch.randint(0, 3, (3, 4, 2), generator=torch.Generator().manual_seed(1)),
    "one_row": torch.tensor([[4, 5, 6]]),
}


@pytest.mark.parametrize("name", list(DIM_INPUTS))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_dim(name, dim):
    x = DIM_INPUTS[name]
    with torch_tpu.set_fallback("error"):
        out = torch.unique(x.to("tpu"), dim=dim, return_inverse=True, return_counts=True)
        values = torch.unique(x.to("tpu"), dim=dim)
    check(out, torch.unique(x, dim=dim, return_inverse=True, return_counts=True))
    check(values, torch.unique(x, dim=dim))


@pytest.mark.parametrize("name", list(DIM_INPUTS))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_consecutive_dim(name, dim):
    x = DIM_INPUTS[name]
    with torch_tpu.set_fallback("error"):
        out = torch.unique_consecutive(x.to("tpu"), dim=dim, return_inverse=True, return_counts=True)
    check(out, torch.unique_consecutive(x, dim=dim, return_inverse=True, return_counts=True))


def test_unique_dim_long_rows_and_empty_run_on_cpu_fallback():
    """Rows longer than 64 elements and empty inputs go to the CPU fallback, with its results and errors."""
    long_rows = torch.randint(0, 2, (6, 65), generator=torch.Generator().manual_seed(2))
    long_rows[3] = long_rows[1]
    torch_tpu.reset_metrics()
    check(
        torch.unique(long_rows.to("tpu"), dim=0, return_counts=True),
        torch.unique(long_rows, dim=0, return_counts=True),
    )
    assert torch_tpu.metrics().get("fallback::aten::unique_dim") == 1
    check(torch.unique(torch.zeros(0, 3).to("tpu"), dim=0), torch.unique(torch.zeros(0, 3), dim=0))
    with pytest.raises(RuntimeError, match="0 sized dimensions"):
        torch.unique(torch.zeros(3, 0).to("tpu"), dim=0)
