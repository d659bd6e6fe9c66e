// Softmax and layer norm, with the backward ops autograd calls. Low-precision
// inputs compute in float32, as PyTorch does.
#include <algorithm>
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

DType compute_type(DType t) { return t == DType::Float16 || t == DType::BFloat16 ? DType::Float32 : t; }

// Reduces `dims` of x and broadcasts the result back to x's shape.
Value reduce_keep(Builder& b, const Value& x, const std::vector<int64_t>& dims, Binary op, double init) {
  Value r = b.reduce(x, b.scalar(init, x.dtype()), dims, op);
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept.push_back(d);
  return b.broadcast_in_dim(r, x.shape(), kept);
}

// _softmax(self, dim, half_to_float) and _log_softmax: max-shifted for stability.
Value log_softmax_value(LoweringContext& c, Value x, int64_t dim) {
  Value shifted = c.b.binary(Binary::Subtract, x, reduce_keep(c.b, x, {dim}, Binary::Maximum, -INFINITY));
  Value sum = reduce_keep(c.b, c.b.unary(Unary::Exp, shifted), {dim}, Binary::Add, 0);
  return c.b.binary(Binary::Subtract, shifted, c.b.unary(Unary::Log, sum));
}

std::vector<Value> softmax(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), compute_type(c.out().dtype));
  if (x.rank() == 0) return {c.b.constant(1, c.out())};
  int64_t dim = normalize_dim(c.integer(1), x.rank());
  Value shifted = c.b.binary(Binary::Subtract, x, reduce_keep(c.b, x, {dim}, Binary::Maximum, -INFINITY));
  Value e = c.b.unary(Unary::Exp, shifted);
  return {c.b.cast(c.b.binary(Binary::Divide, e, reduce_keep(c.b, e, {dim}, Binary::Add, 0)), c.out().dtype)};
}

std::vector<Value> log_softmax(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), compute_type(c.out().dtype));
  if (x.rank() == 0) return {c.b.constant(0, c.out())};
  return {c.b.cast(log_softmax_value(c, x, normalize_dim(c.integer(1), x.rank())), c.out().dtype)};
}

// _softmax_backward_data(grad_output, output, dim, input_dtype): y * (g - sum(g * y))
std::vector<Value> softmax_backward(LoweringContext& c) {
  DType t = compute_type(c.out().dtype);
  Value g = c.b.cast(c.tensor(0), t), y = c.b.cast(c.tensor(1), t);
  if (g.rank() == 0) return {c.b.constant(0, c.out())};
  int64_t dim = normalize_dim(c.integer(2), g.rank());
  Value dot = reduce_keep(c.b, c.b.binary(Binary::Multiply, g, y), {dim}, Binary::Add, 0);
  return {c.b.cast(c.b.binary(Binary::Multiply, y, c.b.binary(Binary::Subtract, g, dot)), c.out().dtype)};
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): g - exp(y) * sum(g)
std::vector<Value> log_softmax_backward(LoweringContext& c) {
  DType t = compute_type(c.out().dtype);
  Value g = c.b.cast(c.tensor(0), t), y = c.b.cast(c.tensor(1), t);
  if (g.rank() == 0) return {c.b.constant(0, c.out())};
  int64_t dim = normalize_dim(c.integer(2), g.rank());
  Value sum = reduce_keep(c.b, g, {dim}, Binary::Add, 0);
  return {c.b.cast(c.b.binary(Binary::Subtract, g, c.b.binary(Binary::Multiply, c.b.unary(Unary::Exp, y), sum)),
                   c.out().dtype)};
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
std::vector<Value> layer_norm(LoweringContext& c) {
  DType t = compute_type(c.out(0).dtype);
  Value x = c.b.cast(c.tensor(0), t);
  int64_t n = static_cast<int64_t>(c.ints(1).size());
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int64_t d = x.rank() - n; d < x.rank(); ++d) {
    dims.push_back(d);
    count *= x.shape()[d];
  }
  Value inv_count = c.b.constant(1.0 / static_cast<double>(count), x.type);
  Value mean = c.b.binary(Binary::Multiply, reduce_keep(c.b, x, dims, Binary::Add, 0), inv_count);
  Value centered = c.b.binary(Binary::Subtract, x, mean);
  Value var =
      c.b.binary(Binary::Multiply,
                 reduce_keep(c.b, c.b.binary(Binary::Multiply, centered, centered), dims, Binary::Add, 0), inv_count);
  Value rstd = c.b.unary(Unary::Rsqrt, c.b.binary(Binary::Add, var, c.b.constant(c.number(4), x.type)));
  Value y = c.b.binary(Binary::Multiply, centered, rstd);
  if (c.has(2)) y = c.b.binary(Binary::Multiply, y, c.b.broadcast_to(c.b.cast(c.tensor(2), t), x.shape()));
  if (c.has(3)) y = c.b.binary(Binary::Add, y, c.b.broadcast_to(c.b.cast(c.tensor(3), t), x.shape()));
  // mean and rstd keep the reduced dims as size 1 (PyTorch's meta says so).
  auto stat = [&](const Value& v, size_t k) {
    Value first = c.b.slice(
        v, std::vector<int64_t>(v.rank(), 0),
        [&] {
          std::vector<int64_t> limit = v.shape();
          for (int64_t d : dims) limit[d] = 1;
          return limit;
        }(),
        std::vector<int64_t>(v.rank(), 1));
    return c.b.cast(c.b.reshape(first, c.out(k).shape), c.out(k).dtype);
  };
  return {c.b.cast(y, c.out(0).dtype), stat(mean, 1), stat(rstd, 2)};
}

}  // namespace

LOWERING("aten::_softmax", softmax);
LOWERING("aten::_log_softmax", log_softmax);
LOWERING("aten::_softmax_backward_data", softmax_backward);
LOWERING("aten::_log_softmax_backward_data", log_softmax_backward);
LOWERING("aten::native_layer_norm", layer_norm);

}  // namespace torch_tpu::lowering
