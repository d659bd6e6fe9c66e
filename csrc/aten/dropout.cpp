// native_dropout (F.dropout and nn.Dropout in training reach it on tpu): its
// schema takes no generator, so it is composed of two lowered ops, as CPU
// composes it: a keep mask from bernoulli_ (the default generator's key) and
// input * mask * 1/(1-p), which is native_dropout_backward's rule.
#include <ATen/ops/native_dropout_backward.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <algorithm>

#include "aten/bounded.h"

namespace torch_tpu::aten {
namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  // CPU's answers for the corner cases: an empty input comes back as is with
  // an empty mask of its dtype; evaluation copies the input and keeps all.
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  const double keep = 1 - p;  // bernoulli_ checks that it lies in [0, 1]
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(keep);
  // p == 1 scales by 0 (CPU's choice), so the output is zeros, not NaN.
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  // A padded input (README "Bounded dynamic shapes"): the mask is drawn at
  // its padded shape and padded alike, so dropout compiles per bucket too.
  if (auto read = is_padded(input) ? padded_read(input) : std::nullopt;
      read && read->whole && std::is_sorted(read->memory_dims.begin(), read->memory_dims.end())) {
    at::Tensor draws = at::empty(read->shape(), input.options().dtype(at::kBool)).bernoulli_(keep);
    at::Tensor padded_mask = wrap_padded(read_dense(draws), read->dims, at::kBool, device_index(input));
    return {at::native_dropout_backward(input, padded_mask, scale), padded_mask};
  }
  return {at::native_dropout_backward(input, mask, scale), mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", native_dropout); }

}  // namespace torch_tpu::aten
