// Ops whose output shape depends on the data (nonzero, masked_select,
// unique, unique_consecutive; and equal, which returns a host bool): one
// program counts on the device, one sync reads the count, and a second
// program, compiled per count, fills the result. These are kernels, not
// lowering rules, because the sync sits between the two programs.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <functional>

#include "aten/bounded.h"
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
  auto out = Runtime::get().execute(program, {read_dense(t)}, device_index(t), "aten::nonzero (count)");
  int64_t count = 0;
  Runtime::get().resolve(*out[0], "data_dependent");
  Runtime::get().download(*out[0], &count, sizeof count);
  return count;
}

// Every flat int64 position of flat `x`, its nonzero elements' first, in
// order: a stable sort that puts nonzero elements first.
Value nonzero_first(Builder& b, const Value& x) {
  Value key = b.convert(b.unary(stablehlo::Unary::Not, truth(b, x)), DType::Int32);
  Value index = b.iota({DType::Int64, x.shape()}, 0);
  auto sorted = b.sort({key, index}, 0, /*is_stable=*/true, [](Builder& r, const std::vector<Value>& a) {
    return std::vector<Value>{r.compare(Compare::LT, a[0], a[1])};
  });
  return sorted[1];
}

// The flat int64 positions of the `count` nonzero elements of flat `x`, in order.
Value nonzero_positions(Builder& b, const Value& x, int64_t count) {
  return b.slice(nonzero_first(b, x), {0}, {count}, {1});
}

// How many elements of flat `x` are nonzero, as int32[1]: a deferred size's count.
Value nonzero_total(Builder& b, const Value& x) {
  Value n = b.reduce(b.convert(truth(b, x), DType::Int32), b.scalar(0, DType::Int32), {0}, Binary::Add);
  return b.reshape(n, {1});
}

// Fused mode (defer_data_dependent_sizes): the result of `x`'s nonzero
// positions, padded to every position, with the count kept on the device. One
// program per input shape; the window goes on. `result` builds the padded
// result from the sorted positions [n].
using DeferredResult = std::function<Value(Builder&, const std::vector<Value>& params, const Value& positions)>;
at::Tensor deferred_select(const std::string& key, const std::vector<at::Tensor>& inputs, const at::Tensor& mask,
                           const TensorType& out_type, PaddedDims dims, at::ScalarType dtype, const char* what,
                           const DeferredResult& result) {
  const int64_t n = mask.numel();
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    std::vector<Value> params;
    for (const at::Tensor& t : inputs) params.push_back(b.parameter({to_dtype(t.scalar_type()), {t.numel()}}));
    Value m = b.parameter({to_dtype(mask.scalar_type()), {n}});
    Value out = result(b, params, nonzero_first(b, m));
    Value count = nonzero_total(b, m);
    return std::make_pair(b.module({out, count}), std::vector<TensorType>{out_type, count.type});
  });
  std::vector<pjrt::BufferPtr> buffers;
  for (const at::Tensor& t : inputs) buffers.push_back(read_dense(t));
  buffers.push_back(read_dense(mask));
  auto out = Runtime::get().execute(program, buffers, device_index(mask), what);
  auto size = device_size(out[1]);
  dims[0] = {Part{-size->id, n}};
  Runtime::get().count("deferred_counts");
  return wrap_padded(out[0], dims, dtype, device_index(mask), {size});
}

at::Tensor empty_result(at::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
  return at::empty(sizes, like.options().dtype(dtype));
}

// The row-major coordinates [n, rank] of the flat positions `pos` ([n]) of a
// tensor of `sizes`, flat.
Value unravel(Builder& b, const Value& pos, const std::vector<int64_t>& sizes) {
  const int64_t n = pos.shape()[0], rank = static_cast<int64_t>(sizes.size());
  std::vector<Value> coords;
  int64_t stride = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    Value c = b.binary(Binary::Divide, pos, b.constant_int(stride, pos.type));
    c = b.binary(Binary::Remainder, c, b.constant_int(sizes[d], pos.type));
    coords.insert(coords.begin(), b.reshape(c, {n, 1}));
    stride *= sizes[d];
  }
  return b.reshape(b.concatenate(coords, 1), {n * rank});
}

