// Softmax and layer norm, with the backward ops autograd calls. Low-precision
// inputs compute in float32, as PyTorch does.
#include <algorithm>
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

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
  Value x = c.b.cast(c.tensor(0), opmath_type(c.out().dtype));
  if (x.rank() == 0) return {c.b.constant(1, c.out())};
  int64_t dim = normalize_dim(c.integer(1), x.rank());
  Value shifted = c.b.binary(Binary::Subtract, x, reduce_keep(c.b, x, {dim}, Binary::Maximum, -INFINITY));
  Value e = c.b.unary(Unary::Exp, shifted);
  return {c.b.cast(c.b.binary(Binary::Divide, e, reduce_keep(c.b, e, {dim}, Binary::Add, 0)), c.out().dtype)};
}

// _safe_softmax(self, dim, dtype?): softmax, but a row of only -inf (a query
// that may attend nothing, in scaled_dot_product_attention) is all 0, not NaN.
std::vector<Value> safe_softmax(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), opmath_type(c.out().dtype));
  if (x.rank() == 0) return {c.b.constant(1, c.out())};
  const int64_t dim = normalize_dim(c.integer(1), x.rank());
  Value shifted = c.b.binary(Binary::Subtract, x, reduce_keep(c.b, x, {dim}, Binary::Maximum, -INFINITY));
  Value e = c.b.unary(Unary::Exp, shifted);
  Value y = c.b.binary(Binary::Divide, e, reduce_keep(c.b, e, {dim}, Binary::Add, 0));
  Value masked = c.b.compare(stablehlo::Compare::EQ, x, c.b.broadcast_to(c.b.scalar(-INFINITY, x.dtype()), x.shape()));
  Value rows = reduce_keep(c.b, c.b.cast(masked, DType::Int32), {dim}, Binary::Minimum, 1);
  Value none = c.b.compare(stablehlo::Compare::NE, c.b.broadcast_to(rows, x.shape()),
                           c.b.constant(0, {DType::Int32, x.shape()}));
  return {c.b.cast(c.b.select(none, c.b.constant(0, {x.dtype(), x.shape()}), y), c.out().dtype)};
}

std::vector<Value> log_softmax(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), opmath_type(c.out().dtype));
  if (x.rank() == 0) return {c.b.constant(0, c.out())};
  return {c.b.cast(log_softmax_value(c, x, normalize_dim(c.integer(1), x.rank())), c.out().dtype)};
}

