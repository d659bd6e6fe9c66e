// Activation functions and their backward ops (what autograd calls).
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

Value k(LoweringContext& c, double v) { return c.b.constant(v, c.out()); }
Value mul(LoweringContext& c, const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); }
Value add(LoweringContext& c, const Value& a, const Value& b) { return c.b.binary(Binary::Add, a, b); }
Value sub(LoweringContext& c, const Value& a, const Value& b) { return c.b.binary(Binary::Subtract, a, b); }

// hardshrink(self, lambd): 0 inside [-lambd, lambd], x outside (NaN stays).
// softshrink(self, lambd): x shrunk toward 0 by lambd, 0 inside (NaN * 0 stays NaN).
// Their backwards pass the gradient outside the band.
Value inside_band(LoweringContext& c, const Value& x, size_t lambd_at) {
  Value l = c.value_as(lambd_at, x.type);
  return c.b.binary(Binary::And, c.b.compare(Compare::GE, x, c.b.unary(Unary::Negate, l)),
                    c.b.compare(Compare::LE, x, l));
}
std::vector<Value> hardshrink(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.select(inside_band(c, x, 1), k(c, 0), x)};
}
std::vector<Value> softshrink(LoweringContext& c) {
  Value x = c.operand_as_output(0), l = c.value_as(1, x.type);
  Value r = c.b.select(c.b.compare(Compare::LT, x, c.b.unary(Unary::Negate, l)), add(c, x, l), mul(c, x, k(c, 0)));
  return {c.b.select(c.b.compare(Compare::GT, x, l), sub(c, x, l), r)};
}
std::vector<Value> shrink_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.value_as(1, c.out());
  return {c.b.select(inside_band(c, x, 2), k(c, 0), g)};
}

// leaky_relu(self, negative_slope)
std::vector<Value> leaky_relu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.select(c.b.compare(Compare::GT, x, k(c, 0)), x, mul(c, x, k(c, c.number(1))))};
}

// gelu(self, approximate="none"|"tanh")
std::vector<Value> gelu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (c.string(1) == "tanh") {
    Value inner = mul(c, k(c, std::sqrt(2.0 / M_PI)), add(c, x, mul(c, k(c, 0.044715), mul(c, x, mul(c, x, x)))));
    return {mul(c, mul(c, k(c, 0.5), x), add(c, k(c, 1), c.b.unary(Unary::Tanh, inner)))};
  }
  Value cdf = mul(c, k(c, 0.5), add(c, k(c, 1), c.b.unary(Unary::Erf, mul(c, x, k(c, M_SQRT1_2)))));
  return {mul(c, x, cdf)};
}

// gelu_backward(grad_output, self, approximate)
std::vector<Value> gelu_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  if (c.string(2) == "tanh") {
    Value x2 = mul(c, x, x);
    Value inner = mul(c, k(c, std::sqrt(2.0 / M_PI)), add(c, x, mul(c, k(c, 0.044715), mul(c, x2, x))));
    Value t = c.b.unary(Unary::Tanh, inner);
    Value dinner = mul(c, k(c, std::sqrt(2.0 / M_PI)), add(c, k(c, 1), mul(c, k(c, 3 * 0.044715), x2)));
    Value left = mul(c, k(c, 0.5), add(c, k(c, 1), t));
    Value right = mul(c, mul(c, k(c, 0.5), x), mul(c, sub(c, k(c, 1), mul(c, t, t)), dinner));
    return {mul(c, g, add(c, left, right))};
  }
  Value cdf = mul(c, k(c, 0.5), add(c, k(c, 1), c.b.unary(Unary::Erf, mul(c, x, k(c, M_SQRT1_2)))));
  Value pdf = mul(c, k(c, 1 / std::sqrt(2 * M_PI)), c.b.unary(Unary::Exp, mul(c, k(c, -0.5), mul(c, x, x))));
  return {mul(c, g, add(c, cdf, mul(c, x, pdf)))};
}

