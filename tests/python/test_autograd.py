"""Autograd on tpu: gradcheck in float64 (finite differences against the
analytical backward, every op lowered: a CPU fallback fails the test), and the
forward/backward ops a training step needs, compared with CPU."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, compare_fn

import torch_tpu


def t64(*shape, low=None):
    x = torch.randn(*shape, dtype=torch.float64)
    if low is not None:
        x = x.abs() + low
    return x


def gradcheck(fn, *inputs, grad_args=None, **kw):
    """gradcheck of fn on tpu, inputs moved there; grad_args (default: float inputs) require grad."""
    with torch_tpu.set_fallback("error"):
        tpu_in = []
        for i, x in enumerate(inputs):
            x = x.to("tpu")
            wants = x.is_floating_point() if grad_args is None else i in grad_args
            tpu_in.append(x.requires_grad_(wants))
        # Fused mode: XLA may round a subexpression differently in another
        # fusion, so two identical backward passes can differ in the last bit.
        if torch_tpu.get_eager_mode() == "fused":
            kw.setdefault("nondet_tol", 1e-12)
        assert torch.autograd.gradcheck(fn, tpu_in, **kw)


def sdpa_math(q, k, v, **kw):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


# (name, fn, inputs, grad_args)
GRADCHECKS = [
    ("mm", torch.mm, (t64(3, 4), t64(4, 2)), None),
    ("linear", F.linear, (t64(3, 4), t64(2, 4), t64(2)), None),
    (
        "conv2d",
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        (t64(1, 2, 4, 4), t64(2, 2, 3, 3), t64(2)),
        None,
    ),
    ("conv2d_input_only", lambda x, w: F.conv2d(x, w, padding=1), (t64(1, 2, 3, 3), t64(2, 2, 3, 3)), (0,)),
    ("conv2d_weight_only", lambda x, w: F.conv2d(x, w, groups=2), (t64(1, 2, 3, 3), t64(2, 1, 3, 3)), (1,)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (4,), w, b), (t64(3, 4), t64(4), t64(4)), None),
    ("layer_norm_no_affine", lambda x: F.layer_norm(x, (2, 3)), (t64(2, 2, 3),), None),
    (
        "batch_norm_training",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        (t64(4, 3, 2), t64(3), t64(3)),
        None,
    ),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), (t64(2, 4, 3), t64(4), t64(4)), None),
    ("batch_norm_input_only", lambda x: F.batch_norm(x, None, None, training=True), (t64(4, 3),), None),
    ("softmax", lambda x: F.softmax(x, -1), (t64(3, 4),), None),
    ("log_softmax", lambda x: F.log_softmax(x, 0), (t64(3, 4),), None),
    ("gelu", F.gelu, (t64(3, 4),), None),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), (t64(3, 4),), None),
    ("silu", F.silu, (t64(3, 4),), None),
    ("embedding", F.embedding, (torch.tensor([[0, 2], [2, 3]]), t64(4, 3)), (1,)),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), (torch.randperm(32, dtype=torch.float64).view(1, 2, 4, 4),), None),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), (t64(1, 2, 5, 5),), None),
    (
        "nll_loss",
        lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=1),
        (t64(5, 3), torch.tensor([0, 1, 2, 2, 0]), t64(3, low=0.5)),
        (0,),
    ),
    (
        "cross_entropy_smoothing",
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2),
        (t64(4, 3), torch.tensor([0, 2, 1, 2])),
        (0,),
    ),
    ("mse_loss", F.mse_loss, (t64(3, 4), t64(3, 4)), None),
    ("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), (t64(3, 4), t64(3, 4)), None),
    ("huber_loss", lambda a, b: F.huber_loss(a, b, delta=0.7, reduction="sum"), (t64(3, 4), t64(3, 4)), None),
    (
        "binary_cross_entropy",
        lambda x, y, w: F.binary_cross_entropy(x, y, weight=w),
        (torch.rand(3, 4, dtype=torch.float64) * 0.8 + 0.1, torch.rand(3, 4, dtype=torch.float64), t64(4, low=0.5)),
        (0, 1),
    ),
    ("bce_with_logits", F.binary_cross_entropy_with_logits, (t64(3, 4), torch.rand(3, 4, dtype=torch.float64)), None),
    ("sdpa_math", sdpa_math, (t64(1, 2, 3, 4), t64(1, 2, 3, 4), t64(1, 2, 3, 4)), None),
    (
        "sdpa_math_causal",
        lambda q, k, v: sdpa_math(q, k, v, is_causal=True),
        (t64(1, 3, 4), t64(1, 3, 4), t64(1, 3, 4)),
        None,
    ),
    (
        "sdpa_math_float_mask",
        lambda q, k, v, m: sdpa_math(q, k, v, attn_mask=m),
        (t64(2, 3, 4), t64(2, 3, 4), t64(2, 3, 4), t64(3, 3)),
        None,
    ),
    (
        "addcmul_addcdiv",
        lambda a, b, c: torch.addcdiv(torch.addcmul(a, b, c, value=0.5), b, c, value=-2),
        (t64(3), t64(3), t64(3, low=1)),
        None,
    ),
]


@pytest.mark.parametrize("name,fn,inputs,grad_args", GRADCHECKS, ids=[g[0] for g in GRADCHECKS])
def test_gradcheck(name, fn, inputs, grad_args):
    gradcheck(fn, *inputs, grad_args=grad_args)


TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}, torch.float64: {}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_addcmul_addcdiv(dtype):
    torch.manual_seed(0)
    a, b, c = torch.randn(3, 4, dtype=dtype), torch.randn(4, dtype=dtype), torch.rand(3, 1, dtype=dtype) + 0.5
    compare_fn(lambda a, b, c: torch.addcmul(a, b, c, value=-1.5), a, b, c, tol=TOL[dtype])
    compare_fn(lambda a, b, c: torch.addcdiv(a, b, c, value=0.25), a, b, c, tol=TOL[dtype])
    compare_fn(lambda a, b, c: torch.addcmul(a, b, c), a, b, c, tol=TOL[dtype])
    with torch_tpu.set_fallback("error"):
        x = a.to("tpu")
        x.addcdiv_(b.to("tpu"), c.to("tpu"), value=3)
        assert_same(x, a.clone().addcdiv_(b, c, value=3), **TOL[dtype])


def test_addcmul_int():
    a, b, c = torch.arange(6).view(2, 3), torch.arange(3), torch.tensor(2)
    with torch_tpu.set_fallback("error"):
        assert_same(torch.addcmul(a.to("tpu"), b.to("tpu"), c.to("tpu"), value=3), torch.addcmul(a, b, c, value=3))
    with pytest.raises(RuntimeError, match="Integer division"):
        torch.addcdiv(a.to("tpu"), b.to("tpu"), c.to("tpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_isneginf_isposinf(dtype):
    x = torch.tensor([0, 1, -2, 7], dtype=dtype)
    if dtype.is_floating_point:
        x = torch.tensor([float("-inf"), float("inf"), float("nan"), -1.0, 3.0], dtype=dtype)
    with torch_tpu.set_fallback("error"):
        assert_same(torch.isneginf(x.to("tpu")), torch.isneginf(x))
        assert_same(torch.isposinf(x.to("tpu")), torch.isposinf(x))


@pytest.mark.parametrize(
    "mask", [(True, True, False), (False, True, True), (True, False, False), (False, True, False), (False, False, True)]
)
def test_convolution_backward_partial_mask(mask):
    torch.manual_seed(1)
    go, x, w = torch.randn(2, 4, 3, 3), torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    args = ([4], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, list(mask))
    with torch_tpu.set_fallback("error"):
        got = torch.ops.aten.convolution_backward(go.to("tpu"), x.to("tpu"), w.to("tpu"), *args)
    want = torch.ops.aten.convolution_backward(go, x, w, *args)
    for g, e, m in zip(got, want, mask, strict=True):
        if m:
            assert_same(g, e, rtol=1e-4, atol=1e-4)
        else:  # CPU sometimes computes more than asked; tpu leaves it undefined
            assert g is None


def test_first_conv_layer_trains_on_device():
    # The first layer's input needs no grad: output_mask [False, True, True].
    torch.manual_seed(2)
    conv_c = torch.nn.Conv2d(3, 4, 3, padding=1)
    conv_t = torch.nn.Conv2d(3, 4, 3, padding=1)
    conv_t.load_state_dict(conv_c.state_dict())
    conv_t.to("tpu")
    x = torch.randn(2, 3, 6, 6)
    with torch_tpu.set_fallback("error"):
        conv_t(x.to("tpu")).square().sum().backward()
    conv_c(x).square().sum().backward()
    assert_same(conv_t.weight.grad, conv_c.weight.grad, rtol=1e-4, atol=1e-4)
    assert_same(conv_t.bias.grad, conv_c.bias.grad, rtol=1e-4, atol=1e-4)


def test_convolution_backward_bias_only():
    # Only grad_bias: the program computes one output, the others are None.
    go, x, w = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3), torch.randn(2, 2, 1, 1)
    with torch_tpu.set_fallback("error"):
        gi, gw, gb = torch.ops.aten.convolution_backward(
            go.to("tpu"), x.to("tpu"), w.to("tpu"), [2], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, False, True]
        )
    assert gi is None and gw is None
    assert_same(gb, go.sum((0, 2, 3)))


ACTIVATIONS = [
    ("elu", lambda x: F.elu(x, alpha=0.7)),
    ("elu_inplace", lambda x: F.elu(x * 1, alpha=0.7, inplace=True)),  # backward from the result
    ("selu", F.selu),
    ("celu", lambda x: F.celu(x, alpha=1.3)),
    ("softplus", lambda x: F.softplus(x, beta=2, threshold=3)),
    ("hardsigmoid", F.hardsigmoid),
    ("hardswish", F.hardswish),
    ("mish", F.mish),
    ("logsigmoid", F.logsigmoid),
    ("logit", lambda x: torch.logit(torch.sigmoid(x))),
    ("logit_eps", lambda x: torch.logit(torch.sigmoid(x * 3), eps=0.1)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,fn", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_backward(name, fn, dtype):
    torch.manual_seed(3)
    x = torch.randn(4, 6, dtype=dtype) * 3
    x[0, :4] = torch.tensor([-3.0, 3.0, 0.0, 1.5])  # kinks of hardsigmoid/hardswish and softplus's threshold
    compare_fn(fn, x, tol=TOL[dtype])


def train_steps(make_model, loss_fn, inputs, steps=3, tol=None):
    """A few SGD-with-momentum steps on CPU and on tpu (no fallback): losses and parameters compared."""
    torch.manual_seed(4)
    model_c = make_model()
    model_t = make_model()
    model_t.load_state_dict(model_c.state_dict())
    model_t.to("tpu")
    losses = {}
    with torch_tpu.set_fallback("error"):
        for model, dev in ((model_c, "cpu"), (model_t, "tpu")):
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
            losses[dev] = []
            for _ in range(steps):
                opt.zero_grad()
                loss = loss_fn(model, *[i.to(dev) for i in inputs])
                loss.backward()
                opt.step()
                losses[dev].append(loss.item())
    tol = tol or {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"]), **tol)
    for (name, p_t), p_c in zip(model_t.state_dict().items(), model_c.state_dict().values(), strict=True):
        torch.testing.assert_close(p_t.cpu(), p_c, **tol, msg=name)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(6)
        self.c2 = torch.nn.Conv2d(6, 8, 3, stride=2, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8, affine=False)
        self.fc = torch.nn.Linear(8 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.c1(x))), 2)
        x = F.relu(self.bn2(self.c2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 2).flatten(1))


def test_cnn_training_step():
    x, y = torch.randn(4, 3, 10, 10), torch.randint(0, 5, (4,))
    train_steps(SmallCNN, lambda m, x, y: F.cross_entropy(m(x), y), (x, y))


class Block(torch.nn.Module):
    """Embedding, pre-norm attention (nn.MultiheadAttention and SDPA), GELU MLP."""

    def __init__(self, causal, mask, approximate):
        super().__init__()
        d, self.h = 16, 2
        self.emb = torch.nn.Embedding(11, d)
        self.ln1, self.ln2, self.ln3 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.mha = torch.nn.MultiheadAttention(d, self.h, batch_first=True)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(d, 2 * d), torch.nn.GELU(approximate=approximate), torch.nn.Linear(2 * d, d)
        )
        self.head = torch.nn.Linear(d, 11)
        self.causal, self.mask = causal, mask

    def forward(self, tok):
        B, L = tok.shape
        x = self.emb(tok)
        y = self.ln1(x)
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool, device=tok.device), 1)
        x = x + self.mha(y, y, y, attn_mask=causal, need_weights=False)[0]
        q, k, v = self.qkv(self.ln2(x)).view(B, L, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        mask = None if self.mask is None else self.mask.to(tok.device)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        x = x + a.transpose(1, 2).reshape(B, L, -1)
        return self.head(x + self.ff(self.ln3(x)))


@pytest.mark.parametrize(
    "causal,mask,approximate",
    [
        (False, None, "none"),
        (True, None, "tanh"),
        (False, torch.randn(5, 5), "none"),
        (False, torch.tensor([[True, False, True, True, True]]).expand(5, 5), "tanh"),
    ],
    ids=["plain", "causal", "float_mask", "bool_mask"],
)
def test_transformer_block_training_step(causal, mask, approximate):
    tok = torch.randint(0, 11, (3, 5))
    train_steps(
        lambda: Block(causal, mask, approximate),
        lambda m, t: F.cross_entropy(m(t).flatten(0, 1), t.flatten(), label_smoothing=0.1),
        (tok,),
    )


@pytest.mark.parametrize(
    "dims,kw",
    [
        (1, {}),
        (2, {"stride": 2, "padding": 1, "output_padding": 1}),
        (2, {"stride": (2, 3), "dilation": 2, "groups": 2, "output_padding": (1, 2)}),
        (3, {"stride": 2, "padding": (0, 1, 0)}),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_backward(dims, kw, bias):
    torch.manual_seed(5)
    x = torch.randn(2, 4, *[5 - dims + 2] * dims)
    w = torch.randn(4, 3, *[3] * dims)
    b = torch.randn(3 * kw.get("groups", 1)) if bias else None
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[dims]
    inputs = (x, w) + ((b,) if bias else ())
    compare_fn(lambda *a: fn(*a, **kw), *inputs, tol={"rtol": 1e-4, "atol": 1e-4})
    # the first layer: no grad for the input
    compare_fn(lambda *a: fn(*a, **kw), *inputs, tol={"rtol": 1e-4, "atol": 1e-4}, grad_args=(1, 2))


def test_gradcheck_conv_transpose():
    gradcheck(
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        t64(1, 2, 2, 3),
        t64(2, 1, 2, 2),
        t64(2),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_xlogy_kl_div_prelu(dtype):
    torch.manual_seed(6)
    x, y = torch.randn(3, 4, dtype=dtype), torch.rand(3, 4, dtype=dtype)
    x[0, 0], y[0, 1], y[1, 1] = 0, 0, float("nan")
    with torch_tpu.set_fallback("error"):
        assert_same(torch.xlogy(x.to("tpu"), y.to("tpu")), torch.xlogy(x, y), equal_nan=True)
        assert_same(torch.xlogy(2, y.to("tpu")), torch.xlogy(2, y), equal_nan=True)
        assert_same(torch.xlogy(x.to("tpu"), 3.0), torch.xlogy(x, 3.0))
    p, q = torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    compare_fn(
        lambda p, q: F.kl_div(F.log_softmax(p, -1), F.softmax(q, -1), reduction="batchmean"), p, q, tol=TOL[dtype]
    )
    compare_fn(lambda p, q: F.kl_div(F.log_softmax(p, -1), F.log_softmax(q, -1), log_target=True), p, q, tol=TOL[dtype])
    a = torch.randn(2, 3, 4, dtype=dtype)
    compare_fn(F.prelu, a, torch.rand(3, dtype=dtype), tol=TOL[dtype])
    compare_fn(F.prelu, a, torch.rand(1, dtype=dtype), tol=TOL[dtype])


# bias=False: PyTorch 2.13's meta kernel of _thnn_fused_lstm_cell reads .device of the None biases;
# the general kernel shows it zero biases.
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_training_step(bias):
    # PyTorch runs the fused LSTM cell ops on a PrivateUse1 device (as on CUDA).
    x, y = torch.randn(2, 4, 3), torch.randn(2, 4, 5)
    train_steps(
        lambda: torch.nn.LSTM(3, 5, num_layers=2, batch_first=True, bias=bias),
        lambda m, x, y: F.mse_loss(m(x)[0], y) + m(x)[1][1].square().mean(),
        (x, y),
    )


@pytest.mark.parametrize("bias", [True, False])
def test_gru_training_step(bias):
    # nn.GRU calls _thnn_fused_gru_cell on PrivateUse1; torch has no meta kernel
    # for it, so ours (csrc/aten/meta_kernels.cpp) gives the shapes.
    x, y = torch.randn(2, 4, 3), torch.randn(2, 4, 5)
    train_steps(
        lambda: torch.nn.GRU(3, 5, num_layers=2, batch_first=True, bias=bias),
        lambda m, x, y: F.mse_loss(m(x)[0], y) + m(x)[1].square().mean(),
        (x, y),
    )


def test_gradcheck_gru_cell():
    cell = torch.nn.GRUCell(2, 3).double().to("tpu")
    gradcheck(lambda x, h: cell(x, h), t64(2, 2), t64(2, 3))


def test_gradcheck_lstm_cell():
    cell = torch.nn.LSTMCell(2, 3).double().to("tpu")

    def fn(x, h, c):
        return cell(x, (h, c))

    gradcheck(fn, t64(2, 2), t64(2, 3), t64(2, 3))
