#include "aten/tensor_access.h"

#include <ATen/EmptyTensor.h>

#include <charconv>

#include "aten/bounded.h"
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
// In Fused mode made by a program recorded in the window, not uploaded from
// host memory: torch.zeros of a big tensor (empty, then zero_ reading it)
// moved its bytes from the host at every call. (Other modes upload: a
// program would compile once per size.)
void ensure_value(DeviceStorage& s, DType dtype) {
  if (s.value) return;
  s.dtype = dtype;
  if (Runtime::get().mode() != runtime::EagerMode::Fused || s.nbytes % stablehlo::byte_size(dtype) != 0) {
    std::vector<char> zeros(s.nbytes, 0);
    s.value = Runtime::get().upload(zeros.data(), dtype, {s.numel()}, s.device);
    return;
  }
  const TensorType type{dtype, {s.numel()}};
  auto program = Runtime::get().program("zeros|" + type.str(), [&] {
    stablehlo::Builder b;
    auto zeros = b.constant(0, type);
    return std::make_pair(b.module({zeros}), std::vector<TensorType>{type});
  });
  s.value = Runtime::get().execute(program, {}, s.device, "new storage")[0];
}

// A flat complex value as the flat array of its parts, real then imaginary:
// its bytes as a real dtype.
stablehlo::Value interleave_parts(stablehlo::Builder& b, const stablehlo::Value& x) {
  const int64_t n = x.type.numel();
  auto re = b.reshape(b.real(x), {n, 1}), im = b.reshape(b.imag(x), {n, 1});
  return b.reshape(b.concatenate({re, im}, 1), {2 * n});
}

// The inverse: a flat array of parts (float32 or float64) as complex numbers.
stablehlo::Value pair_parts(stablehlo::Builder& b, const stablehlo::Value& parts) {
  const int64_t n = parts.type.numel() / 2;
  auto pairs = b.reshape(parts, {n, 2});
  auto part = [&](int64_t k) { return b.reshape(b.slice(pairs, {0, k}, {n, k + 1}, {1, 1}), {n}); };
  return b.complex(part(0), part(1));
}

// Reinterprets the whole storage value as `dtype` (its bytes unchanged), for
// a read or write through a dtype of another element size: storage-level
// copies (torch.save / torch.load, UntypedStorage.copy_) move bytes as uint8.
// A bool is the byte 0 or 1; a byte read as bool is "!= 0".
void retype(const at::Tensor& t, DeviceStorage& s, DType dtype) {
  TORCH_CHECK(s.nbytes % stablehlo::byte_size(dtype) == 0, "torch_tpu: reading a storage of ", s.nbytes,
              " bytes written as ", stablehlo::mlir_name(s.dtype), " through a tensor of dtype ", t.scalar_type(),
              " is not supported; copy the tensor instead of viewing it.");
  const DType from_dtype = s.dtype;
  const int64_t storage_numel = s.numel();
  std::string key = "retype|" + stablehlo::mlir_name(from_dtype) + "|" + std::to_string(s.numel()) + "|" +
                    stablehlo::mlir_name(dtype);
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto x = b.parameter(TensorType{from_dtype, {storage_numel}});
    if (x.dtype() == DType::Bool) x = b.convert(x, DType::UInt8);
    // XLA bitcasts no complex type: a complex storage is its parts interleaved.
    if (stablehlo::is_complex(x.dtype())) x = interleave_parts(b, x);
    const DType bytes = dtype == DType::Bool ? DType::UInt8 : stablehlo::real_part_type(dtype);
    const int64_t to_numel = static_cast<int64_t>(s.nbytes / stablehlo::byte_size(bytes));
    const int64_t from_numel = x.type.numel();
    const size_t from = stablehlo::byte_size(x.dtype()), to = stablehlo::byte_size(bytes);
    if (from > to) {  // one element becomes from/to narrower ones
      auto r = static_cast<int64_t>(from / to);
      x = b.reshape(b.bitcast_convert(x, TensorType{bytes, {from_numel, r}}), {to_numel});
    } else if (from < to) {
      auto r = static_cast<int64_t>(to / from);
      x = b.bitcast_convert(b.reshape(x, {to_numel, r}), TensorType{bytes, {to_numel}});
    } else if (x.dtype() != bytes) {
      x = b.bitcast_convert(x, TensorType{bytes, {to_numel}});
    }
    if (dtype == DType::Bool) x = b.compare(stablehlo::Compare::NE, x, b.constant(0, x.type));
    if (stablehlo::is_complex(dtype)) x = pair_parts(b, x);
    return std::make_pair(b.module({x}), std::vector<TensorType>{{dtype, {x.type.numel()}}});
  });
  s.value = Runtime::get().execute(program, {s.value}, s.device, "storage reinterpretation")[0];
  s.dtype = dtype;
}

