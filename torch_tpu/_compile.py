"""torch.compile(backend="tpu"): Dynamo's graph through AOTAutograd (joint
forward and backward for training) with the core ATen decompositions; each
resulting ATen graph is encoded as a node list and lowered in C++
(csrc/python/graph.cpp) through the same rule table as eager, into one
executable. Ops with no rule (a library's custom op, an op not lowered yet)
split the graph: they run eagerly, in the current eager mode, between the
compiled parts around them, with one warning naming them."""

import contextlib
import dataclasses
import functools
import hashlib
import operator
import sys
import time
import warnings

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.multiprocessing.reductions import StorageWeakRef

from torch_tpu import _C


def _op_name(target) -> str:
    schema = target._schema
    overload = target._overloadname
    return schema.name + ("" if overload == "default" else "." + overload)


def _types(val):
    """(scalar type, sizes) of each tensor a node produces; None where it produces none."""
    if isinstance(val, (list, tuple)):
        return [_types(v)[0] for v in val]
    if isinstance(val, torch.Tensor):
        return [(_scalar_type(val.dtype), [int(s) for s in val.shape])]
    return [None]


def _scalar_type(dtype: torch.dtype) -> int:
    """c10::ScalarType's number for `dtype` (what the C++ side converts)."""
    if dtype not in _SCALAR_TYPES:
        raise _Unsupported(f"dtype {dtype}")
    return _SCALAR_TYPES[dtype]


_SCALAR_TYPES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 11,
    torch.bfloat16: 15,
}


class _Unsupported(Exception):
    pass


@dataclasses.dataclass
class _Encoded:
    """A graph as _C._compile_graph takes it, and what running it needs besides."""

    inputs: list  # (scalar type, sizes) per graph input
    nodes: list  # (op, args, out types) per op node
    outputs: list  # a ref per program output (the graph's, then hidden bases of its views), or None
    output_strides: list  # per program output: its strides when not row-major, else None
    mutations: list  # (graph input, ref) it is overwritten with
    keys: int  # random keys: a random op's generator, fed fresh per call
    key: str  # the program's cache key
    host_inputs: list  # graph inputs on CPU (an eager optimizer's step counts)
    host_outputs: list  # graph outputs that go back to the CPU
    scalars: list  # placeholders that are not program inputs: plain numbers (a specialized size), opaque objects
    constant_outputs: dict  # output index -> a plain number
    constants: list  # tensors the graph holds (get_attr), program inputs after the graph's own
    views: list  # (output, base program output, size, stride, storage offset): outputs sharing a storage
    num_outputs: int  # the graph's outputs (the program's may have hidden bases after them)
    group: str  # the process group of the graph's functional collectives, or ""
    passed_outputs: dict  # output index -> the graph input (a tensor or an opaque object) it returns as is


@dataclasses.dataclass
class _Passed:
    """An opaque graph input (a ScriptObject: DTensor's mesh and placements
    under torch.compile): not a program input; returned as is where the graph
    returns it."""

    position: int


def _opaque(val) -> bool:
    return isinstance(val, (torch.ScriptObject, torch._library.fake_class_registry.FakeScriptObject))


