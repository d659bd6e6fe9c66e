// Scans (cumsum, cumprod) and sorting (sort, topk). Sorting orders NaN above
// every number, as PyTorch does: last ascending, first descending.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

DType accumulation_type(DType out) { return out == DType::Float16 || out == DType::BFloat16 ? DType::Float32 : out; }

}  // namespace

// Hillis-Steele: log2(n) steps of x = x op (x shifted by 2^k).
Value scan(Builder& b, Value x, int64_t dim, Binary op, double identity) {
  const int64_t n = x.shape()[dim];
  for (int64_t k = 1; k < n; k *= 2) {
    Shape pad_shape = x.shape();
    pad_shape[dim] = k;
    std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), strides(x.rank(), 1);
    limit[dim] = n - k;
    Value shifted =
        b.concatenate({b.constant(identity, {x.dtype(), pad_shape}), b.slice(x, start, limit, strides)}, dim);
    x = b.binary(op, x, shifted);
  }
  return x;
}

namespace {

// cumsum / cumprod(self, dim, *, dtype)
LoweringRule cumulative(Binary op, double identity) {
  return [op, identity](LoweringContext& c) -> std::vector<Value> {
    // Rounded to the output dtype first, as PyTorch does, then accumulated wider.
    Value x = c.b.cast(c.b.cast(c.tensor(0), c.out().dtype), accumulation_type(c.out().dtype));
    int64_t dim = normalize_dim(c.integer(1), x.rank());
    if (x.rank() == 0) x = c.b.reshape(x, {1});
    return {c.b.reshape(c.b.cast(scan(c.b, x, dim, op, identity), c.out().dtype), c.out().shape)};
  };
}

}  // namespace

Value before(Builder& b, const Value& l, const Value& r, bool descending) {
  Value strict = b.compare(descending ? Compare::GT : Compare::LT, l, r);
  if (!stablehlo::is_float(l.dtype())) return strict;
  Value l_nan = b.compare(Compare::NE, l, l), r_nan = b.compare(Compare::NE, r, r);
  Value nan_order = descending ? b.binary(Binary::And, l_nan, b.unary(Unary::Not, r_nan))
                               : b.binary(Binary::And, b.unary(Unary::Not, l_nan), r_nan);
  return b.binary(Binary::Or, strict, nan_order);
}

