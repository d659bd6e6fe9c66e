// Scans (cumsum, cumprod) and sorting (sort, topk). Sorting orders NaN above
// every number, as PyTorch does: last ascending, first descending.
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

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
    Value x = c.b.cast(c.b.cast(c.tensor(0), c.out().dtype), opmath_type(c.out().dtype));
    int64_t dim = normalize_dim(c.integer(1), x.rank());
    if (x.rank() == 0) x = c.b.reshape(x, {1});
    return {c.b.reshape(c.b.cast(scan(c.b, x, dim, op, identity), c.out().dtype), c.out().shape)};
  };
}

// log(exp(a) + exp(b)) as CPU's logcumsumexp combines: the larger plus
// log1p(exp(smaller - larger)); equal infinities give themselves; NaN wins.
Value log_add_exp(Builder& b, const Value& x, const Value& y) {
  Value hi = maximum(b, x, y), lo = minimum(b, x, y);
  Value r = b.binary(Binary::Add, hi, b.unary(Unary::Log1p, b.unary(Unary::Exp, b.binary(Binary::Subtract, lo, hi))));
  Value same_inf = b.binary(Binary::And, b.compare(Compare::EQ, lo, hi),
                            b.compare(Compare::EQ, b.unary(Unary::Abs, lo), b.constant(INFINITY, lo.type)));
  return b.select(same_inf, x, r);
}

// _logcumsumexp(self, dim): a Hillis-Steele scan of log_add_exp (identity
// -inf), low-precision floats in float32.
std::vector<Value> logcumsumexp(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), opmath_type(c.out().dtype));
  if (x.rank() == 0) x = c.b.reshape(x, {1});
  const int64_t dim = normalize_dim(c.integer(1), x.rank()), n = x.shape()[dim];
  for (int64_t k = 1; k < n; k *= 2) {
    Shape pad_shape = x.shape();
    pad_shape[dim] = k;
    std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), strides(x.rank(), 1);
    limit[dim] = n - k;
    Value shifted =
        c.b.concatenate({c.b.constant(-INFINITY, {x.dtype(), pad_shape}), c.b.slice(x, start, limit, strides)}, dim);
    x = log_add_exp(c.b, shifted, x);
  }
  return {c.b.reshape(c.b.cast(x, c.out().dtype), c.out().shape)};
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
  if (x.dtype() == DType::Bool)  // CPU and CUDA have no bool kernel
    throw std::runtime_error(
        "topk does not support bool tensors (as on CPU and CUDA): convert first, e.g. x.to(torch.uint8)");
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

// Of each slice of sorted `s` (and its source positions `p`) along `dim`, the
// entry at the per-slice position `at` (a value per slice, shaped as the
// slices' reduction): picked by a mask, so other entries (NaN) cannot leak in.
std::pair<Value, Value> pick(Builder& b, const Value& s, const Value& p, int64_t dim, const Value& at) {
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < s.rank(); ++d)
    if (d != dim) kept.push_back(d);
  Value here = b.compare(Compare::EQ, b.iota({DType::Int64, s.shape()}, dim), b.broadcast_in_dim(at, s.shape(), kept));
  Value value = b.reduce(b.select(here, s, b.constant(0, s.type)), b.constant(0, {s.dtype(), {}}), {dim}, Binary::Add);
  Value index =
      b.reduce(b.select(here, p, b.constant_int(0, p.type)), b.constant_int(0, {DType::Int64, {}}), {dim}, Binary::Add);
  return {value, index};
}

// kthvalue(self, k, dim=-1, keepdim): the k-th smallest along dim (NaN above
// every number) and its index.
std::vector<Value> kthvalue(LoweringContext& c) {
  Value x = c.tensor(0);
  if (x.rank() == 0) x = c.b.reshape(x, {1});
  const int64_t dim = normalize_dim(c.has(2) ? c.integer(2) : -1, x.rank());
  auto [s, p] = sorted(c.b, x, dim, false);
  Shape reduced = s.shape();
  reduced.erase(reduced.begin() + dim);
  auto [v, i] = pick(c.b, s, p, dim, c.b.constant_int(c.integer(1) - 1, {DType::Int64, reduced}));
  return {c.b.reshape(v, c.out(0).shape), c.b.reshape(i, c.out(1).shape)};
}

