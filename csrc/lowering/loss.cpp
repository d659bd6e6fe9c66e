// Loss functions and their backward ops. Reduction codes are PyTorch's:
// 0 none, 1 mean, 2 sum. Low-precision inputs compute in float32.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

constexpr int64_t kNone = 0, kMean = 1, kSum = 2;

// Everything nll_loss needs about its target, laid out on self's shape.
// The class dimension is 1 (0 for an unbatched 1-D input).
struct NllTerms {
  Value pick;  // bool, self's shape: the element of the target class
  Value w;     // target's shape: weight[target] * (target != ignore_index)
  Value bad;   // target's shape: a target outside [0, C) that is not ignored
  int64_t class_dim = 0;
};

NllTerms nll_terms(LoweringContext& c, const Value& self, const Value& target, int weight_arg, int64_t ignore_index,
                   DType t) {
  NllTerms r;
  r.class_dim = self.rank() == 1 ? 0 : 1;
  const int64_t classes = self.shape()[r.class_dim];
  std::vector<int64_t> other;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != r.class_dim) other.push_back(d);
  Value tgt = c.b.cast(target, DType::Int64);
  Value cls = c.b.iota({DType::Int64, self.shape()}, r.class_dim);
  r.pick = c.b.compare(Compare::EQ, cls, c.b.broadcast_in_dim(tgt, self.shape(), other));
  TensorType tt{DType::Int64, tgt.shape()};
  Value kept = c.b.compare(Compare::NE, tgt, c.b.constant_int(ignore_index, tt));
  Value in_range = c.b.binary(Binary::And, c.b.compare(Compare::GE, tgt, c.b.constant_int(0, tt)),
                              c.b.compare(Compare::LT, tgt, c.b.constant_int(classes, tt)));
  r.bad = c.b.binary(Binary::And, kept, c.b.unary(Unary::Not, in_range));
  TensorType wt{t, tgt.shape()};
  Value w = c.b.constant(1, wt);
  if (c.has(weight_arg)) {
    Value weight = c.b.broadcast_in_dim(c.b.cast(c.tensor(weight_arg), t), self.shape(), {r.class_dim});
    w = c.b.reduce(c.b.select(r.pick, weight, c.b.constant(0, {t, self.shape()})), c.b.scalar(0, t), {r.class_dim},
                   Binary::Add);
  }
  r.w = c.b.select(kept, w, c.b.constant(0, wt));
  // CPU raises for such a target; here the program checks it on the device.
  std::vector<int64_t> all;
  for (int64_t d = 0; d < tgt.rank(); ++d) all.push_back(d);
  Value ok = c.b.reduce(c.b.unary(Unary::Not, r.bad), c.b.scalar(1, DType::Bool), all, Binary::And);
  c.checks.push_back({ok, "Target is out of bounds: a target of nll_loss is not in [0, " + std::to_string(classes) +
                              ") and is not ignore_index (" + std::to_string(ignore_index) + ")"});
  return r;
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction,
// ignore_index) -> (output, total_weight). A target out of range raises
// IndexError (the device check); its loss is NaN, never a plausible number.
std::vector<Value> nll_loss_forward(LoweringContext& c) {
  DType t = opmath_type(c.out(0).dtype);
  Value self = c.b.cast(c.tensor(0), t);
  if (self.rank() == 0 || self.type.numel() == 0) throw Declined("nll_loss: empty or 0-d input");
  int64_t reduction = c.integer(3);
  NllTerms n = nll_terms(c, self, c.tensor(1), 2, c.integer(4), t);
  Value picked =
      c.b.reduce(c.b.select(n.pick, self, c.b.constant(0, self.type)), c.b.scalar(0, t), {n.class_dim}, Binary::Add);
  TensorType lt = n.w.type;
  Value loss =
      c.b.select(n.bad, c.b.constant(NAN, lt), c.b.unary(Unary::Negate, c.b.binary(Binary::Multiply, picked, n.w)));
  std::vector<int64_t> all;
  for (int64_t d = 0; d < lt.rank(); ++d) all.push_back(d);
  Value total = c.b.reduce(n.w, c.b.scalar(0, t), all, Binary::Add);
  Value out;
  if (reduction == kNone) {
    out = loss;
    if (lt.rank() == 0) total = c.b.reshape(n.w, {});
  } else {
    out = c.b.reduce(loss, c.b.scalar(0, t), all, Binary::Add);
    if (reduction == kMean) out = c.b.binary(Binary::Divide, out, total);
  }
  return {c.b.cast(c.b.reshape(out, c.out(0).shape), c.out(0).dtype),
          c.b.cast(c.b.reshape(total, c.out(1).shape), c.out(1).dtype)};
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?,
// reduction, ignore_index, total_weight): -w * g at the target class.
std::vector<Value> nll_loss_backward(LoweringContext& c) {
  DType t = opmath_type(c.out().dtype);
  Value self = c.b.cast(c.tensor(1), t);
  if (self.rank() == 0 || self.type.numel() == 0) throw Declined("nll_loss_backward: empty or 0-d input");
  int64_t reduction = c.integer(4);
  NllTerms n = nll_terms(c, self, c.tensor(2), 3, c.integer(5), t);
  Value g = c.b.cast(c.tensor(0), t);
  if (reduction == kNone) {
    g = c.b.reshape(g, n.w.shape());
  } else {
    g = c.b.reshape(g, {});
    if (reduction == kMean) g = c.b.binary(Binary::Divide, g, c.b.reshape(c.b.cast(c.tensor(6), t), {}));
    g = c.b.broadcast_in_dim(g, n.w.shape(), {});
  }
  Value per = c.b.unary(Unary::Negate, c.b.binary(Binary::Multiply, n.w, g));
  std::vector<int64_t> other;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != n.class_dim) other.push_back(d);
  // Ignored targets (w = 0) leave 0, as CPU skips them (even when g / 0 is inf).
  Value kept = c.b.compare(Compare::NE, n.w, c.b.constant(0, n.w.type));
  Value pick = c.b.binary(Binary::And, n.pick, c.b.broadcast_in_dim(kept, self.shape(), other));
  Value grad = c.b.select(pick, c.b.broadcast_in_dim(per, self.shape(), other), c.b.constant(0, self.type));
  return {c.b.cast(grad, c.out().dtype)};
}