at::Tensor deferred_nonzero(const at::Tensor& self) {
  const int64_t n = self.numel(), rank = self.dim();
  const std::vector<int64_t> sizes = self.sizes().vec();
  std::string key =
      "nonzero_deferred|" + stablehlo::mlir_name(to_dtype(self.scalar_type())) + "[" + dims_key(sizes) + "]";
  return deferred_select(
      key, {}, self, {DType::Int64, {n * rank}}, {{}, {Part{rank, 0}}}, at::kLong, "aten::nonzero",
      [&](Builder& b, const std::vector<Value>&, const Value& pos) { return unravel(b, pos, sizes); });
}

at::Tensor nonzero(const at::Tensor& self) {
  if (defer_data_dependent_sizes() && self.numel() > 0 && self.dim() > 0) return deferred_nonzero(self);
  int64_t count = self.numel() == 0 ? 0 : nonzero_count(self);
  int64_t rank = self.dim();
  if (count == 0 || rank == 0) return empty_result({count, rank}, at::kLong, self);
  TensorType flat{to_dtype(self.scalar_type()), {self.numel()}};
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  std::string key = "nonzero|" + flat.str() + "|" + c10::str(self.sizes()) + "|" + std::to_string(count);
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value out = unravel(b, nonzero_positions(b, b.parameter(flat), count), sizes);
    return std::make_pair(b.module({out}), std::vector<TensorType>{{DType::Int64, {count, rank}}});
  });
  auto out = Runtime::get().execute(program, {read_dense(self)}, device_index(self), "aten::nonzero");
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
  if (defer_data_dependent_sizes() && where.numel() > 0) {
    const int64_t n = where.numel();
    TensorType type{to_dtype(values.scalar_type()), {n}};
    return deferred_select(
        "masked_select_deferred|" + type.str(), {values}, where, type, {{}}, self.scalar_type(), "aten::masked_select",
        [](Builder& b, const std::vector<Value>& v, const Value& pos) { return b.gather_1d(v[0], pos); });
  }
  int64_t count = where.numel() == 0 ? 0 : nonzero_count(where);
  if (count == 0) return empty_result({0}, self.scalar_type(), self);
  TensorType vflat{to_dtype(values.scalar_type()), {values.numel()}}, mflat{DType::Bool, {where.numel()}};
  auto program = Runtime::get().program("masked_select|" + vflat.str() + "|" + std::to_string(count), [&] {
    Builder b;
    Value v = b.parameter(vflat), m = b.parameter(mflat);
    Value out = b.gather_1d(v, nonzero_positions(b, m, count));
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  auto out = Runtime::get().execute(program, {read_dense(values), read_dense(where)}, device_index(self),
                                    "aten::masked_select");
  return wrap_buffer(out[0], {count}, self.scalar_type(), device_index(self));
}

// unique and unique_consecutive, of elements (dim=None) or of rows along a
// dim. Program 1 puts equal rows next to each other (a stable sort for unique;
// nothing for unique_consecutive) and numbers the groups; one sync reads how
// many there are; program 2, compiled per count, gathers the groups' rows, the
// inverse and the counts by scatter.
struct Grouped {
  pjrt::BufferPtr rows, order, group;  // grouped rows [m*k], their source rows [m], group ids [m]
  pjrt::BufferPtr groups;              // how many groups: int32[1]
  int64_t count = 0;                   // read when not deferred, else the largest count, m
};

// "row l goes before row r", lexicographically. Elements (k == 1) sort NaN
// last as torch.sort does; rows compare as CPU's unique(dim=) does, where a
// NaN is neither below nor above anything.
Value row_before(Builder& b, const std::vector<Value>& a, int64_t k) {
  if (k == 1) return lowering::before(b, a[0], a[1], /*descending=*/false);
  Value result = b.compare(Compare::LT, a[2 * (k - 1)], a[2 * (k - 1) + 1]);
  for (int64_t j = k - 2; j >= 0; --j) {
    const Value &l = a[2 * j], &r = a[2 * j + 1];
    Value lt = b.compare(Compare::LT, l, r), gt = b.compare(Compare::GT, l, r);
    Value tie = b.unary(stablehlo::Unary::Not, b.binary(Binary::Or, lt, gt));
    result = b.binary(Binary::Or, lt, b.binary(Binary::And, tie, result));
  }
  return result;
}

// `rows` is a contiguous [m, k] tensor with m > 0.
// `what` names the programs in device errors: literals, they must outlive the run.
struct UniqueOp {
  const char* group;
  const char* gather;
};
constexpr UniqueOp kUnique2{"aten::_unique2 (group)", "aten::_unique2"};
constexpr UniqueOp kUniqueDim{"aten::unique_dim (group)", "aten::unique_dim"};
constexpr UniqueOp kUniqueConsecutive{"aten::unique_consecutive (group)", "aten::unique_consecutive"};

Grouped group_equal(const at::Tensor& rows, bool sort, const UniqueOp& op, bool defer) {
  const int64_t m = rows.size(0), k = rows.size(1);
  TensorType flat{to_dtype(rows.scalar_type()), {m * k}};
  std::string key =
      std::string(sort ? "unique_group|" : "unique_consecutive_group|") + flat.str() + "|" + std::to_string(k);
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.reshape(b.parameter(flat), {m, k});
    TensorType index_type{DType::Int64, {m}};
    Value order = b.iota(index_type, 0);
    if (sort) {
      std::vector<Value> keys;
      for (int64_t j = 0; j < k; ++j) keys.push_back(b.reshape(b.slice(x, {0, j}, {m, j + 1}, {1, 1}), {m}));
      keys.push_back(order);
      auto sorted = b.sort(keys, 0, /*is_stable=*/true, [k](Builder& r, const std::vector<Value>& a) {
        return std::vector<Value>{row_before(r, a, k)};
      });
      order = sorted.back();
      sorted.pop_back();
      for (auto& column : sorted) column = b.reshape(column, {m, 1});
      x = k == 1 ? sorted[0] : b.concatenate(sorted, 1);
    }
    // A row starts a group when any element differs from the row before
    // (NaN != NaN: a row with a NaN is its own group, as on CPU).
    Value differs = b.compare(Compare::NE, b.slice(x, {1, 0}, {m, k}, {1, 1}), b.slice(x, {0, 0}, {m - 1, k}, {1, 1}));
    differs = b.reduce(differs, b.scalar(0, DType::Bool), {1}, Binary::Or);
    Value first = b.concatenate({b.constant(1, {DType::Bool, {1}}), differs}, 0);
    Value group = b.binary(Binary::Subtract, lowering::scan(b, b.convert(first, DType::Int64), 0, Binary::Add, 0),
                           b.constant_int(1, index_type));
    Value count = b.binary(Binary::Add, b.slice(group, {m - 1}, {m}, {1}), b.constant_int(1, {DType::Int64, {1}}));
    count = b.convert(count, DType::Int32);
    return std::make_pair(b.module({b.reshape(x, {m * k}), order, group, count}),
                          std::vector<TensorType>{flat, index_type, index_type, {DType::Int32, {1}}});
  });
  auto out = Runtime::get().execute(program, {read_dense(rows)}, device_index(rows), op.group);
  Grouped g{out[0], out[1], out[2], out[3], m};
  if (defer) return g;
  int32_t count = 0;
  Runtime::get().resolve(*out[3], "data_dependent");
  Runtime::get().download(*out[3], &count, sizeof count);
  g.count = count;
  return g;
}