// _softmax_backward_data(grad_output, output, dim, input_dtype): y * (g - sum(g * y))
std::vector<Value> softmax_backward(LoweringContext& c) {
  DType t = opmath_type(c.out().dtype);
  Value g = c.b.cast(c.tensor(0), t), y = c.b.cast(c.tensor(1), t);
  if (g.rank() == 0) return {c.b.constant(0, c.out())};
  int64_t dim = normalize_dim(c.integer(2), g.rank());
  Value dot = reduce_keep(c.b, c.b.binary(Binary::Multiply, g, y), {dim}, Binary::Add, 0);
  return {c.b.cast(c.b.binary(Binary::Multiply, y, c.b.binary(Binary::Subtract, g, dot)), c.out().dtype)};
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): g - exp(y) * sum(g)
std::vector<Value> log_softmax_backward(LoweringContext& c) {
  DType t = opmath_type(c.out().dtype);
  Value g = c.b.cast(c.tensor(0), t), y = c.b.cast(c.tensor(1), t);
  if (g.rank() == 0) return {c.b.constant(0, c.out())};
  int64_t dim = normalize_dim(c.integer(2), g.rank());
  Value sum = reduce_keep(c.b, g, {dim}, Binary::Add, 0);
  return {c.b.cast(c.b.binary(Binary::Subtract, g, c.b.binary(Binary::Multiply, c.b.unary(Unary::Exp, y), sum)),
                   c.out().dtype)};
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
std::vector<Value> layer_norm(LoweringContext& c) {
  DType t = opmath_type(c.out(0).dtype);
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

// native_group_norm(input [N, C, *], weight?, bias?, N, C, HxW, group, eps)
// -> (out, mean [N, group], rstd [N, group]): statistics per (sample, group)
// in float32 for low-precision input, rounded once at the end.
std::vector<Value> group_norm(LoweringContext& c) {
  const DType t = opmath_type(c.out(0).dtype);
  const int64_t n = c.integer(3), channels = c.integer(4), hw = c.integer(5), groups = c.integer(6);
  if (n * channels * hw == 0)  // CPU: groups of no values have mean 0 and rstd NaN (1 / sqrt(0 / 0))
    return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1)), c.b.constant(NAN, c.out(2))};
  Value x = c.b.reshape(c.b.cast(c.tensor(0), t), {n, groups, channels / groups * hw});
  Value inv_count = c.b.constant(1.0 / static_cast<double>(channels / groups * hw), x.type);
  Value mean = c.b.binary(Binary::Multiply, reduce_keep(c.b, x, {2}, Binary::Add, 0), inv_count);
  Value centered = c.b.binary(Binary::Subtract, x, mean);
  Value var =
      c.b.binary(Binary::Multiply,
                 reduce_keep(c.b, c.b.binary(Binary::Multiply, centered, centered), {2}, Binary::Add, 0), inv_count);
  Value rstd = c.b.unary(Unary::Rsqrt, c.b.binary(Binary::Add, var, c.b.constant(c.number(7), x.type)));
  Value y = c.b.binary(Binary::Multiply, centered, rstd);
  y = c.b.reshape(y, {n, channels, hw});
  if (c.has(1)) y = c.b.binary(Binary::Multiply, y, c.b.broadcast_in_dim(c.b.cast(c.tensor(1), t), y.shape(), {1}));
  if (c.has(2)) y = c.b.binary(Binary::Add, y, c.b.broadcast_in_dim(c.b.cast(c.tensor(2), t), y.shape(), {1}));
  auto stat = [&](const Value& v, size_t k) {  // reduce_keep broadcasts back: one column is the statistic
    Value first = c.b.slice(v, {0, 0, 0}, {n, groups, 1}, {1, 1, 1});
    return c.b.cast(c.b.reshape(first, c.out(k).shape), c.out(k).dtype);
  };
  return {c.b.cast(c.b.reshape(y, c.out(0).shape), c.out(0).dtype), stat(mean, 1), stat(rstd, 2)};
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight?, bias?, output_mask) -> (grad_input, grad_weight, grad_bias); an
// output left out of output_mask is undefined (an empty Value).
std::vector<Value> layer_norm_backward(LoweringContext& c) {
  const std::vector<int64_t>& mask = c.ints(7);
  if (mask.size() != 3) throw Declined("native_layer_norm_backward: output_mask of size != 3");
  DType t = opmath_type(c.tensor(1).dtype());
  Value g = c.b.cast(c.tensor(0), t), x = c.b.cast(c.tensor(1), t);
  if (x.type.numel() == 0) throw Declined("native_layer_norm_backward: empty input");
  const int64_t n = static_cast<int64_t>(c.ints(2).size()), outer = x.rank() - n;
  std::vector<int64_t> inner_dims, outer_dims;
  int64_t count = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (d < outer) {
      outer_dims.push_back(d);
    } else {
      inner_dims.push_back(d);
      count *= x.shape()[d];
    }
  }
  // mean and rstd are [outer..., 1...]: broadcast over the normalized dims.
  auto stat = [&](size_t i) {
    Value v = c.b.cast(c.tensor(i), t);
    Shape kept(x.shape().begin(), x.shape().begin() + outer);
    return c.b.broadcast_in_dim(c.b.reshape(v, kept), x.shape(), outer_dims);
  };
  Value xhat = c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, x, stat(3)), stat(4));
  std::vector<Value> grads(3);
  auto param_grad = [&](const Value& v, size_t k) {
    Value r = outer_dims.empty() ? v : c.b.reduce(v, c.b.scalar(0, t), outer_dims, Binary::Add);
    return c.b.cast(c.b.reshape(r, c.out(k).shape), c.out(k).dtype);
  };
  if (mask[1] && c.has(5)) grads[1] = param_grad(c.b.binary(Binary::Multiply, g, xhat), 1);
  if (mask[2] && c.has(6)) grads[2] = param_grad(g, 2);
  if (mask[0]) {
    // rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), means over the normalized dims.
    Value gw = c.has(5) ? c.b.binary(Binary::Multiply, g, c.b.broadcast_to(c.b.cast(c.tensor(5), t), x.shape())) : g;
    Value inv_count = c.b.constant(1.0 / static_cast<double>(count), x.type);
    Value mean_gw = c.b.binary(Binary::Multiply, reduce_keep(c.b, gw, inner_dims, Binary::Add, 0), inv_count);
    Value mean_gwx =
        c.b.binary(Binary::Multiply,
                   reduce_keep(c.b, c.b.binary(Binary::Multiply, gw, xhat), inner_dims, Binary::Add, 0), inv_count);
    Value inner = c.b.binary(Binary::Subtract, c.b.binary(Binary::Subtract, gw, mean_gw),
                             c.b.binary(Binary::Multiply, xhat, mean_gwx));
    grads[0] = c.b.cast(c.b.binary(Binary::Multiply, stat(4), inner), c.out(0).dtype);
  }
  return grads;
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW,
// group, output_mask) -> (grad_input, grad_weight, grad_bias): layer norm's
// backward over each (sample, group) of [N, G, C/G, HxW], per-channel affine.
std::vector<Value> group_norm_backward(LoweringContext& c) {
  const std::vector<int64_t>& mask = c.ints(9);
  if (mask.size() != 3) throw Declined("native_group_norm_backward: output_mask of size != 3");
  DType t = opmath_type(c.tensor(1).dtype());
  const int64_t n = c.integer(5), channels = c.integer(6), hw = c.integer(7), groups = c.integer(8);
  if (n * channels * hw == 0) throw Declined("native_group_norm_backward: empty input");
  Shape grouped{n, groups, channels / groups, hw};
  Value g = c.b.reshape(c.b.cast(c.tensor(0), t), grouped), x = c.b.reshape(c.b.cast(c.tensor(1), t), grouped);
  auto stat = [&](size_t i) {
    return c.b.broadcast_in_dim(c.b.reshape(c.b.cast(c.tensor(i), t), {n, groups}), grouped, {0, 1});
  };
  auto channel = [&](const Value& v) {  // [C] over the grouped shape
    return c.b.broadcast_in_dim(c.b.reshape(v, {groups, channels / groups}), grouped, {1, 2});
  };
  Value xhat = c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, x, stat(2)), stat(3));
  std::vector<Value> grads(3);
  auto param_grad = [&](const Value& v, size_t k) {
    Value r = c.b.reduce(v, c.b.scalar(0, t), {0, 3}, Binary::Add);
    return c.b.cast(c.b.reshape(r, c.out(k).shape), c.out(k).dtype);
  };
  if (mask[1]) grads[1] = param_grad(c.b.binary(Binary::Multiply, g, xhat), 1);
  if (mask[2]) grads[2] = param_grad(g, 2);
  if (mask[0]) {
    Value gw = c.has(4) ? c.b.binary(Binary::Multiply, g, channel(c.b.cast(c.tensor(4), t))) : g;
    Value inv_count = c.b.constant(1.0 / static_cast<double>(channels / groups * hw), x.type);
    Value mean_gw = c.b.binary(Binary::Multiply, reduce_keep(c.b, gw, {2, 3}, Binary::Add, 0), inv_count);
    Value mean_gwx = c.b.binary(
        Binary::Multiply, reduce_keep(c.b, c.b.binary(Binary::Multiply, gw, xhat), {2, 3}, Binary::Add, 0), inv_count);
    Value inner = c.b.binary(Binary::Subtract, c.b.binary(Binary::Subtract, gw, mean_gw),
                             c.b.binary(Binary::Multiply, xhat, mean_gwx));
    Value gi = c.b.binary(Binary::Multiply, stat(3), inner);
    grads[0] = c.b.cast(c.b.reshape(gi, c.out(0).shape), c.out(0).dtype);
  }
  return grads;
}