// Applies a reduction to elementwise losses.
Value reduce_loss(LoweringContext& c, const Value& loss, int64_t reduction) {
  if (reduction == kNone) return loss;
  std::vector<int64_t> all;
  for (int64_t d = 0; d < loss.rank(); ++d) all.push_back(d);
  Value s = c.b.reduce(loss, c.b.scalar(0, loss.dtype()), all, Binary::Add);
  if (reduction == kMean)
    s = c.b.binary(Binary::Divide, s, c.b.scalar(static_cast<double>(loss.type.numel()), loss.dtype()));
  return s;
}

// The upstream gradient of a reduced loss, as a value of `type`.
Value loss_grad(LoweringContext& c, const TensorType& type, int64_t reduction) {
  Value g = c.b.cast(c.tensor(0), type.dtype);
  if (reduction == kNone) return c.b.broadcast_to(g, type.shape);
  g = c.b.broadcast_in_dim(c.b.reshape(g, {}), type.shape, {});
  if (reduction == kMean) g = c.b.binary(Binary::Divide, g, c.b.constant(static_cast<double>(type.numel()), type));
  return g;
}

// mse_loss(self, target, reduction)
std::vector<Value> mse_loss(LoweringContext& c) {
  DType t = opmath_type(c.out().dtype);
  TensorType type{t, c.tensor(0).shape()};
  if (c.tensor(0).shape() != c.tensor(1).shape()) throw Declined("mse_loss: broadcasting");
  Value d = c.b.binary(Binary::Subtract, c.b.cast(c.tensor(0), t), c.b.cast(c.tensor(1), t));
  Value l = reduce_loss(c, c.b.binary(Binary::Multiply, d, d), c.integer(2));
  return {c.b.cast(c.b.reshape(l, c.out().shape), c.out().dtype)};
}

// mse_loss_backward(grad_output, self, target, reduction): 2 (x - y) g
std::vector<Value> mse_loss_backward(LoweringContext& c) {
  DType t = opmath_type(c.out().dtype);
  if (c.tensor(1).shape() != c.tensor(2).shape() || c.out().shape != c.tensor(1).shape())
    throw Declined("mse_loss_backward: broadcasting");
  TensorType type{t, c.out().shape};
  Value d = c.b.binary(Binary::Subtract, c.b.cast(c.tensor(1), t), c.b.cast(c.tensor(2), t));
  Value g = loss_grad(c, type, c.integer(3));
  Value r = c.b.binary(Binary::Multiply, c.b.binary(Binary::Multiply, c.b.constant(2, type), d), g);
  return {c.b.cast(r, c.out().dtype)};
}

// The elementwise losses below take (…, self, target, …) with equal shapes:
// PyTorch warns on broadcasting, which runs on the CPU fallback.
void same_shapes(LoweringContext& c, size_t self, const char* op) {
  if (c.tensor(self).shape() != c.tensor(self + 1).shape())
    throw Declined(std::string(op) + ": self and target of different shapes (broadcasting)");
}

// self - target in the compute type.
Value difference(LoweringContext& c, size_t self, DType t) {
  return c.b.binary(Binary::Subtract, c.b.cast(c.tensor(self), t), c.b.cast(c.tensor(self + 1), t));
}

Value finish(LoweringContext& c, const Value& v) { return c.b.cast(c.b.reshape(v, c.out().shape), c.out().dtype); }

// smooth_l1_loss(self, target, reduction, beta): 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta.
// huber_loss(self, target, reduction, delta): 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta).
LoweringRule smooth_loss(bool huber) {
  return [huber](LoweringContext& c) -> std::vector<Value> {
    same_shapes(c, 0, huber ? "huber_loss" : "smooth_l1_loss");
    DType t = opmath_type(c.out().dtype);
    Value d = difference(c, 0, t);
    TensorType type = d.type;
    Value a = c.b.unary(Unary::Abs, d), limit = c.value_as(3, type), half = c.b.constant(0.5, type);
    Value quad = c.b.binary(Binary::Multiply, half, c.b.binary(Binary::Multiply, d, d));
    Value lin = c.b.binary(Binary::Subtract, a, c.b.binary(Binary::Multiply, half, limit));
    if (huber)
      lin = c.b.binary(Binary::Multiply, limit, lin);
    else
      quad = c.b.binary(Binary::Divide, quad, limit);
    Value l = c.b.select(c.b.compare(Compare::LT, a, limit), quad, lin);
    return {finish(c, reduce_loss(c, l, c.integer(2)))};
  };
}