// The deferred unique rows (a flat padded [m * k] value, m rows of
// `row_shape`, the first `count` real) as a tensor with the rows' dim at `dim`
// (a transpose on the device at the padded size: reading the sizes would wait
// for the count).
at::Tensor deferred_rows_at(pjrt::BufferPtr value, const std::shared_ptr<runtime::DeviceSize>& size,
                            at::ScalarType dtype, int dev, int64_t m, const std::vector<int64_t>& row_shape,
                            int64_t dim) {
  const Part count{-size->id, m};
  std::vector<int64_t> padded{m}, order;
  padded.insert(padded.end(), row_shape.begin(), row_shape.end());
  for (int64_t d = 1; d <= dim; ++d) order.push_back(d);
  order.push_back(0);
  for (int64_t d = dim + 1; d < static_cast<int64_t>(padded.size()); ++d) order.push_back(d);
  if (dim > 0) {
    const TensorType flat{to_dtype(dtype), {c10::multiply_integers(padded)}};
    auto program = Runtime::get().program(
        "unique_rows_at|" + flat.str() + "|" + dims_key(padded) + "|" + std::to_string(dim), [&] {
          Builder b;
          Value x = b.reshape(b.parameter(flat), padded);
          Value out = b.reshape(b.transpose(x, order), flat.shape);
          return std::make_pair(b.module({out}), std::vector<TensorType>{flat});
        });
    value = Runtime::get().execute(program, {value}, dev, "aten::unique_dim (rows at dim)")[0];
  }
  PaddedDims dims;
  for (int64_t d : order) dims.push_back({d == 0 ? count : Part{padded[static_cast<size_t>(d)], 0}});
  return wrap_padded(value, dims, dtype, dev, {size});
}

