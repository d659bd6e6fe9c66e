// Elementwise ops. PyTorch's meta kernel already decided the result dtype and
// broadcast shape (type promotion included); each rule converts its operands
// to that type and applies one StableHLO op.
#include <cmath>
#include <optional>
#include <utility>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

// a + alpha * b, the shape of add and sub (alpha is argument 2).
Value add_scaled(LoweringContext& c, Binary op) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  if (c.has(2) && !c.is_number(2, 1)) b = c.b.binary(Binary::Multiply, b, c.value_as(2, c.out()));
  return c.b.binary(op, a, b);
}

std::vector<Value> add(LoweringContext& c) { return {add_scaled(c, Binary::Add)}; }
std::vector<Value> sub(LoweringContext& c) { return {add_scaled(c, Binary::Subtract)}; }

// _add_relu(self, other, alpha): relu(self + alpha * other), CPU's fused form.
std::vector<Value> add_relu(LoweringContext& c) {
  return {maximum(c.b, add_scaled(c, Binary::Add), c.b.constant(0, c.out()))};
}

std::vector<Value> mul(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  return {c.b.binary(c.out().dtype == DType::Bool ? Binary::And : Binary::Multiply, a, b)};
}

// x / y correctly rounded also where y is one number broadcast: XLA's
// simplifier turns such a division into a multiplication by the reciprocal
// (one ulp off in a third of float32 elements of x / 3); a select it cannot
// fold keeps the divisor opaque (as fast on XLA's CPU, where it is memory bound).
Value divide_exactly(Builder& b, const Value& x, const Value& y) {
  Value always = b.binary(Binary::Or, b.compare(stablehlo::Compare::EQ, x, x), b.compare(stablehlo::Compare::NE, x, x));
  return b.binary(Binary::Divide, x, b.select(always, y, b.constant(NAN, y.type)));
}

// Floating a // b exactly as PyTorch's CPU and CUDA kernels compute it
// (div_floor_floating): from fmod, so non-finite operands give what they give
// there (inf // 1 is nan, -2 // inf is -1), and a zero keeps its sign.
Value floor_divide_float(Builder& b, const Value& x, const Value& y) {
  auto k = [&](double v) { return b.constant(v, x.type); };
  Value q = divide_exactly(b, x, y);
  Value mod = b.binary(Binary::Remainder, x, y);
  Value div = divide_exactly(b, b.binary(Binary::Subtract, x, mod), y);
  Value mod_nonzero = b.compare(stablehlo::Compare::NE, mod, k(0));
  Value signs_differ = b.compare(stablehlo::Compare::NE, b.compare(stablehlo::Compare::LT, y, k(0)),
                                 b.compare(stablehlo::Compare::LT, mod, k(0)));
  div = b.select(b.binary(Binary::And, mod_nonzero, signs_differ), b.binary(Binary::Subtract, div, k(1)), div);
  Value floor = b.unary(Unary::Floor, div);
  floor = b.select(b.compare(stablehlo::Compare::GT, b.binary(Binary::Subtract, div, floor), k(0.5)),
                   b.binary(Binary::Add, floor, k(1)), floor);
  Value signed_zero = b.binary(Binary::Multiply, k(0), q);  // copysign(0, q): q is finite here
  Value r = b.select(b.compare(stablehlo::Compare::NE, div, k(0)), floor, signed_zero);
  return b.select(b.compare(stablehlo::Compare::EQ, y, k(0)), q, r);
}

// a / b rounded per `mode`: "" (true division) | "trunc" | "floor".
Value divide(LoweringContext& c, const std::string& mode) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  const bool is_float = stablehlo::is_float(c.out().dtype);
  if (mode == "floor" && is_float) return floor_divide_float(c.b, a, b);
  const bool broadcast_divisor =
      !c.has(1) || c.args[1].kind != LoweringArg::Tensor || c.tensor(1).type.numel() != c.out().numel();
  Value q = is_float && broadcast_divisor ? divide_exactly(c.b, a, b) : c.b.binary(Binary::Divide, a, b);
  if (mode == "trunc" && is_float) {
    Value zero = c.b.constant(0, c.out());
    q = c.b.select(c.b.compare(stablehlo::Compare::LT, q, zero), c.b.unary(Unary::Ceil, q), c.b.unary(Unary::Floor, q));
  }
  if (mode == "floor" && !is_float) {
    // Integer division truncates; floor differs when the signs differ and it is inexact.
    Value zero = c.b.constant(0, c.out());
    Value inexact = c.b.compare(stablehlo::Compare::NE, c.b.binary(Binary::Remainder, a, b), zero);
    Value signs_differ = c.b.compare(stablehlo::Compare::NE, c.b.compare(stablehlo::Compare::LT, a, zero),
                                     c.b.compare(stablehlo::Compare::LT, b, zero));
    Value adjust = c.b.binary(Binary::And, inexact, signs_differ);
    q = c.b.select(adjust, c.b.binary(Binary::Subtract, q, c.b.constant(1, c.out())), q);
  }
  return q;
}

// div with rounding_mode None | "trunc" | "floor" (argument 2).
std::vector<Value> div(LoweringContext& c) { return {divide(c, c.string(2))}; }

// floor_divide(self, other) = div(self, other, rounding_mode="floor") (`//` on tensors).
std::vector<Value> floor_divide(LoweringContext& c) { return {divide(c, "floor")}; }

// Computed in float32 for float16/bfloat16 and rounded once, as PyTorch's
// CPU and CUDA kernels do (XLA expands logistic, log2, asin... into several
// ops, each rounded in the narrow type).
LoweringRule unary(Unary op) {
  return in_float32([op](LoweringContext& c) -> std::vector<Value> { return {c.b.unary(op, c.operand_as_output(0))}; });
}

// floor/ceil: integers are already whole.
LoweringRule rounding(Unary op) {
  return [op](LoweringContext& c) -> std::vector<Value> {
    Value x = c.operand_as_output(0);
    return {stablehlo::is_float(x.dtype()) ? c.b.unary(op, x) : x};
  };
}

std::vector<Value> relu(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {maximum(c.b, x, c.b.constant(0, c.out()))};
}

// fill(self, value): every element of self's shape becomes value.
std::vector<Value> fill(LoweringContext& c) {
  c.check_value_fits(1);
  return {c.operand_as_output(1)};
}