std::vector<Value> silu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {mul(c, x, c.b.unary(Unary::Logistic, x))};
}

std::vector<Value> silu_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value s = c.b.unary(Unary::Logistic, x);
  return {mul(c, g, mul(c, s, add(c, k(c, 1), mul(c, x, sub(c, k(c, 1), s)))))};
}

// hardtanh(self, min_val, max_val)
std::vector<Value> hardtanh(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {minimum(c.b, maximum(c.b, x, k(c, c.number(1))), k(c, c.number(2)))};
}

// hardtanh_backward(grad_output, self, min_val, max_val)
std::vector<Value> hardtanh_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value outside = c.b.binary(Binary::Or, c.b.compare(Compare::LE, x, k(c, c.number(2))),
                             c.b.compare(Compare::GE, x, k(c, c.number(3))));
  return {c.b.select(outside, k(c, 0), g)};
}

// elu(self, alpha, scale, input_scale)
std::vector<Value> elu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  double alpha = c.number(1), scale = c.number(2), input_scale = c.number(3);
  Value neg = mul(c, k(c, alpha), c.b.unary(Unary::Expm1, mul(c, x, k(c, input_scale))));
  return {mul(c, k(c, scale), c.b.select(c.b.compare(Compare::GT, x, k(c, 0)), x, neg))};
}

// softplus(self, beta, threshold): linear above threshold for stability.
std::vector<Value> softplus(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  double beta = c.number(1), threshold = c.number(2);
  Value bx = mul(c, x, k(c, beta));
  Value soft = c.b.binary(Binary::Divide, c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, bx)), k(c, beta));
  return {c.b.select(c.b.compare(Compare::GT, bx, k(c, threshold)), x, soft)};
}

std::vector<Value> hardsigmoid(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value y = c.b.binary(Binary::Divide, add(c, x, k(c, 3)), k(c, 6));
  return {minimum(c.b, maximum(c.b, y, k(c, 0)), k(c, 1))};
}

std::vector<Value> hardswish(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value y = c.b.binary(Binary::Divide, add(c, x, k(c, 3)), k(c, 6));
  return {mul(c, x, minimum(c.b, maximum(c.b, y, k(c, 0)), k(c, 1)))};
}

std::vector<Value> mish(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value sp = c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, x));
  Value big = c.b.compare(Compare::GT, x, k(c, 20));
  return {mul(c, x, c.b.unary(Unary::Tanh, c.b.select(big, x, sp)))};
}

// threshold(self, threshold, value): x <= threshold ? value : x (NaN stays).
std::vector<Value> threshold(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.select(c.b.compare(Compare::LE, x, k(c, c.number(1))), k(c, c.number(2)), x)};
}

// threshold_backward(grad_output, self, threshold): relu's backward.
std::vector<Value> threshold_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  return {c.b.select(c.b.compare(Compare::LE, x, k(c, c.number(2))), k(c, 0), g)};
}

// sigmoid_backward(grad_output, output), tanh_backward(grad_output, output)
std::vector<Value> sigmoid_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), y = c.operand_as_output(1);
  return {mul(c, g, mul(c, y, sub(c, k(c, 1), y)))};
}
std::vector<Value> tanh_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), y = c.operand_as_output(1);
  return {mul(c, g, sub(c, k(c, 1), mul(c, y, y)))};
}

// leaky_relu_backward(grad_output, self, negative_slope, self_is_result)
std::vector<Value> leaky_relu_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  return {c.b.select(c.b.compare(Compare::GT, x, k(c, 0)), g, mul(c, g, k(c, c.number(2))))};
}

// elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result)
std::vector<Value> elu_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), v = c.operand_as_output(5);
  double alpha = c.number(1), scale = c.number(2), input_scale = c.number(3);
  Value neg;
  if (c.args[4].b)  // v is the result: its negative branch is alpha*scale*(e - 1)
    neg = mul(c, g, mul(c, k(c, input_scale), add(c, v, k(c, alpha * scale))));
  else
    neg = mul(c, g, mul(c, k(c, input_scale * alpha * scale), c.b.unary(Unary::Exp, mul(c, v, k(c, input_scale)))));
  return {c.b.select(c.b.compare(Compare::LE, v, k(c, 0)), neg, mul(c, g, k(c, scale)))};
}

