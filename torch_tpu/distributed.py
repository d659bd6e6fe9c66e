"""torch.distributed on "tpu": the "tpu" c10d backend and ranks as threads.

`import torch_tpu` registers backend "tpu" for device "tpu", so
`init_process_group("cpu:gloo,tpu:tpu")` (or `backend="tpu"`) gives a group
whose collectives on tpu tensors run in ProcessGroupTPU (C++,
csrc/distributed/): each one an XLA collective program over the ranks'
devices when the ranks are threads of one process, one device each
(`run_threads`); through host memory and gloo when they are processes on a
plugin without multi-process collectives (the CPU plugin under torchrun).

`mark_sharding` annotates a tensor for SPMD: a torch.compile(backend="tpu")
graph reading it becomes one program that XLA's partitioner splits over the
mesh's devices, inserting the collectives itself.
"""

import math
import os
import socket
import threading
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_tpu import _C

__all__ = ["mark_sharding", "run_threads"]


def _create_backend(options, _backend_options=None):
    """The creator torch.distributed calls for each group using backend "tpu".

    Transport: XLA collectives when every rank of the group is a thread of
    this process, host staging through gloo otherwise (the CPU plugin runs no
    program across processes); TORCH_TPU_COLLECTIVES=xla|host overrides.
    """
    _C._bind_process_group()
    store, rank, size = options.store, options.group_rank, options.group_size
    here = f"{socket.gethostname()}:{os.getpid()}"
    store.set(f"torch_tpu/process/{rank}", here)
    if rank == 0:
        store.set("torch_tpu/group_key", uuid.uuid4().hex)
    key = store.get("torch_tpu/group_key").decode()
    process_of = [store.get(f"torch_tpu/process/{r}").decode() for r in range(size)]  # hostname:pid per rank
    places = set(process_of)
    transport = os.environ.get("TORCH_TPU_COLLECTIVES", "auto")
    if transport not in ("auto", "xla", "host"):
        raise ValueError(f"torch_tpu: TORCH_TPU_COLLECTIVES={transport!r}: expected xla, host or auto")
    if transport == "auto":
        transport = "xla" if places == {here} else "host"
    if transport == "xla" and places != {here}:
        raise RuntimeError(
            f"torch_tpu: TORCH_TPU_COLLECTIVES=xla, but the {size} ranks of this process group run in "
            f"{len(places)} processes, and the {_C.device_name()} PJRT plugin runs no program across processes. "
            "Use TORCH_TPU_COLLECTIVES=host (or unset it), or run the ranks as threads "
            "(torch_tpu.distributed.run_threads)."
        )
    timeout = options.timeout
    host = None
    if transport == "host":
        host = dist.ProcessGroupGloo(dist.PrefixStore("torch_tpu/host/", store), rank, size, timeout)
    return _C.ProcessGroupTPU(rank, size, key, timeout.total_seconds(), host, process_of)


if dist.is_available() and "tpu" not in dist.Backend.backend_list:
    # devices is a list: a bare string would be iterated letter by letter.
    dist.Backend.register_backend("tpu", _create_backend, extended_api=True, devices=["tpu"])


def run_threads(fn, world_size=None, backend="tpu", timeout=timedelta(seconds=60)):
    """Runs fn(rank) for each rank in its own thread, bound to tpu:rank, inside a
    process group of world_size ranks (default: every tpu device). Returns the
    ranks' results in rank order; the first rank to raise has its exception
    re-raised here, after the others were released from any collective.
    """
    # torch's thread-per-rank world (its multi-threaded test process group uses it).
    from torch.testing._internal.distributed import multi_threaded_pg

    world_size = torch.tpu.device_count() if world_size is None else world_size
    if world_size > torch.tpu.device_count():
        raise ValueError(
            f"torch_tpu: run_threads: {world_size} ranks need {world_size} tpu devices, there are "
            f"{torch.tpu.device_count()} (TORCH_TPU_NUM_DEVICES sets how many the CPU plugin makes)"
        )
    store = dist.HashStore()
    # Shared between threads, which have different current devices: DTensor's
    # fake-tensor propagation must run one thread at a time, and the fake
    # tensor cache (keyed by device "tpu", unindexed) must not hand one rank
    # another rank's device.
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    saved = ShardingPropagator._fake_mode_lock, torch._dynamo.config.fake_tensor_cache_enabled
    # Dynamo registers the "tpu" compile backend on its first lookup, which
    # is not thread safe (two ranks: "duplicate name: tpu"): look it up here.
    torch._dynamo.lookup_backend("tpu")
    # record_function (DDP's forward opens one) imports an optional module on
    # its first use; inside a rank compiling under torch.compile, that import
    # deadlocked with another rank that held Dynamo's compile lock and waited
    # for the import lock. Its first use happens here instead.
    with torch.autograd.profiler.record_function("torch_tpu.run_threads"):
        pass
    ShardingPropagator._fake_mode_lock = threading.Lock()
    torch._dynamo.config.fake_tensor_cache_enabled = False
    results, errors = [None] * world_size, []  # errors in the order raised: the first is the cause
    isolation = torch._C._distributed_c10d._set_thread_isolation_mode
    multi_threaded_pg._install_threaded_pg()
    isolation(True)

    def rank_main(rank):
        torch.tpu.set_device(rank)
        _C._set_thread_rank(rank)
        try:
            dist.init_process_group(backend, rank=rank, world_size=world_size, store=store, timeout=timeout)
            results[rank] = fn(rank)
            # Collectives still in the rank's Fused window: the other ranks wait for them.
            _C._flush("rank_exit")
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller)
            errors.append(e)
            if dist.is_initialized():  # wake the ranks waiting for this one
                dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu")).abort()
            # No rank will meet what this rank's window still holds.
            _C._discard_collectives(torch.tpu.current_device())
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            _C._set_thread_rank(-1)

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"tpu-rank-{r}") for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        isolation(False)
        multi_threaded_pg._uninstall_threaded_pg()
        ShardingPropagator._fake_mode_lock, torch._dynamo.config.fake_tensor_cache_enabled = saved
    if errors:
        raise errors[0]
    return results


