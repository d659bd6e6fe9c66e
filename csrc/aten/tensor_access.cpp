#include "aten/tensor_access.h"

#include <ATen/EmptyTensor.h>

#include <charconv>

#include "lowering/registry.h"

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;
using stablehlo::TensorType;

bool covers_storage(const at::Tensor& t, const DeviceStorage& s) {
  return t.storage_offset() == 0 && t.is_contiguous() && static_cast<size_t>(t.numel()) * t.element_size() == s.nbytes;
}

// Gives a never-written storage a zero value of `dtype`, so that reading
// uninitialized memory is deterministic.
void ensure_value(DeviceStorage& s, DType dtype) {
  if (s.value) return;
  s.dtype = dtype;
  std::vector<char> zeros(s.nbytes, 0);
  s.value = Runtime::get().upload(zeros.data(), dtype, {s.numel()}, s.device);
}

// Reinterprets the whole storage value as `dtype` (its bytes unchanged), for
// a read or write through a dtype of another element size: storage-level
// copies (torch.save / torch.load, UntypedStorage.copy_) move bytes as uint8.
// bool <-> 1-byte integers convert (a bool byte is 0 or 1).
void retype(const at::Tensor& t, DeviceStorage& s, DType dtype) {
  const size_t from = stablehlo::byte_size(s.dtype), to = stablehlo::byte_size(dtype);
  bool via_bool = s.dtype == DType::Bool || dtype == DType::Bool;
  TORCH_CHECK(s.nbytes % to == 0 && (!via_bool || from == to), "torch_tpu: reading a storage of ", s.nbytes,
              " bytes written as ", stablehlo::mlir_name(s.dtype), " through a tensor of dtype ", t.scalar_type(),
              " is not supported; copy the tensor instead of viewing it.");
  const int64_t from_numel = static_cast<int64_t>(s.nbytes / from), to_numel = static_cast<int64_t>(s.nbytes / to);
  DType from_dtype = s.dtype;
  std::string key = "retype|" + stablehlo::mlir_name(from_dtype) + "|" + std::to_string(from_numel) + "|" +
                    stablehlo::mlir_name(dtype);
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto x = b.parameter(TensorType{from_dtype, {from_numel}});
    stablehlo::Value out;
    if (via_bool) {
      out = dtype == DType::Bool ? b.compare(stablehlo::Compare::NE, x, b.constant(0, x.type)) : b.convert(x, dtype);
    } else if (from > to) {  // one element becomes from/to narrower ones
      auto r = static_cast<int64_t>(from / to);
      out = b.reshape(b.bitcast_convert(x, TensorType{dtype, {from_numel, r}}), {to_numel});
    } else if (from < to) {
      auto r = static_cast<int64_t>(to / from);
      out = b.bitcast_convert(b.reshape(x, {to_numel, r}), TensorType{dtype, {to_numel}});
    } else {
      out = b.bitcast_convert(x, TensorType{dtype, {to_numel}});
    }
    return std::make_pair(b.module({out}), std::vector<TensorType>{{dtype, {to_numel}}});
  });
  s.value = Runtime::get().execute(program, {s.value}, s.device, "storage reinterpretation")[0];
  s.dtype = dtype;
}

// A same-size dtype is read by bitcast inside the view-read program; any
// other reinterprets the storage first.
void match_storage_dtype(const at::Tensor& t, DeviceStorage& s, DType d) {
  bool same_size = stablehlo::byte_size(s.dtype) == stablehlo::byte_size(d);
  bool via_bool = s.dtype == DType::Bool || d == DType::Bool;
  if (s.dtype != d && (!same_size || via_bool)) retype(t, s, d);
}

}  // namespace

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: return DType::Bool;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kByte: return DType::UInt8;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    default:
      TORCH_CHECK_TYPE(false, "torch_tpu: dtype torch.", c10::getDtypeNames(t).first,
                       " is not supported on tpu. Supported: float32, bfloat16, float16, float64, int8, int16, "
                       "int32, int64, uint8, bool. Convert the tensor first, e.g. x.float().");
  }
}

at::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::Bool: return at::kBool;
    case DType::Int8: return at::kChar;
    case DType::Int16: return at::kShort;
    case DType::Int32: return at::kInt;
    case DType::Int64: return at::kLong;
    case DType::UInt8: return at::kByte;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float32: return at::kFloat;
    case DType::Float64: return at::kDouble;
  }
  return at::ScalarType::Undefined;
}

