// Meta kernels (output shapes and dtypes) for ops PyTorch ships without one,
// so that the general kernel can lower them: the fused GRU cell, which
// nn.GRU calls on PrivateUse1 devices and which has no CPU kernel either,
// _logcumsumexp, geqrf, linalg_lstsq, _add_relu.Scalar, the margin losses' and
// fractional_max_pool3d's and CTC's backward, the histogram ops.
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "aten/general_kernel.h"

namespace torch_tpu::aten {
namespace {

at::Tensor meta_like(const at::Tensor& t, at::IntArrayRef sizes) {
  return at::empty(sizes, t.options().device(at::kMeta));
}

// (hy [B, H], workspace [B, 5H]).
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>&,
                                                  const std::optional<at::Tensor>&) {
  TORCH_CHECK(hx.dim() == 2 && input_gates.dim() == 2 && hidden_gates.dim() == 2 &&
                  input_gates.sizes() == hidden_gates.sizes() && input_gates.size(0) == hx.size(0) &&
                  input_gates.size(1) == 3 * hx.size(1),
              "_thnn_fused_gru_cell: expected input_gates and hidden_gates of shape [B, 3H] and hx of shape [B, H], "
              "got ",
              input_gates.sizes(), ", ", hidden_gates.sizes(), " and ", hx.sizes());
  return {meta_like(hx, hx.sizes()), meta_like(hx, {hx.size(0), 5 * hx.size(1)})};
}

// (grad_input_gates [B, 3H], grad_hidden_gates [B, 3H], grad_hx [B, H],
// grad_input_bias [3H], grad_hidden_bias [3H]; the biases' only with has_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(1) == 5 * grad_hy.size(1),
              "_thnn_fused_gru_cell_backward: expected grad_hy [B, H] and workspace [B, 5H], got ", grad_hy.sizes(),
              " and ", workspace.sizes());
  const int64_t b = grad_hy.size(0), h = grad_hy.size(1);
  at::Tensor bias = has_bias ? meta_like(grad_hy, {3 * h}) : at::Tensor();
  return {meta_like(grad_hy, {b, 3 * h}), meta_like(grad_hy, {b, 3 * h}), meta_like(grad_hy, {b, h}), bias,
          has_bias ? meta_like(grad_hy, {3 * h}) : at::Tensor()};
}

// _logcumsumexp(self, dim): self's shape and dtype (logcumsumexp checks the dtype first).
at::Tensor logcumsumexp(const at::Tensor& self, int64_t /*dim*/) { return meta_like(self, self.sizes()); }

// geqrf(self [..., m, n]) -> (a [..., m, n], tau [..., min(m, n)]), LAPACK's checks.
std::tuple<at::Tensor, at::Tensor> geqrf(const at::Tensor& self) {
  TORCH_CHECK(self.dim() >= 2, "torch.geqrf: input must have at least 2 dimensions.");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "torch.geqrf: Expected a floating point or complex tensor as input. Got ", self.scalar_type());
  std::vector<int64_t> tau(self.sizes().begin(), self.sizes().end() - 2);
  tau.push_back(std::min(self.size(-2), self.size(-1)));
  return {meta_like(self, self.sizes()), meta_like(self, tau)};
}

// linalg_lstsq(self [*, m, n], b [*, m, k] or [*, m], rcond?, *, driver?) ->
// (solution, residuals, rank, singular_values), shaped as CPU's drivers leave
// them: residuals only for m > n and a driver other than gelsy (assuming full
// rank), rank for all but gels, singular values for gelsd and gelss.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linalg_lstsq(const at::Tensor& self, const at::Tensor& b,
                                                                        std::optional<double> /*rcond*/,
                                                                        std::optional<c10::string_view> driver) {
  TORCH_CHECK(self.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.");
  TORCH_CHECK(self.dim() >= b.dim() && self.dim() - b.dim() <= 1,
              "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and (input.dim() - "
              "other.dim()) <= 1");
  TORCH_CHECK(self.scalar_type() == b.scalar_type(),
              "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype ",
              self.scalar_type(), " and other's dtype ", b.scalar_type());
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
              "torch.linalg.lstsq: Expected a floating point or complex tensor as input. Got ", self.scalar_type());
  const bool vector = b.dim() == self.dim() - 1;
  const int64_t m = self.size(-2), n = self.size(-1), k = vector ? 1 : b.size(-1);
  TORCH_CHECK(b.size(vector ? -1 : -2) == m, "torch.linalg.lstsq: input.size(-2) should match other.size(-",
              vector ? 1 : 2, ")");
  const std::string d = driver.has_value() ? std::string(*driver) : "gelsy";
  TORCH_CHECK(d == "gels" || d == "gelsy" || d == "gelsd" || d == "gelss",
              "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  auto batch = at::infer_size(self.sizes().slice(0, self.dim() - 2), b.sizes().slice(0, b.dim() - (vector ? 1 : 2)));
  std::vector<int64_t> solution = batch, residuals = {0}, rank = {0}, singular = {0};
  solution.push_back(n);
  if (!vector) solution.push_back(k);
  if (m > n && d != "gelsy") {
    residuals = batch;
    residuals.push_back(k);
  }
  if (d != "gels") rank = batch;
  if (d == "gelsd" || d == "gelss") {
    singular = batch;
    singular.push_back(std::min(m, n));
  }
  // Residuals and singular values are real (float for complex64).
  const auto real = self.options().device(at::kMeta).dtype(c10::toRealValueType(self.scalar_type()));
  return {meta_like(self, solution), at::empty(residuals, real),
          at::empty(rank, self.options().device(at::kMeta).dtype(at::kLong)), at::empty(singular, real)};
}

// _add_relu.Scalar: add.Scalar's result (relu keeps shape and dtype).
at::Tensor add_relu_scalar(const at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::add(self, other, alpha);
}

// multi_margin_loss_backward / multilabel_margin_loss_backward: self's shape.
at::Tensor multi_margin_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&, const at::Scalar&,
                                      const at::Scalar&, const std::optional<at::Tensor>&, int64_t) {
  return meta_like(self, self.sizes());
}
at::Tensor multilabel_margin_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&, int64_t,
                                           const at::Tensor&) {
  return meta_like(self, self.sizes());
}

