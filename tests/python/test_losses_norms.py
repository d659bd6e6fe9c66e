"""Losses, norms and batch norm on tpu against CPU PyTorch, forward and backward, with no fallback."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, compare_fn

import torch_tpu


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_nll_loss(reduction, weighted, ignore_index):
    torch.manual_seed(0)
    x = torch.randn(7, 5).log_softmax(1)
    t = torch.randint(0, 5, (7,))
    w = torch.rand(5) + 0.5 if weighted else None
    compare_fn(
        lambda x, t, *w: F.nll_loss(x, t, weight=w[0] if w else None, reduction=reduction, ignore_index=ignore_index),
        x,
        t,
        *([w] if weighted else []),
        grad_args=(0,),
    )


def test_nll_loss_unbatched_and_total_weight():
    torch.manual_seed(1)
    x = torch.randn(5)
    t = torch.tensor(3)
    w = torch.rand(5)
    for red in (0, 1, 2):
        with torch_tpu.set_fallback("error"):
            out_t, tw_t = torch.ops.aten.nll_loss_forward(x.to("tpu"), t.to("tpu"), w.to("tpu"), red, -100)
        out_c, tw_c = torch.ops.aten.nll_loss_forward(x, t, w, red, -100)
        assert_same(out_t, out_c)
        if red != 0:  # total_weight is not written for reduction none on CPU
            assert_same(tw_t, tw_c)


def test_nll_loss_all_ignored_mean_is_nan():
    x = torch.randn(3, 4)
    t = torch.full((3,), -100)
    with torch_tpu.set_fallback("error"):
        r = F.nll_loss(x.to("tpu"), t.to("tpu"))
    assert math.isnan(r.item()) and math.isnan(F.nll_loss(x, t).item())


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss2d(reduction):
    torch.manual_seed(2)
    x = torch.randn(2, 4, 3, 5)
    t = torch.randint(0, 4, (2, 3, 5))
    t[0, 0, 0] = 1
    w = torch.rand(4)
    compare_fn(lambda x, t, w: F.nll_loss(x, t, weight=w, reduction=reduction, ignore_index=1), x, t, w, grad_args=(0,))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy(label_smoothing):
    torch.manual_seed(3)
    x = torch.randn(6, 10)
    t = torch.randint(0, 10, (6,))
    t[0] = -100
    w = torch.rand(10) + 0.5
    tol = {"rtol": 1e-5, "atol": 1e-6}
    compare_fn(lambda x, t: F.cross_entropy(x, t, label_smoothing=label_smoothing), x, t, tol=tol)
    compare_fn(
        lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=label_smoothing), x, t, w, tol=tol, grad_args=(0,)
    )
    # probabilities as targets, and the 2d (image) case
    p = torch.randn(6, 10).softmax(1)
    compare_fn(lambda x, p: F.cross_entropy(x, p, label_smoothing=label_smoothing), x, p, tol=tol, grad_args=(0,))
    x4, t4 = torch.randn(2, 5, 3, 3), torch.randint(0, 5, (2, 3, 3))
    compare_fn(lambda x, t: F.cross_entropy(x, t, label_smoothing=label_smoothing, reduction="sum"), x4, t4, tol=tol)


@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3, 0.5])
@pytest.mark.parametrize("dim,keepdim", [(None, False), ((1,), True), ((0, 2), False), (-1, False)])
def test_vector_norm(ord, dim, keepdim):
    torch.manual_seed(4)
    x = torch.randn(3, 4, 5)
    x[0, 0, 0] = 0
    tol = {"rtol": 1e-4, "atol": 1e-5}
    if ord in (2, 1):  # differentiable everywhere here; p's backward uses pow_ (CPU)
        compare_fn(lambda x: torch.linalg.vector_norm(x, ord, dim, keepdim), x, tol=tol)
    else:
        with torch_tpu.set_fallback("error"):
            got = torch.linalg.vector_norm(x.to("tpu"), ord, dim, keepdim)
        assert_same(got, torch.linalg.vector_norm(x, ord, dim, keepdim), **tol)


def test_vector_norm_dtype_and_nan():
    x = torch.randn(4, 6)
    with torch_tpu.set_fallback("error"):
        assert_same(
            torch.linalg.vector_norm(x.to("tpu"), dtype=torch.float64), torch.linalg.vector_norm(x, dtype=torch.float64)
        )
        xb = x.to(torch.bfloat16)
        assert_same(torch.linalg.vector_norm(xb.to("tpu"), dim=1), torch.linalg.vector_norm(xb, dim=1))
        x[1, 2] = float("nan")
        for o in (math.inf, -math.inf, 2):
            assert_same(torch.linalg.vector_norm(x.to("tpu"), o, 1), torch.linalg.vector_norm(x, o, 1), equal_nan=True)
        assert_same(x.to("tpu").norm(p=3, dim=1), x.norm(p=3, dim=1), equal_nan=True)


def test_dot_and_eye():
    torch.manual_seed(5)
    a, b = torch.randn(7), torch.randn(7)
    compare_fn(torch.dot, a, b, tol={"rtol": 1e-5, "atol": 1e-5})
    ai, bi = torch.randint(-5, 5, (6,)), torch.randint(-5, 5, (6,))
    with torch_tpu.set_fallback("error"):
        assert_same(torch.dot(ai.to("tpu"), bi.to("tpu")), torch.dot(ai, bi))
        assert_same(torch.eye(3, device="tpu"), torch.eye(3))
        assert_same(torch.eye(3, 5, device="tpu", dtype=torch.int32), torch.eye(3, 5, dtype=torch.int32))
        assert_same(torch.eye(4, 2, device="tpu", dtype=torch.bool), torch.eye(4, 2, dtype=torch.bool))
        out = torch.empty(1, device="tpu")
        torch.eye(2, 3, out=out)
        assert_same(out, torch.eye(2, 3))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_mse_loss(reduction):
    torch.manual_seed(6)
    compare_fn(lambda a, b: F.mse_loss(a, b, reduction=reduction), torch.randn(4, 5), torch.randn(4, 5))


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (4, 3, 5, 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_training(shape, affine):
    # Without weight, autograd asks native_batch_norm_backward for the input's
    # grad only: a partial output_mask, also on the device.
    mode = "error"
    torch.manual_seed(7)
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
    m_c = cls(3, affine=affine, momentum=0.3)
    with torch.no_grad():
        m_c.running_mean.uniform_(-1, 1)
        m_c.running_var.uniform_(0.5, 2)
        if affine:
            m_c.weight.uniform_(0.5, 2)
            m_c.bias.uniform_(-1, 1)
    m_t = cls(3, affine=affine, momentum=0.3)
    m_t.load_state_dict(m_c.state_dict())
    m_t.to("tpu")
    x = torch.randn(*shape) * 2 + 1
    tol = {"rtol": 1e-4, "atol": 1e-5}
    with torch_tpu.set_fallback(mode):
        for _ in range(2):  # two steps: the running stats accumulate
            xc = x.clone().requires_grad_()
            xt = x.to("tpu").requires_grad_()
            yc, yt = m_c(xc), m_t(xt)
            assert_same(yt, yc, **tol)
            g = torch.randn(*shape)
            yc.backward(g)
            yt.backward(g.to("tpu"))
            assert_same(xt.grad, xc.grad, **tol)
            if affine:
                assert_same(m_t.weight.grad, m_c.weight.grad, **tol)
                assert_same(m_t.bias.grad, m_c.bias.grad, **tol)
            assert_same(m_t.running_mean, m_c.running_mean, **tol)
            assert_same(m_t.running_var, m_c.running_var, **tol)
        assert m_t.num_batches_tracked.item() == m_c.num_batches_tracked.item() == 2
        # Evaluation uses the running stats.
        m_c.eval()
        m_t.eval()
        xc = x.clone().requires_grad_()
        xt = x.to("tpu").requires_grad_()
        yc, yt = m_c(xc), m_t(xt)
        assert_same(yt, yc, **tol)
        yc.sum().backward()
        yt.sum().backward()
        assert_same(xt.grad, xc.grad, **tol)


def test_batch_norm_no_running_stats_and_functional_ops():
    torch.manual_seed(8)
    x = torch.randn(5, 4, 3)
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    rm, rv = torch.randn(4), torch.rand(4) + 0.5
    tol = {"rtol": 1e-4, "atol": 1e-5}
    compare_fn(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, tol=tol)
    with torch_tpu.set_fallback("error"):
        got = torch.ops.aten._native_batch_norm_legit_functional(
            x.to("tpu"), w.to("tpu"), b.to("tpu"), rm.to("tpu"), rv.to("tpu"), True, 0.1, 1e-5
        )
        want = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        for a, e in zip(got, want, strict=True):
            assert_same(a, e, **tol)
        got = torch.ops.aten._native_batch_norm_legit_no_training(
            x.to("tpu"), w.to("tpu"), b.to("tpu"), rm.to("tpu"), rv.to("tpu"), 0.1, 1e-5
        )
        want = torch.ops.aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)
        # Only the output: CPU returns empty saved statistics, the meta kernel
        # (and so tpu) [C]-shaped ones; evaluation's backward does not read them.
        assert_same(got[0], want[0], **tol)
        rm_t, rv_t = rm.to("tpu"), rv.to("tpu")
        xt, wt, bt = x.to("tpu"), w.to("tpu"), b.to("tpu")
        got = torch.ops.aten._native_batch_norm_legit(xt, wt, bt, rm_t, rv_t, True, 0.1, 1e-5)
        want = torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
        for a, e in zip(got, want, strict=True):
            assert_same(a, e, **tol)
        assert_same(rm_t, rm, **tol)
        assert_same(rv_t, rv, **tol)


def test_mlp_classifier_training_matches_cpu():
    torch.manual_seed(9)
    model_c = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model_t = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model_t.load_state_dict(model_c.state_dict())
    model_t.to("tpu")
    opt_c = torch.optim.SGD(model_c.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(model_t.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 8)
    y = torch.randint(0, 4, (32,))
    xt, yt = x.to("tpu"), y.to("tpu")
    losses_c, losses_t = [], []
    with torch_tpu.set_fallback("error"):
        for _ in range(5):
            for model, opt, xx, yy, losses in (
                (model_c, opt_c, x, y, losses_c),
                (model_t, opt_t, xt, yt, losses_t),
            ):
                opt.zero_grad()
                loss = F.cross_entropy(model(xx), yy)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses_t), torch.tensor(losses_c), rtol=1e-4, atol=1e-6)
    assert losses_c[-1] < losses_c[0]


DTYPE_TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
    torch.float64: {},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_smooth_l1_and_huber_loss(dtype, reduction):
    torch.manual_seed(10)
    a, b = torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    b[0, :2] = a[0, :2]  # d == 0
    tol = DTYPE_TOL[dtype]
    for beta in (1.0, 0.3):
        compare_fn(lambda a, b, beta=beta: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), a, b, tol=tol)
        compare_fn(lambda a, b, beta=beta: F.huber_loss(a, b, reduction=reduction, delta=beta), a, b, tol=tol)
    # beta = 0 (F.smooth_l1_loss turns it into l1_loss; the aten op itself too)
    compare_fn(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), a, b, tol=tol)
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    compare_fn(lambda a, b: torch.ops.aten.smooth_l1_loss(a, b, red, 0.0), a, b, tol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy(dtype, reduction):
    torch.manual_seed(11)
    x = torch.rand(4, 5, dtype=dtype) * 0.9 + 0.05
    y = torch.rand(4, 5, dtype=dtype)
    w = torch.rand(5, dtype=dtype) + 0.5
    tol = DTYPE_TOL[dtype]
    compare_fn(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x, y, tol=tol)
    compare_fn(
        lambda x, y, w: F.binary_cross_entropy(x, y, weight=w, reduction=reduction), x, y, w, tol=tol, grad_args=(0, 1)
    )
    # log clamps to -100 at 0 and 1 (CPU does the same)
    x[0, 0], x[1, 1], y[0, 0], y[1, 1] = 0, 1, 1, 0
    compare_fn(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x, y, tol=tol, grad_args=())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bce_with_logits_soft_margin_logsigmoid(dtype):
    torch.manual_seed(12)
    x, y = torch.randn(4, 5, dtype=dtype) * 3, torch.rand(4, 5, dtype=dtype)
    pw = torch.rand(5, dtype=dtype) + 0.5
    tol = DTYPE_TOL[dtype]
    compare_fn(F.binary_cross_entropy_with_logits, x, y, tol=tol)
    compare_fn(
        lambda x, y, pw: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw), x, y, pw, tol=tol, grad_args=(0, 1)
    )
    compare_fn(lambda x, y: F.soft_margin_loss(x, y * 2 - 1), x, y, tol=tol, grad_args=(0,))
    compare_fn(F.logsigmoid, x, tol=tol)


def test_nll_loss_target_out_of_bounds_raises():
    x = torch.randn(3, 4).log_softmax(1)
    for bad in (4, -1, 7):
        t = torch.tensor([0, bad, 2])
        with pytest.raises(IndexError, match="Target .*out of bounds"):
            F.nll_loss(x, t)  # CPU: "Target 4 is out of bounds."
        with torch_tpu.set_fallback("error"), pytest.raises(IndexError, match="Target .*out of bounds"):
            F.nll_loss(x.to("tpu"), t.to("tpu")).item()
    # ignore_index may lie outside [0, C)
    t = torch.tensor([0, -100, 2])
    with torch_tpu.set_fallback("error"):
        assert_same(F.nll_loss(x.to("tpu"), t.to("tpu")), F.nll_loss(x, t))
    # the 2d op and the backward ops check too
    x2 = torch.randn(1, 3, 2, 2)
    t2 = torch.tensor([[[0, 1], [3, 2]]])
    with torch_tpu.set_fallback("error"), torch_tpu.set_eager_mode("debug"):
        with pytest.raises(IndexError, match="Target .*out of bounds"):
            F.nll_loss(x2.to("tpu"), t2.to("tpu"))
        with pytest.raises(IndexError, match="Target .*out of bounds"):
            torch.ops.aten.nll_loss_backward(
                torch.tensor(1.0, device="tpu"),
                x.to("tpu"),
                torch.tensor([0, 5, 1], device="tpu"),
                None,
                1,
                -100,
                torch.tensor(3.0, device="tpu"),
            )
    # the process stays usable
    with torch_tpu.set_fallback("error"):
        assert_same(
            F.nll_loss(x.to("tpu"), torch.tensor([0, 1, 2], device="tpu")), F.nll_loss(x, torch.tensor([0, 1, 2]))
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,normalized", [((6, 8), (8,)), ((2, 3, 4, 5), (4, 5)), ((7,), (7,))])
def test_layer_norm_forward_backward(dtype, affine, shape, normalized):
    torch.manual_seed(13)
    x = torch.randn(*shape, dtype=dtype) * 2 + 0.5
    w, b = torch.rand(*normalized, dtype=dtype) + 0.5, torch.randn(*normalized, dtype=dtype)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else DTYPE_TOL[dtype]
    if affine:
        compare_fn(lambda x, w, b: F.layer_norm(x, normalized, w, b), x, w, b, tol=tol)
        compare_fn(lambda x, w: F.layer_norm(x, normalized, w), x, w, tol=tol)
        # grads of the parameters only (the first layer: the input needs none)
        compare_fn(lambda x, w, b: F.layer_norm(x, normalized, w, b), x, w, b, tol=tol, grad_args=(1, 2))
        compare_fn(lambda x, w, b: F.layer_norm(x, normalized, w, b), x, w, b, tol=tol, grad_args=(0, 2))
    else:
        compare_fn(lambda x: F.layer_norm(x, normalized), x, tol=tol)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (True, True, False)])
def test_batch_norm_backward_partial_mask(mask):
    torch.manual_seed(14)
    g, x = torch.randn(5, 3, 4), torch.randn(5, 3, 4)
    w, mean, invstd = torch.rand(3) + 0.5, x.mean((0, 2)), x.var((0, 2), unbiased=False).add(1e-5).rsqrt()
    args = (None, None, mean, invstd, True, 1e-5, list(mask))
    with torch_tpu.set_fallback("error"):
        got = torch.ops.aten.native_batch_norm_backward(
            g.to("tpu"), x.to("tpu"), w.to("tpu"), *[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
        )
    want = torch.ops.aten.native_batch_norm_backward(g, x, w, *args)
    for a, e, m in zip(got, want, mask, strict=True):
        if m:
            assert_same(a, e, rtol=1e-4, atol=1e-5)
        else:
            assert a is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,groups", [((3, 6, 5), 2), ((2, 4, 3, 3), 4), ((2, 6), 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_forward_backward(dtype, shape, groups, affine):
    torch.manual_seed(15)
    x = torch.randn(*shape, dtype=dtype) * 2 + 1
    c = shape[1]
    w, b = torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else DTYPE_TOL[dtype]
    if affine:
        compare_fn(lambda x, w, b: F.group_norm(x, groups, w, b), x, w, b, tol=tol)
        compare_fn(lambda x, w, b: F.group_norm(x, groups, w, b), x, w, b, tol=tol, grad_args=(1, 2))
    else:
        compare_fn(lambda x: F.group_norm(x, groups), x, tol=tol)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_with_update(affine):
    """The op torch.export and compile emit for training batch norm: outputs,
    the running stats it writes, and batch_norm_backward from what it saved."""
    g = torch.Generator().manual_seed(0)
    x, grad, w, b = torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, 5, generator=g), torch.randn(3), torch.randn(3)
    results = []
    for device in ("cpu", "tpu"):
        mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
        weight, bias = (w.to(device), b.to(device)) if affine else (None, None)
        with torch_tpu.set_fallback("error"):
            out, save_mean, save_invstd, reserve = torch.ops.aten._batch_norm_with_update(
                x.to(device), weight, bias, mean, var, 0.1, 1e-5
            )
            grads = []
            if affine:  # CPU's batch_norm_backward requires the weight
                grads = torch.ops.aten.batch_norm_backward(
                    grad.to(device), x.to(device), weight, mean, var, save_mean, save_invstd, True, 1e-5,
                    [True, True, True], reserve,
                )  # fmt: skip
        results.append([t.cpu() for t in (out, save_mean, save_invstd, mean, var, reserve, *grads)])
    for actual, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_margin_losses():
    """multi_margin_loss (p 1 then 2 at one shape: p is part of the program,
    not a runtime Scalar) and multilabel_margin_loss (targets up to the first
    -1), forward and backward."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(6, 5, generator=g), torch.rand(5, generator=g)
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    tol = dict(rtol=1e-5, atol=1e-6)
    for p in (1, 2):
        compare_fn(lambda a, p=p: F.multi_margin_loss(a, y.to(a.device), p=p), x, tol=tol)
        weighted = lambda a, w, p=p: F.multi_margin_loss(a, y.to(a.device), p=p, margin=0.5, weight=w)  # noqa: E731
        compare_fn(weighted, x, weight, tol=tol, grad_args=(0,))
        compare_fn(lambda a, p=p: F.multi_margin_loss(a, y.to(a.device), p=p, reduction="none"), x, tol=tol)
    compare_fn(lambda a: F.multi_margin_loss(a, y[0].to(a.device)), x[0], tol=tol)  # one sample, 1-D
    labels = [
        [3, 0, -1, 1, 1],
        [0, 1, 2, 3, 4],
        [-1, 2, 2, 2, 2],
        [4, -1, 0, 0, 0],
        [1, 1, 1, -1, 2],
        [2, 0, -1, -1, -1],
    ]
    labels = torch.tensor(labels)
    for reduction in ("mean", "sum", "none"):
        compare_fn(lambda a, r=reduction: F.multilabel_margin_loss(a, labels.to(a.device), reduction=r), x, tol=tol)
    compare_fn(lambda a: F.multilabel_margin_loss(a, labels[0].to(a.device)), x[0], tol=tol)
    with torch_tpu.set_fallback("error"), pytest.raises(RuntimeError, match="target out of range"):
        F.multi_margin_loss(x.to("tpu"), torch.tensor([0, 5, 1, 1, 1, 1], device="tpu")).cpu()


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_ctc_loss(zero_infinity, reduction):
    """CTC forward and backward against CPU: padded and concatenated targets,
    samples shorter than the batch's time, a repeated label (no skip), and an
    impossible alignment (infinite loss, or 0 with zero_infinity)."""
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(12, 4, 6, generator=g).log_softmax(2)
    targets = torch.tensor([[1, 2, 2, 3], [3, 1, 0, 0], [4, 4, 4, 4], [5, 5, 5, 5]])
    input_lengths, target_lengths = [12, 9, 10, 3], [4, 2, 4, 4]  # the last cannot align in 3 steps
    concatenated = torch.cat([targets[i, :n] for i, n in enumerate(target_lengths)])
    for t in (targets, concatenated):
        fn = lambda lp, t=t: F.ctc_loss(  # noqa: E731
            lp, t.to(lp.device), input_lengths, target_lengths, reduction=reduction, zero_infinity=zero_infinity
        )
        if zero_infinity:
            compare_fn(fn, log_probs, tol=dict(rtol=1e-5, atol=1e-5))
        else:  # an infinite loss has no finite gradient to compare: the forward only
            with torch_tpu.set_fallback("error"):
                torch.testing.assert_close(fn(log_probs.to("tpu")).cpu(), fn(log_probs), rtol=1e-5, atol=1e-5)
    finite = lambda lp: F.ctc_loss(lp, targets[:3].to(lp.device), input_lengths[:3], target_lengths[:3])  # noqa: E731
    compare_fn(finite, log_probs[:, :3].contiguous(), tol=dict(rtol=1e-5, atol=1e-5))
