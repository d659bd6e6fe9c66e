"""Differential semantics: random small tensor programs run on CPU and on "tpu" must agree.

A program (3-12 ops over a few small inputs of mixed dtypes, rebuilt from
(seed, index) alone) mixes views, in-place ops through views, out= variants and
functional ops with type promotion. It runs on CPU, then on tpu in an eager mode
(strict, fused or debug): every op that raises on CPU must raise the same
exception class on tpu (by the next synchronize: errors may be deferred), and no
other op may raise. Then every live tensor (inputs included: in-place ops write
through views into them) is compared: dtype, shape, strides and storage offset,
values (exact for integers and bools), and which tensors share a storage
(StorageImpl identity, untyped_storage()._cdata: CPU gives every empty storage
data_ptr 0). The compile flavor runs programs of functional ops through
torch.compile(backend="tpu") against eager CPU.

The generator keeps to defined behaviour: no float-to-int conversion of NaN, inf
or out-of-range values, no int trunc division by -1 (it traps the CPU), no views
exposing NaN payload bits or subnormals. A divergence is localized (the first op
after which the states differ) and shrunk to a repro. KNOWN_DIVERGENCES lists
deliberate, documented differences; anything else fails. Sweeps run in a worker
process: a program that hangs or crashes it is a divergence too.

pytest runs a sample per mode; the CLI runs sweeps and prints a summary:
    python tests/python/test_semantics.py --mode strict --programs 2000 [--start N] [--show K]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tpu

SEED = 0
MODES = ("strict", "fused", "debug", "compile")
# Per pytest run (a fresh compilation cache: about 0.35 s a program on 2 cores).
PYTEST_PROGRAMS = {"strict": 200, "fused": 150, "compile": 50}


class Divergence(NamedTuple):
    kind: str  # one of KINDS
    op: int | None  # index of the line where it first shows; None until localized
    detail: str


KINDS = (
    "tpu hung",
    "tpu crashed",
    "tpu raised",
    "cpu raised",
    "exception class",
    "dtype",
    "shape",
    "stride",
    "stride (size-1/empty)",
    "value",
    "aliasing",
)


class Known(NamedTuple):
    explanation: str
    # (the divergence, its op's line, the CPU tensors before it) -> is it this one
    applies: Callable[[Divergence, str, dict], bool]
    modes: tuple[str, ...] = MODES  # where it is deliberate


def _out_aliases_an_input(line: str, ns: dict) -> bool:
    """`line` passes out=tN that is also one of its inputs (torch.sum(t1, 0, out=t1)),
    or a view of the same storage (torch.sum(t0.expand(2), 0, out=t0))."""
    m = re.search(r"out=(t\d+)\b", line)
    if not m:
        return False

    def storages(v):
        parts = v if isinstance(v, (list, tuple)) else [v]  # split's pieces: t7[0]
        return {p.untyped_storage().data_ptr() for p in parts if isinstance(p, torch.Tensor)}

    out = storages(ns.get(m.group(1)))
    for name in re.findall(r"\b(t\d+)\b", line[: m.start()]):
        if name == m.group(1) or storages(ns.get(name)) & out:
            return True
    return False


def _run_on_cpu(line: str, ns: dict) -> dict | None:
    """The namespace after `line` runs on CPU, or None where it raises there (no value divergence of its own)."""
    after = dict(ns)
    try:
        exec(line, after)
    except Exception:  # noqa: BLE001 - any error CPU raises
        return None
    return after


def _float_scan(line: str, ns: dict) -> bool:
    """`line` is `tN = ...cumsum/cumprod/prod(...)` with a float result (run on CPU to see)."""
    m = re.match(r"(t\d+) = .*\b(cumsum|cumprod|prod)\(", line)
    if not m:
        return False
    after = _run_on_cpu(line, ns)
    if after is None:
        return False
    out = after.get(m.group(1))
    return isinstance(out, torch.Tensor) and out.dtype.is_floating_point


# assert_close's default (rtol, atol) per float dtype.
TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}


def _cancelling_sum(line: str, ns: dict) -> bool:
    """`line` is `tN = torch.sum/nansum/mean(tM, ...)` with a float result whose terms cancel: so much
    larger than it (2^10 times) that float32 rounding (n * eps * max |term|) exceeds the tolerance."""
    m = re.match(r"(t\d+) = torch\.(sum|nansum|mean)\((t\d+)\b", line)
    if not m:
        return False
    after = _run_on_cpu(line, ns)
    if after is None:
        return False
    out, x = after.get(m.group(1)), ns.get(m.group(3))
    if not (isinstance(out, torch.Tensor) and out.dtype in TOLERANCES and isinstance(x, torch.Tensor)):
        return False
    terms = x.double().abs()
    terms = terms[terms.isfinite()]
    if terms.numel() == 0 or out.numel() == 0:
        return False
    rtol, atol = TOLERANCES[out.dtype]
    largest, smallest_result = terms.max().item(), out.double().abs().min().item()
    bound = largest * x.numel() * torch.finfo(torch.float32).eps
    # Only where the terms cancel (10 bits or more lost): elsewhere the order moves the last bits only.
    return smallest_result * 2**10 <= largest and bound > atol + rtol * smallest_result


def _subnormal(v) -> bool:
    """Whether v (a tensor, or a tuple of them) holds a subnormal float."""
    if isinstance(v, (list, tuple)):
        return any(_subnormal(x) for x in v)
    if not isinstance(v, torch.Tensor) or not v.dtype.is_floating_point or v.numel() == 0:
        return False
    return bool(((v != 0) & (v.abs() < torch.finfo(v.dtype).tiny)).any())


def _meets_subnormals(line: str, ns: dict) -> bool:
    """`line` reads a tensor holding subnormal floats, or computes one on CPU (XLA flushes them to zero)."""
    target, assigns, expr = line.partition(" = ")
    if assigns and any(_subnormal(ns.get(name)) for name in re.findall(r"\bt\d+\b", expr)):
        return True
    after = _run_on_cpu(line, ns)
    if after is None:
        return False
    return any(_subnormal(after.get(name)) for name in re.findall(r"\bt\d+\b", target))


DIVISIONS = {"%": torch.remainder, "//": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod}
DIVISIONS |= {"floor_divide": torch.floor_divide, "remainder_": torch.remainder, "fmod_": torch.fmod}


def _ill_conditioned_division(line: str, ns: dict) -> bool:
    """`line` is a float remainder, fmod or floor division whose result moves beyond its tolerance
    when the dividend moves by 4 ulps (a dividend 4.9e9 that a matmul rounded, % 7)."""
    m = (
        re.match(r"t\d+ = (?P<x>t\d+) (?P<fn>%|//) (?P<y>.+)$", line)
        or re.match(r"t\d+ = torch\.(?P<fn>remainder|fmod|floor_divide)\((?P<x>t\d+), (?P<y>.+)\)$", line)
        or re.match(r"(?:t\d+ = )?(?P<x>t\d+)\.(?P<fn>remainder_|fmod_)\((?P<y>.+)\)$", line)
    )
    if not m:
        return False
    fn, x_name, other = m["fn"], m["x"], m["y"]
    x = ns.get(x_name)
    try:
        y = eval(other, dict(ns))
        r = DIVISIONS[fn](x, y)
    except Exception:  # noqa: BLE001 - it raised on CPU: not a value divergence of its own
        return False
    if not (isinstance(x, torch.Tensor) and x.dtype in TOLERANCES and r.dtype in TOLERANCES and r.numel()):
        return False
    # A few ulps: what an earlier op's rounding order moves its result by.
    moves = 4 * torch.finfo(x.dtype).eps * x.double().abs()
    y64 = y.double() if isinstance(y, torch.Tensor) else y
    r_rtol, r_atol = TOLERANCES[r.dtype]
    for sign in (1, -1):
        moved = DIVISIONS[fn](x.double() + sign * moves, y64)
        if ((moved - r.double()).abs() > r_atol + r_rtol * r.double().abs()).any():
            return True
    return False


def _empty_shape(detail: str) -> bool:
    m = re.search(r"\[([\d, ]*)\]: cpu stride", detail)
    return bool(m) and "0" in [x.strip() for x in m.group(1).split(",")]


# Deliberate, documented differences from CPU (README, "Known divergences from
# CPU"), excluded by name and counted apart in the summary, never silently.
KNOWN_DIVERGENCES: dict[str, Known] = {
    "integer division by zero": Known(
        "CPU raises ZeroDivisionError; tpu, like CUDA, returns what the device computes (x // 0 = -1, x % 0 = x)",
        lambda d, line, ns: d.kind == "cpu raised" and "ZeroDivisionError" in d.detail,
    ),
    "strides of empty tensors": Known(
        "a tensor without elements may report other strides than CPU's (TensorIterator's order for 0 elements)",
        lambda d, line, ns: d.kind == "stride (size-1/empty)" and _empty_shape(d.detail),
    ),
    "out= into an input, unchecked by CPU": Known(
        "reductions and matmuls whose out= is also their input: CPU's result depends on its kernel's loop order "
        "(it reads what it already wrote), and an out= of another shape is resized before the kernel reads it "
        "as its input (torch.sum(t, 1, out=t) then raises 'Dimension out of range'); tpu reads every input first",
        lambda d, line, ns: (
            _out_aliases_an_input(line, ns)
            and (d.kind == "value" or (d.kind == "cpu raised" and "Dimension out of range" in d.detail))
        ),
    ),
    "x[mask] = a one-element tpu tensor of another dtype": Known(
        "raises, as CUDA does (index_put_ needs one dtype); CPU casts because the value is a CPU tensor there, "
        "which index_put_ fills in as a number (a CPU value on tpu is cast too)",
        lambda d, line, ns: d.kind == "tpu raised" and "source and destination dtypes match" in d.detail,
    ),
    "rounding order of a float scan or product": Known(
        "a float cumsum/cumprod/prod: CPU accumulates in order (float32 sums in double, float16 products in "
        "float16), XLA scans and reduces in parallel in float32, as CUDA does; the last bits differ, a "
        "cancellation (2^63 - 2^63 + 6) can lose a term, and an overflow met in CPU's order (inf * 0) may not be",
        lambda d, line, ns: d.kind == "value" and _float_scan(line, ns),
    ),
    "a remainder of a rounded dividend": Known(
        "a float remainder, fmod or floor division is as exact as its dividend: where a dividend that an "
        "earlier op rounded (a matmul's 4.9e9, within tolerance of CPU's) moves the result beyond tolerance "
        "when it moves by a few ulps, the results differ as the roundings do",
        lambda d, line, ns: d.kind == "value" and _ill_conditioned_division(line, ns),
    ),
    "subnormal floats flushed to zero": Known(
        "XLA's CPU kernels flush subnormal operands and results to zero, as TPUs do (0.25 ** 64 is 0, and "
        "0 * -inf then NaN where CPU gives -inf)",
        lambda d, line, ns: d.kind == "value" and _meets_subnormals(line, ns),
    ),
    "rounding order of a cancelling float sum": Known(
        "a float sum or mean whose terms are much larger than its result (-2^31 + 2^31 + 6 in bfloat16): "
        "CPU adds in several interleaved accumulators, XLA in its own tree, as CUDA does; the rounding error "
        "(n * eps * the largest term) then exceeds the tolerance, and either order's answer is as right",
        lambda d, line, ns: d.kind == "value" and _cancelling_sum(line, ns),
    ),
    "traced strides of size-1 dims": Known(
        "a compiled graph's outputs have the strides its trace gives them, which differ from eager CPU's "
        "in dims of size 1 only (inductor's do too)",
        lambda d, line, ns: d.kind == "stride (size-1/empty)",
        modes=("compile",),
    ),
    "traced strides of a number's powers": Known(
        "pow(number, tensor): PyTorch's meta kernel lays the result out as the tensor, CPU's kernel contiguous; "
        "a compiled graph takes the trace's strides (eager tpu takes CPU's)",
        lambda d, line, ns: d.kind == "stride" and re.search(r"torch\.pow\([\d.]+,|= [\d.]+ \*\* ", line) is not None,
        modes=("compile",),
    ),
    "Dynamo's fake run refuses": Known(
        "Dynamo runs the graph on fake tensors (PyTorch's meta kernels) before any backend sees it, and raises "
        "where CPU eager does not check (a bmm of two dtypes with an empty operand): inductor raises the same",
        lambda d, line, ns: d.kind == "tpu raised" and "making fake tensor call" in d.detail,
        modes=("compile",),
    ),
    "traced dtype of a bool ** bool": Known(
        "PyTorch's meta kernel gives int64 for pow(bool tensor, bool), CPU bool: a compiled graph takes the "
        "trace's dtype (eager tpu takes CPU's)",
        lambda d, line, ns: d.kind == "dtype" and "**" in line,
        modes=("compile",),
    ),
    "mixed dtypes of an empty matmul": Known(
        "CPU returns an empty result for a matmul of two dtypes when an operand is empty; tpu raises its dtype error",
        lambda d, line, ns: (
            d.kind == "tpu raised" and "expected scalar type" in d.detail and re.search(r"@|\b(matmul|b?mm)\(", line)
        ),
    ),
}


# ---------------------------------------------------------------- programs


@dataclasses.dataclass(frozen=True)
class Line:
    label: str  # the op, for grouping: "input", "add_", "out=cat", "transpose", ...
    kind: str  # input | view | inplace | out | functional
    text: str  # a Python statement over t0, t1, ... (and torch, nan, inf, dev)


FLOATS = (torch.float32, torch.bfloat16, torch.float16)
DTYPES = FLOATS + (torch.int64, torch.int32, torch.uint8, torch.bool)
DTYPE_WEIGHTS = (5, 2, 2, 4, 2, 1, 2)
SAME_SIZE = {
    torch.float32: torch.int32,
    torch.int32: torch.float32,
    torch.bfloat16: torch.float16,
    torch.float16: torch.bfloat16,
    torch.bool: torch.uint8,
}
INT_EXPONENTS = (0, 1, 2, 3, -1, -2, 31, 62, 63, 64, 100)
NAME = re.compile(r"t\d+")
BINDS = re.compile(r"^(t\d+(?:, t\d+)*) = ")


@contextlib.contextmanager
def quiet():
    """Both devices warn (deprecated out= resizes, ops the CPU fallback runs): warnings are not compared."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Skip(Exception):
    """The op does not apply to the program so far: draw another."""