// The unique rows of `rows` ([m, k], m > 0, each row `row_shape`) with their
// dim at `dim`, the inverse [m] and the counts [count]. In Fused mode
// (defer_data_dependent_sizes): deferred, values and counts padded to m, the
// count on the device (then the count returned is -1).
std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t> unique_rows(const at::Tensor& rows,
                                                                    const std::vector<int64_t>& row_shape, int64_t dim,
                                                                    bool sort, const UniqueOp& op) {
  const int64_t m = rows.size(0), k = rows.size(1);
  const bool defer = defer_data_dependent_sizes();
  Grouped g = group_equal(rows, sort, op, defer);
  const int64_t count = g.count;
  const int dev = device_index(rows);
  TensorType flat{to_dtype(rows.scalar_type()), {m * k}}, index_type{DType::Int64, {m}};
  std::string key = "unique|" + flat.str() + "|" + std::to_string(k) + "|" + std::to_string(count);
  auto program = Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.parameter(flat), order = b.parameter(index_type), group = b.parameter(index_type);
    // Scatter targets: the first (last) row of each group goes to its group
    // id, every other row to slot `count`, which is then dropped.
    Value spare = b.constant_int(count, index_type);
    Value minus_one = b.constant_int(-1, {DType::Int64, {1}});
    Value starts = b.compare(Compare::NE, group, b.concatenate({minus_one, b.slice(group, {0}, {m - 1}, {1})}, 0));
    Value ends = b.compare(Compare::NE, group, b.concatenate({b.slice(group, {1}, {m}, {1}), minus_one}, 0));
    Value position = b.iota(index_type, 0);
    // A group's first row is its value (-0.0 before 0.0 stays -0.0, as on CPU).
    Value first =
        b.scatter_1d(b.constant_int(0, {DType::Int64, {count + 1}}), b.select(starts, group, spare), position);
    first = b.slice(first, {0}, {count}, {1});
    TensorType element_index{DType::Int64, {count, k}};
    Value elements = b.binary(
        Binary::Add,
        b.binary(Binary::Multiply, b.broadcast_in_dim(first, {count, k}, {0}), b.constant_int(k, element_index)),
        b.iota(element_index, 1));
    Value values = b.gather_1d(x, b.reshape(elements, {count * k}));
    // counts[g] = end[g] - end[g-1], with end[g] one past the last row of group g.
    Value end = b.scatter_1d(b.constant_int(0, {DType::Int64, {count + 1}}), b.select(ends, group, spare),
                             b.binary(Binary::Add, position, b.constant_int(1, index_type)));
    end = b.slice(end, {0}, {count}, {1});
    Value previous = b.concatenate({b.constant_int(0, {DType::Int64, {1}}), b.slice(end, {0}, {count - 1}, {1})}, 0);
    Value counts = b.binary(Binary::Subtract, end, previous);
    // inverse[order[i]] = group[i]
    Value inverse = b.scatter_1d(b.constant_int(0, index_type), order, group);
    return std::make_pair(b.module({values, inverse, counts}),
                          std::vector<TensorType>{values.type, inverse.type, counts.type});
  });
  auto out = Runtime::get().execute(program, {g.rows, g.order, g.group}, dev, op.gather);
  if (defer) {
    auto size = device_size(g.groups);
    Runtime::get().count("deferred_counts");
    return {deferred_rows_at(out[0], size, rows.scalar_type(), dev, m, row_shape, dim),
            wrap_buffer(out[1], {m}, at::kLong, dev),
            wrap_padded(out[2], {{Part{-size->id, m}}}, at::kLong, dev, {size}), -1};
  }
  std::vector<int64_t> value_shape{count};
  value_shape.insert(value_shape.end(), row_shape.begin(), row_shape.end());
  at::Tensor values = wrap_buffer(out[0], value_shape, rows.scalar_type(), dev);
  return {dim == 0 ? values : values.movedim(0, dim), wrap_buffer(out[1], {m}, at::kLong, dev),
          wrap_buffer(out[2], {count}, at::kLong, dev), count};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_flat(const at::Tensor& self, bool sort, bool return_inverse,
                                                           bool return_counts, const UniqueOp& op) {
  auto index_options = self.options().dtype(at::kLong);
  if (self.numel() == 0)
    return {at::empty({0}, self.options()),
            at::empty(return_inverse ? self.sizes() : at::IntArrayRef{0}, index_options),
            at::empty({0}, index_options)};
  auto [values, inverse, counts, count] = unique_rows(self.reshape({self.numel(), 1}), {}, 0, sort, op);
  return {values, return_inverse ? inverse.view(self.sizes()) : at::empty({0}, index_options),
          return_counts ? counts : at::empty({0}, index_options)};
}

