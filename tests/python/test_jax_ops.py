"""Kernels written in JAX (torch_tpu.jax_op, torch_tpu.pallas): every eager
mode, Fused windows, torch.compile, autograd, pytrees, static arguments, the
disk cache, and the refusals (an unknown custom call, JAX missing)."""

import itertools

import pytest
import torch
from conftest import metric_delta

import torch_tpu

jax = pytest.importorskip("jax", reason="the jax extra is installed by make test (Makefile PINNED)")
jnp = jax.numpy

_names = itertools.count()


def op_of(fn, **kw):
    """A fresh op name per use: an op name is defined once per process."""
    return torch_tpu.jax_op(f"jax_test::op{next(_names)}", fn, **kw)


def sin_scale(x, y):
    return {"s": jnp.sin(x) * y, "m": jnp.sum(x @ y.T)}


def sin_scale_torch(x, y):
    return {"s": torch.sin(x) * y, "m": (x @ y.T).sum()}


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_pytree_matches_torch_in_every_mode(mode):
    op = op_of(sin_scale)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ref = sin_scale_torch(x, y)
    with torch_tpu.set_eager_mode(mode):
        out = op(x.to("tpu"), y.to("tpu"))
        assert set(out) == {"s", "m"} and out["s"].device.type == "tpu"
        torch.testing.assert_close(out["s"].cpu(), ref["s"])
        torch.testing.assert_close(out["m"].cpu(), ref["m"])
    # CPU tensors run the same function through JAX on the CPU.
    torch.testing.assert_close(op(x, y)["s"], ref["s"])


def test_fused_window_holds_the_kernel_and_its_neighbours(fused):
    op = op_of(lambda x: jnp.tanh(x) * 3)
    x = torch.randn(16, 8)
    t = x.to("tpu")
    before = torch_tpu.metrics()
    out = (op(t * 2) + 1).sum(0)
    result = out.cpu()
    assert metric_delta(before, "fused_flushes") == 1  # mul, the kernel, add and sum: one program
    assert metric_delta(before, "fused_window_compiles") + metric_delta(before, "fused_window_hits") == 1
    torch.testing.assert_close(result, (torch.tanh(x * 2) * 3 + 1).sum(0))


def test_the_same_kernel_twice_in_one_window(fused):
    op = op_of(lambda x: x * x + 1)
    t = torch.randn(5).to("tpu")
    out = op(op(t))  # one function in the window's module, called twice
    torch.testing.assert_close(out.cpu(), (t.cpu() ** 2 + 1) ** 2 + 1)


def test_static_arguments_and_keywords():
    op = op_of(lambda x, n, *, scale: jnp.power(x, n) * scale, static_argnums=(1,))
    x = torch.rand(4) + 0.5
    t = x.to("tpu")
    torch.testing.assert_close(op(t, 2, scale=3.0).cpu(), x**2 * 3)
    torch.testing.assert_close(op(t, 3, scale=0.5).cpu(), x**3 * 0.5)
    with pytest.raises(TypeError, match="hashable"):
        op(t, [2], scale=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool])
def test_dtypes_keep_their_width(dtype):
    op = op_of(lambda x: (x, jnp.zeros_like(x)))
    x = (torch.randn(6) * 100).to(dtype)
    out, zero = op(x.to("tpu"))
    assert out.dtype == dtype and zero.dtype == dtype
    torch.testing.assert_close(out.cpu(), x)


def test_autograd_matches_torch():
    op = op_of(sin_scale)
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    xt, yt = x.detach().to("tpu").requires_grad_(), y.detach().to("tpu").requires_grad_()
    out = op(xt, yt)
    (out["s"].sum() + out["m"]).backward()
    ref = sin_scale_torch(x, y)
    (ref["s"].sum() + ref["m"]).backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    torch.testing.assert_close(yt.grad.cpu(), y.grad)


def test_gradcheck_float64():
    op = op_of(lambda x, w: jnp.tanh(x @ w) * x.sum())
    x = torch.randn(3, 4, dtype=torch.float64).to("tpu").requires_grad_()
    w = torch.randn(4, 2, dtype=torch.float64).to("tpu").requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: op(a, b), (x, w), eps=1e-6, atol=1e-5)


def test_custom_vjp_rule_is_used():
    @jax.custom_vjp
    def clip_grad(x):
        return x * 2

    clip_grad.defvjp(lambda x: (x * 2, None), lambda _, g: (jnp.clip(g, -1.0, 1.0) * 0 + 7.0,))
    op = op_of(clip_grad)
    x = torch.randn(4).to("tpu").requires_grad_()
    op(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((4,), 7.0))


def test_integer_output_and_input_take_no_gradient():
    op = op_of(lambda x, idx: (x[idx] * 2, jnp.argmax(x)))
    x = torch.randn(5).to("tpu").requires_grad_()
    idx = torch.tensor([0, 3]).to("tpu")
    picked, arg = op(x, idx)
    assert not arg.requires_grad
    picked.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([2.0, 0, 0, 2.0, 0]))


