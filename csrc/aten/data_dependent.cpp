// Ops whose output shape depends on the data (nonzero, masked_select,
// unique, unique_consecutive): one
// program counts on the device, one sync reads the count, and a second
// program, compiled per count, fills the result. These are kernels, not
// lowering rules, because the sync sits between the two programs.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/cpu_fallback.h"
#include "aten/tensor_access.h"
#include "lowering/registry.h"

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

// unique and unique_consecutive of the flattened input. Program 1 puts equal
// elements next to each other (a stable sort for unique; nothing for
// unique_consecutive) and numbers the groups; one sync reads how many there
// are; program 2, compiled per count, gathers the groups' values, the
// inverse and the counts by scatter.
struct Grouped {
  pjrt::BufferPtr values, order, group;  // [n] each: grouped values, their source positions, group ids
  int64_t count = 0;
};

Grouped group_equal(const at::Tensor& self, bool sort) {
  TensorType flat{to_dtype(self.scalar_type()), {self.numel()}};
  const int64_t n = self.numel();
  std::string key = std::string(sort ? "unique_group|" : "unique_consecutive_group|") + flat.str();
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.parameter(flat);
    TensorType index_type{DType::Int64, {n}};
    Value order = b.iota(index_type, 0);
    if (sort) {
      auto sorted = b.sort({x, order}, 0, /*is_stable=*/true, [](Builder& r, const std::vector<Value>& a) {
        return std::vector<Value>{lowering::before(r, a[0], a[1], /*descending=*/false)};
      });
      x = sorted[0];
      order = sorted[1];
    }
    // first[i]: x[i] starts a group (NaN != NaN: every NaN is its own group, as on CPU).
    Value differs = b.compare(Compare::NE, b.slice(x, {1}, {n}, {1}), b.slice(x, {0}, {n - 1}, {1}));
    Value first = b.concatenate({b.constant(1, {DType::Bool, {1}}), differs}, 0);
    Value group = b.binary(Binary::Subtract, lowering::scan(b, b.convert(first, DType::Int64), 0, Binary::Add, 0),
                           b.constant_int(1, index_type));
    Value count = b.binary(Binary::Add, b.slice(group, {n - 1}, {n}, {1}), b.constant_int(1, {DType::Int64, {1}}));
    return std::make_pair(b.module({x, order, group, count}),
                          std::vector<TensorType>{flat, index_type, index_type, {DType::Int64, {1}}});
  });
  auto out = Runtime::get().execute(*program, {read_dense(self)->raw()}, device_index(self),
                                    sort ? "aten::_unique2 (group)" : "aten::unique_consecutive (group)");
  Grouped g{out[0], out[1], out[2], 0};
  Runtime::get().download(*out[3], &g.count, sizeof g.count);
  return g;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_flat(const at::Tensor& self, bool sort, bool return_inverse,
                                                           bool return_counts) {
  const int64_t n = self.numel();
  auto index_options = self.options().dtype(at::kLong);
  if (n == 0)
    return {at::empty({0}, self.options()),
            at::empty(return_inverse ? self.sizes() : at::IntArrayRef{0}, index_options),
            at::empty({0}, index_options)};
  Grouped g = group_equal(self, sort);
  const int64_t count = g.count;
  const int dev = device_index(self);
  TensorType flat{to_dtype(self.scalar_type()), {n}}, index_type{DType::Int64, {n}};
  std::string key = std::string("unique|") + flat.str() + "|" + std::to_string(count);
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.parameter(flat), order = b.parameter(index_type), group = b.parameter(index_type);
    // Scatter targets: the first (last) element of each group goes to its group
    // id, every other element to slot `count`, which is then dropped.
    Value spare = b.constant_int(count, index_type);
    Value starts =
        b.compare(Compare::NE, group,
                  b.concatenate({b.constant_int(-1, {DType::Int64, {1}}), b.slice(group, {0}, {n - 1}, {1})}, 0));
    Value ends = b.compare(Compare::NE, group,
                           b.concatenate({b.slice(group, {1}, {n}, {1}), b.constant_int(-1, {DType::Int64, {1}})}, 0));
    // The first element of a group is its value (-0.0 before 0.0 stays -0.0, as on CPU).
    Value values = b.scatter_1d(b.constant(0, {flat.dtype, {count + 1}}), b.select(starts, group, spare), x);
    values = b.slice(values, {0}, {count}, {1});
    // counts[k] = end[k] - end[k-1], with end[k] one past the last element of group k.
    Value end = b.scatter_1d(b.constant_int(0, {DType::Int64, {count + 1}}), b.select(ends, group, spare),
                             b.binary(Binary::Add, b.iota(index_type, 0), b.constant_int(1, index_type)));
    end = b.slice(end, {0}, {count}, {1});
    Value previous = b.concatenate({b.constant_int(0, {DType::Int64, {1}}), b.slice(end, {0}, {count - 1}, {1})}, 0);
    Value counts = b.binary(Binary::Subtract, end, previous);
    // inverse[order[i]] = group[i]
    Value inverse = b.scatter_1d(b.constant_int(0, index_type), order, group);
    return std::make_pair(b.module({values, inverse, counts}),
                          std::vector<TensorType>{values.type, inverse.type, counts.type});
  });
  auto out = Runtime::get().execute(*program, {g.values->raw(), g.order->raw(), g.group->raw()}, dev,
                                    sort ? "aten::_unique2" : "aten::unique_consecutive");
  at::Tensor values = wrap_buffer(out[0], {count}, self.scalar_type(), dev);
  at::Tensor inverse =
      return_inverse ? wrap_buffer(out[1], {n}, at::kLong, dev).view(self.sizes()) : at::empty({0}, index_options);
  at::Tensor counts = return_counts ? wrap_buffer(out[2], {count}, at::kLong, dev) : at::empty({0}, index_options);
  return {values, inverse, counts};
}

// sorted=False also sorts, as CUDA does (and as CPU does for these dtypes).
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool /*sorted*/, bool return_inverse,
                                                       bool return_counts) {
  return unique_flat(self, /*sort=*/true, return_inverse, return_counts);
}

// unique_consecutive(self, return_inverse, return_counts, dim): boxed, so a
// `dim` (rows compared whole) can go to the CPU fallback.
void unique_consecutive(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  if (!args[3].isNone()) return run_cpu_fallback(op, stack, "with dim= (rows compared whole)");
  at::Tensor self = args[0].toTensor();
  bool return_inverse = args[1].toBool(), return_counts = args[2].toBool();
  torch::jit::drop(*stack, 4);
  auto [values, inverse, counts] = unique_flat(self, /*sort=*/false, return_inverse, return_counts);
  torch::jit::push(*stack, values, inverse, counts);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", nonzero);
  m.impl("masked_select", masked_select);
  m.impl("_unique2", unique2);
  m.impl("unique_consecutive", torch::CppFunction::makeFromBoxedFunction<&unique_consecutive>());
}

}  // namespace torch_tpu::aten
