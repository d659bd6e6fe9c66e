// Matrix products: one dot_general each.
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

// Low-precision products sum in float32 and their epilogue (alpha, beta, the
// added term) is applied before the one rounding to the output dtype, as
// cuBLAS does with a float32 compute type.

// Argument i rounded to the output dtype, then widened (exactly) to its
// accumulation type. (A bfloat16 x bfloat16 -> float32 dot_general is what
// TPUs run natively, but XLA:CPU's DotThunk refuses it for larger dots.)
Value operand(LoweringContext& c, size_t i) {
  const DType t = c.out().dtype;
  return c.b.cast(c.b.cast(c.tensor(i), t), opmath_type(t));
}

// lhs . rhs over the given dims, in the accumulation type.
Value product(LoweringContext& c, size_t lhs, size_t rhs, const std::vector<int64_t>& batch,
              const std::vector<int64_t>& lhs_contract, const std::vector<int64_t>& rhs_contract) {
  return c.b.dot_general(operand(c, lhs), operand(c, rhs), batch, batch, lhs_contract, rhs_contract);
}

// beta * self + alpha * p (arguments `beta_at`, `beta_at` + 1), rounded once;
// beta == 0 ignores self, NaN included.
std::vector<Value> epilogue(LoweringContext& c, Value p, size_t self, size_t beta_at) {
  const size_t alpha_at = beta_at + 1;
  auto is_complex_number = [&](size_t i) { return c.has(i) && c.args[i].kind == LoweringArg::Tensor; };
  if (is_complex_number(alpha_at) || is_complex_number(beta_at)) {  // complex alpha or beta (a nonzero beta)
    auto scaled = [&](const Value& v, size_t i) {
      return c.has(i) ? c.b.binary(stablehlo::Binary::Multiply, v, c.value_as(i, v.type)) : v;
    };
    Value s = scaled(c.b.cast(c.operand_as_output(self), p.dtype()), beta_at);
    return {c.b.cast(c.b.binary(stablehlo::Binary::Add, s, scaled(p, alpha_at)), c.out().dtype)};
  }
  const double alpha = c.has(alpha_at) ? c.number(alpha_at) : 1, beta = c.has(beta_at) ? c.number(beta_at) : 1;
  if (alpha != 1) p = c.b.binary(stablehlo::Binary::Multiply, p, c.b.constant(alpha, p.type));
  if (beta != 0) {
    Value s = c.b.cast(c.operand_as_output(self), p.dtype());
    if (beta != 1) s = c.b.binary(stablehlo::Binary::Multiply, s, c.b.constant(beta, p.type));
    p = c.b.binary(stablehlo::Binary::Add, s, p);
  }
  return {c.b.cast(p, c.out().dtype)};
}

// mm(self [n, k], mat2 [k, m]) -> [n, m]
std::vector<Value> mm(LoweringContext& c) { return {c.b.cast(product(c, 0, 1, {}, {1}, {0}), c.out().dtype)}; }

// bmm(self [b, n, k], mat2 [b, k, m]) -> [b, n, m]
std::vector<Value> bmm(LoweringContext& c) { return {c.b.cast(product(c, 0, 1, {0}, {2}, {1}), c.out().dtype)}; }

// dot(self [n], tensor [n]) -> 0-d
std::vector<Value> dot(LoweringContext& c) {
  if (c.tensor(0).dtype() != c.tensor(1).dtype()) throw Declined("dot: mixed dtypes");
  return {c.b.cast(product(c, 0, 1, {}, {0}, {0}), c.out().dtype)};
}

// vdot(a, b) = sum(conj(a) * b).
std::vector<Value> vdot(LoweringContext& c) {
  if (c.tensor(0).dtype() != c.tensor(1).dtype()) throw Declined("vdot: mixed dtypes");
  Value a = operand(c, 0);
  if (stablehlo::is_complex(a.dtype())) a = c.b.complex(c.b.real(a), c.b.unary(stablehlo::Unary::Negate, c.b.imag(a)));
  return {c.b.cast(c.b.dot_general(a, operand(c, 1), {}, {}, {0}, {0}), c.out().dtype)};
}

// addmm(self, mat1, mat2, *, beta, alpha) = beta * self + alpha * (mat1 @ mat2)
std::vector<Value> addmm(LoweringContext& c) { return epilogue(c, product(c, 1, 2, {}, {1}, {0}), 0, 3); }

