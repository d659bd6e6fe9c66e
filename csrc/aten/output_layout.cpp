#include "aten/output_layout.h"

#include <ATen/TensorIterator.h>
#include <ATen/TensorUtils.h>

#include <optional>
#include <set>

#include "aten/tensor_access.h"

namespace torch_tpu::aten {
namespace {

// Ops whose CPU and CUDA kernels lay their outputs out in the memory format
// their input suggests (convolution: its input or its weight). Their meta
// kernels do too, except where the format is ambiguous (one channel, or 1x1
// images: contiguous and channels_last at once) or, for convolution, at all
// (it has no device to ask). Outputs are channels_last when CPU's
// suggest_memory_format says so.
bool follows_input_format(const std::string& op) {
  static const std::set<std::string, std::less<>> ops = {"aten::convolution",
                                                         "aten::upsample_nearest1d",
                                                         "aten::upsample_nearest2d",
                                                         "aten::upsample_nearest3d",
                                                         "aten::_upsample_nearest_exact1d",
                                                         "aten::_upsample_nearest_exact2d",
                                                         "aten::_upsample_nearest_exact3d",
                                                         "aten::upsample_linear1d",
                                                         "aten::upsample_bilinear2d",
                                                         "aten::upsample_trilinear3d",
                                                         "aten::max_pool2d_with_indices",
                                                         "aten::max_pool3d_with_indices",
                                                         "aten::avg_pool2d",
                                                         "aten::avg_pool3d",
                                                         "aten::_adaptive_avg_pool2d",
                                                         "aten::_adaptive_avg_pool3d",
                                                         "aten::_native_batch_norm_legit",
                                                         "aten::_native_batch_norm_legit.no_stats",
                                                         "aten::_native_batch_norm_legit_functional",
                                                         "aten::_native_batch_norm_legit_no_training"};
  return ops.count(op) > 0;
}

std::optional<std::vector<int64_t>> channels_last_strides(const std::string& op, const std::vector<c10::IValue>& args,
                                                          const std::vector<int64_t>& sizes) {
  auto format = [&](size_t i) {
    return i < args.size() && args[i].isTensor() && args[i].toTensor().defined()
               ? args[i].toTensor().suggest_memory_format()
               : at::MemoryFormat::Contiguous;
  };
  const bool convolution = op == "aten::convolution";
  auto is = [&](at::MemoryFormat f) { return format(0) == f || (convolution && format(1) == f); };
  if (sizes.size() == 4 && is(at::MemoryFormat::ChannelsLast)) return c10::get_channels_last_strides_2d(sizes);
  if (sizes.size() == 5 && is(at::MemoryFormat::ChannelsLast3d)) return c10::get_channels_last_strides_3d(sizes);
  return std::nullopt;
}

// A pointwise op's output strides as TensorIterator computes them from its
// inputs' strides (CPU's and CUDA's rule), by building one over meta
// stand-ins: the meta kernels (Python) agree except in the strides of size-1
// dimensions. None when the inputs do not give `sizes`.
std::optional<std::vector<int64_t>> tensor_iterator_strides(const std::string& op, const std::vector<bool>& is_out,
                                                            const std::vector<c10::IValue>& args,
                                                            const std::vector<int64_t>& sizes) {
  at::TensorIteratorConfig config;
  config.set_check_mem_overlap(false).check_all_same_dtype(false).promote_inputs_to_common_dtype(true);
  config.add_owned_output(at::Tensor());
  // A binary op's Scalar overload (add.Scalar, eq.Scalar) wraps its number in
  // a 0-d tensor that TensorIterator iterates with the tensor.
  const bool wraps_scalars = op.find(".Scalar") != std::string::npos && op.rfind("aten::pow", 0) != 0;
  bool any = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out[i]) continue;
    if (wraps_scalars && (args[i].isDouble() || args[i].isInt() || args[i].isBool())) {
      config.add_owned_const_input(at::empty({}, at::TensorOptions().device(at::kMeta)));
      continue;
    }
    if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
    const at::Tensor& t = args[i].toTensor();
    config.add_owned_const_input(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
    any = true;
  }
  if (!any) return std::nullopt;
  try {
    auto iter = config.build();
    if (iter.output(0).sizes() != at::IntArrayRef(sizes)) return std::nullopt;
    return iter.output(0).strides().vec();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

// Ops whose CPU kernels lay their outputs out as TensorIterator does over
// their inputs: the pointwise ones, and floor_divide (TensorIterator's, untagged).
bool lays_out_like_its_inputs(const std::string& op, bool pointwise) {
  return pointwise || op == "aten::floor_divide" || op == "aten::floor_divide.Scalar";
}

// sort's, nan_to_num's and isinf's CPU kernels allocate outputs as empty_like(self): self's strides
// when self is dense, else dense strides in self's dimension order.
std::vector<int64_t> empty_like_strides(const at::Tensor& self) {
  if (self.is_non_overlapping_and_dense()) return self.strides().vec();
  return at::infer_dense_strides(self.sizes(), self.strides());
}

}  // namespace

void lay_out_like_cpu(const std::string& op, bool pointwise, const std::vector<bool>& is_out,
                      const std::vector<c10::IValue>& args, const std::vector<stablehlo::TensorType>& outs,
                      std::vector<std::vector<int64_t>>& strides) {
  const size_t n = std::min(outs.size(), strides.size());
  // clamp of an integer tensor by a float number, and pow of a tensor to a
  // number of another dtype (bool ** 3): CPU's meta promotes self first
  // (self.to(dtype): dense strides), then iterates over that copy.
  const bool promotes_self =
      ((op == "aten::clamp" || op == "aten::clamp_min" || op == "aten::clamp_max") && n > 0 && args[0].isTensor() &&
       c10::isIntegralType(args[0].toTensor().scalar_type(), /*includeBool=*/true) &&
       stablehlo::is_float(outs[0].dtype)) ||
      (op == "aten::pow.Tensor_Scalar" && n > 0 && args[0].isTensor() &&
       to_dtype(args[0].toTensor().scalar_type()) != outs[0].dtype);
  std::vector<c10::IValue> promoted;
  if (promotes_self) {
    const at::Tensor& self = args[0].toTensor();
    promoted = args;
    promoted[0] = at::empty_strided(self.sizes(), empty_like_strides(self), self.options().device(at::kMeta));
  }
  if (lays_out_like_its_inputs(op, pointwise))
    for (size_t k = 0; k < n; ++k)
      if (auto ti = tensor_iterator_strides(op, is_out, promotes_self ? promoted : args, outs[k].shape))
        strides[k] = *ti;
  // isinf of integers is zeros_like(self): no element can be infinite.
  const bool isinf_of_integers = op == "aten::isinf" && !at::isFloatingType(args[0].toTensor().scalar_type()) &&
                                 !at::isComplexType(args[0].toTensor().scalar_type());
  if (op == "aten::sort" || op == "aten::sort.stable" || op == "aten::nan_to_num" || isinf_of_integers)
    for (size_t k = 0; k < n; ++k) strides[k] = empty_like_strides(args[0].toTensor());
  // masked_fill: a contiguous clone, filled; pow.Scalar (a number to a tensor's
  // powers): CPU's meta sets its output with no strides, contiguous.
  if (op == "aten::masked_fill.Scalar" || op == "aten::masked_fill.Tensor" || op == "aten::pow.Scalar")
    for (size_t k = 0; k < n; ++k) {
      auto contiguous = c10::contiguous_strides(outs[k].shape);
      strides[k].assign(contiguous.begin(), contiguous.end());
    }
  if (follows_input_format(op))
    for (size_t k = 0; k < n; ++k)
      if (auto channels_last = channels_last_strides(op, args, outs[k].shape)) strides[k] = *channels_last;
}

}  // namespace torch_tpu::aten