// softplus_backward(grad_output, self, beta, threshold): g * sigmoid(beta x), g above the threshold.
std::vector<Value> softplus_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), bx = mul(c, c.operand_as_output(1), k(c, c.number(2)));
  Value s = mul(c, g, c.b.unary(Unary::Logistic, bx));
  return {c.b.select(c.b.compare(Compare::GT, bx, k(c, c.number(3))), g, s)};
}

// hardsigmoid_backward(grad_output, self): g / 6 inside (-3, 3).
std::vector<Value> hardsigmoid_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value inside = c.b.binary(Binary::And, c.b.compare(Compare::GT, x, k(c, -3)), c.b.compare(Compare::LT, x, k(c, 3)));
  return {c.b.select(inside, c.b.binary(Binary::Divide, g, k(c, 6)), k(c, 0))};
}

// hardswish_backward(grad_output, self): 0 up to -3, g (x/3 + 1/2) inside (-3, 3), g from 3 (as CPU).
std::vector<Value> hardswish_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value mid = mul(c, g, add(c, c.b.binary(Binary::Divide, x, k(c, 3)), k(c, 0.5)));
  return {c.b.select(c.b.compare(Compare::LE, x, k(c, -3)), k(c, 0),
                     c.b.select(c.b.compare(Compare::LT, x, k(c, 3)), mid, g))};
}

// mish_backward(grad_output, self): g (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x)).
std::vector<Value> mish_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value t = c.b.unary(Unary::Tanh, c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, x)));
  Value d = add(c, t, mul(c, mul(c, x, c.b.unary(Unary::Logistic, x)), sub(c, k(c, 1), mul(c, t, t))));
  return {mul(c, g, d)};
}

// log_sigmoid_forward(self) -> (output, buffer): min(x, 0) - log1p(exp(-|x|));
// the buffer is exp(-|x|), as CPU keeps it (the backward here does not read it).
std::vector<Value> log_sigmoid_forward(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value z = c.b.unary(Unary::Exp, c.b.unary(Unary::Negate, c.b.unary(Unary::Abs, x)));
  Value y = sub(c, minimum(c.b, x, k(c, 0)), c.b.unary(Unary::Log1p, z));
  return {y, c.b.reshape(c.b.cast(z, c.out(1).dtype), c.out(1).shape)};
}

// log_sigmoid_backward(grad_output, self, buffer): g * sigmoid(-x)
std::vector<Value> log_sigmoid_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  return {mul(c, g, c.b.unary(Unary::Logistic, c.b.unary(Unary::Negate, x)))};
}

// logit(self, eps?): log(z / (1 - z)), z = x clamped to [eps, 1 - eps] when eps is given.
std::vector<Value> logit(LoweringContext& c) {
  Value z = c.operand_as_output(0);
  if (c.has(1)) z = c.b.clamp(k(c, c.number(1)), z, k(c, 1 - c.number(1)));
  return {c.b.unary(Unary::Log, c.b.binary(Binary::Divide, z, sub(c, k(c, 1), z)))};
}

// logit_backward(grad_output, self, eps?): g / (x (1 - x)); 0 outside [eps, 1 - eps]
// with eps, NaN outside [0, 1] without (as CPU).
std::vector<Value> logit_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1);
  Value d = c.b.binary(Binary::Divide, g, mul(c, x, sub(c, k(c, 1), x)));
  double lo = c.has(2) ? c.number(2) : 0, hi = 1 - lo;
  Value outside = c.b.binary(Binary::Or, c.b.compare(Compare::LT, x, k(c, lo)), c.b.compare(Compare::GT, x, k(c, hi)));
  return {c.b.select(outside, k(c, c.has(2) ? 0.0 : NAN), d)};
}

}  // namespace

