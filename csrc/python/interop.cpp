// Zero-copy interop through DLPack (torch_tpu.to_dlpack / from_dlpack,
// to_jax / from_jax): on the CPU plugin a device buffer is host memory, so
// another library can read it in place, and we can run on its memory.
//
// Export: the tensor's dense value (the storage itself when the tensor covers
// it), computed first (a Fused window is flushed), held by a PJRT external
// reference and a reference of ours until the consumer's deleter runs; while
// held, it is never donated. Marked read-only: a later write to the tensor
// makes a new buffer, so the consumer reads the value at export.
// Import: a PJRT view of the producer's memory (never donated, never written),
// whose on-delete callback returns the producer's DLPack tensor.
#include <ATen/DLConvertor.h>
#include <ATen/dlpack.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>

#include "aten/tensor_access.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torch_tpu::python {
namespace {

using runtime::Runtime;

constexpr const char* kVersioned = "dltensor_versioned";
constexpr const char* kLegacy = "dltensor";

struct Exported {
  pjrt::BufferPtr buffer;
  std::vector<int64_t> shape, strides;
  DLManagedTensorVersioned versioned{};
  DLManagedTensor legacy{};
};

void release(Exported* e) {
  try {
    e->buffer->release_external_reference();
  } catch (...) {  // a deleter must not throw; the buffer is freed with `e` anyway
  }
  delete e;
}

void capsule_destructor(PyObject* capsule) {  // a capsule no consumer took
  if (PyCapsule_IsValid(capsule, kVersioned)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersioned));
    if (m && m->deleter) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, kLegacy)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacy));
    if (m && m->deleter) m->deleter(m);
  }
}

// A DLPack capsule of `t`'s value in place (the CPU plugin's memory). `versioned`:
// DLPack 1.x, marked read-only; else the legacy struct (consumers that predate 1.0).
py::object export_dlpack(const at::Tensor& t, bool versioned) {
  TORCH_CHECK(t.device().is_privateuseone(), "torch_tpu.to_dlpack: needs a tpu tensor, got one on ", t.device());
  auto& rt = Runtime::get();
  TORCH_CHECK(rt.client().platform_name() == "cpu", "torch_tpu.to_dlpack: zero-copy export needs the CPU plugin (",
              rt.client().platform_name(), " memory is not host memory); torch_tpu.to_dlpack copies through the host.");
  auto buffer = aten::read_dense(t);
  rt.resolve(*buffer, "dlpack");
  buffer->await_ready();
  buffer->add_external_reference();
  auto* e = new Exported{buffer, t.sizes().vec(), {}, {}, {}};
  e->strides.resize(e->shape.size());
  for (int64_t i = static_cast<int64_t>(e->shape.size()) - 1, step = 1; i >= 0; --i) {
    e->strides[i] = step;
    step *= std::max<int64_t>(e->shape[i], 1);
  }
  DLTensor dl{};
  dl.data = reinterpret_cast<void*>(buffer->unsafe_pointer());
  dl.device = {kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(e->shape.size());
  dl.dtype = at::getDLDataType(t);
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = 0;
  rt.count("interop_zero_copy_exports");
  if (versioned) {
    e->versioned.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    e->versioned.manager_ctx = e;
    e->versioned.deleter = [](DLManagedTensorVersioned* m) { release(static_cast<Exported*>(m->manager_ctx)); };
    e->versioned.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    e->versioned.dl_tensor = dl;
    return py::reinterpret_steal<py::object>(PyCapsule_New(&e->versioned, kVersioned, capsule_destructor));
  }
  e->legacy.manager_ctx = e;
  e->legacy.deleter = [](DLManagedTensor* m) { release(static_cast<Exported*>(m->manager_ctx)); };
  e->legacy.dl_tensor = dl;
  return py::reinterpret_steal<py::object>(PyCapsule_New(&e->legacy, kLegacy, capsule_destructor));
}

// The producer's DLPack tensor, returned when PJRT is done with the view.
struct Imported {
  DLManagedTensorVersioned* versioned = nullptr;
  DLManagedTensor* legacy = nullptr;
};

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

void return_import(void*, void* arg) {
  auto* i = static_cast<Imported*>(arg);
  // The producer's deleter may release Python objects (numpy's does): with
  // the GIL, and not at all once the interpreter is going away (then it leaks).
  if (Py_IsInitialized() && !python_finalizing()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    if (i->versioned && i->versioned->deleter) i->versioned->deleter(i->versioned);
    if (i->legacy && i->legacy->deleter) i->legacy->deleter(i->legacy);
    PyGILState_Release(gil);
  }
  delete i;
}

// A tpu tensor on `device` over a DLPack capsule's memory, without a copy; None
// where that cannot be (not host memory, not dense row-major, misaligned, a
// plugin without views): the caller copies then.
py::object import_dlpack(const py::object& capsule, int device) {
  PyObject* c = capsule.ptr();
  const bool versioned = PyCapsule_IsValid(c, kVersioned);
  TORCH_CHECK(versioned || PyCapsule_IsValid(c, kLegacy),
              "torch_tpu.from_dlpack: not a DLPack capsule (or one already consumed)");
  auto* v = versioned ? static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, kVersioned)) : nullptr;
  auto* l = versioned ? nullptr : static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacy));
  const DLTensor& dl = versioned ? v->dl_tensor : l->dl_tensor;
  auto& rt = Runtime::get();
  if (rt.client().platform_name() != "cpu" || dl.device.device_type != kDLCPU) return py::none();
  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides)
    for (int64_t i = dl.ndim - 1, step = 1; i >= 0; --i) {
      if (shape[i] != 1 && dl.strides[i] != step) return py::none();
      step *= shape[i];
    }
  auto* data = static_cast<char*>(dl.data) + dl.byte_offset;
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return py::none();  // XLA CPU's minimum alignment
  const at::ScalarType dtype = at::toScalarType(dl.dtype);
  auto* arg = new Imported{v, l};
  pjrt::BufferPtr buffer;
  try {
    buffer = rt.client().view_of(data, runtime::pjrt_type(aten::to_dtype(dtype)), shape, rt.device(device),
                                 return_import, arg);
  } catch (const std::exception&) {  // the plugin refused this memory: copy instead
    buffer = nullptr;
  }
  if (!buffer) {
    delete arg;
    return py::none();
  }
  PyCapsule_SetName(c, versioned ? "used_dltensor_versioned" : "used_dltensor");  // ours to release now
  rt.count("interop_zero_copy_imports");
  return py::cast(aten::wrap_buffer(buffer, shape, dtype, device));
}

}  // namespace

void bind_interop(py::module& m) {
  m.def("_export_dlpack", &export_dlpack, py::arg("tensor"), py::arg("versioned") = true);
  m.def("_import_dlpack", &import_dlpack, py::arg("capsule"), py::arg("device"));
  m.def("_count_metric", [](const std::string& name, int64_t n) { Runtime::get().count(name, n); });
}

}  // namespace torch_tpu::python