// The dtype PyTorch computes a comparison or isin in (its output is bool).
DType common_dtype(LoweringContext& c, size_t i, size_t j) {
  auto info = [&](size_t k) -> std::pair<DType, Operand> {
    const LoweringArg& a = c.args[k];
    if (a.kind == LoweringArg::Tensor)
      return {a.tensor.dtype(), a.wrapped_number       ? Operand::Number
                                : a.tensor.rank() == 0 ? Operand::ZeroDim
                                                       : Operand::Tensor};
    return {a.kind == LoweringArg::Double ? DType::Float32
            : a.kind == LoweringArg::Bool ? DType::Bool
                                          : DType::Int64,
            Operand::Number};
  };
  auto [a, a_class] = info(i);
  auto [b, b_class] = info(j);
  return promote(a, a_class, b, b_class);
}

LoweringRule comparison(stablehlo::Compare dir) {
  return [dir](LoweringContext& c) -> std::vector<Value> {
    TensorType t{common_dtype(c, 0, 1), c.out().shape};
    return {c.b.compare(dir, c.value_as(0, t), c.value_as(1, t))};
  };
}

// isin(elements, test_elements, *, assume_unique, invert): each element
// compared with every test element (in their promoted dtype), any match.
std::vector<Value> isin(LoweringContext& c) {
  const TensorType& out = c.out();
  const DType t = common_dtype(c, 0, 1);
  Value tests = c.args[1].kind == LoweringArg::Tensor ? c.b.cast(c.tensor(1), t) : c.value_as(1, {t, {}});
  tests = c.b.reshape(tests, {tests.type.numel()});
  Shape all = out.shape;
  all.push_back(tests.shape()[0]);
  std::vector<int64_t> element_dims(out.rank()), last{out.rank()};
  for (int64_t d = 0; d < out.rank(); ++d) element_dims[d] = d;
  Value eq = c.b.compare(stablehlo::Compare::EQ, c.b.broadcast_in_dim(c.value_as(0, {t, out.shape}), all, element_dims),
                         c.b.broadcast_in_dim(tests, all, last));
  Value any = c.b.reduce(eq, c.b.scalar(0, DType::Bool), last, Binary::Or);
  const bool invert = c.has(3) && c.args[3].b;
  return {invert ? c.b.unary(Unary::Not, any) : any};
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

// remainder: Python's modulo, the sign follows the divisor.
std::vector<Value> remainder(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1), zero = c.b.constant(0, c.out());
  Value r = c.b.binary(Binary::Remainder, a, b);
  Value fix = c.b.binary(Binary::And, c.b.compare(stablehlo::Compare::NE, r, zero),
                         c.b.compare(stablehlo::Compare::NE, c.b.compare(stablehlo::Compare::LT, r, zero),
                                     c.b.compare(stablehlo::Compare::LT, b, zero)));
  return {c.b.select(fix, c.b.binary(Binary::Add, r, b), r)};
}

// clamp(self, min?, max?) with Scalar or Tensor bounds: min(max(x, lo), hi),
// so a NaN in x or in a bound gives NaN, and min > max gives max.
std::vector<Value> clamp(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (c.has(1)) x = maximum(c.b, x, c.operand_as_output(1));
  if (c.has(2)) x = minimum(c.b, x, c.operand_as_output(2));
  return {x};
}
std::vector<Value> clamp_min(LoweringContext& c) {
  return {maximum(c.b, c.operand_as_output(0), c.operand_as_output(1))};
}
std::vector<Value> clamp_max(LoweringContext& c) {
  return {minimum(c.b, c.operand_as_output(0), c.operand_as_output(1))};
}

std::vector<Value> elementwise_max(LoweringContext& c) {
  return {maximum(c.b, c.operand_as_output(0), c.operand_as_output(1))};
}
std::vector<Value> elementwise_min(LoweringContext& c) {
  return {minimum(c.b, c.operand_as_output(0), c.operand_as_output(1))};
}

// logical ops: operands are "x != 0", the result is bool.
Value truth(LoweringContext& c, size_t i) {
  const Value& x = c.tensor(i);
  if (x.dtype() == DType::Bool) return c.b.broadcast_to(x, c.out().shape);
  Value nz = c.b.compare(stablehlo::Compare::NE, x, c.b.constant(0, x.type));
  return c.b.broadcast_to(nz, c.out().shape);
}
LoweringRule logical(Binary op) {
  return [op](LoweringContext& c) -> std::vector<Value> {
    return {c.b.cast(c.b.binary(op, truth(c, 0), truth(c, 1)), c.out().dtype)};
  };
}
std::vector<Value> logical_not(LoweringContext& c) {
  return {c.b.cast(c.b.unary(Unary::Not, truth(c, 0)), c.out().dtype)};
}

std::vector<Value> bitwise_not(LoweringContext& c) { return {c.b.unary(Unary::Not, c.operand_as_output(0))}; }

std::vector<Value> isnan(LoweringContext& c) {
  const Value& x = c.tensor(0);  // a complex NaN (either part) is unequal to itself too
  if (!stablehlo::is_float(x.dtype()) && !stablehlo::is_complex(x.dtype())) return {c.b.constant(0, c.out())};
  return {c.b.compare(stablehlo::Compare::NE, x, x)};
}

Value is_infinite(Builder& b, const Value& x) {
  if (stablehlo::is_complex(x.dtype()))  // either part
    return b.binary(Binary::Or, is_infinite(b, b.real(x)), is_infinite(b, b.imag(x)));
  return b.compare(stablehlo::Compare::EQ, b.unary(Unary::Abs, x), b.constant(INFINITY, x.type));
}

std::vector<Value> isinf(LoweringContext& c) {
  const Value& x = c.tensor(0);
  if (!stablehlo::is_float(x.dtype()) && !stablehlo::is_complex(x.dtype())) return {c.b.constant(0, c.out())};
  return {is_infinite(c.b, x)};
}

// isneginf / isposinf: integers are never infinite.
LoweringRule is_signed_inf(double inf) {
  return [inf](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    if (!stablehlo::is_float(x.dtype())) return {c.b.constant(0, c.out())};
    return {c.b.compare(stablehlo::Compare::EQ, x, c.b.constant(inf, x.type))};
  };
}

