#include "aten/pytorch_checks.h"

#include <ATen/MemoryOverlap.h>

#include <set>
#include <string_view>
#include <typeinfo>
#include <utility>

namespace torch_tpu::aten {
namespace {

// Drops the warnings a stand-in run makes (an out= tensor it resizes).
class Silent : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

// A CPU tensor of t's dtype and rank with every non-empty dimension of size 1,
// filled with `fill` (1 for pointwise ops: no integer division by zero; 0 for
// others: a valid index into any non-empty dimension).
at::Tensor stand_in(const at::Tensor& t, double fill, bool real_sizes = false) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  if (t.is_cpu() && t.dim() == 0) return t;  // a CPU scalar tensor is taken as it is
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  if (!real_sizes)
    for (auto& n : sizes) n = n == 0 ? 0 : 1;
  return at::full(sizes, fill, at::TensorOptions().dtype(t.scalar_type()));
}

// An error a non-pointwise op's stand-in raises that its real arguments
// raise too: about dtypes (or a TypeError), or an IndexError about ranks or
// empty dimensions (the stand-in keeps both). Not an index value (select(x, 1, 2) on a size-1
// stand-in), nor a dtype the CPU kernel lacks ("histogram_cpu" not implemented
// for 'Int': CUDA has it, and so may our lowering).
bool trusted(const c10::Error& e) {
  std::string_view m = e.msg();
  auto says = [&](std::string_view about) { return m.find(about) != std::string_view::npos; };
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return !says("_cpu\" not implemented");
  // An index tensor of the stand-in holds zeros, in range of any non-empty
  // dim: "index out of range in self" means an empty dim, for the real call too.
  if (dynamic_cast<const c10::IndexError*>(&e))
    return says("Dimension out of range") || says("too many indices") || says("non-zero size") ||
           says("index out of range in self") || says("for input.numel() == 0");
  if (dynamic_cast<const c10::TypeError*>(&e)) return true;
  // A Scalar the dtype cannot hold ("value cannot be converted to type int64_t
  // without overflow") is refused whatever the stand-ins hold.
  for (std::string_view about : {"dtype", "scalar type", "result type", "can't be cast", "tensor for result",
                                 "without overflow", "does not support bool input"})
    if (says(about)) return true;
  return false;
}

}  // namespace

// Ops whose CPU kernel is not run on stand-ins, and why.
constexpr std::pair<std::string_view, std::string_view> kNoCpuProbe[] = {
    // It takes the float32 statistics a bfloat16 forward saves, as on CUDA
    // (CPU saves bfloat16 ones and refuses float32).
    {"aten::native_batch_norm_backward", "float32 statistics of a bfloat16 forward"},
    // Their CPU kernels walk the stand-ins' offsets and indices as data: out of bounds.
    {"aten::_embedding_bag", "reads offsets as data"},
    {"aten::_embedding_bag_forward_only", "reads offsets as data"},
    // CPU's CTC kernels walk the stand-ins by the (real) input and target lengths.
    {"aten::_ctc_loss", "reads the lengths against stand-ins"},
    {"aten::_ctc_loss_backward", "reads the lengths against stand-ins"},
};

bool cpu_probe_applies(std::string_view op) {
  if (op.rfind("aten::", 0) != 0) return false;  // an op defined at run time (jax_op): its meta kernel is its check
  for (const auto& entry : kNoCpuProbe)
    if (entry.first == op) return false;
  return true;
}

OverlapRule overlap_rule(const std::string& op, bool pointwise) {
  if (op == "aten::fill_.Tensor") return OverlapRule::Copy;
  // "aten::index_add_.default" -> "index_add"
  std::string name = op.substr(op.find("::") + 2);
  name = name.substr(0, name.find('.'));
  if (!name.empty() && name.back() == '_') name.pop_back();
  static const std::set<std::string, std::less<>> none = {"fill", "zero", "index_fill"};
  static const std::set<std::string, std::less<>> full = {"index_select",   "gather",    "scatter",    "scatter_add",
                                                          "scatter_reduce", "index_add", "index_copy", "topk",
                                                          "take",           "put"};
  static const std::set<std::string, std::less<>> partial = {"cumsum", "cumprod"};
  static const std::set<std::string, std::less<>> internal = {"mm", "bmm", "addmm", "baddbmm", "addmv", "mv"};
  if (none.count(name)) return OverlapRule::None;
  if (name == "cat") return OverlapRule::Cat;
  if (name == "masked_fill") return OverlapRule::Mask;
  if (name == "index_put" || name == "_index_put_impl") return OverlapRule::IndexPut;
  if (full.count(name)) return OverlapRule::Full;
  if (pointwise || partial.count(name)) return OverlapRule::Partial;
  if (internal.count(name)) return OverlapRule::Internal;
  return OverlapRule::None;
}