// median / nanmedian with or without dim: the lower of the two middle values
// and its index. median returns the first NaN of a slice that has one;
// nanmedian the middle of the numbers (a NaN if there are none).
LoweringRule median(bool ignore_nan, bool with_dim) {
  return [ignore_nan, with_dim](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    if (!with_dim) x = c.b.reshape(x, {x.type.numel()});
    if (x.rank() == 0) x = c.b.reshape(x, {1});
    const int64_t dim = with_dim ? normalize_dim(c.integer(1), x.rank()) : 0, n = x.shape()[dim];
    if (n == 0) throw Declined("median of an empty slice");
    auto [s, p] = sorted(c.b, x, dim, false);
    Value numbers = c.b.reduce(c.b.convert(c.b.compare(Compare::EQ, x, x), DType::Int64),
                               c.b.constant_int(0, {DType::Int64, {}}), {dim}, Binary::Add);
    const TensorType counts = numbers.type;
    auto k = [&](int64_t v) { return c.b.constant_int(v, counts); };
    Value middle = c.b.binary(Binary::Divide, c.b.binary(Binary::Subtract, numbers, k(1)), k(2));
    Value at = ignore_nan ? c.b.select(c.b.compare(Compare::EQ, numbers, k(0)), k(0), middle)
                          : c.b.select(c.b.compare(Compare::LT, numbers, k(n)), numbers, k((n - 1) / 2));
    auto [v, i] = pick(c.b, s, p, dim, at);
    if (!with_dim) return {c.b.reshape(v, c.out(0).shape)};
    return {c.b.reshape(v, c.out(0).shape), c.b.reshape(i, c.out(1).shape)};
  };
}

// searchsorted(sorted_sequence, self, out_int32, right, side, sorter) and
// bucketize(self, boundaries, out_int32, right): how many entries of the
// sequence (the last dimension of each batch) come before each value, as a
// binary search counts them (a NaN value goes after everything).
Value count_before(Builder& b, Value seq, Value values, bool right) {
  const DType t = promote_types(seq.dtype(), values.dtype());
  seq = b.cast(seq, t);
  values = b.cast(values, t);
  const int64_t m = seq.shape().back(), r = values.rank();
  Shape shape = values.shape();
  shape.push_back(m);
  std::vector<int64_t> value_dims, seq_dims;
  for (int64_t d = 0; d < r; ++d) value_dims.push_back(d);
  if (seq.rank() == 1) {
    seq_dims = {r};
  } else {  // batched: seq [..., m] against values [..., k]
    for (int64_t d = 0; d < r - 1; ++d) seq_dims.push_back(d);
    seq_dims.push_back(r);
  }
  Value at_or_after = b.compare(right ? Compare::GT : Compare::GE, b.broadcast_in_dim(seq, shape, seq_dims),
                                b.broadcast_in_dim(values, shape, value_dims));
  Value before = b.convert(b.unary(stablehlo::Unary::Not, at_or_after), DType::Int64);
  return b.reduce(before, b.constant_int(0, {DType::Int64, {}}), {r}, Binary::Add);
}

// x[..., index[..., j]] for every j: each batch gathers with its own index.
// Picked by a mask (x [..., m] against index [..., k]), so other entries (NaN) cannot leak in.
Value gather_last(Builder& b, const Value& x, const Value& index) {
  const int64_t r = x.rank(), m = x.shape().back();
  Shape shape = index.shape();
  shape.push_back(m);
  std::vector<int64_t> x_dims, index_dims;
  for (int64_t d = 0; d < r - 1; ++d) x_dims.push_back(d);
  x_dims.push_back(r);
  for (int64_t d = 0; d < r; ++d) index_dims.push_back(d);
  Value here = b.compare(Compare::EQ, b.iota({DType::Int64, shape}, r),
                         b.broadcast_in_dim(b.cast(index, DType::Int64), shape, index_dims));
  Value picked = b.select(here, b.broadcast_in_dim(x, shape, x_dims), b.constant(0, {x.dtype(), shape}));
  return b.reduce(picked, b.constant(0, {x.dtype(), {}}), {r}, Binary::Add);
}

