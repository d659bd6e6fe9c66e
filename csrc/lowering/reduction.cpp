// Reductions over dimensions. Low-precision floats accumulate in float32, as
// PyTorch does on CPU and CUDA.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;

// Input `i` as PyTorch reduces it: first in the output dtype (sum(x, dtype=bf16)
// rounds x to bf16), then widened to the accumulation type.
Value accumulated_input(LoweringContext& c, size_t i, size_t k = 0) {
  return c.b.cast(c.b.cast(c.tensor(i), c.out(k).dtype), opmath_type(c.out(k).dtype));
}

// The reduced dimensions: argument `i` as an int list; None or [] means all.
std::vector<int64_t> reduced_dims(LoweringContext& c, size_t i, int64_t rank) {
  std::vector<int64_t> dims;
  if (rank == 0) return dims;  // a 0-d tensor's dim 0 / -1 reduces nothing
  if (c.has(i)) {
    for (int64_t d : c.ints(i)) dims.push_back(normalize_dim(d, rank));
  }
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

Value sum_over(LoweringContext& c, const std::vector<int64_t>& dims, DType acc) {
  Value x = accumulated_input(c, 0);
  return c.b.reduce(x, c.b.scalar(0, acc), dims, Binary::Add);
}

// sum.dim_IntList(self, dim, keepdim, *, dtype)
std::vector<Value> sum(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = opmath_type(c.out().dtype);
  Value s = sum_over(c, reduced_dims(c, 1, x.rank()), acc);
  return {c.b.reshape(c.b.cast(s, c.out().dtype), c.out().shape)};
}

// sum(self, *, dtype): all dimensions.
std::vector<Value> sum_all(LoweringContext& c) {
  DType acc = opmath_type(c.out().dtype);
  Value s = sum_over(c, reduced_dims(c, 99, c.tensor(0).rank()), acc);
  return {c.b.reshape(c.b.cast(s, c.out().dtype), c.out().shape)};
}

// mean.dim(self, dim, keepdim, *, dtype)
std::vector<Value> mean(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = opmath_type(c.out().dtype);
  std::vector<int64_t> dims = reduced_dims(c, 1, x.rank());
  Value s = sum_over(c, dims, acc);
  Value m = c.b.binary(Binary::Divide, s, c.b.broadcast_to(c.count(0, dims, acc), s.shape()));
  return {c.b.reshape(c.b.cast(m, c.out().dtype), c.out().shape)};
}

// mean(self, *, dtype): all dimensions.
std::vector<Value> mean_all(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = opmath_type(c.out().dtype);
  const std::vector<int64_t> dims = reduced_dims(c, 99, x.rank());
  Value s = sum_over(c, dims, acc);
  Value m = c.b.binary(Binary::Divide, s, c.b.broadcast_to(c.count(0, dims, acc), s.shape()));
  return {c.b.reshape(c.b.cast(m, c.out().dtype), c.out().shape)};
}

using stablehlo::Compare;
using stablehlo::Unary;

Value is_nan(Builder& b, const Value& x) { return b.compare(Compare::NE, x, x); }

// PyTorch's meta kernels let these through; its CPU kernels raise.
void refuse_empty(const char* op, const Value& x, const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (x.shape()[d] == 0)
      throw std::invalid_argument(std::string(op) + "(): Expected reduction dim " + std::to_string(d) +
                                  " to have non-zero size (input " + x.type.str() + ")");
}

Value extreme(Builder& b, bool is_max, const Value& l, const Value& r) {
  return is_max ? maximum(b, l, r) : minimum(b, l, r);
}

// amax / amin / max / min over `dims`, NaN-propagating.
Value reduce_extreme(Builder& b, const Value& x, const std::vector<int64_t>& dims, bool is_max) {
  Value init = is_max ? lowest(b, x.dtype()) : highest(b, x.dtype());
  return b.reduce({x}, {init}, dims, [is_max](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    return {extreme(r, is_max, a[0], a[1])};
  })[0];
}

// The extreme value of `x` along `dim` and the first index where it occurs
// (a NaN counts as the extreme). The combiner is symmetric, so XLA may
// combine partial results in any order.
std::pair<Value, Value> arg_extreme(Builder& b, Value x, int64_t dim, bool is_max) {
  if (x.rank() == 0) x = b.reshape(x, {1});
  Value index = b.iota({DType::Int64, x.shape()}, dim);
  Value init = is_max ? lowest(b, x.dtype()) : highest(b, x.dtype());
  Value no_index = b.constant_int(INT64_MAX, {DType::Int64, {}});
  auto body = [is_max](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    const Value &v = a[0], &i = a[1], &w = a[2], &j = a[3];
    Value better = r.compare(is_max ? Compare::GT : Compare::LT, v, w);
    Value equal = r.compare(Compare::EQ, v, w);
    if (stablehlo::is_float(v.dtype())) {
      Value v_nan = is_nan(r, v), w_nan = is_nan(r, w);
      better = r.binary(Binary::Or, better, r.binary(Binary::And, v_nan, r.unary(Unary::Not, w_nan)));
      equal = r.binary(Binary::Or, equal, r.binary(Binary::And, v_nan, w_nan));
    }
    Value first = r.binary(Binary::And, equal, r.compare(Compare::LT, i, j));
    Value pick = r.binary(Binary::Or, better, first);
    return {r.select(pick, v, w), r.select(pick, i, j)};
  };
  auto out = b.reduce({x, index}, {init, no_index}, {dim}, body);
  return {out[0], out[1]};
}

LoweringRule amax_amin(bool is_max) {
  return [is_max](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    return {c.b.reshape(reduce_extreme(c.b, x, reduced_dims(c, 1, x.rank()), is_max), c.out().shape)};
  };
}

// aminmax(self, *, dim=None, keepdim) and _aminmax(self[, dim, keepdim]) -> (min, max).
std::vector<Value> aminmax(LoweringContext& c) {
  const Value& x = c.tensor(0);
  if (x.type.numel() == 0) throw Declined("aminmax of an empty tensor: CPU's error");
  std::vector<int64_t> dims;
  if (c.has(1) && x.rank() > 0)
    dims.push_back(normalize_dim(c.integer(1), x.rank()));
  else
    for (int64_t d = 0; d < x.rank(); ++d) dims.push_back(d);
  return {c.b.reshape(reduce_extreme(c.b, x, dims, false), c.out(0).shape),
          c.b.reshape(reduce_extreme(c.b, x, dims, true), c.out(1).shape)};
}

// max(self) / min(self): every dimension.
LoweringRule max_min_all(bool is_max) {
  return [is_max](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    if (x.type.numel() == 0)
      throw std::invalid_argument(std::string(is_max ? "max" : "min") +
                                  "(): Expected reduction dim to be specified for input.numel() == 0.");
    return {c.b.reshape(reduce_extreme(c.b, x, reduced_dims(c, 99, x.rank()), is_max), c.out().shape)};
  };
}

// max.dim / min.dim(self, dim, keepdim) -> (values, indices)
LoweringRule max_min_dim(bool is_max) {
  return [is_max](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    int64_t dim = normalize_dim(c.integer(1), x.rank());
    if (x.rank() > 0) refuse_empty(is_max ? "max" : "min", x, {dim});
    auto [v, i] = arg_extreme(c.b, x, dim, is_max);
    return {c.b.reshape(v, c.out(0).shape), c.b.reshape(i, c.out(1).shape)};
  };
}

// argmax / argmin(self, dim=None, keepdim): None flattens.
LoweringRule arg_max_min(bool is_max) {
  return [is_max](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    if (x.dtype() == DType::Bool)
      throw std::invalid_argument(std::string(is_max ? "argmax" : "argmin") + "(): does not support bool input");
    int64_t dim = 0;
    if (c.has(1))
      dim = normalize_dim(c.integer(1), x.rank());
    else
      x = c.b.reshape(x, {x.type.numel()});
    if (x.rank() > 0) refuse_empty(is_max ? "argmax" : "argmin", x, {dim});
    return {c.b.reshape(arg_extreme(c.b, x, dim, is_max).second, c.out().shape)};
  };
}

Value prod_over(LoweringContext& c, const std::vector<int64_t>& dims) {
  DType acc = opmath_type(c.out().dtype);
  Value x = accumulated_input(c, 0);
  Value p = c.b.reduce(x, c.b.scalar(1, acc), dims, Binary::Multiply);
  return c.b.reshape(c.b.cast(p, c.out().dtype), c.out().shape);
}

// prod(self, *, dtype) and prod.dim_int(self, dim, keepdim, *, dtype).
std::vector<Value> prod_all(LoweringContext& c) { return {prod_over(c, reduced_dims(c, 99, c.tensor(0).rank()))}; }
std::vector<Value> prod_dim(LoweringContext& c) {
  int64_t rank = c.tensor(0).rank();
  return {prod_over(c, rank == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{normalize_dim(c.integer(1), rank)})};
}

// `r`, reduced over `dims` of `shape`, broadcast back to `shape`.
Value expand_back(Builder& b, const Value& r, const Shape& shape, const std::vector<int64_t>& dims) {
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept.push_back(d);
  return b.broadcast_in_dim(r, shape, kept);
}

// var.correction(self, dim=None, *, correction=None, keepdim): two-pass, in
// the accumulation type. Returns (var, mean), shaped like output `k`.
std::pair<Value, Value> var_mean_of(LoweringContext& c, size_t k) {
  const Value& x0 = c.tensor(0);
  const bool complex = stablehlo::is_complex(x0.dtype());  // var is real: the mean of |x - mean|^2
  if (!stablehlo::is_float(x0.dtype()) && !complex)
    throw std::invalid_argument("std and var only support floating point and complex dtypes (input " + x0.type.str() +
                                ")");
  std::vector<int64_t> dims = reduced_dims(c, 1, x0.rank());
  int64_t count = 1;
  for (int64_t d : dims) count *= x0.shape()[d];
  double correction = c.has(2) ? c.number(2) : 1.0;
  Value x = complex ? x0 : accumulated_input(c, 0, k);
  Value sum = c.b.reduce(x, c.b.scalar(0, x.dtype()), dims, Binary::Add);
  Value mean = c.b.binary(Binary::Divide, sum, c.b.constant(static_cast<double>(count), sum.type));
  Value d = c.b.binary(Binary::Subtract, x, expand_back(c.b, mean, x.shape(), dims));
  auto square = [&](const Value& v) { return c.b.binary(Binary::Multiply, v, v); };
  Value sq = complex ? c.b.binary(Binary::Add, square(c.b.real(d)), square(c.b.imag(d))) : square(d);
  Value ss = c.b.reduce(sq, c.b.scalar(0, sq.dtype()), dims, Binary::Add);
  // PyTorch divides by max(0, N - correction): 0 gives inf, or nan for 0/0.
  double dof = std::max(0.0, static_cast<double>(count) - correction);
  Value var = c.b.binary(Binary::Divide, ss, c.b.constant(dof, ss.type));
  return {var, mean};
}

Value as_out(LoweringContext& c, const Value& v, size_t k) {
  return c.b.reshape(c.b.cast(v, c.out(k).dtype), c.out(k).shape);
}

std::vector<Value> var(LoweringContext& c) { return {as_out(c, var_mean_of(c, 0).first, 0)}; }
std::vector<Value> stddev(LoweringContext& c) {
  return {as_out(c, c.b.unary(Unary::Sqrt, var_mean_of(c, 0).first), 0)};
}
std::vector<Value> var_mean(LoweringContext& c) {
  auto [v, m] = var_mean_of(c, 0);
  return {as_out(c, v, 0), as_out(c, m, 1)};
}
std::vector<Value> std_mean(LoweringContext& c) {
  auto [v, m] = var_mean_of(c, 0);
  return {as_out(c, c.b.unary(Unary::Sqrt, v), 0), as_out(c, m, 1)};
}

// any / all of any dtype: an element is true when it is not zero (NaN is true).
Value any_all_over(Builder& b, const Value& x, const std::vector<int64_t>& dims, bool is_any) {
  Value t = x.dtype() == DType::Bool ? x : b.compare(Compare::NE, x, b.constant(0, x.type));
  return b.reduce(t, b.constant_int(is_any ? 0 : 1, {DType::Bool, {}}), dims, is_any ? Binary::Or : Binary::And);
}

// any(self) / all(self): every dimension.
LoweringRule any_all(bool is_any) {
  return [is_any](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    return {c.b.reshape(any_all_over(c.b, x, reduced_dims(c, 99, x.rank()), is_any), c.out().shape)};
  };
}
// any.dim / all.dim(self, int dim, keepdim)
LoweringRule any_all_dim(bool is_any) {
  return [is_any](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    std::vector<int64_t> dims;
    if (x.rank() > 0) dims.push_back(normalize_dim(c.integer(1), x.rank()));
    return {c.b.reshape(any_all_over(c.b, x, dims, is_any), c.out().shape)};
  };
}
// any.dims / all.dims(self, int[]? dim=None, keepdim): None is every
// dimension, [] is none (an elementwise test), as on CPU.
LoweringRule any_all_dims(bool is_any) {
  return [is_any](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    std::vector<int64_t> dims;
    if (!c.has(1) || !c.ints(1).empty()) dims = reduced_dims(c, 1, x.rank());
    return {c.b.reshape(any_all_over(c.b, x, dims, is_any), c.out().shape)};
  };
}

// An explicit dim=() where PyTorch's kernels disagree on what it means: an
// error rather than an answer that differs from CPU.
void refuse_empty_dim_list(LoweringContext& c, const char* op, const char* cpu) {
  if (c.has(1) && c.ints(1).empty() && c.tensor(0).rank() > 0)
    throw std::invalid_argument(std::string("torch_tpu: ") + op + " with dim=() is " + cpu +
                                "; pass the dimensions to reduce, or dim=None for all of them");
}

// logsumexp(self, dim, keepdim): shifted by the max, which counts as 0 when
// it is infinite (all -inf, or an +inf) so no inf - inf appears.
std::vector<Value> logsumexp(LoweringContext& c) {
  refuse_empty_dim_list(c, "logsumexp", "an error on CPU");
  DType acc = opmath_type(c.out().dtype);
  Value x = accumulated_input(c, 0);
  std::vector<int64_t> dims = reduced_dims(c, 1, x.rank());
  // Complex numbers shift by the largest real part, as CPU does.
  const bool complex = stablehlo::is_complex(x.dtype());
  Value m = reduce_extreme(c.b, complex ? c.b.real(x) : x, dims, true);
  m = c.b.cast(c.b.select(c.b.unary(Unary::IsFinite, m), m, c.b.constant(0, m.type)), x.dtype());
  Value e = c.b.unary(Unary::Exp, c.b.binary(Binary::Subtract, x, expand_back(c.b, m, x.shape(), dims)));
  Value s = c.b.reduce(e, c.b.scalar(0, acc), dims, Binary::Add);
  return {as_out(c, c.b.binary(Binary::Add, c.b.unary(Unary::Log, s), m), 0)};
}

// nansum(self, dim=None, keepdim, *, dtype): NaN counts as zero.
std::vector<Value> nansum(LoweringContext& c) {
  refuse_empty_dim_list(c, "nansum", "a full reduction on CPU but no reduction for PyTorch's meta kernel");
  DType acc = opmath_type(c.out().dtype);
  Value x = accumulated_input(c, 0);
  if (stablehlo::is_float(acc)) x = c.b.select(is_nan(c.b, x), c.b.constant(0, x.type), x);
  Value s = c.b.reduce(x, c.b.scalar(0, acc), reduced_dims(c, 1, x.rank()), Binary::Add);
  return {as_out(c, s, 0)};
}

// linalg_vector_norm(self, ord=2, dim=None, keepdim, *, dtype): in the
// accumulation type of the output dtype. inf / -inf are max / min of |x|
// (NaN-propagating), 0 counts the nonzeros, p is (sum |x|^p)^(1/p).
std::vector<Value> vector_norm(LoweringContext& c) {
  const Value& x0 = c.tensor(0);
  const bool complex = stablehlo::is_complex(x0.dtype());  // the norm of |x|
  if (!stablehlo::is_float(x0.dtype()) && !complex) throw Declined("linalg_vector_norm: non-float input");
  DType acc = opmath_type(c.out().dtype);
  std::vector<int64_t> dims = reduced_dims(c, 2, x0.rank());
  double ord = c.has(1) ? c.number(1) : 2.0;  // norm's p=None is 2
  Value x = complex ? c.b.cast(c.b.unary(Unary::Abs, x0), acc) : accumulated_input(c, 0);
  Value a = c.b.unary(Unary::Abs, x);
  Value r;
  if (std::isinf(ord)) {
    r = reduce_extreme(c.b, a, dims, ord > 0);
  } else if (ord == 0) {
    Value nz = c.b.convert(c.b.compare(Compare::NE, x, c.b.constant(0, x.type)), acc);
    r = c.b.reduce(nz, c.b.scalar(0, acc), dims, Binary::Add);
  } else if (ord == 1) {
    r = c.b.reduce(a, c.b.scalar(0, acc), dims, Binary::Add);
  } else if (ord == 2) {
    r = c.b.unary(Unary::Sqrt, c.b.reduce(c.b.binary(Binary::Multiply, x, x), c.b.scalar(0, acc), dims, Binary::Add));
  } else {
    Value s =
        c.b.reduce(c.b.binary(Binary::Power, a, c.b.constant(ord, a.type)), c.b.scalar(0, acc), dims, Binary::Add);
    r = c.b.binary(Binary::Power, s, c.b.constant(1.0 / ord, s.type));
  }
  return {as_out(c, r, 0)};
}

// histc(self, bins, min, max): counts of the elements in `bins` equal-width
// bins over [min, max]; elements outside (and NaN) are not counted, max falls
// in the last bin. min == max takes the data's range (widened by 1 each side
// when that is a single value), as PyTorch does. Float inputs compute the bin
// as PyTorch's CPU kernel does, (x - min) * bins / (max - min) truncated,
// without its correction for values within rounding of an inner bin edge;
// integer inputs compute it in integers, as CUDA does.
std::vector<Value> histc(LoweringContext& c) {
  const int64_t bins = c.integer(1);
  const Value& x0 = c.tensor(0);
  const bool is_float = stablehlo::is_float(x0.dtype());
  const DType t = is_float ? opmath_type(x0.dtype()) : DType::Int64;
  const TensorType scalar{t, {}};
  Value x = c.b.reshape(c.b.cast(x0, t), {x0.type.numel()});
  Value lo = c.b.constant(c.number(2), scalar), hi = c.b.constant(c.number(3), scalar);
  if (c.number(2) == c.number(3)) {
    if (x0.type.numel() == 0) return {c.b.constant(0, c.out())};  // no values: empty bins, as on CPU
    lo = c.b.reduce(x, highest(c.b, t), {0}, Binary::Minimum);
    hi = c.b.reduce(x, lowest(c.b, t), {0}, Binary::Maximum);
    Value same = c.b.compare(Compare::EQ, lo, hi), one = c.b.constant(1, scalar);
    lo = c.b.select(same, c.b.binary(Binary::Subtract, lo, one), lo);
    hi = c.b.select(same, c.b.binary(Binary::Add, hi, one), hi);
  }
  const Shape n = x.shape();
  Value lo_n = c.b.broadcast_to(lo, n), hi_n = c.b.broadcast_to(hi, n);
  Value valid = c.b.binary(Binary::And, c.b.compare(Compare::GE, x, lo_n), c.b.compare(Compare::LE, x, hi_n));
  Value scaled = c.b.binary(Binary::Divide,
                            c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, x, lo_n),
                                       c.b.constant(static_cast<double>(bins), {t, n})),
                            c.b.binary(Binary::Subtract, hi_n, lo_n));
  Value bin = c.b.cast(scaled, DType::Int64);
  // max itself, and invalid elements (counted as 0 in bin 0), stay in range.
  Value last = c.b.constant(static_cast<double>(bins - 1), {DType::Int64, n}), zero = c.b.constant(0, bin.type);
  bin = c.b.select(valid, c.b.clamp(zero, bin, last), zero);
  const TensorType& out = c.out();
  Value ones = c.b.convert(valid, out.dtype);
  stablehlo::ScatterDims dims;
  dims.inserted_window_dims = {0};
  dims.scatter_dims_to_operand_dims = {0};
  dims.index_vector_dim = 1;
  return {c.b.scatter(c.b.constant(0, out), c.b.reshape(bin, {n[0], 1}), ones, dims, stablehlo::ScatterCombine::Add)};
}