def _encode(gm: torch.fx.GraphModule) -> _Encoded:
    """The graph as _C._compile_graph takes it. Tensor constants the graph holds
    (get_attr nodes: a tensor the model made, such as torch.tensor(...) in its
    forward) become program inputs after the graph's own, passed on every call."""
    refs = {}  # fx node -> ("v", k, j) or a list of refs (multi-output)
    inputs, nodes, outputs, mutations, constants = [], [], [], [], []
    host_inputs, host_outputs = [], []  # CPU tensors in the graph (an eager optimizer's step counts)
    scalars = []  # placeholders that are not program inputs: plain numbers (constants), opaque objects
    constant_outputs = {}  # output index -> a plain number
    passed_outputs = {}  # output index -> the position of the graph input it returns as is
    positions = {}  # tensor placeholder -> its position among the graph's arguments
    keys = 0  # random keys: a random op's generator, fed fresh per call
    output_vals = []  # the traced value of each graph output
    groups = set()  # process groups of the graph's functional collectives
    storage_values = {}  # storage -> the first node whose value is that whole storage, row-major

    def arg(a):
        if isinstance(a, torch.fx.Node):
            r = refs[a]
            if isinstance(r, list):
                raise _Unsupported(f"a tuple value used directly ({a})")
            if isinstance(r, _Passed):
                raise _Unsupported(f"an opaque graph input used by an op ({a})")
            return r
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        if isinstance(a, torch.dtype):
            return _scalar_type(a)
        if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
            return None
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        raise _Unsupported(f"an argument of type {type(a).__name__}")

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and _whole_storage(val):
            storage_values.setdefault(StorageWeakRef(val.untyped_storage()), node)
        if node.op == "placeholder":
            val = node.meta.get("val")
            if val is None or type(val) in (int, float, bool, str):  # a plain value: a constant of this program
                scalars.append(len(inputs) + len(scalars))
                refs[node] = val
                continue
            if _opaque(val):  # a DTensor's mesh or spec: handed back as is, never an op's argument
                refs[node] = _Passed(len(inputs) + len(scalars))
                scalars.append(refs[node].position)
                continue
            if not isinstance(val, torch.Tensor):
                raise _Unsupported(f"a non-tensor graph input ({node.name}: {type(val).__name__})")
            if val.device.type == "cpu":
                host_inputs.append(len(inputs))
            positions[node] = len(inputs) + len(scalars)
            refs[node] = ("v", -1, len(inputs))
            inputs.append(_types(val)[0])
        elif node.op == "get_attr":  # after every placeholder, as FX orders them
            val = getattr(gm, node.target)
            if not isinstance(val, torch.Tensor):
                raise _Unsupported(f"a non-tensor constant ({node.target})")
            refs[node] = ("v", -1, len(inputs))
            with torch._subclasses.fake_tensor.unset_fake_temporarily():  # compilers run under fake mode
                constants.append(val.detach().to("tpu"))
            inputs.append(_types(constants[-1])[0])
        elif node.op == "call_function" and node.target is operator.getitem:
            refs[node] = refs[node.args[0]][node.args[1]]
        elif node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            # AOTAutograd keeps an input's overwrite in the graph (keep_inference_input_mutations):
            # the new value, in the input's type, is written back (and the buffer donated) in C++.
            dst, src = node.args[0], node.args[1]
            if dst.op != "placeholder" or any(m[0] == refs[dst][2] for m in mutations):
                raise _Unsupported(f"copy_ into {dst.name}, which is not a graph input or is overwritten twice")
            k = len(nodes)
            nodes.append(("aten::copy", [arg(dst), arg(src), False], _types(node.meta.get("val"))))
            refs[node] = ("v", k, 0)
            mutations.append((refs[dst][2], refs[node]))
        elif node.op == "call_function" and node.target is torch.ops.aten.as_strided.default:
            # as_strided addresses its input's storage, not its input: it reads
            # the value that holds that storage whole (a view of a slice reaches
            # elements outside the slice; its offset counts from the storage).
            x = node.args[0].meta.get("val")
            base = storage_values.get(StorageWeakRef(x.untyped_storage())) if isinstance(x, torch.Tensor) else None
            if base is None or base not in refs:
                raise _Unsupported(f"as_strided of a storage no graph value holds whole ({node.name})")
            size, stride = node.args[1], node.args[2]
            offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
            offset = x.storage_offset() if offset is None else offset
            k = len(nodes)
            nodes.append(("aten::as_strided", [arg(base), arg(size), arg(stride), arg(offset)], _types(val)))
            refs[node] = ("v", k, 0)
        elif node.op == "call_function" and node.target is _WAIT_TENSOR:
            refs[node] = refs[node.args[0]]  # a collective in the program is done when its value is
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            schema = node.target._schema
            args = []
            for i, a in enumerate(schema.arguments):
                if "Generator" in str(a.type):
                    args.append(("rng", keys))
                    keys += 1
                    continue
                if a.name == "group_name" and schema.name.startswith("_c10d_functional::"):
                    name = node.args[i] if i < len(node.args) else node.kwargs[a.name]
                    groups.add(name)
                    args.append(_group_size(name))  # what the lowering needs; the program runs on the group
                    continue
                if i < len(node.args):
                    v = node.args[i]
                elif a.name in node.kwargs:
                    v = node.kwargs[a.name]
                elif a.has_default_value():
                    v = a.default_value
                else:
                    v = None
                args.append(arg(v))
            if node.target is torch.ops.aten.native_dropout.default:  # random, without a generator argument
                args.append(("rng", keys))
                keys += 1
            out_types = _types(node.meta.get("val"))
            k = len(nodes)
            nodes.append((_op_name(node.target), args, out_types))
            rs = [("v", k, j) for j in range(len(out_types))]
            multi = isinstance(node.meta.get("val"), (list, tuple))
            refs[node] = rs if multi else rs[0]
        elif node.op == "output":
            for o in node.args[0]:
                val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
                output_vals.append(val)
                if isinstance(val, torch.Tensor) and val.device.type == "cpu":
                    host_outputs.append(len(outputs))
                if isinstance(o, torch.fx.Node) and isinstance(refs[o], _Passed):
                    passed_outputs[len(outputs)] = refs[o].position
                    outputs.append(None)
                    continue
                j = refs[o][2] if o in positions else None
                if j is not None and j not in host_inputs and all(m[0] != j for m in mutations):
                    # An input returned unchanged (AOTAutograd saves weights for the backward
                    # this way): the tensor itself, as eager would, not a copy made by the program.
                    passed_outputs[len(outputs)] = positions[o]
                    outputs.append(None)
                    continue
                r = None if o is None else arg(o)
                if r is not None and not (isinstance(r, tuple) and r[0] == "v"):
                    constant_outputs[len(outputs)] = r  # a size of a specialized graph, returned as is
                    r = None
                outputs.append(r)
        else:
            raise _Unsupported(f"a {node.op} node ({node.target})")
    num_outputs = len(outputs)
    views = _shared_storages(gm, refs, outputs, output_vals, host_outputs)
    output_strides = [None] * len(outputs)
    for i, r in enumerate(outputs):
        val = _value_of(gm, refs, r) if r is not None else None
        if isinstance(val, torch.Tensor) and val.dim() > 1 and val.stride() != _row_major(val.shape):
            output_strides[i] = [int(s) for s in val.stride()]  # also those of size-1 dims, as eager reports them
    if len(groups) > 1:
        raise _Unsupported(f"collectives of {len(groups)} process groups in one graph")
    key = hashlib.sha256(
        repr((inputs, nodes, outputs, output_strides, mutations, constant_outputs, views)).encode()
    ).hexdigest()
    return _Encoded(
        inputs,
        nodes,
        outputs,
        output_strides,
        mutations,
        keys,
        key,
        host_inputs,
        host_outputs,
        scalars,
        constant_outputs,
        constants,
        views,
        num_outputs,
        groups.pop() if groups else "",
        passed_outputs,
    )


_WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default if torch.distributed.is_available() else None


def _group_size(name: str) -> int:
    """The size of process group `name`, whose collectives a compiled graph runs
    in its program: possible when its ranks are threads of this process."""
    if reason := _host_staged(name):
        raise _Unsupported(reason)
    return torch.distributed.distributed_c10d._resolve_process_group(name).size()


def _host_staged(name: str) -> str:
    """Why process group `name` cannot run a program's collectives, or ""."""
    group = torch.distributed.distributed_c10d._resolve_process_group(name)
    if getattr(group._get_backend(torch.device("tpu")), "host_staged", True):
        return (
            f"collectives of process group {name!r}, whose ranks are processes (host staging); "
            "a program runs collectives across the ranks only when they are threads of one process"
        )
    return ""


def _value_of(gm, refs, ref):
    """The traced value (a fake tensor) of a graph value ("v", k, j)."""
    for node in gm.graph.nodes:
        if refs.get(node) == ref:
            return node.meta.get("val")
    return None


def _row_major(shape) -> tuple:
    strides, n = [], 1
    for size in reversed(shape):
        strides.insert(0, n)
        n *= max(size, 1)
    return tuple(strides)


def _whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` is its whole storage, row-major from offset 0."""
    return (
        t.storage_offset() == 0
        and t.stride() == _row_major(t.shape)
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its extent exactly once (in some order of its dims)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _shared_storages(gm, refs, outputs, output_vals, host_outputs):
    """Graph outputs that share a storage in the traced graph (b and b.T), or
    that are views of an intermediate, share one on tpu too, as in eager: the
    value that created the storage becomes a program output (appended to
    `outputs` if the graph does not return it) and each such output is a view
    of it with the traced sizes, strides and offset. Returns (output, base
    output, size, stride, storage offset) per such output."""
    creators = {}  # storage -> (ref, val) of the op output that created it
    for node in gm.graph.nodes:
        val, r = node.meta.get("val"), refs.get(node)
        if node.op == "call_function" and isinstance(val, torch.Tensor) and isinstance(r, tuple) and r[0] == "v":
            creators.setdefault(StorageWeakRef(val.untyped_storage()), (r, val))
    by_storage = {}
    for i, val in enumerate(output_vals):
        if isinstance(val, torch.Tensor) and val.device.type != "cpu" and i not in host_outputs:
            by_storage.setdefault(StorageWeakRef(val.untyped_storage()), []).append(i)
    views = []
    for storage, members in by_storage.items():
        if storage not in creators:
            continue  # a graph input's storage: AOTAutograd makes those outputs views of the input
        base_ref, base = creators[storage]
        dense = base.storage_offset() == 0 and _dense(base)
        alone = len(members) == 1 and outputs[members[0]] == base_ref
        if alone or not dense or base.untyped_storage().nbytes() != base.numel() * base.element_size():
            continue
        if base_ref not in outputs:
            outputs.append(base_ref)
        b = outputs.index(base_ref)
        for i in members:
            if i == b:
                continue
            val = output_vals[i]
            outputs[i] = None  # not a program output of its own: a view of the base
            views.append((i, b, [int(s) for s in val.shape], [int(s) for s in val.stride()], int(val.storage_offset())))
    return views


# What torch_tpu.metrics() reports about compiled graphs (see _metrics()).
_GRAPH_COMPILE_MS: dict[str, float] = {}  # "<dynamo compile id> <forward|backward|inference>" -> ms
_RECOMPILES: list[dict] = []  # one per Dynamo recompile that reached this backend
_GRAPH_COLLECTIVES: dict[str, dict] = {}  # graph name -> the collectives its program holds (see _collectives_in)


def _collectives_in(gm: torch.fx.GraphModule) -> dict:
    """The functional collectives a graph's program runs per launch: count,
    bytes in (as collective_bytes::<op> counts eager ones), and per op."""
    ops, nbytes = {}, 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target.namespace != "_c10d_functional" or node.target is _WAIT_TENSOR:
            continue
        op = node.target._schema.name.split("::")[-1]
        ops[op] = ops.get(op, 0) + 1
        first = node.args[0]
        for a in first if isinstance(first, (list, tuple)) else [first]:
            val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                nbytes += val.numel() * val.element_size()
    return {"collectives": sum(ops.values()), "bytes": nbytes, "ops": ops}


def _compile_id():
    cid = torch._guards.CompileContext.current_compile_id()
    return cid, str(cid) if cid is not None else "?"


def _recompile_reason():
    """The guard that failed, as Dynamo recorded it for the compile in progress."""
    try:
        from torch._dynamo.utils import get_metrics_context

        context = get_metrics_context()
        return getattr(context, "_metrics", {}).get("recompile_reason") if context.in_progress() else None
    except Exception:  # a torch without the metrics context: resolved later from get_compilation_metrics()
        return None


def _note_recompile(cid, name):
    """Records a recompile (Dynamo compiling a frame again after a guard failed), once per compile id."""
    if cid is None or not getattr(cid, "frame_compile_id", 0) or any(r["compile_id"] == name for r in _RECOMPILES):
        return
    _RECOMPILES.append({"compile_id": name, "function": None, "reason": _recompile_reason()})


def _metrics() -> dict:
    """Per-graph compile times and recompiles with the guard that failed, for torch_tpu.metrics()."""
    missing = [r for r in _RECOMPILES if not r["reason"] or not r["function"]]
    if missing:  # filled in from Dynamo's record of finished compiles
        with contextlib.suppress(Exception):
            from torch._dynamo.utils import get_compilation_metrics

            done = {str(m.compile_id): m for m in get_compilation_metrics()}
            for r in missing:
                if (m := done.get(r["compile_id"])) is not None:
                    r["reason"] = r["reason"] or m.recompile_reason
                    r["function"] = f"{m.co_name} ({m.co_filename}:{m.co_firstlineno})"
    return {
        "graph_compile_ms": dict(_GRAPH_COMPILE_MS),
        "graph_collectives": {k: dict(v) for k, v in _GRAPH_COLLECTIVES.items()},
        "recompiles": len(_RECOMPILES),
        "recompile_reasons": [dict(r) for r in _RECOMPILES],
    }


def _reset_metrics() -> None:
    _GRAPH_COMPILE_MS.clear()
    _GRAPH_COLLECTIVES.clear()
    _RECOMPILES.clear()


def _is_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo made some sizes symbolic (dynamic=True, mark_dynamic, or a second shape seen)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt | torch.SymFloat) or (
            isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape)
        ):
            return True
    return False


def _compiler(gm: torch.fx.GraphModule, example_inputs, kind: str):
    cid, cid_name = _compile_id()
    _note_recompile(cid, cid_name)
    name = f"{cid_name} {kind}"
    if _is_symbolic(gm) and _C._dynamic_shapes_enabled():
        return _bounded(gm, name)
    eager_ops = _ops_without_rule(gm)
    if eager_ops:
        return _split(gm, name, eager_ops)
    return _compile_whole(gm, name)


def _compile_whole(gm: torch.fx.GraphModule, name: str):
    """One program for `gm` (one per shape where sizes are symbolic), or eager where it cannot be one."""
    if _is_symbolic(gm):
        return _per_shape(gm, name)
    try:
        return _with_host_part(gm, name) or _build(gm, name)
    except (_Unsupported, NotImplementedError, RuntimeError, ValueError) as e:
        # Eager runs it right or raises the user's error (a rule refusing a graph's
        # arguments raises ValueError, as the same rule in eager does).
        warnings.warn(f"torch_tpu: this graph runs eagerly, op by op: {e}", stacklevel=3)
        return make_boxed_func(gm.forward)


def _cpu_valued(val) -> bool:
    if isinstance(val, (list, tuple)):
        return bool(val) and all(_cpu_valued(v) for v in val)
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def _host_nodes(gm: torch.fx.GraphModule) -> set:
    """The placeholders and ops whose values are CPU tensors computed from CPU
    tensors alone: an eager optimizer's step counts and bias corrections."""
    host = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function") and _cpu_valued(node.meta.get("val")):
            if node.op == "placeholder" or all(i in host for i in node.all_input_nodes):
                host.add(node)
    # A tuple of host values that a device op reads whole cannot be a program
    # input: it, and what is computed from it, stay in the program.
    dropped = [
        n
        for n in host
        if isinstance(n.meta["val"], (list, tuple))
        and any(u not in host and u.target is not operator.getitem for u in n.users)
    ]
    while dropped:
        node = dropped.pop()
        if node in host:
            host.discard(node)
            dropped.extend(node.users)
    return host


def _with_host_part(gm: torch.fx.GraphModule, name: str):
    """`gm` with its CPU-only ops (_host_nodes) run on the CPU before its
    program, as inductor runs them: their results join the program as inputs,
    and the CPU inputs they overwrite (step += 1) are written after it. Without
    this, a non-capturable optimizer's step counts go to the device and their
    new values come back with a host read per step count, each waiting for the
    device. None when the graph has no such ops."""
    host = _host_nodes(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ops = [n for n in gm.graph.nodes if n in host and n.op == "call_function"]
    if not ops:
        return None

    def device_reads(node):
        return any(u not in host and u.op != "output" for u in node.users)

    writebacks = [n for n in ops if n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder"]
    computed = [n for n in ops if n not in writebacks]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = [n for n in computed if device_reads(n) or n in output.all_input_nodes]
    results += [w.args[1] for w in writebacks if w.args[1] not in results and w.args[1] not in placeholders]
    index = {n: i for i, n in enumerate(results)}

    host_graph, host_env = torch.fx.Graph(), {}
    for node in placeholders:
        host_env[node] = host_graph.node_copy(node)
    for node in computed:
        host_env[node] = host_graph.node_copy(node, host_env.__getitem__)
    host_graph.output(tuple(host_env[n] for n in results))
    host_module = torch.fx.GraphModule(gm, host_graph)

    device_graph, env = torch.fx.Graph(), {}
    kept = [p for p, node in enumerate(placeholders) if node not in host or device_reads(node)]
    for p in kept:
        env[placeholders[p]] = device_graph.node_copy(placeholders[p])
    hoisted = [n for n in results if device_reads(n)]
    for node in hoisted:
        env[node] = device_graph.placeholder(f"host_{node.name}")
        env[node].meta["val"] = node.meta["val"]
    patched = {}  # output position -> the host node whose value it is
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in host:
            continue
        if node.op == "output":
            outs = node.args[0]
            for i, o in enumerate(outs):
                if isinstance(o, torch.fx.Node) and o in host:
                    patched[i] = o
            device_outs = tuple(None if i in patched else o for i, o in enumerate(outs))
            device_graph.output(torch.fx.node.map_arg(device_outs, env.__getitem__))
            continue
        env[node] = device_graph.node_copy(node, env.__getitem__)
    if all(o is None for o in device_outs) and not any(n.op == "call_function" for n in device_graph.nodes):
        # All on the CPU: no program.
        program = lambda args: [None] * len(device_outs)  # noqa: E731
    else:
        program = _build(torch.fx.GraphModule(gm, device_graph), name)
    position = {n: p for p, n in enumerate(placeholders)}
    write = [(position[w.args[0]], w.args[1]) for w in writebacks]

    def value(node, args, values):
        if node in position:
            return args[position[node]]
        if node.target is torch.ops.aten.copy_.default:  # an input it overwrote
            return args[position[node.args[0]]]
        return values[index[node]]

    def run(args):
        values = host_module(*args)
        result = program([args[p] for p in kept] + [values[index[n]] for n in hoisted])
        for p, src in write:
            args[p].copy_(value(src, args, values))
        for i, node in patched.items():
            result[i] = value(node, args, values)
        args.clear()
        return result

    run._boxed_call = True
    return run


_GRAPH_ONLY = {operator.getitem, torch.ops.aten.copy_.default, _WAIT_TENSOR}  # handled by _encode itself


def _ops_without_rule(gm: torch.fx.GraphModule) -> set:
    """The graph's nodes that no rule lowers: ops we have no rule for, library
    custom ops, higher-order ops (auto_functionalized around a mutating custom op)."""
    rules = _lowered_ops()
    eager = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target in _GRAPH_ONLY:
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or _op_name(node.target) not in rules:
            eager.add(node)
    return eager


@functools.cache
def _lowered_ops() -> frozenset:
    return frozenset(_C._graph_ops())


def _split(gm: torch.fx.GraphModule, name: str, eager_ops: set):
    """`gm` cut around the ops no rule lowers: each run of lowerable ops between
    them is compiled as a graph of its own; those ops run eagerly in between."""
    from torch.fx.passes.split_module import split_module

    part, parts, eager_parts = {}, [0], set()

    def partition(node):
        if node.target is operator.getitem and node.args[0] in part:
            part[node] = part[node.args[0]]  # a tuple stays with its producer
        elif node in eager_ops:
            parts[0] += 1
            part[node] = parts[0]
            eager_parts.add(parts[0])
            parts[0] += 1
        else:
            part[node] = parts[0]
        return part[node]

    split = split_module(gm, None, partition, keep_original_order=True)
    for child_name, child in list(split.named_children()):
        if int(child_name.removeprefix("submod_")) in eager_parts:
            continue
        delattr(split, child_name)
        setattr(split, child_name, _as_module_call(child, f"{name} {child_name}"))
    names = sorted({_describe(n) for n in eager_ops})
    warnings.warn(
        f"torch_tpu: {', '.join(names)} ha{'s' if len(names) == 1 else 've'} no tpu lowering: "
        "run eagerly between the compiled parts of this graph",
        stacklevel=3,
    )
    return make_boxed_func(split.forward)


def _describe(node: torch.fx.Node) -> str:
    """The op a node calls; for a higher-order op wrapping one (auto_functionalized), the wrapped op."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) and node.args and isinstance(node.args[0], torch._ops.OpOverload):
        target = node.args[0]
    return _op_name(target) if isinstance(target, torch._ops.OpOverload) else str(getattr(target, "__name__", target))


def _tuple_output(gm: torch.fx.GraphModule) -> bool:
    """Makes `gm` return a tuple (what _encode reads); True if it returned one value."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    single = not isinstance(output.args[0], (tuple, list))
    if single:
        output.args = ((output.args[0],),)
        gm.recompile()
    return single


def _signature(args) -> tuple:
    """What a static program is specialized on: tensors' shapes and dtypes, plain values."""
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _trace_static(fn, args) -> torch.fx.GraphModule:
    """`fn` traced for these arguments: sizes and plain values are constants of the graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = make_fx(fn, tracing_mode="fake")(*args)
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for node, a in zip(placeholders, args, strict=True):
        if not isinstance(a, torch.Tensor):  # a size or plain value: a constant of this specialization
            node.meta["val"] = a
    return traced


def _as_module_call(gm: torch.fx.GraphModule, name: str):
    """A compiled part called as split_module calls its submodules: positional
    arguments, one value or a tuple back."""
    single = _tuple_output(gm)
    run = _compile_whole(gm, name)

    def call(*args):
        result = run(list(args))
        return result[0] if single else tuple(result)

    return call


def _per_shape(gm: torch.fx.GraphModule, name: str):
    """A graph with symbolic sizes runs as one static program per set of concrete sizes:
    traced again with the call's shapes (sizes become constants), compiled on first sight."""
    programs = {}

    def run(args):
        signature = _signature(args)
        program = programs.get(signature)
        if program is None:
            try:
                program = _build(
                    _trace_static(gm, args), f"{name} {[s[0] if isinstance(s, tuple) else s for s in signature]}"
                )
            except (_Unsupported, NotImplementedError, RuntimeError) as e:
                warnings.warn(f"torch_tpu: this graph runs eagerly, op by op: {e}", stacklevel=2)
                program = make_boxed_func(gm.forward)
            programs[signature] = program
        return program(args)

    run._boxed_call = True
    return run


def _symbolic_dims(gm: torch.fx.GraphModule) -> list:
    """(input index, [(dim, upper bound or None)]) per tensor input with symbolic sizes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        dims = [(d, _upper_bound(s)) for d, s in enumerate(val.shape) if _symbolic(s)]
        if dims:
            found.append((i, dims))
    return found


def _upper_bound(size: torch.SymInt) -> int | None:
    """The largest value Dynamo allows `size` (torch._dynamo.mark_dynamic's max), or None."""
    upper = size.node.shape_env.bound_sympy(size.node.expr).upper
    return int(upper) if upper.is_Integer else None  # int_oo: unbounded


def _make_padded(gm: torch.fx.GraphModule) -> None:
    """Rewrites the nodes that make a tensor of symbolic sizes out of none
    (full([s0, 4]), arange(s0), the expand of a loss gradient to [s0, 4]) to
    make it padded: called with each symbol's bucket for its size, the result
    takes the real sizes. Made at real sizes, it would be plain and compile
    one program per size, as would every op that meets it."""
    symbols = {}  # sympy symbol -> the first node whose value it is
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            symbols.setdefault(val.node.expr, node)
    buckets = {}  # a node whose value is a symbol -> the node of that value's bucket
    for node in list(gm.graph.nodes):
        val = node.meta.get("val")
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not isinstance(val, torch.Tensor) or any(
            isinstance(i.meta.get("val"), torch.Tensor) and _has_symbols(i.meta["val"]) for i in node.all_input_nodes
        ):
            continue
        dims = [d for d, size in enumerate(val.shape) if _symbolic(size)]
        exprs = [val.shape[d].node.expr for d in dims]
        if not dims or not all(e.is_Symbol and e in symbols for e in exprs):
            continue

        def bucket_of(arg):
            v = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if not (isinstance(v, torch.SymInt) and v.node.expr.is_Symbol):
                return arg
            if arg not in buckets:
                with gm.graph.inserting_after(arg):
                    buckets[arg] = gm.graph.call_function(_C._bucket_for, (arg, _upper_bound(v)))
            return buckets[arg]

        args = torch.fx.node.map_arg(node.args, bucket_of)
        kwargs = torch.fx.node.map_arg(node.kwargs, bucket_of)
        node.args = (node.target, tuple(symbols[e] for e in exprs), tuple(dims), *args)
        node.kwargs = kwargs
        node.target = _made_padded
    gm.graph.lint()
    gm.recompile()


def _symbolic(size) -> bool:
    return isinstance(size, torch.SymInt) and not size.node.is_constant()


def _has_symbols(t: torch.Tensor) -> bool:
    return any(_symbolic(s) for s in t.shape)


def _made_padded(op, reals, dims, *args, **kwargs):
    """`op` run at bucket sizes, its result a padded tensor of the real sizes `reals` in `dims`."""
    full = op(*args, **kwargs)
    real = list(full.shape)
    for d, n in zip(dims, reals, strict=True):
        real[d] = n
    if full.device.type != "tpu":  # a host tensor: cut to the real sizes
        return full[tuple(slice(0, n) for n in real)].clone()
    return _C._as_padded(full, real, list(dims))


def _bounded(gm: torch.fx.GraphModule, name: str):
    """A graph with symbolic sizes (dynamic=True, mark_dynamic, a second shape
    seen) over bounded shapes (README "Bounded dynamic shapes"): its inputs'
    symbolic dims are padded to buckets, as torch_tpu.mark_dynamic pads them,
    and the graph runs recorded as one Fused window. The window's program is
    keyed by the buckets, not the sizes, and built from the same bounded rules
    as eager ops: one program per bucket, the real sizes a runtime input.
    TORCH_TPU_DYNAMIC=off compiles one program per shape instead."""
    symbolic = _symbolic_dims(gm)
    _make_padded(gm)
    seen = set()

    def run(args):
        for i, dims in symbolic:
            t = args[i]
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                for d, upper in dims:
                    with contextlib.suppress(RuntimeError):  # a view of a larger storage: its ops read it exact
                        _C._mark_dynamic(t, d, upper)
        signature = tuple(
            tuple(_C._padded_shape(a) or a.shape) if isinstance(a, torch.Tensor) and a.device.type == "tpu" else None
            for a in args
        )
        start = time.perf_counter()
        previous = _C.get_eager_mode()
        if previous == "strict":
            _C.set_eager_mode("fused")
        try:
            result = gm.forward(*args)
        finally:
            if previous == "strict":
                _C.set_eager_mode(previous)  # runs the window
        args.clear()
        if signature not in seen:  # the first run of a bucket: its window compiled
            seen.add(signature)
            shapes = [s for s in signature if s is not None]
            _GRAPH_COMPILE_MS[f"{name} bounded {shapes}"] = (time.perf_counter() - start) * 1e3
        return list(result) if isinstance(result, (list, tuple)) else [result]

    run._boxed_call = True
    return run


def program(fn):
    """`fn` (a function of tensors and plain values) as one XLA program per set
    of input shapes, dtypes and plain values: functionalized (in-place ops
    inside it become values; an input it overwrites is written back, its buffer
    donated), traced with make_fx and compiled on first sight, without Dynamo
    (so it also works where Dynamo is disabled, such as between the pieces of
    vLLM's compiled graphs)."""
    programs = {}
    functional = torch.func.functionalize(fn)

    def run(*args):
        signature = _signature(args)
        compiled = programs.get(signature)
        if compiled is None:
            traced = _trace_static(functional, args)
            single = _tuple_output(traced)
            build = _build(traced, f"{fn.__name__} {[s[0] if isinstance(s, tuple) else s for s in signature]}")
            compiled = programs[signature] = (build, single)
        build, single = compiled
        result = build(list(args))
        return result[0] if single else tuple(result)

    return run


def _build(gm: torch.fx.GraphModule, name: str):
    """One executable for `gm` (static sizes); returns its boxed runner."""
    start = time.perf_counter()
    g = _encode(gm)
    program = _C._compile_graph(g.key, g.inputs, g.nodes, g.outputs, g.output_strides, g.keys, g.mutations, g.group)
    _GRAPH_COMPILE_MS[name] = (time.perf_counter() - start) * 1e3
    if g.group:
        _GRAPH_COLLECTIVES[name] = _collectives_in(gm)

    host_mutated = [i for i, _ in g.mutations if i in g.host_inputs]
    tensors = g.constants
    eager = make_boxed_func(gm.forward) if g.group else None
    spmd = {}  # the shardings of the program inputs -> this graph as an SPMD program over their mesh

    def spmd_program(args):
        # Inputs marked by torch_tpu.distributed.mark_sharding: one program over their mesh.
        if g.group or not getattr(sys.modules.get("torch_tpu.distributed"), "any_marked", False):
            return program
        shardings = [getattr(a, "_tpu_sharding", None) for a in args]
        marked = [s for s in shardings if s is not None]
        if not marked or g.group:
            return program
        key = tuple((tuple(s.devices), tuple(s.mesh), tuple(map(tuple, s.axes))) if s else None for s in shardings)
        if key not in spmd:
            first = marked[0]
            if any((s.devices, s.mesh) != (first.devices, first.mesh) for s in marked):
                meshes = sorted({(tuple(s.mesh), tuple(s.devices)) for s in marked})
                raise ValueError(
                    f"torch_tpu: {name} reads tensors marked over different meshes (shape, devices: {meshes}); "
                    "one SPMD program runs over one mesh"
                )
            layout = [s.axes if s else None for s in shardings] + [None] * len(tensors)
            spmd[key] = _C._compile_graph(
                g.key,
                g.inputs,
                g.nodes,
                g.outputs,
                g.output_strides,
                g.keys,
                g.mutations,
                "",
                layout,
                first.mesh,
                first.devices,
            )
        return spmd[key]

    def run(args):
        if eager is not None:
            given = list(args)
        if g.group and (reason := _host_staged(g.group)):
            # Dynamo reuses this graph for a new group of the same name (its
            # guards do not see the group): one whose ranks are processes.
            warnings.warn(f"torch_tpu: this graph runs eagerly, op by op: {reason}", stacklevel=2)
            return eager(list(args))
        passed = {i: args[p] for i, p in g.passed_outputs.items()}
        if g.scalars:  # sizes baked into this program, and opaque inputs
            args = [a for i, a in enumerate(args) if i not in g.scalars]
        if g.host_inputs:  # CPU scalars (step counts) join the program as device values
            host = {i: args[i] for i in host_mutated}
            args = list(args)
            for i in g.host_inputs:
                args[i] = args[i].to("tpu")
        result = _C._run_graph(spmd_program(args), list(args) + tensors if tensors else args)
        if result is None:  # the ranks traced different graphs (rank-dependent values): SPMD cannot run them
            _warn_diverged(name)
            args.clear()
            return eager(given)
        if g.host_inputs:
            for i, t in host.items():  # the graph overwrote the device copy: back to the CPU tensor
                t.copy_(args[i])
        args.clear()
        for i, base, size, stride, offset in g.views:  # outputs sharing a storage, as traced
            result[i] = result[base].as_strided(size, stride, offset)
        del result[g.num_outputs :]
        for i in g.host_outputs:  # and go back to the CPU where the graph says so
            result[i] = result[i].cpu()
        for i, value in g.constant_outputs.items():
            result[i] = value
        for i, obj in passed.items():
            result[i] = obj
        return result

    run._boxed_call = True
    return run


@functools.cache
def _warn_diverged(name: str) -> None:
    warnings.warn(
        f"torch_tpu: the ranks compiled different graphs with collectives ({name}): a value that differs "
        "between ranks (such as the rank) is a constant of each rank's graph, and one program runs on every "
        "rank's device. This graph runs eagerly, op by op; pass such values as tensors to compile it once.",
        stacklevel=3,
    )


# keep_inference_input_mutations: an input overwritten under no_grad (optimizer
# updates) or that needs no grad (batch-norm statistics) stays a copy_ in the
# graph, so the program writes it back itself and can donate its buffer.
_compilers = {
    "fw_compiler": functools.partial(_compiler, kind="forward"),
    "bw_compiler": functools.partial(_compiler, kind="backward"),
    "inference_compiler": functools.partial(_compiler, kind="inference"),
    "keep_inference_input_mutations": True,
}
_static_backend = aot_autograd(decompositions=core_aten_decompositions(), **_compilers)
# A graph over bounded shapes runs eager's ops (_bounded): undecomposed, so
# nll_loss, softmax and layer norm meet their bounded rules.
_bounded_backend = aot_autograd(**_compilers)


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The "tpu" backend of torch.compile: Dynamo's graph through AOTAutograd,
    with the core decompositions for one program per graph, or without them
    when its sizes are symbolic (then it runs over bounded shapes: _bounded)."""
    symbolic = any(
        isinstance(a, torch.SymInt)
        or (isinstance(a, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in a.shape))
        for a in example_inputs
    )
    backend = _bounded_backend if symbolic and _C._dynamic_shapes_enabled() else _static_backend
    return backend(gm, example_inputs, **kwargs)
