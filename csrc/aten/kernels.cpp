// The kernels PyTorch needs from every backend and that are not lowerings:
// allocation, views (metadata only, sharing the storage), copies across
// devices, resize, and reading one element back to the host; and
// native_batch_norm, which routes to the overloads whose schemas say what
// they write.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_native_batch_norm_legit.h>
#include <ATen/ops/_native_batch_norm_legit_no_training.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <limits>

#include "aten/bounded.h"
#include "aten/tensor_access.h"

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// torch.use_deterministic_algorithms(True) with fill_uninitialized_memory
// (its default): new memory holds NaN, or the largest integer, as on CPU and CUDA.
bool fills_uninitialized() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}
void fill_uninitialized(const at::Tensor& t) {
  if (t.numel() == 0) return;
  PlainFactoryScope plain;  // new memory, not a factory of a bounded size
  if (at::isFloatingType(t.scalar_type()))
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  else if (t.scalar_type() == at::kBool)
    t.fill_(true);
  else
    AT_DISPATCH_INTEGRAL_TYPES(t.scalar_type(), "fill_uninitialized",
                               [&] { t.fill_(std::numeric_limits<scalar_t>::max()); });
}

at::Tensor empty(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                 std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> format) {
  c10::OptionalDeviceGuard guard(device);
  at::ScalarType t = dtype.value_or(at::get_default_dtype_as_scalartype());
  to_dtype(t);
  at::Tensor out = at::detail::empty_generic(size, c10::GetAllocator(kTpu),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t, format);
  if (fills_uninitialized()) fill_uninitialized(out);
  return out;
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  at::ScalarType t = dtype.value_or(at::get_default_dtype_as_scalartype());
  to_dtype(t);
  at::Tensor out = at::detail::empty_strided_generic(size, stride, c10::GetAllocator(kTpu),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t);
  if (fills_uninitialized())
    fill_uninitialized(out.as_strided({static_cast<int64_t>(out.storage().nbytes() / out.element_size())}, {1}, 0));
  return out;
}

