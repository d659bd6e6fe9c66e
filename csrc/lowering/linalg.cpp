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

// addmv(self [n], mat [n, k], vec [k], *, beta, alpha) = beta * self + alpha * (mat @ vec)
std::vector<Value> addmv(LoweringContext& c) {
  DType t = c.out().dtype;
  Value p = c.b.dot_general(c.b.cast(c.tensor(1), t), c.b.cast(c.tensor(2), t), {}, {}, {1}, {0});
  if (c.has(4) && c.number(4) != 1) p = c.b.binary(stablehlo::Binary::Multiply, p, c.b.constant(c.number(4), p.type));
  if (c.has(3) && c.number(3) == 0) return {p};  // self is ignored, NaN included
  Value self = c.operand_as_output(0);
  if (c.has(3) && c.number(3) != 1)
    self = c.b.binary(stablehlo::Binary::Multiply, self, c.b.constant(c.number(3), p.type));
  return {c.b.binary(stablehlo::Binary::Add, self, p)};
}

// linalg_cross(self, other, dim): the cross product of 3-vectors along `dim`.
std::vector<Value> linalg_cross(LoweringContext& c) {
  Value a = c.operand_as_output(0), b = c.operand_as_output(1);
  const int64_t rank = a.rank(), d = normalize_dim(c.has(2) ? c.integer(2) : -1, rank);
  auto component = [&](const Value& x, int64_t i) {
    std::vector<int64_t> start(rank, 0), limit = x.shape(), step(rank, 1);
    start[d] = i;
    limit[d] = i + 1;
    return c.b.slice(x, start, limit, step);
  };
  auto term = [&](int64_t i, int64_t j) {  // a_i b_j - a_j b_i
    return c.b.binary(stablehlo::Binary::Subtract,
                      c.b.binary(stablehlo::Binary::Multiply, component(a, i), component(b, j)),
                      c.b.binary(stablehlo::Binary::Multiply, component(a, j), component(b, i)));
  };
  return {c.b.concatenate({term(1, 2), term(2, 0), term(0, 1)}, d)};
}

