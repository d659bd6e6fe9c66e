// Matrix products: one dot_general each.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

// mm(self [n, k], mat2 [k, m]) -> [n, m]
std::vector<Value> mm(LoweringContext& c) {
  Value a = c.b.cast(c.tensor(0), c.out().dtype), b = c.b.cast(c.tensor(1), c.out().dtype);
  return {c.b.dot_general(a, b, {}, {}, {1}, {0})};
}

// bmm(self [b, n, k], mat2 [b, k, m]) -> [b, n, m]
std::vector<Value> bmm(LoweringContext& c) {
  Value a = c.b.cast(c.tensor(0), c.out().dtype), b = c.b.cast(c.tensor(1), c.out().dtype);
  return {c.b.dot_general(a, b, {0}, {0}, {2}, {1})};
}

// addmm(self, mat1, mat2, *, beta, alpha) = beta * self + alpha * (mat1 @ mat2)
std::vector<Value> addmm(LoweringContext& c) {
  DType t = c.out().dtype;
  Value p = c.b.dot_general(c.b.cast(c.tensor(1), t), c.b.cast(c.tensor(2), t), {}, {}, {1}, {0});
  if (c.has(4) && c.number(4) != 1) p = c.b.binary(stablehlo::Binary::Multiply, p, c.b.constant(c.number(4), p.type));
  if (c.has(3) && c.number(3) == 0) return {p};
  Value self = c.operand_as_output(0);
  if (c.has(3) && c.number(3) != 1)
    self = c.b.binary(stablehlo::Binary::Multiply, self, c.b.constant(c.number(3), p.type));
  return {c.b.binary(stablehlo::Binary::Add, self, p)};
}

// dot(self [n], tensor [n]) -> 0-d
std::vector<Value> dot(LoweringContext& c) {
  if (c.tensor(0).dtype() != c.tensor(1).dtype()) throw Declined("dot: mixed dtypes");
  Value a = c.b.cast(c.tensor(0), c.out().dtype), b = c.b.cast(c.tensor(1), c.out().dtype);
  return {c.b.dot_general(a, b, {}, {}, {0}, {0})};
}

}  // namespace

LOWERING("aten::mm", mm);
LOWERING("aten::bmm", bmm);
LOWERING("aten::addmm", addmm);
LOWERING("aten::dot", dot);

}  // namespace torch_tpu::lowering