// ---- Batch norm. The channel dimension is 1; statistics reduce every other.

std::vector<int64_t> batch_dims(const Value& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != 1) dims.push_back(d);
  return dims;
}

// A per-channel [C] value broadcast over x's shape.
Value per_channel(Builder& b, const Value& v, const Value& x) { return b.broadcast_in_dim(v, x.shape(), {1}); }

// (x - mean) * invstd * weight + bias, with [C] mean and invstd.
Value normalize(LoweringContext& c, const Value& x, const Value& mean, const Value& invstd, size_t weight_arg,
                size_t bias_arg) {
  DType t = x.dtype();
  Value y = c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, x, per_channel(c.b, mean, x)),
                       per_channel(c.b, invstd, x));
  if (c.has(weight_arg)) y = c.b.binary(Binary::Multiply, y, per_channel(c.b, c.b.cast(c.tensor(weight_arg), t), x));
  if (c.has(bias_arg)) y = c.b.binary(Binary::Add, y, per_channel(c.b, c.b.cast(c.tensor(bias_arg), t), x));
  return y;
}

// An output of `type`: `v` when it has elements, else the empty tensor
// PyTorch returns for the unused statistics of an evaluation.
Value stat_out(LoweringContext& c, const Value& v, size_t k) {
  if (c.out(k).numel() == 0) return c.b.constant(0, c.out(k));
  return c.b.cast(c.b.reshape(v, c.out(k).shape), c.out(k).dtype);
}