// addcmul / addcdiv(self, tensor1, tensor2, *, value): self + value * (t1 op t2).
// Half-precision types compute in float32 and round once, as CPU does.
LoweringRule addc(Binary op) {
  return [op](LoweringContext& c) -> std::vector<Value> {
    DType out = c.out().dtype;
    DType t = out == DType::BFloat16 || out == DType::Float16 ? DType::Float32 : out;
    TensorType type{t, c.out().shape};
    auto operand = [&](size_t i) { return c.b.broadcast_to(c.b.cast(c.tensor(i), t), type.shape); };
    Value r = c.b.binary(op, operand(1), operand(2));
    r = c.b.binary(Binary::Multiply, c.value_as(3, type), r);
    return {c.b.cast(c.b.binary(Binary::Add, operand(0), r), out)};
  };
}

// xlogy(self, other): x log(y); 0 where x == 0 unless y is NaN.
std::vector<Value> xlogy(LoweringContext& c) {
  Value x = c.operand_as_output(0), y = c.operand_as_output(1), zero = c.b.constant(0, c.out());
  Value r = c.b.binary(Binary::Multiply, x, c.b.unary(Unary::Log, y));
  r = c.b.select(c.b.compare(stablehlo::Compare::EQ, x, zero), zero, r);
  return {c.b.select(c.b.compare(stablehlo::Compare::NE, y, y), y, r)};
}

// special_xlog1py(self, other): x log1p(y); 0 where x == 0 unless y is NaN.
std::vector<Value> xlog1py(LoweringContext& c) {
  Value x = c.operand_as_output(0), y = c.operand_as_output(1), zero = c.b.constant(0, c.out());
  Value r = c.b.binary(Binary::Multiply, x, c.b.unary(Unary::Log1p, y));
  r = c.b.select(c.b.compare(stablehlo::Compare::EQ, x, zero), zero, r);
  return {c.b.select(c.b.compare(stablehlo::Compare::NE, y, y), y, r)};
}

// special_entr(self): -x log(x) for x > 0, 0 at 0, -inf below 0, NaN kept.
std::vector<Value> entr(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  auto k = [&](double v) { return c.b.constant(v, x.type); };
  Value r = c.b.unary(Unary::Negate, c.b.binary(Binary::Multiply, x, c.b.unary(Unary::Log, x)));
  r = c.b.select(c.b.compare(stablehlo::Compare::EQ, x, k(0)), k(0), r);
  r = c.b.select(c.b.compare(stablehlo::Compare::LT, x, k(0)), k(-INFINITY), r);
  return {c.b.select(c.b.compare(stablehlo::Compare::NE, x, x), x, r)};
}

// signbit(self): the sign bit, so -0.0 and -NaN count (floats read as integers).
std::vector<Value> signbit(LoweringContext& c) {
  const Value& x = c.tensor(0);
  if (x.dtype() == DType::Bool || stablehlo::is_unsigned_int(x.dtype())) return {c.b.constant(0, c.out())};
  if (!stablehlo::is_float(x.dtype())) return {c.b.compare(stablehlo::Compare::LT, x, c.b.constant(0, x.type))};
  const DType bits = stablehlo::byte_size(x.dtype()) == 8   ? DType::Int64
                     : stablehlo::byte_size(x.dtype()) == 4 ? DType::Int32
                                                            : DType::Int16;
  Value i = c.b.bitcast_convert(x, {bits, x.shape()});
  return {c.b.compare(stablehlo::Compare::LT, i, c.b.constant_int(0, i.type))};
}

// _prelu_kernel(self, weight): x > 0 ? x : w x (weight already broadcastable).
std::vector<Value> prelu(LoweringContext& c) {
  Value x = c.operand_as_output(0), w = c.operand_as_output(1);
  Value pos = c.b.compare(stablehlo::Compare::GT, x, c.b.constant(0, c.out()));
  return {c.b.select(pos, x, c.b.binary(Binary::Multiply, w, x))};
}

// _prelu_kernel_backward(grad_output, self, weight) -> (grad_input, grad_weight),
// both of the broadcast shape (autograd sums grad_weight down to weight's).
std::vector<Value> prelu_backward(LoweringContext& c) {
  Value g = c.operand_as_output(0), x = c.operand_as_output(1), w = c.operand_as_output(2);
  Value zero = c.b.constant(0, c.out());
  Value pos = c.b.compare(stablehlo::Compare::GT, x, zero);
  return {c.b.select(pos, g, c.b.binary(Binary::Multiply, w, g)),
          c.b.cast(c.b.select(pos, zero, c.b.binary(Binary::Multiply, x, g)), c.out(1).dtype)};
}

// sign(x) = (0 < x) - (x < 0), as PyTorch computes it: sign(nan) and
// sign(-0.0) are 0.
std::vector<Value> sign(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (x.dtype() == DType::Bool) return {x};
  if (stablehlo::is_complex(x.dtype())) {  // sgn: x / |x|, and 0 at 0
    Value magnitude = c.b.unary(Unary::Abs, x);
    Value zero = c.b.constant(0, magnitude.type);
    Value is_zero = c.b.compare(stablehlo::Compare::EQ, magnitude, zero);
    Value unit = c.b.binary(Binary::Divide, x, c.b.complex(magnitude, zero));
    return {c.b.select(is_zero, c.b.constant(0, x.type), unit)};
  }
  Value zero = c.b.constant(0, x.type);
  return {c.b.binary(Binary::Subtract, c.b.cast(c.b.compare(stablehlo::Compare::GT, x, zero), x.dtype()),
                     c.b.cast(c.b.compare(stablehlo::Compare::LT, x, zero), x.dtype()))};
}

// abs: unsigned integers are their own absolute value.
std::vector<Value> abs(LoweringContext& c) {
  if (stablehlo::is_complex(c.tensor(0).dtype())) return {c.b.unary(Unary::Abs, c.tensor(0))};  // real-valued
  Value x = c.operand_as_output(0);
  if (stablehlo::is_unsigned_int(x.dtype()) || x.dtype() == DType::Bool) return {x};
  return {c.b.unary(Unary::Abs, x)};
}