// segment_reduce(data, reduce, *, lengths?, indices?, offsets?, axis=0,
// unsafe=False, initial?): data reduced per segment of consecutive rows along
// `axis`, with lengths (or offsets) of shape data.shape[:axis] + [segments]:
// each row scattered into its segment. Empty segments get `initial`, else sum
// 0, prod 1, max -inf, min inf, mean NaN; NaN propagates, as on CPU.
std::vector<Value> segment_reduce(LoweringContext& c) {
  const std::string reduce = c.string(1);
  if (c.has(3) || !(c.has(2) || c.has(4))) throw Declined("segment_reduce: indices");
  const Value& data0 = c.tensor(0);
  const TensorType& o = c.out();
  if (data0.rank() == 0) throw Declined("segment_reduce: 0-d data");
  if (o.numel() == 0) return {c.b.constant(0, o)};
  const int64_t axis = normalize_dim(c.has(5) ? c.integer(5) : 0, data0.rank());
  const int64_t n = data0.shape()[axis], segments = o.shape[axis];
  Value lengths;
  if (c.has(2)) {
    lengths = c.b.cast(c.tensor(2), DType::Int64);
  } else {
    Value off = c.b.cast(c.tensor(4), DType::Int64);
    if (off.rank() != axis + 1) throw Declined("segment_reduce: offsets of another rank than axis + 1");
    std::vector<int64_t> start(off.rank(), 0), limit = off.shape(), unit(off.rank(), 1);
    start[axis] = 1;
    Value upper = c.b.slice(off, start, limit, unit);
    start[axis] = 0;
    limit[axis] = segments;
    lengths = c.b.binary(Binary::Subtract, upper, c.b.slice(off, start, limit, unit));
  }
  if (lengths.rank() != axis + 1) throw Declined("segment_reduce: lengths of another rank than axis + 1");
  std::vector<int64_t> batch(data0.shape().begin(), data0.shape().begin() + axis), leading;
  for (int64_t d = 0; d < axis; ++d) leading.push_back(d);
  Value ends = scan(c.b, lengths, axis, Binary::Add, 0);  // batch + [S]
  if (!(c.has(6) && c.args[6].b)) {
    std::vector<int64_t> start(axis + 1, 0), limit = ends.shape(), unit(axis + 1, 1);
    start[axis] = segments - 1;
    Value total = c.b.slice(ends, start, limit, unit);
    std::vector<int64_t> all(axis + 1);
    std::iota(all.begin(), all.end(), 0);
    c.checks.push_back(
        {c.b.reduce(c.b.compare(Compare::EQ, total, c.b.constant_int(n, total.type)), c.b.scalar(1, DType::Bool), all,
                    Binary::And),
         "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) "
         "when !unsafe.",
         false});
  }
  // Each row's segment: how many segments end at or before it (batch + [n]).
  Shape pair = batch;
  pair.push_back(n);
  pair.push_back(segments);
  std::vector<int64_t> ends_dims = leading;
  ends_dims.push_back(axis + 1);
  Value ended =
      c.b.compare(Compare::LE, c.b.broadcast_in_dim(ends, pair, ends_dims), c.b.iota({DType::Int64, pair}, axis));
  Value segment = c.b.reduce(c.b.convert(ended, DType::Int64), c.b.scalar(0, DType::Int64), {axis + 1}, Binary::Add);
  // Scatter coordinates batch + [n, axis + 1]: the row's batch position, then its segment.
  Shape column = batch;
  column.push_back(n);
  column.push_back(1);
  std::vector<Value> coordinates;
  for (int64_t d = 0; d < axis; ++d) coordinates.push_back(c.b.iota({DType::Int64, column}, d));
  coordinates.push_back(c.b.reshape(segment, column));
  Value index = c.b.concatenate(coordinates, axis + 1);
  const DType t = o.dtype;
  Value data = c.b.cast(data0, t);
  stablehlo::ScatterDims dims;
  for (int64_t d = axis + 1; d < data.rank(); ++d) dims.update_window_dims.push_back(d);
  for (int64_t d = 0; d <= axis; ++d) dims.inserted_window_dims.push_back(d);
  dims.scatter_dims_to_operand_dims = dims.inserted_window_dims;
  dims.index_vector_dim = axis + 1;
  auto scatter = [&](const Value& init, const Value& updates, stablehlo::ScatterCombine combine) {
    return n == 0 ? init : c.b.scatter(init, index, updates, dims, combine);
  };
  const bool has_initial = c.has(7);
  auto initial = [&] { return c.b.constant(c.number(7), o); };
  Value r;
  if (reduce == "sum" || reduce == "mean") {
    r = scatter(has_initial ? initial() : c.b.constant(0, o), data, stablehlo::ScatterCombine::Add);
    if (reduce == "mean") {
      std::vector<int64_t> count_dims = leading;
      count_dims.push_back(axis);
      Value count = c.b.broadcast_in_dim(c.b.convert(lengths, t), o.shape, count_dims);
      Value mean = c.b.binary(Binary::Divide, r, count);
      r = has_initial ? c.b.select(c.b.compare(Compare::EQ, count, c.b.constant(0, o)), initial(), mean) : mean;
    }
  } else if (reduce == "prod") {
    r = scatter(has_initial ? initial() : c.b.constant(1, o), data, stablehlo::ScatterCombine::Multiply);
  } else if (reduce == "max" || reduce == "min") {
    const bool max = reduce == "max";
    Value init = has_initial ? initial() : c.b.broadcast_in_dim(max ? lowest(c.b, t) : highest(c.b, t), o.shape, {});
    r = scatter(init, data, max ? stablehlo::ScatterCombine::Maximum : stablehlo::ScatterCombine::Minimum);
  } else {
    throw Declined("segment_reduce: reduce=" + reduce);
  }
  if (stablehlo::is_float(t)) {  // a NaN row makes its segment NaN (XLA's max / min may drop it)
    Value nan_rows = c.b.convert(c.b.compare(Compare::NE, data, data), DType::Int32);
    Value nans = scatter(c.b.constant(0, {DType::Int32, o.shape}), nan_rows, stablehlo::ScatterCombine::Add);
    r = c.b.select(c.b.compare(Compare::GT, nans, c.b.constant(0, nans.type)), c.b.constant(NAN, o), r);
  }
  return {r};
}

