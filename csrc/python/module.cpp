// torch_tpu._C: the extension module's bindings. Thin: every function here
// forwards to the runtime or the aten layer.
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>

#include "aten/bounded.h"
#include "aten/cpu_fallback.h"
#include "aten/general_kernel.h"
#include "aten/generator.h"
#include "aten/tensor_access.h"
#include "lowering/registry.h"
#include "runtime/fused_window.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace torch_tpu::python {
void bind_graph(py::module& m);        // graph.cpp: torch.compile's graphs
void bind_distributed(py::module& m);  // distributed.cpp: the c10d backend
void bind_foreign(py::module& m);      // foreign.cpp: ops written in JAX
void bind_interop(py::module& m);      // interop.cpp: zero-copy DLPack
}  // namespace torch_tpu::python
using torch_tpu::runtime::EagerMode;
using torch_tpu::runtime::Runtime;

namespace {

// Median microseconds of a bare PJRT execute of `a + b` on the tensors'
// buffers: the floor under the eager dispatch of the same op.
double bare_execute_median_us(const at::Tensor& a, const at::Tensor& b, int iters) {
  namespace shlo = torch_tpu::stablehlo;
  shlo::TensorType ta{torch_tpu::aten::to_dtype(a.scalar_type()), {a.numel()}};
  shlo::Builder builder;
  auto x = builder.parameter(ta), y = builder.parameter(ta);
  auto out = builder.binary(shlo::Binary::Add, x, y);
  auto program = Runtime::get().program("bench|" + out.type.str(), [&] {
    return std::make_pair(builder.module({out}), std::vector<shlo::TensorType>{out.type});
  });
  auto ba = torch_tpu::aten::read_dense(a), bb = torch_tpu::aten::read_dense(b);
  Runtime::get().resolve(*ba);
  Runtime::get().resolve(*bb);
  PJRT_Device* device = Runtime::get().device(torch_tpu::aten::device_index(a));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto outs = Runtime::get().executable(*program)->execute({ba->raw(), bb->raw()}, device);
    outs.clear();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu native extension";
  torch_tpu::python::bind_graph(m);
  torch_tpu::python::bind_distributed(m);
  torch_tpu::python::bind_foreign(m);
  torch_tpu::python::bind_interop(m);
  m.def("_set_search_paths", &Runtime::set_search_paths);
  m.def("_register_kernels", &torch_tpu::aten::register_general_kernels);
  m.def("_initialized", &Runtime::initialized);
  m.def("_in_bad_fork", &Runtime::in_bad_fork);
  m.def("_set_device", [](int i) {
    c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->setDevice(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i)));
  });
  m.def("_current_device",
        [] { return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index(); });
  m.def("device_count", [] { return Runtime::get().device_count(); });
  m.def("platform_name", [] { return Runtime::get().client().platform_name(); });
  m.def("platform_version", [] { return Runtime::get().client().platform_version(); });
  m.def("device_kind", [](int i) { return Runtime::get().client().device_kind(i); });
  m.def("device_id", [](int i) { return Runtime::get().client().device_id(i); });
  auto to_dict = [](const torch_tpu::pjrt::Plugin::Attributes& attributes) {
    py::dict out;
    for (auto& [name, value] : attributes) out[py::str(name)] = std::visit([](auto& v) { return py::cast(v); }, value);
    return out;
  };
  m.def("device_attributes", [to_dict](int i) { return to_dict(Runtime::get().client().device_attributes(i)); });
  m.def("plugin_attributes", [to_dict] { return to_dict(Runtime::get().client().plugin()->attributes()); });
  m.def("device_name", [] { return Runtime::get().device_name(); });
  m.def("plugin_path", [] { return Runtime::get().plugin_path(); });
  m.def("plugin_api_version", [] { return Runtime::get().client().plugin()->version(); });
  m.def("synchronize", [](int device) {
    try {
      py::gil_scoped_release release;
      Runtime::get().synchronize(device);
    } catch (const torch_tpu::runtime::DeviceCheckFailed& e) {  // IndexError or RuntimeError, as CPU raises it
      if (torch_tpu::runtime::raises_runtime_error(e.what()))
        throw std::runtime_error(torch_tpu::runtime::check_message(e.what()));
      throw py::index_error(e.what());
    }
  });
  m.def("metrics", [] { return Runtime::get().metrics(); });
  m.def("_mark_dynamic", &torch_tpu::aten::mark_dynamic);
  m.def("_dynamic_shapes_enabled", &torch_tpu::aten::dynamic_shapes_enabled);
  m.def("_set_dynamic", &torch_tpu::aten::set_dynamic_setting);
  m.def("_forget_auto_bounds", &torch_tpu::aten::forget_auto_bounds);
  m.def("_bucket_for", &torch_tpu::aten::bucket_for);
  m.def("_as_padded", [](const at::Tensor& full, std::vector<int64_t> real, std::vector<int64_t> bounded) {
    return torch_tpu::aten::as_padded(full, real, bounded);
  });
  m.def("_padded_shape", [](const at::Tensor& t) -> std::optional<std::vector<int64_t>> {
    const auto& s = torch_tpu::aten::storage_of(t);
    if (!s.padding) return std::nullopt;
    return s.padding->padded();
  });
  // The persistent compilation cache; needs no runtime (no plugin load).
  m.def("cache_info", [] {
    auto i = torch_tpu::runtime::DiskCache::from_environment()->info();
    py::dict d;
    d["dir"] = i.dir;
    d["enabled"] = !i.dir.empty();
    d["entries"] = i.entries;
    d["bytes"] = i.bytes;
    d["limit_bytes"] = i.limit;
    return d;
  });
  m.def("cache_entries", [] {
    py::list out;
    for (const auto& e : torch_tpu::runtime::DiskCache::from_environment()->entries()) {
      py::dict d;
      d["file"] = e.file;
      d["what"] = e.what;
      d["bytes"] = e.bytes;
      d["hits"] = e.hits;
      d["compile_ms"] = e.compile_ms;
      d["age_s"] = e.age_s;
      out.append(d);
    }
    return out;
  });
  m.def("cache_clear", [] {
    auto disk = torch_tpu::runtime::DiskCache::from_environment();
    // The runtime's own cache object, when it is this directory: its running size starts over.
    if (Runtime::initialized() && Runtime::get().disk_cache().dir() == disk->dir())
      return Runtime::get().disk_cache().clear();
    return disk->clear();
  });
  m.def("reset_metrics", [] { Runtime::get().reset_metrics(); });
  m.def("memory_allocated", [](int d) { return Runtime::get().memory_allocated(d); });
  m.def("max_memory_allocated", [](int d) { return Runtime::get().max_memory_allocated(d); });
  m.def("device_bytes_in_use", [](int d) { return Runtime::get().client().device_bytes_in_use(d); });
  // CUDA's memory_stats keys for what we account, plus what the plugin reports.
  m.def("memory_stats", [](int d) {
    auto s = Runtime::get().memory_stats(d);
    std::map<std::string, int64_t> out{
        {"allocated_bytes.all.current", s.allocated_bytes},
        {"allocated_bytes.all.peak", s.peak_allocated_bytes},
        {"allocated_bytes.all.allocated", s.total_allocated_bytes},
        {"allocated_bytes.all.freed", s.total_freed_bytes},
        {"allocation.all.current", s.allocations},
        {"allocation.all.peak", s.peak_allocations},
        {"allocation.all.allocated", s.total_allocations},
        {"allocation.all.freed", s.total_frees},
        {"num_ooms", s.ooms},
        {"num_alloc_retries", 0},
        {"capacity_bytes", s.capacity},
        {"reserved_bytes.all.current", s.reserved_bytes},
        {"reserved_bytes.all.peak", s.peak_reserved_bytes},
    };
    if (auto p = Runtime::get().client().device_memory_stats(d)) {
      out["device.bytes_in_use"] = p->bytes_in_use;
      if (p->peak_bytes_in_use >= 0) out["device.peak_bytes_in_use"] = p->peak_bytes_in_use;
      if (p->num_allocs >= 0) out["device.num_allocs"] = p->num_allocs;
      if (p->bytes_limit >= 0) out["device.bytes_limit"] = p->bytes_limit;
      if (p->bytes_reserved >= 0) out["device.bytes_reserved"] = p->bytes_reserved;
      if (p->peak_bytes_reserved >= 0) out["device.peak_bytes_reserved"] = p->peak_bytes_reserved;
    }
    return out;
  });
  m.def("reset_peak_memory_stats", [](int d) { Runtime::get().reset_peak_memory_stats(d); });
  m.def("reset_accumulated_memory_stats", [](int d) { Runtime::get().reset_accumulated_memory_stats(d); });
  m.def("memory_capacity", [](int d) { return Runtime::get().memory_capacity(d); });
  m.def("set_eager_mode", [](const std::string& mode) {
    if (mode == "strict")
      Runtime::get().set_mode(EagerMode::Strict);
    else if (mode == "debug")
      Runtime::get().set_mode(EagerMode::Debug);
    else if (mode == "fused")
      Runtime::get().set_mode(EagerMode::Fused);
    else
      throw py::value_error("torch_tpu.set_eager_mode: '" + mode + "' is not one of: strict, debug, fused");
  });
  m.def("set_fallback", [](const std::string& mode) {
    if (mode != "cpu" && mode != "error")
      throw py::value_error("torch_tpu.set_fallback: '" + mode + "' is not one of: cpu, error");
    torch_tpu::aten::set_fallback_raises(mode == "error");
  });
  m.def("get_fallback", [] { return torch_tpu::aten::fallback_raises_errors() ? "error" : "cpu"; });
  m.def("set_check_nan", [](bool on) { Runtime::get().set_check_nan(on); });
  m.def("get_check_nan", [] { return Runtime::get().check_nan(); });
  m.def("get_eager_mode", [] {
    switch (Runtime::get().mode()) {
      case EagerMode::Debug: return "debug";
      case EagerMode::Fused: return "fused";
      default: return "strict";
    }
  });
  // Runs Fused mode's windows now (mark_step, the optimizer-step hook, exit):
  // the current device's, and every other that never held collectives (a
  // rank's window with collectives is its own thread's to run).
  m.def("_flush", [](const std::string& reason) {
    py::gil_scoped_release release;
    Runtime::get().flush(reason.c_str());
    Runtime::get().flush(c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index(),
                         reason.c_str());
  });
  m.def("_set_thread_rank", &torch_tpu::runtime::FusedWindow::set_thread_rank);
  m.def("_discard_collectives", [](int device) {
    py::gil_scoped_release release;
    Runtime::get().discard_collectives(device);
  });
  // The structured trace (torch_tpu/_trace.py): `listener(family, key, mlir,
  // how, context, ms)` per program compiled or loaded from the disk cache.
  m.def("_set_program_listener", [](py::object listener) {
    if (listener.is_none()) return Runtime::set_program_listener(nullptr);
    // Dropped with the GIL; left to the OS once Python is gone (a listener
    // still set at exit is destroyed with the runtime, after Python).
    std::shared_ptr<py::object> held(new py::object(std::move(listener)), [](py::object* o) {
      if (!Py_IsInitialized()) return;
      py::gil_scoped_acquire gil;
      delete o;
    });
    Runtime::set_program_listener([held](const Runtime::ProgramNote& n) {
#if PY_VERSION_HEX >= 0x030D0000
      if (Py_IsFinalizing()) return;  // (the window flushed at exit)
#else
      if (_Py_IsFinalizing()) return;  // (the window flushed at exit)
#endif
      py::gil_scoped_acquire gil;
      try {
        (*held)(n.family, n.key, n.mlir, n.how, n.context, n.ms);
      } catch (const py::error_already_set& e) {  // a trace that fails to write never fails the op
        PyErr_WarnEx(PyExc_RuntimeWarning, (std::string("torch_tpu: structured trace: ") + e.what()).c_str(), 1);
      }
    });
  });
  // TORCH_TPU_FUSED_DEBUG=1: each recorded op keeps the Python frames that called it.
  Runtime::set_stack_provider([] {
    py::gil_scoped_acquire gil;
    try {
      py::list frames = py::module::import("traceback").attr("format_stack")();
      std::string out;
      for (const auto& f : frames) {
        std::string line = py::str(f);
        if (line.find("/torch/") == std::string::npos) out += line;  // the user's frames, not torch's
      }
      return out;
    } catch (const py::error_already_set&) {
      return std::string();
    }
  });
  // The XLA options each kind of program compiles with (README "XLA options").
  m.def("_xla_options", [] {
    using torch_tpu::runtime::ProgramKind;
    auto& r = Runtime::get();
    return std::map<std::string, std::string>{{"op", r.xla_options(ProgramKind::Op)},
                                              {"window", r.xla_options(ProgramKind::Window)},
                                              {"graph", r.xla_options(ProgramKind::Graph)}};
  });
  // Compiles MLIR text as-is: lets tests reach the plugin's own error messages.
  m.def("_compile", [](const std::string& mlir) {
    Runtime::get().client().compile(mlir, torch_tpu::pjrt::single_device_compile_options());
  });
  m.def("registered_lowerings", [] {  // the aten ops; "graph:" forms serve compiled graphs only
    std::vector<std::string> ops;
    for (auto& op : torch_tpu::lowering::registered_ops())
      if (op.rfind("aten::", 0) == 0) ops.push_back(op);
    return ops;
  });
  m.def("_bare_execute_median_us", &bare_execute_median_us);
  m.def("_fallback_call_sites", &torch_tpu::aten::fallback_call_sites);
  m.def("_compile_changes", [] { return Runtime::get().compile_changes(); });
  // Program executions with their device time (launch to outputs ready); a
  // traced execution waits for its outputs. torch.profiler uses the same trace.
  m.def("_start_trace", [] { Runtime::get().start_trace(); });
  m.def("_stop_trace", [] {
    std::vector<std::tuple<std::string, int, int64_t>> out;
    for (const auto& e : Runtime::get().stop_trace()) out.emplace_back(e.name, e.device, e.end_ns - e.start_ns);
    return out;
  });
  m.def("_set_cache_only", [](bool on) { Runtime::get().set_cache_only(on); });
  m.def("_cache_only", [] { return Runtime::get().cache_only(); });
  m.def("_set_compile_fault", [](const std::string& marker) { Runtime::get().set_compile_fault(marker); });
  // The device's default generator as a torch.Generator, one Python object per device.
  m.def("_default_generator", [](int device) {
    static std::vector<PyObject*> objects;
    const at::Generator& g = torch_tpu::aten::default_generator(static_cast<c10::DeviceIndex>(device));
    const size_t i = static_cast<size_t>(g.device().index());
    if (objects.size() <= i) objects.resize(i + 1, nullptr);
    if (!objects[i]) objects[i] = THPGenerator_initDefaultGenerator(g);
    return py::reinterpret_borrow<py::object>(objects[i]);
  });
  m.def("_manual_seed_all", &torch_tpu::aten::manual_seed_all);
}
