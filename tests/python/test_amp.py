"""Mixed precision: torch.autocast("tpu") follows CUDA's op lists, and a model
trained under autocast matches a CPU run under torch.autocast("cpu")."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

LOW = "low"  # the autocast dtype
F32 = torch.float32


_inputs = torch.Generator().manual_seed(0)  # fixed inputs: a failure reproduces


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, generator=_inputs)


# (name, fn, CPU inputs, expected output dtype under autocast: LOW, float32 or a
# dtype). The expectations are CUDA's lists (aten/src/ATen/autocast_mode.h):
# lower_precision_fp, fp32, fp32_set_opt_dtype, promote; ops on no list keep
# their own type promotion.
CASES = [
    # lower_precision_fp: float32 inputs run in the low dtype
    ("mm", torch.mm, (r(4, 5), r(5, 3)), LOW),
    ("matmul", torch.matmul, (r(2, 4, 5), r(5, 3)), LOW),
    ("bmm", torch.bmm, (r(2, 4, 5), r(2, 5, 3)), LOW),
    ("baddbmm", torch.baddbmm, (r(2, 4, 3), r(2, 4, 5), r(2, 5, 3)), LOW),
    ("addmm", torch.addmm, (r(4, 3), r(4, 5), r(5, 3)), LOW),
    ("addmm_bf16_bias", torch.addmm, (r(4, 3, dtype=torch.bfloat16), r(4, 5), r(5, 3)), LOW),
    ("linear", F.linear, (r(4, 5), r(3, 5), r(3)), LOW),
    ("conv1d", F.conv1d, (r(2, 3, 8), r(4, 3, 3)), LOW),
    ("conv2d", F.conv2d, (r(2, 3, 6, 6), r(4, 3, 3, 3), r(4)), LOW),
    ("conv_transpose2d", F.conv_transpose2d, (r(1, 3, 4, 4), r(3, 2, 3, 3)), LOW),
    ("sdpa", F.scaled_dot_product_attention, (r(2, 4, 6, 8), r(2, 4, 6, 8), r(2, 4, 6, 8)), LOW),
    # fp32: low-precision inputs run in float32
    ("exp", torch.exp, (r(8, dtype=torch.bfloat16),), F32),
    ("log", lambda x: torch.log(x.abs() + 1), (r(8, dtype=torch.bfloat16),), F32),
    ("pow", lambda x: torch.pow(x, 2.0), (r(8, dtype=torch.bfloat16),), F32),
    ("rsqrt", lambda x: torch.rsqrt(x.abs() + 1), (r(8, dtype=torch.bfloat16),), F32),
    ("softplus", F.softplus, (r(8, dtype=torch.bfloat16),), F32),
    ("layer_norm", lambda x: F.layer_norm(x, (6,)), (r(3, 6, dtype=torch.bfloat16),), F32),
    ("mse_loss", F.mse_loss, (r(4, 3, dtype=torch.bfloat16), r(4, 3, dtype=torch.bfloat16)), F32),
    (
        "nll_loss",
        lambda x: F.nll_loss(x, torch.tensor([0, 2, 1, 1], device=x.device)),
        (r(4, 3, dtype=torch.bfloat16),),
        F32,
    ),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), (r(4, 3, dtype=torch.bfloat16),), F32),
    (
        "bce_with_logits",
        F.binary_cross_entropy_with_logits,
        (r(4, 3, dtype=torch.bfloat16), torch.rand(4, 3).to(torch.bfloat16)),
        F32,
    ),
    # fp32_set_opt_dtype: reductions and softmax accumulate and return float32
    ("softmax", lambda x: torch.softmax(x, 1), (r(4, 3, dtype=torch.bfloat16),), F32),
    ("log_softmax", lambda x: F.log_softmax(x, 1), (r(4, 3, dtype=torch.bfloat16),), F32),
    ("sum", torch.sum, (r(4, 3, dtype=torch.bfloat16),), F32),
    ("sum_dim", lambda x: x.sum(1), (r(4, 3, dtype=torch.bfloat16),), F32),
    ("prod", lambda x: x.prod(1), (r(4, 3, dtype=torch.bfloat16),), F32),
    ("cumsum", lambda x: x.cumsum(1), (r(4, 3, dtype=torch.bfloat16),), F32),
    ("vector_norm", torch.linalg.vector_norm, (r(4, 3, dtype=torch.bfloat16),), F32),
    (
        "cross_entropy",
        lambda x: F.cross_entropy(x, torch.tensor([0, 2, 1, 1], device=x.device)),
        (r(4, 3, dtype=torch.bfloat16),),
        F32,
    ),
    # promote: the widest input type
    ("addcmul", torch.addcmul, (r(4), r(4, dtype=torch.bfloat16), r(4, dtype=torch.bfloat16)), F32),
    ("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1), (r(4), r(4, dtype=torch.bfloat16), r(4)), F32),
    ("atan2", torch.atan2, (r(4, dtype=torch.bfloat16), r(4)), F32),
    ("dot", torch.dot, (r(4), r(4, dtype=torch.bfloat16)), F32),
    (
        "index_put",
        lambda x, v: x.index_put((torch.tensor([0, 2], device=x.device),), v),
        (r(4), r(2, dtype=torch.bfloat16)),
        F32,
    ),
    (
        "scatter_add",
        lambda x, s: x.scatter_add(0, torch.tensor([0, 1, 0], device=x.device), s),
        (r(4), r(3, dtype=torch.bfloat16)),
        F32,
    ),
    # on no list: PyTorch's own type promotion
    ("cat", lambda a, b: torch.cat([a, b]), (r(3), r(2, dtype=torch.bfloat16)), F32),
    ("stack", lambda a, b: torch.stack([a, b]), (r(3), r(3, dtype=torch.bfloat16)), F32),
    ("add", torch.add, (r(3), r(3, dtype=torch.bfloat16)), F32),
    ("relu_low", torch.relu, (r(3, dtype=torch.bfloat16),), LOW),  # input bfloat16 (float16 run: float16)
    ("relu_f32", torch.relu, (r(3),), F32),
    ("mm_int_untouched", torch.mm, (torch.arange(6).view(2, 3), torch.arange(6).view(3, 2)), torch.int64),
]


def cpu_reference(fn, inputs, out_dtype):
    """The op on CPU with the float inputs cast as the policy casts them. A
    low-precision op is computed in float32 from the rounded inputs and rounded
    once, as CUDA's float32 accumulation does (CPU's own bfloat16 kernels, e.g.
    conv_transpose2d, round partial sums and differ from CUDA by an ulp of
    the terms)."""
    floats = [x for x in inputs if x.is_floating_point()]
    if out_dtype in (torch.bfloat16, torch.float16) and any(x.dtype != out_dtype for x in floats):
        cast = out_dtype  # lower_precision_fp
    elif out_dtype == F32:
        cast = F32  # fp32 / promote to the widest (float32 here)
    else:
        cast = None
    inputs = [x.to(cast) if cast is not None and x.is_floating_point() else x for x in inputs]
    if cast in (torch.bfloat16, torch.float16):
        return fn(*[x.float() if x.is_floating_point() else x for x in inputs]).to(cast)
    return fn(*inputs)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,fn,inputs,expected", CASES, ids=[c[0] for c in CASES])
def test_autocast_dtype(name, fn, inputs, expected, low):
    torch.manual_seed(0)
    expected = low if expected is LOW else expected
    if low == torch.float16:  # the float16 run: low-precision inputs are float16 too
        inputs = tuple(x.to(torch.float16) if x.dtype == torch.bfloat16 else x for x in inputs)
    tpu_inputs = [x.to("tpu") for x in inputs]
    with torch.autocast("tpu", dtype=low):
        out = fn(*tpu_inputs)
    assert out.device.type == "tpu"
    assert out.dtype == expected, (name, out.dtype, expected)
    ref = cpu_reference(fn, inputs, expected)
    tol = {"atol": 2e-2, "rtol": 2e-2} if expected in (torch.bfloat16, torch.float16) else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(out.cpu(), ref.to(out.dtype), **tol)


def test_default_dtype_is_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu")
        out = torch.mm(torch.randn(2, 3, device="tpu"), torch.randn(3, 2, device="tpu"))
    assert out.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("tpu")


def test_device_module_amp_api():
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.tpu.is_bf16_supported()
    assert torch.amp.is_autocast_available("tpu")


def test_disabled_and_nested():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(3, 2, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.bfloat16
        with torch.autocast("tpu", enabled=False):
            assert torch.mm(a, b).dtype == torch.float32
        assert torch.mm(a, b).dtype == torch.bfloat16
    assert torch.mm(a, b).dtype == torch.float32


def test_cpu_autocast_does_not_touch_tpu():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(3, 2, device="tpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.float32


def test_binary_cross_entropy_refused_like_cuda():
    p = torch.rand(4, device="tpu")
    with torch.autocast("tpu"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, p)


def test_unsupported_dtype_warns_and_disables():
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("tpu", dtype=torch.float64):
            out = torch.mm(torch.randn(2, 3, device="tpu"), torch.randn(3, 2, device="tpu"))
    assert out.dtype == torch.float32


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.LayerNorm(4 * 6 * 6)
        self.fc1 = torch.nn.Linear(4 * 6 * 6, 16)
        self.fc2 = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        x = self.norm(x)
        return self.fc2(torch.relu(self.fc1(x)))


def test_model_forward_backward_matches_cpu_autocast():
    """The same model, forward and backward under autocast(bfloat16), on tpu and on CPU.

    The op lists of CPU and CUDA autocast differ only in ops this model does not
    use the same way (layer_norm and softmax stay float32 on tpu, CPU leaves them
    in the input dtype), so the tolerance is bfloat16's.
    """
    torch.manual_seed(0)
    cpu_model = SmallNet()
    tpu_model = SmallNet()
    tpu_model.load_state_dict(cpu_model.state_dict())
    tpu_model.to("tpu")
    x = torch.randn(8, 3, 6, 6)
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    with torch_tpu.set_fallback("error"), torch.autocast("tpu", dtype=torch.bfloat16):
        out_t = tpu_model(x.to("tpu"))
        loss_t = F.cross_entropy(out_t, y.to("tpu"))
    loss_t.backward()  # native_layer_norm_backward has no rule yet: it runs on the CPU fallback
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_c = cpu_model(x)
        loss_c = F.cross_entropy(out_c, y)
    loss_c.backward()
    assert out_t.dtype == out_c.dtype == torch.bfloat16
    assert loss_t.dtype == loss_c.dtype == torch.float32
    torch.testing.assert_close(out_t.cpu(), out_c, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss_t.cpu(), loss_c, atol=2e-2, rtol=2e-2)
    for (name, pt), pc in zip(tpu_model.named_parameters(), cpu_model.parameters(), strict=True):
        assert pt.grad.dtype == pc.grad.dtype == torch.float32, name
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=5e-2, rtol=5e-2, msg=name)


def test_grad_scaler_float16_training():
    """GradScaler("tpu") with float16 autocast: a few steps lower the loss, no inf/nan.

    The _amp_* ops it calls run on the CPU fallback until they get rules.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("tpu")
    x, y = torch.randn(32, 8, device="tpu"), torch.randn(32, 1, device="tpu")
    losses = []
    for _ in range(5):
        opt.zero_grad()
        with torch.autocast("tpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert scaler.get_scale() > 0
