// Loss functions and their backward ops. Reduction codes are PyTorch's:
// 0 none, 1 mean, 2 sum. Low-precision inputs compute in float32.
#include <cmath>
#include <string>

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

}  // namespace

LOWERING("aten::nll_loss_forward", nll_loss_forward);
LOWERING("aten::multi_margin_loss", multi_margin_loss);
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