void check_overlap(const std::vector<Written>& written, const std::vector<Written>& inputs, OverlapRule rule) {
  if (rule == OverlapRule::Copy) {  // a host value fills with value.item(), unchecked (CUDA's too)
    for (const auto& in : inputs)
      if (in.argument == 1 && in.tensor.is_cpu()) return;
    rule = OverlapRule::Internal;
  }
  if (rule == OverlapRule::None) return;
  for (const auto& w : written) {
    if (rule != OverlapRule::IndexPut && rule != OverlapRule::Mask)
      at::assert_no_internal_overlap(w.tensor);
    else if (at::has_internal_overlap(w.tensor) == at::MemOverlap::Yes)
      TORCH_WARN("Use of ", rule == OverlapRule::Mask ? "masked_fill_" : "index_put_",
                 " on expanded tensors is deprecated. Please clone() the tensor before performing "
                 "this operation. This also applies to advanced indexing e.g. tensor[",
                 rule == OverlapRule::Mask ? "mask] = scalar" : "indices] = tensor");
    if (rule == OverlapRule::Internal) continue;
    for (const auto& in : inputs) {
      if (in.argument == w.argument || !in.tensor.defined() || in.tensor.is_cpu()) continue;
      if (rule == OverlapRule::Cat && in.tensor.dim() == 1 && in.tensor.numel() == 0) continue;
      if (rule == OverlapRule::Mask && in.argument != 1) continue;
      if (rule == OverlapRule::Partial || rule == OverlapRule::Mask)
        at::assert_no_partial_overlap(w.tensor, in.tensor);
      else
        at::assert_no_overlap(w.tensor, in.tensor);
    }
  }
}

std::vector<at::ScalarType> check_like_cpu(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                           bool pointwise, bool meta_refused) {
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) return {};
  const double fill = pointwise ? 1 : 0;
  // Where the meta kernel refused the call (shapes that do not broadcast),
  // small arguments keep their sizes, so that CPU meets the same error first.
  const bool real = meta_refused && [&] {
    int64_t numel = 0;
    for (const auto& v : args)
      if (v.isTensor() && v.toTensor().defined()) numel += v.toTensor().numel();
    return numel <= (int64_t{1} << 16);
  }();
  torch::jit::Stack stack;
  for (const auto& v : args) {
    if (v.isGenerator()) return {};  // a random op: its CPU kernel would want a CPU generator
    if (v.isTensor()) {
      stack.push_back(stand_in(v.toTensor(), fill, real));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : v.toTensorVector()) ts.push_back(stand_in(t, fill, real));
      stack.push_back(std::move(ts));
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> ts;
      for (const auto& t : v.toOptionalTensorList()) {
        const std::optional<at::Tensor>& ot = t;
        ts.push_back(ot ? std::optional<at::Tensor>(stand_in(*ot, fill, real)) : std::nullopt);
      }
      stack.push_back(std::move(ts));
    } else {
      stack.push_back(v);
    }
  }
  Silent silent;
  c10::WarningUtils::WarningHandlerGuard guard(&silent);
  try {
    op.callBoxed(stack);
  } catch (const c10::Error& e) {
    if (std::string_view(e.msg()).find("Could not run") != std::string_view::npos)
      return {};  // no CPU kernel after all
    if (pointwise || trusted(e)) throw;
    // A dtype CPU's kernel lacks, where the meta kernel refused the call too:
    // no kernel takes it (CUDA's says "div_floor_cuda" not implemented as well).
    const std::string_view m = e.msg();
    if (const size_t at = m.find("_cpu\" not implemented");
        meta_refused && at != std::string_view::npos && dynamic_cast<const c10::NotImplementedError*>(&e))
      TORCH_CHECK_NOT_IMPLEMENTED(false, m.substr(0, at), "_tpu", m.substr(at + 4));
    return {};
  } catch (const std::exception& e) {
    // oneDNN (dnnl::error) refusing the stand-in itself is not one of
    // PyTorch's checks: its bfloat16 convolution on CPUs with avx512_bf16
    // rejects a size-1 stand-in whose padding exceeds it. Other exceptions
    // are (a Scalar that overflows the dtype: std::runtime_error).
    if (std::string_view(typeid(e).name()).find("dnnl") != std::string_view::npos) return {};
    throw;
  }
  std::vector<at::ScalarType> dtypes;
  for (const auto& r : stack)
    if (r.isTensor()) dtypes.push_back(r.toTensor().scalar_type());
  return dtypes;
}

}  // namespace torch_tpu::aten