// glu(self, dim): the first half along dim times the sigmoid of the second.
std::pair<Value, Value> halves(LoweringContext& c, const Value& x, int64_t dim_arg) {
  const int64_t d = normalize_dim(dim_arg, x.rank()), half = x.shape()[d] / 2;
  std::vector<int64_t> start(x.rank(), 0), mid = x.shape(), step(x.rank(), 1);
  mid[d] = half;
  std::vector<int64_t> second = start;
  second[d] = half;
  return {c.b.slice(x, start, mid, step), c.b.slice(x, second, x.shape(), step)};
}

std::vector<Value> glu(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(0), c.out().dtype);
  auto [a, b] = halves(c, x, c.has(1) ? c.integer(1) : -1);
  return {c.b.binary(Binary::Multiply, a, c.b.unary(stablehlo::Unary::Logistic, b))};
}

// glu_backward(grad_output, self, dim): d/da = g * s, d/db = g * a * s * (1 - s), s = sigmoid(b).
std::vector<Value> glu_backward(LoweringContext& c) {
  Value x = c.b.cast(c.tensor(1), c.out().dtype), g = c.b.cast(c.tensor(0), c.out().dtype);
  const int64_t d = normalize_dim(c.integer(2), x.rank());
  auto [a, b] = halves(c, x, d);
  Value s = c.b.unary(stablehlo::Unary::Logistic, b);
  Value ga = c.b.binary(Binary::Multiply, g, s);
  Value gb = c.b.binary(Binary::Multiply, c.b.binary(Binary::Multiply, ga, a),
                        c.b.binary(Binary::Subtract, c.b.constant(1, s.type), s));
  return {c.b.concatenate({ga, gb}, d)};
}

LOWERING("aten::leaky_relu", leaky_relu);
LOWERING("aten::glu", in_float32(glu));
LOWERING("aten::glu_backward", in_float32(glu_backward));
LOWERING("aten::leaky_relu_backward", leaky_relu_backward);
LOWERING("aten::gelu", in_float32(gelu));
LOWERING("aten::gelu_backward", in_float32(gelu_backward));
LOWERING("aten::silu", in_float32(silu));
LOWERING("aten::silu_backward", in_float32(silu_backward));
LOWERING("aten::hardtanh", hardtanh);
LOWERING("aten::hardshrink", hardshrink);
LOWERING("aten::softshrink", softshrink);
LOWERING("aten::hardshrink_backward", shrink_backward);
LOWERING("aten::softshrink_backward", shrink_backward);
LOWERING("aten::hardtanh_backward", hardtanh_backward);
LOWERING("aten::elu", in_float32(elu));
LOWERING("aten::softplus", in_float32(softplus));
LOWERING("aten::hardsigmoid", in_float32(hardsigmoid));
LOWERING("aten::hardswish", in_float32(hardswish));
LOWERING("aten::mish", in_float32(mish));
LOWERING("aten::threshold", threshold);
LOWERING("aten::threshold_backward", threshold_backward);
LOWERING("aten::sigmoid_backward", in_float32(sigmoid_backward));
LOWERING("aten::tanh_backward", in_float32(tanh_backward));
LOWERING("aten::elu_backward", in_float32(elu_backward));
LOWERING("aten::softplus_backward", in_float32(softplus_backward));
LOWERING("aten::hardsigmoid_backward", in_float32(hardsigmoid_backward));
LOWERING("aten::hardswish_backward", in_float32(hardswish_backward));
LOWERING("aten::mish_backward", in_float32(mish_backward));
LOWERING("aten::log_sigmoid_forward", in_float32(log_sigmoid_forward));
LOWERING("aten::log_sigmoid_backward", in_float32(log_sigmoid_backward));
LOWERING("aten::logit", in_float32(logit));
LOWERING("aten::logit_backward", in_float32(logit_backward));

}  // namespace torch_tpu::lowering
