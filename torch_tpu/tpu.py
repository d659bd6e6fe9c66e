"""The `torch.tpu` device module, modelled on `torch.cuda`."""

import contextlib
import dataclasses
import os

import torch

from torch_tpu import _C


def is_available() -> bool:
    try:
        return _C.device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    """Whether the runtime (the PJRT client) has started; FakeTensor asks this, as of torch.cuda."""
    return _C._initialized()


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device) -> None:
    index = _index(device)
    if not 0 <= index < device_count():
        raise ValueError(f"torch.tpu.set_device: device {index} out of range; there are {device_count()} tpu devices")
    _C._set_device(index)


def _index(device) -> int:
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return _C._current_device() if device.index is None else device.index


@contextlib.contextmanager
def device(device):
    previous = _C._current_device()
    set_device(device)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device=None) -> None:
    """Waits for every op launched on the device; raises a device error if one failed."""
    _C.synchronize(_index(device))


def get_device_name(device=None) -> str:
    """The plugin's platform and device kind, e.g. "cpu (cpu)" or "cuda (NVIDIA H200)"."""
    return f"{_C.platform_name()} ({_C.device_kind(_index(device))})"


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What torch.tpu.get_device_properties returns (torch.cuda's counterpart
    has name and total_memory too): the plugin's platform and device kind, its
    memory capacity, and the PJRT device attributes as the plugin names them."""

    index: int
    id: int  # the plugin's global device id
    name: str  # the device kind: "cpu", "NVIDIA H200", "TPU v5 lite"
    platform: str  # "cpu", "cuda", "tpu"
    platform_version: str
    pjrt_api_version: str
    total_memory: int  # bytes: what allocations are checked against (mem_get_info's total)
    attributes: dict  # PJRT_DeviceDescription_Attributes

    def __repr__(self) -> str:
        return (
            f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"total_memory={self.total_memory // 2**20}MB, attributes={self.attributes})"
        )


def get_device_properties(device=None) -> DeviceProperties:
    """The properties of a tpu device (the current one by default)."""
    index = _index(device)
    count = _C.device_count()
    if not 0 <= index < count:
        raise ValueError(f"torch.tpu.get_device_properties: device {index} is out of range ({count} tpu devices)")
    return DeviceProperties(
        index=index,
        id=_C.device_id(index),
        name=_C.device_kind(index),
        platform=_C.platform_name(),
        platform_version=_C.platform_version(),
        pjrt_api_version=_C.plugin_api_version(),
        total_memory=_C.memory_capacity(index),
        attributes=dict(_C.device_attributes(index)),
    )


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensor storages on the device."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated since the start or the last reset_peak_memory_stats."""
    return _C.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    _C.reset_accumulated_memory_stats(_index(device))


def memory_stats(device=None) -> dict:
    """CUDA's memory_stats keys for our storage accounting ("allocated_bytes.all.current",
    "allocated_bytes.all.peak", "allocation.all.current", "num_ooms", ...), "reserved_bytes.all.*"
    (see memory_reserved), "capacity_bytes", and "device.*": the plugin's own statistics
    (PJRT_Device_MemoryStats) where it reports them (the XLA CPU plugin does not)."""
    return dict(sorted(_C.memory_stats(_index(device)).items()))


def memory_reserved(device=None) -> int:
    """Bytes the device holds for us: the plugin's bytes_in_use where it reports it (it includes
    program temporaries), else memory_allocated (storages free at once; nothing is cached)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the device. total is the capacity allocations are checked against:
    TORCH_TPU_MEMORY_LIMIT, else the plugin's bytes_limit, else physical RAM (host-memory plugins)."""
    index = _index(device)
    total = _C.memory_capacity(index)
    return max(total - memory_reserved(index), 0), total


def empty_cache() -> None:
    """Nothing to release: a storage's device buffer is freed when its last tensor dies."""


def get_amp_supported_dtype() -> list:
    """The low-precision dtypes torch.autocast("tpu", dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Every XLA device computes in bfloat16 (TPUs natively)."""
    return True


def _is_in_bad_fork() -> bool:
    """A child forked after this process used tpu: it cannot use tpu (use spawn)."""
    return _C._in_bad_fork()


# Random numbers: one default torch.Generator per device (seed and offset; see
# csrc/aten/generator.h). torch.manual_seed / torch.seed reach manual_seed_all.


def _default_generator(device=None) -> torch.Generator:
    return _C._default_generator(_index(device))


def _as_seed(seed) -> int:
    # PyTorch's own range check and mapping of negative seeds.
    return torch.Generator().manual_seed(int(seed)).initial_seed()


def manual_seed(seed) -> None:
    """Seeds the current tpu device's default generator."""
    _default_generator().manual_seed(_as_seed(seed))


def manual_seed_all(seed) -> None:
    """Seeds every tpu device's default generator (before the first tpu op, without starting the runtime)."""
    _C._manual_seed_all(_as_seed(seed))


def seed() -> None:
    """Seeds the current tpu device's default generator with a nondeterministic number."""
    _default_generator().seed()


def seed_all() -> None:
    """Seeds every tpu device's default generator with one nondeterministic number."""
    manual_seed_all(int.from_bytes(os.urandom(8), "little"))


def initial_seed() -> int:
    """The seed of the current tpu device's default generator."""
    return _default_generator().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    """The default generator's state of a tpu device: a uint8 tensor (seed and offset)."""
    return _default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _default_generator(device).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---- Streams and events. PJRT orders work by the buffers each execution reads,
# so every stream of a device is one ordered flow: streams are names PyTorch
# passes around (FSDP2 and DDP make and switch them), waiting on a stream or
# event orders nothing more, and an event completes when the work launched on
# its device before its record() is computed. An event made with
# enable_timing=True waits for that work at record(), so elapsed_time() is the
# time between the two points where the device caught up.


class Stream(torch.Stream):
    """A tpu stream, as torch.cuda.Stream: `Stream(device=None, priority=0)`."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # torch's own constructor arguments (stream_id, device_index, device_type)
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


class _TpuEvent(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_TpuEvent):
    """A tpu event, as torch.cuda.Event: `Event(enable_timing=False, blocking=False, interprocess=False)`.
    Made as a torch.Event (whose elapsed_time takes torch.Event objects only)."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return torch.Event(
            device=torch.device("tpu", current_device()), enable_timing=enable_timing, blocking=blocking,
            interprocess=interprocess,
        )  # fmt: skip


def _as_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    return _as_stream(torch.accelerator.current_stream(torch.device("tpu", _index(device))))


def default_stream(device=None) -> Stream:
    current = torch.accelerator.current_stream(torch.device("tpu", _index(device)))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s):
    """Makes `s` the current stream of its device inside the block (None: no change)."""
    if s is None:
        yield
        return
    previous = current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


def __getattr__(name):
    if name == "default_generators":  # as torch.cuda.default_generators, made on first use
        return tuple(_C._default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")