// Rows longer than this compare on the CPU fallback: the sort's comparator
// grows with the row.
constexpr int64_t kMaxRowLength = 64;

// Whether unique along `dim` runs on the device: empty inputs (CPU's errors
// and results) and long rows go to the CPU fallback.
bool unique_dim_fits(const at::Tensor& self, int64_t dim) {
  return self.numel() > 0 && self.numel() / self.size(c10::maybe_wrap_dim(dim, self.dim())) <= kMaxRowLength;
}

// unique along `dim`: rows are the slices self.select(dim, i), compared whole.
void unique_dim_on_device(const at::Tensor& self, int64_t dim, bool sort, bool return_inverse, bool return_counts,
                          const UniqueOp& op, torch::jit::Stack* stack) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const int64_t m = self.size(dim);
  at::Tensor rows = self.movedim(dim, 0).contiguous();
  std::vector<int64_t> row_shape(rows.sizes().begin() + 1, rows.sizes().end());
  auto [values, inverse, counts, count] = unique_rows(rows.reshape({m, -1}), row_shape, dim, sort, op);
  auto index_options = self.options().dtype(at::kLong);
  torch::jit::push(*stack, values, return_inverse ? inverse : at::empty({0}, index_options),
                   return_counts ? counts : at::empty({0}, index_options));
}

// sorted=False also sorts, as CUDA does (and as CPU does for these dtypes).
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool /*sorted*/, bool return_inverse,
                                                       bool return_counts) {
  return unique_flat(self, /*sort=*/true, return_inverse, return_counts, kUnique2);
}

// unique_dim(self, dim, sorted, return_inverse, return_counts)
void unique_dim(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);
  at::Tensor self = args[0].toTensor();
  int64_t dim = args[1].toInt();
  bool return_inverse = args[3].toBool(), return_counts = args[4].toBool();
  if (!unique_dim_fits(self, dim))
    return run_cpu_fallback(op, stack, "for empty inputs or rows longer than 64 elements");
  torch::jit::drop(*stack, 5);
  unique_dim_on_device(self, dim, /*sort=*/true, return_inverse, return_counts, kUniqueDim, stack);
}

// unique_consecutive(self, return_inverse, return_counts, dim)
void unique_consecutive(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor self = args[0].toTensor();
  bool return_inverse = args[1].toBool(), return_counts = args[2].toBool();
  if (!args[3].isNone()) {
    int64_t dim = args[3].toInt();
    if (!unique_dim_fits(self, dim))
      return run_cpu_fallback(op, stack, "with dim= for empty inputs or rows longer than 64 elements");
    torch::jit::drop(*stack, 4);
    unique_dim_on_device(self, dim, /*sort=*/false, return_inverse, return_counts, kUniqueConsecutive, stack);
    return;
  }
  torch::jit::drop(*stack, 4);
  auto [values, inverse, counts] = unique_flat(self, /*sort=*/false, return_inverse, return_counts, kUniqueConsecutive);
  torch::jit::push(*stack, values, inverse, counts);
}

// The one bool mask of x[mask] (or x[mask] = v) when it covers x's leading
// dims exactly: the calls the deferred paths take. nullopt for any other
// (a mismatch included: the exact path raises CPU's error).
std::optional<at::Tensor> leading_bool_mask(const at::Tensor& self,
                                            const c10::List<std::optional<at::Tensor>>& indices) {
  if (indices.size() != 1) return std::nullopt;
  std::optional<at::Tensor> mask = indices.get(0);
  if (!mask || !mask->defined() || mask->scalar_type() != at::kBool || mask->device() != self.device() ||
      mask->dim() == 0 || mask->dim() > self.dim() || mask->numel() == 0 ||
      mask->sizes() != self.sizes().slice(0, static_cast<size_t>(mask->dim())))
    return std::nullopt;
  return mask;
}

}  // namespace