// smooth_l1_loss_backward(grad_output, self, target, reduction, beta): g * clamp(d / beta, -1, 1)
// huber_loss_backward(..., delta): g * clamp(d, -delta, delta).
LoweringRule smooth_loss_backward(bool huber) {
  return [huber](LoweringContext& c) -> std::vector<Value> {
    same_shapes(c, 1, huber ? "huber_loss_backward" : "smooth_l1_loss_backward");
    DType t = opmath_type(c.out().dtype);
    Value d = difference(c, 1, t);
    TensorType type = d.type;
    Value limit = c.value_as(4, type);
    Value hi = huber ? limit : c.b.constant(1, type);
    Value lo = c.b.unary(Unary::Negate, hi);
    Value inner = huber ? d : c.b.binary(Binary::Divide, d, limit);
    // CPU's order of tests: with beta 0, d == 0 gives -1.
    Value r = c.b.select(c.b.compare(Compare::LE, d, c.b.unary(Unary::Negate, limit)), lo,
                         c.b.select(c.b.compare(Compare::GE, d, limit), hi, inner));
    return {finish(c, c.b.binary(Binary::Multiply, r, loss_grad(c, type, c.integer(3))))};
  };
}

// binary_cross_entropy(self, target, weight?, reduction):
// -w (y log x + (1 - y) log(1 - x)), each log clamped to >= -100 as on CPU.
std::vector<Value> binary_cross_entropy(LoweringContext& c) {
  same_shapes(c, 0, "binary_cross_entropy");
  DType t = opmath_type(c.out().dtype);
  Value x = c.b.cast(c.tensor(0), t), y = c.b.cast(c.tensor(1), t);
  TensorType type = x.type;
  Value one = c.b.constant(1, type), floor = c.b.constant(-100, type);
  Value log_x = c.b.binary(Binary::Maximum, c.b.unary(Unary::Log, x), floor);
  Value log_1mx = c.b.binary(Binary::Maximum, c.b.unary(Unary::Log1p, c.b.unary(Unary::Negate, x)), floor);
  Value l = c.b.binary(Binary::Add, c.b.binary(Binary::Multiply, y, log_x),
                       c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, one, y), log_1mx));
  l = c.b.unary(Unary::Negate, l);
  if (c.has(2)) l = c.b.binary(Binary::Multiply, l, c.b.broadcast_to(c.b.cast(c.tensor(2), t), type.shape));
  return {finish(c, reduce_loss(c, l, c.integer(3)))};
}

// binary_cross_entropy_backward(grad_output, self, target, weight?, reduction):
// g w (x - y) / max(x (1 - x), 1e-12), as CPU computes it.
std::vector<Value> binary_cross_entropy_backward(LoweringContext& c) {
  same_shapes(c, 1, "binary_cross_entropy_backward");
  DType t = opmath_type(c.out().dtype);
  Value x = c.b.cast(c.tensor(1), t);
  TensorType type = x.type;
  Value denom = c.b.binary(Binary::Maximum,
                           c.b.binary(Binary::Multiply, c.b.binary(Binary::Subtract, c.b.constant(1, type), x), x),
                           c.b.constant(1e-12, type));
  Value r = c.b.binary(Binary::Divide, difference(c, 1, t), denom);
  r = c.b.binary(Binary::Multiply, r, loss_grad(c, type, c.integer(4)));
  if (c.has(3)) r = c.b.binary(Binary::Multiply, r, c.b.broadcast_to(c.b.cast(c.tensor(3), t), type.shape));
  return {finish(c, r)};
}

// x[n, index[n, k]] for x [N, C] and integer index [N, K] in [0, C).
Value pick_classes(Builder& b, const Value& x, const Value& index) {
  Value classes = b.iota({DType::Int64, {x.shape()[0], index.shape()[1], x.shape()[1]}}, 2);
  Value hit = b.compare(Compare::EQ, classes, b.broadcast_in_dim(index, classes.shape(), {0, 1}));
  Value spread = b.broadcast_in_dim(x, classes.shape(), {0, 2});
  return b.reduce(b.select(hit, spread, b.constant(0, {x.dtype(), classes.shape()})), b.scalar(0, x.dtype()), {2},
                  Binary::Add);
}

// The per-sample weight of a reduced loss's upstream gradient, [N]:
// g[n] (none), g / N (mean) or g (sum).
Value per_sample_grad(LoweringContext& c, int64_t n, int64_t reduction, DType t) {
  Value g = c.b.cast(c.tensor(0), t);
  if (reduction == kNone) return c.b.reshape(g, {n});
  g = c.b.broadcast_in_dim(c.b.reshape(g, {}), {n}, {});
  if (reduction == kMean) g = c.b.binary(Binary::Divide, g, c.b.constant(static_cast<double>(n), {t, {n}}));
  return g;
}

// multi_margin_loss's terms over x [N, C]: z = margin - x[y] + x[i] where it
// counts (i != y and z > 0), per-sample weights w[y] / C, y as [N].
struct MultiMargin {
  Value x, y, z, active, scale;
};
MultiMargin multi_margin_terms(LoweringContext& c, size_t self, size_t target, size_t margin, size_t weight, DType t) {
  MultiMargin m;
  Value x = c.b.cast(c.tensor(self), t);
  m.x = c.b.reshape(x, {x.rank() == 2 ? x.shape()[0] : 1, x.rank() == 2 ? x.shape()[1] : x.type.numel()});
  const int64_t n = m.x.shape()[0], classes = m.x.shape()[1];
  m.y = c.b.reshape(c.b.cast(c.tensor(target), DType::Int64), {n});
  const TensorType yt{DType::Int64, {n}}, xt{t, m.x.shape()};
  Value in_range = c.b.binary(Binary::And, c.b.compare(Compare::GE, m.y, c.b.constant_int(0, yt)),
                              c.b.compare(Compare::LT, m.y, c.b.constant_int(classes, yt)));
  c.checks.push_back({c.b.reduce(in_range, c.b.scalar(1, DType::Bool), {0}, Binary::And),
                      "multi_margin_loss: target out of range (not in [0, " + std::to_string(classes) + "))", false});
  Value x_y = c.b.reshape(pick_classes(c.b, m.x, c.b.reshape(m.y, {n, 1})), {n});
  m.z = c.b.binary(
      Binary::Add,
      c.b.binary(Binary::Subtract, c.b.constant(c.number(margin), xt), c.b.broadcast_in_dim(x_y, m.x.shape(), {0})),
      m.x);
  Value not_target =
      c.b.compare(Compare::NE, c.b.iota({DType::Int64, m.x.shape()}, 1), c.b.broadcast_in_dim(m.y, m.x.shape(), {0}));
  m.active = c.b.binary(Binary::And, not_target, c.b.compare(Compare::GT, m.z, c.b.constant(0, xt)));
  m.scale = c.b.constant(1.0 / static_cast<double>(classes), {t, {n}});
  if (c.has(weight)) {
    Value w = c.b.reshape(c.b.cast(c.tensor(weight), t), {1, classes});
    m.scale = c.b.binary(Binary::Multiply, m.scale, c.b.reshape(pick_classes(c.b, w, c.b.reshape(m.y, {1, n})), {n}));
  }
  return m;
}