// hash_tensor(self, dim=[], *, keepdim=False, mode=0): the XOR of the values
// widened to float64 (floats) or 64-bit integers and read as uint64 bits.
std::vector<Value> hash_tensor(LoweringContext& c) {
  if (c.has(3) && c.integer(3) != 0) throw Declined("hash_tensor: a mode other than 0 (xor)");
  const Value& x = c.tensor(0);
  const DType t = x.dtype();
  if (stablehlo::is_complex(t)) throw Declined("hash_tensor: complex values");
  const DType wide = stablehlo::is_float(t)          ? DType::Float64
                     : stablehlo::is_unsigned_int(t) ? DType::UInt64
                                                     : DType::Int64;
  Value bits = c.b.bitcast_convert(c.b.convert(x, wide), {DType::UInt64, x.shape()});
  Value r = c.b.reduce(bits, c.b.scalar(0, DType::UInt64), reduced_dims(c, 1, x.rank()), Binary::Xor);
  return {c.b.reshape(r, c.out().shape)};
}

}  // namespace

// count_nonzero.dim_IntList(self, dim) / count_nonzero(self, dim?): int64 counts.
std::vector<Value> count_nonzero(LoweringContext& c) {
  const Value& x = c.tensor(0);
  std::vector<int64_t> dims;
  if (c.has(1) && c.args[1].kind == LoweringArg::Int) {
    if (x.rank() > 0) dims.push_back(normalize_dim(c.integer(1), x.rank()));
  } else
    dims = reduced_dims(c, 1, x.rank());
  Value nonzero = c.b.convert(c.b.compare(stablehlo::Compare::NE, x, c.b.constant(0, x.type)), DType::Int64);
  return {c.b.reshape(c.b.reduce(nonzero, c.b.scalar(0, DType::Int64), dims, Binary::Add), c.out().shape)};
}

