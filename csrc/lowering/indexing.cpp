// Indexing: index_select, gather, scatter and its reductions, advanced
// indexing (index, index_put), masked_fill, index_fill, embedding and its
// backward. Each lowers to one stablehlo.gather or scatter over int64
// coordinates.
//
// Out-of-range indices: XLA clamps a gather's indices and drops a scatter's
// out-of-range updates, so every rule also computes a range check on the
// device (LoweringContext::check_indices): an IndexError at the op in Debug
// mode, at the next sync or host read in Strict mode, as CUDA reports its
// device-side asserts. Negative indices are wrapped where PyTorch wraps them (index, index_put,
// index_fill); where PyTorch refuses them (index_select, gather, scatter,
// embedding) they are out of range like any other.
#include <algorithm>
#include <cmath>
#include <optional>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::GatherDims;
using stablehlo::ScatterCombine;
using stablehlo::ScatterDims;

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// An index tensor as int64, negative entries counted from the end of a
// dimension of `size` (x[-1]).
Value wrap_negative(Builder& b, const Value& index, int64_t size) {
  Value i = b.cast(index, DType::Int64);
  Value negative = b.compare(Compare::LT, i, b.constant_int(0, i.type));
  return b.select(negative, b.binary(Binary::Add, i, b.constant_int(size, i.type)), i);
}

// `index` with a trailing dimension of 1 appended.
Value as_column(Builder& b, const Value& index) {
  Shape s = index.shape();
  s.push_back(1);
  return b.reshape(index, s);
}

// ---------------------------------------------------------- along one dim

}  // namespace

// x.shape[:dim] + index.shape + x.shape[dim+1:]: the rows of `dim` picked by `index`.
Value take_along(Builder& b, const Value& x, int64_t dim, const Value& index) {
  const int64_t r = x.rank(), n = index.rank();
  GatherDims g;
  g.offset_dims = range(0, dim);
  for (int64_t d = dim + n; d < r - 1 + n; ++d) g.offset_dims.push_back(d);
  g.collapsed_slice_dims = {dim};
  g.start_index_map = {dim};
  g.index_vector_dim = n;
  Shape sizes = x.shape();
  sizes[dim] = 1;
  return b.gather(x, b.cast(index, DType::Int64), g, sizes);
}

Value gather_along(Builder& b, const Value& x, int64_t dim, const Value& index) {
  const int64_t r = x.rank();
  GatherDims g;
  for (int64_t d = 0; d < r; ++d)
    if (d != dim) g.operand_batching_dims.push_back(d), g.start_indices_batching_dims.push_back(d);
  g.collapsed_slice_dims = {dim};
  g.start_index_map = {dim};
  g.index_vector_dim = r;
  Shape column = index.shape();
  column.push_back(1);
  return b.gather(x, b.reshape(b.cast(index, DType::Int64), column), g, std::vector<int64_t>(r, 1));
}