// _addmm_activation(self, mat1, mat2, *, beta, alpha, use_gelu): relu or
// gelu (erf form, as CPU) of addmm, the addmm rounded to the dtype first.
std::vector<Value> addmm_activation(LoweringContext& c) {
  Value y = epilogue(c, product(c, 1, 2, {}, {1}, {0}), 0, 3)[0];
  if (!c.has(5) || !c.args[5].b) return {maximum(c.b, y, c.b.constant(0, y.type))};
  Value x = c.b.cast(y, opmath_type(y.dtype()));
  Value half = c.b.constant(0.5, x.type),
        erf = c.b.unary(stablehlo::Unary::Erf,
                        c.b.binary(stablehlo::Binary::Multiply, x, c.b.constant(M_SQRT1_2, x.type)));
  Value cdf =
      c.b.binary(stablehlo::Binary::Multiply, half, c.b.binary(stablehlo::Binary::Add, c.b.constant(1, x.type), erf));
  return {c.b.cast(c.b.binary(stablehlo::Binary::Multiply, x, cdf), y.dtype())};
}

// addbmm(self [n, m], batch1 [b, n, k], batch2 [b, k, m], *, beta, alpha) =
// beta * self + alpha * (sum over b of batch1[b] @ batch2[b]): one dot over b and k.
std::vector<Value> addbmm(LoweringContext& c) { return epilogue(c, product(c, 1, 2, {}, {0, 2}, {0, 1}), 0, 3); }

// addmv(self [n], mat [n, k], vec [k], *, beta, alpha) = beta * self + alpha * (mat @ vec)
std::vector<Value> addmv(LoweringContext& c) { return epilogue(c, product(c, 1, 2, {}, {1}, {0}), 0, 3); }

// baddbmm(self, batch1 [b, n, k], batch2 [b, k, m], *, beta, alpha) = beta * self + alpha * (batch1 @ batch2)
std::vector<Value> baddbmm(LoweringContext& c) { return epilogue(c, product(c, 1, 2, {0}, {2}, {1}), 0, 3); }

// addr(self, vec1 [n], vec2 [m], *, beta, alpha) = beta * self + alpha * outer(vec1, vec2)
std::vector<Value> addr(LoweringContext& c) {
  const DType t = c.out().dtype;
  if (t == DType::Bool) throw Declined("addr: bool (logical and / or)");
  const TensorType& o = c.out();
  Value a = operand(c, 1), b = operand(c, 2);
  Value p = c.b.binary(stablehlo::Binary::Multiply, c.b.broadcast_in_dim(a, o.shape, {0}),
                       c.b.broadcast_in_dim(b, o.shape, {1}));
  return epilogue(c, p, 0, 3);
}

// _scaled_mm(self [M, K], mat2 [K, N], scale_a, scale_b, bias?, scale_result?,
// out_dtype, use_fast_accum): the float8 matmul. As CPU's: each operand in
// float32 times its scale (one value, or per row of self [M, 1] and per
// column of mat2 [1, N]), the product plus bias, divided by scale_result for
// a float8 result.
std::vector<Value> scaled_mm(LoweringContext& c) {
  const TensorType& out = c.out();
  Math m{c.b};
  const DType f = DType::Float32;
  auto scaled = [&](size_t operand, size_t scale) {
    Value x = c.b.cast(c.tensor(operand), f), s = c.b.cast(c.tensor(scale), f);
    if (s.type.numel() == 1) return m.mul(x, m.bcast(s, x));
    return m.mul(x, c.b.broadcast_to(s, x.shape()));
  };
  Value p = c.b.dot_general(scaled(0, 2), scaled(1, 3), {}, {}, {1}, {0});
  if (c.has(4)) p = m.add(p, c.b.broadcast_to(c.b.cast(c.tensor(4), f), p.shape()));
  if (c.has(5) && (out.dtype == DType::Float8E4M3FN || out.dtype == DType::Float8E5M2))
    p = m.div(p, m.bcast(c.b.cast(c.tensor(5), f), p));
  return {c.b.cast(p, out.dtype)};
}