def test_compile_fullgraph_forward_and_backward(monkeypatch):
    import torch_tpu._compile as backend

    splits = []
    split = backend._split
    monkeypatch.setattr(backend, "_split", lambda gm, name, eager: splits.append(eager) or split(gm, name, eager))
    op = op_of(lambda x, w: jnp.tanh(x @ w))

    def step(x, w):
        return (op(x * 2, w) + 1).pow(2).mean()

    x, w = torch.randn(8, 4), torch.randn(4, 3, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    loss = compiled(x.to("tpu"), wt)
    loss.backward()
    ref = (torch.tanh((x * 2) @ w) + 1).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach())
    torch.testing.assert_close(wt.grad.cpu(), w.grad)
    assert splits == []  # the kernel is lowered into the graphs' programs, not run between them


def test_pallas_interpret_kernel():
    from jax.experimental import pallas as pl

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...] * 2

    @torch_tpu.pallas.custom_kernel(name="jax_test::pallas_add")
    def pallas_add(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)

    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(pallas_add(x.to("tpu"), y.to("tpu")).cpu(), x + 2 * y)


def test_unknown_custom_call_is_refused_and_the_process_goes_on():
    op = op_of(lambda a: jnp.linalg.inv(a))  # CPU jaxlib lowers it to LAPACK FFI targets the plugin lacks
    with pytest.raises(RuntimeError, match=r"custom_call @lapack_\w+.*cannot run"):
        op(torch.randn(3, 3).to("tpu"))
    assert (torch.ones(2).to("tpu") + 1).cpu().tolist() == [2.0, 2.0]


def test_a_shape_error_names_the_op_and_inputs():
    op = op_of(lambda a, b: a @ b)
    with pytest.raises(RuntimeError, match=r"jax_test::op\d+: JAX could not lower .*float32\[3, 3\], float32\[4, 4\]"):
        op(torch.randn(3, 3).to("tpu"), torch.randn(4, 4).to("tpu"))


def test_bad_uses():
    with pytest.raises(ValueError, match="namespace::name"):
        torch_tpu.jax_op("noname", lambda x: x)
    torch_tpu.jax_op("jax_test::taken", lambda x: x)
    with pytest.raises(RuntimeError, match="exists already"):
        torch_tpu.jax_op("jax_test::taken", lambda x: x)
    op = op_of(lambda x: x)
    with pytest.raises(ValueError, match="at least one tensor"):
        op(3.0)
    with pytest.raises(RuntimeError, match="several devices"):
        op_of(lambda x, y: x + y)(torch.ones(2), torch.ones(2).to("tpu"))


_SECOND_PROCESS = """
import torch, torch_tpu, jax.numpy as jnp
op = torch_tpu.jax_op("jax_test::cached", lambda x: jnp.cos(x) + 1)
x = torch.arange(4.0)
torch.testing.assert_close(op(x.to("tpu")).cpu(), torch.cos(x) + 1)
m = torch_tpu.metrics()
print("compiles", m.get("compiles", 0), "disk", m.get("disk_cache_hits", 0) + m.get("disk_index_hits", 0))
"""


def test_second_process_loads_the_kernel_from_disk(run_python, tmp_path):
    env = {"TORCH_TPU_CACHE_DIR": str(tmp_path)}
    first = run_python(_SECOND_PROCESS, **env)
    assert first.returncode == 0, first.stderr
    second = run_python(_SECOND_PROCESS, **env)
    assert second.returncode == 0, second.stderr
    words = second.stdout.split()
    assert words[1] == "0" and int(words[3]) >= 1, second.stdout


def test_without_jax_a_clear_error(run_python):
    code = (
        "import sys; sys.modules['jax'] = None\n"
        "import torch, torch_tpu\n"
        "op = torch_tpu.jax_op('jax_test::nojax', lambda x: x)\n"
        "op(torch.ones(2).to('tpu'))\n"
    )
    r = run_python(code)
    assert r.returncode != 0 and "pip install 'torch_tpu[jax]'" in r.stderr, r.stderr


def test_example_trains_with_a_pallas_kernel_in_every_mode():
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).parents[2] / "examples" / "jax_kernel.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["strict", "fused", "compile"], r.stdout


# ---- zero-copy interop (torch_tpu/dlpack.py)


def _address(array) -> int:
    return (
        array.__array_interface__["data"][0] if hasattr(array, "__array_interface__") else array.unsafe_buffer_pointer()
    )


def test_tpu_to_jax_and_numpy_in_place():
    x = torch.arange(1024.0).reshape(32, 32)
    t = x.to("tpu") * 1  # a computed buffer, not the upload's
    before = torch_tpu.metrics()
    view = torch_tpu.cpu_view(t)
    a = torch_tpu.to_jax(t)
    assert _address(view) == _address(a)  # both read the tpu tensor's buffer
    assert metric_delta(before, "interop_zero_copy_exports") == 2 and metric_delta(before, "interop_copies") == 0
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 5
    del t, view
    import gc

    gc.collect()  # the producer gone first: the JAX array still holds its buffer
    assert float(a.sum()) == float(x.sum()) and a.dtype == jnp.float32 and a.shape == (32, 32)