namespace {

// index_select(self, dim, index)
std::vector<Value> index_select(LoweringContext& c) {
  Value x = c.tensor(0);
  if (c.out().numel() == 0) {
    // CPU checks an empty tensor's indices all the same (rank > 1), as RuntimeError.
    const int64_t n = c.tensor(2).type.numel();
    if (x.rank() > 1 && n > 0 && x.type.numel() == 0) {
      const int64_t dim = normalize_dim(c.integer(1), x.rank()), size = x.shape()[dim];
      if (size == 0) throw std::runtime_error("index_select(): self indexing axis dim should be positive");
      c.check_indices(c.b.reshape(c.tensor(2), {n}), size, false,
                      "INDICES element is out of DATA bounds, axis_dim=" + std::to_string(size) +
                          " (index_select of a tensor without elements)",
                      /*index_error=*/false);
    }
    return {c.b.constant(0, c.out())};
  }
  if (x.rank() == 0) x = c.b.reshape(x, {1});
  Value index = c.b.reshape(c.tensor(2), {c.tensor(2).type.numel()});
  int64_t dim = normalize_dim(c.integer(1), x.rank());
  // CPU's kernel for dim 1 of a matrix has its own check, a RuntimeError.
  if (x.rank() == 2 && dim == 1)
    c.check_indices(index, x.shape()[dim], false,
                    "INDICES element is out of DATA bounds, axis_dim=" + std::to_string(x.shape()[dim]),
                    /*index_error=*/false);
  else
    c.check_indices(index, x.shape()[dim], false, "index out of range in self");
  return {c.b.reshape(take_along(c.b, x, dim, index), c.out().shape)};
}

// take(self, index): self's elements in row-major order, picked by `index`
// (negative counts from the end), in index's shape.
std::vector<Value> take(LoweringContext& c) {
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  const int64_t n = c.tensor(0).type.numel();
  Value flat = c.b.reshape(c.tensor(0), {n});
  Value index = c.b.cast(c.tensor(1), DType::Int64);
  c.check_indices(
      index, n, true,
      "out of range: tried to access an index outside a tensor of " + std::to_string(n) + " elements (in take)");
  Value wrapped = c.b.select(c.b.compare(stablehlo::Compare::LT, index, c.b.constant(0, index.type)),
                             c.b.binary(stablehlo::Binary::Add, index, c.b.constant(n, index.type)), index);
  return {c.b.reshape(c.b.gather_1d(flat, wrapped), c.out().shape)};
}

// put(self, index, source, accumulate): take's inverse, self's elements in
// row-major order written (or added) at `index`; take's gradient.
std::vector<Value> put(LoweringContext& c) {
  const int64_t n = c.tensor(0).type.numel(), m = c.tensor(1).type.numel();
  Value flat = c.b.reshape(c.b.cast(c.tensor(0), c.out().dtype), {n});
  if (m == 0) return {c.b.reshape(flat, c.out().shape)};
  Value index = c.b.reshape(c.b.cast(c.tensor(1), DType::Int64), {m});
  c.check_indices(
      index, n, true,
      "out of range: tried to access an index outside a tensor of " + std::to_string(n) + " elements (in put_)");
  index = c.b.select(c.b.compare(stablehlo::Compare::LT, index, c.b.constant(0, index.type)),
                     c.b.binary(stablehlo::Binary::Add, index, c.b.constant(n, index.type)), index);
  Value source = c.b.reshape(c.b.cast(c.tensor(2), c.out().dtype), {m});
  if (!(c.has(3) && c.args[3].b)) return {c.b.reshape(c.b.scatter_1d(flat, index, source), c.out().shape)};
  ScatterDims dims;
  dims.inserted_window_dims = {0};
  dims.scatter_dims_to_operand_dims = {0};
  dims.index_vector_dim = 1;
  return {c.b.reshape(c.b.scatter(flat, c.b.reshape(index, {m, 1}), source, dims, ScatterCombine::Add), c.out().shape)};
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): rows of weight.
std::vector<Value> embedding(LoweringContext& c) {
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  c.check_indices(c.tensor(1), c.tensor(0).shape()[0], false, "index out of range in self");
  return {take_along(c.b, c.tensor(0), 0, c.tensor(1))};
}

// The coordinates of every element of `index` in a tensor of rank `rank`,
// with `index` giving the coordinate along `dim`: [index.shape..., rank].
Value coordinates(Builder& b, const Value& index, int64_t dim, int64_t rank) {
  std::vector<Value> parts;
  TensorType type{DType::Int64, index.shape()};
  for (int64_t d = 0; d < rank; ++d)
    parts.push_back(as_column(b, d == dim ? b.cast(index, DType::Int64) : b.iota(type, d)));
  return b.concatenate(parts, index.rank());
}

GatherDims pointwise_gather(int64_t rank) {
  GatherDims g;
  g.collapsed_slice_dims = range(0, rank);
  g.start_index_map = range(0, rank);
  g.index_vector_dim = rank;
  return g;
}

ScatterDims pointwise_scatter(int64_t rank) {
  ScatterDims s;
  s.inserted_window_dims = range(0, rank);
  s.scatter_dims_to_operand_dims = range(0, rank);
  s.index_vector_dim = rank;
  return s;
}

// self and index as tensors of rank >= 1 (a 0-d self is a 1-element vector).
std::pair<Value, Value> at_least_1d(Builder& b, const Value& self, const Value& index) {
  if (self.rank() > 0) return {self, index};
  return {b.reshape(self, {1}), b.reshape(index, {index.type.numel()})};
}

// gather(self, dim, index, *, sparse_grad): out[i][j] = self[index[i][j]][j] (dim 0).
std::vector<Value> gather(LoweringContext& c) {
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  auto [x, index] = at_least_1d(c.b, c.tensor(0), c.tensor(2));
  int64_t dim = normalize_dim(c.integer(1), x.rank());
  c.check_indices(index, x.shape()[dim], false,
                  "gather: index out of bounds for dimension " + std::to_string(dim) + " with size " +
                      std::to_string(x.shape()[dim]),
                  /*index_error=*/false);
  Value coords = coordinates(c.b, index, dim, x.rank());
  Value g = c.b.gather(x, coords, pointwise_gather(x.rank()), std::vector<int64_t>(x.rank(), 1));
  return {c.b.reshape(g, c.out().shape)};
}

// The value every reduction leaves unchanged: 0 for sums, 1 for products,
// the lowest (highest) value of the dtype for maxima (minima).
Value identity(Builder& b, ScatterCombine combine, const TensorType& type) {
  switch (combine) {
    case ScatterCombine::Add: return b.constant(0, type);
    case ScatterCombine::Multiply: return b.constant(1, type);
    default: break;
  }
  Value v = combine == ScatterCombine::Minimum ? highest(b, type.dtype) : lowest(b, type.dtype);
  return b.broadcast_to(v, type.shape);
}

// self with src (argument 3, a tensor cut to index's shape, or a Scalar)
// combined in at the positions index gives along dim. Without include_self,
// the positions written start from the reduction's identity.
Value scatter_along(LoweringContext& c, ScatterCombine combine, bool include_self = true) {
  const TensorType& out = c.out();
  auto [x, index] = at_least_1d(c.b, c.b.cast(c.tensor(0), out.dtype), c.tensor(2));
  if (index.type.numel() == 0) return c.tensor(0);
  const int64_t r = x.rank();
  int64_t dim = normalize_dim(c.integer(1), r);
  Value updates;
  TensorType update_type{out.dtype, index.shape()};
  if (c.args[3].kind == LoweringArg::Tensor) {
    Value src = c.b.cast(c.tensor(3), out.dtype);
    if (src.rank() == 0) src = c.b.reshape(src, Shape(r, 1));
    updates = src.shape() == index.shape()
                  ? src
                  : c.b.slice(src, std::vector<int64_t>(r, 0), index.shape(), std::vector<int64_t>(r, 1));
  } else {
    updates = c.value_as(3, update_type);
  }
  c.check_indices(index, x.shape()[dim], false,
                  "scatter: index out of bounds for dimension " + std::to_string(dim) + " with size " +
                      std::to_string(x.shape()[dim]),
                  /*index_error=*/false);
  Value coords = coordinates(c.b, index, dim, r);
  if (!include_self) {
    TensorType flags{DType::Bool, x.shape()};
    Value written = c.b.scatter(c.b.constant(0, flags), coords, c.b.constant(1, {DType::Bool, index.shape()}),
                                pointwise_scatter(r), ScatterCombine::Replace);
    x = c.b.select(written, c.b.broadcast_to(identity(c.b, combine, {out.dtype, {}}), x.shape()), x);
  }
  return c.b.reshape(c.b.scatter(x, coords, updates, pointwise_scatter(r), combine), out.shape);
}

LoweringRule scatter_with(ScatterCombine combine) {
  return [combine](LoweringContext& c) -> std::vector<Value> { return {scatter_along(c, combine)}; };
}

// scatter.reduce / scatter.value_reduce(self, dim, index, src, *, reduce): "add" | "multiply".
std::vector<Value> scatter_reduce_legacy(LoweringContext& c) {
  std::string reduce = c.string(4);
  if (reduce == "add") return {scatter_along(c, ScatterCombine::Add)};
  if (reduce == "multiply") return {scatter_along(c, ScatterCombine::Multiply)};
  throw std::invalid_argument("scatter: reduce argument must be either add or multiply, got " + reduce);
}

// scatter_reduce.two(self, dim, index, src, reduce, *, include_self)
std::vector<Value> scatter_reduce(LoweringContext& c) {
  std::string reduce = c.string(4);
  bool include_self = !c.has(5) || c.args[5].b;
  if (reduce == "sum") return {scatter_along(c, ScatterCombine::Add, include_self)};
  if (reduce == "prod") return {scatter_along(c, ScatterCombine::Multiply, include_self)};
  if (reduce == "amax") return {scatter_along(c, ScatterCombine::Maximum, include_self)};
  if (reduce == "amin") return {scatter_along(c, ScatterCombine::Minimum, include_self)};
  if (reduce != "mean")
    throw std::invalid_argument("reduce argument must be either sum, prod, mean, amax or amin, got " + reduce);
  // mean: the sum over self (if included) and the scattered values, divided
  // by their count (at least 1); integers floor-divided, as CPU.
  Value sum = scatter_along(c, ScatterCombine::Add, include_self);
  const TensorType& out = c.out();
  auto [ones, index] = at_least_1d(c.b, c.b.constant(include_self ? 1 : 0, out), c.tensor(2));
  if (index.type.numel() == 0) return {sum};
  const int64_t dim = normalize_dim(c.integer(1), ones.rank());
  Value counts =
      c.b.scatter(ones, coordinates(c.b, index, dim, ones.rank()), c.b.constant(1, {out.dtype, index.shape()}),
                  pointwise_scatter(ones.rank()), ScatterCombine::Add);
  counts = c.b.reshape(counts, out.shape);
  counts = c.b.select(c.b.compare(stablehlo::Compare::LT, counts, c.b.constant(1, out)), c.b.constant(1, out), counts);
  Value mean = c.b.binary(stablehlo::Binary::Divide, sum, counts);
  if (!stablehlo::is_float(out.dtype) && !stablehlo::is_complex(out.dtype)) {
    // Floor: truncation is one less where the signs differ and it is inexact.
    Value zero = c.b.constant(0, out);
    Value inexact = c.b.compare(stablehlo::Compare::NE, c.b.binary(stablehlo::Binary::Remainder, sum, counts), zero);
    Value negative = c.b.compare(stablehlo::Compare::LT, sum, zero);
    mean = c.b.select(c.b.binary(stablehlo::Binary::And, inexact, negative),
                      c.b.binary(stablehlo::Binary::Subtract, mean, c.b.constant(1, out)), mean);
  }
  return {mean};
}

// index_copy(self, dim, index, source) and index_add(self, dim, index,
// source, *, alpha): slice k of source along dim written into (added to)
// slice index[k] of self. One scatter, source's own dims as the window.
LoweringRule index_write(ScatterCombine combine) {
  return [combine](LoweringContext& c) -> std::vector<Value> {
    const TensorType& out = c.out();
    Value x = c.b.cast(c.tensor(0), out.dtype), src = c.b.cast(c.tensor(3), out.dtype);
    if (x.rank() == 0) x = c.b.reshape(x, {1});
    if (src.rank() == 0) src = c.b.reshape(src, {1});
    const int64_t dim = normalize_dim(c.integer(1), x.rank()), size = x.shape()[dim];
    const Value& index = c.tensor(2);
    if (index.type.numel() == 0 || out.numel() == 0) return {c.tensor(0)};
    auto column = [&](const Value& v) { return c.b.reshape(c.b.cast(v, DType::Int64), {index.type.numel(), 1}); };
    Value i = column(index);
    // A padded index's padding (pointed past self by the bounded rule, so the scatter skips it) is not checked.
    c.check_indices(column(c.masked(2, c.b.scalar(0, index.dtype()))), size, false,
                    "index_copy/index_add: index out of range for dimension " + std::to_string(dim) + " with size " +
                        std::to_string(size),
                    // CPU: IndexError for index_copy, for a 1-D index_add, one along a middle dim
                    // and one with an int32 index; RuntimeError (its scatter_add path) for an N-D
                    // index_add along the first or last dim with an int64 index
                    /*index_error=*/combine != ScatterCombine::Add || c.tensor(0).rank() <= 1 ||
                        (dim != 0 && dim != c.tensor(0).rank() - 1) || index.dtype() != DType::Int64);
    if (combine == ScatterCombine::Add && c.has(4) && !c.is_number(4, 1))
      src = c.b.binary(Binary::Multiply, src, c.value_as(4, src.type));
    ScatterDims dims;
    for (int64_t d = 0; d < src.rank(); ++d)
      if (d != dim) dims.update_window_dims.push_back(d);
    dims.inserted_window_dims = {dim};
    dims.scatter_dims_to_operand_dims = {dim};
    dims.index_vector_dim = 1;
    return {c.b.reshape(c.b.scatter(x, i, src, dims, combine), out.shape)};
  };
}

// index_reduce(self, dim, index, source, reduce, include_self): source's
// slices combined into self's rows at `index` by prod / mean / amax / amin;
// without include_self an indexed row starts from the reduction's identity
// (mean: from zero, counting only the sources).
std::vector<Value> index_reduce(LoweringContext& c) {
  const TensorType& out = c.out();
  Value x = c.b.cast(c.tensor(0), out.dtype), src = c.b.cast(c.tensor(3), out.dtype);
  if (x.rank() == 0) x = c.b.reshape(x, {1});
  if (src.rank() == 0) src = c.b.reshape(src, {1});
  const int64_t dim = normalize_dim(c.integer(1), x.rank()), size = x.shape()[dim];
  const Value& index = c.tensor(2);
  if (index.type.numel() == 0 || out.numel() == 0) return {c.tensor(0)};
  const std::string reduce = c.string(4);
  const bool include_self = !c.has(5) || c.args[5].b;
  Value i = c.b.reshape(c.b.cast(index, DType::Int64), {index.type.numel(), 1});
  c.check_indices(i, size, false, "index_reduce: index out of range for dimension " + std::to_string(dim),
                  /*index_error=*/false);
  ScatterDims dims;
  for (int64_t d = 0; d < src.rank(); ++d)
    if (d != dim) dims.update_window_dims.push_back(d);
  dims.inserted_window_dims = {dim};
  dims.scatter_dims_to_operand_dims = {dim};
  dims.index_vector_dim = 1;
  auto scatter = [&](const Value& into, const Value& updates, ScatterCombine combine) {
    return c.b.scatter(into, i, updates, dims, combine);
  };
  auto fill_indexed = [&](const Value& into, const Value& value) {  // indexed rows set to a constant
    return scatter(into, c.b.broadcast_to(value, src.shape()), ScatterCombine::Replace);
  };
  Value result;
  if (reduce == "mean") {
    Value zero = c.b.scalar(0, out.dtype);
    Value base = include_self ? x : fill_indexed(x, zero);
    Value sum = scatter(base, src, ScatterCombine::Add);
    Value ones = c.b.constant(1, {out.dtype, x.shape()});
    Value count =
        scatter(include_self ? ones : fill_indexed(ones, zero), c.b.constant(1, src.type), ScatterCombine::Add);
    Value mean = stablehlo::is_float(out.dtype)
                     ? c.b.binary(Binary::Divide, sum, count)
                     : c.b.unary(stablehlo::Unary::Floor, c.b.binary(Binary::Divide, c.b.convert(sum, DType::Float64),
                                                                     c.b.convert(count, DType::Float64)));
    result = c.b.cast(mean, out.dtype);
  } else {
    ScatterCombine combine = reduce == "prod"   ? ScatterCombine::Multiply
                             : reduce == "amax" ? ScatterCombine::Maximum
                             : reduce == "amin" ? ScatterCombine::Minimum
                                                : throw Declined("index_reduce with reduce=\"" + reduce + "\"");
    Value identity = reduce == "prod"   ? c.b.scalar(1, out.dtype)
                     : reduce == "amax" ? lowest(c.b, out.dtype)
                                        : highest(c.b, out.dtype);
    result = scatter(include_self ? x : fill_indexed(x, identity), src, combine);
  }
  return {c.b.reshape(result, out.shape)};
}

// index_fill(self, dim, index, value): whole slices of dim set to value.
std::vector<Value> index_fill(LoweringContext& c) {
  const TensorType& out = c.out();
  Value x = c.b.cast(c.tensor(0), out.dtype);
  if (x.rank() == 0) x = c.b.reshape(x, {1});
  const int64_t dim = normalize_dim(c.integer(1), x.rank()), size = x.shape()[dim];
  const Value& index = c.tensor(2);
  if (index.type.numel() == 0 || out.numel() == 0) return {c.tensor(0)};
  c.check_value_fits(3);
  Value i = wrap_negative(c.b, c.b.reshape(index, {index.type.numel()}), size);
  Value rows = c.b.scatter_1d(c.b.constant(0, {DType::Bool, {size}}), i, c.b.constant(1, {DType::Bool, i.shape()}));
  Value mask = c.b.broadcast_in_dim(rows, x.shape(), {dim});
  Value value = c.value_as(3, x.type);
  return {c.b.reshape(c.b.select(mask, value, x), out.shape)};
}

// ---------------------------------------------------------- advanced indexing

// How x[indices] (a list of int64 index tensors and Nones) maps onto gather
// and scatter. The index tensors broadcast together to `batch`; they take
// the place of the first indexed dimension when the indexed dimensions are
// adjacent, and go first otherwise (PyTorch's and NumPy's rule).
struct AdvancedIndex {
  Value coords;                      // [batch..., indexed.size()]
  std::vector<int64_t> indexed;      // the dimensions of x that are indexed
  std::vector<int64_t> offset_dims;  // the result dimensions that are x's other dimensions
  Shape result;                      // the shape of x[indices]
};

Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  Shape out;
  for (const Shape& s : shapes) {
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out[out.size() - s.size() + k];
      int64_t v = s[k];
      if (o == 1)
        o = v;
      else if (v != 1 && v != o)
        throw std::invalid_argument("index: shape mismatch: indexing tensors could not be broadcast together");
    }
  }
  return out;
}