std::vector<Value> searchsorted(LoweringContext& c) {
  Value seq = c.tensor(0);
  if (c.has(5)) seq = gather_last(c.b, seq, c.tensor(5));  // sorter: the order that sorts seq
  Value values = c.args[1].kind == LoweringArg::Tensor ? c.tensor(1) : c.value_as(1, {seq.dtype(), {}});
  const bool right = (c.has(3) && c.args[3].b) || c.string(4) == "right";
  Value v = values.rank() == 0 ? c.b.reshape(values, {1}) : values;
  return {c.b.reshape(c.b.cast(count_before(c.b, seq, v, right), c.out().dtype), c.out().shape)};
}

std::vector<Value> bucketize(LoweringContext& c) {
  Value values = c.args[0].kind == LoweringArg::Tensor ? c.tensor(0) : c.value_as(0, {c.tensor(1).dtype(), {}});
  Value v = values.rank() == 0 ? c.b.reshape(values, {1}) : values;
  const bool right = c.has(3) && c.args[3].b;
  return {c.b.reshape(c.b.cast(count_before(c.b, c.tensor(1), v, right), c.out().dtype), c.out().shape)};
}

// cummax / cummin(self, dim) -> (values, indices): the running max (min) and
// the index where it was last reached, as CPU's kernel keeps them: a value
// takes over when it is NaN, or when nothing NaN came before and it is >=
// (<=) the running one. That is the max under an order (NaN above all, later
// above earlier among equals), so a Hillis-Steele scan computes it.
LoweringRule cumulative_extreme(bool max) {
  return [max](LoweringContext& c) -> std::vector<Value> {
    Value v = c.tensor(0);
    if (v.rank() == 0) v = c.b.reshape(v, {1});
    const int64_t dim = normalize_dim(c.integer(1), v.rank()), n = v.shape()[dim];
    Value i = c.b.iota({DType::Int64, v.shape()}, dim);
    const bool is_float = stablehlo::is_float(v.dtype());
    for (int64_t k = 1; k < n; k *= 2) {
      Shape pad_shape = v.shape();
      pad_shape[dim] = k;
      std::vector<int64_t> start(v.rank(), 0), limit = v.shape(), strides(v.rank(), 1);
      limit[dim] = n - k;
      Value identity = c.b.broadcast_in_dim(max ? lowest(c.b, v.dtype()) : highest(c.b, v.dtype()), pad_shape, {});
      Value sv = c.b.concatenate({identity, c.b.slice(v, start, limit, strides)}, dim);
      Value si =
          c.b.concatenate({c.b.constant_int(-1, {DType::Int64, pad_shape}), c.b.slice(i, start, limit, strides)}, dim);
      Value later = c.b.compare(max ? Compare::GE : Compare::LE, v, sv);
      if (is_float)
        later = c.b.binary(Binary::Or, c.b.compare(Compare::NE, v, v),
                           c.b.binary(Binary::And, c.b.compare(Compare::EQ, sv, sv), later));
      v = c.b.select(later, v, sv);
      i = c.b.select(later, i, si);
    }
    return {c.b.reshape(v, c.out(0).shape), c.b.reshape(i, c.out(1).shape)};
  };
}

}  // namespace

LOWERING("aten::mode", mode);
LOWERING("aten::cumsum", cumulative(Binary::Add, 0));
LOWERING("aten::cumprod", cumulative(Binary::Multiply, 1));
LOWERING("aten::_logcumsumexp", logcumsumexp);
LOWERING("aten::cummax", cumulative_extreme(true));
LOWERING("aten::cummin", cumulative_extreme(false));
LOWERING("aten::sort.stable", sort_stable);
LOWERING("aten::sort", sort);
LOWERING("aten::topk", topk);
LOWERING("aten::kthvalue", kthvalue);
LOWERING("aten::median", median(false, false));
LOWERING("aten::median.dim", median(false, true));
LOWERING("aten::nanmedian", median(true, false));
LOWERING("aten::nanmedian.dim", median(true, true));
LOWERING("aten::searchsorted.Tensor", searchsorted);
LOWERING("aten::searchsorted.Scalar", searchsorted);
LOWERING("aten::bucketize.Tensor", bucketize);
LOWERING("aten::bucketize.Scalar", bucketize);

}  // namespace torch_tpu::lowering
