"""Pooling (max with indices, average, adaptive average) through its lowering rules,
forward and backward via autograd, compared against CPU PyTorch.

Every test runs with the CPU fallback off, so an op without a rule fails here.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, compare_fn

import torch_tpu

nan, inf = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def no_fallback():
    with torch_tpu.set_fallback("error"):
        yield


def check_with_grad(fn, x, **tol):
    """fn's outputs on a tpu copy of x vs on x, then x.grad of sum(out * w) for a random w."""
    torch.manual_seed(0)
    cpu = x.detach().clone().requires_grad_(x.dtype.is_floating_point)
    dev = x.detach().to("tpu").requires_grad_(x.dtype.is_floating_point)
    want, got = fn(cpu), fn(dev)
    if isinstance(want, torch.Tensor):
        want, got = (want,), (got,)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w.detach(), equal_nan=True, **tol)
    if not x.dtype.is_floating_point:
        return
    weight = torch.randn(want[0].shape, dtype=x.dtype)
    (want[0] * weight).sum().backward()
    (got[0] * weight.to("tpu")).sum().backward()
    assert_same(dev.grad, cpu.grad, **tol)


MAX_POOL_2D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=3, ceil_mode=True),
    dict(kernel_size=3, dilation=2),
    dict(kernel_size=(3, 2), stride=1, padding=(1, 0), dilation=(2, 3)),
    dict(kernel_size=3, stride=1, padding=1),  # overlapping windows: gradients add up
]


@pytest.mark.parametrize("kw", MAX_POOL_2D)
def test_max_pool2d_with_indices(kw):
    x = torch.randn(2, 3, 9, 10)
    check_with_grad(lambda t: F.max_pool2d(t, return_indices=True, **kw), x)


def test_max_pool2d_unbatched_and_without_indices():
    x = torch.randn(3, 7, 8)
    check_with_grad(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), x)
    check_with_grad(lambda t: F.max_pool2d(t, 2), x)
    check_with_grad(lambda t: torch.nn.MaxPool2d(3, stride=2)(t.unsqueeze(0)), x)


def test_max_pool2d_ties_infinities_and_nan():
    x = torch.tensor(
        [
            [1.0, 1.0, 2.0, 2.0, -inf],
            [1.0, 1.0, 2.0, 2.0, -inf],
            [-inf, -inf, nan, 3.0, nan],
            [-inf, -inf, 3.0, nan, 0.0],
        ]
    ).reshape(1, 1, 4, 5)
    for kw in (dict(kernel_size=2), dict(kernel_size=2, stride=1), dict(kernel_size=3, stride=1, padding=1)):
        check_with_grad(lambda t, kw=kw: F.max_pool2d(t, return_indices=True, **kw), x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int32, torch.int64])
def test_max_pool2d_dtypes(dtype):
    x = (torch.randn(2, 2, 6, 7) * 10).to(dtype)
    check_with_grad(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), x)


@pytest.mark.parametrize(
    "kw",
    [
        dict(kernel_size=2),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
        dict(kernel_size=(1, 2, 3), dilation=(1, 2, 1)),
    ],
)
def test_max_pool3d_with_indices(kw):
    x = torch.randn(2, 2, 5, 6, 7)
    check_with_grad(lambda t: F.max_pool3d(t, return_indices=True, **kw), x)


AVG_POOL_2D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(3, 1), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=2, stride=3, ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1, divisor_override=5),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=2),
]


@pytest.mark.parametrize("kw", AVG_POOL_2D)
def test_avg_pool2d(kw):
    x = torch.randn(2, 3, 9, 10)
    check_with_grad(lambda t: F.avg_pool2d(t, **kw), x)


def test_avg_pool2d_unbatched_and_dtypes():
    check_with_grad(lambda t: F.avg_pool2d(t, 3, 2, 1), torch.randn(3, 7, 8))
    check_with_grad(lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True), torch.randn(2, 2, 7, 8, dtype=torch.float64))
    check_with_grad(lambda t: F.avg_pool2d(t, 2), torch.randn(2, 2, 6, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "kw",
    [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)],
)
def test_avg_pool3d(kw):
    check_with_grad(lambda t: F.avg_pool3d(t, **kw), torch.randn(2, 2, 5, 6, 7))


@pytest.mark.parametrize("shape,size", [((2, 3, 8, 12), (4, 3)), ((3, 6, 6), (2, 6)), ((1, 2, 4, 4), (4, 4))])
def test_adaptive_avg_pool2d_divisible(shape, size):
    check_with_grad(lambda t: F.adaptive_avg_pool2d(t, size), torch.randn(shape))


def test_adaptive_avg_pool3d_divisible():
    check_with_grad(lambda t: F.adaptive_avg_pool3d(t, (2, 3, 1)), torch.randn(2, 2, 4, 6, 5))


def test_adaptive_avg_pool2d_not_divisible_runs_on_cpu():
    x = torch.randn(1, 2, 7, 5)
    with torch_tpu.set_fallback("cpu"):
        check_with_grad(lambda t: F.adaptive_avg_pool2d(t, (3, 2)), x)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("batched", [True, False])
def test_fractional_max_pool(dims, batched):
    """Given random samples (also outside [0, 1): PyTorch truncates, not
    floors), the windows, maxima and indices equal CPU's; the backward adds
    the gradient back at those indices. A NaN in a window wins."""
    g = torch.Generator().manual_seed(dims)
    shape = (2, 3, 9, 7, 8)[: 2 + dims]
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x.view(-1)[5] = float("nan")
    samples = torch.rand(2, 3, dims, generator=g, dtype=torch.float64)
    samples[0, 0] = torch.tensor([-0.7, 1.9, 0.2][:dims])
    if not batched:
        x, samples = x[0], samples[:1]
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    kernel, out = ((2, 3), (4, 3)) if dims == 2 else ((2, 3, 2), (3, 2, 5))

    def fn(a):
        values, indices = pool(
            a, kernel, output_size=out, return_indices=True, _random_samples=samples.to(a.device, a.dtype)
        )
        return values.nan_to_num(100.0) + indices.to(a.dtype) * 1e-3

    for dtype in (torch.float32, torch.float64):
        compare_fn(fn, x.to(dtype))
