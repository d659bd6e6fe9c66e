// nn.Module.to("tpu") keeps parameter identity (and so weight tying, and
// optimizers built before the move) only when PyTorch says a CPU tensor and a
// tpu tensor may share a TensorImpl type: then it assigns `param.data = new`
// instead of making a new Parameter per module. PyTorch's default answer lists
// only its built-in dense backends; a tpu tensor is a plain dense TensorImpl
// too, so it answers yes for any pair of dense CPU/tpu tensors.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

bool is_dense_cpu_or_tpu(const at::Tensor& t) {
  return t.layout() == at::kStrided && !t.is_quantized() && !t.is_nested() &&
         (t.device().is_cpu() || t.device().is_privateuseone());
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.key_set() == from.key_set()) return true;
  return is_dense_cpu_or_tpu(self) && is_dense_cpu_or_tpu(from);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

}  // namespace torch_tpu::aten
