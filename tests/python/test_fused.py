"""Fused eager mode: ops recorded into a window and run as one program.

What the rest of the suite cannot see: when windows flush and why, that dead
intermediates are not outputs, that a steady training loop stops compiling,
and that errors still name their op. (`make test` also runs the op, autograd
and training tests under TORCH_TPU_EAGER_MODE=fused.)
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same
from conftest import metric_delta as delta

import torch_tpu


def test_mode_switch_and_context_manager():
    before = torch_tpu.get_eager_mode()
    with torch_tpu.set_eager_mode("fused"):
        assert torch_tpu.get_eager_mode() == "fused"
        x = torch.ones(3, device="tpu") * 2
    # Leaving fused mode flushed the window: the value is there in Strict mode.
    assert torch_tpu.get_eager_mode() == before
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="strict, debug, fused"):
        torch_tpu.set_eager_mode("lazy")


def test_ops_are_recorded_until_a_host_read(fused):
    a, b = torch.randn(4, 5), torch.randn(5)
    m = torch_tpu.metrics()
    x, y = a.to("tpu"), b.to("tpu")
    z = ((x * 2 + y).relu() - x.exp()).sum(0)
    assert delta(m, "executions") == 0  # nothing ran yet
    assert_same(z, ((a * 2 + b).relu() - a.exp()).sum(0))
    assert delta(m, "fused_flushes") == 1
    assert delta(m, "fused_flush_host_read") == 1
    assert delta(m, "fused_ops") >= 5
    # Only z is held by a tensor: the intermediates were not outputs.
    assert delta(m, "fused_outputs") == 1


def test_views_and_inplace_writes_in_a_window(fused):
    a = torch.randn(6, 4)
    x = a.to("tpu")
    v = x[1:4, ::2]  # a strided view of the window's input
    v.mul_(10)  # writes through the view into x's storage
    x.add_(1)
    t = x.t().contiguous()
    ref = a.clone()
    ref[1:4, ::2] *= 10
    ref += 1
    assert_same(x, ref)
    assert_same(t, ref.t().contiguous())
    assert_same(v, ref[1:4, ::2])


@pytest.mark.parametrize(
    "reason,action",
    [
        ("synchronize", lambda t: torch.tpu.synchronize()),
        ("mark_step", lambda t: torch_tpu.mark_step()),
        ("size_read", lambda t: torch.nonzero(t).shape),
        ("host_read", lambda t: t.sum().item()),
        ("host_read", lambda t: print(t)),
    ],
)
def test_flush_reasons(fused, reason, action):
    t = torch.arange(6.0, device="tpu") - 2
    m = torch_tpu.metrics()
    action(t)
    assert delta(m, "fused_flush_" + reason) == 1


def test_data_dependent_ops_flush_when_dynamic_shapes_are_off(run_python):
    # Fused mode keeps nonzero's, masked_select's and unique's counts on the
    # device; with TORCH_TPU_DYNAMIC=off it reads them, one flush each.
    code = (
        "import torch, torch_tpu\n"
        "torch_tpu.set_eager_mode('fused')\n"
        "t = torch.arange(6.0, device='tpu') - 2\n"
        "torch.unique(t.view(3, 2), dim=0); torch.nonzero(t); torch.masked_select(t, t > 0)\n"
        "print(torch_tpu.metrics().get('fused_flush_data_dependent', 0))\n"
    )
    for dynamic, flushes in (("off", "3"), ("marked", "0")):
        r = run_python(code, TORCH_TPU_DYNAMIC=dynamic)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[-1] == flushes, (dynamic, r.stdout)


def test_mode_switch_flushes(fused):
    t = torch.arange(6.0, device="tpu") * 3
    m = torch_tpu.metrics()
    with torch_tpu.set_eager_mode("strict"):
        assert delta(m, "fused_flush_mode_switch") == 1
        assert t.cpu().tolist() == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]


def test_an_op_without_a_rule_flushes_and_falls_back(fused):
    x = torch.tensor([1, 3, 3, 0, 5]).to("tpu") * 2
    m = torch_tpu.metrics()
    with warnings.catch_warnings():  # the fallback's warning (once per op and process)
        warnings.simplefilter("ignore")
        y = torch.bincount(x)  # no rule: the CPU fallback reads x
    assert delta(m, "fused_flush_fallback") == 1
    assert delta(m, "fallback::aten::bincount") == 1
    assert_same(y, torch.bincount(x.cpu()))


def test_window_limit(run_python):
    code = """
import torch, torch_tpu
torch_tpu.set_eager_mode("fused")
x = torch.ones(3).to("tpu")  # copied: no op recorded before the adds
for _ in range(10):
    x = x + 1
print(x.cpu().tolist(), torch_tpu.metrics()["fused_flush_window_limit"], torch_tpu.metrics()["fused_ops_max"])
"""
    r = run_python(code, TORCH_TPU_FUSED_WINDOW="4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[11.0,", "11.0,", "11.0]", "2", "4"]
    r = run_python(code, TORCH_TPU_FUSED_WINDOW="zero")
    assert r.returncode != 0 and "TORCH_TPU_FUSED_WINDOW='zero'" in r.stderr


def test_env_selects_fused_mode_and_exit_flushes(run_python):
    r = run_python(
        "import torch, torch_tpu\nprint(torch_tpu.get_eager_mode())\nx = torch.ones(2, device='tpu') + 1\n",
        TORCH_TPU_EAGER_MODE="fused",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "fused"


def test_device_check_names_the_op_and_where_it_was_called(run_python):
    code = """