DeviceStorage& storage_of(const at::Tensor& t) {
  auto* s = static_cast<DeviceStorage*>(t.storage().data_ptr().get());
  TORCH_CHECK(s, "torch_tpu: tensor has no device storage");
  return *s;
}

int device_index(const at::Tensor& t) { return t.device().has_index() ? t.device().index() : 0; }

void append_dims(std::string& key, at::IntArrayRef v) {
  char buf[24];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) key += ',';
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v[i]);
    key.append(buf, end);
  }
}

std::string dims_key(at::IntArrayRef v) {
  std::string s;
  append_dims(s, v);
  return s;
}

std::string layout_key(const at::Tensor& t) {
  return dims_key(t.sizes()) + ":" + dims_key(t.strides()) + "@" + std::to_string(t.storage_offset());
}

pjrt::BufferPtr read_dense(const at::Tensor& t) {
  DeviceStorage& s = storage_of(t);
  DType d = to_dtype(t.scalar_type());
  ensure_value(s, d);
  match_storage_dtype(t, s, d);
  if (s.dtype == d && covers_storage(t, s)) return s.value;
  std::string key = "read|" + stablehlo::mlir_name(s.dtype) + "|" + std::to_string(s.numel()) + "|" +
                    stablehlo::mlir_name(d) + "|" + layout_key(t);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  int64_t offset = t.storage_offset(), numel = t.numel(), storage_numel = s.numel();
  DType storage_dtype = s.dtype;
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto storage = b.parameter(TensorType{storage_dtype, {storage_numel}});
    if (storage_dtype != d) storage = b.bitcast_convert(storage, TensorType{d, {storage_numel}});
    auto out = lowering::strided_read(b, storage, sizes, strides, offset);
    return std::make_pair(b.module({out}), std::vector<TensorType>{{d, {numel}}});
  });
  return Runtime::get().execute(program, {s.value}, s.device, "view read")[0];
}

void write_dense(const at::Tensor& t, pjrt::BufferPtr value) {
  DeviceStorage& s = storage_of(t);
  DType d = to_dtype(t.scalar_type());
  if (covers_storage(t, s)) {
    s.value = std::move(value);
    s.dtype = d;
    return;
  }
  ensure_value(s, d);
  if (s.dtype != d) retype(t, s, d);
  std::string key = "write|" + stablehlo::mlir_name(d) + "|" + std::to_string(s.numel()) + "|" + layout_key(t);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  int64_t offset = t.storage_offset(), numel = t.numel(), storage_numel = s.numel();
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto storage = b.parameter(TensorType{d, {storage_numel}});
    auto update = b.parameter(TensorType{d, {numel}});
    auto out = lowering::strided_write(b, storage, update, sizes, strides, offset);
    return std::make_pair(b.module({out}), std::vector<TensorType>{{d, {storage_numel}}});
  });
  s.value = Runtime::get().execute(program, {s.value, value}, s.device, "view write")[0];
}

at::Tensor wrap_buffer(pjrt::BufferPtr value, at::IntArrayRef sizes, at::ScalarType dtype, int device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  at::Tensor t = at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::PrivateUse1),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype, std::nullopt);
  DeviceStorage& s = storage_of(t);
  s.value = std::move(value);
  s.dtype = to_dtype(dtype);
  return t;
}

pjrt::BufferPtr upload(const at::Tensor& cpu, int device) {
  TORCH_INTERNAL_ASSERT(cpu.is_contiguous());
  return Runtime::get().upload(cpu.data_ptr(), to_dtype(cpu.scalar_type()), {cpu.numel()}, device);
}

at::Tensor download(const at::Tensor& t) {
  at::Tensor out = at::empty(t.sizes(), t.options().device(at::kCPU));
  if (t.numel() == 0) return out;
  auto buffer = read_dense(t);
  try {
    Runtime::get().download(*buffer, out.data_ptr(), out.nbytes());
  } catch (const runtime::DeviceCheckFailed& e) {
    TORCH_CHECK_INDEX(false, e.what(),
                      " (reported at this host read: ops run asynchronously in Strict and Fused modes; "
                      "TORCH_TPU_EAGER_MODE=debug raises at the op)");
  }
  return out;
}

}  // namespace torch_tpu::aten