// Grows the storage in place when the new shape needs more bytes; the old
// elements keep their positions and the new ones read as zeros.
const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  // Same shape: keep the strides (a view stays the view), like PyTorch's resize_.
  if (self.sizes() == size && !format) return self;
  int64_t numel = c10::multiply_integers(size);
  size_t needed = numel == 0 ? 0 : static_cast<size_t>(self.storage_offset() + numel) * self.element_size();
  DeviceStorage& s = storage_of(self);
  if (needed > s.nbytes) make_plain(s);  // grown as plain bytes
  if (needed > s.nbytes) {
    try {  // checked before the tensor or any host memory is touched: an OOM leaves self as it was
      Runtime::get().resize(s.device, static_cast<int64_t>(needed - s.nbytes));
    } catch (const runtime::OutOfMemory& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (format && *format != at::MemoryFormat::Contiguous) impl->empty_tensor_restride(*format);
  if (needed > s.nbytes) {
    const size_t old_nbytes = s.nbytes;
    std::vector<char> bytes(needed, 0);
    if (s.value && s.nbytes > 0) Runtime::get().download(*s.value, bytes.data(), s.nbytes);
    s.nbytes = needed;
    s.dtype = to_dtype(self.scalar_type());
    s.value = Runtime::get().upload(bytes.data(), s.dtype, {s.numel()}, s.device);
    self.storage().unsafeGetStorageImpl()->set_nbytes(needed);
    const int64_t element = static_cast<int64_t>(self.element_size());
    const int64_t first_new = (static_cast<int64_t>(old_nbytes) + element - 1) / element;
    if (fills_uninitialized())
      fill_uninitialized(self.as_strided({static_cast<int64_t>(needed) / element - first_new}, {1}, first_new));
  }
  return self;
}

// _copy_from(self=src, dst): every copy_ that involves a tpu tensor lands here,
// math views included (the Negative key falls through to it, below).
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  // x._neg_view(), x.conj(): the values are the negated / conjugated stored ones.
  if (src.is_neg() || dst.is_neg() || src.is_conj() || dst.is_conj()) {
    at::Tensor from = src.alias(), to = dst.alias();  // the stored values, without the bits
    from._set_neg(false);
    from._set_conj(false);
    to._set_neg(false);
    to._set_conj(false);
    if (src.is_conj() != dst.is_conj()) from = at::conj_physical(from);
    if (src.is_neg() != dst.is_neg()) from = at::neg(from);
    to.copy_(from, non_blocking);
    return dst;
  }
  // The checks CPU's copy_ makes through TensorIterator, which this path skips.
  const auto shape = at::infer_size(dst.sizes(), src.sizes());
  TORCH_CHECK(at::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", at::IntArrayRef(shape));
  if (dst.numel() == 0) return dst;
  if (dst.device().type() == kTpu) at::assert_no_internal_overlap(dst);
  if (src.device() == dst.device()) at::assert_no_partial_overlap(dst, src);
  if (src.device().type() == kTpu && dst.device().type() == kTpu && src.device() == dst.device()) {
    if (is_padded(src) && copy_padded(src, dst)) return dst;  // stays padded: a program per bucket
    std::vector<int64_t> dst_shape(dst.sizes().begin(), dst.sizes().end());
    std::string key = "copy|" + stablehlo::mlir_name(to_dtype(src.scalar_type())) + "|" + c10::str(src.sizes()) + "|" +
                      stablehlo::mlir_name(to_dtype(dst.scalar_type())) + "|" + c10::str(dst.sizes());
    stablehlo::TensorType in{to_dtype(src.scalar_type()), {src.numel()}};
    stablehlo::DType out_dtype = to_dtype(dst.scalar_type());
    std::vector<int64_t> src_shape(src.sizes().begin(), src.sizes().end());
    auto program = Runtime::get().program(key, [&] {
      stablehlo::Builder b;
      auto x = b.reshape(b.parameter(in), src_shape);
      auto y = b.broadcast_to(b.cast(x, out_dtype), dst_shape);
      auto out = b.reshape(y, {dst.numel()});
      return std::make_pair(b.module({out}), std::vector<stablehlo::TensorType>{out.type});
    });
    auto value = read_dense(src);
    write_dense(dst, Runtime::get().execute(program, {value}, device_index(dst), "copy_")[0]);
    return dst;
  }
  if (dst.device().type() == kTpu) {  // host (or another tpu) -> tpu
    at::Tensor host = src.device().type() == kTpu ? download(src) : src;
    host = host.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    // A model's parameters, copied in a burst of shapes (model.to("tpu"), or
    // load_state_dict into tpu parameters), are not one dim that varies.
    if (src.device().type() != kTpu && !src.requires_grad() && !dst.requires_grad() && upload_bounded(host, dst))
      return dst;
    write_dense(dst, upload(host, device_index(dst)));
    return dst;
  }
  TORCH_CHECK(src.device().type() == kTpu, "torch_tpu: _copy_from called without a tpu tensor");
  if (non_blocking && dst.is_pinned() && dst.is_contiguous() && dst.sizes() == src.sizes() &&
      dst.scalar_type() == src.scalar_type()) {
    // As CUDA does into pinned memory: the copy is started, not awaited; an
    // event recorded after it (or synchronize) waits for it. The host tensor's
    // storage stays alive until the copy is done.
    Runtime::get().download_async(read_dense(src), dst.data_ptr(), dst.nbytes(),
                                  std::shared_ptr<void>(nullptr, [keep = dst.storage()](void*) {}), device_index(src));
    return dst;
  }
  dst.copy_(download(src));  // tpu -> host: CPU does the dtype, broadcast and strides
  return dst;
}

// tril_indices / triu_indices(row, col, offset, dtype, ...): factories with no
// tensor argument; the result is allocated here and filled by the .out form,
// whose lowering makes the coordinates (csrc/lowering/factories.cpp).
template <bool lower>
at::Tensor triangle_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                            std::optional<at::Layout> /*layout*/, std::optional<at::Device> device,
                            std::optional<bool> /*pin_memory*/) {
  int64_t n = 0;
  for (int64_t i = 0; i < row; ++i)
    for (int64_t j = 0; j < col; ++j) n += lower ? j - i <= offset : j - i >= offset;
  at::Tensor out = at::empty({2, n}, at::TensorOptions().dtype(dtype.value_or(at::kLong)).device(*device));
  return lower ? at::tril_indices_outf(row, col, offset, out) : at::triu_indices_outf(row, col, offset, out);
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  dst.resize_(src.sizes());
  return copy_from(src, dst, false);
}

