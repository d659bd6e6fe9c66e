"""benchmarks/scaling_model.py: the fake-PG recorder and the cost models (fast; no device)."""

import importlib.util
import math
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "scaling_model", os.path.join(HERE, "..", "..", "benchmarks", "scaling_model.py")
)
sm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm)

TINY = sm.LlamaConfig(64, 2, 4, 2, 128, 256, tied=False)


def parameters_of(c):
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in sm.Llama(c).parameters())


def test_parameter_count_matches_the_module():
    for c in (TINY, sm.LlamaConfig(64, 2, 4, 2, 128, 256, tied=True)):
        assert sm.parameter_count(c) == parameters_of(c)


@pytest.mark.parametrize("world", [8, 64])
def test_ddp_all_reduces_every_gradient_once(world):
    calls = sm.record(TINY, "ddp", world, bucket_mb=0.05, batch=2, seq=16)
    assert {(c.phase, c.op, c.dtype, c.group) for c in calls} == {("backward", "all_reduce", "float32", world)}
    assert sum(c.nbytes for c in calls) == 4 * parameters_of(TINY)
    assert len(calls) > 1  # several buckets, each ready at a backward position
    assert all(0 <= c.ready <= TINY.layers + 1 for c in calls)


def test_fsdp2_gathers_bf16_shards_and_reduce_scatters_fp32():
    world = 8
    calls = sm.record(TINY, "fsdp2", world, batch=2, seq=16)
    n = parameters_of(TINY)
    gathered = [c for c in calls if c.op == "all_gather"]
    forward = sum(c.nbytes for c in gathered if c.phase == "forward")
    # every parameter once in forward, in bf16, a shard per rank (padded up to a multiple of the world)
    assert 2 * n / world <= forward <= 2 * (n + world * 16) / world
    assert {c.dtype for c in gathered} == {"bfloat16"}
    scattered = [c for c in calls if c.op == "reduce_scatter"]
    assert len(scattered) == TINY.layers + 1 and {c.dtype for c in scattered} == {"float32"}
    assert 4 * n <= sum(c.nbytes for c in scattered) <= 4 * (n + world * 16)


def test_hsdp_all_reduces_over_the_replicate_dimension():
    calls = sm.record(TINY, "hsdp", 2 * sm.SLICE, batch=2, seq=16)
    replicas = [c for c in calls if c.dim == "replicate"]
    assert replicas and {(c.op, c.group) for c in replicas} == {("all_reduce", 2)}
    assert {c.group for c in calls if c.dim == "shard"} == {sm.SLICE}


def test_ring_all_reduce_formula():
    n, p, link, alpha = 1e9, 8, 100e9, 1e-6
    expected = 2 * (p - 1) / p * n / (2 * link) + 2 * (p - 1) * alpha
    assert math.isclose(sm.ring_time("all_reduce", n, p, link, alpha), expected)
    net = sm.Network("ring", sm.V5P, "ring")
    # all_gather's bytes in are one shard: the whole buffer is p of them
    assert math.isclose(
        sm.collective_time(net, "all_gather", n / p, p, "world"),
        (p - 1) / p * n / (2 * sm.V5P.link) + (p - 1) * sm.ALPHA_ICI,
    )


def test_torus_shapes():
    assert sm.torus_shape(8192, 3) == [16, 16, 32]
    assert sm.torus_shape(512, 3) == [8, 8, 8]
    assert math.prod(sm.torus_shape(8192, 2)) == 8192


def test_overlap_simulation():
    # comm that fits under the compute after it is hidden; the rest is exposed
    tasks = [sm.Task("compute", 1.0), sm.Task("comm", 0.5, after=(0,)), sm.Task("compute", 1.0)]
    assert sm.simulate(tasks) == 2.0
    tasks = [sm.Task("compute", 1.0), sm.Task("comm", 3.0, after=(0,)), sm.Task("compute", 1.0)]
    assert sm.simulate(tasks) == 4.0


def test_ring_efficiency_does_not_rise_with_world_size():
    flops = sm.count_flops(TINY, batch=2, seq=16)
    calls = sm.record(TINY, "ddp", 8, bucket_mb=0.05, batch=2, seq=16)
    net = sm.Network("ring", sm.V5P, "ring")
    effs = []
    for w in sm.WORLD_SIZES:
        at_w = [sm.Collective(**{**vars(c), "group": w}) for c in calls]
        effs.append(sm.efficiency("ddp", at_w, flops, net, w)["efficiency"])
    assert all(a >= b for a, b in zip(effs, effs[1:], strict=False)) and effs[-1] < effs[0]
