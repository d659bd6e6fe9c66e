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
  return {c.b.binary(Binary::Minimum, c.b.binary(Binary::Maximum, x, k(c, c.number(1))), k(c, c.number(2)))};
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
  return {c.b.binary(Binary::Minimum, c.b.binary(Binary::Maximum, y, k(c, 0)), k(c, 1))};
}

std::vector<Value> hardswish(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value y = c.b.binary(Binary::Divide, add(c, x, k(c, 3)), k(c, 6));
  return {mul(c, x, c.b.binary(Binary::Minimum, c.b.binary(Binary::Maximum, y, k(c, 0)), k(c, 1)))};
}

std::vector<Value> mish(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  Value sp = c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, x));
  Value big = c.b.compare(Compare::GT, x, k(c, 20));
  return {mul(c, x, c.b.unary(Unary::Tanh, c.b.select(big, x, sp)))};
}

// threshold(self, threshold, value): x > threshold ? x : value
std::vector<Value> threshold(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.select(c.b.compare(Compare::GT, x, k(c, c.number(1))), x, k(c, c.number(2)))};
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

}  // namespace

LOWERING("aten::leaky_relu", leaky_relu);
LOWERING("aten::leaky_relu_backward", leaky_relu_backward);
LOWERING("aten::gelu", gelu);
LOWERING("aten::gelu_backward", gelu_backward);
LOWERING("aten::silu", silu);
LOWERING("aten::silu_backward", silu_backward);
LOWERING("aten::hardtanh", hardtanh);
LOWERING("aten::hardtanh_backward", hardtanh_backward);
LOWERING("aten::elu", elu);
LOWERING("aten::softplus", softplus);
LOWERING("aten::hardsigmoid", hardsigmoid);
LOWERING("aten::hardswish", hardswish);
LOWERING("aten::mish", mish);
LOWERING("aten::threshold", threshold);
LOWERING("aten::threshold_backward", threshold_backward);
LOWERING("aten::sigmoid_backward", sigmoid_backward);
LOWERING("aten::tanh_backward", tanh_backward);

}  // namespace torch_tpu::lowering