def tup(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(map(str, items)) + ")"


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def broadcastable(a: torch.Size, b: torch.Size) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def castable(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether converting t's values to dtype is defined (float to int needs finite, in-range values)."""
    if not is_float(t) or dtype.is_floating_point or dtype == torch.bool or t.numel() == 0:
        return True
    info, v = torch.iinfo(dtype), t.double()
    return bool(v.isfinite().all() and (v > float(info.min) - 1).all() and (v < float(info.max) + 1).all())


def namespace(device: str) -> dict:
    return {"torch": torch, "nan": math.nan, "inf": math.inf, "dev": device}


def live_tensors(ns: dict) -> dict[str, torch.Tensor]:
    """The tensors a program holds, by expression: t3, and t5[0], t5[1] for a tuple."""
    out = {}
    for name, value in ns.items():
        if not NAME.fullmatch(name):
            continue
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, (tuple, list)):
            out.update({f"{name}[{i}]": v for i, v in enumerate(value) if isinstance(v, torch.Tensor)})
    return out


class Gen:
    """Builds one program, running each line on CPU as it goes: ops are drawn to
    fit the shapes, dtypes and values the program holds at that point."""

    def __init__(self, seed: int, index: int):
        self.rng = random.Random(f"{seed}:{index}")
        self.lines: list[Line] = []
        self.ns = namespace("cpu")
        self.count = 0

    # -- running
    def execute(self, line: Line) -> Exception | None:
        try:
            exec(line.text, self.ns)
        except Exception as e:
            self.rebuild()  # a failed op may have written part of its result
            return e
        self.lines.append(line)
        return None

    def rebuild(self):
        self.ns = namespace("cpu")
        for line in self.lines:
            exec(line.text, self.ns)

    # -- drawing operands
    def new(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def pick(self, pred=None) -> tuple[str, torch.Tensor]:
        tensors = live_tensors(self.ns)
        # Not an integer view of floats holding NaN or subnormals (a NaN that a
        # later in-place op wrote): an op reading it would copy unspecified bits.
        noisy = {v.untyped_storage().data_ptr() for v in tensors.values() if bit_noise(v)}

        def bits_defined(v):
            return v.dtype.is_floating_point or v.untyped_storage().data_ptr() not in noisy

        live = [(k, v) for k, v in tensors.items() if (pred is None or pred(v)) and bits_defined(v)]
        if not live:
            raise Skip
        if self.rng.random() < 0.5:
            live = live[-3:]  # chains: often an operand just made
        return self.rng.choice(live)

    def other(self, t: torch.Tensor, tensor: bool = False) -> tuple[str, object]:
        """A second operand for t: a broadcastable tensor, a 0-dim tensor or a Python scalar."""
        roll = self.rng.random()
        if roll < 0.3 and not tensor:
            s = self.scalar()
            return s, eval(s, self.ns)
        if roll < 0.4:
            dtype = self.rng.choices(DTYPES, DTYPE_WEIGHTS)[0]
            s = f"torch.tensor({self.literal(self.value(dtype, False))}, dtype={dtype}, device=dev)"
            return s, eval(s, self.ns)
        if roll < 0.95:
            try:
                return self.pick(lambda u: broadcastable(u.shape, t.shape))
            except Skip:
                pass
        return self.pick()

    def scalar(self, kind: str | None = None) -> str:
        kind = kind or self.rng.choices(["int", "float", "bool"], [4, 5, 1])[0]
        if kind == "bool":
            return self.rng.choice(["True", "False"])
        if kind == "int":
            ints, weights = [0, 1, 2, 3, -1, -2, 5, 100, 2**31, -(2**40)], [3, 4, 4, 2, 3, 2, 2, 1, 0.3, 0.3]
            return str(self.rng.choices(ints, weights)[0])
        special = ["nan", "inf", "-inf", "-0.0"]
        return self.rng.choice([*["0.5", "-1.5", "2.0", "0.25", "3.75", "0.0"] * 3, *special])

    def value(self, dtype: torch.dtype, special: bool):
        r = self.rng
        if dtype == torch.bool:
            return r.random() < 0.5
        if dtype.is_floating_point:
            if special and r.random() < 0.3:
                return r.choice([math.nan, math.inf, -math.inf, -0.0, 1e4, 70000.0, 1e-3])
            return r.randint(-16, 16) / 4  # exact in every float dtype: roundoff stays out of the way
        if special and r.random() < 0.3:
            info = torch.iinfo(dtype)
            return r.choice([info.min, info.max, info.max - 1, 0])
        return r.randint(0, 10) if dtype == torch.uint8 else r.randint(-6, 6)

    def values(self, shape: list[int], dtype: torch.dtype, special: bool):
        """Nested lists of values."""
        if not shape:
            return self.value(dtype, special)
        return [self.values(shape[1:], dtype, special) for _ in range(shape[0])]

    @staticmethod
    def literal(v) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(Gen.literal(x) for x in v) + "]"
        return repr(float(v)) if isinstance(v, float) else repr(v)

    def dim(self, t: torch.Tensor) -> int:
        r = max(t.dim(), 1)
        d = self.rng.randrange(r)
        return d - r if self.rng.random() < 0.25 else d

    def index_tensor(self, size: int, n: int | None = None, negative: bool = True) -> str:
        n = self.rng.randint(0, 3) if n is None else n
        low = -size if negative else 0
        vals = [self.rng.randrange(low, size) if size else 0 for _ in range(n)]
        if vals and self.rng.random() < 0.04:
            vals[-1] = size  # out of range
        if not vals:
            return "torch.tensor([], dtype=torch.int64, device=dev)"
        dtype = ", dtype=torch.int32" if self.rng.random() < 0.15 else ""
        return f"torch.tensor({vals}{dtype}, device=dev)"

    def accumulator(self, t: torch.Tensor, dtypes: list[torch.dtype]) -> torch.dtype:
        """A dtype= for a reduction of t (not an integer one for NaN, inf or huge floats: undefined)."""
        return self.rng.choice([d for d in dtypes if castable(t, d)])

    def statement(self, text: str) -> str:
        """An in-place or out= call, sometimes keeping its result (an alias) too."""
        return f"{self.new()} = {text}" if self.rng.random() < 0.25 else text

    def shape_like(self, base: list[int]) -> list[int]:
        roll = self.rng.random()
        if roll < 0.5:
            return list(base)
        if roll < 0.75:  # broadcastable against base
            shape = base[self.rng.randint(0, len(base)) :]
            return [1 if self.rng.random() < 0.3 else s for s in shape]
        return self.random_shape()

    def random_shape(self) -> list[int]:
        rank = self.rng.choices([0, 1, 2, 3], [1, 3, 4, 2])[0]
        return [self.rng.choices(range(6), [0.4, 1.5, 3, 3, 2, 1])[0] for _ in range(rank)]

    def reshape_target(self, numel: int) -> str:
        rank = self.rng.choice([1, 1, 2, 2, 3])
        if numel == 0:
            dims = [self.rng.randint(0, 3) for _ in range(rank)]
            dims[self.rng.randrange(rank)] = 0
        else:
            dims = [1] * rank
            n, p = numel, 2
            while n > 1:  # distribute the prime factors
                while n % p == 0:
                    dims[self.rng.randrange(rank)] *= p
                    n //= p
                p += 1
            if numel == 1 and self.rng.random() < 0.3:
                dims = []
            if dims and self.rng.random() < 0.3:
                dims[self.rng.randrange(len(dims))] = -1
        if self.rng.random() < 0.05:
            dims = [numel + 1]  # the wrong number of elements
        return tup(dims)


def add_inputs(g: Gen):
    base = g.random_shape()
    for _ in range(g.rng.choices([1, 2, 3, 4], [1, 3, 3, 1])[0]):
        dtype = g.rng.choices(DTYPES, DTYPE_WEIGHTS)[0]
        shape = g.shape_like(base)
        name = g.new()
        if 0 in shape:
            text = f"{name} = torch.empty({tup(shape)}, dtype={dtype}).to(dev)"
        else:
            values = g.values(shape, dtype, special=g.rng.random() < 0.3)
            text = f"{name} = torch.tensor({Gen.literal(values)}, dtype={dtype}).to(dev)"
        g.execute(Line("input", "input", text))


# ---------------------------------------------------------------- ops


class OpSpec(NamedTuple):
    kind: str
    weight: float
    make: Callable[[Gen], tuple[str, str]]  # -> (label, line)


OPS: list[OpSpec] = []


def op(kind: str, weight: float = 1.0):
    def register(make):
        OPS.append(OpSpec(kind, weight, make))
        return make

    return register


# -- views


@op("view", 2)
def reshape(g):
    x, t = g.pick()
    how = g.rng.choice(["view", "view", "reshape", "reshape", "flatten"])
    if how == "flatten":
        return how, f"{g.new()} = {x}.flatten()"
    return how, f"{g.new()} = {x}.{how}({g.reshape_target(t.numel())})"


@op("view", 2)
def transpose(g):
    x, t = g.pick()
    roll, r = g.rng.random(), t.dim()
    if roll < 0.25 and r <= 2:
        return "t", f"{g.new()} = {x}.t()"
    if roll < 0.5:
        return "permute", f"{g.new()} = {x}.permute({tup(g.rng.sample(range(r), r))})"
    return "transpose", f"{g.new()} = {x}.transpose({g.dim(t)}, {g.dim(t)})"


@op("view", 3)
def slicing(g):
    x, t = g.pick(lambda t: t.dim() > 0)
    items = []
    for size in t.shape[: g.rng.randint(1, t.dim())]:
        roll = g.rng.random()
        if roll < 0.2 and size > 0:
            items.append(str(g.rng.randrange(-size, size)))
        elif roll < 0.3:
            items.append(":")
        else:
            start = g.rng.choice(["", "", "1", "-2", str(size)])
            stop = g.rng.choice(["", "", str(max(size - 1, 0)), "-1", str(size + 2)])
            step = g.rng.choices(["", "2", "3", "-1"], [5, 3, 1, 0.1])[0]  # a negative step raises
            items.append(f"{start}:{stop}" + (f":{step}" if step else ""))
    if g.rng.random() < 0.15:
        items.insert(0, "...")
    if g.rng.random() < 0.1:
        items.insert(g.rng.randint(0, len(items)), "None")
    return "slice", f"{g.new()} = {x}[{', '.join(items)}]"


@op("view", 1)
def select(g):
    x, t = g.pick(lambda t: t.dim() > 0)
    d = g.dim(t)
    size = t.shape[d]
    if g.rng.random() < 0.5:
        i = g.rng.randrange(-size, size) if size and g.rng.random() < 0.95 else size
        return "select", f"{g.new()} = {x}.select({d}, {i})"
    start = g.rng.randint(0, size)
    length = g.rng.randint(0, size - start) + (g.rng.random() < 0.05)
    return "narrow", f"{g.new()} = {x}.narrow({d}, {start}, {length})"


@op("view", 2)
def expand(g):
    x, t = g.pick()
    sizes = [g.rng.choice([1, 2, 3]) if s == 1 else g.rng.choice([s, s, -1]) for s in t.shape]
    if g.rng.random() < 0.4 or not sizes:
        sizes.insert(0, g.rng.randint(1, 3))
    if g.rng.random() < 0.05:
        sizes[-1] = sizes[-1] + 2  # not expandable unless the size was 1
    if g.rng.random() < 0.2:
        return "expand_as", f"{g.new()} = {x}.expand_as(torch.empty({tup(sizes)}, device=dev))"
    return "expand", f"{g.new()} = {x}.expand{tup(sizes)}"


@op("view", 2)
def squeeze(g):
    x, t = g.pick()
    roll = g.rng.random()
    if roll < 0.5:
        return "unsqueeze", f"{g.new()} = {x}.unsqueeze({g.rng.randint(-t.dim() - 1, t.dim())})"
    if roll < 0.7:
        return "squeeze", f"{g.new()} = {x}.squeeze()"
    return "squeeze", f"{g.new()} = {x}.squeeze({g.dim(t)})"


@op("view", 1)
def diagonal(g):
    x, t = g.pick(lambda t: t.dim() >= 2)
    d1, d2 = g.rng.sample(range(t.dim()), 2)
    if g.rng.random() < 0.2 and t.dim() == 2:
        return "diag", f"{g.new()} = torch.diag({x}, {g.rng.randint(-2, 2)})"  # a copy, not a view
    return "diagonal", f"{g.new()} = {x}.diagonal({g.rng.randint(-2, 2)}, {d1}, {d2})"


@op("view", 1)
def as_strided(g):
    x, t = g.pick()
    storage = t.untyped_storage().nbytes() // t.element_size()
    for _ in range(6):
        rank = g.rng.randint(0, 3)
        sizes = [g.rng.randint(0, 3) for _ in range(rank)]
        strides = [g.rng.choice([0, 1, 1, 2, 3, 4]) for _ in range(rank)]
        span = sum((s - 1) * st for s, st in zip(sizes, strides, strict=True)) if all(sizes) else -1
        if span < storage:
            break
    offset = g.rng.randint(0, max(storage - 1 - span, 0))
    return "as_strided", f"{g.new()} = {x}.as_strided({tup(sizes)}, {tup(strides)}, {offset})"


@op("view", 1)
def unfold(g):
    x, t = g.pick()
    d = g.dim(t)
    size_d = t.shape[d] if t.dim() else 1
    size = g.rng.randint(0, size_d) + (g.rng.random() < 0.05)
    return "unfold", f"{g.new()} = {x}.unfold({d}, {size}, {g.rng.randint(1, 3)})"


@op("view", 2)
def split(g):
    x, t = g.pick(lambda t: t.dim() > 0)
    d = g.dim(t)
    size = t.shape[d]
    roll = g.rng.random()
    if roll < 0.35:
        return "split", f"{g.new()} = {x}.split({g.rng.randint(1, 3)}, {d})"
    if roll < 0.6:
        return "chunk", f"{g.new()} = {x}.chunk({g.rng.randint(1, 4)}, {d})"
    if roll < 0.8:
        return "unbind", f"{g.new()} = {x}.unbind({d})"
    parts = []
    while sum(parts) < size:
        parts.append(g.rng.randint(1, size - sum(parts)))
    if g.rng.random() < 0.2:
        parts.insert(g.rng.randint(0, len(parts)), g.rng.choice([0, 1]))  # an empty part, or one too many
    return "split", f"{g.new()} = {x}.split({parts}, {d})"


@op("view", 1)
def view_dtype(g):
    x, t = g.pick()
    dtype = SAME_SIZE.get(t.dtype)
    if dtype is None or g.rng.random() < 0.15:  # another element size: the last dim scales
        dtype = g.rng.choice([torch.int32, torch.uint8, torch.bfloat16, torch.int64])
    if bit_noise(t):
        raise Skip
    with contextlib.suppress(RuntimeError):  # (a view that raises is kept: both devices must raise)
        if bit_noise(t.view(dtype)):
            raise Skip
    return "view(dtype)", f"{g.new()} = {x}.view({dtype})"


def bit_noise(t: torch.Tensor) -> bool:
    """Float values whose bits are not PyTorch semantics: NaN payloads, and subnormals
    (which XLA may flush to zero): what a view as another dtype would expose."""
    return t.dtype.is_floating_point and (bool(t.isnan().any()) or _subnormal(t))


def cat_partner(g: Gen, t: torch.Tensor, d: int) -> str:
    """A tensor to concatenate with t along d (t itself if nothing else fits)."""
    d = d % max(t.dim(), 1)
    return g.pick(
        lambda u: u.dim() == t.dim() and [*u.shape[:d], *u.shape[d + 1 :]] == [*t.shape[:d], *t.shape[d + 1 :]]
    )[0]


# -- in-place ops (on any live tensor: inputs, views, expanded views)


def safe_divisor(result_integral: bool, other: str, value) -> str:
    """trunc division of integers by -1 at the minimum traps the CPU (SIGFPE): keep -1 out."""
    if result_integral and (isinstance(value, torch.Tensor) or value == -1):
        return "2"
    return other


@op("inplace", 4)
def arith_(g):
    x, t = g.pick()
    name = g.rng.choice(["add_", "sub_", "mul_", "div_"])
    other, value = g.other(t)
    args = other
    if name in ("add_", "sub_") and g.rng.random() < 0.2:
        args += ", alpha=2"
    if name == "div_" and g.rng.random() < 0.5:
        mode = g.rng.choice(["floor", "trunc"])
        if mode == "trunc":
            other = safe_divisor(not is_float(t), other, value)
        args = f"{other}, rounding_mode={mode!r}"
    return name, g.statement(f"{x}.{name}({args})")


def bounds(g: Gen, t: torch.Tensor) -> tuple[str, str]:
    """clamp's (min, max): both tensors or both scalars (nan included), each sometimes None."""
    tensors = g.rng.random() < 0.25

    def bound():
        if g.rng.random() < 0.15:
            return "None"
        if tensors:
            return g.pick(lambda u: broadcastable(u.shape, t.shape))[0]
        return g.rng.choice(["-1", "0", "0.5", "2", "3.5", "nan", "-inf", "inf"])

    return bound(), bound()


@op("inplace", 1)
def clamp_(g):
    x, t = g.pick()
    lo, hi = bounds(g, t)
    roll = g.rng.random()
    if roll < 0.6 or "None" in (lo, hi):
        return "clamp_", g.statement(f"{x}.clamp_({lo}, {hi})")
    if roll < 0.8:
        return "clamp_min_", g.statement(f"{x}.clamp_min_({lo})")
    return "clamp_max_", g.statement(f"{x}.clamp_max_({hi})")


@op("inplace", 1)
def fill_(g):
    x, t = g.pick()
    roll = g.rng.random()
    if roll < 0.25:
        return "zero_", g.statement(f"{x}.zero_()")
    if roll < 0.4:
        value = g.scalar()
        if not castable(torch.tensor(eval(value, g.ns)), t.dtype):  # a tensor value is cast unchecked
            raise Skip
        return "fill_", g.statement(f"{x}.fill_(torch.tensor({value}, device=dev))")
    return "fill_", g.statement(f"{x}.fill_({g.scalar()})")


@op("inplace", 3)
def copy_(g):
    x, t = g.pick()
    roll = g.rng.random()
    try:
        if roll < 0.15:  # from an alias: partial overlap raises
            ptr = t.untyped_storage().data_ptr()
            src = g.pick(lambda u: u.untyped_storage().data_ptr() == ptr and castable(u, t.dtype))[0]
        elif roll < 0.9:
            src = g.pick(lambda u: broadcastable(u.shape, t.shape) and castable(u, t.dtype))[0]
        else:
            src = g.pick(lambda u: castable(u, t.dtype))[0]
    except Skip:
        src = f"torch.tensor({g.literal(g.value(t.dtype, True))}, device=dev)"
    if g.rng.random() < 0.2 and t.dim() > 0:
        return "setitem", f"{x}[{g.rng.randint(0, 1)}:] = {src}"
    return "copy_", g.statement(f"{x}.copy_({src})")


def mask_for(g: Gen, t: torch.Tensor) -> str:
    """A bool tensor broadcastable to t: a live one, or a comparison of one."""
    if g.rng.random() < 0.5:
        with contextlib.suppress(Skip):
            return g.pick(lambda u: u.dtype == torch.bool and broadcastable(u.shape, t.shape))[0]
    y, u = g.pick(lambda u: broadcastable(u.shape, t.shape))
    return f"({y} > 0)" if u.dtype != torch.bool else y


@op("inplace", 2)
def masked_fill_(g):
    x, t = g.pick()
    mask = mask_for(g, t)
    value = g.scalar() if g.rng.random() < 0.8 else f"torch.tensor({g.scalar()}, device=dev)"
    if g.rng.random() < 0.3:
        return "setitem", f"{x}[{mask}] = {value}"
    return "masked_fill_", g.statement(f"{x}.masked_fill_({mask}, {value})")


@op("inplace", 2)
def index_put_(g):
    x, t = g.pick(lambda t: t.dim() > 0)
    idx = g.index_tensor(t.shape[0])
    dtype = t.dtype if g.rng.random() < 0.9 else g.rng.choice(DTYPES)
    values = f"torch.tensor({g.literal(g.value(dtype, False))}, dtype={dtype}, device=dev)"
    roll = g.rng.random()
    if roll < 0.35:
        return "setitem", f"{x}[{idx}] = {g.scalar() if g.rng.random() < 0.5 else values}"
    acc = g.rng.random() < 0.4
    return "index_put_", g.statement(f"{x}.index_put_(({idx},), {values}, accumulate={acc})")


@op("inplace", 1)
def index_add_(g):
    x, t = g.pick(lambda t: t.dim() > 0)
    d = g.rng.randrange(t.dim())
    n = g.rng.randint(0, 3)
    idx = g.index_tensor(t.shape[d], n, negative=False)
    shape = list(t.shape)
    shape[d] = n
    try:
        src = g.pick(lambda u: list(u.shape) == shape and u.dtype == t.dtype)[0]
    except Skip:
        v = "True" if t.dtype == torch.bool else "2" if not is_float(t) else "1.5"
        src = f"torch.full({tup(shape)}, {v}, dtype={t.dtype}, device=dev)"
    alpha = ", alpha=3" if g.rng.random() < 0.2 and t.dtype != torch.bool else ""
    return "index_add_", g.statement(f"{x}.index_add_({d}, {idx}, {src}{alpha})")


UNARY_FLOAT = ["abs", "neg", "round", "trunc", "frac", "floor", "ceil", "sign", "sqrt", "relu", "reciprocal", "exp"]
UNARY_FLOAT += ["sigmoid", "tanh", "nan_to_num", "square", "sgn"]
UNARY_INT = ["abs", "neg", "sign", "bitwise_not", "square", "relu", "round", "floor"]
UNARY_BOOL = ["logical_not", "bitwise_not"]


def unary_name(g: Gen, t: torch.Tensor) -> str:
    if g.rng.random() < 0.1:
        return g.rng.choice(UNARY_FLOAT + UNARY_INT + UNARY_BOOL)
    return g.rng.choice(UNARY_FLOAT if is_float(t) else UNARY_BOOL if t.dtype == torch.bool else UNARY_INT)


@op("inplace", 2)
def unary_(g):
    x, t = g.pick()
    name = unary_name(g, t)
    if name == "round" and is_float(t) and g.rng.random() < 0.3:
        return "round_", g.statement(f"{x}.round_(decimals=1)")
    return name + "_", g.statement(f"{x}.{name}_()")


@op("inplace", 1)
def pow_(g):
    x, t = g.pick()
    roll = g.rng.random()
    if roll < 0.15:
        exponent = g.other(t, tensor=True)[0]
    elif roll < 0.35:
        exponent = g.rng.choice(["0.5", "2.0", "-1.5", "nan"])
    else:
        exponent = str(g.rng.choice(INT_EXPONENTS))
    return "pow_", g.statement(f"{x}.pow_({exponent})")


@op("inplace", 1)
def mod_(g):
    x, t = g.pick()
    name = g.rng.choice(["fmod_", "remainder_"])
    return name, g.statement(f"{x}.{name}({g.other(t)[0]})")


@op("inplace", 1)
def lerp_(g):
    x, t = g.pick(is_float)
    end = g.pick(lambda u: broadcastable(u.shape, t.shape))[0]
    weight = g.rng.choice(["0.5", "0.25", "2.0", "nan"]) if g.rng.random() < 0.8 else g.other(t, tensor=True)[0]
    return "lerp_", g.statement(f"{x}.lerp_({end}, {weight})")


@op("inplace", 1)
def logical_(g):
    x, t = g.pick(lambda t: not is_float(t) or g.rng.random() < 0.1)
    name = g.rng.choice(["bitwise_and_", "bitwise_or_", "bitwise_xor_", "logical_and_", "logical_or_", "logical_xor_"])
    other = g.scalar(g.rng.choice(["int", "bool"])) if g.rng.random() < 0.3 else g.other(t, tensor=True)[0]
    return name, g.statement(f"{x}.{name}({other})")


# -- out= variants


OUT_OPS = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp", "neg", "abs", "cat", "sum", "index_select"]
OUT_OPS += ["where", "where"]


@op("out", 5)
def out_variant(g):
    name = g.rng.choice(OUT_OPS)
    a, ta = g.pick()
    if name in ("add", "sub", "mul", "div"):
        other, value = g.other(ta)
        args = f"{a}, {other}"
        if name == "div" and g.rng.random() < 0.3:
            args = f"{a}, {safe_divisor(True, other, value)}, rounding_mode='trunc'"
    elif name in ("maximum", "minimum"):
        args = f"{a}, {g.other(ta, tensor=True)[0]}"
    elif name == "clamp":
        args = f"{a}, {', '.join(bounds(g, ta))}"
    elif name in ("neg", "abs"):
        args = a
    elif name == "cat":
        d = g.dim(ta)
        args = f"[{a}, {cat_partner(g, ta, d)}], {d}"
    elif name == "sum":
        args = f"{a}, {g.dim(ta)}"
    elif name == "index_select":
        d = g.dim(ta)
        args = f"{a}, {d}, {g.index_tensor(ta.shape[d] if ta.dim() else 1, negative=False)}"
    else:  # where
        args = f"{mask_for(g, ta)}, {a}, {g.other(ta, tensor=True)[0]}"
    try:
        result = eval(f"torch.{name}({args})", dict(g.ns))
    except Exception:
        raise Skip from None  # the op itself fails: not an out= case
    roll = g.rng.random()
    if roll < 0.45:
        out = f"torch.zeros({tup(result.shape)}, dtype={result.dtype}, device=dev)"
    elif roll < 0.55:
        dtype = g.rng.choice([d for d in DTYPES if d != result.dtype])
        out = f"torch.zeros({tup(result.shape)}, dtype={dtype}, device=dev)"
    elif roll < 0.65:
        shape = g.rng.choice([[0], [1], [result.numel() + 1], g.random_shape()])
        out = f"torch.zeros({tup(shape)}, dtype={result.dtype}, device=dev)"
    elif roll < 0.85:
        out = g.pick()[0]
    else:
        out = a
    if not castable(result, eval(out, dict(g.ns)).dtype):
        raise Skip  # a float result of inf, NaN or out of range into an integer out=: undefined
    call = f"torch.{name}({args}, out={out})"
    return f"out={name}", (f"{g.new()} = {call}" if out.startswith("torch.") else g.statement(call))


@op("out", 1)
def where_out_self(g):
    x, t = g.pick()
    other = g.other(t, tensor=True)[0]
    return "out=where", g.statement(f"torch.where({mask_for(g, t)}, {x}, {other}, out={x})")


# -- functional ops


INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floor_divide", "%": "remainder", "**": "pow"}
BITWISE = {"&": "bitwise_and", "|": "bitwise_or", "^": "bitwise_xor"}
BINARY_FNS = ["add", "sub", "div", "fmod", "remainder", "floor_divide", "true_divide", "maximum", "minimum"]
BINARY_FNS += ["fmax", "fmin", "logical_and", "logical_xor", "atan2", "mul"]


@op("functional", 5)
def binary(g):
    a, ta = g.pick()
    other, value = g.other(ta)
    roll = g.rng.random()
    if roll < 0.4:
        sym = g.rng.choice(list(INFIX) + (list(BITWISE) if not is_float(ta) else []))
        return INFIX.get(sym) or BITWISE[sym], f"{g.new()} = {a} {sym} {other}"
    if roll < 0.5:
        sym = g.rng.choice(list(INFIX))
        return INFIX[sym], f"{g.new()} = {g.scalar()} {sym} {a}"
    name = g.rng.choice(BINARY_FNS)
    if name in ("maximum", "minimum", "fmax", "fmin", "atan2"):
        other, value = g.other(ta, tensor=True)
    args = f"{a}, {other}"
    if name in ("add", "sub") and g.rng.random() < 0.3:
        args += g.rng.choice([", alpha=2", ", alpha=-1", ", alpha=0.5"])
    if name == "div" and g.rng.random() < 0.6:
        mode = g.rng.choice(["floor", "trunc"])
        integral = not is_float(ta) and not (isinstance(value, torch.Tensor) and is_float(value))
        if mode == "trunc":
            args = f"{a}, {safe_divisor(integral and not isinstance(value, float), other, value)}"
        args += f", rounding_mode={mode!r}"
    return name, f"{g.new()} = torch.{name}({args})"


@op("functional", 2)
def comparison(g):
    a, ta = g.pick()
    roll = g.rng.random()
    if roll < 0.25:
        name = g.rng.choice(["isnan", "isinf", "isfinite", "signbit", "isneginf", "isposinf"])
        if name == "signbit" and ta.is_floating_point() and ta.isnan().any():
            raise Skip  # a NaN's sign is not specified (inf - inf is -nan on x86)
        return name, f"{g.new()} = torch.{name}({a})"
    sym = g.rng.choice(["<", "<=", ">", ">=", "==", "!="])
    names = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
    return names[sym], f"{g.new()} = {a} {sym} {g.other(ta)[0]}"


@op("functional", 3)
def unary(g):
    a, ta = g.pick()
    roll = g.rng.random()
    if roll < 0.2:
        dtype = g.rng.choices(DTYPES, DTYPE_WEIGHTS)[0]
        if not castable(ta, dtype):
            raise Skip  # float to int of NaN, inf or out-of-range values is undefined
        return "to", f"{g.new()} = {a}.to({dtype})"
    if roll < 0.3:
        how = g.rng.choice(["clone", "contiguous", "float", "nan_to_num"])
        if how == "nan_to_num" and g.rng.random() < 0.5:
            return how, f"{g.new()} = {a}.nan_to_num(0.0, 1.0, -1.0)"
        return how, f"{g.new()} = {a}.{how}()"
    name = unary_name(g, ta)
    if name == "bitwise_not" and g.rng.random() < 0.5:
        return name, f"{g.new()} = ~{a}"
    return name, f"{g.new()} = torch.{name}({a})"


@op("functional", 2)
def clamp(g):
    a, ta = g.pick()
    lo, hi = bounds(g, ta)
    roll = g.rng.random()
    if roll < 0.7 or "None" in (lo, hi):
        return "clamp", f"{g.new()} = torch.clamp({a}, {lo}, {hi})"
    if roll < 0.85:
        return "clamp_min", f"{g.new()} = {a}.clamp_min({lo})"
    return "clamp_max", f"{g.new()} = {a}.clamp_max({hi})"


@op("functional", 2)
def where(g):
    a, ta = g.pick()
    mask = mask_for(g, ta)
    b = g.other(ta)[0]
    roll = g.rng.random()
    if roll < 0.3:
        return "masked_fill", f"{g.new()} = {a}.masked_fill({mask}, {g.scalar()})"
    if roll < 0.5:
        return "where", f"{g.new()} = torch.where({mask}, {g.scalar()}, {b})"
    return "where", f"{g.new()} = torch.where({mask}, {a}, {b})"


@op("functional", 2)
def power(g):
    a, ta = g.pick()
    roll = g.rng.random()
    if roll < 0.5:
        return "pow", f"{g.new()} = torch.pow({a}, {g.rng.choice(INT_EXPONENTS)})"
    if roll < 0.65:
        return "pow", f"{g.new()} = {a} ** {g.rng.choice(['0.5', '2.0', '-1.0', '3'])}"
    if roll < 0.8:
        return "pow", f"{g.new()} = torch.pow({g.rng.choice(['2', '-2', '0.5', '0', '3'])}, {a})"
    return "pow", f"{g.new()} = torch.pow({a}, {g.other(ta, tensor=True)[0]})"


REDUCTIONS = ["sum", "sum", "amax", "amin", "argmax", "argmin", "mean", "prod", "any", "all", "max", "min"]
REDUCTIONS += ["count_nonzero", "nansum"]


@op("functional", 4)
def reduce(g):
    a, ta = g.pick()
    name = g.rng.choice(REDUCTIONS)
    if name == "mean" and not is_float(ta) and g.rng.random() < 0.8:
        raise Skip  # mean of integers raises: mostly draw something else
    args = []
    roll = g.rng.random()
    if roll < 0.5 and ta.dim():
        args.append(str(g.dim(ta)))
    elif roll < 0.65 and ta.dim() >= 2 and name in ("sum", "amax", "amin", "mean", "count_nonzero", "nansum"):
        args.append(tup(g.rng.sample(range(ta.dim()), 2)))
    if args and name not in ("count_nonzero",) and g.rng.random() < 0.4:
        args.append("keepdim=True")
    if name in ("sum", "prod") and g.rng.random() < 0.2:
        args.append(f"dtype={g.accumulator(ta, [torch.float32, torch.int64, torch.bfloat16])}")
    if name in ("max", "min") and not args and g.rng.random() < 0.5:
        args.append("0" if ta.dim() else "-1")  # -> (values, indices)
    return name, f"{g.new()} = torch.{name}({', '.join([a, *args])})"


@op("functional", 1)
def cat(g):
    a, ta = g.pick()
    d = g.dim(ta)
    if g.rng.random() < 0.3 or ta.dim() == 0:
        b = g.pick(lambda u: u.shape == ta.shape)[0]
        return "stack", f"{g.new()} = torch.stack([{a}, {b}], {g.rng.randint(0, ta.dim())})"
    parts = [a, cat_partner(g, ta, d)]
    if g.rng.random() < 0.15:
        parts.append("torch.tensor([], device=dev)")  # a legacy empty 1-d tensor: skipped, yet promotes
    return "cat", f"{g.new()} = torch.cat([{', '.join(parts)}], {d})"


@op("functional", 2)
def matmul(g):
    a, ta = g.pick(lambda t: t.dim() >= 1 and (is_float(t) or g.rng.random() < 0.2))
    candidates = []
    for expr, u in live_tensors(g.ns).items():
        try:
            torch.matmul(ta, u)
            candidates.append(expr)
        except RuntimeError:
            pass
    b = g.rng.choice(candidates) if candidates and g.rng.random() < 0.7 else f"{a}.mT" if ta.dim() >= 2 else a
    roll = g.rng.random()
    if roll < 0.5:
        return "matmul", f"{g.new()} = {a} @ {b}"
    if roll < 0.7:
        return "matmul", f"{g.new()} = torch.matmul({a}, {b})"
    name = {1: "dot", 2: "mm", 3: "bmm"}.get(ta.dim(), "matmul")
    return name, f"{g.new()} = torch.{name}({a}, {b})"


@op("functional", 2)
def sort(g):
    a, ta = g.pick()
    d = g.dim(ta)
    descending = g.rng.random() < 0.5
    roll = g.rng.random()
    if roll < 0.4:
        return "sort", f"{g.new()} = {a}.sort(dim={d}, descending={descending}, stable=True)"
    if roll < 0.6:
        return "argsort", f"{g.new()} = {a}.argsort(dim={d}, descending={descending}, stable=True)"
    size = ta.shape[d] if ta.dim() else 1
    k = g.rng.randint(0, size) + (g.rng.random() < 0.05)
    # ties make topk's indices unspecified: only its values are compared
    return "topk", f"{g.new()} = torch.topk({a}, {k}, {d}, largest={not descending}).values"


@op("functional", 2)
def cumsum(g):
    a, ta = g.pick()
    d = g.dim(ta)
    roll = g.rng.random()
    if roll < 0.5:
        return "cumsum", f"{g.new()} = {a}.cumsum({d})"
    if roll < 0.7:
        return "cumsum", f"{g.new()} = torch.cumsum({a}, {d}, dtype={g.accumulator(ta, [torch.float32, torch.int32])})"
    return "cumprod", f"{g.new()} = {a}.cumprod({d})"


@op("functional", 2)
def index(g):
    a, ta = g.pick(lambda t: t.dim() > 0)
    d = g.rng.randrange(ta.dim())
    roll = g.rng.random()
    if roll < 0.3:
        return (
            "index_select",
            f"{g.new()} = torch.index_select({a}, {d}, {g.index_tensor(ta.shape[d], negative=False)})",
        )
    if roll < 0.55:
        return "index", f"{g.new()} = {a}[{g.index_tensor(ta.shape[0])}]"
    if roll < 0.75:
        mask = (
            g.pick(lambda u: u.dtype == torch.bool and u.shape == ta.shape)[0] if g.rng.random() < 0.3 else f"{a} > 0"
        )
        return "index(mask)", f"{g.new()} = {a}[{mask}]"
    shape = list(ta.shape)
    shape[d] = g.rng.randint(0, 3)
    flat = [g.rng.randrange(max(ta.shape[d], 1)) for _ in range(math.prod(shape))]
    idx = f"torch.tensor({flat}, dtype=torch.int64, device=dev).view({tup(shape)})"
    return "gather", f"{g.new()} = torch.gather({a}, {d}, {idx})"


KEEP_ERROR = 0.2  # how often an op that raises on CPU is kept (and ends the program)


def _elements(t: torch.Tensor) -> list[int]:
    """The storage offsets of t's elements (the programs' tensors are small)."""
    offsets = [t.storage_offset()]
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = [o + i * stride for o in offsets for i in range(size)]
    return offsets if t.numel() else []


class OverlappingWrites(TorchDispatchMode):
    """Notes an op that writes memory some of its other elements or inputs share,
    where PyTorch leaves the result to the kernel's loop order (undefined): an
    expanded tensor written, an input overlapping the written tensor without being
    it. Where CPU refuses such an op the program keeps it (both must raise);
    where CPU computes something, the op is not drawn."""

    def __init__(self):
        super().__init__()
        self.undefined = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written, inputs = [], []
        for i, a in enumerate(func._schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for t in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(t, torch.Tensor):
                    (written if a.alias_info is not None and a.alias_info.is_write else inputs).append(t)
        for w in written:
            mine = _elements(w)
            if len(set(mine)) != len(mine) and func not in (torch.ops.aten.fill_.Scalar, torch.ops.aten.zero_.default):
                self.undefined = True
            for t in inputs:
                same_view = (t.storage_offset(), t.shape, t.stride()) == (w.storage_offset(), w.shape, w.stride())
                if t.untyped_storage()._cdata == w.untyped_storage()._cdata and not same_view:
                    self.undefined |= bool(set(mine) & set(_elements(t)))
        return func(*args, **kwargs)


@quiet()
def generate(seed: int, index: int, functional: bool = False) -> tuple[Line, ...]:
    """The program (seed, index): input lines, then 3-12 ops. functional: views and
    functional ops only, none raising on CPU (the compile flavor)."""
    g = Gen(seed, index)
    add_inputs(g)
    specs = [s for s in OPS if not functional or s.kind in ("view", "functional")]
    weights = [s.weight for s in specs]
    ops, target = 0, g.rng.randint(3, 12)
    for _ in range(100):
        if ops >= target:
            break
        spec = g.rng.choices(specs, weights)[0]
        try:
            label, text = spec.make(g)
        except Skip:
            continue
        line = Line(label, spec.kind, text)
        probe = OverlappingWrites()
        with probe:
            error = g.execute(line)
        if error is None and probe.undefined:  # computed by CPU, but in an undefined order
            g.lines.pop()
            g.rebuild()
            continue
        if error is None:
            ops += 1
        elif not functional and g.rng.random() < KEEP_ERROR:  # (error is set)
            g.lines.append(line)  # both devices must raise here: the program ends
            break
    return tuple(g.lines)


# ---------------------------------------------------------------- running and comparing


class State(NamedTuple):
    dtype: torch.dtype
    shape: tuple
    stride: tuple
    offset: int
    storage: int  # the StorageImpl's identity: equal for tensors that share a storage
    values: torch.Tensor  # on CPU


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, State]:
    return {
        name: State(
            t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage()._cdata, t.to("cpu", copy=True)
        )
        for name, t in tensors.items()
    }


def compare(cpu: dict[str, State], tpu: dict[str, State], aliasing: bool = True) -> list[tuple[str, str, str]]:
    """(kind, tensor, detail) for each difference, in program order."""
    found = []
    # Storages that a live float tensor views: their integer views show the
    # float results' bits, which need not match to the last one (the float
    # views are compared with float tolerances).
    float_storages = {s.storage for s in cpu.values() if s.dtype.is_floating_point}
    # Likewise a float view of another float dtype's NaN (a float16 NaN seen as
    # bfloat16 is a number): NaN payloads are not specified (CPU's float16
    # arithmetic makes 0x7E00, XLA keeps the operand's payload).
    nan_dtypes: dict[int, set] = {}  # storage -> the float dtypes whose view of it holds a NaN
    for st in cpu.values():
        if st.dtype.is_floating_point and st.values.isnan().any():
            nan_dtypes.setdefault(st.storage, set()).add(st.dtype)
    for name in [*cpu, *(n for n in tpu if n not in cpu)]:
        c, t = cpu.get(name), tpu.get(name)
        if c is None or t is None:
            found.append(("shape", name, f"{name} exists on {'tpu' if c is None else 'cpu'} only"))
        elif c.dtype != t.dtype:
            found.append(("dtype", name, f"{name}: cpu {c.dtype}, tpu {t.dtype}"))
        elif c.shape != t.shape:
            found.append(("shape", name, f"{name}: cpu {list(c.shape)}, tpu {list(t.shape)}"))
        else:
            if (c.stride, c.offset) != (t.stride, t.offset):
                found.append(
                    (
                        stride_kind(c, t),
                        name,
                        f"{name} {list(c.shape)}: cpu stride {c.stride} offset {c.offset}, "
                        f"tpu stride {t.stride} offset {t.offset}",
                    )
                )
            if not c.dtype.is_floating_point and c.storage in float_storages:
                continue
            if c.dtype.is_floating_point and c.dtype not in nan_dtypes.get(c.storage, {c.dtype}):
                continue
            try:
                torch.testing.assert_close(t.values, c.values, equal_nan=True, check_stride=False)
            except AssertionError:
                found.append(("value", name, f"{name}: cpu {brief(c.values)}, tpu {brief(t.values)}"))
    if aliasing:
        common = [n for n in cpu if n in tpu]
        for i, a in enumerate(common):
            for b in common[i + 1 :]:
                shared_cpu, shared_tpu = cpu[a].storage == cpu[b].storage, tpu[a].storage == tpu[b].storage
                if shared_cpu != shared_tpu:
                    how = "share a storage on cpu, not on tpu" if shared_cpu else "share a storage on tpu, not on cpu"
                    found.append(("aliasing", b, f"{a} and {b} {how}"))
    return found


def stride_kind(c: State, t: State) -> str:
    """The kind of a stride difference: "stride (size-1/empty)" where only strides that
    address no other element differ (dims of size 1, or a tensor without elements)."""
    if (
        c.offset != t.offset
        or 0 not in c.shape
        and any(n > 1 and a != b for n, a, b in zip(c.shape, c.stride, t.stride, strict=True))
    ):
        return "stride"
    return "stride (size-1/empty)"


def brief(t: torch.Tensor) -> str:
    text = str(t.tolist()) if t.numel() <= 24 else f"{t.flatten()[:24].tolist()}..."
    return text if len(text) <= 240 else text[:240] + "..."


def describe(e: BaseException) -> str:
    message = " ".join(line.strip() for line in str(e).strip().splitlines()[:2])  # Dynamo's: the cause on line 2
    return f"{type(e).__name__}: {message[:240]}"


class Run(NamedTuple):
    state: dict[str, State] | None  # the live tensors at the end, or before the op that raised
    error_at: int | None  # the op that raised; None with an error: raised later (a deferred error)
    error: Exception | None
    trace: list[dict[str, State]]  # with trace=True: the state after each op


def sync():
    torch.tpu.synchronize()


@quiet()
def run_cpu(lines, trace: bool = False) -> Run:
    ns, states = namespace("cpu"), []
    for i, line in enumerate(lines):
        try:
            exec(line.text, ns)
        except Exception as e:
            before = namespace("cpu")  # rerun: the failed op may have written part of its result
            for prior in lines[:i]:
                exec(prior.text, before)
            return Run(snapshot(live_tensors(before)), i, e, states)
        if trace:
            states.append(snapshot(live_tensors(ns)))
    return Run(snapshot(live_tensors(ns)), None, None, states)


@quiet()
def run_tpu(lines, mode: str, stop_at: int | None, trace: bool = False) -> Run:
    """The program on tpu in an eager mode. stop_at (where CPU raised): the state is
    taken before that op, synchronized, and the op must raise by the next sync."""
    ns, states = namespace("tpu"), []
    with torch_tpu.set_eager_mode(mode):
        for i, line in enumerate(lines):
            if i == stop_at:
                try:
                    sync()
                    before = snapshot(live_tensors(ns))
                except Exception as e:
                    return Run(None, None, e, states)
                try:
                    exec(line.text, ns)
                    sync()
                except Exception as e:
                    return Run(before, i, e, states)
                return Run(before, None, None, states)
            try:
                exec(line.text, ns)
                if trace:
                    sync()
                    states.append(snapshot(live_tensors(ns)))
            except Exception as e:
                return Run(None, i, e, states)
        try:
            sync()
            return Run(snapshot(live_tensors(ns)), None, None, states)
        except Exception as e:
            return Run(None, None, e, states)


def judge(cpu: Run, tpu: Run) -> list[Divergence]:
    if tpu.error is not None and (cpu.error is None or tpu.error_at != cpu.error_at):
        return [Divergence("tpu raised", tpu.error_at, describe(tpu.error))]
    found = []
    if cpu.error is not None and tpu.error is None:
        found.append(Divergence("cpu raised", cpu.error_at, describe(cpu.error)))
    elif cpu.error is not None and type(cpu.error) is not type(tpu.error):
        detail = f"cpu {describe(cpu.error)} | tpu {describe(tpu.error)}"
        found.append(Divergence("exception class", cpu.error_at, detail))
    found += [Divergence(kind, None, detail) for kind, _, detail in compare(cpu.state, tpu.state)]
    return found


def check(lines, mode: str) -> list[Divergence]:
    """Every divergence of the program between CPU and tpu in `mode` (empty: they agree)."""
    return check_run(lines, mode)[0]


def check_run(lines, mode: str) -> tuple[list[Divergence], Run]:
    """check(), and the CPU run."""
    if _heartbeat:
        _heartbeat()
    cpu = run_cpu(lines)
    if mode == "compile":
        return check_compiled(lines, cpu), cpu
    return judge(cpu, run_tpu(lines, mode, cpu.error_at)), cpu


def binder(lines) -> dict[str, int]:
    """Each name -> the index of the line that binds it."""
    found = {}
    for i, line in enumerate(lines):
        m = BINDS.match(line.text)
        if m:
            found.update({n: i for n in m.group(1).split(", ")})
    return found


def compiled_source(lines) -> tuple[list[str], str]:
    """(parameters, source of `program`): the ops of a functional program as one
    function returning what its functional ops made (views of inputs are not returned)."""
    params = [BINDS.match(line.text).group(1) for line in lines if line.kind == "input"]
    body = [line for line in lines if line.kind != "input"]
    outputs = [n for n, i in binder(lines).items() if lines[i].kind == "functional"]
    source = f"def program({', '.join(params)}):\n"
    source += "".join(f"    {line.text}\n" for line in body)
    source += "    return {" + ", ".join(f"{n!r}: {n}" for n in outputs) + "}\n"
    return params, source


@quiet()
def check_compiled(lines, cpu: Run) -> list[Divergence]:
    if cpu.error is not None:
        return []  # generated compile programs run on CPU; a shrunk one that raises is no repro
    params, source = compiled_source(lines)
    bound_at = binder(lines)
    torch._dynamo.reset()
    ns = namespace("tpu")
    try:
        for line in lines:
            if line.kind == "input":
                exec(line.text, ns)
        exec(compile(source, "<semantics program>", "exec"), ns)
        result = torch.compile(ns["program"], backend="tpu")(*(ns[p] for p in params))
        sync()
        actual = snapshot(live_tensors(result))
    except Exception as e:
        return [Divergence("tpu raised", None, describe(e))]
    expected = {n: s for n, s in cpu.state.items() if n.split("[")[0] in result}
    return [Divergence(k, bound_at[n.split("[")[0]], d) for k, n, d in compare(expected, actual, aliasing=False)]


def localize(lines, mode: str, found: list[Divergence]) -> Divergence:
    """The first divergence, with the op after which it first shows."""
    first = min((d for d in found if d.op is not None), key=lambda d: d.op, default=None)
    if mode != "compile":
        traced = first_in_trace(lines, mode)
        if traced is not None and (first is None or traced.op < first.op):
            first = traced
    if first is None:  # compiled, or only in a whole fused window: the shortest diverging prefix
        for n in range(1, len(lines) + 1):
            prefix = check(lines[:n], mode)
            if prefix:
                return prefix[0]._replace(op=n - 1 if prefix[0].op is None else prefix[0].op)
        first = found[0]._replace(op=len(lines) - 1)
    return first


def first_in_trace(lines, mode: str) -> Divergence | None:
    """The first op after which the states differ, comparing after every op."""
    cpu = run_cpu(lines, trace=True)
    tpu = run_tpu(lines, mode, cpu.error_at, trace=True)
    for i, (c, t) in enumerate(zip(cpu.trace, tpu.trace, strict=False)):
        diffs = compare(c, t)
        if diffs:
            return Divergence(diffs[0][0], i, diffs[0][2])
    if tpu.error is not None and tpu.error_at is not None and tpu.error_at != cpu.error_at:
        return Divergence("tpu raised", tpu.error_at, describe(tpu.error))
    return None


def minimize(lines, mode: str, divergence: Divergence) -> list[Line]:
    """Drops lines before the diverging op while the same kind of divergence remains."""
    lines = list(lines[: divergence.op + 1])
    for _ in range(3):
        changed = False
        for i in reversed(range(len(lines) - 1)):
            candidate = lines[:i] + lines[i + 1 :]
            last = len(candidate) - 1
            if any(d.kind == divergence.kind and d.op in (None, last) for d in check(candidate, mode)):
                lines, changed = candidate, True
        if not changed:
            break
    return lines


def repro(lines, mode: str, divergence: Divergence) -> str:
    out = ["import torch", "import torch_tpu", "from math import inf, nan", ""]
    if mode == "compile":
        params, source = compiled_source(lines)
        out += ['dev = "tpu"  # the same with dev = "cpu" and program() uncompiled gives what CPU does']
        out += [line.text for line in lines if line.kind == "input"]
        out += source.rstrip().splitlines()
        out.append(f'print(torch.compile(program, backend="tpu")({", ".join(params)}))')
    else:
        if mode != "strict":
            out.append(f'torch_tpu.set_eager_mode("{mode}")')
        out.append('dev = "tpu"  # run again with dev = "cpu" and compare')
        out += [line.text for line in lines]
    out.append(f"# {divergence.kind}: {divergence.detail}")
    return "\n".join(out)


@quiet()
def known(divergence: Divergence, lines, mode: str) -> str | None:
    at = divergence.op if divergence.op is not None and divergence.op < len(lines) else None
    line = lines[at].text if at is not None else ""
    ns = namespace("cpu")
    if at is not None:
        try:
            for prior in lines[:at]:
                exec(prior.text, ns)
        except Exception:  # noqa: BLE001 - a program CPU cannot run this far: no tensors to look at
            ns = namespace("cpu")
    return next(
        (name for name, k in KNOWN_DIVERGENCES.items() if mode in k.modes and k.applies(divergence, line, ns)), None
    )


# ---------------------------------------------------------------- sweeps


@dataclasses.dataclass
class Finding:
    index: int
    first: Divergence  # localized
    label: str  # the op where it first shows
    known: str | None
    repro: str | None = None

    def to_json(self) -> dict:
        return {
            **self.first._asdict(),
            "index": self.index,
            "label": self.label,
            "known": self.known,
            "repro": self.repro,
        }

    @staticmethod
    def from_json(d: dict) -> Finding:
        return Finding(d["index"], Divergence(d["kind"], d["op"], d["detail"]), d["label"], d["known"], d["repro"])


@dataclasses.dataclass
class Summary:
    mode: str
    seed: int
    start: int
    programs: int = 0
    ended_in_error: int = 0  # programs where CPU raised at an op (tpu must raise there too)
    seconds: float = 0.0
    findings: list[Finding] = dataclasses.field(default_factory=list)

    @property
    def unexplained(self) -> list[Finding]:
        return [f for f in self.findings if f.known is None]

    def report(self, max_indices: int = 12) -> str:
        bad = self.unexplained
        out = [
            f"{self.mode}: {self.programs} programs (seed {self.seed}, start {self.start}) in {self.seconds:.0f} s: "
            f"{len(bad)} diverge, {len(self.findings) - len(bad)} by a known divergence, "
            f"{self.ended_in_error} end at an op that raises on CPU"
        ]
        by_known = collections.Counter(f.known for f in self.findings if f.known)
        out += [f"  known {name}: {n} ({KNOWN_DIVERGENCES[name].explanation})" for name, n in by_known.items()]
        if not bad:
            return "\n".join(out)
        out.append("by kind:")
        out += [f"  {k:22} {n}" for k, n in collections.Counter(f.first.kind for f in bad).most_common()]
        groups = collections.defaultdict(list)
        for f in bad:
            groups[(f.first.kind, f.label)].append(f)
        groups = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        out.append("by kind and first diverging op:")
        for (kind, label), fs in groups:
            indices = ", ".join(str(f.index) for f in fs[:max_indices]) + (", ..." if len(fs) > max_indices else "")
            out.append(f"  {kind:22} {label:16} {len(fs):4}  programs {indices}")
        for (kind, label), fs in groups:
            for f in fs:
                if f.repro:
                    rerun = f"--mode {self.mode} --seed {self.seed} --start {f.index} --programs 1"
                    out += ["", f"--- {kind} at {label} (program {f.index}; rerun: {rerun})", f.repro]
        return "\n".join(out)


def run_one(mode: str, seed: int, index: int, may_shrink: Callable[[str, str], bool]) -> tuple[bool, Finding | None]:
    """Program `index`: (whether CPU raised in it, its first divergence or None). A
    divergence gets a minimal repro when may_shrink(kind, label) says so."""
    lines = generate(seed, index, functional=mode == "compile")
    found, cpu = check_run(lines, mode)
    if not found:
        return cpu.error is not None, None
    first = localize(lines, mode, found)
    label = lines[first.op].label if first.op is not None and first.op < len(lines) else "(end)"
    finding = Finding(index, first, label, known(first, lines, mode))
    if finding.known is None and may_shrink(first.kind, label):
        shrunk = minimize(lines, mode, first)
        again = [d for d in check(shrunk, mode) if d.kind == first.kind]  # its own names and values
        finding.repro = repro(shrunk, mode, again[0] if again else first)
    return cpu.error is not None, finding


class ReproBudget:
    """The first `show` divergences of each (kind, op) group get a repro, at most `total` in all."""

    def __init__(self, show: int, total: int | None = None, used: dict | None = None):
        self.show, self.total = show, total
        self.used = collections.Counter(used or {})

    def __call__(self, kind: str, label: str) -> bool:
        key = f"{kind}|{label}"
        if self.used[key] >= self.show or (self.total is not None and sum(self.used.values()) >= self.total):
            return False
        self.used[key] += 1
        return True


def sweep(mode: str, programs: int, start: int = 0, seed: int = SEED, budget: ReproBudget | None = None) -> Summary:
    """Programs start..start+programs-1 in this process."""
    summary, budget = Summary(mode, seed, start), budget or ReproBudget(3)
    begin = time.monotonic()
    for index in range(start, start + programs):
        cpu_raised, finding = run_one(mode, seed, index, budget)
        summary.programs += 1
        summary.ended_in_error += cpu_raised
        if finding:
            summary.findings.append(finding)
    summary.seconds = time.monotonic() - begin
    return summary


PROTOCOL = "@@semantics "
_heartbeat: Callable[[], None] | None = None  # the worker's: a check still makes progress


def worker(args) -> int:
    """Runs programs and reports each on stdout (for sweep_isolated)."""
    global _heartbeat

    def emit(**event):
        print(PROTOCOL + json.dumps(event), flush=True)

    def alive():
        emit(event="alive")

    _heartbeat = alive
    budget = ReproBudget(args.show, args.max_repros, json.loads(args.repros_used))
    for index in range(args.start, args.start + args.programs):
        emit(event="begin", index=index)
        cpu_raised, finding = run_one(args.mode, args.seed, index, budget)
        emit(event="done", index=index, cpu_raised=cpu_raised, finding=finding and finding.to_json())
    return 0


def worker_events(command: list[str], timeout: float):
    """The events a worker reports; last, a "failed" one if it hung or crashed."""

    def read(stream, lines):
        for line in stream:
            lines.put(line)
        lines.put(None)

    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        lines = queue.Queue()
        threading.Thread(target=read, args=(proc.stdout, lines), daemon=True).start()
        try:
            while True:
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    yield {"event": "failed", "kind": "tpu hung", "detail": f"no progress in {timeout:.0f} s"}
                    return
                if line is None:
                    if proc.wait() != 0:
                        stderr.seek(0)
                        tail = " | ".join(stderr.read().strip().splitlines()[-3:])[-300:]
                        yield {"event": "failed", "kind": "tpu crashed", "detail": f"exit {proc.returncode}: {tail}"}
                    return
                if line.startswith(PROTOCOL):
                    yield json.loads(line[len(PROTOCOL) :])
        finally:
            proc.kill()
            proc.wait()


def sweep_isolated(
    mode: str,
    programs: int,
    start: int = 0,
    seed: int = SEED,
    show: int = 3,
    max_repros: int | None = None,
    timeout: float = 60.0,
    progress: Callable[[int, Summary], None] | None = None,
) -> Summary:
    """sweep() in a worker process: a program that hangs (no progress for `timeout`
    seconds) or crashes the process is a finding, and a new worker goes on after it."""
    summary, budget = Summary(mode, seed, start), ReproBudget(show, max_repros)
    begin, index, end = time.monotonic(), start, start + programs
    while index < end:
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--seed", str(seed)]
        command += ["--start", str(index), "--programs", str(end - index), "--show", str(show)]
        command += ["--repros-used", json.dumps(budget.used)]
        command += ["--max-repros", str(max_repros)] if max_repros is not None else []
        first = index
        for event in worker_events(command, timeout):
            if event["event"] == "begin":
                index = event["index"]
                if progress:
                    progress(index, summary)
            elif event["event"] == "done":
                summary.programs += 1
                summary.ended_in_error += event["cpu_raised"]
                if event["finding"]:
                    finding = Finding.from_json(event["finding"])
                    summary.findings.append(finding)
                    if finding.repro:
                        budget.used[f"{finding.first.kind}|{finding.label}"] += 1
                index += 1
            elif event["event"] == "failed":  # in program `index`: the whole program is the repro
                failure = Divergence(event["kind"], None, event["detail"])
                text = repro(generate(seed, index, functional=mode == "compile"), mode, failure)
                if index > first:  # a hang can depend on what ran before it in the process
                    text += f"\n# (it ran after programs {first}..{index - 1} in the same process)"
                summary.programs += 1
                summary.findings.append(Finding(index, failure, "(whole program)", None, text))
                index += 1
    summary.seconds = time.monotonic() - begin
    return summary


# ---------------------------------------------------------------- pytest


def lines_of(*texts: str) -> tuple[Line, ...]:
    return tuple(Line("input" if i == 0 else "op", "input" if i == 0 else "functional", t) for i, t in enumerate(texts))


def test_programs_are_reproducible_and_mostly_valid():
    programs = [generate(SEED, i) for i in range(60)]
    assert programs == [generate(SEED, i) for i in range(60)]
    assert len(set(programs)) == len(programs)
    ops = [sum(line.kind != "input" for line in p) for p in programs]
    ended_in_error = sum(run_cpu(p).error is not None for p in programs)
    assert sum(ops) / len(ops) >= 4, ops
    assert 0 < ended_in_error < len(programs) // 3, ended_in_error
    for i in range(20):
        assert run_cpu(generate(SEED, i, functional=True)).error is None


@pytest.mark.parametrize(
    "cpu_op,tpu_op,kinds",
    [
        ("t1 = t0 + 1", "t1 = t0 + 2", {"value"}),
        ("t1 = t0 + 1", "t1 = (t0 + 1).int()", {"dtype"}),
        ("t1 = t0.sum(0)", "t1 = t0.sum(0, keepdim=True)", {"shape"}),
        ("t1 = t0.t().clone()", "t1 = t0.t().contiguous()", {"stride"}),
        ("t1 = t0.t()", "t1 = t0.t().clone()", {"aliasing"}),
        ("t1 = t0[1:]", "t1 = t0.clone()[1:]", {"aliasing"}),
        ("t1 = t0.mul_(2)", "t1 = t0 * 2", {"value", "aliasing"}),
        ("t1 = t0 @ t0", "t1 = t0 @ t0.t()", {"shape"}),
        ("t1 = t0.view(-1)", "t1 = t0.reshape(-1)", set()),
    ],
)
def test_comparison_catches_each_kind(cpu_op, tpu_op, kinds):
    """The comparison itself, on two CPU programs standing in for CPU and tpu."""
    start = "t0 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(dev)"
    a, b = run_cpu(lines_of(start, cpu_op)), run_cpu(lines_of(start, tpu_op))
    assert {kind for kind, _, _ in compare(a.state, b.state)} == kinds


def test_exceptions_are_compared():
    start = "t0 = torch.tensor([1, 2]).to(dev)"
    raises = run_cpu(lines_of(start, "t1 = t0.view(3)"))
    index_error = run_cpu(lines_of(start, "t1 = t0[5]"))
    fine = run_cpu(lines_of(start, "t1 = t0.view(2)"))
    assert raises.error_at == 1 and set(raises.state) == {"t0"}
    assert judge(raises, raises) == []
    assert [d.kind for d in judge(raises, fine)] == ["cpu raised", "shape"]
    assert [d.kind for d in judge(fine, raises)] == ["tpu raised"]
    assert [d.kind for d in judge(raises, index_error)] == ["exception class"]


# The sweeps choose their eager modes themselves: the TORCH_TPU_EAGER_MODE
# passes of `make test` (test-fused, test-debug) would only repeat them.
@pytest.mark.skipif(bool(os.environ.get("TORCH_TPU_EAGER_MODE")), reason="sets its own eager modes")
@pytest.mark.parametrize("mode", list(PYTEST_PROGRAMS))
def test_random_programs_match_cpu(mode):
    summary = sweep_isolated(mode, PYTEST_PROGRAMS[mode], show=1, max_repros=6, timeout=20)
    if summary.unexplained:
        rerun = f"python tests/python/test_semantics.py --mode {mode} --programs {summary.programs}"
        pytest.fail(f"{summary.report()}\n\n(all of them: {rerun})", pytrace=False)


# ---------------------------------------------------------------- CLI


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="strict")
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--start", type=int, default=0, help="the first program index")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--show", type=int, default=3, help="minimal repros per group of divergences")
    parser.add_argument("--max-repros", type=int, default=None, help="minimal repros in all")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without progress: a hang")
    parser.add_argument("--print", action="store_true", help="print the programs instead of running them")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repros-used", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.print:
        for index in range(args.start, args.start + args.programs):
            lines = generate(args.seed, index, functional=args.mode == "compile")
            print(f"# program {index}\n" + "\n".join(line.text for line in lines) + "\n")
        return 0

    def progress(index, summary):
        if index > args.start and (index - args.start) % 100 == 0:
            print(f"  [{args.mode}] program {index}: {len(summary.unexplained)} diverge so far", file=sys.stderr)

    summary = sweep_isolated(
        args.mode, args.programs, args.start, args.seed, args.show, args.max_repros, args.timeout, progress
    )
    print(summary.report())
    return 1 if summary.unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