// Integer base ** exponent by squaring, in a loop over the exponent's bits
// (XLA's integer power looks at its low 6 bits only: 3 ** 100 came out as
// 3 ** 36). A negative exponent gives 0, except for a base of 1 or -1, as on CPU.
Value integer_power(Builder& b, const Value& base, const Value& exponent) {
  auto k = [&](int64_t v, const TensorType& t) { return b.constant_int(v, t); };
  const TensorType& t = base.type;
  std::vector<int64_t> all(t.rank());
  for (int64_t d = 0; d < t.rank(); ++d) all[d] = d;
  Value e = stablehlo::is_signed_int(t.dtype)
                ? b.select(b.compare(stablehlo::Compare::LT, exponent, k(0, t)), k(0, t), exponent)
                : exponent;
  auto state = b.while_loop(
      {k(1, t), base, e},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value left = r.compare(stablehlo::Compare::NE, s[2], r.constant_int(0, t));
        return {r.reduce(left, r.scalar(0, DType::Bool), all, Binary::Or)};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value one = r.constant_int(1, t);
        Value odd = r.compare(stablehlo::Compare::NE, r.binary(Binary::And, s[2], one), r.constant_int(0, t));
        return {r.select(odd, r.binary(Binary::Multiply, s[0], s[1]), s[0]), r.binary(Binary::Multiply, s[1], s[1]),
                r.binary(Binary::ShiftRightLogical, s[2], one)};
      });
  Value result = state[0];
  if (!stablehlo::is_signed_int(t.dtype)) return result;
  Value odd = b.compare(stablehlo::Compare::NE, b.binary(Binary::And, exponent, k(1, t)), k(0, t));
  Value negative =
      b.select(b.compare(stablehlo::Compare::EQ, base, k(1, t)), k(1, t),
               b.select(b.compare(stablehlo::Compare::EQ, base, k(-1, t)), b.select(odd, k(-1, t), k(1, t)), k(0, t)));
  return b.select(b.compare(stablehlo::Compare::LT, exponent, k(0, t)), negative, result);
}

// base ** e for a float base and a known exponent, as CPU's kernel computes
// it: squares, cubes, square roots and reciprocals exactly, not through
// pow() ((-inf) ** 0.5 is nan there, as sqrt gives). Its float16 kernel
// takes no square root: (-inf) ** 0.5 is inf and (-0) ** 0.5 is 0, as pow()
// gives (`half`: the base is float16, whatever x is computed in).
std::optional<Value> float_power_of(Builder& b, const Value& x, double e, bool half = false) {
  auto one = [&] { return b.constant(1, x.type); };
  if (e == 2) return b.binary(Binary::Multiply, x, x);
  if (e == 3) return b.binary(Binary::Multiply, b.binary(Binary::Multiply, x, x), x);
  if (e == 0.5 && !half) return b.unary(Unary::Sqrt, x);
  if (e == -0.5 && !half) return b.unary(Unary::Rsqrt, x);
  if (e == -1) return b.binary(Binary::Divide, one(), x);
  if (e == -2) return b.binary(Binary::Divide, one(), b.binary(Binary::Multiply, x, x));
  return std::nullopt;
}

// pow in every form (Tensor ** Tensor, Tensor ** Scalar, Scalar ** Tensor).
std::vector<Value> pow(LoweringContext& c) {
  Value base = c.operand_as_output(0), exponent = c.operand_as_output(1);
  const bool known = c.args[1].kind != LoweringArg::Tensor && !c.args[1].dynamic;
  if (stablehlo::is_float(c.out().dtype) || stablehlo::is_complex(c.out().dtype)) {
    if (known)
      if (auto r = float_power_of(c.b, base, c.number(1), c.tensor(0).dtype() == DType::Float16)) return {*r};
    return {c.b.binary(Binary::Power, base, exponent)};
  }
  if (c.out().dtype == DType::Bool)  // b ** e on bools (CPU's result type): e false gives true
    return {c.b.binary(Binary::Or, base, c.b.unary(Unary::Not, exponent))};
  return {integer_power(c.b, base, exponent)};
}

// trunc rounds toward zero; integers are already whole.
Value trunc_value(Builder& b, const Value& x) {
  if (!stablehlo::is_float(x.dtype())) return x;
  Value negative = b.compare(stablehlo::Compare::LT, x, b.constant(0, x.type));
  return b.select(negative, b.unary(Unary::Ceil, x), b.unary(Unary::Floor, x));
}
std::vector<Value> trunc(LoweringContext& c) { return {trunc_value(c.b, c.operand_as_output(0))}; }
std::vector<Value> frac(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.binary(Binary::Subtract, x, trunc_value(c.b, x))};
}

// round(self) and round.decimals(self, decimals): half to even, like PyTorch.
std::vector<Value> round(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (!stablehlo::is_float(x.dtype())) return {x};
  int64_t decimals = c.has(1) ? c.integer(1) : 0;
  if (decimals == 0) return {c.b.unary(Unary::RoundNearestEven, x)};
  Value scale = c.b.constant(std::pow(10.0, static_cast<double>(decimals)), x.type);
  Value r = c.b.unary(Unary::RoundNearestEven, c.b.binary(Binary::Multiply, x, scale));
  return {c.b.binary(Binary::Divide, r, scale)};
}

std::vector<Value> reciprocal(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.binary(Binary::Divide, c.b.constant(1, x.type), x)};
}

LoweringRule log_base(double base) {
  return [base](LoweringContext& c) -> std::vector<Value> {
    Value x = c.operand_as_output(0);
    return {c.b.binary(Binary::Divide, c.b.unary(Unary::Log, x), c.b.constant(std::log(base), x.type))};
  };
}

std::vector<Value> exp2(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  return {c.b.binary(Binary::Power, c.b.constant(2, x.type), x)};
}

std::vector<Value> hypot(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  return {c.b.unary(Unary::Sqrt,
                    c.b.binary(Binary::Add, c.b.binary(Binary::Multiply, a, a), c.b.binary(Binary::Multiply, b, b)))};
}

// lerp(self, end, weight): PyTorch's two-sided form keeps lerp(a, b, 1) == b exactly.
std::vector<Value> lerp(LoweringContext& c) {
  Value a = c.operand_as_output(0), e = c.operand_as_output(1), w = c.operand_as_output(2);
  Value diff = c.b.binary(Binary::Subtract, e, a), one = c.b.constant(1, c.out());
  Value low = c.b.binary(Binary::Add, a, c.b.binary(Binary::Multiply, w, diff));
  Value high =
      c.b.binary(Binary::Subtract, e, c.b.binary(Binary::Multiply, diff, c.b.binary(Binary::Subtract, one, w)));
  Value magnitude = c.b.unary(Unary::Abs, w);  // real for complex weights too
  Value small = c.b.compare(stablehlo::Compare::LT, magnitude, c.b.constant(0.5, magnitude.type));
  return {c.b.select(small, low, high)};
}