import torch, torch_tpu
torch_tpu.set_eager_mode("fused")
x = torch.randn(4, 3, device="tpu")
def gather_rows(x):
    return x[torch.tensor([0, 9], device="tpu")]
y = gather_rows(x) * 2
try:
    y.cpu()
except IndexError as e:
    print("ERROR:", e)
print("usable:", (x.sum() * 0).item())
"""
    r = run_python(code, TORCH_TPU_FUSED_DEBUG="1")
    assert r.returncode == 0, r.stderr
    assert "index is out of bounds" in r.stdout and "aten::index.Tensor" in r.stdout
    assert "gather_rows" in r.stdout  # the Python frame that recorded the op
    assert "usable: 0.0" in r.stdout


def test_a_windows_checks_leave_it_as_one_array_and_name_the_op_that_failed(fused):
    x = torch.randn(4, 3, device="tpu")
    ok, bad = torch.tensor([0, 3], device="tpu"), torch.tensor([1, 9], device="tpu")
    expected = (x.cpu()[[0, 3]] * 3).sum()
    before = torch_tpu.metrics()
    y = (x[ok] + torch.index_select(x, 0, ok) + F.embedding(ok, x)).sum()  # three ops with bounds checks
    torch.testing.assert_close(y.cpu(), expected)
    assert delta(before, "fused_flushes") == 1
    assert delta(before, "transfers_to_host") == 2  # the value, and the three ops' check flags in one copy
    z = x[ok] + torch.index_select(x, 0, bad) * 2  # the second checked op of the window fails
    with pytest.raises(IndexError, match="aten::index_select"):
        z.cpu()
    assert (x.sum() * 0).item() == 0  # the process stays usable


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
        )

    def forward(self, x):
        return self.net(x)


def train(device, steps, mode=None, opt_cls=torch.optim.AdamW):
    torch.manual_seed(0)
    model = MLP().to(device)
    opt = opt_cls(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    x, y = torch.randn(16, 8).to(device), torch.randint(0, 4, (16,)).to(device)
    losses, compiles = [], []
    train.outputs = []  # each step's window outputs (Fused mode)
    for _ in range(steps):
        before = torch_tpu.metrics().get("fused_outputs", 0)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
        if mode:
            compiles.append(torch_tpu.metrics().get("fused_window_compiles", 0))
            train.outputs.append(torch_tpu.metrics().get("fused_outputs", 0) - before)
    return torch.stack([loss.cpu() for loss in losses]), [p.detach().cpu() for p in model.parameters()], compiles


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_steady_training_loop_compiles_nothing_after_warmup(fused, opt_cls):
    with torch_tpu.set_fallback("error"):
        losses, params, compiles = train("tpu", 8, mode="fused", opt_cls=opt_cls)
    outputs = train.outputs
    cpu_losses, cpu_params, _ = train("cpu", 8, opt_cls=opt_cls)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for p, q in zip(params, cpu_params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    m = torch_tpu.metrics()
    # One window per step (the optimizer step flushes). Step 2 compiles anew
    # (optimizer state exists, the changing learning rate becomes an input);
    # from step 3 on every window is found in the cache.
    assert m["fused_flush_optimizer_step"] == 8
    assert compiles[1] == compiles[-1], compiles
    assert m["fused_window_hits"] >= 6  # 7 when an earlier test made the scalars inputs already
    assert m.get("fused_recompiles", 0) == 0, m
    # The parameters' old buffers are donated: updated in place, not copied.
    assert m["fused_donated_buffers"] >= len(params) * 7, m
    # A window's outputs are what the step keeps: the parameters, their
    # gradients and AdamW's two moments, and the loss; not the parameters'
    # values between the weight decay and the update.
    per_parameter = 4 if opt_cls is torch.optim.AdamW else 2
    assert outputs[-1] == per_parameter * len(params) + 1, outputs


def test_second_process_loads_fused_windows_from_disk(run_python, tmp_path):
    code = """
import torch, torch_tpu
torch_tpu.set_eager_mode("fused")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4).to("tpu"), torch.randn(16, 1).to("tpu")
for _ in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
m = torch_tpu.metrics()
print(loss.item(), m.get("compiles", 0), m.get("fused_window_compiles", 0), m.get("disk_cache_hits", 0))
"""
    cold = run_python(code, TORCH_TPU_CACHE_DIR=str(tmp_path))
    warm = run_python(code, TORCH_TPU_CACHE_DIR=str(tmp_path))
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    cold_loss, cold_compiles, windows, _ = cold.stdout.split()
    warm_loss, warm_compiles, _, warm_hits = warm.stdout.split()
    assert warm_loss == cold_loss
    assert int(cold_compiles) >= int(windows) >= 1
    assert int(warm_compiles) == 0 and int(warm_hits) >= int(windows)


def test_scalars_that_happen_to_be_equal_keep_the_windows_program(fused):
    """Scalar inputs are kept by value and shared between ops; a window still
    takes each read as its own input, so two scalars that are equal in one step
    and differ in the next do not make a new program."""
    x = torch.arange(6.0).to("tpu")
    got = []
    for a, b in [(0.1, 0.2), (0.3, 0.4), (0.5, 0.5), (0.6, 0.7)]:
        got.append((x * a + x * b).cpu())
        if a == 0.1:
            compiles = torch_tpu.metrics().get("fused_window_compiles", 0)
    assert torch_tpu.metrics().get("fused_window_compiles", 0) == compiles
    for (a, b), g in zip([(0.1, 0.2), (0.3, 0.4), (0.5, 0.5), (0.6, 0.7)], got, strict=True):
        torch.testing.assert_close(g, torch.arange(6.0) * a + torch.arange(6.0) * b)