struct BatchNormResult {
  std::vector<Value> outs;          // out, save_mean, save_invstd
  Value running_mean, running_var;  // updated (training) or as given; unset without running stats
};

// The shared batch norm: arguments input, weight, bias at 0..2; running
// stats at `rm`/`rv` (or none when rm < 0); training, momentum, eps given.
BatchNormResult batch_norm(LoweringContext& c, int rm, int rv, bool training, double momentum, double eps) {
  DType t = opmath_type(c.out(0).dtype);
  Value x = c.b.cast(c.tensor(0), t);
  if (x.rank() < 2 || x.type.numel() == 0) throw Declined("batch_norm: rank < 2 or empty input");
  std::vector<int64_t> dims = batch_dims(x);
  int64_t count = x.type.numel() / x.shape()[1];
  bool has_stats = rm >= 0 && c.has(rm) && c.has(rv);
  BatchNormResult r;
  if (training) {
    if (count <= 1) throw Declined("batch_norm: one value per channel in training");
    TensorType ct{t, {x.shape()[1]}};
    Value inv_count = c.b.constant(1.0 / static_cast<double>(count), ct);
    Value mean = c.b.binary(Binary::Multiply, c.b.reduce(x, c.b.scalar(0, t), dims, Binary::Add), inv_count);
    Value centered = c.b.binary(Binary::Subtract, x, per_channel(c.b, mean, x));
    Value ss = c.b.reduce(c.b.binary(Binary::Multiply, centered, centered), c.b.scalar(0, t), dims, Binary::Add);
    Value var = c.b.binary(Binary::Multiply, ss, inv_count);
    Value invstd = c.b.unary(Unary::Rsqrt, c.b.binary(Binary::Add, var, c.b.constant(eps, ct)));
    r.outs = {c.b.cast(normalize(c, x, mean, invstd, 1, 2), c.out(0).dtype), stat_out(c, mean, 1),
              stat_out(c, invstd, 2)};
    if (has_stats) {
      // running = (1 - momentum) * running + momentum * batch, unbiased variance.
      auto update = [&](const Value& running, const Value& batch) {
        DType rt = opmath_type(running.dtype());
        Value keep =
            c.b.binary(Binary::Multiply, c.b.cast(running, rt), c.b.constant(1 - momentum, {rt, running.shape()}));
        Value add = c.b.binary(Binary::Multiply, c.b.cast(batch, rt), c.b.constant(momentum, {rt, running.shape()}));
        return c.b.cast(c.b.binary(Binary::Add, keep, add), running.dtype());
      };
      Value unbiased = c.b.binary(Binary::Multiply, ss, c.b.constant(1.0 / static_cast<double>(count - 1), ct));
      r.running_mean = update(c.tensor(rm), mean);
      r.running_var = update(c.tensor(rv), unbiased);
    }
  } else {
    if (!has_stats) throw Declined("batch_norm: evaluation without running stats");
    Value mean = c.b.cast(c.tensor(rm), t);
    Value invstd =
        c.b.unary(Unary::Rsqrt, c.b.binary(Binary::Add, c.b.cast(c.tensor(rv), t), c.b.constant(eps, mean.type)));
    r.outs = {c.b.cast(normalize(c, x, mean, invstd, 1, 2), c.out(0).dtype), stat_out(c, mean, 1),
              stat_out(c, invstd, 2)};
  }
  if (has_stats && !training) {
    r.running_mean = c.tensor(rm);
    r.running_var = c.tensor(rv);
  }
  return r;
}