// multi_margin_loss(self, target, p, margin, weight?, reduction): per sample
// the sum over classes i != y of w[y] max(0, margin - x[y] + x[i])^p, over C.
std::vector<Value> multi_margin_loss(LoweringContext& c) {
  const DType t = opmath_type(c.out().dtype);
  MultiMargin m = multi_margin_terms(c, 0, 1, 3, 4, t);
  Value h = c.integer(2) == 2 ? c.b.binary(Binary::Multiply, m.z, m.z) : m.z;
  h = c.b.select(m.active, h, c.b.constant(0, h.type));
  Value loss = c.b.binary(Binary::Multiply, c.b.reduce(h, c.b.scalar(0, t), {1}, Binary::Add), m.scale);
  if (c.tensor(0).rank() < 2) loss = c.b.reshape(loss, {});
  return {c.b.cast(c.b.reshape(reduce_loss(c, loss, c.integer(5)), c.out().shape), c.out().dtype)};
}

// multi_margin_loss_backward(grad_output, self, target, p, margin, weight?,
// reduction): each counted term's derivative (1, or 2z for p = 2) on x[i],
// their negated sum on x[y].
std::vector<Value> multi_margin_loss_backward(LoweringContext& c) {
  const DType t = opmath_type(c.out().dtype);
  MultiMargin m = multi_margin_terms(c, 1, 2, 4, 5, t);
  const int64_t n = m.x.shape()[0];
  Value d =
      c.integer(3) == 2 ? c.b.binary(Binary::Multiply, c.b.constant(2, m.z.type), m.z) : c.b.constant(1, m.z.type);
  Value per_sample = c.b.binary(Binary::Multiply, m.scale, per_sample_grad(c, n, c.integer(6), t));
  d = c.b.binary(Binary::Multiply, c.b.select(m.active, d, c.b.constant(0, d.type)),
                 c.b.broadcast_in_dim(per_sample, m.x.shape(), {0}));
  Value is_y =
      c.b.compare(Compare::EQ, c.b.iota({DType::Int64, m.x.shape()}, 1), c.b.broadcast_in_dim(m.y, m.x.shape(), {0}));
  Value total = c.b.broadcast_in_dim(c.b.reduce(d, c.b.scalar(0, t), {1}, Binary::Add), m.x.shape(), {0});
  Value grad = c.b.select(is_y, c.b.unary(Unary::Negate, total), d);
  return {c.b.cast(c.b.reshape(grad, c.out().shape), c.out().dtype)};
}

// multilabel_margin_loss's terms over x [N, C]: target holds each sample's
// classes up to its first negative label; for [n, position, class], where the
// position counts and the class is no target, z = 1 - x[label] + x[class].
struct MultiLabel {
  Value x, is_target, z, active;  // active: those terms with z > 0
};
MultiLabel multilabel_terms(LoweringContext& c, size_t self, size_t target, DType t) {
  MultiLabel m;
  Value x = c.b.cast(c.tensor(self), t);
  m.x = c.b.reshape(x, {x.rank() == 2 ? x.shape()[0] : 1, x.rank() == 2 ? x.shape()[1] : x.type.numel()});
  const int64_t n = m.x.shape()[0], classes = m.x.shape()[1];
  const TensorType lt{DType::Int64, {n, classes}};
  Value labels = c.b.reshape(c.b.cast(c.tensor(target), DType::Int64), lt.shape);
  Value negative = c.b.compare(Compare::LT, labels, c.b.constant_int(0, lt));
  Value first_stop = c.b.reduce(c.b.select(negative, c.b.iota(lt, 1), c.b.constant_int(classes, lt)),
                                c.b.scalar(static_cast<double>(classes), DType::Int64), {1}, Binary::Minimum);
  Value counted = c.b.compare(Compare::LT, c.b.iota(lt, 1), c.b.broadcast_in_dim(first_stop, lt.shape, {0}));
  Value in_range = c.b.compare(Compare::LT, labels, c.b.constant_int(classes, lt));
  c.checks.push_back({c.b.reduce(c.b.binary(Binary::Or, c.b.unary(Unary::Not, counted), in_range),
                                 c.b.scalar(1, DType::Bool), {0, 1}, Binary::And),
                      "multilabel_margin_loss: target out of range (not in [-1, " + std::to_string(classes) + "))",
                      false});
  Value safe = c.b.select(counted, labels, c.b.constant_int(0, lt));
  const Shape cube{n, classes, classes};  // [n, position, class]
  Value counted3 = c.b.broadcast_in_dim(counted, cube, {0, 1});
  Value holds = c.b.compare(Compare::EQ, c.b.broadcast_in_dim(labels, cube, {0, 1}), c.b.iota({DType::Int64, cube}, 2));
  m.is_target = c.b.reduce(c.b.binary(Binary::And, holds, counted3), c.b.scalar(0, DType::Bool), {1}, Binary::Or);
  Value x_label = c.b.broadcast_in_dim(pick_classes(c.b, m.x, safe), cube, {0, 1});
  m.z = c.b.binary(Binary::Add, c.b.binary(Binary::Subtract, c.b.constant(1, {t, cube}), x_label),
                   c.b.broadcast_in_dim(m.x, cube, {0, 2}));
  Value kept =
      c.b.binary(Binary::And, counted3, c.b.unary(Unary::Not, c.b.broadcast_in_dim(m.is_target, cube, {0, 2})));
  m.active = c.b.binary(Binary::And, kept, c.b.compare(Compare::GT, m.z, c.b.constant(0, {t, cube})));
  return m;
}

// multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target):
// the sum of max(0, 1 - x[j] + x[i]) over target classes j and the others i, over C.
std::vector<Value> multilabel_margin_loss(LoweringContext& c) {
  const DType t = opmath_type(c.out().dtype);
  MultiLabel m = multilabel_terms(c, 0, 1, t);
  const int64_t n = m.x.shape()[0], classes = m.x.shape()[1];
  Value h = c.b.select(m.active, m.z, c.b.constant(0, m.z.type));
  Value loss = c.b.binary(Binary::Divide, c.b.reduce(h, c.b.scalar(0, t), {1, 2}, Binary::Add),
                          c.b.constant(static_cast<double>(classes), {t, {n}}));
  if (c.tensor(0).rank() < 2) loss = c.b.reshape(loss, {});
  Value out = c.b.cast(c.b.reshape(reduce_loss(c, loss, c.integer(2)), c.out(0).shape), c.out(0).dtype);
  const TensorType flags_t{c.out(1).dtype, {n, classes}};
  Value flags = c.b.select(m.is_target, c.b.constant(1, flags_t), c.b.constant(0, flags_t));
  return {out, c.b.reshape(flags, c.out(1).shape)};
}

// multilabel_margin_loss_backward(grad_output, self, target, reduction,
// is_target): +1/C on x[class] and -1/C on x[label] per counted term.
std::vector<Value> multilabel_margin_loss_backward(LoweringContext& c) {
  const DType t = opmath_type(c.out().dtype);
  MultiLabel m = multilabel_terms(c, 1, 2, t);
  const int64_t n = m.x.shape()[0], classes = m.x.shape()[1];
  const Shape cube{n, classes, classes};
  Value per_sample = c.b.binary(Binary::Divide, per_sample_grad(c, n, c.integer(3), t),
                                c.b.constant(static_cast<double>(classes), {t, {n}}));
  Value d = c.b.select(m.active, c.b.broadcast_in_dim(per_sample, cube, {0}), c.b.constant(0, {t, cube}));
  Value on_class = c.b.reduce(d, c.b.scalar(0, t), {1}, Binary::Add);      // [n, class]
  Value per_position = c.b.reduce(d, c.b.scalar(0, t), {2}, Binary::Add);  // [n, position]
  // Each position's share goes to its label's class.
  const TensorType lt{DType::Int64, {n, classes}};
  Value labels = c.b.reshape(c.b.cast(c.tensor(2), DType::Int64), lt.shape);
  Value to_label =
      c.b.compare(Compare::EQ, c.b.broadcast_in_dim(labels, cube, {0, 1}), c.b.iota({DType::Int64, cube}, 2));
  Value on_label =
      c.b.reduce(c.b.select(to_label, c.b.broadcast_in_dim(per_position, cube, {0, 1}), c.b.constant(0, {t, cube})),
                 c.b.scalar(0, t), {1}, Binary::Add);
  Value grad = c.b.binary(Binary::Subtract, on_class, on_label);
  return {c.b.cast(c.b.reshape(grad, c.out().shape), c.out().dtype)};
}

// CTC (connectionist temporal classification), as PyTorch's CPU kernel: over
// each sample's extended target l' (blank, t1, blank, t2, ..., blank; W = 2S+1
// positions), alpha[t, s] = lse(alpha[t-1, s], alpha[t-1, s-1], alpha[t-1, s-2]
// where l'_s differs from l'_(s-2)) + log_probs[t, l'_s], one while-loop step
// per time step for the whole batch (a sample past its input length keeps its
// last column); the loss is -lse of the last two positions. The backward runs
// beta the same way from each sample's last step and gives
// exp(lp) - exp(lse over s with l'_s = c of alpha + beta, + nll - lp).
struct Ctc {
  Value lp;          // [T, N, C], the compute type
  Value ext;         // [N, W] int64: l'
  Value lp_ext;      // [N, T, W]: log_probs at l'
  Value skip;        // [N, W] bool: s may come from s - 2
  Value input_len;   // [N] int64
  Value target_len;  // [N] int64
  int64_t steps = 0, batch = 0, classes = 0, width = 0;
  bool batched = true;
};

// A length argument (int[] or a tensor) as int64 [n].
Value lengths_arg(LoweringContext& c, size_t i, int64_t n) {
  if (c.args[i].kind == LoweringArg::Tensor) return c.b.reshape(c.b.cast(c.tensor(i), DType::Int64), {n});
  return c.b.constant_array_int(c.ints(i), {DType::Int64, {n}});
}