// _pdist_forward(self [N, M], p) -> [N (N - 1) / 2]: the p-norm distance of
// every pair of rows i < j, in that order; as CPU's: count of differences
// for p = 0, the largest for p = inf.
std::vector<Value> pdist(LoweringContext& c) {
  const TensorType& out = c.out();
  const Value& x = c.tensor(0);
  const int64_t n = x.shape()[0], m = x.shape()[1];
  if (out.numel() == 0) return {c.b.constant(0, out)};
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) first.push_back(i), second.push_back(j);
  const int64_t pairs = static_cast<int64_t>(first.size());
  auto rows = [&](const std::vector<int64_t>& index) {
    stablehlo::GatherDims g;
    g.offset_dims = {1};
    g.collapsed_slice_dims = {0};
    g.start_index_map = {0};
    g.index_vector_dim = 1;
    return c.b.gather(x, c.b.constant_array_int(index, {DType::Int64, {pairs, 1}}), g, {1, m});
  };
  Math k{c.b};
  Value d = c.b.unary(stablehlo::Unary::Abs, k.sub(rows(first), rows(second)));
  const double p = c.number(1);
  const TensorType t = d.type;
  auto sum = [&](const Value& v) { return c.b.reduce(v, c.b.scalar(0, t.dtype), {1}, stablehlo::Binary::Add); };
  if (p == 0)
    return {sum(c.b.select(c.b.compare(stablehlo::Compare::NE, d, c.b.constant(0, t)), c.b.constant(1, t),
                           c.b.constant(0, t)))};
  if (p == 1) return {sum(d)};
  if (p == 2) return {c.b.unary(stablehlo::Unary::Sqrt, sum(k.mul(d, d)))};
  if (std::isinf(p)) return {c.b.reduce(d, c.b.scalar(0, t.dtype), {1}, stablehlo::Binary::Maximum)};
  Value s = sum(c.b.binary(stablehlo::Binary::Power, d, c.b.constant(p, t)));
  return {c.b.binary(stablehlo::Binary::Power, s, c.b.constant(1 / p, s.type))};
}

// _cdist_forward(x1 [..., P, M], x2 [..., R, M], p, compute_mode) -> [..., P, R].
// p = 2 goes through a matmul as CPU's does (always with compute_mode 1,
// with 0 when P or R > 25): |a|^2 + |b|^2 - 2 a.b as one product of the
// vectors extended by their squared norms and ones, clamped at 0.
std::vector<Value> cdist(LoweringContext& c) {
  const DType t = c.out().dtype;
  const Shape& o = c.out().shape;
  const size_t r = o.size();
  const int64_t rows = o[r - 2], cols = o[r - 1], m = c.tensor(0).shape().back();
  if (c.out().numel() == 0 || m == 0) return {c.b.constant(0, c.out())};
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= o[i];
  auto flat = [&](size_t i, int64_t n) {
    Shape full(o.begin(), o.end() - 2);
    full.push_back(n);
    full.push_back(m);
    return c.b.reshape(c.b.broadcast_to(c.b.cast(c.tensor(i), t), full), {batch, n, m});
  };
  Value x1 = flat(0, rows), x2 = flat(1, cols);
  const double p = c.number(2);  // static: it picks the formula
  const int64_t mode = c.has(3) ? c.integer(3) : 0;
  using stablehlo::Binary;
  if (p == 2 && (mode == 1 || (mode == 0 && (rows > 25 || cols > 25)))) {
    auto squared_norm = [&](const Value& x, int64_t n) {
      return c.b.reshape(c.b.reduce(c.b.binary(Binary::Multiply, x, x), c.b.scalar(0, t), {2}, Binary::Add),
                         {batch, n, 1});
    };
    Value ones1 = c.b.constant(1, {t, {batch, rows, 1}}), ones2 = c.b.constant(1, {t, {batch, cols, 1}});
    Value a = c.b.concatenate(
        {c.b.binary(Binary::Multiply, x1, c.b.constant(-2, x1.type)), squared_norm(x1, rows), ones1}, 2);
    Value b = c.b.concatenate({x2, ones2, squared_norm(x2, cols)}, 2);
    Value d = c.b.dot_general(a, b, {0}, {0}, {2}, {2});
    d = c.b.unary(stablehlo::Unary::Sqrt, c.b.binary(Binary::Maximum, d, c.b.constant(0, d.type)));
    return {c.b.reshape(d, o)};
  }
  const Shape pairs{batch, rows, cols, m};
  Value diff = c.b.unary(stablehlo::Unary::Abs, c.b.binary(Binary::Subtract, c.b.broadcast_in_dim(x1, pairs, {0, 1, 3}),
                                                           c.b.broadcast_in_dim(x2, pairs, {0, 2, 3})));
  auto sum = [&](const Value& v) { return c.b.reduce(v, c.b.scalar(0, t), {3}, Binary::Add); };
  Value d;
  if (p == 0) {
    d = sum(c.b.convert(c.b.compare(stablehlo::Compare::NE, diff, c.b.constant(0, diff.type)), t));
  } else if (p == 1) {
    d = sum(diff);
  } else if (p == 2) {
    d = c.b.unary(stablehlo::Unary::Sqrt, sum(c.b.binary(Binary::Multiply, diff, diff)));
  } else if (std::isinf(p)) {
    d = c.b.reduce(diff, c.b.scalar(0, t), {3}, Binary::Maximum);
  } else {
    d = sum(c.b.binary(Binary::Power, diff, c.b.constant(p, diff.type)));
    d = c.b.binary(Binary::Power, d, c.b.constant(1 / p, d.type));
  }
  return {c.b.reshape(d, o)};
}

