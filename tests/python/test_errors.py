"""Bad input raises a clear Python exception, never a crash, and the process stays usable."""

import pytest
import torch

import torch_tpu

AFTER = "; print('usable', torch.ones(2).add(1).tolist())"


def test_unknown_pjrt_device(run_python):
    code = (
        "import torch\ntry:\n torch.zeros(1, device='tpu')\nexcept RuntimeError as e:\n print('ERR', e)\n" + AFTER[2:]
    )
    r = run_python(code, PJRT_DEVICE="FOO")
    assert r.returncode == 0, r.stderr
    assert "unknown PJRT_DEVICE='FOO'" in r.stdout and "CPU (default), CUDA or TPU" in r.stdout
    assert "usable [2.0, 2.0]" in r.stdout


def test_no_plugin_found_names_every_place_looked(run_python):
    code = (
        "import torch\ntry:\n torch.zeros(1, device='tpu')\nexcept RuntimeError as e:\n print('ERR', e)\n" + AFTER[2:]
    )
    r = run_python(code, PJRT_DEVICE="TPU")
    assert r.returncode == 0, r.stderr
    assert "no PJRT plugin found for PJRT_DEVICE=TPU" in r.stdout
    assert "libtpu/libtpu.so" in r.stdout and "usable" in r.stdout


@pytest.mark.parametrize("path,message", [("/nonexistent/plugin.so", "does not exist"), ("libm.so.6", "GetPjrtApi")])
def test_missing_or_invalid_plugin_file(run_python, path, message):
    if path == "libm.so.6":
        import ctypes.util

        path = "/lib/x86_64-linux-gnu/libm.so.6" if ctypes.util.find_library("m") else path
    code = (
        "import torch\ntry:\n torch.zeros(1, device='tpu')\nexcept RuntimeError as e:\n print('ERR', e)\n" + AFTER[2:]
    )
    r = run_python(code, TORCH_TPU_PJRT_PLUGIN=path)
    assert r.returncode == 0, r.stderr
    assert message in r.stdout, r.stdout
    assert "usable" in r.stdout


def test_malformed_module_raises_plugin_message():
    with pytest.raises(RuntimeError, match="PJRT_Client_Compile failed"):
        torch_tpu._C._compile("module { not stablehlo }")
    assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]


def test_mixing_cpu_and_tpu_tensors():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*tpu:0 and cpu"):
        torch.ones(2, 2, device="tpu") + torch.ones(2, 2)
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]


def test_op_without_lowering_names_the_op_when_fallback_is_off():
    x = torch.ones(3, device="tpu")
    with (
        torch_tpu.set_fallback("error"),
        pytest.raises(NotImplementedError, match="aten::special_airy_ai.*no tpu lowering"),
    ):
        torch.special.airy_ai(x)
    assert torch_tpu.get_fallback() == "cpu"
    assert (x * 2).cpu().tolist() == [2.0, 2.0, 2.0]


def test_unsupported_dtype_is_named():
    with pytest.raises(TypeError, match="torch.float8_e4m3fnuz is not supported on tpu"):
        torch.zeros(2, dtype=torch.float8_e4m3fnuz, device="tpu")


def test_bad_shapes_raise_pytorchs_error():
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):  # CPU's own wording
        torch.ones(3, device="tpu") + torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
        torch.mm(torch.ones(2, 3, device="tpu"), torch.ones(2, 3, device="tpu"))


def test_debug_mode_nan_check_names_op_shapes_and_dtypes():
    x = torch.tensor([-1.0, 2.0], device="tpu")
    before = torch_tpu.get_eager_mode()
    with torch_tpu.set_eager_mode("debug", check_nan=True):
        with pytest.raises(RuntimeError, match=r"aten::log produced NaN or Inf.*float32\[2\]"):
            torch.log(x)
        assert torch.exp(x).cpu().tolist() == pytest.approx([0.36787944, 7.3890561])
    assert torch_tpu.get_eager_mode() == before
    assert torch.isnan(torch.log(x)).cpu().tolist() == [True, False]  # other modes do not check


def test_nan_check_env_var(run_python):
    code = (
        "import torch\ntry:\n torch.log(torch.tensor([-1.0], device='tpu'))\n"
        "except RuntimeError as e:\n print('ERR', str(e).splitlines()[0])\n"
    )
    r = run_python(code, TORCH_TPU_EAGER_MODE="debug", TORCH_TPU_DEBUG_CHECK_NAN="1")
    assert r.returncode == 0, r.stderr
    assert "ERR torch_tpu: aten::log produced NaN or Inf" in r.stdout
