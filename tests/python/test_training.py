"""Training on "tpu" matches training on CPU.

Each model starts from the same weights (initialized on CPU from a seed and
copied), sees the same batches (drawn on CPU), and trains for a few steps on
both devices with the same optimizer. The per-step losses and the final
parameters (and batch-norm running statistics) must match.

Tolerances: XLA sums float32 reductions (matmul, convolution, norms) in
another order than PyTorch's CPU kernels, so each step differs by float32
rounding (~1e-6 relative) and the optimizer carries that forward. Adam-style
updates divide by sqrt(v): a rounding difference in a near-zero gradient moves
a parameter by up to lr, so parameters after adaptive optimizers get a looser
absolute tolerance than after SGD. A backend bug (a wrong gradient, a missed
in-place update) moves losses and parameters by orders of magnitude more.

Dropout is random: a device's random stream differs from CPU's by design, so
the comparisons run dropout layers in eval mode (the CNN) or with p=0 (the
transformers); the rest of the model trains in train mode (batch norm uses
batch statistics and updates its running statistics).

Every op of these steps has a lowering rule: the tests run with the CPU
fallback set to error, so an op that falls back fails the test.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import demo

STEPS = 6

# (loss rtol, loss atol, param rtol, param atol) per optimizer family, see the module docstring.
SGD_TOL = dict(loss=(1e-5, 1e-5), param=(1e-5, 1e-5))
ADAPTIVE_TOL = dict(loss=(1e-4, 1e-4), param=(1e-4, 2e-4))

OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.05), SGD_TOL),
    "sgd_momentum": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4), SGD_TOL),
    "sgd_nesterov": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True), SGD_TOL),
    "adam": (lambda p: torch.optim.Adam(p, lr=1e-2), ADAPTIVE_TOL),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), ADAPTIVE_TOL),
    "rmsprop": (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5), ADAPTIVE_TOL),
}


@pytest.fixture(autouse=True)
def no_fallback():
    with torch_tpu.set_fallback("error"):
        yield


def train_both(model_cpu, make_opt, batches, loss_fn, clip=None, prepare=None):
    """Trains a CPU model and a copy of it on "tpu" on the same batches; returns both models and loss lists."""
    before = copy.deepcopy(model_cpu.state_dict())
    model_tpu = copy.deepcopy(model_cpu).to("tpu")
    results = []
    for model, device in ((model_cpu, "cpu"), (model_tpu, "tpu")):
        model.train()
        if prepare is not None:
            prepare(model)
        opt = make_opt(model.parameters())
        # The default (foreach) implementation on both devices: what a user gets without asking.
        assert opt.defaults.get("foreach") is None and not opt.defaults.get("fused")
        losses = []
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                assert norm.device.type == device
            opt.step()
            losses.append(loss.detach())
        results.append((model, torch.stack(losses).cpu()))
    (model_cpu, losses_cpu), (model_tpu, losses_tpu) = results
    moved = max((model_cpu.state_dict()[k].float() - v.float()).abs().max().item() for k, v in before.items())
    assert moved > 1e-4, "training did not change the weights: comparing them would prove nothing"
    return model_cpu, model_tpu, losses_cpu, losses_tpu


def assert_trained_same(model_cpu, model_tpu, losses_cpu, losses_tpu, tol):
    (lr, la), (pr, pa) = tol["loss"], tol["param"]
    torch.testing.assert_close(losses_tpu, losses_cpu, rtol=lr, atol=la, msg=lambda m: f"losses differ:\n{m}")
    state_tpu = model_tpu.state_dict()
    for name, value in model_cpu.state_dict().items():
        assert state_tpu[name].device.type == "tpu", name
        torch.testing.assert_close(
            state_tpu[name].cpu(), value, rtol=pr, atol=pa, msg=lambda m, name=name: f"{name} differs:\n{m}"
        )


def data(seed, n, make_x, make_y):
    g = torch.Generator().manual_seed(seed)
    return [(make_x(g), make_y(g)) for _ in range(n)]


# ---------------------------------------------------------------------------
# MLP: every optimizer, with and without clip_grad_norm_.


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))


MLP_BATCHES = data(1, STEPS, lambda g: torch.randn(16, 20, generator=g), lambda g: torch.randint(5, (16,), generator=g))


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip"])
def test_mlp(opt_name, clip):
    make_opt, tol = OPTIMIZERS[opt_name]
    assert_trained_same(*train_both(mlp(), make_opt, MLP_BATCHES, F.cross_entropy, clip=clip), tol)


def test_clip_grad_norm_scales_gradients_like_cpu():
    model_cpu = mlp()
    model_tpu = copy.deepcopy(model_cpu).to("tpu")
    x, y = MLP_BATCHES[0]
    for model, dev in ((model_cpu, "cpu"), (model_tpu, "tpu")):
        F.cross_entropy(model(x.to(dev)), y.to(dev)).backward()
    norm_cpu = torch.nn.utils.clip_grad_norm_(model_cpu.parameters(), 0.1)
    norm_tpu = torch.nn.utils.clip_grad_norm_(model_tpu.parameters(), 0.1)
    assert norm_cpu > 0.1  # the clip is active
    torch.testing.assert_close(norm_tpu.cpu(), norm_cpu, rtol=1e-5, atol=1e-6)
    for p_cpu, p_tpu in zip(model_cpu.parameters(), model_tpu.parameters(), strict=True):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# CNN: convolution, batch norm (batch statistics, running-stat update), pooling, dropout (eval: see module doc).


class CNN(nn.Module):
    # No conv bias before batch norm (as usual): its gradient is exactly zero in math, so both devices see only
    # rounding noise there, which Adam scales up to steps of size lr in random directions.
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AvgPool2d(2),
        )
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.dropout(self.features(x).flatten(1)))


def cnn():
    torch.manual_seed(0)
    return CNN()


def dropout_off(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.eval()


CNN_BATCHES = data(
    2, STEPS, lambda g: torch.randn(8, 3, 16, 16, generator=g), lambda g: torch.randint(10, (8,), generator=g)
)


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_cnn(opt_name):
    make_opt, tol = OPTIMIZERS[opt_name]
    result = train_both(cnn(), make_opt, CNN_BATCHES, F.cross_entropy, clip=1.0, prepare=dropout_off)
    # Convolutions sum in another order on XLA: a little more rounding per step than a matmul.
    loose = {k: (r * 3, a * 3) for k, (r, a) in tol.items()}
    assert_trained_same(*result, loose)
    bn = result[1].features[1]
    assert bn.training and bn.num_batches_tracked.item() == STEPS


# ---------------------------------------------------------------------------
# Transformer: PyTorch's own encoder layer (multi-head attention, layer norm, GELU), and the demo's GPT.


class TinyTransformer(nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=32,
            nhead=4,
            dim_feedforward=64,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
            bias=bias,
        )
        self.head = nn.Linear(32, 7)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


TRANSFORMER_BATCHES = data(
    3, STEPS, lambda g: torch.randn(4, 10, 32, generator=g), lambda g: torch.randint(7, (4,), generator=g)
)


# The key projection's bias has an exactly zero gradient in math (it adds the same amount to every score of a
# query, which softmax ignores): both devices see rounding noise there, which Adam scales up to steps of size lr.
# So the AdamW case runs without biases; SGD keeps them.
@pytest.mark.parametrize("opt_name,bias", [("adamw", False), ("sgd_nesterov", True)])
def test_transformer_block(opt_name, bias):
    make_opt, tol = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    result = train_both(TinyTransformer(bias), make_opt, TRANSFORMER_BATCHES, F.cross_entropy, clip=1.0)
    assert_trained_same(*result, tol)


def test_demo_gpt_matches_cpu():
    text = demo.load_corpus()
    tok = demo.CharTokenizer(text)
    data_ids = tok.encode(text)
    model_cpu = demo.make_model(tok.vocab_size, seed=0, dropout=0.0)
    model_tpu = copy.deepcopy(model_cpu)
    assert model_tpu.head.weight is model_tpu.tok_emb.weight  # weight tying survives the copy
    kw = dict(data=data_ids, steps=STEPS, batch_size=8, lr=3e-3, seed=0, progress=False)
    losses_tpu = demo.train(model_tpu, device="tpu", **kw)
    losses_cpu = demo.train(model_cpu, device="cpu", **kw)
    assert model_tpu.head.weight is model_tpu.tok_emb.weight and model_tpu.head.weight.device.type == "tpu"
    assert_trained_same(model_cpu, model_tpu, torch.tensor(losses_cpu), torch.tensor(losses_tpu), ADAPTIVE_TOL)
    assert losses_cpu[-1] < losses_cpu[0]


def test_module_to_keeps_parameters_and_tying():
    # Like CUDA: .to() changes each Parameter in place, so tied weights stay tied and an optimizer built before
    # the move still holds the model's parameters.
    model = demo.make_model(vocab_size=11, seed=0, dropout=0.0)
    before = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("tpu")
    after = list(model.parameters())
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before, strict=True))
    assert all(p.device.type == "tpu" for p in after)
    assert model.head.weight is model.tok_emb.weight
    assert opt.param_groups[0]["params"][0] is after[0]
    model.cpu()
    assert model.head.weight is model.tok_emb.weight and model.head.weight.device.type == "cpu"


def test_demo_corpus_is_the_generated_one():
    # The shipped corpus is reproducible from its generator.
    assert demo.load_corpus() == demo.generate_corpus()


def test_demo_generate_is_greedy_and_matches_cpu():
    text = demo.load_corpus()
    tok = demo.CharTokenizer(text)
    model_cpu = demo.make_model(tok.vocab_size, seed=0, dropout=0.0).eval()
    model_tpu = copy.deepcopy(model_cpu).to("tpu")
    prompt = tok.encode(text[: model_cpu.cfg.context])
    out_cpu = model_cpu.generate(prompt, 8)
    out_tpu = model_tpu.generate(prompt.to("tpu"), 8)
    assert out_tpu == out_cpu


def test_demo_modes(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--mode", "lazy"])
    assert "must be one of strict, debug, fused, compile" in capsys.readouterr().err
    assert demo.parse_args(["--mode", "compile"]).mode == "compile"
    assert demo.parse_args(["--mode", "fused"]).mode == "fused"
