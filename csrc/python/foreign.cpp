// torch_tpu.jax_op's native half: an op defined at run time whose body is
// lowered by a Python function (JAX), registered into the lowering table
// and given the general kernel, so every path runs it like an aten op.
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>

#include "aten/general_kernel.h"
#include "aten/tensor_access.h"
#include "lowering/registry.h"

namespace py = pybind11;

namespace torch_tpu::python {
namespace {

stablehlo::TensorType tensor_type(const py::handle& t) {
  auto dtype = t[py::int_(0)];
  TORCH_CHECK(THPDtype_Check(dtype.ptr()), "torch_tpu: a lowerer's result type needs a torch.dtype");
  return {aten::to_dtype(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type),
          t[py::int_(1)].cast<std::vector<int64_t>>()};
}

// `lower(statics, [(dtype, shape), ...])` -> (entry, [(name, func.func text)], [(dtype, shape)]).
void register_foreign_op(const std::string& op, const py::function& lower) {
  // Kept for the process: the rule may run at exit, and a py::object must not die without the GIL.
  auto* fn = new py::object(lower);
  lowering::register_foreign_op(
      op, [fn, op](const std::string& statics, const std::vector<stablehlo::TensorType>& inputs) {
        py::gil_scoped_acquire gil;
        try {
          py::list types;
          for (const auto& t : inputs)
            types.append(py::make_tuple(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
                                            torch::getTHPDtype(aten::to_scalar_type(t.dtype)))),
                                        py::cast(t.shape)));
          py::tuple r = (*fn)(statics, types);
          lowering::ForeignFunction f;
          f.entry = r[0].cast<std::string>();
          f.functions = r[1].cast<std::vector<std::pair<std::string, std::string>>>();
          for (const auto& t : r[2]) f.results.push_back(tensor_type(t));
          return f;
        } catch (py::error_already_set& e) {
          throw std::runtime_error(e.what());  // the Python error's text, without holding Python state
        }
      });
  aten::register_general_kernel(op);
}

}  // namespace

void bind_foreign(py::module& m) { m.def("_register_foreign_op", &register_foreign_op); }

}  // namespace torch_tpu::python