class _Sharding:
    """How mark_sharding laid a tensor over a mesh: the devices in mesh order
    (row-major), the mesh's shape, and per tensor dim the mesh dims cutting it."""

    def __init__(self, devices, mesh, axes):
        self.devices, self.mesh, self.axes = devices, mesh, axes

    def __repr__(self):
        return f"Sharding(mesh {self.mesh} of tpu:{self.devices}, mesh dims per tensor dim {self.axes})"


def mark_sharding(tensor, mesh, placements):
    """Lays `tensor` (on "tpu") over `mesh` for SPMD compilation: a
    `torch.compile(backend="tpu")` graph that reads it runs as one program
    partitioned by XLA over the mesh's devices (each gets its piece; XLA
    inserts the collectives). `mesh`: a DeviceMesh of "tpu" (rank r is tpu:r,
    ranks as threads of this process) or a nested list of device indices;
    `placements`: one `Shard(dim)` or `Replicate()` per mesh dimension. Sizes
    must divide evenly. Returns `tensor`. The graph's outputs come back whole
    (replicated) on the tensor's device; a graph reading no marked tensor
    runs on one device as usual."""
    from torch.distributed.tensor import Replicate, Shard

    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"torch_tpu.distributed.mark_sharding: expected a tensor on tpu, got one on {where}")
    if hasattr(mesh, "mesh") and dist.is_initialized():
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu"))
        if getattr(backend, "host_staged", False):
            raise ValueError(
                "torch_tpu.distributed.mark_sharding: the DeviceMesh's ranks are processes (torchrun), each with "
                "its own device; an SPMD program runs over this process's devices: pass a nested list of their "
                "indices (or use DTensor, whose collectives run between the processes)"
            )
    grid = torch.as_tensor(mesh.mesh if hasattr(mesh, "mesh") else mesh)
    if grid.dtype.is_floating_point or grid.dim() == 0:
        raise ValueError(f"torch_tpu.distributed.mark_sharding: mesh {mesh!r} is not a list of device indices")
    devices = grid.flatten().tolist()
    count = torch.tpu.device_count()
    if len(set(devices)) != len(devices) or not all(0 <= d < count for d in devices):
        raise ValueError(
            f"torch_tpu.distributed.mark_sharding: mesh devices {devices} must be distinct tpu indices below {count}"
        )
    placements = list(placements)
    if len(placements) != grid.dim():
        raise ValueError(
            f"torch_tpu.distributed.mark_sharding: a {grid.dim()}-D mesh {list(grid.shape)} needs one placement per "
            f"dimension, got {placements}"
        )
    axes = [[] for _ in range(tensor.dim())]
    for j, p in enumerate(placements):
        if isinstance(p, Shard):
            if not -tensor.dim() <= p.dim < tensor.dim():
                raise ValueError(
                    f"torch_tpu.distributed.mark_sharding: {p} of a tensor of shape {list(tensor.shape)}: no such dim"
                )
            axes[p.dim % tensor.dim()].append(j)  # mesh dims in order: the first cuts outermost, as DTensor's
        elif not isinstance(p, Replicate):
            raise ValueError(f"torch_tpu.distributed.mark_sharding: placement {p} (only Shard and Replicate)")
    for d, dims in enumerate(axes):
        n = math.prod(grid.shape[j] for j in dims)
        if tensor.shape[d] % n:
            raise ValueError(
                f"torch_tpu.distributed.mark_sharding: dim {d} of shape {list(tensor.shape)} does not split evenly "
                f"into {n} pieces over mesh {list(grid.shape)} ({placements}); pad it to a multiple of {n}"
            )
    tensor._tpu_sharding = _Sharding(devices, list(grid.shape), axes)
    global any_marked
    any_marked = True
    return tensor


any_marked = False  # whether mark_sharding was ever called (compiled graphs look for marks only then)