def test_jax_to_tpu_in_place_and_the_producer_deleted_first():
    b = jnp.arange(1024, dtype=jnp.float32).reshape(16, 64) * 3
    address = b.unsafe_buffer_pointer()
    before = torch_tpu.metrics()
    t = torch_tpu.from_jax(b)
    assert metric_delta(before, "interop_zero_copy_imports") == 1
    assert _address(torch_tpu.cpu_view(t)) == address
    del b
    import gc

    gc.collect()
    expected = torch.arange(1024.0).reshape(16, 64) * 3
    torch.testing.assert_close((t + 1).cpu(), expected + 1)
    t.mul_(2)  # writes a new buffer: the borrowed memory is never donated or written
    torch.testing.assert_close(t.cpu(), expected * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.float64])
def test_round_trips_keep_values_dtypes_shapes(dtype):
    x = (torch.randn(4, 5, 6) * 10).to(dtype)
    t = x.to("tpu")
    back = torch_tpu.from_jax(torch_tpu.to_jax(t))
    assert back.dtype == dtype and back.shape == x.shape and back.device.type == "tpu"
    torch.testing.assert_close(back.cpu(), x)
    torch.testing.assert_close(torch.from_dlpack(torch_tpu.to_jax(t)), x)  # tpu -> jax -> torch CPU


def test_views_and_fused_values_export_their_elements(fused):
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    y = (t * 2).t()  # pending in the window: the export flushes it
    torch.testing.assert_close(torch.from_numpy(torch_tpu.cpu_view(y).copy()), (x * 2).t())


def test_unaligned_or_strided_memory_is_copied():
    import numpy as np

    n = np.arange(40, dtype=np.float32)[1:33]  # 4 bytes past an aligned start
    before = torch_tpu.metrics()
    t = torch_tpu.from_dlpack(n)
    assert metric_delta(before, "interop_copies") == 1
    torch.testing.assert_close(t.cpu(), torch.from_numpy(n))
    s = np.arange(64, dtype=np.float32).reshape(8, 8)[:, ::2]
    torch.testing.assert_close(torch_tpu.from_dlpack(s).cpu(), torch.from_numpy(s.copy()))


def test_interop_bad_input():
    with pytest.raises(TypeError, match="needs a tpu tensor"):
        torch_tpu.to_dlpack(torch.ones(2))
    with pytest.raises(TypeError, match="not a DLPack producer"):
        torch_tpu.from_dlpack([1, 2])


def test_numpy_and_jax_take_tpu_tensors_directly():
    import numpy as np

    x = torch.randn(8, 8)
    t = x.to("tpu")
    torch.testing.assert_close(torch.from_numpy(np.from_dlpack(t).copy()), x)
    torch.testing.assert_close(torch.from_numpy(np.array(jax.dlpack.from_dlpack(t))), x)
    assert torch.ones(2).__dlpack_device__() == (1, 0)  # CPU tensors keep PyTorch's own protocol


def test_pallas_kernel_that_cannot_run_here_is_a_clear_error():
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    op = op_of(lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
    with pytest.raises(RuntimeError, match=r"jax_test::op\d+: JAX could not lower the function for platform 'cpu'"):
        op(torch.ones(8, 128).to("tpu"))


def test_views_and_expanded_inputs_are_read_as_their_elements():
    op = op_of(lambda a, b: a * 10 + b)
    x = torch.randn(4, 6)
    b = torch.randn(6)
    t = x.to("tpu")
    torch.testing.assert_close(op(t.t(), b.to("tpu")[:4].expand(6, 4).t().t()).cpu(), x.t() * 10 + b[:4])
    torch.testing.assert_close(op(t[1:, ::2], t[0, ::2]).cpu(), x[1:, ::2] * 10 + x[0, ::2])


def test_a_kernel_whose_module_has_helper_functions_fuses(fused):
    op = op_of(lambda x: jnp.cumsum(x, 0) * 2)  # JAX lowers cumsum to a private helper function
    x = torch.randn(5, 3)
    before = torch_tpu.metrics()
    out = op(x.to("tpu") + 1).cpu()
    assert metric_delta(before, "fused_replays") == 0  # one program, not replayed op by op
    torch.testing.assert_close(out, torch.cumsum(x + 1, 0) * 2)


def test_a_lowering_does_not_keep_its_first_call_tensors():
    import gc
    import weakref

    op = op_of(lambda x, n: x * n, static_argnums=(1,))
    t = torch.randn(64).to("tpu")
    g = torch.randn(64).to("tpu").requires_grad_()
    op(t, 2)
    op(g, 3).sum().backward()
    refs = [weakref.ref(t), weakref.ref(g)]
    del t, g
    gc.collect()
    assert all(r() is None for r in refs)  # the cached lowerings hold static values, not the tensors