// nan_to_num(self, nan?, posinf?, neginf?): defaults are 0 and the dtype's extremes.
std::vector<Value> nan_to_num(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (!stablehlo::is_float(x.dtype())) return {x};
  double big = x.dtype() == DType::Float16    ? 65504.0
               : x.dtype() == DType::BFloat16 ? 3.3895313892515355e38
               : x.dtype() == DType::Float32  ? 3.4028234663852886e38
                                              : 1.7976931348623157e308;
  Value nan = c.b.constant(c.has(1) ? c.number(1) : 0.0, x.type);
  Value pos = c.b.constant(c.has(2) ? c.number(2) : big, x.type);
  Value neg = c.b.constant(c.has(3) ? c.number(3) : -big, x.type);
  x = c.b.select(c.b.compare(stablehlo::Compare::NE, x, x), nan, x);
  x = c.b.select(c.b.compare(stablehlo::Compare::EQ, x, c.b.constant(INFINITY, x.type)), pos, x);
  return {c.b.select(c.b.compare(stablehlo::Compare::EQ, x, c.b.constant(-INFINITY, x.type)), neg, x)};
}

// atan by range reduction and a minimax polynomial (Cephes' atanf). XLA CPU's
// own atan (and atan2 with a constant 1, which it rewrites to it) returns wrong
// values once vectorized (seen at 400 elements), so we do not use it.
std::vector<Value> atan(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  auto k = [&](double v) { return c.b.constant(v, x.type); };
  auto mul = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); };
  auto add = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Add, a, b); };
  Value t = c.b.unary(Unary::Abs, x);
  Value big = c.b.compare(stablehlo::Compare::GT, t, k(2.414213562373095));
  Value mid = c.b.compare(stablehlo::Compare::GT, t, k(0.4142135623730950));
  Value z_big = c.b.binary(Binary::Divide, k(-1), t);
  Value z_mid = c.b.binary(Binary::Divide, c.b.binary(Binary::Subtract, t, k(1)), add(t, k(1)));
  Value z = c.b.select(big, z_big, c.b.select(mid, z_mid, t));
  Value y0 = c.b.select(big, k(M_PI_2), c.b.select(mid, k(M_PI_4), k(0)));
  Value zz = mul(z, z);
  Value p = add(mul(k(8.05374449538e-2), zz), k(-1.38776856032e-1));
  p = add(mul(p, zz), k(1.99777106478e-1));
  p = add(mul(p, zz), k(-3.33329491539e-1));
  Value y = add(y0, add(mul(mul(p, zz), z), z));
  Value negative = c.b.compare(stablehlo::Compare::LT, x, k(0));
  Value r = c.b.select(negative, c.b.unary(Unary::Negate, y), y);
  return {c.b.select(c.b.compare(stablehlo::Compare::NE, x, x), x, r)};  // NaN stays NaN
}

// A low-precision float operand widened to float32: PyTorch's kernels
// compute a formula of several steps there and round once.
Value computed(LoweringContext& c, const Value& x) { return c.b.cast(x, opmath_type(x.dtype())); }

// logaddexp(a, b) = log(exp(a) + exp(b)), as PyTorch computes it: the larger
// plus log1p(exp(-|a - b|)), and equal infinities give themselves.
// logaddexp2 is the same in base 2.
LoweringRule logaddexp(bool base2) {
  return [base2](LoweringContext& c) -> std::vector<Value> {
    Value a = computed(c, c.operand_as_output(0)), b = computed(c, c.operand_as_output(1));
    auto k = [&](double v) { return c.b.constant(v, a.type); };
    Value m = maximum(c.b, a, b);
    Value d = c.b.unary(Unary::Negate, c.b.unary(Unary::Abs, c.b.binary(Binary::Subtract, a, b)));
    Value tail =
        base2 ? c.b.binary(Binary::Divide,
                           c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, c.b.binary(Binary::Multiply, d, k(M_LN2)))),
                           k(M_LN2))
              : c.b.unary(Unary::Log1p, c.b.unary(Unary::Exp, d));
    Value same_inf = c.b.binary(Binary::And, c.b.compare(stablehlo::Compare::EQ, a, b),
                                c.b.compare(stablehlo::Compare::EQ, c.b.unary(Unary::Abs, a), k(INFINITY)));
    return {c.b.cast(c.b.select(same_inf, a, c.b.binary(Binary::Add, m, tail)), c.out().dtype)};
  };
}

// fmax / fmin: a NaN operand loses to a number (maximum / minimum propagate it).
LoweringRule nan_ignoring(bool max) {
  return [max](LoweringContext& c) -> std::vector<Value> {
    Value a = c.operand_as_output(0), b = c.operand_as_output(1);
    Value m = max ? maximum(c.b, a, b) : minimum(c.b, a, b);
    if (!stablehlo::is_float(a.dtype())) return {m};
    m = c.b.select(c.b.compare(stablehlo::Compare::NE, a, a), b, m);
    return {c.b.select(c.b.compare(stablehlo::Compare::NE, b, b), a, m)};
  };
}

// Whether the sign bit of float `x` is set (-0.0 and -NaN included).
Value sign_bit(Builder& b, const Value& x) {
  const DType bits = stablehlo::byte_size(x.dtype()) == 2   ? DType::Int16
                     : stablehlo::byte_size(x.dtype()) == 4 ? DType::Int32
                                                            : DType::Int64;
  Value i = b.bitcast_convert(x, {bits, x.shape()});
  return b.compare(stablehlo::Compare::LT, i, b.constant(0, i.type));
}

// copysign(a, b): |a| with b's sign bit.
std::vector<Value> copysign(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1), magnitude = c.b.unary(Unary::Abs, a);
  return {c.b.select(sign_bit(c.b, b), c.b.unary(Unary::Negate, magnitude), magnitude)};
}

// a << b and a >> b on integers. StableHLO's shifts already give what
// PyTorch's kernels define for amounts past the width or negative (read as
// huge unsigned): 0 to the left, the sign to the right.
LoweringRule shift(bool left) {
  return [left](LoweringContext& c) -> std::vector<Value> {
    Value a = c.operand_as_output(0), b = c.operand_as_output(1);
    const bool is_unsigned = stablehlo::is_unsigned_int(a.dtype()) || a.dtype() == DType::Bool;
    const Binary op = left ? Binary::ShiftLeft : is_unsigned ? Binary::ShiftRightLogical : Binary::ShiftRightArithmetic;
    return {c.b.binary(op, a, b)};
  };
}

// rsub(self, other, alpha) = other - alpha * self.
std::vector<Value> rsub(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  if (c.has(2) && !c.is_number(2, 1)) a = c.b.binary(Binary::Multiply, a, c.value_as(2, c.out()));
  return {c.b.binary(Binary::Subtract, b, a)};
}

