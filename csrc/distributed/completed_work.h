// What every collective of ProcessGroupTPU returns, and the GIL release
// around its waits. Internal to csrc/distributed/.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace torch_tpu::distributed {

// A collective that finished before it was returned: its outputs are written.
class CompletedWork final : public c10d::Work {
 public:
  CompletedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(rank, type), outputs_(std::move(outputs)) {
    // No devices: a CPU-typed future, which records no events on tpu streams.
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

inline c10::intrusive_ptr<c10d::Work> done(int rank, c10d::OpType type, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<CompletedWork>(rank, type, std::move(outputs));
}

// The other ranks' threads need the GIL while this one waits for them (a
// functional collective is called from Python holding it).
// Hidden like pybind11's own types, which it holds.
struct __attribute__((visibility("hidden"))) WithoutGil {
  std::optional<pybind11::gil_scoped_release> release;
  WithoutGil() {
    if (Py_IsInitialized() && PyGILState_Check()) release.emplace();
  }
};

}  // namespace torch_tpu::distributed
