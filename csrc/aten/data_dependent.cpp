// Ops whose output shape depends on the data (nonzero, masked_select): one
// program counts on the device, one sync reads the count, and a second
// program, compiled per count, fills the result. These are kernels, not
// lowering rules, because the sync sits between the two programs.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/tensor_access.h"

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;
using stablehlo::Binary;
using stablehlo::Builder;
using stablehlo::Compare;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;

Value truth(Builder& b, const Value& x) {
  return x.dtype() == DType::Bool ? x : b.compare(Compare::NE, x, b.constant(0, x.type));
}

// How many elements of `t` are nonzero: the one sync of these ops.
int64_t nonzero_count(const at::Tensor& t) {
  TensorType flat{to_dtype(t.scalar_type()), {t.numel()}};
  auto program = Runtime::get().program("count_nonzero|" + flat.str(), [&] {
    Builder b;
    Value x = b.parameter(flat);
    Value n = b.reduce(b.convert(truth(b, x), DType::Int64), b.scalar(0, DType::Int64), {0}, Binary::Add);
    Value out = b.reshape(n, {1});
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  auto out = Runtime::get().execute(*program, {read_dense(t)->raw()}, device_index(t), "aten::nonzero (count)");
  int64_t count = 0;
  Runtime::get().download(*out[0], &count, sizeof count);
  return count;
}

// The flat int64 positions of the `count` nonzero elements of flat `x`, in
// order: a stable sort that puts nonzero elements first.
Value nonzero_positions(Builder& b, const Value& x, int64_t count) {
  Value key = b.convert(b.unary(stablehlo::Unary::Not, truth(b, x)), DType::Int32);
  Value index = b.iota({DType::Int64, x.shape()}, 0);
  auto sorted = b.sort({key, index}, 0, /*is_stable=*/true, [](Builder& r, const std::vector<Value>& a) {
    return std::vector<Value>{r.compare(Compare::LT, a[0], a[1])};
  });
  return b.slice(sorted[1], {0}, {count}, {1});
}

at::Tensor empty_result(at::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
  return at::empty(sizes, like.options().dtype(dtype));
}

at::Tensor nonzero(const at::Tensor& self) {
  int64_t count = self.numel() == 0 ? 0 : nonzero_count(self);
  int64_t rank = self.dim();
  if (count == 0 || rank == 0) return empty_result({count, rank}, at::kLong, self);
  TensorType flat{to_dtype(self.scalar_type()), {self.numel()}};
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  std::string key = "nonzero|" + flat.str() + "|" + c10::str(self.sizes()) + "|" + std::to_string(count);
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value pos = nonzero_positions(b, b.parameter(flat), count);
    std::vector<Value> coords;
    int64_t stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {  // row-major unravel of the flat position
      Value c = b.binary(Binary::Divide, pos, b.constant_int(stride, pos.type));
      c = b.binary(Binary::Remainder, c, b.constant_int(sizes[d], pos.type));
      coords.insert(coords.begin(), b.reshape(c, {count, 1}));
      stride *= sizes[d];
    }
    Value out = b.reshape(b.concatenate(coords, 1), {count * rank});
    return std::make_pair(b.module({out}), std::vector<TensorType>{{DType::Int64, {count, rank}}});
  });
  auto out = Runtime::get().execute(*program, {read_dense(self)->raw()}, device_index(self), "aten::nonzero");
  return wrap_buffer(out[0], {count, rank}, at::kLong, device_index(self));
}

at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  auto expanded = at::expand_outplace(self, mask);
  const at::Tensor& values = *std::get<0>(expanded);
  const at::Tensor& where = *std::get<1>(expanded);
  TORCH_CHECK(where.device() == values.device() && values.device().type() == c10::DeviceType::PrivateUse1,
              "Expected all tensors to be on the same device, but found at least "
              "two devices, ",
              values.device(), " and ", where.device(), "! (in aten::masked_select on tpu)");
  int64_t count = where.numel() == 0 ? 0 : nonzero_count(where);
  if (count == 0) return empty_result({0}, self.scalar_type(), self);
  TensorType vflat{to_dtype(values.scalar_type()), {values.numel()}}, mflat{DType::Bool, {where.numel()}};
  auto program = Runtime::get().program("masked_select|" + vflat.str() + "|" + std::to_string(count), [&] {
    Builder b;
    Value v = b.parameter(vflat), m = b.parameter(mflat);
    Value out = b.gather_1d(v, nonzero_positions(b, m, count));
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  auto out = Runtime::get().execute(*program, {read_dense(values)->raw(), read_dense(where)->raw()}, device_index(self),
                                    "aten::masked_select");
  return wrap_buffer(out[0], {count}, self.scalar_type(), device_index(self));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", nonzero);
  m.impl("masked_select", masked_select);
}

}  // namespace torch_tpu::aten
