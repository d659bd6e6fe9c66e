// Ops that create values from nothing but their static arguments.
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

// arange.start_out(start, end, step, *, out): out[i] = start + i * step, in the
// output dtype (float32 at least for low-precision floats, as PyTorch does).
std::vector<Value> arange(LoweringContext& c) {
  DType t = c.out().dtype;
  DType compute = (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
  TensorType type{compute, c.out().shape};
  Value i = c.b.iota(type, 0);
  Value v = c.b.binary(stablehlo::Binary::Add, c.b.constant(c.number(0), type),
                       c.b.binary(stablehlo::Binary::Multiply, i, c.b.constant(c.number(2), type)));
  return {c.b.cast(v, t)};
}

// In compiled graphs: arange(end) and arange.start(start, end) step by 1.
std::vector<Value> arange_from(LoweringContext& c, double start, double step) {
  DType t = c.out().dtype;
  DType compute = (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
  TensorType type{compute, c.out().shape};
  Value v = c.b.binary(stablehlo::Binary::Add, c.b.constant(start, type),
                       c.b.binary(stablehlo::Binary::Multiply, c.b.iota(type, 0), c.b.constant(step, type)));
  return {c.b.cast(v, t)};
}

// eye.out(n, *, out) / eye.m_out(n, m, *, out): ones on the diagonal.
std::vector<Value> eye(LoweringContext& c) {
  TensorType idx{DType::Int64, c.out().shape};
  Value diag = c.b.compare(stablehlo::Compare::EQ, c.b.iota(idx, 0), c.b.iota(idx, 1));
  return {c.b.cast(diag, c.out().dtype)};
}

// linspace.out(start, end, steps): CPU's (and CUDA's) formula in the output's
// float type (double for integers).
}  // namespace

// `steps` values of start's type from 0-d start, end and step, each half
// counted from its own end as CPU does: start + step * i before the middle,
// end - step * (steps - 1 - i) after. The index is an integer converted to the
// type, as C++ converts it (so a bfloat16 index rounds past 256, as on CPU).
Value from_both_ends(Builder& b, const Value& start, const Value& end, const Value& step, int64_t steps) {
  const Shape shape{steps};
  const DType t = start.dtype();
  const TensorType index{DType::Int64, shape};
  Value i = b.iota(index, 0);
  Value back = b.binary(stablehlo::Binary::Subtract, b.constant_int(steps - 1, index), i);
  Value step_v = b.broadcast_to(step, shape);
  // Each product rounded before it is added, as on CPU (not fused into an FMA).
  Value low = b.binary(stablehlo::Binary::Add, b.broadcast_to(start, shape),
                       b.rounded(b.binary(stablehlo::Binary::Multiply, step_v, b.convert(i, t))));
  Value high = b.binary(stablehlo::Binary::Subtract, b.broadcast_to(end, shape),
                        b.rounded(b.binary(stablehlo::Binary::Multiply, step_v, b.convert(back, t))));
  return b.select(b.compare(stablehlo::Compare::LT, i, b.constant_int(steps / 2, index)), low, high);
}

Value spaced_values(Builder& b, const Value& start, const Value& end, int64_t steps) {
  if (steps <= 1) return b.broadcast_to(start, {steps});
  Value step = b.binary(stablehlo::Binary::Divide, b.binary(stablehlo::Binary::Subtract, end, start),
                        b.scalar(static_cast<double>(steps - 1), start.dtype()));
  return from_both_ends(b, start, end, step, steps);
}

namespace {

// The type values are spaced in: the output's float type, double for integers.
DType spacing_type(DType out) { return stablehlo::is_float(out) ? out : DType::Float64; }

// An integer result starts from start and end as integers (CPU converts them first).
double bound(LoweringContext& c, int i) {
  return stablehlo::is_float(c.out().dtype) ? c.number(i) : std::trunc(c.number(i));
}

std::vector<Value> linspace(LoweringContext& c) {
  const TensorType& out = c.out();
  const int64_t steps = c.integer(2);
  if (steps == 0) return {c.b.constant(0, out)};
  if (stablehlo::is_complex(out.dtype)) {
    // A complex step divided and multiplied by integers works part by part.
    Value start = c.value_as(0, {out.dtype, {}}), end = c.value_as(1, {out.dtype, {}});
    return {c.b.complex(spaced_values(c.b, c.b.real(start), c.b.real(end), steps),
                        spaced_values(c.b, c.b.imag(start), c.b.imag(end), steps))};
  }
  const DType t = spacing_type(out.dtype);
  return {c.b.convert(spaced_values(c.b, c.b.scalar(bound(c, 0), t), c.b.scalar(bound(c, 1), t), steps), out.dtype)};
}

// Complex logspace as CPU computes it, in the parts' type: the step is a
// complex quotient (a product with 1 / (steps - 1)), and base ** x is
// exp(x * log(base)). One step is base ** start in double.
Value complex_logspace(LoweringContext& c, int64_t steps) {
  Builder& b = c.b;
  const TensorType& out = c.out();
  const double base = c.has(3) ? c.number(3) : 10.0;
  const DType part = steps == 1 ? DType::Float64 : stablehlo::real_part_type(out.dtype);
  const DType z = steps == 1 ? DType::Complex128 : out.dtype;
  Value start = c.value_as(0, {z, {}}), end = c.value_as(1, {z, {}});
  auto mul = [&](const Value& x, const Value& y) { return b.binary(stablehlo::Binary::Multiply, x, y); };
  Value xr = b.broadcast_to(b.real(start), out.shape), xi = b.broadcast_to(b.imag(start), out.shape);
  if (steps > 1) {
    Value scale = b.scalar(1.0 / static_cast<double>(steps - 1), part);
    Value diff = b.binary(stablehlo::Binary::Subtract, end, start);
    xr = from_both_ends(b, b.real(start), b.real(end), mul(b.real(diff), scale), steps);
    xi = from_both_ends(b, b.imag(start), b.imag(end), mul(b.imag(diff), scale), steps);
  }
  // log(base) = ln|base| + i pi for a negative base.
  const TensorType type{part, out.shape};
  Value lr = b.constant(std::log(std::abs(base)), type), li = b.constant(base < 0 ? M_PI : 0.0, type);
  Value ar = b.binary(stablehlo::Binary::Subtract, mul(xr, lr), mul(xi, li));
  Value ai = b.binary(stablehlo::Binary::Add, mul(xr, li), mul(xi, lr));
  Value m = b.unary(stablehlo::Unary::Exp, ar);
  Value y = b.complex(mul(m, b.unary(stablehlo::Unary::Cos, ai)), mul(m, b.unary(stablehlo::Unary::Sin, ai)));
  return b.cast(y, out.dtype);
}

// logspace.out(start, end, steps, base): CPU's formula for real types: start and
// end in the output type, their difference too (so a bfloat16 difference
// rounds), then the exponents and the power in double; a double result reaches
// 16-bit floats through float32, as C++'s float-only constructors round it.
std::vector<Value> logspace(LoweringContext& c) {
  const TensorType& out = c.out();
  const int64_t steps = c.integer(2);
  if (steps == 0) return {c.b.constant(0, out)};
  if (stablehlo::is_complex(out.dtype)) return {complex_logspace(c, steps)};
  const DType t = spacing_type(out.dtype), f64 = DType::Float64;
  // One step fills base ** start with start as given, neither rounded nor truncated.
  Value x = c.b.broadcast_to(c.b.scalar(c.number(0), f64), out.shape);
  if (steps > 1) {
    Value start = c.b.scalar(bound(c, 0), t), end = c.b.scalar(bound(c, 1), t);
    Value step =
        c.b.binary(stablehlo::Binary::Divide, c.b.convert(c.b.binary(stablehlo::Binary::Subtract, end, start), f64),
                   c.b.scalar(static_cast<double>(steps - 1), f64));
    x = from_both_ends(c.b, c.b.convert(start, f64), c.b.convert(end, f64), step, steps);
  }
  Value y = c.b.binary(stablehlo::Binary::Power, c.b.constant(c.has(3) ? c.number(3) : 10.0, x.type), x);
  if (out.dtype == DType::BFloat16 || out.dtype == DType::Float16) y = c.b.convert(y, DType::Float32);
  return {c.b.convert(y, out.dtype)};
}

// tril_indices / triu_indices(row, col, offset): the coordinates of the lower
// (upper) triangle of a row x col matrix, row by row: constants of the sizes.
LoweringRule triangle_indices(bool lower) {
  return [lower](LoweringContext& c) -> std::vector<Value> {
    const int64_t rows = c.integer(0), cols = c.integer(1), offset = c.has(2) ? c.integer(2) : 0;
    std::vector<int64_t> r, k;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (lower ? j - i <= offset : j - i >= offset) {
          r.push_back(i);
          k.push_back(j);
        }
    r.insert(r.end(), k.begin(), k.end());
    if (static_cast<int64_t>(r.size()) != c.out().numel()) throw Declined("tril/triu_indices: unexpected size");
    if (r.empty()) return {c.b.constant(0, c.out())};
    return {c.b.cast(c.b.constant_array_int(r, {DType::Int64, c.out().shape}), c.out().dtype)};
  };
}

}  // namespace

LOWERING("aten::linspace.out", linspace);
LOWERING("aten::logspace.out", logspace);
LOWERING("aten::tril_indices.out", triangle_indices(true));
LOWERING("aten::triu_indices.out", triangle_indices(false));
LOWERING("aten::arange.start_out", arange);
LOWERING("graph:aten::arange.start_step", arange);
LOWERING("graph:aten::arange", [](LoweringContext& c) { return arange_from(c, 0, 1); });
LOWERING("graph:aten::arange.start", [](LoweringContext& c) { return arange_from(c, c.number(0), 1); });
LOWERING("aten::eye.out", eye);
LOWERING("aten::eye.m_out", eye);

}  // namespace torch_tpu::lowering
