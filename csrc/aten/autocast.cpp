// Mixed precision: torch.autocast("tpu") casts op inputs at the
// AutocastPrivateUse1 dispatch key. The op lists are PyTorch's own shared
// lists (autocast_mode.h), registered with the policies CUDA gives them, so a
// model autocasts on tpu exactly as it does on CUDA: matmuls and convolutions
// in the low dtype, reductions, losses, norms and exp/log/pow in float32,
// mixed-input ops at the widest input type.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

// As on CUDA: binary_cross_entropy on low-precision probabilities is unsafe.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                        int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast (on tpu as on "
              "cuda): use torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which "
              "run in float32 under autocast, or compute the loss outside the autocast region.");
}

}  // namespace

// Ops on no list pass through autocast untouched (PyTorch registers this
// fallthrough for its own autocast keys but not for PrivateUse1's).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  using namespace at;  // the list macros name at:: types unqualified
#define TPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION_FP)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TPU_FP32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
#undef TPU_LOWER_PRECISION_FP
#undef TPU_FP32
#undef TPU_FP32_SET_OPT_DTYPE
#undef TPU_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace torch_tpu::aten