// _native_batch_norm_legit(input, weight?, bias?, running_mean!, running_var!,
// training, momentum, eps): the running stats are written arguments.
std::vector<Value> native_batch_norm_legit(LoweringContext& c) {
  BatchNormResult r = batch_norm(c, 3, 4, c.args[5].b, c.number(6), c.number(7));
  std::vector<Value> v = r.outs;
  // Evaluation: CPU returns empty saved statistics (the general kernel's meta correction).
  if (!c.args[5].b)
    for (size_t k = 1; k < 3; ++k) v[k] = c.b.constant(0, c.out(k));
  v.push_back(r.running_mean);
  v.push_back(r.running_var);
  return v;
}

// _batch_norm_with_update(input, weight?, bias?, running_mean!, running_var!,
// momentum, eps) -> (out, save_mean, save_invstd, reserve): training batch
// norm; reserve is CPU's empty byte tensor.
std::vector<Value> batch_norm_with_update(LoweringContext& c) {
  BatchNormResult r = batch_norm(c, 3, 4, true, c.number(5), c.number(6));
  std::vector<Value> v = r.outs;
  v.push_back(c.b.constant(0, c.out(3)));
  v.push_back(r.running_mean);
  v.push_back(r.running_var);
  return v;
}

// _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps)
std::vector<Value> native_batch_norm_legit_no_stats(LoweringContext& c) {
  return batch_norm(c, -1, -1, c.args[3].b, c.number(4), c.number(5)).outs;
}

// _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum, eps)
std::vector<Value> native_batch_norm_legit_no_training(LoweringContext& c) {
  return batch_norm(c, 3, 4, false, c.number(5), c.number(6)).outs;
}

