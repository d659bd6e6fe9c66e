// torch_tpu._C.ProcessGroupTPU: bound on first use, once torch.distributed has
// registered c10d.Backend (our base class) with pybind.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "distributed/process_group_tpu.h"

namespace py = pybind11;

namespace torch_tpu::python {

void bind_distributed(py::module& m) {
  m.def("_set_fused_collectives", &distributed::ProcessGroupTPU::set_fused_collectives);
  m.def("_bind_process_group", [m]() mutable {
    if (py::hasattr(m, "ProcessGroupTPU")) return;
    py::class_<distributed::ProcessGroupTPU, c10d::Backend, c10::intrusive_ptr<distributed::ProcessGroupTPU>>(
        m, "ProcessGroupTPU")
        .def(py::init([](int rank, int size, const std::string& group_key, double timeout_seconds,
                         c10::intrusive_ptr<c10d::Backend> host, std::vector<std::string> places) {
               return c10::make_intrusive<distributed::ProcessGroupTPU>(
                   rank, size, group_key, std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)),
                   std::move(host), std::move(places));
             }),
             py::arg("rank"), py::arg("size"), py::arg("group_key"), py::arg("timeout_seconds"),
             py::arg("host") = c10::intrusive_ptr<c10d::Backend>(), py::arg("places") = std::vector<std::string>())
        .def_property_readonly("host_staged", &distributed::ProcessGroupTPU::host_staged);
  });
}

}  // namespace torch_tpu::python