Value log_add(Builder& b, const std::vector<Value>& xs) {
  Value m = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) m = b.binary(Binary::Maximum, m, xs[i]);
  Value finite = b.compare(Compare::GT, m, b.constant(-INFINITY, m.type));
  Value safe = b.select(finite, m, b.constant(0, m.type)), sum = b.constant(0, m.type);
  for (const Value& x : xs) sum = b.binary(Binary::Add, sum, b.unary(Unary::Exp, b.binary(Binary::Subtract, x, safe)));
  return b.select(finite, b.binary(Binary::Add, safe, b.unary(Unary::Log, sum)), m);
}

// x shifted right by k along dim 1 (positions s < k get -inf).
Value shift_right(Builder& b, const Value& x, int64_t k) {
  const int64_t w = x.shape()[1];
  Value padded = b.pad(x, b.constant(-INFINITY, {x.dtype(), {}}), {0, k}, {0, 0}, {0, 0});
  return b.slice(padded, {0, 0}, {x.shape()[0], w}, {1, 1});
}
Value shift_left(Builder& b, const Value& x, int64_t k) {
  const int64_t w = x.shape()[1];
  Value padded = b.pad(x, b.constant(-INFINITY, {x.dtype(), {}}), {0, 0}, {0, k}, {0, 0});
  return b.slice(padded, {0, k}, {x.shape()[0], w + k}, {1, 1});
}

Ctc ctc_terms(LoweringContext& c, size_t lp_arg, size_t target_arg, size_t in_len_arg, size_t target_len_arg,
              size_t blank_arg, int64_t width) {
  Builder& b = c.b;
  Ctc k;
  Value lp = c.tensor(lp_arg);
  k.batched = lp.rank() == 3;
  if (!k.batched) lp = b.reshape(lp, {lp.shape()[0], 1, lp.shape()[1]});
  const DType t = opmath_type(lp.dtype());
  k.lp = b.cast(lp, t);
  k.steps = lp.shape()[0], k.batch = lp.shape()[1], k.classes = lp.shape()[2], k.width = width;
  const int64_t n = k.batch, s_max = (width - 1) / 2;
  k.input_len = lengths_arg(c, in_len_arg, n);
  k.target_len = lengths_arg(c, target_len_arg, n);
  // Targets padded to [N, S]: a 2-D tensor as it is, a 1-D one cut at the lengths' running sums.
  Value targets = b.cast(c.tensor(target_arg), DType::Int64);
  Value padded;
  if (s_max == 0) {
    padded = b.constant_int(0, {DType::Int64, {n, 0}});
  } else if (targets.rank() == 2 || !k.batched) {
    padded = targets.rank() == 2 ? b.slice(targets, {0, 0}, {n, s_max}, {1, 1})
                                 : b.reshape(b.slice(targets, {0}, {s_max}, {1}), {1, s_max});
  } else {
    Value ends = scan(b, k.target_len, 0, Binary::Add, 0);
    Value starts = b.binary(Binary::Subtract, ends, k.target_len);
    Value at =
        b.binary(Binary::Add, b.broadcast_in_dim(starts, {n, s_max}, {0}), b.iota({DType::Int64, {n, s_max}}, 1));
    const int64_t total = targets.shape()[0];
    at = b.clamp(b.constant_int(0, {DType::Int64, {n, s_max}}), at,
                 b.constant_int(std::max<int64_t>(total - 1, 0), {DType::Int64, {n, s_max}}));
    padded = total == 0 ? b.constant_int(0, {DType::Int64, {n, s_max}})
                        : b.reshape(take_along(b, targets, 0, b.reshape(at, {n * s_max})), {n, s_max});
  }
  const TensorType wt{DType::Int64, {n, width}};
  Value s = b.iota(wt, 1);
  Value odd = b.compare(Compare::EQ, b.binary(Binary::Remainder, s, b.constant_int(2, wt)), b.constant_int(1, wt));
  Value label_at = b.clamp(b.constant_int(0, wt), b.binary(Binary::Divide, s, b.constant_int(2, wt)),
                           b.constant_int(std::max<int64_t>(s_max - 1, 0), wt));
  Value labels = s_max == 0 ? b.constant_int(0, wt) : gather_along(b, padded, 1, label_at);
  const int64_t blank = c.integer(blank_arg);
  k.ext = b.select(odd, labels, b.constant_int(blank, wt));
  Value two_back = b.binary(Binary::Subtract, s, b.constant_int(2, wt));
  Value ext_back =
      b.select(b.compare(Compare::GE, two_back, b.constant_int(0, wt)),
               gather_along(b, k.ext, 1, b.clamp(b.constant_int(0, wt), two_back, b.constant_int(width - 1, wt))),
               b.constant_int(blank, wt));
  k.skip = b.binary(Binary::And, b.binary(Binary::And, odd, b.compare(Compare::GE, s, b.constant_int(2, wt))),
                    b.compare(Compare::NE, k.ext, ext_back));
  // log_probs at l': [N, T, W].
  Value lp_ntc = b.transpose(k.lp, {1, 0, 2});
  Value index = b.broadcast_in_dim(k.ext, {n, k.steps, width}, {0, 2});
  k.lp_ext = gather_along(b, lp_ntc, 2, index);
  return k;
}

// Column t (0-d int64) of a [N, T, W] table.
Value at_step(Builder& b, const Value& table, const Value& t) {
  Value zero = b.constant_int(0, {DType::Int64, {}});
  return b.reshape(b.dynamic_slice(table, {zero, t, zero}, {table.shape()[0], 1, table.shape()[2]}),
                   {table.shape()[0], table.shape()[2]});
}
Value put_step(Builder& b, const Value& table, const Value& column, const Value& t) {
  Value zero = b.constant_int(0, {DType::Int64, {}});
  return b.dynamic_update_slice(table, b.reshape(column, {table.shape()[0], 1, table.shape()[2]}), {zero, t, zero});
}

