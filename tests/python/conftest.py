import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# A fresh persistent compilation cache for the session: counts of compiles stay
# what each test expects, and a user's ~/.cache/torch_tpu is left alone.
os.environ["TORCH_TPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_tpu_test_cache_")
atexit.register(shutil.rmtree, os.environ["TORCH_TPU_CACHE_DIR"], ignore_errors=True)

import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, whatever ran before it:
    a failure reproduces when the test is run alone."""
    torch.manual_seed(0)


@pytest.fixture
def static_shapes():
    """TORCH_TPU_DYNAMIC=marked for one test: sizes that change compile a
    program each (tests of recompile diagnostics vary a size on purpose)."""
    import torch_tpu

    previous = torch_tpu._C._set_dynamic("marked")
    yield
    torch_tpu._C._set_dynamic(previous)


@pytest.fixture(autouse=True)
def _fresh_auto_bounds():
    """Under TORCH_TPU_DYNAMIC=auto, the sizes earlier tests copied bound no
    class of copies here (as in a fresh process): program counts stay each test's own."""
    import torch_tpu

    torch_tpu._C._forget_auto_bounds()


@pytest.fixture
def run_python():
    """Runs a snippet in a fresh interpreter (for errors that happen at runtime start)."""

    def run(code: str, **env):
        full_env = {**os.environ, **env}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)

    return run


def assert_same(tpu_result, cpu_result, **tol):
    assert tpu_result.device.type == "tpu"
    assert tpu_result.dtype == cpu_result.dtype, (tpu_result.dtype, cpu_result.dtype)
    assert tpu_result.shape == cpu_result.shape, (tpu_result.shape, cpu_result.shape)
    torch.testing.assert_close(tpu_result.cpu(), cpu_result, **tol)


def compare_fn(fn, *inputs, tol=None, grad_args=None):
    """fn on CPU and on tpu with the CPU fallback off: outputs compared, then the
    grads of the float inputs (or of the inputs numbered in grad_args)."""
    import torch_tpu

    tol = tol or {}
    cpu_in = [
        x.detach().clone().requires_grad_(x.is_floating_point() if grad_args is None else i in grad_args)
        for i, x in enumerate(inputs)
    ]
    with torch_tpu.set_fallback("error"):
        tpu_in = [x.detach().to("tpu").requires_grad_(x.requires_grad) for x in cpu_in]
        out_t, out_c = fn(*tpu_in), fn(*cpu_in)
        assert_same(out_t, out_c, **tol)
        if out_c.requires_grad:
            g = torch.rand_like(out_c)
            out_c.backward(g)
            out_t.backward(g.to("tpu"))
            for a, b in zip(tpu_in, cpu_in, strict=True):
                if b.grad is not None:
                    assert_same(a.grad, b.grad, **tol)


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_opinfo")
    if module is not None and any(s["passed"] or s["failed"] or s["uncovered"] for s in module.SUMMARY.values()):
        for line in module.pytest_sessionfinish_summary().splitlines():
            terminalreporter.write_line(line)
    for name in ("test_modules", "test_census"):
        module = sys.modules.get(name)
        if module is not None:
            for line in module.summary_lines():
                terminalreporter.write_line(line)


@pytest.fixture
def fused():
    """Fused eager mode for the test, from a synchronized device and zeroed metrics."""
    import torch_tpu

    torch.tpu.synchronize()
    with torch_tpu.set_eager_mode("fused"):
        torch_tpu.reset_metrics()
        yield
    torch.tpu.synchronize()


def metric_delta(before: dict, key: str) -> int:
    """How much metric `key` grew since the metrics snapshot `before`."""
    import torch_tpu

    return torch_tpu.metrics().get(key, 0) - before.get(key, 0)