// heaviside(x, values): values where x is 0, else x > 0.
std::vector<Value> heaviside(LoweringContext& c) {
  Value x = c.operand_as_output(0), v = c.operand_as_output(1), zero = c.b.constant(0, x.type);
  Value step = c.b.convert(c.b.compare(stablehlo::Compare::GT, x, zero), x.dtype());
  return {c.b.select(c.b.compare(stablehlo::Compare::EQ, x, zero), v, step)};
}

// sinc(x) = sin(pi x) / (pi x), 1 at 0.
std::vector<Value> sinc(LoweringContext& c) {
  Value x = computed(c, c.operand_as_output(0));
  Value px = c.b.binary(Binary::Multiply, x, c.b.constant(M_PI, x.type));
  Value r = c.b.binary(Binary::Divide, c.b.unary(Unary::Sin, px), px);
  r = c.b.select(c.b.compare(stablehlo::Compare::EQ, x, c.b.constant(0, x.type)), c.b.constant(1, x.type), r);
  return {c.b.cast(r, c.out().dtype)};
}

// polygamma(n, self): the n-th derivative of digamma, low-precision floats in
// float32. CHLO's (through Hurwitz zeta) is inaccurate for x < 0 and off by
// ~1e-6 relative below 2, so smaller x is first shifted up with the recurrence
// psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1), elementwise in a loop; a pole
// (x a non-positive integer) comes out as CPU's infinity of the right sign.
std::vector<Value> polygamma(LoweringContext& c) {
  const int64_t n = c.integer(0);
  Value x = computed(c, c.b.cast(c.b.broadcast_to(c.tensor(1), c.out().shape), c.out().dtype));
  if (n == 0) return {c.b.cast(c.b.unary(Unary::Digamma, x), c.out().dtype)};
  double factorial = 1;
  for (int64_t i = 2; i <= n; ++i) factorial *= static_cast<double>(i);
  const double coefficient = (n % 2 ? -1 : 1) * factorial;
  const TensorType t = x.type;
  std::vector<int64_t> all(t.rank());
  for (int64_t d = 0; d < t.rank(); ++d) all[d] = d;
  auto to_shift = [&](Builder& r, const Value& v) {  // finite and < 2: still to shift
    return r.binary(Binary::And, r.compare(stablehlo::Compare::LT, v, r.constant(2, t)),
                    r.compare(stablehlo::Compare::GT, v, r.constant(-INFINITY, t)));
  };
  auto state = c.b.while_loop(
      {x, c.b.constant(0, t)},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.reduce(to_shift(r, s[0]), r.scalar(0, DType::Bool), all, Binary::Or)};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value shift = to_shift(r, s[0]), power = s[0];
        for (int64_t i = 0; i < n; ++i) power = r.binary(Binary::Multiply, power, s[0]);
        Value term = r.binary(Binary::Divide, r.constant(coefficient, t), power);
        return {r.select(shift, r.binary(Binary::Add, s[0], r.constant(1, t)), s[0]),
                r.select(shift, r.binary(Binary::Add, s[1], term), s[1])};
      });
  Value shifted = c.b.binary(Binary::Polygamma, c.b.constant(static_cast<double>(n), t), state[0]);
  return {c.b.cast(c.b.binary(Binary::Subtract, shifted, state[1]), c.out().dtype)};
}

// special_zeta(x, q): CHLO's Hurwitz zeta, with Cephes' infinity at q a
// non-positive integer (for x > 1; x < 1 is NaN), low-precision floats in float32.
std::vector<Value> zeta(LoweringContext& c) {
  Value x = computed(c, c.operand_as_output(0)), q = computed(c, c.operand_as_output(1));
  Value pole = c.b.binary(Binary::And, c.b.compare(stablehlo::Compare::LE, q, c.b.constant(0, q.type)),
                          c.b.compare(stablehlo::Compare::EQ, q, c.b.unary(Unary::Floor, q)));
  pole = c.b.binary(Binary::And, pole,
                    c.b.compare(stablehlo::Compare::GT, x, c.b.constant(1, x.type)));  // x < 1: NaN first
  Value r = c.b.select(pole, c.b.constant(INFINITY, q.type), c.b.binary(Binary::Zeta, x, q));
  r = c.b.select(c.b.compare(stablehlo::Compare::LT, x, c.b.constant(1, x.type)), c.b.constant(NAN, x.type), r);
  return {c.b.cast(r, c.out().dtype)};
}

// nextafter(self, other): CHLO's, exact in every float dtype.
std::vector<Value> nextafter(LoweringContext& c) {
  return {c.b.binary(Binary::NextAfter, c.operand_as_output(0), c.operand_as_output(1))};
}

// gcd(a, b) of integers by Euclid's algorithm, elementwise, looping until
// every remainder is 0; non-negative, gcd(0, 0) = 0, as CPU's calc_gcd.
Value gcd_of(Builder& b, Value x, Value y) {
  if (stablehlo::is_signed_int(x.dtype())) {
    x = b.unary(Unary::Abs, x);
    y = b.unary(Unary::Abs, y);
  }
  std::vector<int64_t> all(x.rank());
  for (int64_t d = 0; d < x.rank(); ++d) all[d] = d;
  const TensorType t = x.type;
  auto state = b.while_loop(
      {x, y},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.reduce(r.compare(stablehlo::Compare::NE, s[1], r.constant_int(0, t)), r.scalar(0, DType::Bool), all,
                         Binary::Or)};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value zero = r.constant_int(0, t), live = r.compare(stablehlo::Compare::NE, s[1], zero);
        Value divisor = r.select(live, s[1], r.constant_int(1, t));
        return {r.select(live, s[1], s[0]), r.select(live, r.binary(Binary::Remainder, s[0], divisor), zero)};
      });
  return state[0];
}

std::vector<Value> gcd(LoweringContext& c) { return {gcd_of(c.b, c.operand_as_output(0), c.operand_as_output(1))}; }

// lcm(a, b) = |a / gcd * b|, 0 when gcd is 0.
std::vector<Value> lcm(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1), g = gcd_of(c.b, a, b);
  Value zero = c.b.constant_int(0, g.type), none = c.b.compare(stablehlo::Compare::EQ, g, zero);
  Value r =
      c.b.binary(Binary::Multiply, c.b.binary(Binary::Divide, a, c.b.select(none, c.b.constant_int(1, g.type), g)), b);
  if (stablehlo::is_signed_int(r.dtype())) r = c.b.unary(Unary::Abs, r);
  return {c.b.select(none, zero, r)};
}