// _native_batch_norm_legit_functional(input, weight?, bias?, running_mean,
// running_var, training, momentum, eps) -> (out, mean, invstd, running_mean, running_var)
std::vector<Value> native_batch_norm_legit_functional(LoweringContext& c) {
  BatchNormResult r = batch_norm(c, 3, 4, c.args[5].b, c.number(6), c.number(7));
  std::vector<Value> v = r.outs;
  v.push_back(c.b.cast(r.running_mean, c.out(3).dtype));
  v.push_back(c.b.cast(r.running_var, c.out(4).dtype));
  return v;
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
// running_var?, save_mean?, save_invstd?, train, eps, output_mask)
std::vector<Value> native_batch_norm_backward(LoweringContext& c) {
  const std::vector<int64_t>& mask = c.ints(9);
  if (mask.size() != 3) throw Declined("batch_norm_backward: output_mask of size != 3");
  DType t = opmath_type(c.tensor(1).dtype());
  Value g = c.b.cast(c.tensor(0), t), x = c.b.cast(c.tensor(1), t);
  if (x.rank() < 2 || x.type.numel() == 0) throw Declined("batch_norm_backward: rank < 2 or empty input");
  bool train = c.args[7].b;
  std::vector<int64_t> dims = batch_dims(x);
  int64_t channels = x.shape()[1];
  TensorType ct{t, {channels}};
  Value mean, invstd;
  if (train) {
    if (!c.has(5) || !c.has(6)) throw Declined("batch_norm_backward: no saved statistics");
    mean = c.b.cast(c.tensor(5), t);
    invstd = c.b.cast(c.tensor(6), t);
  } else {
    if (!c.has(3) || !c.has(4)) throw Declined("batch_norm_backward: evaluation without running stats");
    mean = c.b.cast(c.tensor(3), t);
    invstd = c.b.unary(Unary::Rsqrt, c.b.binary(Binary::Add, c.b.cast(c.tensor(4), t), c.b.constant(c.number(8), ct)));
  }
  Value w = c.has(2) ? c.b.cast(c.tensor(2), t) : c.b.constant(1, ct);
  Value xhat = c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, x, per_channel(c.b, mean, x)),
                          per_channel(c.b, invstd, x));
  Value sum_g = c.b.reduce(g, c.b.scalar(0, t), dims, Binary::Add);
  Value sum_gx = c.b.reduce(c.b.binary(Binary::Multiply, g, xhat), c.b.scalar(0, t), dims, Binary::Add);
  Value scale = per_channel(c.b, c.b.binary(Binary::Multiply, w, invstd), x);
  // Outputs left out of output_mask are undefined (an empty Value).
  std::vector<Value> grads(3);
  if (mask[1]) grads[1] = c.b.cast(c.b.reshape(sum_gx, c.out(1).shape), c.out(1).dtype);
  if (mask[2]) grads[2] = c.b.cast(c.b.reshape(sum_g, c.out(2).shape), c.out(2).dtype);
  if (!mask[0]) return grads;
  Value gi;
  if (train) {
    double inv_count = static_cast<double>(channels) / static_cast<double>(x.type.numel());
    Value mg = c.b.binary(Binary::Multiply, sum_g, c.b.constant(inv_count, ct));
    Value mgx = c.b.binary(Binary::Multiply, sum_gx, c.b.constant(inv_count, ct));
    Value inner = c.b.binary(Binary::Subtract, c.b.binary(Binary::Subtract, g, per_channel(c.b, mg, x)),
                             c.b.binary(Binary::Multiply, xhat, per_channel(c.b, mgx, x)));
    gi = c.b.binary(Binary::Multiply, scale, inner);
  } else {
    gi = c.b.binary(Binary::Multiply, scale, g);
  }
  grads[0] = c.b.cast(gi, c.out(0).dtype);
  return grads;
}

}  // namespace

LOWERING("aten::_softmax", softmax);
LOWERING("aten::_log_softmax", log_softmax);
LOWERING("aten::_safe_softmax", safe_softmax);
LOWERING("aten::_softmax_backward_data", softmax_backward);
LOWERING("aten::_log_softmax_backward_data", log_softmax_backward);
LOWERING("aten::native_layer_norm", layer_norm);
LOWERING("aten::native_layer_norm_backward", layer_norm_backward);
LOWERING("aten::native_group_norm", group_norm);
LOWERING("aten::native_group_norm_backward", group_norm_backward);
LOWERING("aten::_native_batch_norm_legit", native_batch_norm_legit);
LOWERING("aten::_native_batch_norm_legit.no_stats", native_batch_norm_legit_no_stats);
LOWERING("aten::_native_batch_norm_legit_no_training", native_batch_norm_legit_no_training);
LOWERING("aten::_native_batch_norm_legit_functional", native_batch_norm_legit_functional);
LOWERING("aten::native_batch_norm_backward", native_batch_norm_backward);
LOWERING("aten::_batch_norm_with_update", batch_norm_with_update);
// batch_norm_backward(grad_out, input, weight, running_mean, running_var,
// save_mean, save_var (the invstd), update, eps, output_mask, reserve): the same arguments in the same places.
LOWERING("aten::batch_norm_backward", native_batch_norm_backward);

}  // namespace torch_tpu::lowering
