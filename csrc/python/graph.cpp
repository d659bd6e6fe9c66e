// torch.compile(backend="tpu"): an FX graph (ATen ops after AOTAutograd and the
// core decompositions), encoded by torch_tpu/_compile.py as a list of nodes,
// is lowered through the same rule table as eager into one StableHLO module
// and one executable. Every value stays on the device between the graph's ops.
//
// Encoding (built in Python, read here):
//   inputs:  [(scalar_type, sizes), ...]            values (-1, i)
//   nodes:   [(op_name, args, out_types), ...]      node k's outputs are values (k, j)
//            an arg is a ref ("v", k, j), a list of refs/None, or a constant
//            (None, bool, int, float, str, list of ints or floats)
//   outputs: [ref or None, ...]
//   mutations: [(input index, ref), ...]  graph inputs the graph overwrites
//            (AOTAutograd keeps such copy_ in the graph: batch-norm statistics,
//            optimizer updates under no_grad); written back into the input's
//            storage here, and the input's buffer donated to that output
//            where nothing else holds it.
//   group:   the process group (its name) of the graph's functional
//            collectives, or "": such a graph is one program with a partition
//            per rank, launched by every rank at once (ranks as threads).
//   shardings, mesh, devices: an SPMD graph (torch_tpu.distributed.mark_sharding):
//            per input None (replicated) or, per dim, the mesh axes cutting it;
//            the mesh's axis sizes; one partition per device of `devices`
//            (mesh position p, row-major). XLA's partitioner splits the
//            program over them.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <unordered_set>

#include "aten/generator.h"
#include "aten/tensor_access.h"
#include "distributed/process_group_tpu.h"
#include "lowering/registry.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torch_tpu::python {
namespace {

using lowering::LoweringArg;
using runtime::Runtime;
using stablehlo::TensorType;
using stablehlo::Value;

struct GraphProgram {
  runtime::ProgramPtr program;                       // or, for a graph with collectives:
  std::string group;                                 // their process group's name
  std::shared_ptr<const runtime::ProgramSpec> spec;  // one partition's program, compiled at the first launch
  std::string key;
  std::vector<int> output_slots;  // per graph output: its program output, or -1 for None
  int num_keys = 0;               // random keys the program reads after the inputs, one per random op
  std::string name;               // for error messages
  struct Mutation {
    int input, slot;  // graph input overwritten by program output `slot`
    bool aliased;     // the program aliases that input's buffer to the output (donation possible)
  };
  std::vector<Mutation> mutations;
  size_t num_inputs = 0;
  using Sharding = stablehlo::Builder::Sharding;   // per dim, the mesh axes cutting it
  std::vector<std::optional<Sharding>> shardings;  // SPMD: per input, none where replicated
  std::vector<int64_t> mesh;                       // SPMD: the mesh's axis sizes
  std::vector<int> devices;                        // SPMD: partition p runs on tpu:devices[p]; empty otherwise
  std::string source;                              // where the executable came from: "memory", "disk" or "compiled"
  double compile_ms = 0;                           // lowering and compiling (or loading) it
};

TensorType tensor_type(const py::handle& t) {
  auto pair = t.cast<py::tuple>();
  auto sizes = pair[1].cast<std::vector<int64_t>>();
  return {aten::to_dtype(static_cast<at::ScalarType>(pair[0].cast<int>())), sizes};
}

// ("rng", i): the i-th random key of the graph (a random op's generator).
bool is_key(const py::handle& h) {
  if (!py::isinstance<py::tuple>(h)) return false;
  auto t = h.cast<py::tuple>();
  return t.size() == 2 && py::isinstance<py::str>(t[0]) && t[0].cast<std::string>() == "rng";
}

bool is_ref(const py::handle& h) {
  if (!py::isinstance<py::tuple>(h)) return false;
  auto t = h.cast<py::tuple>();
  return t.size() == 3 && py::isinstance<py::str>(t[0]) && t[0].cast<std::string>() == "v";
}

// Where partition `p` sits in `mesh` (row-major): one coordinate per axis.
std::vector<int64_t> mesh_coordinates(const std::vector<int64_t>& mesh, int64_t p) {
  std::vector<int64_t> at(mesh.size());
  for (size_t a = mesh.size(); a-- > 0;) {
    at[a] = p % mesh[a];
    p /= mesh[a];
  }
  return at;
}

// How many pieces `axes` (mesh dims) cut a dimension into.
int64_t pieces_along(const std::vector<int>& axes, const std::vector<int64_t>& mesh) {
  int64_t pieces = 1;
  for (int a : axes) pieces *= mesh[a];
  return pieces;
}

// How many pieces `axes` cut a dimension into, and which of them partition `at` holds.
std::pair<int64_t, int64_t> piece_along(const std::vector<int>& axes, const std::vector<int64_t>& mesh,
                                        const std::vector<int64_t>& at) {
  int64_t index = 0;
  for (int a : axes) index = index * mesh[a] + at[a];
  return {pieces_along(axes, mesh), index};
}

struct GraphBuilder {
  stablehlo::Builder b;
  std::vector<Value> inputs, keys;
  std::vector<std::vector<Value>> node_values;

