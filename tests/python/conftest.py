import os
import subprocess
import sys

import pytest
import torch


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


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_opinfo")
    if module is not None and (module.SUMMARY["passed"] or module.SUMMARY["failed"]):
        terminalreporter.write_line(module.pytest_sessionfinish_summary())