// trace(self): the sum of a matrix's diagonal, accumulated as sum is.
std::vector<Value> trace(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = opmath_type(c.out().dtype);
  Value diagonal = c.b.compare(stablehlo::Compare::EQ, c.b.iota({DType::Int64, x.shape()}, 0),
                               c.b.iota({DType::Int64, x.shape()}, 1));
  Value kept = c.b.select(diagonal, accumulated_input(c, 0), c.b.constant(0, {acc, x.shape()}));
  return {c.b.cast(c.b.reduce(kept, c.b.scalar(0, acc), {0, 1}, Binary::Add), c.out().dtype)};
}

// renorm(self, p, dim, maxnorm): each slice along dim whose p-norm exceeds
// maxnorm scaled to maxnorm / (norm + 1e-7), as CPU does.
std::vector<Value> renorm(LoweringContext& c) {
  const DType acc = opmath_type(c.out().dtype);
  Value x = c.b.cast(c.tensor(0), acc);
  const double p = c.number(1), maxnorm = c.number(3);
  const int64_t dim = normalize_dim(c.integer(2), x.rank());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) others.push_back(d);
  auto k = [&](double v, const Value& like) { return c.b.constant(v, like.type); };
  Value a = c.b.unary(stablehlo::Unary::Abs, x), norm;
  if (std::isinf(p)) {
    norm = c.b.reduce(a, c.b.scalar(0, acc), others, Binary::Maximum);
  } else {
    Value powered = p == 1 ? a : p == 2 ? c.b.binary(Binary::Multiply, a, a) : c.b.binary(Binary::Power, a, k(p, a));
    norm = c.b.reduce(powered, c.b.scalar(0, acc), others, Binary::Add);
    if (p == 2)
      norm = c.b.unary(stablehlo::Unary::Sqrt, norm);
    else if (p != 1)
      norm = c.b.binary(Binary::Power, norm, k(1.0 / p, norm));
  }
  Value factor = c.b.select(c.b.compare(stablehlo::Compare::GT, norm, k(maxnorm, norm)),
                            c.b.binary(Binary::Divide, k(maxnorm, norm), c.b.binary(Binary::Add, norm, k(1e-7, norm))),
                            k(1, norm));
  if (x.rank() == 0) return {c.b.cast(c.b.binary(Binary::Multiply, x, factor), c.out().dtype)};
  Value scaled = c.b.binary(Binary::Multiply, x, c.b.broadcast_in_dim(factor, x.shape(), {dim}));
  return {c.b.cast(scaled, c.out().dtype)};
}