  const Value& ref(const py::handle& h) {
    auto t = h.cast<py::tuple>();
    int k = t[1].cast<int>(), j = t[2].cast<int>();
    const Value& v = k < 0 ? inputs.at(j) : node_values.at(k).at(j);
    if (v.name.empty()) throw lowering::Declined("a graph value that its op left undefined is used");
    return v;
  }

  LoweringArg arg(const py::handle& h) {
    LoweringArg a;
    if (h.is_none()) return a;
    if (is_ref(h)) {
      a.kind = LoweringArg::Tensor;
      a.tensor = ref(h);
    } else if (is_key(h)) {
      a.kind = LoweringArg::Tensor;
      a.tensor = keys.at(h.cast<py::tuple>()[1].cast<size_t>());
    } else if (py::isinstance<py::bool_>(h)) {
      a.kind = LoweringArg::Bool;
      a.b = h.cast<bool>();
    } else if (py::isinstance<py::int_>(h)) {
      a.kind = LoweringArg::Int;
      a.i = h.cast<int64_t>();
    } else if (py::isinstance<py::float_>(h)) {
      a.kind = LoweringArg::Double;
      a.d = h.cast<double>();
    } else if (py::isinstance<py::str>(h)) {
      a.kind = LoweringArg::String;
      a.s = h.cast<std::string>();
    } else if (py::isinstance<py::list>(h)) {
      auto list = h.cast<py::list>();
      bool refs = false, floats = false;
      for (auto x : list) {
        refs |= is_ref(x) || x.is_none();
        floats |= py::isinstance<py::float_>(x);
      }
      if (refs) {
        a.kind = LoweringArg::TensorList;
        for (auto x : list) a.tensors.push_back(x.is_none() ? Value{} : ref(x));
      } else if (floats) {
        a.kind = LoweringArg::NumberList;
        for (auto x : list) a.numbers.push_back(x.cast<double>());
      } else {
        a.kind = LoweringArg::IntList;
        for (auto x : list) a.ints.push_back(py::isinstance<py::bool_>(x) ? x.cast<bool>() : x.cast<int64_t>());
      }
    } else {
      throw std::invalid_argument("torch_tpu.compile: an argument of type " +
                                  std::string(py::str(py::type::handle_of(h).attr("__name__"))) + " in the graph");
    }
    return a;
  }
};

// The rule for a graph node: the op's own rule, or its graph-only form (view
// ops are metadata in eager, values in a graph).
const lowering::LoweringRule* rule_for(const std::string& op) {
  if (const auto* r = lowering::find_rule("graph:" + op)) return r;
  return lowering::find_rule(op);
}

std::shared_ptr<GraphProgram> compile_graph(const std::string& key, const py::list& inputs, const py::list& nodes,
                                            const py::list& outputs, const py::list& output_strides, int num_keys,
                                            const py::list& mutations, const std::string& group,
                                            const py::object& shardings, const std::vector<int64_t>& mesh,
                                            const std::vector<int>& devices) {
  auto graph = std::make_shared<GraphProgram>();
  graph->group = group;
  graph->key = "graph|" + key;
  graph->mesh = mesh;
  graph->devices = devices;
  graph->shardings.resize(inputs.size());
  if (!devices.empty()) {
    auto list = shardings.cast<py::list>();
    TORCH_CHECK(list.size() == inputs.size(), "torch_tpu: an SPMD graph needs a sharding (or None) per input");
    graph->key += "|spmd mesh";
    for (int64_t n : mesh) graph->key += " " + std::to_string(n);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_none()) continue;
      graph->shardings[i] = list[i].cast<GraphProgram::Sharding>();
      graph->key += "|" + std::to_string(i) + ":";
      for (const auto& axes : *graph->shardings[i]) {
        graph->key += "{";
        for (int a : axes) graph->key += std::to_string(a) + " ";
        graph->key += "}";
      }
    }
  }
  const bool spmd = !devices.empty();
  graph->num_keys = num_keys;
  graph->num_inputs = inputs.size();
  graph->name = "compiled graph " + key.substr(0, 16);
  // Which program output each graph output is (outputs that repeat a value,
  // or are None, need no slot of their own).
  std::vector<std::pair<int, int>> slot_refs;
  std::vector<std::vector<int64_t>> slot_strides;  // as the traced graph lays each out (empty: row-major)
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].is_none()) {
      graph->output_slots.push_back(-1);
      continue;
    }
    auto t = outputs[i].cast<py::tuple>();
    std::pair<int, int> r{t[1].cast<int>(), t[2].cast<int>()};
    auto it = std::find(slot_refs.begin(), slot_refs.end(), r);
    graph->output_slots.push_back(static_cast<int>(it - slot_refs.begin()));
    if (it != slot_refs.end()) continue;
    slot_refs.push_back(r);
    slot_strides.push_back(output_strides[i].is_none() ? std::vector<int64_t>()
                                                       : output_strides[i].cast<std::vector<int64_t>>());
  }
  // Each overwritten input gets a program output of its own, after the graph's outputs.
  std::vector<std::pair<int, int>> mutation_refs;
  for (auto m : mutations) {
    auto pair = m.cast<py::tuple>();
    auto ref = pair[1].cast<py::tuple>();
    const int input = pair[0].cast<int>(), slot = static_cast<int>(slot_refs.size() + mutation_refs.size());
    const int k = ref[1].cast<int>(), j = ref[2].cast<int>();
    for (const auto& other : graph->mutations)
      if (other.input == input) throw lowering::Declined("an input overwritten twice in one graph");
    // The value's type from the encoding (known without building: the program may come from a cache).
    const TensorType in = tensor_type(inputs[input]);
    const TensorType value =
        k < 0 ? tensor_type(inputs[j]) : tensor_type(nodes[k].cast<py::tuple>()[2].cast<py::list>()[j]);
    if (value.dtype != in.dtype || value.numel() != in.numel())
      throw lowering::Declined("an input overwritten by a value of another type: " + value.str() + " into " + in.str());
    // Writing an input back unchanged needs no alias.
    graph->mutations.push_back({input, slot, !(k < 0 && j == input)});
    mutation_refs.emplace_back(k, j);
  }
  const auto start = std::chrono::steady_clock::now();
  runtime::ProgramSource source = runtime::ProgramSource::Compiled;
  auto build = [&] {
    GraphBuilder g;
    std::vector<TensorType> input_types;
    for (auto in : inputs) {
      input_types.push_back(tensor_type(in));
      g.inputs.push_back(g.b.parameter({input_types.back().dtype, {input_types.back().numel()}}));
    }
    for (int i = 0; i < num_keys; ++i) g.keys.push_back(g.b.parameter({stablehlo::DType::Int64, {}}));
    if (spmd) {
      g.b.set_partitions(static_cast<int64_t>(devices.size()));
      g.b.set_mesh(mesh);
      for (const auto& k : g.keys) g.b.set_parameter_sharding(k, {});
    }
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const auto& sharding = graph->shardings[i];
      if (!sharding) {
        if (spmd) g.b.set_parameter_sharding(g.inputs[i], {{}});  // the flat parameter, whole everywhere
        g.inputs[i] = g.b.reshape(g.inputs[i], input_types[i].shape);
        continue;
      }
      // Partition p holds its piece row-major, so the flat whole is the pieces
      // one after another, in the order of the axes cutting dim 0, then dim 1...:
      // [pieces per dim..., piece...], interleaved back into the shape.
      const auto& shape = input_types[i].shape;
      const auto rank = static_cast<int64_t>(shape.size());
      std::vector<int64_t> split, order, piece;
      std::vector<int> flat_axes;
      for (int64_t d = 0; d < rank; ++d) {
        const int64_t pieces = pieces_along((*sharding)[d], mesh);
        split.push_back(pieces);
        piece.push_back(shape[d] / pieces);
        order.push_back(d);
        order.push_back(rank + d);
        flat_axes.insert(flat_axes.end(), (*sharding)[d].begin(), (*sharding)[d].end());
      }
      split.insert(split.end(), piece.begin(), piece.end());
      g.b.set_parameter_sharding(g.inputs[i], {flat_axes});
      Value v = g.b.transpose(g.b.reshape(g.inputs[i], split), order);
      g.inputs[i] = g.b.sharding_constraint(g.b.reshape(v, shape), *sharding);
    }
    std::vector<Value> flags;
    std::vector<std::string> messages;
    for (auto node_handle : nodes) {
      auto node = node_handle.cast<py::tuple>();
      const std::string op = node[0].cast<std::string>();
      const auto* rule = rule_for(op);
      if (!rule) throw lowering::Declined(op + " has no tpu lowering");
      std::vector<LoweringArg> args;
      for (auto a : node[1].cast<py::list>()) args.push_back(g.arg(a));
      std::vector<TensorType> outs;
      for (auto t : node[2].cast<py::list>()) outs.push_back(t.is_none() ? TensorType{} : tensor_type(t));
      if (!lowering::takes_complex(op)) {
        bool complex = false;
        for (const auto& a : args) {
          complex |= stablehlo::is_complex(a.tensor.dtype()) && !a.tensor.name.empty();
          for (const auto& t : a.tensors) complex |= stablehlo::is_complex(t.dtype());
        }
        for (const auto& t : outs) complex |= stablehlo::is_complex(t.dtype);
        if (complex) throw lowering::Declined(op + " has no rule for complex values yet");
      }
      lowering::LoweringContext ctx{g.b, args, outs, {}};
      std::vector<Value> results = (*rule)(ctx);
      for (size_t k = 0; k < results.size() && k < outs.size(); ++k) {
        if (results[k].name.empty()) continue;
        if (results[k].type.numel() != outs[k].numel())
          throw std::runtime_error("torch_tpu.compile: the lowering of " + op + " produced " + results[k].type.str() +
                                   " where the graph expects " + outs[k].str());
        results[k] = g.b.reshape(g.b.cast(results[k], outs[k].dtype), outs[k].shape);
      }
      for (auto& check : ctx.checks) {
        flags.push_back(g.b.reshape(check.ok, {1}));
        messages.push_back(std::string(check.index_error ? "" : runtime::kRuntimeErrorCheck) + check.message + " (in " +
                           op + " of a compiled graph)");
      }
      g.node_values.push_back(std::move(results));
    }
    std::vector<Value> flat;
    std::vector<TensorType> types;
    std::vector<std::vector<int64_t>> layouts;
    for (size_t s = 0; s < slot_refs.size(); ++s) {
      const auto& [k, j] = slot_refs[s];
      Value v = k < 0 ? g.inputs.at(j) : g.node_values.at(k).at(j);
      types.push_back(v.type);
      // Laid out as eager lays it out (x.t() + 1 is transposed): flattened in memory order.
      auto order = lowering::memory_order(v.shape(), slot_strides[s]);
      const bool dense = lowering::is_dense(v.shape(), slot_strides[s]);
      layouts.push_back(dense ? slot_strides[s] : std::vector<int64_t>());
      if (!order.empty()) v = g.b.transpose(v, order);
      flat.push_back(g.b.reshape(v, {v.type.numel()}));
    }
    std::vector<std::pair<size_t, size_t>> aliases;
    for (size_t m = 0; m < mutation_refs.size(); ++m) {
      const auto& [k, j] = mutation_refs[m];
      const auto& mutation = graph->mutations[m];
      const Value& v = k < 0 ? g.inputs.at(j) : g.node_values.at(k).at(j);
      if (v.name.empty()) throw lowering::Declined("an input is overwritten by an undefined value");
      flat.push_back(g.b.reshape(v, {v.type.numel()}));
      types.push_back(v.type);
      // A multi-device launch donates nothing: each rank's buffers stay its own.
      if (mutation.aliased && group.empty() && !spmd) aliases.emplace_back(mutation.input, mutation.slot);
    }
    if (!flags.empty()) {  // one trailing bool[k] output: see Program::checks
      flat.push_back(flags.size() == 1 ? flags[0] : g.b.concatenate(flags, 0));
      types.push_back(flat.back().type);
    }
    if (spmd) g.b.replicate_results();
    std::string mlir = g.b.module(flat, aliases);
    Runtime::get().count("compiled_graphs");
    // TORCH_TPU_DUMP_DIR: each compiled graph's StableHLO, for inspection.
    if (const char* dir = std::getenv("TORCH_TPU_DUMP_DIR"); dir && *dir) {
      std::filesystem::create_directories(dir);
      std::ofstream(std::filesystem::path(dir) / ("graph_" + key.substr(0, 16) + ".mlir")) << mlir;
    }
    runtime::ProgramSpec spec(std::move(mlir), types, messages);
    layouts.resize(types.size());
    spec.output_strides = std::move(layouts);
    return spec;
  };
  if (spmd) {
    graph->program = Runtime::get().multi_device_program(graph->key, devices, build);
    for (auto& m : graph->mutations) m.aliased = false;
  } else if (group.empty()) {
    graph->program = Runtime::get().program(graph->key, build, /*indexed=*/true, &source, runtime::ProgramKind::Graph);
  } else {
    graph->spec = std::make_shared<const runtime::ProgramSpec>(build());
    for (auto& m : graph->mutations) m.aliased = false;
  }
  graph->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  auto& runtime = Runtime::get();
  switch (source) {
    case runtime::ProgramSource::Memory:
      graph->source = "memory";
      runtime.count("graph_cache_hits_memory");
      break;
    case runtime::ProgramSource::Disk:
      graph->source = "disk";
      runtime.count("graph_cache_hits_disk");
      break;
    case runtime::ProgramSource::Compiled:
      graph->source = "compiled";
      runtime.count("graph_cache_misses");
      break;
  }
  return graph;
}