namespace {

// Values and int64 indices of `x` sorted along `dim`, stably.
std::pair<Value, Value> sorted(Builder& b, Value x, int64_t dim, bool descending) {
  if (x.rank() == 0) x = b.reshape(x, {1});
  Value index = b.iota({DType::Int64, x.shape()}, dim);
  auto out = b.sort({x, index}, dim, /*is_stable=*/true,
                    [descending](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                      return {before(r, a[0], a[1], descending)};
                    });
  return {out[0], out[1]};
}

std::vector<Value> sort_result(LoweringContext& c, int64_t dim, bool descending) {
  const Value& x = c.tensor(0);
  auto [v, i] = sorted(c.b, x, normalize_dim(dim, x.rank()), descending);
  return {c.b.reshape(v, c.out(0).shape), c.b.reshape(i, c.out(1).shape)};
}

// sort.stable(self, *, stable, dim=-1, descending=False): always stable,
// which is one of the orders an unstable sort may return.
std::vector<Value> sort_stable(LoweringContext& c) { return sort_result(c, c.integer(2), c.has(3) && c.args[3].b); }
// sort(self, dim=-1, descending=False)
std::vector<Value> sort(LoweringContext& c) { return sort_result(c, c.integer(1), c.has(2) && c.args[2].b); }

// topk(self, k, dim=-1, largest=True, sorted=True): the first k of a stable
// sort, so ties come in index order; always sorted.
std::vector<Value> topk(LoweringContext& c) {
  const Value& x = c.tensor(0);
  if (x.rank() == 0) return {x, c.b.constant_int(0, c.out(1))};  // CPU returns the element, for any k
  int64_t dim = normalize_dim(c.integer(2), x.rank());
  bool largest = !c.has(3) || c.args[3].b;
  auto [v, i] = sorted(c.b, x, dim, largest);
  std::vector<int64_t> start(v.rank(), 0), limit = v.shape(), strides(v.rank(), 1);
  limit[dim] = c.integer(1);
  return {c.b.reshape(c.b.slice(v, start, limit, strides), c.out(0).shape),
          c.b.reshape(c.b.slice(i, start, limit, strides), c.out(1).shape)};
}

// mode(self, dim=-1, keepdim=False): the most frequent value along dim (the
// smallest of equally frequent ones) and the index of its last occurrence, as
// CPU returns them: a stable sort, the length of each run of equal values, the
// longest run.
std::vector<Value> mode(LoweringContext& c) {
  Builder& b = c.b;
  Value x = c.tensor(0);
  if (x.dtype() == DType::Bool) x = b.convert(x, DType::Int8);
  if (x.rank() == 0) x = b.reshape(x, {1});
  const int64_t dim = normalize_dim(c.integer(1), x.rank()), n = x.shape()[dim];
  auto [s, p] = sorted(b, x, dim, false);
  const TensorType positions{DType::Int64, s.shape()};
  Value pos = b.iota(positions, dim);
  std::vector<int64_t> start(s.rank(), 0), limit = s.shape(), strides(s.rank(), 1), first_limit = s.shape();
  limit[dim] = n - 1;
  first_limit[dim] = 1;
  Value previous = b.concatenate({b.slice(s, start, first_limit, strides), b.slice(s, start, limit, strides)}, dim);
  Value run_begins = b.binary(Binary::Or, b.compare(Compare::EQ, pos, b.constant_int(0, positions)),
                              b.compare(Compare::NE, s, previous));
  Value run_start = scan(b, b.select(run_begins, pos, b.constant_int(0, positions)), dim, Binary::Maximum, 0);
  Value count = b.binary(Binary::Subtract, pos, run_start);
  // The end of the longest run; of equally long ones the first (smallest value).
  auto best = b.reduce({count, pos}, {b.constant_int(-1, {DType::Int64, {}}), b.constant_int(0, {DType::Int64, {}})},
                       {dim}, [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                         Value longer = r.compare(Compare::GT, a[0], a[2]);
                         Value tie = r.binary(Binary::And, r.compare(Compare::EQ, a[0], a[2]),
                                              r.compare(Compare::LT, a[1], a[3]));
                         Value take_first = r.binary(Binary::Or, longer, tie);
                         return {r.select(take_first, a[0], a[2]), r.select(take_first, a[1], a[3])};
                       });
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < s.rank(); ++d)
    if (d != dim) kept.push_back(d);
  Value at_best = b.compare(Compare::EQ, pos, b.broadcast_in_dim(best[1], s.shape(), kept));
  Value value = b.reduce(b.select(at_best, s, b.broadcast_to(lowest(b, s.dtype()), s.shape())), lowest(b, s.dtype()),
                         {dim}, Binary::Maximum);
  Value best_start = b.reduce(b.select(at_best, run_start, b.constant_int(0, positions)),
                              b.constant_int(0, {DType::Int64, {}}), {dim}, Binary::Maximum);
  Value in_run = b.compare(Compare::EQ, run_start, b.broadcast_in_dim(best_start, s.shape(), kept));
  Value index = b.reduce(b.select(in_run, p, b.constant_int(-1, positions)), b.constant_int(-1, {DType::Int64, {}}),
                         {dim}, Binary::Maximum);
  return {b.reshape(b.cast(value, c.out(0).dtype), c.out(0).shape), b.reshape(index, c.out(1).shape)};
}

}  // namespace

LOWERING("aten::mode", mode);
LOWERING("aten::cumsum", cumulative(Binary::Add, 0));
LOWERING("aten::cumprod", cumulative(Binary::Multiply, 1));
LOWERING("aten::sort.stable", sort_stable);
LOWERING("aten::sort", sort);
LOWERING("aten::topk", topk);

}  // namespace torch_tpu::lowering