// alpha [N, T, W] (-inf past each input length) and the loss [N].
std::pair<Value, Value> ctc_alpha(Builder& b, const Ctc& k) {
  const int64_t n = k.batch, w = k.width;
  const DType t = k.lp.dtype();
  const TensorType col{t, {n, w}}, it{DType::Int64, {n, w}};
  Value s = b.iota(it, 1);
  Value first = at_step(b, k.lp_ext, b.constant_int(0, {DType::Int64, {}}));
  Value has_label =
      b.broadcast_in_dim(b.compare(Compare::GT, k.target_len, b.constant_int(0, {DType::Int64, {n}})), {n, w}, {0});
  Value start = b.binary(Binary::Or, b.compare(Compare::EQ, s, b.constant_int(0, it)),
                         b.binary(Binary::And, b.compare(Compare::EQ, s, b.constant_int(1, it)), has_label));
  Value alive0 =
      b.broadcast_in_dim(b.compare(Compare::GT, k.input_len, b.constant_int(0, {DType::Int64, {n}})), {n, w}, {0});
  Value a0 = b.select(b.binary(Binary::And, start, alive0), first, b.constant(-INFINITY, col));
  Value table = put_step(b, b.constant(-INFINITY, {t, {n, k.steps, w}}), a0, b.constant_int(0, {DType::Int64, {}}));
  const TensorType scalar{DType::Int64, {}};
  auto state = b.while_loop(
      {b.constant_int(1, scalar), a0, table, k.lp_ext, k.skip, k.input_len},
      [&](Builder& r, const std::vector<Value>& st) -> std::vector<Value> {
        return {r.compare(Compare::LT, st[0], r.constant_int(k.steps, scalar))};
      },
      [&](Builder& r, const std::vector<Value>& st) -> std::vector<Value> {
        const Value &step = st[0], &prev = st[1];
        Value from_two = r.select(st[4], shift_right(r, prev, 2), r.constant(-INFINITY, col));
        Value next =
            r.binary(Binary::Add, log_add(r, {prev, shift_right(r, prev, 1), from_two}), at_step(r, st[3], step));
        Value active = r.broadcast_in_dim(r.compare(Compare::LT, r.broadcast_to(step, {n}), st[5]), {n, w}, {0});
        Value kept = r.select(active, next, prev);
        Value stored = put_step(r, st[2], r.select(active, next, r.constant(-INFINITY, col)), step);
        return {r.binary(Binary::Add, step, r.constant_int(1, scalar)), kept, stored, st[3], st[4], st[5]};
      });
  // The loss from the last column: -lse(alpha[2S], alpha[2S-1]) (only alpha[0] for an empty target).
  Value last = state[1];
  Value end = b.binary(Binary::Multiply, k.target_len, b.constant_int(2, {DType::Int64, {n}}));
  auto pick = [&](const Value& pos) {
    Value safe = b.clamp(b.constant_int(0, {DType::Int64, {n}}), pos, b.constant_int(w - 1, {DType::Int64, {n}}));
    return b.reshape(gather_along(b, last, 1, b.reshape(safe, {n, 1})), {n});
  };
  Value a_end = pick(end), a_before = pick(b.binary(Binary::Subtract, end, b.constant_int(1, {DType::Int64, {n}})));
  a_before = b.select(b.compare(Compare::GT, k.target_len, b.constant_int(0, {DType::Int64, {n}})), a_before,
                      b.constant(-INFINITY, {t, {n}}));
  Value nll = b.unary(Unary::Negate, log_add(b, {a_end, a_before}));
  return {state[2], nll};
}

// _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity) -> (nll, log_alpha);
// an impossible alignment stays inf (ctc_loss zeroes it for zero_infinity, the backward reads it).
std::vector<Value> ctc_loss(LoweringContext& c) {
  Ctc k = ctc_terms(c, 0, 1, 2, 3, 4, c.out(1).shape.back());
  auto [alpha, nll] = ctc_alpha(c.b, k);
  return {c.b.reshape(c.b.cast(nll, c.out(0).dtype), c.out(0).shape),
          c.b.reshape(c.b.cast(alpha, c.out(1).dtype), c.out(1).shape)};
}