// A storage value of `from` seen as `to`, both of one byte size: bool and the
// 1-byte integers share their bytes as on CPU (a byte read as bool is
// "!= 0"; a bool written as a byte is 0 or 1), other dtypes are bitcast.
stablehlo::Value reinterpret(stablehlo::Builder& b, const stablehlo::Value& x, DType to) {
  if (x.dtype() == to) return x;
  if (to == DType::Bool) return b.compare(stablehlo::Compare::NE, x, b.constant(0, x.type));
  if (x.dtype() == DType::Bool) return b.convert(x, to);
  return b.bitcast_convert(x, TensorType{to, x.shape()});
}

// A dtype of another byte size reinterprets the whole storage first (its
// bytes unchanged); one of the same size is reinterpreted inside the program.
// A bool reinterprets the storage as bytes (lossless), not as bools.
// A complex dtype and another one of its size (complex64 and float64) retype too: XLA bitcasts no complex type.
void match_storage_dtype(const at::Tensor& t, DeviceStorage& s, DType d) {
  const bool complex_change = s.dtype != d && (stablehlo::is_complex(s.dtype) || stablehlo::is_complex(d));
  if (complex_change || stablehlo::byte_size(s.dtype) != stablehlo::byte_size(d))
    retype(t, s, d == DType::Bool ? DType::UInt8 : d);
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
    case at::kUInt16: return DType::UInt16;
    case at::kUInt32: return DType::UInt32;
    case at::kUInt64: return DType::UInt64;
    case at::kFloat8_e4m3fn: return DType::Float8E4M3FN;
    case at::kFloat8_e5m2: return DType::Float8E5M2;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kComplexFloat: return DType::Complex64;
    case at::kComplexDouble: return DType::Complex128;
    default:
      TORCH_CHECK_TYPE(false, "torch_tpu: dtype torch.", c10::getDtypeNames(t).first,
                       " is not supported on tpu. Supported: float32, bfloat16, float16, float64, complex64, "
                       "complex128, float8_e4m3fn, float8_e5m2, int8, int16, int32, int64, uint8, uint16, uint32, "
                       "uint64, bool. Convert the tensor "
                       "first, e.g. x.float().");
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
    case DType::UInt16: return at::kUInt16;
    case DType::UInt32: return at::kUInt32;
    case DType::UInt64: return at::kUInt64;
    case DType::Float8E4M3FN: return at::kFloat8_e4m3fn;
    case DType::Float8E5M2: return at::kFloat8_e5m2;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float32: return at::kFloat;
    case DType::Float64: return at::kDouble;
    case DType::Complex64: return at::kComplexFloat;
    case DType::Complex128: return at::kComplexDouble;
  }
  return at::ScalarType::Undefined;
}