AdvancedIndex advanced_index(LoweringContext& c, const Value& x, const std::vector<Value>& indices) {
  Builder& b = c.b;
  AdvancedIndex a;
  std::vector<Shape> shapes;
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k].name.empty()) continue;
    if (indices[k].dtype() == DType::Bool || stablehlo::is_float(indices[k].dtype()))
      throw std::invalid_argument("index: tensors used as indices must be long, int, byte or bool tensors");
    a.indexed.push_back(static_cast<int64_t>(k));
    shapes.push_back(indices[k].shape());
  }
  if (a.indexed.size() > static_cast<size_t>(x.rank()))
    throw std::invalid_argument("index: too many indices for a tensor of dimension " + std::to_string(x.rank()));
  Shape batch = broadcast_shapes(shapes);
  // Where a dim left unindexed is empty, the result has no elements and CPU
  // (like CUDA) reads no index: none is checked.
  int64_t rest_elements = 1;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(a.indexed.begin(), a.indexed.end(), d) == a.indexed.end()) rest_elements *= x.shape()[d];
  std::vector<Value> parts;
  for (int64_t d : a.indexed) {
    Value i = b.broadcast_to(b.cast(indices[d], DType::Int64), batch);
    if (rest_elements > 0)
      c.check_indices(
          i, x.shape()[d], true,
          "index is out of bounds for dimension " + std::to_string(d) + " with size " + std::to_string(x.shape()[d]));
    parts.push_back(as_column(b, wrap_negative(b, i, x.shape()[d])));
  }
  a.coords = b.concatenate(parts, static_cast<int64_t>(batch.size()));
  bool adjacent = a.indexed.back() - a.indexed.front() + 1 == static_cast<int64_t>(a.indexed.size());
  int64_t first = adjacent ? a.indexed.front() : 0;
  const int64_t n = static_cast<int64_t>(batch.size());
  Shape rest;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(a.indexed.begin(), a.indexed.end(), d) == a.indexed.end()) rest.push_back(x.shape()[d]);
  const int64_t result_rank = static_cast<int64_t>(rest.size()) + n;
  size_t next = 0;
  for (int64_t d = 0; d < result_rank; ++d) {
    if (d >= first && d < first + n) {
      a.result.push_back(batch[d - first]);
    } else {
      a.offset_dims.push_back(d);
      a.result.push_back(rest[next++]);
    }
  }
  return a;
}