// A graph with collectives: this rank's part of the one launch over the
// group's devices (the calling thread's group of that name: each rank's own);
// nothing when the ranks' graphs differ.
std::optional<std::vector<pjrt::BufferPtr>> launch_over_group(const GraphProgram& graph,
                                                              std::vector<pjrt::BufferPtr> args, int dev) {
  auto group = c10d::resolve_process_group(graph.group);
  auto backend = group->getBackend(c10::DeviceType::PrivateUse1);
  auto* tpu = dynamic_cast<distributed::ProcessGroupTPU*>(backend.get());
  TORCH_CHECK(tpu, "torch_tpu: ", graph.name, " holds collectives of process group '", graph.group,
              "', whose tpu backend is ", backend->getBackendName(), ", not torch_tpu's \"tpu\"");
  Runtime::get().count("collective::compiled_graph");
  auto spec = graph.spec;
  return tpu->launch({graph.key, graph.name + " on tpu:" + std::to_string(dev), [spec] { return *spec; }, dev,
                      std::move(args), /*may_diverge=*/true});
}

// A graph's name for the fused window, which keeps a name's pointer past the
// graph's life (graphs are few: one per compiled shape).
const char* interned(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

// The graph's outputs from its program's `results` (on tpu:`on`), its checks
// queued first; each moved to tpu:`dev` where that is another device.
py::list graph_outputs(const GraphProgram& graph, const std::vector<pjrt::BufferPtr>& results, int on, int dev) {
  auto& runtime = Runtime::get();
  const auto& out_types = graph.spec ? graph.spec->outputs : graph.program->outputs;
  const auto& checks = graph.spec ? graph.spec->checks : graph.program->checks;
  const auto& strides = graph.spec ? graph.spec->output_strides : graph.program->output_strides;
  const size_t n = results.size() - (checks.empty() ? 0 : 1);
  if (!checks.empty()) runtime.defer_check(results[n], checks);
  if (runtime.mode() == runtime::EagerMode::Debug) runtime.verify_checks();
  py::list out;
  for (int slot : graph.output_slots) {
    if (slot < 0) {
      out.append(py::none());
      continue;
    }
    const TensorType& t = out_types.at(slot);
    at::Tensor value = aten::wrap_buffer(
        results.at(slot), t.shape, aten::to_scalar_type(t.dtype), on,
        static_cast<size_t>(slot) < strides.size() ? at::IntArrayRef(strides[slot]) : at::IntArrayRef());
    out.append(on == dev ? value
                         : value.to(at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))));
  }
  return out;
}