// frexp(self) -> (mantissa, exponent): x = mantissa 2^exponent with |mantissa|
// in [1/2, 1), read off the float's bits (exact). All tests are on the bits:
// XLA's CPU flushes subnormal operands to zero, so a subnormal's mantissa
// field is converted to a (normal) float and decoded instead. 0, inf and NaN
// give themselves and exponent 0.
std::vector<Value> frexp(LoweringContext& c) {
  Builder& b = c.b;
  Value x = c.tensor(0);
  const DType t = x.dtype();
  struct Format {
    DType bits;
    int exponent, mantissa;
  };
  const Format f = t == DType::Float64    ? Format{DType::Int64, 11, 52}
                   : t == DType::Float32  ? Format{DType::Int32, 8, 23}
                   : t == DType::BFloat16 ? Format{DType::Int16, 8, 7}
                   : t == DType::Float16  ? Format{DType::Int16, 5, 10}
                                          : throw Declined("frexp of " + stablehlo::mlir_name(t));
  const int64_t bias = (int64_t{1} << (f.exponent - 1)) - 1, all_ones = (int64_t{1} << f.exponent) - 1;
  const int64_t field_mask = all_ones << f.mantissa, fraction_mask = (int64_t{1} << f.mantissa) - 1;
  const TensorType it{f.bits, x.shape()};
  auto k = [&](int64_t v) { return b.constant_int(v, it); };
  auto field_of = [&](const Value& bits) {
    return b.binary(Binary::And, b.binary(Binary::ShiftRightLogical, bits, k(f.mantissa)), k(all_ones));
  };
  // A normal number's (mantissa bits, exponent).
  auto decode = [&](const Value& bits) -> std::pair<Value, Value> {
    Value exponent = b.binary(Binary::Subtract, field_of(bits), k(bias - 1));
    Value mantissa = b.binary(Binary::Or, b.binary(Binary::And, bits, k(~field_mask)), k((bias - 1) << f.mantissa));
    return {mantissa, exponent};
  };
  Value bits = b.bitcast_convert(x, it), field = field_of(bits);
  Value fraction = b.binary(Binary::And, bits, k(fraction_mask));
  auto [mantissa_bits, exponent] = decode(bits);
  // Subnormal: x = fraction 2^(1 - bias - mantissa bits), the fraction a normal float.
  auto [sub_bits, sub_exponent] = decode(b.bitcast_convert(b.convert(fraction, t), it));
  sub_exponent = b.binary(Binary::Add, sub_exponent, k(1 - bias - f.mantissa));
  const int64_t sign_bit = int64_t{1} << (f.exponent + f.mantissa);
  sub_bits = b.binary(Binary::Or, sub_bits, b.binary(Binary::And, bits, k(sign_bit)));
  Value subnormal = b.binary(Binary::And, b.compare(stablehlo::Compare::EQ, field, k(0)),
                             b.compare(stablehlo::Compare::NE, fraction, k(0)));
  mantissa_bits = b.select(subnormal, sub_bits, mantissa_bits);
  exponent = b.select(subnormal, sub_exponent, exponent);
  Value special = b.binary(Binary::Or,
                           b.binary(Binary::And, b.compare(stablehlo::Compare::EQ, field, k(0)),
                                    b.compare(stablehlo::Compare::EQ, fraction, k(0))),
                           b.compare(stablehlo::Compare::EQ, field, k(all_ones)));
  Value mantissa = b.bitcast_convert(b.select(special, bits, mantissa_bits), x.type);
  exponent = b.select(special, k(0), exponent);
  return {mantissa, b.convert(exponent, DType::Int32)};
}

// zero(self): zeros of self's shape and dtype.
std::vector<Value> zero(LoweringContext& c) { return {c.b.constant(0, c.out())}; }

}  // namespace