// _cdist_backward(grad [..., P, R], x1 [..., P, M], x2 [..., R, M], p, cdist)
// -> grad_x1: the sum over R of grad times d dist / d x1, per p as CPU
// computes it (0 where the distance is 0).
std::vector<Value> cdist_backward(LoweringContext& c) {
  using stablehlo::Binary;
  using stablehlo::Compare;
  const DType t = c.out().dtype;
  const Shape& o = c.out().shape;  // x1's
  const size_t r = o.size();
  const int64_t rows = o[r - 2], m = o[r - 1], cols = c.tensor(2).shape()[c.tensor(2).rank() - 2];
  const double p = c.number(3);
  if (c.out().numel() == 0 || cols == 0 || p == 0) return {c.b.constant(0, c.out())};
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= o[i];
  auto flat = [&](size_t i, int64_t a, int64_t b) {
    Shape full(o.begin(), o.end() - 2);
    full.push_back(a);
    full.push_back(b);
    return c.b.reshape(c.b.broadcast_to(c.b.cast(c.tensor(i), t), full), {batch, a, b});
  };
  const Shape pairs{batch, rows, cols, m};
  Value x1 = flat(1, rows, m), x2 = flat(2, cols, m);
  Value g = c.b.broadcast_in_dim(flat(0, rows, cols), pairs, {0, 1, 2});
  Value dist = c.b.broadcast_in_dim(flat(4, rows, cols), pairs, {0, 1, 2});
  Value diff = c.b.binary(Binary::Subtract, c.b.broadcast_in_dim(x1, pairs, {0, 1, 3}),
                          c.b.broadcast_in_dim(x2, pairs, {0, 2, 3}));
  auto k = [&](double v) { return c.b.constant(v, {t, pairs}); };
  auto mul = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); };
  auto pow = [&](const Value& a, double e) { return c.b.binary(Binary::Power, a, k(e)); };
  Value sign = c.b.unary(stablehlo::Unary::Sign, diff), mag = c.b.unary(stablehlo::Unary::Abs, diff);
  Value term;
  if (p == 1) {
    term = mul(g, sign);
  } else if (std::isinf(p)) {
    term = mul(mul(g, sign), c.b.convert(c.b.compare(Compare::EQ, mag, dist), t));
  } else {
    Value scaled = p == 2  ? c.b.binary(Binary::Divide, mul(g, diff), dist)
                   : p < 2 ? c.b.binary(Binary::Divide, mul(mul(sign, pow(mag, p - 1)), g), pow(dist, p - 1))
                           : c.b.binary(Binary::Divide, mul(mul(diff, pow(mag, p - 2)), g), pow(dist, p - 1));
    Value zero = c.b.compare(Compare::EQ, dist, k(0));
    if (p < 1) zero = c.b.binary(Binary::Or, zero, c.b.compare(Compare::EQ, diff, k(0)));
    term = c.b.select(zero, k(0), scaled);
  }
  return {c.b.reshape(c.b.reduce(term, c.b.scalar(0, t), {2}, Binary::Add), o)};
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
LOWERING("aten::_pdist_forward", pdist);
LOWERING("aten::_scaled_mm", scaled_mm);
LOWERING("aten::_addmm_activation", addmm_activation);
LOWERING("aten::dot", dot);
LOWERING("aten::vdot", vdot);
LOWERING("aten::addmv", addmv);
LOWERING("aten::addr", addr);
LOWERING("aten::baddbmm", baddbmm);
LOWERING("aten::addbmm", addbmm);
LOWERING("aten::linalg_cross", linalg_cross);
LOWERING("aten::_cdist_forward", in_float32(cdist));
LOWERING("aten::_cdist_backward", in_float32(cdist_backward));
LOWERING("aten::_grouped_mm", grouped_mm);

}  // namespace torch_tpu::lowering
