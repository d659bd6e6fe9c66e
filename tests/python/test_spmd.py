"""SPMD through XLA's partitioner: tensors laid over a mesh of the CPU plugin's
devices with torch_tpu.distributed.mark_sharding make a torch.compile graph one
program partitioned over them (XLA inserts the collectives), equal to the
unsharded run, forward and backward; bad annotations raise naming what is wrong."""

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

import torch_tpu
from torch_tpu.distributed import mark_sharding

MESH = [[0, 1], [2, 3]]  # 2 x 2: mesh dim 0 for data, mesh dim 1 for tensor parallelism


def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def attention(x, wq, wk, wv, wo, heads):
    b, s, d = x.shape
    q, k, v = ((x @ w).view(b, s, heads, -1).transpose(1, 2) for w in (wq, wk, wv))
    scores = (q @ k.transpose(-1, -2) / (d // heads) ** 0.5).softmax(-1)
    return x + (scores @ v).transpose(1, 2).reshape(b, s, d) @ wo


def launches():
    return torch_tpu.metrics().get("spmd_graph_launches", 0)


def run(fn, tensors, placements, *extra):
    """fn over CPU copies and over tpu copies marked by `placements` (None:
    unmarked), forward and backward; returns both outputs and gradients."""
    cpu = [t.clone().requires_grad_() for t in tensors]
    want = fn(*cpu, *extra)
    want.square().sum().backward()
    tpu = []
    for t, p in zip(tensors, placements, strict=True):
        t = t.to("tpu")
        if p is not None:
            mark_sharding(t, MESH, p)
        tpu.append(t.requires_grad_())
    before = launches()
    got = torch.compile(fn, backend="tpu", fullgraph=True)(*tpu, *extra)
    forward = launches() - before
    got.square().sum().backward()
    return (got, want), [(t.grad.cpu(), c.grad) for t, c in zip(tpu, cpu, strict=True)], forward


@pytest.mark.parametrize(
    "placements",
    [
        [[Shard(0), Replicate()], [Replicate(), Shard(1)], [Replicate(), Shard(0)]],  # data x tensor parallel
        [[Shard(0), Shard(1)], None, None],  # one input cut two ways; the weights whole
        [None, [Shard(0), Shard(1)], [Shard(1), Shard(0)]],  # weights cut over both mesh dims
        [[Shard(0), Shard(0)], [Shard(1), Replicate()], None],  # one dim cut by both mesh dims, outer first
    ],
)
def test_sharded_mlp_equals_the_unsharded_run(placements):
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(8, 16, generator=g), torch.randn(16, 32, generator=g), torch.randn(32, 16, generator=g)
    (got, want), grads, forward = run(mlp, [x, w1, w2], placements)
    assert forward == 1  # one program over the 4 devices
    assert got.device == torch.device("tpu:0")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for g_tpu, g_cpu in grads:
        torch.testing.assert_close(g_tpu, g_cpu, rtol=1e-4, atol=1e-4)


def test_sharded_attention_block_equals_the_unsharded_run():
    g = torch.Generator().manual_seed(1)
    d, heads = 16, 4
    x = torch.randn(4, 6, d, generator=g)
    weights = [torch.randn(d, d, generator=g) / 4 for _ in range(4)]
    heads_split = [Replicate(), Shard(1)]  # q, k, v: heads over mesh dim 1
    placements = [[Shard(0), Replicate()], heads_split, heads_split, heads_split, [Replicate(), Shard(0)]]
    (got, want), grads, forward = run(attention, [x, *weights], placements, heads)
    assert forward == 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for g_tpu, g_cpu in grads:
        torch.testing.assert_close(g_tpu, g_cpu, rtol=1e-4, atol=1e-4)


def test_bad_annotations_raise_naming_what_is_wrong():
    t = torch.ones(6, 4, device="tpu")
    with pytest.raises(ValueError, match=r"dim 0 of shape \[6, 4\] does not split evenly into 4 pieces"):
        mark_sharding(t, [0, 1, 2, 3], [Shard(0)])
    with pytest.raises(ValueError, match="needs one placement per dimension"):
        mark_sharding(t, MESH, [Shard(0)])
    with pytest.raises(ValueError, match="must be distinct tpu indices below"):
        mark_sharding(t, [0, 0], [Shard(1)])
    with pytest.raises(ValueError, match="expected a tensor on tpu"):
        mark_sharding(torch.ones(4), [0, 1], [Shard(0)])
    with pytest.raises(ValueError, match="no such dim"):
        mark_sharding(t, [0, 1], [Shard(2)])
    a, b = mark_sharding(torch.ones(4, device="tpu"), [0, 1], [Shard(0)]), torch.ones(4, device="tpu")
    mark_sharding(b, [2, 3], [Shard(0)])
    with pytest.raises(ValueError, match="marked over different meshes"):
        torch.compile(lambda a, b: a + b, backend="tpu")(a, b)
    assert (torch.ones(3, device="tpu") + 1).cpu().tolist() == [2.0, 2.0, 2.0]  # still usable


@pytest.mark.parametrize("mesh", [[2, 3], [[3, 2], [1, 0]]])
def test_any_devices_in_any_order(mesh):
    """A mesh that leaves out the inputs' device, or lists the devices in
    another order: pieces go to the devices the mesh names, outputs come back
    to the inputs' device."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    xt, wt = x.to("tpu"), w.to("tpu")
    rows = [Shard(0)] * (2 if isinstance(mesh[0], list) else 1)
    mark_sharding(xt, mesh, rows)
    mark_sharding(wt, mesh, [Replicate()] * len(rows))
    before = launches()
    got = torch.compile(lambda a, b: (a @ b).tanh(), backend="tpu")(xt, wt)
    assert launches() - before == 1 and got.device == torch.device("tpu:0")
    torch.testing.assert_close(got.cpu(), (x @ w).tanh(), rtol=1e-5, atol=1e-5)


def test_an_input_the_graph_overwrites_is_written_back():
    """An in-place update inside the SPMD graph (a running statistic) lands in
    the input, as on one device."""

    def update(x, stat):
        stat.mul_(0.5).add_(x.sum(0))
        return x * stat

    g = torch.Generator().manual_seed(3)
    x, stat = torch.randn(8, 4, generator=g), torch.randn(4, generator=g)
    xt, st = x.to("tpu"), stat.to("tpu")
    mark_sharding(xt, MESH, [Shard(0), Replicate()])
    mark_sharding(st, MESH, [Replicate(), Shard(0)])
    before = launches()
    got = torch.compile(update, backend="tpu")(xt, st)
    want = update(x, stat)
    assert launches() - before == 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st.cpu(), stat, rtol=1e-5, atol=1e-5)


def test_a_device_mesh_of_process_ranks_is_refused(monkeypatch):
    """Ranks that are processes (host staging, as under torchrun) each have one
    device: a DeviceMesh of them names no devices of this process."""
    from torch.distributed.device_mesh import init_device_mesh

    from torch_tpu.distributed import run_threads

    monkeypatch.setenv("TORCH_TPU_COLLECTIVES", "host")

    def body(rank):
        mesh = init_device_mesh("tpu", (2,))
        with pytest.raises(ValueError, match="ranks are processes"):
            mark_sharding(torch.ones(4, device="tpu"), mesh, [Shard(0)])

    run_threads(body, world_size=2)