LOWERING("aten::_add_relu.Tensor", add_relu);
LOWERING("aten::_add_relu.Scalar", add_relu);
LOWERING("aten::logaddexp", logaddexp(false));
LOWERING("aten::logaddexp2", logaddexp(true));
LOWERING("aten::fmax", nan_ignoring(true));
LOWERING("aten::fmin", nan_ignoring(false));
LOWERING("aten::copysign.Tensor", copysign);
LOWERING("aten::copysign.Scalar", copysign);
LOWERING("aten::__lshift__.Tensor", shift(true));
LOWERING("aten::__lshift__.Scalar", shift(true));
LOWERING("aten::__rshift__.Tensor", shift(false));
LOWERING("aten::__rshift__.Scalar", shift(false));
LOWERING("aten::bitwise_left_shift.Tensor", shift(true));
LOWERING("aten::bitwise_left_shift.Tensor_Scalar", shift(true));
LOWERING("aten::bitwise_left_shift.Scalar_Tensor", shift(true));
LOWERING("aten::bitwise_right_shift.Tensor", shift(false));
LOWERING("aten::bitwise_right_shift.Tensor_Scalar", shift(false));
LOWERING("aten::bitwise_right_shift.Scalar_Tensor", shift(false));
LOWERING("aten::heaviside", heaviside);
LOWERING("aten::frexp.Tensor", frexp);
LOWERING("aten::polygamma", polygamma);
LOWERING("aten::gcd", gcd);
LOWERING("aten::lcm", lcm);
LOWERING("aten::nextafter", nextafter);
LOWERING("aten::special_zeta", zeta);
LOWERING("aten::special_zeta.self_scalar", zeta);
LOWERING("aten::special_zeta.other_scalar", zeta);
LOWERING("aten::sinc", in_float32(sinc));
// float16/bfloat16 in float32, their Scalar and 0-d operands rounded to the op's dtype first (as CPU's TensorIterator).
LOWERING("aten::add.Tensor", in_float32(add, Operands::Rounded));
LOWERING("aten::add.Scalar", in_float32(add, Operands::Rounded));
LOWERING("aten::sub.Tensor", in_float32(sub, Operands::Rounded));
LOWERING("aten::sub.Scalar", in_float32(sub, Operands::Rounded));
LOWERING("aten::rsub.Tensor", in_float32(rsub, Operands::Rounded));
LOWERING("aten::rsub.Scalar", in_float32(rsub, Operands::Rounded));
LOWERING("aten::mul.Tensor", in_float32(mul));
LOWERING("aten::mul.Scalar", in_float32(mul));
LOWERING("aten::div.Tensor", in_float32(div));
LOWERING("aten::div.Scalar", in_float32(div));
LOWERING("aten::div.Tensor_mode", in_float32(div));
LOWERING("aten::div.Scalar_mode", in_float32(div));
LOWERING("aten::floor_divide", floor_divide);
LOWERING("aten::floor_divide.Scalar", floor_divide);
LOWERING("aten::isin.Tensor_Tensor", isin);
LOWERING("aten::isin.Tensor_Scalar", isin);
LOWERING("aten::isin.Scalar_Tensor", isin);
LOWERING("aten::neg", unary(Unary::Negate));
LOWERING("aten::exp", unary(Unary::Exp));
LOWERING("aten::tanh", unary(Unary::Tanh));
LOWERING("aten::sigmoid", unary(Unary::Logistic));
LOWERING("aten::sqrt", unary(Unary::Sqrt));
LOWERING("aten::abs", abs);
LOWERING("aten::relu", relu);
LOWERING("aten::fill.Scalar", fill);
LOWERING("aten::fill.Tensor", fill);
LOWERING("aten::zero", zero);
LOWERING("aten::log", unary(Unary::Log));
LOWERING("aten::rsqrt", unary(Unary::Rsqrt));
LOWERING("aten::sin", unary(Unary::Sin));
LOWERING("aten::cos", unary(Unary::Cos));
LOWERING("aten::floor", rounding(Unary::Floor));
LOWERING("aten::ceil", rounding(Unary::Ceil));
LOWERING("aten::maximum", elementwise_max);
LOWERING("aten::minimum", elementwise_min);
LOWERING("aten::where.self", where);
LOWERING("aten::remainder.Tensor", in_float32(remainder, Operands::Rounded));
LOWERING("aten::remainder.Scalar_Tensor", in_float32(remainder, Operands::Rounded));
LOWERING("aten::remainder.Scalar", in_float32(remainder, Operands::Rounded));
LOWERING("aten::fmod.Tensor", binary_op(Binary::Remainder));
LOWERING("aten::fmod.Scalar", binary_op(Binary::Remainder));
LOWERING("aten::pow.Tensor_Tensor", in_float32(pow));
LOWERING("aten::pow.Tensor_Scalar", in_float32(pow));
LOWERING("aten::pow.Scalar", in_float32(pow, Operands::Rounded));  // the base Scalar: a TensorIterator operand
LOWERING("aten::atan2", in_float32(binary_op(Binary::Atan2)));
LOWERING("aten::hypot", in_float32(hypot));
LOWERING("aten::clamp", clamp);
LOWERING("aten::clamp.Tensor", clamp);
LOWERING("aten::clamp_min", clamp_min);
LOWERING("aten::clamp_min.Tensor", clamp_min);
LOWERING("aten::clamp_max", clamp_max);
LOWERING("aten::clamp_max.Tensor", clamp_max);
LOWERING("aten::bitwise_and.Tensor", binary_op(Binary::And));
LOWERING("aten::bitwise_and.Scalar", binary_op(Binary::And));
LOWERING("aten::bitwise_or.Tensor", binary_op(Binary::Or));
LOWERING("aten::bitwise_or.Scalar", binary_op(Binary::Or));
LOWERING("aten::bitwise_xor.Tensor", binary_op(Binary::Xor));
LOWERING("aten::bitwise_xor.Scalar", binary_op(Binary::Xor));
LOWERING("aten::bitwise_not", bitwise_not);
LOWERING("aten::logical_and", logical(Binary::And));
LOWERING("aten::logical_or", logical(Binary::Or));
LOWERING("aten::logical_xor", logical(Binary::Xor));
LOWERING("aten::logical_not", logical_not);
LOWERING("aten::isnan", isnan);
LOWERING("aten::isinf", isinf);
LOWERING("aten::isneginf", is_signed_inf(-INFINITY));
LOWERING("aten::isposinf", is_signed_inf(INFINITY));
LOWERING("aten::xlogy.Tensor", xlogy);
LOWERING("aten::xlogy.Scalar_Self", xlogy);
LOWERING("aten::xlogy.Scalar_Other", xlogy);
LOWERING("aten::_prelu_kernel", prelu);
LOWERING("aten::_prelu_kernel_backward", prelu_backward);
LOWERING("aten::sign", sign);
LOWERING("aten::sgn", sign);
LOWERING("aten::trunc", trunc);
LOWERING("aten::frac", in_float32(frac));
LOWERING("aten::round", in_float32(round));
LOWERING("aten::round.decimals", in_float32(round));
LOWERING("aten::reciprocal", in_float32(reciprocal));
LOWERING("aten::log2", in_float32(log_base(2.0)));
LOWERING("aten::log10", in_float32(log_base(10.0)));
LOWERING("aten::exp2", in_float32(exp2));
LOWERING("aten::addcmul", addc(Binary::Multiply));
LOWERING("aten::addcdiv", addc(Binary::Divide));
LOWERING("aten::lerp.Scalar", in_float32(lerp));
LOWERING("aten::lerp.Tensor", in_float32(lerp));
LOWERING("aten::nan_to_num", nan_to_num);
LOWERING("aten::expm1", unary(Unary::Expm1));
LOWERING("aten::log1p", unary(Unary::Log1p));
LOWERING("aten::tan", unary(Unary::Tan));
LOWERING("aten::erf", unary(Unary::Erf));
LOWERING("aten::erfc", unary(Unary::Erfc));
LOWERING("aten::special_xlog1py", in_float32(xlog1py));
LOWERING("aten::special_xlog1py.self_scalar", in_float32(xlog1py));
LOWERING("aten::special_xlog1py.other_scalar", in_float32(xlog1py));
LOWERING("aten::special_entr", in_float32(entr));
LOWERING("aten::signbit", signbit);
LOWERING("aten::erfinv", unary(Unary::ErfInv));
LOWERING("aten::lgamma", unary(Unary::Lgamma));
LOWERING("aten::digamma", unary(Unary::Digamma));
LOWERING("aten::asin", unary(Unary::Asin));
LOWERING("aten::acos", unary(Unary::Acos));
LOWERING("aten::atan", in_float32(atan));
LOWERING("aten::sinh", unary(Unary::Sinh));
LOWERING("aten::cosh", unary(Unary::Cosh));
LOWERING("aten::asinh", unary(Unary::Asinh));
LOWERING("aten::acosh", unary(Unary::Acosh));
LOWERING("aten::atanh", unary(Unary::Atanh));
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