// set_: self takes another storage (and a view of it). Only metadata changes:
// the storages are shared, so every alias sees later writes.
at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kTpu, "set_: expected a tpu storage, got one on ", source.device());
  std::vector<int64_t> strides(stride.begin(), stride.end());
  if (strides.empty()) {
    auto contiguous = c10::contiguous_strides(size);
    strides.assign(contiguous.begin(), contiguous.end());
  }
  int64_t extent = 1;  // elements the view reaches, past its offset
  bool empty = false;
  for (size_t d = 0; d < size.size(); ++d) {
    empty |= size[d] == 0;
    extent += (size[d] - 1) * strides[d];
  }
  TORCH_CHECK(empty || static_cast<size_t>(offset + extent) * self.element_size() <= source.nbytes(),
              "set_: a view of sizes ", size, " strides ", at::IntArrayRef(strides), " at offset ", offset,
              " needs more than the storage's ", source.nbytes(), " bytes");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, strides, offset);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return set_storage(self, std::move(source), offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                     C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.element_size());
  return set_storage(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "set_: expected a source of dtype ", self.scalar_type(),
              ", got ", source.scalar_type());
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  at::Storage empty(at::Storage::use_byte_size_t(), 0, c10::GetAllocator(kTpu), true);
  return set_storage(self, std::move(empty), 0, {0}, {1});
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor host = download(self);
  return host.item();
}

at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

// native_batch_norm updates running_mean / running_var in training, but its
// schema does not mark them written, so the general kernel could not write
// them back. _native_batch_norm_legit computes the same and says so (its
// rule writes the running stats through the storage model).
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const std::optional<at::Tensor>& running_mean,
                                                                 const std::optional<at::Tensor>& running_var,
                                                                 bool training, double momentum, double eps) {
  bool stats = running_mean && running_mean->defined() && running_var && running_var->defined();
  if (stats && !training) {  // CPU returns empty saved statistics in evaluation
    auto out =
        at::_native_batch_norm_legit_no_training(input, weight, bias, *running_mean, *running_var, momentum, eps);
    return {std::get<0>(out), std::get<1>(out).new_empty({0}), std::get<2>(out).new_empty({0})};
  }
  if (stats) {
    at::Tensor mean = *running_mean, var = *running_var;  // handles to the same tensors, written in place
    return at::_native_batch_norm_legit(input, weight, bias, mean, var, training, momentum, eps);
  }
  TORCH_CHECK(!(running_mean && running_mean->defined()) && !(running_var && running_var->defined()),
              "native_batch_norm: running_mean and running_var must be both defined or both undefined");
  return at::_native_batch_norm_legit(input, weight, bias, training, momentum, eps);
}

}  // namespace

// PyTorch's math-view fallback would resolve a negative view by cloning it,
// and a clone copies through _copy_from again: endless recursion. copy_from
// resolves the bit itself.
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", empty_strided);
  m.impl("resize_", resize_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("tril_indices", triangle_indices<true>);
  m.impl("triu_indices", triangle_indices<false>);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("as_strided", as_strided);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("view", at::native::view);
  m.impl("view_as_real", at::native::view_as_real);  // complex storage seen as its float parts
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("native_batch_norm", native_batch_norm);
}

}  // namespace torch_tpu::aten