// index.Tensor(self, indices): x[i0, None, i2, ...] for int64/int32 index tensors.
std::vector<Value> index(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const auto& indices = c.args[1].tensors;
  bool any = std::any_of(indices.begin(), indices.end(), [](const Value& v) { return !v.name.empty(); });
  if (!any) return {c.b.reshape(x, c.out().shape)};
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  AdvancedIndex a = advanced_index(c, x, indices);
  GatherDims g;
  g.offset_dims = a.offset_dims;
  g.collapsed_slice_dims = a.indexed;
  g.start_index_map = a.indexed;
  g.index_vector_dim = a.coords.rank() - 1;
  Shape sizes = x.shape();
  for (int64_t d : a.indexed) sizes[d] = 1;
  return {c.b.gather(x, a.coords, g, sizes)};
}

// x[mask] = value (or += value) with one bool mask over dims k.. of x, as a
// compiled graph keeps it (eager turns masks into indices first): the value
// must be one element, since how many it fills is the mask's count. None
// when the indices are not one mask.
std::optional<Value> index_put_by_mask(LoweringContext& c, const Value& x, const std::vector<Value>& indices,
                                       const Value& values, bool accumulate) {
  std::vector<size_t> given;
  for (size_t k = 0; k < indices.size(); ++k)
    if (!indices[k].name.empty()) given.push_back(k);
  if (given.size() != 1 || indices[given[0]].dtype() != DType::Bool) return std::nullopt;
  const size_t k = given[0];
  const Value& mask = indices[k];
  const Shape& shape = x.shape();
  bool fits = k + mask.shape().size() <= shape.size();
  for (size_t d = 0; fits && d < mask.shape().size(); ++d) fits = mask.shape()[d] == shape[k + d];
  if (!fits)
    throw std::invalid_argument("index_put: the mask " + mask.type.str() + " does not match the indexed " +
                                x.type.str() + " at dimension " + std::to_string(k));
  if (values.type.numel() != 1)
    throw Declined("index_put of " + values.type.str() + " through a bool mask (its count decides how many)");
  std::vector<int64_t> dims(mask.shape().size());
  for (size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int64_t>(k + d);
  Value where = c.b.broadcast_in_dim(mask, shape, dims);
  Value v = c.b.broadcast_to(c.b.reshape(values, {}), shape);
  if (!accumulate) return c.b.select(where, v, x);
  const bool logical = x.dtype() == DType::Bool;
  return c.b.binary(logical ? Binary::Or : Binary::Add, x, c.b.select(where, v, c.b.constant(0, x.type)));
}

// index_put / _index_put_impl(self, indices, values, accumulate[, unsafe]):
// x[indices] = values (or += with accumulate), values broadcast to x[indices]'s shape.
std::vector<Value> index_put(LoweringContext& c) {
  const TensorType& out = c.out();
  Value x = c.b.cast(c.tensor(0), out.dtype);
  const auto& indices = c.args[1].tensors;
  Value values = c.b.cast(c.tensor(2), out.dtype);
  const bool accumulate = c.has(3) && c.args[3].b;
  bool any = std::any_of(indices.begin(), indices.end(), [](const Value& v) { return !v.name.empty(); });
  if (!any) {
    Value v = c.b.broadcast_to(values, x.shape());
    return {accumulate ? c.b.binary(out.dtype == DType::Bool ? Binary::Or : Binary::Add, x, v) : v};
  }
  if (auto masked = index_put_by_mask(c, x, indices, values, accumulate)) return {*masked};
  AdvancedIndex a = advanced_index(c, x, indices);
  if (TensorType{out.dtype, a.result}.numel() == 0) return {x};
  // PyTorch lets values carry extra leading 1s.
  while (values.rank() > static_cast<int64_t>(a.result.size()) && values.shape()[0] == 1)
    values = c.b.reshape(values, Shape(values.shape().begin() + 1, values.shape().end()));
  Value updates = c.b.broadcast_to(values, a.result);
  ScatterDims s;
  s.update_window_dims = a.offset_dims;
  s.inserted_window_dims = a.indexed;
  s.scatter_dims_to_operand_dims = a.indexed;
  s.index_vector_dim = a.coords.rank() - 1;
  return {c.b.scatter(x, a.coords, updates, s, accumulate ? ScatterCombine::Add : ScatterCombine::Replace)};
}

// masked_fill(self, mask, value): value where mask (broadcast) is true.
std::vector<Value> masked_fill(LoweringContext& c) {
  c.check_value_fits(2);
  Value mask = c.b.broadcast_to(c.tensor(1), c.out().shape);
  return {c.b.select(mask, c.value_as(2, c.out()), c.operand_as_output(0))};
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq): the rows of grad_output summed into the rows of the
// weight they came from; padding_idx's row gets nothing.
std::vector<Value> embedding_dense_backward(LoweringContext& c) {
  const TensorType& out = c.out();
  const Value& indices = c.tensor(1);
  const int64_t n = indices.type.numel(), width = out.shape[1], padding_idx = c.integer(3);
  if (n == 0 || out.numel() == 0) return {c.b.constant(0, out)};
  Value idx = c.b.reshape(c.b.cast(indices, DType::Int64), {n});
  Value grad = c.b.reshape(c.b.cast(c.tensor(0), out.dtype), {n, width});
  TensorType rows{out.dtype, {n, width}};
  Value zero_rows = c.b.constant(0, rows);
  Value keep = c.b.compare(Compare::NE, idx, c.b.constant_int(padding_idx, idx.type));
  grad = c.b.select(c.b.broadcast_in_dim(keep, rows.shape, {0}), grad, zero_rows);
  if (c.args[4].b) {  // scale_grad_by_freq: each row divided by how often its index occurs
    TensorType counts{out.dtype, {out.shape[0]}};
    Value ones = c.b.constant(1, {out.dtype, {n}});
    Value freq =
        c.b.scatter(c.b.constant(0, counts), as_column(c.b, idx), ones, pointwise_scatter(1), ScatterCombine::Add);
    Value per_row = c.b.gather(freq, as_column(c.b, idx), pointwise_gather(1), {1});
    grad = c.b.binary(Binary::Divide, grad, c.b.broadcast_in_dim(per_row, rows.shape, {0}));
  }
  ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  return {c.b.scatter(c.b.constant(0, out), as_column(c.b, idx), grad, s, ScatterCombine::Add)};
}

// nonzero_static(self, *, size, fill_value=-1) -> [size, ndim] int64: the
// coordinates of the first `size` nonzeros in row-major order, rows past
// them fill_value. Each nonzero's slot is the count of nonzeros before it;
// slots past `size` fall off the scatter.
std::vector<Value> nonzero_static(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const int64_t size = c.integer(1), fill = c.has(2) ? c.integer(2) : -1, n = x.type.numel();
  const int64_t rank = x.rank();
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  if (n == 0) return {c.b.constant_int(fill, c.out())};
  const TensorType lt{DType::Int64, {n}};
  Value flat = c.b.reshape(x, {n});
  Value nonzero =
      flat.dtype() == DType::Bool ? flat : c.b.compare(stablehlo::Compare::NE, flat, c.b.constant(0, flat.type));
  Value slot =
      c.b.binary(stablehlo::Binary::Subtract,
                 scan(c.b, c.b.convert(nonzero, DType::Int64), 0, stablehlo::Binary::Add, 0), c.b.constant_int(1, lt));
  slot = c.b.select(nonzero, slot, c.b.constant_int(size, lt));  // zeros fall off
  Value linear = c.b.scatter_1d(c.b.constant_int(-1, {DType::Int64, {size}}), slot, c.b.iota(lt, 0));
  // Row-major coordinates of each linear index.
  std::vector<Value> coords;
  int64_t stride = n;
  for (int64_t d = 0; d < rank; ++d) {
    stride /= std::max<int64_t>(x.shape()[d], 1);
    const TensorType st{DType::Int64, {size}};
    Value coord = c.b.binary(stablehlo::Binary::Remainder,
                             c.b.binary(stablehlo::Binary::Divide, linear, c.b.constant_int(stride, st)),
                             c.b.constant_int(x.shape()[d], st));
    coords.push_back(c.b.reshape(coord, {size, 1}));
  }
  Value out = c.b.concatenate(coords, 1);
  Value filled = c.b.compare(stablehlo::Compare::LT, c.b.broadcast_in_dim(linear, {size, rank}, {0}),
                             c.b.constant_int(0, {DType::Int64, {size, rank}}));
  return {c.b.select(filled, c.b.constant_int(fill, out.type), out)};
}

// masked_scatter_(self, mask, source): the elements of self where mask is
// true, in order, take source's first elements; source must hold enough.
std::vector<Value> masked_scatter(LoweringContext& c) {
  const TensorType& out = c.out();
  const int64_t n = out.numel();
  Value self = c.b.reshape(c.b.broadcast_to(c.b.cast(c.tensor(0), out.dtype), out.shape), {n});
  Value mask = c.b.reshape(c.b.broadcast_to(c.tensor(1), out.shape), {n});
  Value source = c.b.reshape(c.b.cast(c.tensor(2), out.dtype), {c.tensor(2).type.numel()});
  if (n == 0) return {c.b.reshape(self, out.shape)};
  Value taken = scan(c.b, c.b.convert(mask, DType::Int64), 0, Binary::Add, 0);  // 1-based position in source
  const int64_t available = source.type.numel();
  Value last = c.b.slice(taken, {n - 1}, {n}, {1});
  c.checks.push_back(
      {c.b.reshape(c.b.compare(stablehlo::Compare::LE, last, c.b.constant_int(available, last.type)), {}),
       "masked_scatter: expected source to have at least as many elements as ones in mask", false});
  if (available == 0) return {c.b.reshape(self, out.shape)};
  Value at =
      c.b.clamp(c.b.constant_int(0, taken.type), c.b.binary(Binary::Subtract, taken, c.b.constant_int(1, taken.type)),
                c.b.constant_int(available - 1, taken.type));
  return {c.b.reshape(c.b.select(mask, c.b.gather_1d(source, at), self), out.shape)};
}

// Each of n positions' bag given the bags' start offsets: how many starts are
// at or before it, less one (within [0, bags)).
Value bag_of_positions(Builder& b, const Value& offsets, int64_t n, int64_t bags) {
  const TensorType it{DType::Int64, {n}}, grid{DType::Int64, {n, bags}};
  Value starts = b.slice(offsets, {0}, {bags}, {1});
  Value at_or_before = b.compare(Compare::LE, b.broadcast_in_dim(starts, grid.shape, {1}), b.iota(grid, 0));
  Value count = b.reduce(b.select(at_or_before, b.constant_int(1, grid), b.constant_int(0, grid)),
                         b.constant_int(0, {DType::Int64, {}}), {1}, Binary::Add);
  return b.clamp(b.constant_int(0, it), b.binary(Binary::Subtract, count, b.constant_int(1, it)),
                 b.constant_int(bags - 1, it));
}

// _embedding_bag / _embedding_bag_forward_only(weight [V, D], indices [n],
// offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset, padding_idx) -> (output [B, D], offset2bag [n],
// bag_size [B], max_indices): bag b sums (mode 0), averages (1) or takes the
// max (2) of the rows its indices name, those equal to padding_idx left out;
// an empty bag is 0. The auxiliary outputs as PyTorch's meta shapes them
// (CUDA's layout): each index's bag; the bag's count for mean and max (0 for
// sum, as CPU); for max the row each maximum came from (the first), else empty.
std::vector<Value> embedding_bag(LoweringContext& c) {
  Builder& b = c.b;
  const Value& weight = c.tensor(0);
  const int64_t mode = c.integer(4), padding_idx = c.has(8) ? c.integer(8) : -1;
  const bool include_last = c.has(7) && c.args[7].b;
  if (weight.rank() != 2 || c.tensor(1).rank() != 1) throw Declined("_embedding_bag: 2-D weight and 1-D indices only");
  const int64_t dim = weight.shape()[1], n = c.tensor(1).shape()[0], bags = c.out(0).shape[0];
  const DType t = opmath_type(weight.dtype());
  const TensorType it{DType::Int64, {n}};
  Value indices = b.cast(c.tensor(1), DType::Int64);
  std::vector<Value> outs(4);
  outs[2] = b.constant_int(0, c.out(2));
  outs[3] = b.constant_int(0, c.out(3));
  if (n == 0 || bags == 0) {
    outs[0] = b.constant(0, c.out(0));
    outs[1] = b.constant_int(0, c.out(1));
    return outs;
  }
  c.check_indices(indices, weight.shape()[0], false, "index out of range in self");
  Value bag = bag_of_positions(b, b.cast(c.tensor(2), DType::Int64), n, bags);
  Value counted = b.compare(Compare::NE, indices, b.constant_int(padding_idx, it));
  if (include_last) {  // positions from the last offset on belong to no bag
    Value end = b.reshape(b.slice(b.cast(c.tensor(2), DType::Int64), {bags}, {bags + 1}, {1}), {});
    counted = b.binary(Binary::And, counted, b.compare(Compare::LT, b.iota(it, 0), b.broadcast_to(end, {n})));
  }
  Value rows = b.cast(take_along(b, weight, 0, indices), t);  // [n, D]
  if (c.has(6)) rows = b.binary(Binary::Multiply, rows, b.broadcast_in_dim(b.cast(c.tensor(6), t), {n, dim}, {0}));
  const Shape out_shape{bags, dim};
  ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  Value at = b.reshape(bag, {n, 1});
  Value counted_rows = b.broadcast_in_dim(counted, {n, dim}, {0});
  Value count = b.scatter(b.constant_int(0, {DType::Int64, {bags}}), at,
                          b.select(counted, b.constant_int(1, it), b.constant_int(0, it)), pointwise_scatter(1),
                          ScatterCombine::Add);
  Value empty =
      b.broadcast_in_dim(b.compare(Compare::EQ, count, b.constant_int(0, {DType::Int64, {bags}})), out_shape, {0});
  Value out;
  if (mode == 2) {
    Value low = b.broadcast_to(lowest(b, t), {n, dim});
    out = b.scatter(b.broadcast_to(lowest(b, t), out_shape), at, b.select(counted_rows, rows, low), s,
                    ScatterCombine::Maximum);
    out = b.select(empty, b.constant(0, {t, out_shape}), out);
    // The first position holding each bag's maximum, and the row it read.
    Value is_max = b.binary(Binary::And, counted_rows, b.compare(Compare::EQ, rows, take_along(b, out, 0, bag)));
    Value position = b.select(is_max, b.iota({DType::Int64, {n, dim}}, 0), b.constant_int(n, {DType::Int64, {n, dim}}));
    Value first = b.scatter(b.constant_int(n, {DType::Int64, out_shape}), at, position, s, ScatterCombine::Minimum);
    Value safe =
        b.clamp(b.constant_int(0, {DType::Int64, out_shape}), first, b.constant_int(n - 1, {DType::Int64, out_shape}));
    Value picked = b.reshape(take_along(b, indices, 0, b.reshape(safe, {bags * dim})), out_shape);
    outs[3] = b.cast(b.select(empty, b.constant_int(0, {DType::Int64, out_shape}), picked), c.out(3).dtype);
  } else {
    out = b.scatter(b.constant(0, {t, out_shape}), at, b.select(counted_rows, rows, b.constant(0, {t, {n, dim}})), s,
                    ScatterCombine::Add);
    if (mode == 1) {
      Value divisor = b.convert(
          b.clamp(b.constant_int(1, {DType::Int64, {bags}}), count, b.constant_int(INT64_MAX, {DType::Int64, {bags}})),
          t);
      out = b.binary(Binary::Divide, out, b.broadcast_in_dim(divisor, out_shape, {0}));
    }
  }
  outs[0] = b.cast(out, c.out(0).dtype);
  outs[1] = b.cast(bag, c.out(1).dtype);
  if (mode != 0) {
    // With include_last_offset PyTorch's meta sizes bag_size like offsets: a trailing 0.
    const int64_t extra = c.out(2).shape[0] - bags;
    Value sizes = extra > 0 ? b.pad(count, b.constant_int(0, {DType::Int64, {}}), {0}, {extra}, {0}) : count;
    outs[2] = b.cast(sizes, c.out(2).dtype);
  }
  return outs;
}

// _embedding_bag_backward(grad [B, D], indices, offsets, offset2bag, bag_size,
// maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
// per_sample_weights, padding_idx) -> grad_weight [num_weights, D]: sum and
// mean add each bag's gradient (weighted, over its size for mean) into the rows
// its indices name (padding left out; over each index's frequency with
// scale_grad_by_freq); max into the rows its maxima came from.
// Where _embedding_bag_backward's arguments sit (_embedding_bag_dense_backward
// has no offsets and no sparse flag).
struct BagBackwardArgs {
  int offsets, offset2bag, bag_size, maximum_indices, scale_by_freq, mode, sparse, per_sample_weights, padding_idx;
};

LoweringRule embedding_bag_backward(BagBackwardArgs a) {
  return [a](LoweringContext& c) -> std::vector<Value> {
    Builder& b = c.b;
    if (a.sparse >= 0 && c.args[a.sparse].b) throw Declined("_embedding_bag_backward: sparse gradients");
    const TensorType& out = c.out();
    const DType t = opmath_type(out.dtype);
    const int64_t mode = c.integer(a.mode), padding_idx = c.has(a.padding_idx) ? c.integer(a.padding_idx) : -1;
    const int64_t rows = out.shape[0], dim = out.shape[1];
    Value grad = b.cast(c.tensor(0), t);
    const int64_t bags = grad.shape()[0];
    Value indices = b.cast(c.tensor(1), DType::Int64);
    const int64_t n = indices.shape()[0];
    if (n == 0 || bags == 0) return {b.constant(0, out)};
    const TensorType it{DType::Int64, {n}};
    Value bag_size = b.slice(b.cast(c.tensor(a.bag_size), DType::Int64), {0}, {bags}, {1});
    ScatterDims s;
    s.update_window_dims = {1};
    s.inserted_window_dims = {0};
    s.scatter_dims_to_operand_dims = {0};
    s.index_vector_dim = 1;
    Value zeros = b.constant(0, {t, {rows, dim}});
    if (mode == 2) {
      // Bag b's gradient in dim d goes to row maximum_indices[b, d]; empty bags give none.
      Value at = b.cast(c.tensor(a.maximum_indices), DType::Int64);
      Value filled = b.broadcast_in_dim(b.compare(Compare::GT, bag_size, b.constant_int(0, {DType::Int64, {bags}})),
                                        {bags, dim}, {0});
      Value g = b.select(filled, grad, b.constant(0, grad.type));
      Value coords = b.concatenate(
          {b.reshape(at, {bags, dim, 1}), b.reshape(b.iota({DType::Int64, {bags, dim}}, 1), {bags, dim, 1})}, 2);
      ScatterDims p;
      p.inserted_window_dims = {0, 1};
      p.scatter_dims_to_operand_dims = {0, 1};
      p.index_vector_dim = 2;
      return {b.cast(b.scatter(zeros, coords, g, p, ScatterCombine::Add), out.dtype)};
    }
    Value offset2bag = c.tensor(3).type.numel() == n ? b.cast(c.tensor(3), DType::Int64)
                                                     : bag_of_positions(b, b.cast(c.tensor(2), DType::Int64), n, bags);
    Value per_position = take_along(b, grad, 0, offset2bag);  // [n, D]
    Value scale = b.constant(1, {t, {n}});
    if (mode == 1) {
      Value size = b.convert(take_along(b, bag_size, 0, offset2bag), t);
      scale =
          b.binary(Binary::Divide, scale,
                   b.select(b.compare(Compare::GT, size, b.constant(0, size.type)), size, b.constant(1, size.type)));
    }
    if (c.has(a.per_sample_weights))
      scale = b.binary(Binary::Multiply, scale, b.cast(c.tensor(a.per_sample_weights), t));
    if (c.args[a.scale_by_freq].b) {  // scale_grad_by_freq: over how often each index occurs
      Value freq = b.scatter(b.constant_int(0, {DType::Int64, {rows}}), b.reshape(indices, {n, 1}),
                             b.constant_int(1, it), pointwise_scatter(1), ScatterCombine::Add);
      scale = b.binary(Binary::Divide, scale, b.convert(take_along(b, freq, 0, indices), t));
    }
    Value counted = b.compare(Compare::NE, indices, b.constant_int(padding_idx, it));
    scale = b.select(counted, scale, b.constant(0, scale.type));
    Value updates = b.binary(Binary::Multiply, per_position, b.broadcast_in_dim(scale, {n, dim}, {0}));
    return {b.cast(b.scatter(zeros, b.reshape(indices, {n, 1}), updates, s, ScatterCombine::Add), out.dtype)};
  };
}

// _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets,
// offset2bag, mode, padding_idx): each position's weight row dotted with its
// bag's gradient (0 for padding).
std::vector<Value> embedding_bag_per_sample_weights_backward(LoweringContext& c) {
  Builder& b = c.b;
  const DType t = opmath_type(c.out().dtype);
  Value grad = b.cast(c.tensor(0), t), indices = b.cast(c.tensor(2), DType::Int64);
  const int64_t n = indices.shape()[0], bags = grad.shape()[0];
  if (n == 0 || bags == 0) return {b.constant(0, c.out())};
  const int64_t padding_idx = c.has(6) ? c.integer(6) : -1;
  Value offset2bag = c.tensor(4).type.numel() == n ? b.cast(c.tensor(4), DType::Int64)
                                                   : bag_of_positions(b, b.cast(c.tensor(3), DType::Int64), n, bags);
  Value rows = b.cast(take_along(b, c.tensor(1), 0, indices), t);
  Value g = take_along(b, grad, 0, offset2bag);
  Value dot = b.reduce(b.binary(Binary::Multiply, rows, g), b.scalar(0, t), {1}, Binary::Add);
  Value counted = b.compare(Compare::NE, indices, b.constant_int(padding_idx, {DType::Int64, {n}}));
  return {b.cast(b.select(counted, dot, b.constant(0, dot.type)), c.out().dtype)};
}

// embedding_renorm_(self!, indices, max_norm, norm_type): every row of self
// that indices name and whose norm exceeds max_norm is scaled by
// max_norm / (norm + 1e-7), as CPU's.
std::vector<Value> embedding_renorm(LoweringContext& c) {
  Builder& b = c.b;
  const Value& self = c.tensor(0);
  if (self.rank() != 2) throw Declined("embedding_renorm_: self of rank " + std::to_string(self.rank()));
  const int64_t rows = self.shape()[0], cols = self.shape()[1];
  const double max_norm = c.number(2), p = c.number(3);
  Value index = b.reshape(b.cast(c.tensor(1), DType::Int64), {c.tensor(1).type.numel()});
  c.check_indices(index, rows, false, "embedding_renorm_: index out of range", /*index_error=*/true);
  const int64_t n = index.shape()[0];
  stablehlo::ScatterDims s;
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  Value named = n == 0 ? b.constant(0, {DType::Bool, {rows}})
                       : b.scatter(b.constant(0, {DType::Bool, {rows}}), b.reshape(index, {n, 1}),
                                   b.constant(1, {DType::Bool, {n}}), s, stablehlo::ScatterCombine::Replace);
  // The norm in self's opmath type (CPU's row.norm), the scale from it in double.
  const DType t = opmath_type(self.dtype());
  Value x = b.cast(self, t), ax = b.unary(stablehlo::Unary::Abs, x);
  Value norm;
  if (p == 2) {
    norm =
        b.unary(stablehlo::Unary::Sqrt, b.reduce(b.binary(Binary::Multiply, x, x), b.scalar(0, t), {1}, Binary::Add));
  } else if (p == 1) {
    norm = b.reduce(ax, b.scalar(0, t), {1}, Binary::Add);
  } else if (std::isinf(p)) {
    norm = b.reduce(ax, b.scalar(p > 0 ? 0 : INFINITY, t), {1}, p > 0 ? Binary::Maximum : Binary::Minimum);
  } else {
    Value sum = b.reduce(b.binary(Binary::Power, ax, b.constant(p, ax.type)), b.scalar(0, t), {1}, Binary::Add);
    norm = b.binary(Binary::Power, sum, b.constant(1 / p, sum.type));
  }
  norm = b.convert(norm, DType::Float64);
  Value scale = b.binary(Binary::Divide, b.constant(max_norm, norm.type),
                         b.binary(Binary::Add, norm, b.constant(1e-7, norm.type)));
  Value apply = b.binary(Binary::And, named, b.compare(Compare::GT, norm, b.constant(max_norm, norm.type)));
  Value factor = b.broadcast_in_dim(b.cast(scale, opmath_type(self.dtype())), {rows, cols}, {0});
  Value scaled = b.cast(b.binary(Binary::Multiply, b.cast(self, opmath_type(self.dtype())), factor), self.dtype());
  return {b.select(b.broadcast_in_dim(apply, {rows, cols}, {0}), scaled, self)};
}

}  // namespace