LOWERING("aten::sum.dim_IntList", sum);
LOWERING("aten::renorm", renorm);
LOWERING("aten::count_nonzero.dim_IntList", count_nonzero);
LOWERING("aten::count_nonzero", count_nonzero);
LOWERING("aten::trace", trace);
LOWERING("aten::hash_tensor", hash_tensor);
LOWERING("aten::sum", sum_all);
LOWERING("aten::mean.dim", mean);
LOWERING("aten::mean", mean_all);
LOWERING("aten::amax", amax_amin(true));
LOWERING("aten::aminmax", aminmax);
LOWERING("aten::_aminmax", aminmax);
LOWERING("aten::_aminmax.dim", aminmax);
LOWERING("aten::amin", amax_amin(false));
LOWERING("aten::max", max_min_all(true));
LOWERING("aten::min", max_min_all(false));
LOWERING("aten::max.dim", max_min_dim(true));
LOWERING("aten::min.dim", max_min_dim(false));
LOWERING("aten::argmax", arg_max_min(true));
LOWERING("aten::argmin", arg_max_min(false));
LOWERING("aten::prod", prod_all);
LOWERING("aten::prod.dim_int", prod_dim);
LOWERING("aten::var.correction", var);
LOWERING("aten::std.correction", stddev);
LOWERING("aten::var_mean.correction", var_mean);
LOWERING("aten::std_mean.correction", std_mean);
LOWERING("aten::any", any_all(true));
LOWERING("aten::all", any_all(false));
LOWERING("aten::any.dim", any_all_dim(true));
LOWERING("aten::all.dim", any_all_dim(false));
LOWERING("aten::any.dims", any_all_dims(true));
LOWERING("aten::all.dims", any_all_dims(false));
LOWERING("aten::logsumexp", logsumexp);
LOWERING("aten::nansum", nansum);
LOWERING("aten::linalg_vector_norm", vector_norm);
// torch.norm's overloads with linalg_vector_norm's argument positions (self, p, dim, keepdim, dtype).
LOWERING("aten::norm.Scalar", vector_norm);
LOWERING("aten::norm.ScalarOpt_dim", vector_norm);
LOWERING("aten::norm.ScalarOpt_dim_dtype", vector_norm);
LOWERING("aten::histc", histc);
LOWERING("aten::segment_reduce", in_float32(segment_reduce, Operands::Indices));

}  // namespace torch_tpu::lowering