// The piece of `t` that partition `p` holds under `sharding`, on its device.
at::Tensor piece_of(const at::Tensor& t, const GraphProgram::Sharding& sharding, const std::vector<int64_t>& mesh,
                    int p, int device) {
  const auto at = mesh_coordinates(mesh, p);
  at::Tensor piece = t;
  for (int64_t d = 0; d < static_cast<int64_t>(sharding.size()); ++d) {
    const auto [pieces, index] = piece_along(sharding[d], mesh, at);
    const int64_t size = t.size(d) / pieces;
    piece = piece.narrow(d, index * size, size);
  }
  return piece.contiguous().to(at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}

// An SPMD graph: each partition gets its pieces of the inputs (replicated
// inputs whole), all launch together; the outputs are replicated, and the
// partition on the inputs' device (else the first) hands them back.
py::object run_spmd(const GraphProgram& graph, const std::vector<at::Tensor>& inputs, int dev) {
  auto& runtime = Runtime::get();
  const auto& devices = graph.devices;
  std::vector<std::vector<pjrt::BufferPtr>> args(devices.size());
  std::vector<at::Tensor> keep_alive;  // the pieces, until the launch has read them
  const auto& generator = aten::default_generator(static_cast<c10::DeviceIndex>(dev));
  std::vector<at::Tensor> keys;
  for (int k = 0; k < graph.num_keys; ++k) keys.push_back(aten::next_key_tensor(generator, graph.name));
  for (size_t p = 0; p < devices.size(); ++p) {
    const auto device = at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(devices[p]));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& sharding = graph.shardings[i];
      keep_alive.push_back(sharding ? piece_of(inputs[i], *sharding, graph.mesh, static_cast<int>(p), devices[p])
                                    : inputs[i].to(device));
      args[p].push_back(aten::read_dense(keep_alive.back()));
    }
    for (const auto& key : keys) args[p].push_back(aten::upload(key, devices[p]));
  }
  runtime.count("spmd_graph_launches");
  auto outputs = runtime.execute_on_devices(*graph.program, args, graph.name.c_str());
  const auto home = std::find(devices.begin(), devices.end(), dev);
  const size_t from = home == devices.end() ? 0 : static_cast<size_t>(home - devices.begin());
  auto& results = outputs[from];
  for (const auto& m : graph.mutations) {
    if (devices[from] == dev) {
      aten::write_dense(inputs[m.input], results.at(m.slot));
      continue;
    }
    const TensorType& t = graph.program->outputs.at(m.slot);
    inputs[m.input].copy_(
        aten::wrap_buffer(results.at(m.slot), t.shape, aten::to_scalar_type(t.dtype), devices[from], {}));
  }
  return graph_outputs(graph, results, devices[from], dev);
}