// _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
// neg_log_likelihood, log_alpha, blank, zero_infinity) -> grad of log_probs.
std::vector<Value> ctc_loss_backward(LoweringContext& c) {
  Builder& b = c.b;
  Value alpha_in = c.tensor(6);
  const int64_t width = alpha_in.shape().back();
  Ctc k = ctc_terms(c, 1, 2, 3, 4, 7, width);
  const int64_t n = k.batch, w = width, steps = k.steps;
  const DType t = k.lp.dtype();
  const TensorType col{t, {n, w}}, it{DType::Int64, {n, w}}, scalar{DType::Int64, {}};
  Value alpha = b.reshape(b.cast(alpha_in, t), {n, steps, w});
  Value nll = b.reshape(b.cast(c.tensor(5), t), {n});
  // beta, from each sample's last step back to 0.
  Value s = b.iota(it, 1);
  Value end =
      b.broadcast_in_dim(b.binary(Binary::Multiply, k.target_len, b.constant_int(2, {DType::Int64, {n}})), {n, w}, {0});
  Value last_two =
      b.binary(Binary::Or, b.compare(Compare::EQ, s, end),
               b.binary(Binary::And, b.compare(Compare::EQ, s, b.binary(Binary::Subtract, end, b.constant_int(1, it))),
                        b.compare(Compare::GT, end, b.constant_int(0, it))));
  // skip_into[s]: s + 2 may come from s (the skip flag of s + 2).
  Value skip_into =
      b.slice(b.pad(k.skip, b.constant(0, {DType::Bool, {}}), {0, 0}, {0, 2}, {0, 0}), {0, 2}, {n, w + 2}, {1, 1});
  auto state = b.while_loop(
      {b.constant_int(steps - 1, scalar), b.constant(-INFINITY, col), b.constant(-INFINITY, {t, {n, steps, w}}),
       k.lp_ext, skip_into, k.input_len, last_two},
      [&](Builder& r, const std::vector<Value>& st) -> std::vector<Value> {
        return {r.compare(Compare::GE, st[0], r.constant_int(0, scalar))};
      },
      [&](Builder& r, const std::vector<Value>& st) -> std::vector<Value> {
        const Value &step = st[0], &next = st[1];
        Value lp_now = at_step(r, st[3], step);
        Value from_two = r.select(st[4], shift_left(r, next, 2), r.constant(-INFINITY, col));
        Value rec = r.binary(Binary::Add, log_add(r, {next, shift_left(r, next, 1), from_two}), lp_now);
        Value stepn = r.broadcast_to(step, {n});
        Value last_len = r.binary(Binary::Subtract, st[5], r.constant_int(1, {DType::Int64, {n}}));
        Value is_last = r.broadcast_in_dim(r.compare(Compare::EQ, stepn, last_len), {n, w}, {0});
        Value before = r.broadcast_in_dim(r.compare(Compare::LT, stepn, last_len), {n, w}, {0});
        Value init = r.select(st[6], lp_now, r.constant(-INFINITY, col));
        Value now = r.select(is_last, init, r.select(before, rec, r.constant(-INFINITY, col)));
        return {r.binary(Binary::Subtract, step, r.constant_int(1, scalar)),
                now,
                put_step(r, st[2], now, step),
                st[3],
                st[4],
                st[5],
                st[6]};
      });
  Value beta = state[2];
  // exp(alpha + beta + nll - lp) summed into the classes l' names: [N, T, C].
  Value nll3 = b.broadcast_in_dim(nll, {n, steps, w}, {0});
  Value share =
      b.unary(Unary::Exp,
              b.binary(Binary::Subtract, b.binary(Binary::Add, b.binary(Binary::Add, alpha, beta), nll3), k.lp_ext));
  share = b.select(b.compare(Compare::NE, share, share), b.constant(0, share.type), share);
  Value onehot = b.compare(Compare::EQ, b.broadcast_in_dim(k.ext, {n, steps, w, k.classes}, {0, 2}),
                           b.iota({DType::Int64, {n, steps, w, k.classes}}, 3));
  Value summed = b.reduce(b.select(onehot, b.broadcast_in_dim(share, {n, steps, w, k.classes}, {0, 1, 2}),
                                   b.constant(0, {t, {n, steps, w, k.classes}})),
                          b.scalar(0, t), {2}, Binary::Add);  // [N, T, C]
  Value lp = b.transpose(k.lp, {1, 0, 2});
  Value grad = b.binary(Binary::Subtract, b.unary(Unary::Exp, lp), summed);
  Value g = b.broadcast_in_dim(b.reshape(b.cast(c.tensor(0), t), {n}), {n, steps, k.classes}, {0});
  grad = b.binary(Binary::Multiply, grad, g);
  Value inside = b.compare(Compare::LT, b.iota({DType::Int64, {n, steps, k.classes}}, 1),
                           b.broadcast_in_dim(k.input_len, {n, steps, k.classes}, {0}));
  Value keep = inside;
  if (c.has(8) && c.args[8].b)
    keep = b.binary(
        Binary::And, keep,
        b.broadcast_in_dim(b.compare(Compare::NE, nll, b.constant(INFINITY, nll.type)), {n, steps, k.classes}, {0}));
  grad = b.select(keep, grad, b.constant(0, grad.type));
  return {b.reshape(b.cast(b.transpose(grad, {1, 0, 2}), c.out().dtype), c.out().shape)};
}

}  // namespace

LOWERING("aten::nll_loss_forward", nll_loss_forward);
LOWERING("aten::multi_margin_loss", multi_margin_loss);
LOWERING("aten::_ctc_loss", ctc_loss);
LOWERING("aten::_ctc_loss_backward", ctc_loss_backward);
LOWERING("aten::multilabel_margin_loss_forward", multilabel_margin_loss);
LOWERING("aten::multi_margin_loss_backward", multi_margin_loss_backward);
LOWERING("aten::multilabel_margin_loss_backward", multilabel_margin_loss_backward);
LOWERING("aten::nll_loss_backward", nll_loss_backward);
LOWERING("aten::nll_loss2d_forward", nll_loss_forward);
LOWERING("aten::nll_loss2d_backward", nll_loss_backward);
LOWERING("aten::mse_loss", mse_loss);
LOWERING("aten::mse_loss_backward", mse_loss_backward);
LOWERING("aten::smooth_l1_loss", smooth_loss(false));
LOWERING("aten::smooth_l1_loss_backward", smooth_loss_backward(false));
LOWERING("aten::huber_loss", smooth_loss(true));
LOWERING("aten::huber_loss_backward", smooth_loss_backward(true));
LOWERING("aten::binary_cross_entropy", binary_cross_entropy);
LOWERING("aten::binary_cross_entropy_backward", binary_cross_entropy_backward);

}  // namespace torch_tpu::lowering