DeviceStorage& storage_of(const at::Tensor& t) {
  const c10::DataPtr& data = t.storage().data_ptr();
  // PyTorch's UntypedStorage slicing (storage[a:b]) makes a storage whose
  // pointer is ours plus a byte offset, as if device memory were addressable.
  TORCH_CHECK(is_device_storage(data),
              "torch_tpu: this tpu tensor's storage was not allocated by torch_tpu: it is a slice of an "
              "UntypedStorage (storage[a:b]), which PyTorch makes by offsetting a host pointer; tpu memory has none. "
              "Slice a tensor instead (t.view(torch.uint8)[a:b], or t.untyped_storage() without a slice).");
  return *static_cast<DeviceStorage*>(data.get());
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
  if (s.padding && s.dtype != d) make_plain(s);  // reinterpreted bytes: the plain storage's
  match_storage_dtype(t, s, d);
  // A box of a padded storage with no bounded dim left (x[:, -1]) is read at
  // a runtime offset; any other view of it through its real elements (a program per size).
  if (s.padding && s.dtype == d && !covers_storage(t, s))
    if (auto value = plain_box_value(t)) return *value;
  const pjrt::BufferPtr value = s.padding ? unpadded_value(s) : s.value;
  if (s.dtype == d && covers_storage(t, s)) return value;
  std::string key = "read|" + stablehlo::mlir_name(s.dtype) + "|" + std::to_string(s.numel()) + "|" +
                    stablehlo::mlir_name(d) + "|" + layout_key(t);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  int64_t offset = t.storage_offset(), numel = t.numel(), storage_numel = s.numel();
  DType storage_dtype = s.dtype;
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto storage = reinterpret(b, b.parameter(TensorType{storage_dtype, {storage_numel}}), d);
    auto out = lowering::strided_read(b, storage, sizes, strides, offset);
    return std::make_pair(b.module({out}), std::vector<TensorType>{{d, {numel}}});
  });
  return Runtime::get().execute(program, {value}, s.device, "view read", /*join_pending=*/true)[0];
}

void write_dense(const at::Tensor& t, pjrt::BufferPtr value) {
  DeviceStorage& s = storage_of(t);
  DType d = to_dtype(t.scalar_type());
  auto& runtime = Runtime::get();
  if (covers_storage(t, s)) {
    if (s.dtype == d && !s.padding) runtime.replaced(value, s.value);
    if (s.padding) {  // the write replaces every real element: the storage is plain again
      s.value = nullptr;
      make_plain(s);
    }
    s.value = std::move(value);
    s.dtype = d;
    return;
  }
  make_plain(s);
  ensure_value(s, d);
  // A bool written into a byte storage becomes 0/1 bytes and the storage
  // keeps its bytes (a uint8 3 stays 3); any other dtype retypes the storage.
  if (d == DType::Bool)
    match_storage_dtype(t, s, d);
  else if (s.dtype != d)
    retype(t, s, d);
  const DType storage_dtype = s.dtype;
  std::string key = "write|" + stablehlo::mlir_name(storage_dtype) + "|" + stablehlo::mlir_name(d) + "|" +
                    std::to_string(s.numel()) + "|" + layout_key(t);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  int64_t offset = t.storage_offset(), numel = t.numel(), storage_numel = s.numel();
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto storage = b.parameter(TensorType{storage_dtype, {storage_numel}});
    auto update = reinterpret(b, b.parameter(TensorType{d, {numel}}), storage_dtype);
    auto out = lowering::strided_write(b, storage, update, sizes, strides, offset);
    return std::make_pair(b.module({out}), std::vector<TensorType>{{storage_dtype, {storage_numel}}});
  });
  auto written = runtime.execute(program, {s.value, value}, s.device, "view write")[0];
  runtime.replaced(written, s.value);
  s.value = std::move(written);
}

at::Tensor wrap_buffer(pjrt::BufferPtr value, at::IntArrayRef sizes, at::ScalarType dtype, int device,
                       at::IntArrayRef strides) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  auto* allocator = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  at::Tensor t = strides.empty() ? at::detail::empty_generic(sizes, allocator, keys, dtype, std::nullopt)
                                 : at::detail::empty_strided_generic(sizes, strides, allocator, keys, dtype);
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
  const DeviceStorage& s = storage_of(t);
  try {
    if (s.padding && s.value && s.dtype == to_dtype(t.scalar_type())) {
      // Copied padded and cut on the host: no program per size.
      out.copy_(download_padded(s).as_strided(t.sizes(), t.strides(), t.storage_offset()));
      return out;
    }
    auto buffer = read_dense(t);
    Runtime::get().download(*buffer, out.data_ptr(), out.nbytes());
  } catch (const runtime::DeviceCheckFailed& e) {
    raise_check(e.what(),
                " (reported at this host read: ops run asynchronously in Strict and Fused modes; "
                "TORCH_TPU_EAGER_MODE=debug raises at the op)");
  }
  return out;
}

void raise_check(const std::string& check, const std::string& note) {
  TORCH_CHECK(!runtime::raises_runtime_error(check), runtime::check_message(check), note);
  TORCH_CHECK_INDEX(false, check, note);
}

}  // namespace torch_tpu::aten