// Runs a compiled graph on tpu tensors; returns its outputs (None where the
// graph returns None), or None when it holds collectives and the ranks'
// graphs differ (the caller runs it eagerly).
py::object run_graph(const GraphProgram& graph, const std::vector<at::Tensor>& inputs) {
  auto& runtime = Runtime::get();
  int dev = 0;
  std::vector<pjrt::BufferPtr> buffers;
  for (const auto& t : inputs) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "torch_tpu: ", graph.name, " got an input on ",
                t.device(), "; move it to tpu");
    dev = aten::device_index(t);
    buffers.push_back(aten::read_dense(t));
  }
  TORCH_CHECK(inputs.size() == graph.num_inputs, "torch_tpu: ", graph.name, " takes ", graph.num_inputs,
              " inputs, got ", inputs.size());
  if (!graph.devices.empty()) return run_spmd(graph, inputs, dev);
  // Outside Debug mode a graph is a call of the window (Runtime::record_graph):
  // a step's graphs, and in Fused mode the eager ops around them, become one
  // program, one launch. A graph with collectives runs at once, over its group.
  const bool record = graph.group.empty() && runtime.mode() != runtime::EagerMode::Debug;
  if (!record)
    for (const auto& b : buffers) runtime.resolve(*b, "compiled_graph");
  // Donate an overwritten input's buffer only when the input's storage is its
  // sole holder (the storage and `buffers` here: no other storage, view read
  // or argument shares it), so no live tensor can see the donated buffer; the
  // storage takes the output right after the launch. Otherwise XLA copies.
  std::vector<int64_t> keep;
  int64_t donated = 0;
  std::vector<PJRT_Buffer*> raw;
  if (!record)
    for (const auto& b : buffers) raw.push_back(b->raw());
  for (const auto& m : graph.mutations) {
    if (!m.aliased || record) continue;
    const auto& buffer = buffers[m.input];
    const auto& storage = aten::storage_of(inputs[m.input]);
    const bool sole = storage.value == buffer && buffer.use_count() == 2 &&
                      std::count(raw.begin(), raw.end(), buffer->raw()) == 1 &&
                      !buffer->borrowed();  // another library's memory (from_dlpack): never written
    if (sole)
      ++donated;
    else
      keep.push_back(m.input);
  }
  const auto& generator = aten::default_generator(static_cast<c10::DeviceIndex>(dev));
  for (int k = 0; k < graph.num_keys; ++k) {  // a fresh key per random op and call, as in eager
    buffers.push_back(aten::upload(aten::next_key_tensor(generator, graph.name), dev));
  }
  std::vector<pjrt::BufferPtr> results;
  try {
    if (record) {
      runtime.check_fits(dev, graph.program->output_bytes);  // as a launch would: the window does not
      results = runtime.record_graph(graph.program, buffers, dev, interned(graph.name));
    } else if (graph.group.empty()) {
      results = runtime.execute_now(*graph.program, buffers, dev, graph.name.c_str(), true, keep);
    } else if (auto launched = launch_over_group(graph, std::move(buffers), dev)) {
      results = std::move(*launched);
    } else {
      return py::none();
    }
  } catch (const runtime::OutOfMemory& e) {  // refused before running: nothing was donated
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what(), "\n  in ", graph.name);
  }
  for (const auto& m : graph.mutations) aten::write_dense(inputs[m.input], results.at(m.slot));
  if (donated) runtime.count("donated_buffers", donated);
  return graph_outputs(graph, results, dev, dev);
}

}  // namespace

void bind_graph(py::module& m) {
  py::class_<GraphProgram, std::shared_ptr<GraphProgram>>(m, "_GraphProgram")
      .def_readonly("source", &GraphProgram::source)
      .def_readonly("compile_ms", &GraphProgram::compile_ms);
  m.def("_compile_graph", &compile_graph, py::arg("key"), py::arg("inputs"), py::arg("nodes"), py::arg("outputs"),
        py::arg("output_strides"), py::arg("num_keys"), py::arg("mutations"), py::arg("group") = "",
        py::arg("shardings") = py::none(), py::arg("mesh") = std::vector<int64_t>(),
        py::arg("devices") = std::vector<int>());
  m.def("_run_graph", &run_graph);
  // The ops a compiled graph can hold (rule_for finds a rule): the rest run eagerly between its parts.
  m.def("_graph_ops", [] {
    std::vector<std::string> ops;
    for (auto& op : lowering::registered_ops()) ops.push_back(op.rfind("graph:", 0) == 0 ? op.substr(6) : op);
    return ops;
  });
}

}  // namespace torch_tpu::python