// fractional_max_pool3d_backward: self's shape.
at::Tensor fractional_max_pool3d_backward(const at::Tensor&, const at::Tensor& self, at::IntArrayRef, at::IntArrayRef,
                                          const at::Tensor&) {
  return meta_like(self, self.sizes());
}

// The histogram ops: hist [bins...] and edges [bins + 1] in self's dtype.
std::tuple<at::Tensor, at::Tensor> histogram_bin_ct(const at::Tensor& self, int64_t bins,
                                                    std::optional<at::ArrayRef<double>>,
                                                    const std::optional<at::Tensor>&, bool) {
  return {meta_like(self, {bins}), meta_like(self, {bins + 1})};
}
std::tuple<at::Tensor, at::Tensor> histogram_bins_tensor(const at::Tensor& self, const at::Tensor& bins,
                                                         const std::optional<at::Tensor>&, bool) {
  return {meta_like(self, {bins.numel() - 1}), meta_like(self, {bins.numel()})};
}
std::vector<at::Tensor> histogramdd_bin_edges(const at::Tensor& self, at::IntArrayRef bins,
                                              std::optional<at::ArrayRef<double>>, const std::optional<at::Tensor>&,
                                              bool) {
  std::vector<at::Tensor> edges;
  for (int64_t n : bins) edges.push_back(meta_like(self, {n + 1}));
  return edges;
}
at::Tensor histogramdd_from_bin_cts(const at::Tensor& self, at::IntArrayRef bins, std::optional<at::ArrayRef<double>>,
                                    const std::optional<at::Tensor>&, bool) {
  return meta_like(self, bins);
}
at::Tensor histogramdd_from_bin_tensors(const at::Tensor& self, at::TensorList bins, const std::optional<at::Tensor>&,
                                        bool) {
  std::vector<int64_t> sizes;
  for (const auto& b : bins) sizes.push_back(b.numel() - 1);
  return meta_like(self, sizes);
}

// _ctc_loss_backward: log_probs' shape.
at::Tensor ctc_loss_backward(const at::Tensor&, const at::Tensor& log_probs, const at::Tensor&, at::IntArrayRef,
                             at::IntArrayRef, const at::Tensor&, const at::Tensor&, int64_t, bool) {
  return meta_like(log_probs, log_probs.sizes());
}

bool lacks_meta(const std::string& op) {  // "aten::name" or "aten::name.overload"
  const size_t dot = op.find('.');
  auto handle = c10::Dispatcher::singleton().findOp(
      {op.substr(0, dot), dot == std::string::npos ? std::string() : op.substr(dot + 1)});
  return handle && !handle->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void register_missing_meta_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  // Only where torch has none: a later torch that ships one keeps its own.
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  if (lacks_meta("aten::_thnn_fused_gru_cell")) library->impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  if (lacks_meta("aten::_thnn_fused_gru_cell_backward"))
    library->impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
  if (lacks_meta("aten::_logcumsumexp")) library->impl("_logcumsumexp", TORCH_FN(logcumsumexp));
  if (lacks_meta("aten::geqrf")) library->impl("geqrf", TORCH_FN(geqrf));
  if (lacks_meta("aten::linalg_lstsq")) library->impl("linalg_lstsq", TORCH_FN(linalg_lstsq));
  if (lacks_meta("aten::multi_margin_loss_backward"))
    library->impl("multi_margin_loss_backward", TORCH_FN(multi_margin_loss_backward));
  if (lacks_meta("aten::multilabel_margin_loss_backward"))
    library->impl("multilabel_margin_loss_backward", TORCH_FN(multilabel_margin_loss_backward));
  if (lacks_meta("aten::fractional_max_pool3d_backward"))
    library->impl("fractional_max_pool3d_backward", TORCH_FN(fractional_max_pool3d_backward));
  if (lacks_meta("aten::histogram.bin_ct")) library->impl("histogram.bin_ct", TORCH_FN(histogram_bin_ct));
  if (lacks_meta("aten::histogram.bins_tensor"))
    library->impl("histogram.bins_tensor", TORCH_FN(histogram_bins_tensor));
  if (lacks_meta("aten::_histogramdd_bin_edges"))
    library->impl("_histogramdd_bin_edges", TORCH_FN(histogramdd_bin_edges));
  if (lacks_meta("aten::_histogramdd_from_bin_cts"))
    library->impl("_histogramdd_from_bin_cts", TORCH_FN(histogramdd_from_bin_cts));
  if (lacks_meta("aten::_histogramdd_from_bin_tensors"))
    library->impl("_histogramdd_from_bin_tensors", TORCH_FN(histogramdd_from_bin_tensors));
  if (lacks_meta("aten::_ctc_loss_backward")) library->impl("_ctc_loss_backward", TORCH_FN(ctc_loss_backward));
  if (lacks_meta("aten::_add_relu.Scalar")) library->impl("_add_relu.Scalar", TORCH_FN(add_relu_scalar));
}

}  // namespace torch_tpu::aten