// baddbmm(self, batch1 [b, n, k], batch2 [b, k, m], *, beta, alpha) = beta * self + alpha * (batch1 @ batch2)
std::vector<Value> baddbmm(LoweringContext& c) {
  DType t = c.out().dtype;
  Value p = c.b.dot_general(c.b.cast(c.tensor(1), t), c.b.cast(c.tensor(2), t), {0}, {0}, {2}, {1});
  if (c.has(4) && c.number(4) != 1) p = c.b.binary(stablehlo::Binary::Multiply, p, c.b.constant(c.number(4), p.type));
  if (c.has(3) && c.number(3) == 0) return {p};  // self is ignored, NaN included
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

// Which group each of `n` rows (or columns) is in, as a mask [n, groups]:
// `offs` holds each group's end (cumulative counts), so group g spans
// [offs[g-1], offs[g]). Past the last end no group is set.
Value group_mask(Builder& b, const Value& offs, int64_t n) {
  const int64_t groups = offs.shape()[0];
  Value ends = b.cast(offs, DType::Int64);
  Value starts = b.concatenate({b.constant(0, {DType::Int64, {1}}), b.slice(ends, {0}, {groups - 1}, {1})}, 0);
  const Shape shape{n, groups};
  Value i = b.iota({DType::Int64, shape}, 0);
  return b.binary(stablehlo::Binary::And, b.compare(stablehlo::Compare::GE, i, b.broadcast_in_dim(starts, shape, {1})),
                  b.compare(stablehlo::Compare::LT, i, b.broadcast_in_dim(ends, shape, {1})));
}

// `x` broadcast into `shape` with the entries outside each group zeroed: the
// group mask goes into dims (row_dim, group_dim); each list in increasing order.
Value masked(Builder& b, const Value& x, const Value& mask, const Shape& shape, const std::vector<int64_t>& x_dims,
             int64_t row_dim, int64_t group_dim) {
  Value m = row_dim < group_dim ? b.broadcast_in_dim(mask, shape, {row_dim, group_dim})
                                : b.broadcast_in_dim(b.transpose(mask, {1, 0}), shape, {group_dim, row_dim});
  return b.binary(stablehlo::Binary::Multiply, b.broadcast_in_dim(x, shape, x_dims), b.convert(m, x.dtype()));
}

// _grouped_mm(self, mat2, offs, bias, out_dtype): one matmul per group
// (mixture-of-experts layers). With offs, a 2-D operand is split into groups
// along its rows (2-D x 3-D: [S, K] x [G, K, N] -> [S, N]), columns (3-D x
// 2-D) or the contraction (2-D x 2-D -> [G, M, N], the weights' gradient);
// 3-D x 3-D is bmm. Each is one dot_general over operands with the entries
// outside each group zeroed: G times the FLOPs of the grouped products, no
// data-dependent shapes, so one program serves every routing. Rows past the
// last offset (which PyTorch leaves uninitialized) are 0.
std::vector<Value> grouped_mm(LoweringContext& c) {
  const DType t = c.out().dtype;
  Value a = c.b.cast(c.tensor(0), t), w = c.b.cast(c.tensor(1), t);
  if (a.rank() == 3 && w.rank() == 3) {
    if (c.has(2) || c.has(3)) throw Declined("_grouped_mm: 3-D x 3-D with offs or bias");
    return {c.b.dot_general(a, w, {0}, {0}, {2}, {1})};
  }
  if (!c.has(2)) throw Declined("_grouped_mm: a 2-D operand without offs");
  const Value& offs = c.tensor(2);
  const int64_t g = offs.shape()[0];
  if (a.rank() == 2 && w.rank() == 3) {  // [S, K] x [G, K, N]: rows grouped
    const int64_t s = a.shape()[0], k = a.shape()[1];
    Value mask = group_mask(c.b, offs, s);
    Value spread = c.b.reshape(masked(c.b, a, mask, {s, g, k}, {0, 2}, 0, 1), {s, g * k});
    Value y = c.b.dot_general(spread, c.b.reshape(w, {g * k, w.shape()[2]}), {}, {}, {1}, {0});
    if (c.has(3))  // each row's group's bias
      y = c.b.binary(stablehlo::Binary::Add, y,
                     c.b.dot_general(c.b.convert(mask, t), c.b.cast(c.tensor(3), t), {}, {}, {1}, {0}));
    return {y};
  }
  if (c.has(3)) throw Declined("_grouped_mm: bias with a grouped contraction or columns");
  if (a.rank() == 2 && w.rank() == 2) {  // [M, S] x [S, N] -> [G, M, N]: contraction grouped
    const int64_t m = a.shape()[0], s = a.shape()[1];
    Value spread = masked(c.b, a, group_mask(c.b, offs, s), {g, m, s}, {1, 2}, 2, 0);
    return {c.b.dot_general(spread, w, {}, {}, {2}, {0})};
  }
  // [G, M, K] x [K, N] -> [M, N]: columns grouped.
  const int64_t m = a.shape()[1], n = w.shape()[1];
  Value all = c.b.dot_general(a, w, {}, {}, {2}, {0});  // [G, M, N]
  Value picked = masked(c.b, all, group_mask(c.b, offs, n), {g, m, n}, {0, 1, 2}, 2, 0);
  return {c.b.reduce(picked, c.b.scalar(0, t), {0}, stablehlo::Binary::Add)};
}

}  // namespace

LOWERING("aten::mm", mm);
LOWERING("aten::bmm", bmm);
LOWERING("aten::addmm", addmm);
LOWERING("aten::dot", dot);
LOWERING("aten::addmv", addmv);
LOWERING("aten::baddbmm", baddbmm);
LOWERING("aten::linalg_cross", linalg_cross);
LOWERING("aten::_grouped_mm", grouped_mm);

}  // namespace torch_tpu::lowering