LOWERING("aten::index_select", index_select);
LOWERING("aten::take", take);
LOWERING("aten::put", put);
LOWERING("aten::embedding", embedding);
LOWERING("aten::_embedding_bag", embedding_bag);
LOWERING("aten::_embedding_bag_forward_only", embedding_bag);
LOWERING("aten::_embedding_bag_backward", embedding_bag_backward({2, 3, 4, 5, 7, 8, 9, 10, 11}));
LOWERING("aten::_embedding_bag_dense_backward", embedding_bag_backward({-1, 2, 3, 4, 6, 7, -1, 8, 9}));
LOWERING("aten::_embedding_bag_per_sample_weights_backward", embedding_bag_per_sample_weights_backward);
LOWERING("aten::embedding_renorm_", embedding_renorm);
LOWERING("aten::embedding_dense_backward", embedding_dense_backward);
LOWERING("aten::gather", gather);
LOWERING("aten::scatter.src", scatter_with(ScatterCombine::Replace));
LOWERING("aten::scatter.value", scatter_with(ScatterCombine::Replace));
LOWERING("aten::scatter_add", scatter_with(ScatterCombine::Add));
LOWERING("aten::scatter.reduce", scatter_reduce_legacy);
LOWERING("aten::scatter.value_reduce", scatter_reduce_legacy);
LOWERING("aten::scatter_reduce.two", scatter_reduce);
LOWERING("aten::index_fill.int_Scalar", index_fill);
LOWERING("aten::index_fill.int_Tensor", index_fill);
LOWERING("aten::index_copy", index_write(ScatterCombine::Replace));
LOWERING("aten::index_add", index_write(ScatterCombine::Add));
LOWERING("aten::index_reduce", index_reduce);
LOWERING("aten::index.Tensor", index);
LOWERING("aten::nonzero_static", nonzero_static);
LOWERING("aten::index_put", index_put);
LOWERING("aten::_index_put_impl", index_put);
LOWERING("aten::masked_fill.Scalar", masked_fill);
LOWERING("aten::masked_scatter_", masked_scatter);
LOWERING("aten::masked_scatter", masked_scatter);
LOWERING("aten::masked_fill.Tensor", masked_fill);

}  // namespace torch_tpu::lowering
