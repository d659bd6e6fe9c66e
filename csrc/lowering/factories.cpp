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

// linspace.out(start, end, steps) / logspace.out(start, end, steps, base):
// CPU's formula, each half counted from its own end (start + step * i before
// the middle, end - step * (steps - 1 - i) after), in the output's float type
// (double for integers); logspace raises base to it in double.
}  // namespace

Value spaced_values(Builder& b, const Value& start, const Value& end, int64_t steps) {
  const TensorType type{start.dtype(), {steps}};
  auto k = [&](double v) { return b.constant(v, type); };
  Value start_v = b.broadcast_to(start, type.shape), end_v = b.broadcast_to(end, type.shape);
  if (steps <= 1) return start_v;
  // The step as CPU computes it: (end - start) / (steps - 1) in the dtype.
  Value step = b.binary(stablehlo::Binary::Divide, b.binary(stablehlo::Binary::Subtract, end_v, start_v),
                        k(static_cast<double>(steps - 1)));
  Value i = b.iota(type, 0);
  Value low = b.binary(stablehlo::Binary::Add, start_v, b.binary(stablehlo::Binary::Multiply, step, i));
  Value back = b.binary(stablehlo::Binary::Subtract, k(static_cast<double>(steps - 1)), i);
  Value high = b.binary(stablehlo::Binary::Subtract, end_v, b.binary(stablehlo::Binary::Multiply, step, back));
  return b.select(b.compare(stablehlo::Compare::LT, i, k(static_cast<double>(steps / 2))), low, high);
}

namespace {

LoweringRule spaced(bool log) {
  return [log](LoweringContext& c) -> std::vector<Value> {
    const TensorType& out = c.out();
    const int64_t steps = c.integer(2);
    if (steps == 0) return {c.b.constant(0, out)};
    const DType t = stablehlo::is_float(out.dtype) ? out.dtype : DType::Float64;
    if (t == DType::BFloat16 || t == DType::Float16) throw Declined("linspace/logspace in a 16-bit float");
    // An integer result starts from start and end as integers (CPU converts them first).
    auto bound = [&](double v) { return stablehlo::is_float(out.dtype) ? v : std::trunc(v); };
    Value x = spaced_values(c.b, c.b.scalar(bound(c.number(0)), t), c.b.scalar(bound(c.number(1)), t), steps);
    if (log) {
      Value e = c.b.convert(x, DType::Float64);
      x = c.b.binary(stablehlo::Binary::Power, c.b.constant(c.has(3) ? c.number(3) : 10.0, e.type), e);
    }
    return {c.b.convert(x, out.dtype)};
  };
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

LOWERING("aten::linspace.out", spaced(false));
LOWERING("aten::logspace.out", spaced(true));
LOWERING("aten::tril_indices.out", triangle_indices(true));
LOWERING("aten::triu_indices.out", triangle_indices(false));
LOWERING("aten::arange.start_out", arange);
LOWERING("graph:aten::arange.start_step", arange);
LOWERING("graph:aten::arange", [](LoweringContext& c) { return arange_from(c, 0, 1); });
LOWERING("graph:aten::arange.start", [](LoweringContext& c) { return arange_from(c, c.number(0), 1); });
LOWERING("aten::eye.out", eye);
LOWERING("aten::eye.m_out", eye);

}  // namespace torch_tpu::lowering
