// Elementwise ops. PyTorch's meta kernel already decided the result dtype and
// broadcast shape (type promotion included); each rule converts its operands
// to that type and applies one StableHLO op.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

// a + alpha * b, the shape of add and sub (alpha is argument 2).
Value add_scaled(LoweringContext& c, Binary op) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  if (c.has(2) && c.number(2) != 1) b = c.b.binary(Binary::Multiply, b, c.b.constant(c.number(2), c.out()));
  return c.b.binary(op, a, b);
}

std::vector<Value> add(LoweringContext& c) { return {add_scaled(c, Binary::Add)}; }
std::vector<Value> sub(LoweringContext& c) { return {add_scaled(c, Binary::Subtract)}; }

std::vector<Value> mul(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  return {c.b.binary(c.out().dtype == DType::Bool ? Binary::And : Binary::Multiply, a, b)};
}

// div with rounding_mode None | "trunc" | "floor" (argument 2).
std::vector<Value> div(LoweringContext& c) {
  Value q = c.b.binary(Binary::Divide, c.operand_as_output(0), c.operand_as_output(1));
  std::string mode = c.string(2);
  if (mode == "floor" && stablehlo::is_float(c.out().dtype)) q = c.b.unary(Unary::Floor, q);
  if (mode == "trunc" && stablehlo::is_float(c.out().dtype)) {
    Value zero = c.b.constant(0, c.out());
    q = c.b.select(c.b.compare(stablehlo::Compare::LT, q, zero), c.b.unary(Unary::Ceil, q), c.b.unary(Unary::Floor, q));
  }
  if (mode == "floor" && !stablehlo::is_float(c.out().dtype)) {
    // Integer division truncates; floor differs when the signs differ and it is inexact.
    Value a = c.operand_as_output(0), b = c.operand_as_output(1), zero = c.b.constant(0, c.out());
    Value inexact = c.b.compare(stablehlo::Compare::NE, c.b.binary(Binary::Remainder, a, b), zero);
    Value signs_differ = c.b.compare(stablehlo::Compare::NE, c.b.compare(stablehlo::Compare::LT, a, zero),
                                     c.b.compare(stablehlo::Compare::LT, b, zero));
    Value adjust = c.b.binary(Binary::And, inexact, signs_differ);
    q = c.b.select(adjust, c.b.binary(Binary::Subtract, q, c.b.constant(1, c.out())), q);
  }
  return {q};
}

LoweringRule unary(Unary op) {
  return [op](LoweringContext& c) -> std::vector<Value> { return {c.b.unary(op, c.operand_as_output(0))}; };
}

std::vector<Value> relu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.binary(Binary::Maximum, x, c.b.constant(0, c.out()))};
}

// fill(self, value): every element of self's shape becomes value.
std::vector<Value> fill(LoweringContext& c) { return {c.operand_as_output(1)}; }

// The dtype PyTorch computes a comparison or where() in: argument i is a
// Python Scalar or a 0-d tensor when it is not a full tensor operand.
DType common_dtype(LoweringContext& c, size_t i, size_t j) {
  auto info = [&](size_t k) -> std::pair<DType, bool> {
    const LoweringArg& a = c.args[k];
    if (a.kind == LoweringArg::Tensor) return {a.tensor.dtype(), a.tensor.rank() == 0};
    return {a.kind == LoweringArg::Double ? DType::Float32
            : a.kind == LoweringArg::Bool ? DType::Bool
                                          : DType::Int64,
            true};
  };
  auto [a, a_scalar] = info(i);
  auto [b, b_scalar] = info(j);
  return promote(a, a_scalar, b, b_scalar);
}

LoweringRule comparison(stablehlo::Compare dir) {
  return [dir](LoweringContext& c) -> std::vector<Value> {
    TensorType t{common_dtype(c, 0, 1), c.out().shape};
    return {c.b.compare(dir, c.value_as(0, t), c.value_as(1, t))};
  };
}

LoweringRule binary_op(Binary op) {
  return [op](LoweringContext& c) -> std::vector<Value> {
    return {c.b.binary(op, c.operand_as_output(0), c.operand_as_output(1))};
  };
}

// where(condition, self, other)
std::vector<Value> where(LoweringContext& c) {
  Value pred = c.b.broadcast_to(c.tensor(0), c.out().shape);
  return {c.b.select(pred, c.operand_as_output(1), c.operand_as_output(2))};
}

// zero(self): zeros of self's shape and dtype.
std::vector<Value> zero(LoweringContext& c) { return {c.b.constant(0, c.out())}; }

}  // namespace

LOWERING("aten::add.Tensor", add);
LOWERING("aten::add.Scalar", add);
LOWERING("aten::sub.Tensor", sub);
LOWERING("aten::sub.Scalar", sub);
LOWERING("aten::mul.Tensor", mul);
LOWERING("aten::mul.Scalar", mul);
LOWERING("aten::div.Tensor", div);
LOWERING("aten::div.Scalar", div);
LOWERING("aten::div.Tensor_mode", div);
LOWERING("aten::div.Scalar_mode", div);
LOWERING("aten::neg", unary(Unary::Negate));
LOWERING("aten::exp", unary(Unary::Exp));
LOWERING("aten::tanh", unary(Unary::Tanh));
LOWERING("aten::sigmoid", unary(Unary::Logistic));
LOWERING("aten::sqrt", unary(Unary::Sqrt));
LOWERING("aten::abs", unary(Unary::Abs));
LOWERING("aten::relu", relu);
LOWERING("aten::fill.Scalar", fill);
LOWERING("aten::fill.Tensor", fill);
LOWERING("aten::zero", zero);
LOWERING("aten::log", unary(Unary::Log));
LOWERING("aten::rsqrt", unary(Unary::Rsqrt));
LOWERING("aten::sin", unary(Unary::Sin));
LOWERING("aten::cos", unary(Unary::Cos));
LOWERING("aten::floor", unary(Unary::Floor));
LOWERING("aten::ceil", unary(Unary::Ceil));
LOWERING("aten::maximum", binary_op(Binary::Maximum));
LOWERING("aten::minimum", binary_op(Binary::Minimum));
LOWERING("aten::where.self", where);
LOWERING("aten::eq.Tensor", comparison(stablehlo::Compare::EQ));
LOWERING("aten::eq.Scalar", comparison(stablehlo::Compare::EQ));
LOWERING("aten::ne.Tensor", comparison(stablehlo::Compare::NE));
LOWERING("aten::ne.Scalar", comparison(stablehlo::Compare::NE));
LOWERING("aten::lt.Tensor", comparison(stablehlo::Compare::LT));
LOWERING("aten::lt.Scalar", comparison(stablehlo::Compare::LT));
LOWERING("aten::le.Tensor", comparison(stablehlo::Compare::LE));
LOWERING("aten::le.Scalar", comparison(stablehlo::Compare::LE));
LOWERING("aten::gt.Tensor", comparison(stablehlo::Compare::GT));
LOWERING("aten::gt.Scalar", comparison(stablehlo::Compare::GT));
LOWERING("aten::ge.Tensor", comparison(stablehlo::Compare::GE));
LOWERING("aten::ge.Scalar", comparison(stablehlo::Compare::GE));

}  // namespace torch_tpu::lowering
