"""A scaling model: weak-scaling efficiency of DDP, FSDP2 and HSDP to 8,192 chips.

    python benchmarks/scaling_model.py [--out DIR] [--no-check-real]

1. Record. The real training step (forward with the loss, backward,
   clip_grad_norm_, AdamW) of a Llama-shaped model runs in this one process
   under PyTorch's fake process group ("fake" backend, FakeStore) at each
   world size, with the model built under FakeTensorMode so nothing is
   allocated. A TorchDispatchMode sees every c10d / _c10d_functional op and
   records op, bytes in, group size, mesh dimension and the phase of the step.
   DDP's reducer calls its process group from C++, past the dispatcher, so DDP
   runs with a comm hook that issues the same all_reduce of each bucket
   through `dist.all_reduce`, where the recorder sees it (and which parameters
   the bucket holds). DDP's bucket assignment does not depend on the world
   size, so DDP is recorded at 8 ranks; FSDP2 and HSDP at every world size
   (their shards and padding do). Models: 1B (d 2048, 16 layers, ffn 8192,
   32/8 heads, vocab 128256, tied embeddings: Llama 3.2 1B's shape) and 8B
   (d 4096, 32 layers, ffn 14336, 32/8 heads, vocab 128256: Llama 3 8B's).
   FSDP2/HSDP: `fully_shard` per block and the root, MixedPrecisionPolicy
   bf16 parameters / fp32 reduction (torchtitan's default). DDP: fp32 grads.
2. FLOPs per chip and step: FlopCounterMode over the same step (matmuls; the
   attention is written out as matmuls, full S x S, not halved for the causal
   mask); per block and forward / backward apart, for the overlap model.
3. Check. The same recorder at world size 2 on a small model of the same
   structure, against a real 2-process torchrun on device "tpu" (host staging
   on this machine's CPU plugin): torch_tpu.metrics()'s collective::<op> and
   collective_bytes::<op> around the steady-state step.
4. Cost. Alpha-beta models of each collective on a ring, a tree, a 2-D torus
   (v5e ICI), a 3-D torus (v5p ICI) and multi-slice (v5p slices over DCN;
   hierarchical collectives, HSDP's replicate dimension on DCN, its shard
   dimension on ICI; and, for contrast, flat rings paced by DCN), and an
   overlap model: a compute stream and one comm stream in issue order (DDP
   buckets launch when their last gradient is ready; FSDP2 all-gathers one
   block ahead, reduce-scatters after each block's backward). Weak scaling:
   fixed per-chip batch; efficiency = compute time / step time. At 8,192
   chips also with 1 sequence per chip (comm is the same, compute 1/4).

Hardware parameters, as published (not measured here):

| chip | peak bf16 | ICI (bidirectional, per chip) | ICI ports | DCN per chip | HBM | source |
|---|---|---|---|---|---|---|
| TPU v5p | 459 TFLOP/s | 1200 GB/s | 6 (3-D torus) | 50 Gbps | 95 GiB | cloud.google.com/tpu/docs/v5p |
| TPU v5e | 197 TFLOP/s | 400 GB/s | 4 (2-D torus) | 25 Gbps (2 x 100 Gbps per 8 chips) | 16 GB | .../docs/v5e |

Assumed (not published): ICI latency 1 us per collective step, DCN latency
10 us per step, 50% MFU, 4 sequences x 4096 tokens per chip.
"""

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

WORLD_SIZES = (8, 64, 512, 4096, 8192)
BUCKETS_MB = (1, 25, 250)  # 25 MB is DDP's default
SLICE = 256  # chips per slice (multi-slice) and HSDP's shard group
BATCH, SEQ = 4, 4096  # per chip
SMALL_BATCH = 1  # the sensitivity table's sequences per chip
MFU = 0.5
ALPHA_ICI = 1e-6  # seconds per collective step; assumed
ALPHA_DCN = 10e-6
HERE = os.path.dirname(os.path.abspath(__file__))


# --- the model ---------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool


MODELS = {
    "1B": LlamaConfig(2048, 16, 32, 8, 8192, 128256, tied=True),
    "8B": LlamaConfig(4096, 32, 32, 8, 14336, 128256, tied=False),
}
SMALL = LlamaConfig(64, 2, 4, 2, 128, 256, tied=False)  # the 2-process check


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, theta: float = 500000.0):
    """Rotary position embedding of x (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    freqs = torch.exp(torch.arange(half, device=x.device, dtype=torch.float32) * (-math.log(theta) / half))
    angles = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.dim // c.heads
        self.wq = nn.Linear(c.dim, c.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * self.head_dim, c.dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = rope(self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2))
        k = rope(self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2))
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        # Grouped-query attention written out as matmuls, so FlopCounterMode counts it on any device.
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        out = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.dim), Attention(c)
        self.mlp_norm = RMSNorm(c.dim)
        self.w1 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens, targets):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def parameter_count(c: LlamaConfig) -> int:
    block = 2 * c.dim + c.dim * c.dim * 2 + 2 * c.dim * (c.dim // c.heads * c.kv_heads) + 3 * c.dim * c.ffn
    return c.vocab * c.dim * (1 if c.tied else 2) + c.layers * block + c.dim


# --- recording ---------------------------------------------------------------

# c10d and functional collectives by the name torch_tpu's metrics use
OPS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
}
# c10d ops whose first argument is the output: their inputs come second
OUTPUT_FIRST = {"_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_", "_reduce_scatter_base_"}
OUTPUT_FIRST |= {"reduce_scatter_", "reduce_scatter_tensor_coalesced_", "alltoall_base_"}


@dataclass
class Collective:
    phase: str  # forward, backward, optimizer
    op: str
    nbytes: int  # bytes in, per chip (as torch_tpu's collective_bytes::<op> counts them)
    group: int
    dim: str  # mesh dimension: world, shard, replicate
    dtype: str
    ready: int | None = None  # DDP: position in backward after which the bucket's gradients are all ready


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


class Recorder(TorchDispatchMode):
    """Records every collective the step issues, with the phase set by the step."""

    def __init__(self, dims: dict[str, str]):
        super().__init__()
        self.dims = dims  # process group name -> mesh dimension
        self.phase = "setup"
        self.calls: list[Collective] = []
        self.host = False  # set while DDP rebuilds its buckets

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if self.host:
            # DDP's bucket rebuild writes and reads the new bucket indices through
            # small int32 tensors' data (and broadcasts them): those run for real.
            tensors = _tensors((args, kwargs))
            new_ints = func is torch.ops.aten.empty.memory_format and kwargs.get("dtype") == torch.int32
            if new_ints or (tensors and not any(isinstance(t, FakeTensor) for t in tensors)):
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
        if func.namespace in ("c10d", "_c10d_functional") and name in OPS:
            self._record(func.namespace, name, args)
        return func(*args, **kwargs)

    def _record(self, namespace: str, name: str, args):
        if namespace == "c10d":
            inputs = _tensors(args[1] if name in OUTPUT_FIRST else args[0])
            pg = next(dist.ProcessGroup.unbox(a) for a in args if _is_process_group(a))
        else:
            inputs = _tensors(args[0])
            pg = dist.distributed_c10d._resolve_process_group(args[-1])
        dim = self.dims.get(pg.group_name, "world")
        if name == "reduce_scatter_":  # a list of inputs per output: one call per output
            inputs = [torch.cat([t.flatten() for t in inputs])]
        for t in inputs:  # coalesced calls count per tensor, as torch_tpu's backend does
            nbytes = t.numel() * t.element_size()
            self.calls.append(Collective(self.phase, OPS[name], nbytes, pg.size(), dim, str(t.dtype)[6:]))

    @contextlib.contextmanager
    def dtensor_reductions(self):
        """Also record the all_reduce DTensor issues inside its handler (clip_grad_norm_'s Partial norm).

        A mode is off while a handler below it runs, so the recorder cannot see
        it: the functional all_reduce that DTensor calls is recorded here."""
        import torch.distributed._functional_collectives as funcol
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        all_reduce = funcol.all_reduce

        def recorded(tensor, reduceOp, group, tag=""):
            if self not in _get_current_dispatch_mode_stack():
                pg = dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(group, tag))
                nbytes = tensor.numel() * tensor.element_size()
                dim = self.dims.get(pg.group_name, "world")
                self.calls.append(Collective(self.phase, "all_reduce", nbytes, pg.size(), dim, str(tensor.dtype)[6:]))
            return all_reduce(tensor, reduceOp, group, tag)

        with mock.patch.object(funcol, "all_reduce", recorded):
            yield


def _is_process_group(a) -> bool:
    return isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type())


def train_step(model, opt, tokens, targets, recorder: Recorder | None = None):
    def phase(name):
        if recorder is not None:
            recorder.phase = name

    phase("forward")
    loss = model(tokens, targets)
    phase("backward")
    loss.backward()
    phase("optimizer")
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def backward_positions(model: Llama) -> dict[int, int]:
    """id(parameter) -> position in backward after which its gradient is final.

    Position 0 is the head (final norm, output), L - i block i, L + 1 the
    embedding (a tied output weight's gradient is final only there)."""
    layers = len(model.layers)
    pos = {id(p): 0 for p in (*model.norm.parameters(), *model.output.parameters())}
    for i, layer in enumerate(model.layers):
        pos.update({id(p): layers - i for p in layer.parameters()})
    pos.update({id(p): layers + 1 for p in model.tok_embeddings.parameters()})
    return pos


def ddp_recording_hook(recorder: Recorder, positions: dict[int, int], world: int):
    """DDP comm hook: the default all_reduce of the bucket, through the dispatcher where the recorder sees it."""

    def hook(_, bucket):
        buffer = bucket.buffer()
        dist.all_reduce(buffer)
        recorder.calls[-1].ready = max(positions[id(p)] for p in bucket.parameters())
        future = torch.futures.Future()
        future.set_result(buffer.div_(world))
        return future

    return hook


def make_mesh(strategy: str, device: str, world: int):
    """FSDP2: one dimension; HSDP: replicate across slices, shard within one; DDP: none."""
    from torch.distributed.device_mesh import init_device_mesh

    if strategy == "ddp":
        return None
    if strategy == "fsdp2":
        return init_device_mesh(device, (world,), mesh_dim_names=("shard",))
    shard = min(world, SLICE)
    return init_device_mesh(device, (world // shard, shard), mesh_dim_names=("replicate", "shard"))


def wrap(model: Llama, strategy: str, mesh, bucket_mb: float = 25.0):
    """The data-parallel model and the process group names of its mesh dimensions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if strategy == "ddp":
        return DistributedDataParallel(model, bucket_cap_mb=bucket_mb), {}
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, {mesh.get_group(d).group_name: d for d in mesh.mesh_dim_names}


@contextlib.contextmanager
def fake_world(world: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def record(c: LlamaConfig, strategy: str, world: int, bucket_mb: float = 25.0, batch=BATCH, seq=SEQ, steps=None):
    """The collectives of one steady-state training step on rank 0 of `world` fake ranks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # DDP's first step reduces everything in one bucket, its second rebuilds
    # the buckets in gradient order: the third is the steady state.
    steps = steps or (3 if strategy == "ddp" else 2)
    lazy = mock.patch("torch.distributed.fsdp._fully_shard._fsdp_param._chunk_with_empty", LazyChunks)
    with fake_world(world), lazy:
        mesh = make_mesh(strategy, "cpu", world)  # outside FakeTensorMode: the mesh reads its ranks
        with FakeTensorMode():
            return _record(c, strategy, world, mesh, bucket_mb, batch, seq, steps)


def _record(c: LlamaConfig, strategy: str, world: int, mesh, bucket_mb: float, batch: int, seq: int, steps: int):
    model = Llama(c)
    positions = backward_positions(model)
    # DDP checks that every rank's parameters have the same shapes by reading their
    # values across ranks; fake tensors have none, and one process has one set.
    with mock.patch("torch.nn.parallel.distributed._verify_param_shape_across_processes"):
        wrapped, dims = wrap(model, strategy, mesh, bucket_mb)
    recorder = Recorder(dims)
    if strategy == "ddp":
        wrapped.register_comm_hook(None, ddp_recording_hook(recorder, positions, world))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, c.vocab, (batch, seq))
    rebuild = contextlib.nullcontext()
    if strategy == "ddp":
        rebuild = mock.patch.object(type(wrapped), "_pre_forward", _host_rebuild(recorder, type(wrapped)._pre_forward))
    with rebuild, recorder.dtensor_reductions():
        for _ in range(steps):
            recorder.calls = []
            with recorder:
                train_step(wrapped, opt, tokens, tokens, recorder)
    return recorder.calls


class LazyChunks(Sequence):
    """FSDP2's _chunk_with_empty (torch.chunk's pieces, then empty ones up to
    num_chunks), each made when read: FSDP2 reads two of them per parameter,
    and making all 8,192 views of a fake tensor costs seconds per parameter."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim

    def __len__(self):
        return self.num_chunks

    def __getitem__(self, i: int) -> torch.Tensor:
        n = self.tensor.size(self.dim)
        size = -(-n // self.num_chunks)
        if i * size >= n:
            return self[0].new_empty(0)
        return self.tensor.narrow(self.dim, i * size, min(size, n - i * size))


def _host_rebuild(recorder: Recorder, pre_forward):
    """DDP's _pre_forward (where it rebuilds its buckets) with the recorder's host flag set."""

    def wrapper(self, *args, **kwargs):
        recorder.host = True
        try:
            return pre_forward(self, *args, **kwargs)
        finally:
            recorder.host = False

    return wrapper


@dataclass
class Flops:
    """FLOPs per chip and step, as FlopCounterMode counts them."""

    total: float
    block_forward: float
    block_backward: float
    head_forward: float  # the root module's (embedding, final norm, output, loss)
    head_backward: float
    layers: int


def count_flops(c: LlamaConfig, batch=BATCH, seq=SEQ) -> Flops:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode():
        model = Llama(c)
        tokens = torch.randint(0, c.vocab, (batch, seq))
        # modules are attributed their backward's FLOPs only where the counter saw their forward
        with FlopCounterMode(display=False) as step:
            model(tokens, tokens).backward()
        with FlopCounterMode(display=False) as forward, torch.no_grad():
            model(tokens, tokens)

    def of(counter, key):
        return sum(counter.get_flop_counts().get(key, {}).values())

    bf, b = of(forward, "Llama.layers.0"), of(step, "Llama.layers.0") - of(forward, "Llama.layers.0")
    f, total = of(forward, "Global"), of(step, "Global")
    return Flops(total, bf, b, f - c.layers * bf, total - f - c.layers * b, c.layers)


# --- the 2-process check -----------------------------------------------------


def small_batch(world: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL.vocab, (2 * world, 32), generator=g)


CHECK_BUCKET_MB = 0.05  # several buckets for the small model
CHECK_STEPS = {"ddp": 3, "fsdp2": 2}


def real_worker(out: str):
    """Under torchrun: each rank runs the small model's steps on "tpu" and writes its metrics' deltas."""
    import torch_tpu

    rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(rank)
    dist.init_process_group("cpu:gloo,tpu:tpu")
    world = dist.get_world_size()
    result = {}
    for strategy, steps in CHECK_STEPS.items():
        torch.manual_seed(0)
        model = Llama(SMALL).to("tpu")
        wrapped, _ = wrap(model, strategy, make_mesh(strategy, "tpu", world), CHECK_BUCKET_MB)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = small_batch(world)[rank * 2 : rank * 2 + 2].to("tpu")
        for _ in range(steps):
            before = torch_tpu.metrics()
            train_step(wrapped, opt, tokens, tokens)
            torch.tpu.synchronize()
            after = torch_tpu.metrics()
        result[strategy] = {
            k: after[k] - before.get(k, 0)
            for k in after
            if k.startswith("collective") and after[k] != before.get(k, 0) and k != "collective::compiled_graph"
        }
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def check_real(timeout: float = 240) -> list[dict]:
    """Rows: per strategy and op, the fake-PG recording at world size 2 beside the real run's metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "metrics.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        cmd += [os.path.abspath(__file__), "--real-worker", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-process run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        ranks = []
        for r in range(2):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
    rows = []
    for strategy, steps in CHECK_STEPS.items():
        calls = record(SMALL, strategy, 2, CHECK_BUCKET_MB, batch=2, seq=32, steps=steps)
        fake = defaultdict(lambda: [0, 0])
        for call in calls:
            fake[call.op][0] += 1
            fake[call.op][1] += call.nbytes
        ops = sorted(set(fake) | {k.split("::")[1] for k in ranks[0][strategy]})
        for op in ops:
            real = [
                (m[strategy].get(f"collective::{op}", 0), m[strategy].get(f"collective_bytes::{op}", 0)) for m in ranks
            ]
            rows.append({"strategy": strategy, "op": op, "fake": tuple(fake[op]), "real": real})
    return rows


# --- cost models -------------------------------------------------------------


@dataclass(frozen=True)
class Chip:
    name: str
    peak: float  # bf16 FLOP/s
    link: float  # bytes/s one way per ICI port
    ports: int
    dcn: float  # bytes/s per chip
    hbm: float  # bytes


# Published figures (see the docstring's table): per-port one-way ICI is the
# bidirectional per-chip figure split over both directions of every port.
V5P = Chip("TPU v5p", 459e12, 1200e9 / 2 / 6, 6, 50e9 / 8, 95 * 2**30)
V5E = Chip("TPU v5e", 197e12, 400e9 / 2 / 4, 4, 2 * 100e9 / 8 / 8, 16e9)


@dataclass(frozen=True)
class Network:
    name: str
    chip: Chip
    kind: str  # ring, tree, torus, multislice, flat
    dims: int = 1
    slice: int = 0


NETWORKS = (
    Network("ring (v5p ICI)", V5P, "ring"),
    Network("tree (v5p ICI)", V5P, "tree"),
    Network("2-D torus (v5e ICI)", V5E, "torus", 2),
    Network("3-D torus (v5p ICI)", V5P, "torus", 3),
    Network(f"multi-slice (v5p, {SLICE}-chip slices + DCN)", V5P, "multislice", 3, SLICE),
    # the same machine with collectives that are not topology-aware: one ring over every chip, paced by DCN
    Network("multi-slice, flat ring over DCN", V5P, "flat", 3, SLICE),
)


def torus_shape(p: int, dims: int) -> list[int]:
    """p chips as a torus of `dims` dimensions, as near a cube as p's divisors allow."""
    shape, rest = [], p
    for left in range(dims, 0, -1):
        target = math.ceil(round(rest ** (1 / left), 9))
        k = max(d for d in range(1, target + 1) if rest % d == 0)
        shape.append(k)
        rest //= k
    return shape


def _alpha_beta(op: str, n: float, p: int, bw: float, alpha: float, steps: int) -> float:
    """n: the whole buffer's bytes; steps: latency terms of one reduce-scatter or all-gather pass."""
    if p == 1:
        return 0.0
    passes = 2 if op == "all_reduce" else 1
    return passes * ((p - 1) / p * n / bw + steps * alpha)


def ring_time(op: str, n: float, p: int, link: float, alpha: float) -> float:
    """Bidirectional ring (half the data each way): 2(p-1)/p n/B + 2(p-1) alpha for all-reduce."""
    return _alpha_beta(op, n, p, 2 * link, alpha, p - 1)


def tree_time(op: str, n: float, p: int, link: float, alpha: float) -> float:
    """Double binary tree all-reduce (2 n/B + 2 log2 p alpha); halving-doubling reduce-scatter / all-gather."""
    if p == 1:
        return 0.0
    steps = math.ceil(math.log2(p))
    if op == "all_reduce":
        return 2 * n / (2 * link) + 2 * steps * alpha
    return _alpha_beta(op, n, p, 2 * link, alpha, steps)


def torus_time(op: str, n: float, p: int, link: float, dims: int, alpha: float) -> float:
    """Bidirectional rings along every torus dimension at once (the buffer split over them): all ports busy."""
    shape = [k for k in torus_shape(p, dims) if k > 1]
    return _alpha_beta(op, n, p, 2 * len(shape) * link, alpha, sum(k - 1 for k in shape))


def collective_time(net: Network, op: str, nbytes_in: float, p: int, dim: str) -> float:
    """Seconds for one collective of `nbytes_in` bytes in per chip over a group of p chips."""
    n = nbytes_in * p if op == "all_gather" else nbytes_in  # the whole buffer
    chip = net.chip
    if net.kind == "ring":
        return ring_time(op, n, p, chip.link, ALPHA_ICI)
    if net.kind == "tree":
        return tree_time(op, n, p, chip.link, ALPHA_ICI)
    if net.kind == "torus":
        return torus_time(op, n, p, chip.link, net.dims, ALPHA_ICI)
    # multi-slice: HSDP's replicate groups hold one chip per slice, over DCN
    if dim == "replicate" or (net.kind == "flat" and p > net.slice):
        return ring_time(op, n, p, chip.dcn / 2, ALPHA_DCN)
    if p <= net.slice:
        return torus_time(op, n, p, chip.link, net.dims, ALPHA_ICI)
    # hierarchical: within the slice over ICI, across slices over DCN on 1/slice of the data
    s, k = net.slice, p // net.slice
    ici = {o: torus_time(o, n, s, chip.link, net.dims, ALPHA_ICI) for o in ("reduce_scatter", "all_gather")}
    dcn = ring_time(op, n / s, k, chip.dcn / 2, ALPHA_DCN)
    if op == "all_reduce":
        return ici["reduce_scatter"] + dcn + ici["all_gather"]
    return dcn + ici.get(op, ici["all_gather"])


# --- the overlap model -------------------------------------------------------


@dataclass
class Task:
    stream: str  # compute or comm; each runs its tasks one after another in list order
    seconds: float
    after: tuple[int, ...] = ()  # tasks that must have ended
    gate: int | None = None  # a compute task that must have started (where a prefetch is issued)


def simulate(tasks: list[Task]) -> float:
    start, end, free = [], [], {"compute": 0.0, "comm": 0.0}
    for t in tasks:
        s = max([free[t.stream], *(end[i] for i in t.after), *([start[t.gate]] if t.gate is not None else [])])
        start.append(s)
        end.append(s + t.seconds)
        free[t.stream] = s + t.seconds
    return max(end)


@dataclass
class Program:
    tasks: list[Task] = field(default_factory=list)

    def add(self, stream: str, seconds: float, after=(), gate=None) -> int:
        self.tasks.append(Task(stream, seconds, tuple(after), gate))
        return len(self.tasks) - 1


def split(calls: list[Collective], phase: str, op: str, dims=("world", "shard")) -> list[Collective]:
    return [c for c in calls if c.phase == phase and c.op == op and c.dim in dims]


def step_program(strategy: str, calls: list[Collective], fl: Flops, comm: Callable[[Collective], float], flop_s: float):
    """The step as compute and comm tasks in issue order."""
    prog, L = Program(), fl.layers
    if strategy == "ddp":
        prog.add("compute", (L * fl.block_forward + fl.head_forward) / flop_s)
        backward = [prog.add("compute", fl.head_backward / flop_s)]
        backward += [prog.add("compute", fl.block_backward / flop_s) for _ in range(L)]
        backward.append(prog.add("compute", 0.0))  # the embedding (no FLOPs counted)
        for c in split(calls, "backward", "all_reduce"):
            prog.add("comm", comm(c), after=(backward[c.ready],))
    else:
        gathers, scatters = split(calls, "forward", "all_gather"), split(calls, "backward", "reduce_scatter")
        regathers = split(calls, "backward", "all_gather")
        replicas = split(calls, "backward", "all_reduce", dims=("replicate",))
        shapes = (len(gathers), len(regathers), len(scatters), len(replicas))
        hsdp = strategy == "hsdp" and any(c.group > 1 for c in calls if c.dim == "replicate")
        if shapes[0] != L + 1 or shapes[1] not in (L, L + 1) or shapes[2] != L + 1 or len(replicas) not in (0, L + 1):
            raise RuntimeError(f"unexpected FSDP2 collectives for {L} blocks: {shapes} (gathers, regathers, ...)")
        # forward: the root's all-gather, then each block's issued one block ahead
        root = prog.add("comm", comm(gathers[0]))
        embed = prog.add("compute", 0.0, after=(root,))
        ag = prog.add("comm", comm(gathers[1]), gate=embed)
        for i in range(L):
            block = prog.add("compute", fl.block_forward / flop_s, after=(ag,))
            if i + 1 < L:
                ag = prog.add("comm", comm(gathers[i + 2]), gate=block)
        prog.add("compute", fl.head_forward / flop_s)
        # backward: the root regathers if it resharded; blocks regather one ahead, reduce-scatter after
        after = (prog.add("comm", comm(regathers[0])),) if len(regathers) == L + 1 else ()
        head = prog.add("compute", fl.head_backward / flop_s, after=after)
        regathers = regathers[len(regathers) - L :]
        ag = prog.add("comm", comm(regathers[0]), gate=head)
        for j in range(L):
            block = prog.add("compute", fl.block_backward / flop_s, after=(ag,))
            if j + 1 < L:
                ag = prog.add("comm", comm(regathers[j + 1]), gate=block)
            rs = prog.add("comm", comm(scatters[j]), after=(block,))
            if hsdp:
                prog.add("comm", comm(replicas[j]), after=(rs,))
        embed = prog.add("compute", 0.0)
        rs = prog.add("comm", comm(scatters[L]), after=(embed,))
        if hsdp:
            prog.add("comm", comm(replicas[L]), after=(rs,))
    # the optimizer's collectives (clip_grad_norm_'s) wait for everything before them
    for c in (c for c in calls if c.phase == "optimizer"):
        prog.add("comm", comm(c), after=tuple(range(len(prog.tasks))))
    return prog.tasks


def efficiency(strategy: str, calls: list[Collective], fl: Flops, net: Network, world: int) -> dict:
    flop_s = net.chip.peak * MFU

    def comm(c: Collective) -> float:
        return collective_time(net, c.op, c.nbytes, c.group, c.dim)

    step = simulate(step_program(strategy, calls, fl, comm, flop_s))
    compute = fl.total / flop_s
    return {"compute": compute, "comm": sum(comm(c) for c in calls), "step": step, "efficiency": compute / step}


def state_bytes(c: LlamaConfig, strategy: str, world: int) -> float:
    """fp32 parameters, gradients and AdamW's two moments per chip; activations not counted."""
    shards = 1 if strategy == "ddp" else min(world, SLICE) if strategy == "hsdp" else world
    return 16 * parameter_count(c) / shards


# --- output ------------------------------------------------------------------


def summarize(calls: list[Collective]) -> list[tuple]:
    groups = defaultdict(lambda: [0, 0])
    for c in calls:
        key = (c.phase, c.op, c.dtype, c.group, c.dim)
        groups[key][0] += 1
        groups[key][1] += c.nbytes
    return [(*k, n, b) for k, (n, b) in groups.items()]


def gb(x: float) -> str:
    return f"{x / 1e9:.3f}"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def strategies() -> list[tuple[str, str, float]]:
    return [(f"DDP {mb} MB buckets", "ddp", mb) for mb in BUCKETS_MB] + [("FSDP2", "fsdp2", 0), ("HSDP", "hsdp", 0)]


def run(out: str, check: bool) -> None:
    t0 = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    md = ["# Weak-scaling model: DDP, FSDP2, HSDP to 8,192 chips", ""]
    md += [f"Per chip: {BATCH} x {SEQ} tokens; {MFU:.0%} MFU; latency {ALPHA_ICI * 1e6:g} us (ICI) /"]
    md += [f"{ALPHA_DCN * 1e6:g} us (DCN) per step (assumed). Hardware as published, not measured:", ""]
    md.append(
        markdown_table(
            ["chip", "peak bf16 TFLOP/s", "ICI GB/s one way per port", "ports", "DCN GB/s per chip", "HBM GiB"],
            [
                [x.name, f"{x.peak / 1e12:g}", f"{x.link / 1e9:g}", x.ports, f"{x.dcn / 1e9:g}", f"{x.hbm / 2**30:.1f}"]
                for x in (V5P, V5E)
            ],
        )
    )
    if check:
        rows = check_real()
        md += ["", "## Recorded bytes against a real 2-process run (small model, device tpu)", ""]
        table = []
        for r in rows:
            same = all(tuple(x) == r["fake"] for x in r["real"])
            cells = [r["strategy"], r["op"], f"{r['fake'][0]} / {r['fake'][1]}"]
            table.append([*cells, *(f"{n} / {b}" for n, b in r["real"]), "yes" if same else "NO"])
        header = ["strategy", "op", "fake PG: calls / bytes in", "rank 0: calls / bytes", "rank 1", "equal"]
        md.append(markdown_table(header, table))
        print("\n".join(md[-len(table) - 4 :]), flush=True)
        md += ["", f"(check took {time.perf_counter() - t0:.0f} s)"]

    results, small, summaries, flops = {}, {}, [], {}
    for model_name, c in MODELS.items():
        fl = flops[model_name] = count_flops(c)
        # comm does not depend on the batch; the FLOPs FlopCounterMode counts are linear in it
        fl_small = Flops(*(getattr(fl, f.name) * SMALL_BATCH / BATCH for f in fields(Flops)[:-1]), fl.layers)
        print(f"{model_name}: {parameter_count(c) / 1e9:.2f} B parameters, {fl.total / 1e12:.1f} TFLOP per chip-step")
        for label, strategy, mb in strategies():
            worlds = (8,) if strategy == "ddp" else WORLD_SIZES
            recorded = {w: record(c, strategy, w, mb) for w in worlds}
            for w in (worlds[0], worlds[-1]) if len(worlds) > 1 else worlds:
                summaries += [[model_name, label, w, *row[:5], row[5], gb(row[6])] for row in summarize(recorded[w])]
            for net in NETWORKS:
                for w in WORLD_SIZES:
                    calls = recorded.get(w, recorded[worlds[0]])
                    if strategy == "ddp":  # the same buckets at any world size, over a group of w
                        calls = [Collective(**{**vars(x), "group": w}) for x in calls]
                    results[(model_name, label, net.name, w)] = efficiency(strategy, calls, fl, net, w)
                small[(model_name, label, net.name)] = efficiency(strategy, calls, fl_small, net, WORLD_SIZES[-1])
            print(f"  {label}: recorded ({time.perf_counter() - t0:.0f} s)", flush=True)

    md += ["", "## Recorded collectives per chip and step (fake process group)", ""]
    header = ["model", "strategy", "world", "phase", "op", "dtype", "group", "mesh dim", "calls", "GB in"]
    md.append(markdown_table(header, summaries))
    for model_name, c in MODELS.items():
        md += ["", f"## {model_name}: weak-scaling efficiency (compute / step time)", ""]
        rows = []
        for label, strategy, _ in strategies():
            for net in NETWORKS:
                cells = []
                for w in WORLD_SIZES:
                    r = results[(model_name, label, net.name, w)]
                    fits = state_bytes(c, strategy, w) <= net.chip.hbm
                    cells.append(f"{r['efficiency']:.0%}" + ("" if fits else " †"))
                rows.append([label, net.name, *cells])
        md.append(markdown_table(["strategy", "network", *map(str, WORLD_SIZES)], rows))
        fl, w = flops[model_name], WORLD_SIZES[-1]
        md += ["", f"Compute per step: {fl.total / 1e12:.1f} TFLOP per chip. † parameters, gradients and AdamW state"]
        md += ["(16 bytes per parameter, sharded as the strategy shards them) exceed the chip's HBM."]
        md += [
            "",
            f"{model_name} at {w} chips: seconds per step, and efficiency with {SMALL_BATCH} x {SEQ} tokens per chip",
            "",
        ]
        rows = []
        for label, _, _ in strategies():
            for net in NETWORKS:
                r, r1 = results[(model_name, label, net.name, w)], small[(model_name, label, net.name)]
                exposed = r["step"] - r["compute"]
                cells = [f"{r['compute']:.3f}", f"{r['comm']:.3f}", f"{exposed:.3f}", f"{r['efficiency']:.0%}"]
                rows.append([label, net.name, *cells, f"{r1['efficiency']:.0%}"])
        header = ["strategy", "network", "compute s", "comm s", "exposed s", f"eff. {BATCH}x{SEQ}"]
        md.append(markdown_table([*header, f"eff. {SMALL_BATCH}x{SEQ}"], rows))
    md += ["", f"Runtime: {time.perf_counter() - t0:.0f} s"]
    text = "\n".join(md) + "\n"
    with open(os.path.join(out, "scaling_model.md"), "w") as f:
        f.write(text)
    plot(results, os.path.join(out, "scaling_model.png"))
    print(text)
    print(f"wrote {out}/scaling_model.md and scaling_model.png in {time.perf_counter() - t0:.0f} s")


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(MODELS), len(NETWORKS), figsize=(4 * len(NETWORKS), 3.6 * len(MODELS)), sharey=True)
    for i, model_name in enumerate(MODELS):
        for j, net in enumerate(NETWORKS):
            ax = axes[i][j]
            for label, _, _ in strategies():
                ys = [results[(model_name, label, net.name, w)]["efficiency"] for w in WORLD_SIZES]
                ax.plot(WORLD_SIZES, ys, marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{model_name}: {net.name}", fontsize=9)
            ax.set_xlabel("chips")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("weak-scaling efficiency")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--no-check-real", action="store_true", help="skip the real 2-process check")
    p.add_argument("--real-worker", help=argparse.SUPPRESS)  # the check's torchrun ranks
    args = p.parse_args()
    if args.real_worker:
        real_worker(args.real_worker)
    else:
        run(args.out, not args.no_check_real)


if __name__ == "__main__":
    main()