std::optional<at::Tensor> deferred_mask_index(const at::Tensor& self,
                                              const c10::List<std::optional<at::Tensor>>& indices) {
  if (!defer_data_dependent_sizes()) return std::nullopt;
  const std::optional<at::Tensor> mask = leading_bool_mask(self, indices);
  if (!mask) return std::nullopt;
  const int64_t m = mask->numel(), r = self.numel() / m;
  PaddedDims dims{{}};
  for (int64_t d = mask->dim(); d < self.dim(); ++d) dims.push_back({Part{self.size(d), 0}});
  TensorType type{to_dtype(self.scalar_type()), {m * r}};
  std::string key = "mask_index_deferred|" + type.str() + "|" + std::to_string(r);
  return deferred_select(key, {self}, *mask, type, std::move(dims), self.scalar_type(), "aten::index",
                         [m, r](Builder& b, const std::vector<Value>& x, const Value& pos) {
                           if (r == 1) return b.gather_1d(x[0], pos);
                           // Row pos[i] is elements pos[i] * r + 0..r-1.
                           TensorType grid{DType::Int64, {m, r}};
                           Value rows = b.broadcast_in_dim(b.reshape(pos, {m, 1}), grid.shape, {0, 1});
                           Value at = b.binary(Binary::Add, b.binary(Binary::Multiply, rows, b.constant_int(r, grid)),
                                               b.iota(grid, 1));
                           return b.gather_1d(x[0], b.reshape(at, {m * r}));
                         });
}

bool deferred_mask_put(const std::string& op, const std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  if (!defer_data_dependent_sizes() || args.size() < 4 || args[3].toBool() || !args[2].isTensor()) return false;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& values = args[2].toTensor();
  const std::optional<at::Tensor> mask = leading_bool_mask(self, args[1].toOptionalTensorList());
  if (!mask || values.device() != self.device() || values.scalar_type() != self.scalar_type() || deferred(self) ||
      deferred(*mask) || deferred(values))
    return false;
  // Each selected row is self[mask.dim():]-shaped: values broadcast to it,
  // with one more leading dim when they give a row per selected row.
  const auto rest = self.sizes().slice(static_cast<size_t>(mask->dim()));
  const int64_t extra = values.dim() - static_cast<int64_t>(rest.size());
  if (extra > 1) return false;
  for (int64_t d = std::max<int64_t>(extra, 0); d < values.dim(); ++d) {
    const int64_t r = rest[static_cast<size_t>(d - extra)];
    if (values.size(d) != r && values.size(d) != 1) return false;
  }
  std::vector<int64_t> mask_shape = mask->sizes().vec();
  mask_shape.resize(static_cast<size_t>(self.dim()), 1);
  const at::Tensor where = mask->view(mask_shape);
  at::Tensor target = op == "aten::index_put" ? self.clone(at::MemoryFormat::Preserve) : self;
  if (extra < 1 || values.size(0) == 1) {  // the same row for every selected row
    target.copy_(at::where(where, extra == 1 ? values.squeeze(0) : values, target));
  } else {  // row i of values into the i-th selected row: their count must be values' rows
    const int64_t rows = values.size(0);
    std::vector<int64_t> full{rows};
    full.insert(full.end(), rest.begin(), rest.end());
    const at::Tensor ok = at::eq(mask->sum(), rows).reshape({1});
    std::string result = "[n";
    for (int64_t r : rest) result += ", " + std::to_string(r);
    Runtime::get().defer_check(
        read_dense(ok), {std::string(runtime::kRuntimeErrorCheck) + "shape mismatch: value tensor of shape " +
                         c10::str(values.sizes()) + " cannot be broadcast to indexing result of shape " + result +
                         "]: the mask selects n != " + std::to_string(rows) + " rows (" + op +
                         ", counted on the device in Fused mode)"});
    target.masked_scatter_(where.expand(self.sizes()), values.expand(full).contiguous());
  }
  torch::jit::drop(*stack, args.size());
  stack->push_back(target);
  return true;
}

// equal(self, other): equal sizes and every element equal (a NaN never is),
// dtypes promoted as eq does: one reduction on the device, then one sync.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ", self.device(),
              " and ", other.device());
  if (!self.sizes().equals(other.sizes())) return false;
  return self.numel() == 0 || at::eq(self, other).all().item<bool>();
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("equal", equal);
  m.impl("nonzero", nonzero);
  m.impl("masked_select", masked_select);
  m.impl("_unique2", unique2);
  m.impl("unique_consecutive", torch::CppFunction::makeFromBoxedFunction<&unique_consecutive>());
  m.impl("unique_dim", torch::CppFunction::makeFromBoxedFunction<&unique_dim>());
}

}  // namespace torch_tpu::aten
