"""A fused RMSNorm written in Pallas, used inside a PyTorch model on "tpu".

The kernel is a Pallas kernel (Mosaic on TPU, Triton on GPU, interpreted on
the CPU plugin) with its backward in jax.numpy through jax.custom_vjp. The
model trains a few steps in Strict, Fused and torch.compile, and each run is
checked against the same model with PyTorch's own RMSNorm on the CPU; a step
is timed against the PyTorch version on tpu.

    python examples/jax_kernel.py
"""

import time

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import torch_tpu

EPS = 1e-6
INTERPRET = torch.tpu.get_device_properties(0).platform == "cpu"


def rms_kernel(x_ref, w_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w_ref[...]


@jax.custom_vjp
def rms_norm(x, w):
    return pl.pallas_call(rms_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET)(x, w)


def rms_norm_fwd(x, w):
    return rms_norm(x, w), (x, w)


def rms_norm_bwd(residuals, g):
    x, w = residuals
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    gw = g * w
    gx = r * gw - x * r**3 * jnp.mean(gw * x, axis=-1, keepdims=True)
    return gx, jnp.sum(g * x * r, axis=tuple(range(x.ndim - 1)))


rms_norm.defvjp(rms_norm_fwd, rms_norm_bwd)
pallas_rms_norm = torch_tpu.pallas.custom_kernel(rms_norm, name="examples::rms_norm")


class Model(torch.nn.Module):
    def __init__(self, pallas: bool):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 10)
        self.norm = torch.nn.RMSNorm(256, eps=EPS)
        self.pallas = pallas

    def forward(self, x):
        h = torch.relu(self.up(x))
        h = pallas_rms_norm(h, self.norm.weight) if self.pallas else self.norm(h)
        return self.down(h)


def train(model, device, steps=5, compiled=False):
    torch.manual_seed(0)
    data = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(steps)]
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    run = torch.compile(step, backend="tpu") if compiled else step
    losses, times = [], []
    for x, y in data:
        t0 = time.perf_counter()
        loss = run(x.to(device), y.to(device))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return losses, sorted(times)[len(times) // 2] * 1e3


def main():
    torch.manual_seed(1)
    initial = Model(pallas=False).state_dict()

    def model(pallas):
        m = Model(pallas)
        m.load_state_dict(initial)
        return m

    cpu_losses, _ = train(model(False), "cpu")
    for name, mode, compiled in (("strict", "strict", False), ("fused", "fused", False), ("compile", "strict", True)):
        with torch_tpu.set_eager_mode(mode):
            losses, ms = train(model(True), "tpu", compiled=compiled)
            _, torch_ms = train(model(False), "tpu", compiled=compiled)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-4)
        print(
            f"{name:8} losses match CPU; median step {ms:6.1f} ms with the Pallas RMSNorm, "
            f"{torch_ms:6.1f} ms with PyTorch's"
        )


if __name__ == "__main__":
    main()
