// Matrix factorizations and solves. Cholesky and triangular solves are
// StableHLO ops; LU with partial pivoting is a loop over columns (the XLA
// plugins have no LAPACK); solve, inverse and determinants build on LU, as
// LAPACK's do. Batch dimensions are flattened to one.
#include <algorithm>
#include <cmath>
#include <functional>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

int64_t product(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// x [..., m, n] broadcast to `batch` and flattened: [prod(batch), m, n].
Value flat_batch(Builder& b, const Value& x, const Shape& batch) {
  const int64_t m = x.shape()[x.rank() - 2], n = x.shape()[x.rank() - 1];
  Shape full = batch;
  full.push_back(m);
  full.push_back(n);
  return b.reshape(b.broadcast_to(x, full), {product(batch), m, n});
}

Value transpose_last(Builder& b, const Value& x) { return b.transpose(x, {0, 2, 1}); }

// Complex numbers: the conjugate, the conjugate transpose and |x|^2 (real);
// real values are their own conjugate.
Value conj(Builder& b, const Value& x) {
  return stablehlo::is_complex(x.dtype()) ? b.complex(b.real(x), b.unary(Unary::Negate, b.imag(x))) : x;
}
Value adjoint(Builder& b, const Value& x) { return conj(b, transpose_last(b, x)); }
Value abs2(Builder& b, const Value& x) {
  Value re = b.real(x), sq = b.binary(Binary::Multiply, re, re);
  if (!stablehlo::is_complex(x.dtype())) return sq;
  Value im = b.imag(x);
  return b.binary(Binary::Add, sq, b.binary(Binary::Multiply, im, im));
}

// Where col - row >= k (upper) or <= k (lower), over x's last two dims.
Value band(Builder& b, const TensorType& t, bool upper, int64_t k) {
  const int64_t r = t.rank();
  const TensorType i{DType::Int64, t.shape};
  Value diff = b.binary(Binary::Subtract, b.iota(i, r - 1), b.iota(i, r - 2));
  return b.compare(upper ? Compare::GE : Compare::LE, diff, b.constant_int(k, i));
}

Value triangle(Builder& b, const Value& x, bool upper, int64_t k = 0) {
  return b.select(band(b, x.type, upper, k), x, b.constant(0, x.type));
}

Value diagonal_mask(Builder& b, const TensorType& t) {
  return b.binary(Binary::And, band(b, t, true, 0), band(b, t, false, 0));
}

// The diagonal of each matrix [B, m, n] -> [B, min(m, n)], exactly (the
// other entries are replaced by 0 before the sum).
Value diagonal(Builder& b, const Value& x) {
  const int64_t k = std::min(x.shape()[1], x.shape()[2]);
  Value square = b.slice(x, {0, 0, 0}, {x.shape()[0], k, k}, {1, 1, 1});
  return b.reduce(b.select(diagonal_mask(b, square.type), square, b.constant(0, square.type)), b.scalar(0, x.dtype()),
                  {2}, Binary::Add);
}

// Solves with the triangle of `a` that `lower` names (the other is ignored,
// as LAPACK does); a unit diagonal is taken as ones.
using TriOp = Builder::TriangularOp;
Value tri_solve(Builder& b, Value a, const Value& rhs, bool left, bool lower, bool unit, TriOp op) {
  a = triangle(b, a, !lower);
  if (unit) a = b.select(diagonal_mask(b, a.type), b.constant(1, a.type), a);
  return b.triangular_solve(a, rhs, left, lower, unit, op);
}

// All of `ok` (bool) true, as a 0-d bool: a device-side check.
Value all_true(Builder& b, const Value& ok) {
  std::vector<int64_t> dims(ok.rank());
  for (int64_t d = 0; d < ok.rank(); ++d) dims[d] = d;
  return b.reduce(ok, b.scalar(1, DType::Bool), dims, Binary::And);
}

// ---- Cholesky

// LAPACK's potrf info from the factor [B, n, n]: the order (1-based) of the
// first leading minor whose pivot is not positive (XLA leaves NaN from there
// on), 0 if none.
Value cholesky_info(Builder& b, const Value& l) {
  const int64_t batch = l.shape()[0], n = l.shape()[1];
  Value d = b.real(diagonal(b, l));
  Value bad = b.unary(Unary::Not, b.compare(Compare::GT, d, b.constant(0, d.type)));
  const TensorType it{DType::Int32, {batch, n}};
  Value order = b.binary(Binary::Add, b.iota(it, 1), b.constant_int(1, it));
  Value first = b.reduce(b.select(bad, order, b.constant_int(n + 1, it)), b.constant_int(n + 1, {DType::Int32, {}}),
                         {1}, Binary::Minimum);
  const TensorType info{DType::Int32, {batch}};
  return b.select(b.compare(Compare::EQ, first, b.constant_int(n + 1, info)), b.constant_int(0, info), first);
}

const char* kNotPositiveDefinite =
    ": The factorization could not be completed because the input is not positive-definite.";

// The factor and its info, batch flattened.
std::pair<Value, Value> cholesky_of(Builder& b, const Value& a, bool upper) {
  Value l = triangle(b, b.cholesky(a, !upper), upper);
  return {l, cholesky_info(b, upper ? transpose_last(b, l) : l)};
}

// linalg_cholesky_ex(self, *, upper=False, check_errors=False) -> (L, info)
std::vector<Value> linalg_cholesky_ex(LoweringContext& c) {
  const bool upper = c.has(1) && c.args[1].b;
  if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1))};
  auto [l, info] =
      cholesky_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), c.out(0).dtype), batch_of(c.out(0).shape)), upper);
  if (c.has(2) && c.args[2].b)
    c.checks.push_back({all_true(c.b, c.b.compare(Compare::EQ, info, c.b.constant_int(0, info.type))),
                        std::string("linalg.cholesky") + kNotPositiveDefinite, false});
  return {c.b.reshape(l, c.out(0).shape), c.b.reshape(info, c.out(1).shape)};
}

// cholesky(self, upper=False): the deprecated form, which always checks.
std::vector<Value> cholesky(LoweringContext& c) {
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  auto [l, info] = cholesky_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), c.out().dtype), batch_of(c.out().shape)),
                               c.has(1) && c.args[1].b);
  c.checks.push_back({all_true(c.b, c.b.compare(Compare::EQ, info, c.b.constant_int(0, info.type))),
                      std::string("cholesky") + kNotPositiveDefinite, false});
  return {c.b.reshape(l, c.out().shape)};
}

// X with L L^H X = B (or U^H U X = B), a and rhs batch-flattened alike.
Value cholesky_solve_of(Builder& b, const Value& factor, const Value& rhs, bool upper) {
  Value y = tri_solve(b, factor, rhs, true, !upper, false, upper ? TriOp::Adjoint : TriOp::None);
  return tri_solve(b, factor, y, true, !upper, false, upper ? TriOp::None : TriOp::Adjoint);
}

// _cholesky_solve_helper(self=B, A=factor, upper): cholesky_solve has broadcast both.
std::vector<Value> cholesky_solve_helper(LoweringContext& c) {
  const DType t = c.out().dtype;
  const Shape batch = batch_of(c.out().shape);
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  Value x = cholesky_solve_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(1), t), batch),
                              flat_batch(c.b, c.b.cast(c.tensor(0), t), batch), c.args[2].b);
  return {c.b.reshape(x, c.out().shape)};
}

Value identity_like(Builder& b, const TensorType& t) {
  return b.select(diagonal_mask(b, t), b.constant(1, t), b.constant(0, t));
}

// cholesky_inverse(self=factor, upper=False): (L L^H)^-1.
std::vector<Value> cholesky_inverse(LoweringContext& c) {
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  Value f = flat_batch(c.b, c.b.cast(c.tensor(0), c.out().dtype), batch_of(c.out().shape));
  return {c.b.reshape(cholesky_solve_of(c.b, f, identity_like(c.b, f.type), c.has(1) && c.args[1].b), c.out().shape)};
}

// ---- Triangular solves

// linalg_solve_triangular(self=A, B, *, upper, left=True, unitriangular=False)
std::vector<Value> linalg_solve_triangular(LoweringContext& c) {
  const DType t = c.out().dtype;
  const bool upper = c.args[2].b, left = !c.has(3) || c.args[3].b, unit = c.has(4) && c.args[4].b;
  const Shape batch = batch_of(c.out().shape);
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), t), batch), rhs = flat_batch(c.b, c.b.cast(c.tensor(1), t), batch);
  return {c.b.reshape(tri_solve(c.b, a, rhs, left, !upper, unit, TriOp::None), c.out().shape)};
}

// triangular_solve(self=B, A, upper=True, transpose=False, unitriangular=False)
//   -> (solution, cloned_coefficient)
std::vector<Value> triangular_solve(LoweringContext& c) {
  const DType t = c.out(0).dtype;
  const bool upper = !c.has(2) || c.args[2].b, transpose = c.has(3) && c.args[3].b, unit = c.has(4) && c.args[4].b;
  const Shape batch = batch_of(c.out(0).shape);
  Value a = c.b.broadcast_to(c.b.cast(c.tensor(1), t), c.out(1).shape);
  if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), a};
  Value x = tri_solve(c.b, flat_batch(c.b, a, batch), flat_batch(c.b, c.b.cast(c.tensor(0), t), batch), true, !upper,
                      unit, transpose ? TriOp::Transpose : TriOp::None);
  return {c.b.reshape(x, c.out(0).shape), a};
}

// ---- LU

struct Lu {
  Value lu, pivots, info;  // [B, m, n]; int32 [B, min(m, n)], 1-based; int32 [B]
};

Value i32(Builder& b, int64_t v) { return b.constant_int(v, {DType::Int32, {}}); }

// Column j of x [B, r, c] as [B, r].
Value column(Builder& r, const Value& x, const Value& j) {
  const Value zero = i32(r, 0);
  return r.reshape(r.dynamic_slice(x, {zero, zero, j}, {x.shape()[0], x.shape()[1], 1}), {x.shape()[0], x.shape()[1]});
}

// rows[b, i] = x[b, perm[b, i]] for x [B, n, k].
Value permute_rows(Builder& b, const Value& x, const Value& perm) {
  stablehlo::GatherDims g;
  g.offset_dims = {2};
  g.collapsed_slice_dims = {1};
  g.operand_batching_dims = {0};
  g.start_indices_batching_dims = {0};
  g.start_index_map = {1};
  g.index_vector_dim = 2;
  const int64_t batch = x.shape()[0], n = perm.shape()[1];
  return b.gather(x, b.reshape(perm, {batch, n, 1}), g, {1, 1, x.shape()[2]});
}

// The LU factorization with partial pivoting of each matrix of x [B, m, n],
// as LAPACK's getrf: column j takes the row of largest magnitude at or below
// j as its pivot (the first of equal ones), the rows below are scaled by its
// reciprocal and the trailing block updated. info is the first zero pivot
// (1-based), 0 if none; the factorization goes on past it.
Lu lu_factor(Builder& b, const Value& x) {
  const int64_t batch = x.shape()[0], m = x.shape()[1], n = x.shape()[2], k = std::min(m, n);
  const DType t = x.dtype();
  auto state = b.while_loop(
      {i32(b, 0), x, b.constant_int(0, {DType::Int32, {batch, k}}), b.constant_int(0, {DType::Int32, {batch}})},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.compare(Compare::LT, s[0], i32(r, k))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        const Value &j = s[0], &a = s[1], &pivots = s[2], &info = s[3], zero = i32(r, 0);
        const TensorType full{DType::Int32, {batch, m, n}}, column_t{DType::Int32, {batch, m}};
        auto splat = [&](const Value& v, const Shape& shape, std::vector<int64_t> dims) {
          return r.broadcast_in_dim(v, shape, dims);
        };
        // The pivot row p of column j: the largest magnitude at or below j
        // (NaN only if all are), the first of equal ones.
        Value col = column(r, a, j);
        Value rows = r.iota(column_t, 1), jc = splat(j, {batch, m}, {});
        // LAPACK's i?amax: |re| + |im| for complex numbers.
        Value mag = stablehlo::is_complex(t)
                        ? r.binary(Binary::Add, r.unary(Unary::Abs, r.real(col)), r.unary(Unary::Abs, r.imag(col)))
                        : r.unary(Unary::Abs, col);
        mag = r.select(r.compare(Compare::NE, mag, mag), r.constant(-1, mag.type), mag);
        mag = r.select(r.compare(Compare::GE, rows, jc), mag, r.constant(-2, mag.type));
        Value best = r.reduce(mag, r.scalar(-3, mag.dtype()), {1}, Binary::Maximum);
        Value is_best = r.compare(Compare::EQ, mag, splat(best, {batch, m}, {0}));
        Value p = r.reduce(r.select(is_best, rows, r.constant_int(m, column_t)), i32(r, m), {1}, Binary::Minimum);
        // Swap rows j and p.
        Value rows_full = r.iota(full, 1), cols_full = r.iota(full, 2), jf = splat(j, {batch, m, n}, {});
        Value row_j = r.dynamic_slice(a, {zero, j, zero}, {batch, 1, n});
        Value row_p = permute_rows(r, a, r.reshape(p, {batch, 1}));  // [B, 1, n]
        Value pf = splat(p, {batch, m, n}, {0});
        Value swapped =
            r.select(r.compare(Compare::EQ, rows_full, jf), splat(r.reshape(row_p, {batch, n}), {batch, m, n}, {0, 2}),
                     r.select(r.compare(Compare::EQ, rows_full, pf),
                              splat(r.reshape(row_j, {batch, n}), {batch, m, n}, {0, 2}), a));
        // Eliminate below the pivot.
        Value pivot = r.reshape(r.dynamic_slice(swapped, {zero, j, j}, {batch, 1, 1}), {batch});
        Value pivot_f = splat(pivot, {batch, m, n}, {0});
        Value nonzero = r.compare(Compare::NE, pivot_f, r.constant(0, pivot_f.type));
        Value below = r.compare(Compare::GT, rows_full, jf);
        Value col_f = splat(column(r, swapped, j), {batch, m, n}, {0, 1});
        Value multiplier = r.select(
            nonzero, r.binary(Binary::Multiply, col_f, r.binary(Binary::Divide, r.constant(1, pivot_f.type), pivot_f)),
            col_f);
        Value row_f = splat(r.reshape(r.dynamic_slice(swapped, {zero, j, zero}, {batch, 1, n}), {batch, n}),
                            {batch, m, n}, {0, 2});
        Value updated = r.binary(Binary::Subtract, swapped, r.binary(Binary::Multiply, multiplier, row_f));
        Value right = r.compare(Compare::GT, cols_full, jf), at_j = r.compare(Compare::EQ, cols_full, jf);
        Value next = r.select(r.binary(Binary::And, below, right), updated,
                              r.select(r.binary(Binary::And, below, at_j), multiplier, swapped));
        // Record the pivot (1-based) and the first zero pivot.
        const TensorType piv_t{DType::Int32, {batch, k}};
        Value at = r.compare(Compare::EQ, r.iota(piv_t, 1), splat(j, {batch, k}, {}));
        Value one = i32(r, 1);
        Value next_pivots =
            r.select(at, splat(r.binary(Binary::Add, p, r.constant_int(1, p.type)), {batch, k}, {0}), pivots);
        const TensorType info_t{DType::Int32, {batch}};
        Value first_zero = r.binary(Binary::And, r.compare(Compare::EQ, pivot, r.constant(0, pivot.type)),
                                    r.compare(Compare::EQ, info, r.constant_int(0, info_t)));
        Value next_info = r.select(first_zero, splat(r.binary(Binary::Add, j, one), {batch}, {}), info);
        return {r.binary(Binary::Add, j, one), next, next_pivots, next_info};
      });
  return {state[1], state[2], state[3]};
}

// perm [B, n] with (P^T x)[i] = x[perm[i]]: the row swaps of the 1-based
// pivots [B, k] applied in order to 0..n-1.
Value permutation(Builder& b, const Value& pivots, int64_t n) {
  const int64_t batch = pivots.shape()[0], k = pivots.shape()[1];
  const TensorType t{DType::Int32, {batch, n}};
  auto state = b.while_loop(
      {i32(b, 0), b.iota(t, 1), pivots},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.compare(Compare::LT, s[0], i32(r, k))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        const Value &j = s[0], &perm = s[1], zero = i32(r, 0);
        Value p = r.binary(Binary::Subtract, r.reshape(r.dynamic_slice(s[2], {zero, j}, {batch, 1}), {batch}),
                           r.constant_int(1, {DType::Int32, {batch}}));
        Value idx = r.iota(t, 1), jb = r.broadcast_in_dim(j, {batch, n}, {}),
              pb = r.broadcast_in_dim(p, {batch, n}, {0});
        Value at_p = r.compare(Compare::EQ, idx, pb);
        Value vj =
            r.broadcast_in_dim(r.reshape(r.dynamic_slice(perm, {zero, j}, {batch, 1}), {batch}), {batch, n}, {0});
        Value vp = r.broadcast_in_dim(r.reduce(r.select(at_p, perm, r.constant_int(0, t)), i32(r, 0), {1}, Binary::Add),
                                      {batch, n}, {0});
        Value next = r.select(r.compare(Compare::EQ, idx, jb), vp, r.select(at_p, vj, perm));
        return {r.binary(Binary::Add, j, i32(r, 1)), next, s[2]};
      });
  return state[1];
}

// inverse[perm[i]] = i, in integers.
Value inverse_permutation(Builder& b, const Value& perm) {
  const int64_t batch = perm.shape()[0], n = perm.shape()[1];
  const TensorType t{DType::Int32, {batch, n, n}};  // [B, i, j]
  Value hit = b.compare(Compare::EQ, b.broadcast_in_dim(perm, t.shape, {0, 1}), b.iota(t, 2));
  return b.reduce(b.select(hit, b.iota(t, 1), b.constant_int(0, t)), i32(b, 0), {1}, Binary::Add);
}

// X with A X = B (left) or X A = B, conjugate: A^H in place of A; A = P L U
// given by lu [B, n, n] and pivots, rhs [B, n, k] (left) or [B, k, n].
Value lu_solve_of(Builder& b, const Value& lu, const Value& pivots, const Value& rhs, bool left, bool conjugate) {
  if (!left)  // X op(A) = B is op(A)^H X^H = B^H
    return adjoint(b, lu_solve_of(b, lu, pivots, adjoint(b, rhs), true, !conjugate));
  Value perm = permutation(b, pivots, lu.shape()[1]);
  if (!conjugate) {
    Value y = tri_solve(b, lu, permute_rows(b, rhs, perm), true, true, true, TriOp::None);
    return tri_solve(b, lu, y, true, false, false, TriOp::None);
  }
  Value y = tri_solve(b, lu, rhs, true, false, false, TriOp::Adjoint);
  Value z = tri_solve(b, lu, y, true, true, true, TriOp::Adjoint);
  return permute_rows(b, z, inverse_permutation(b, perm));
}

Value flat_pivots(Builder& b, const Value& pivots, const Shape& batch) {
  Shape full = batch;
  full.push_back(pivots.shape().back());
  return b.reshape(b.broadcast_to(b.cast(pivots, DType::Int32), full), {product(batch), full.back()});
}

Value info_check(Builder& b, const Value& info) {
  return all_true(b, b.compare(Compare::EQ, info, b.constant_int(0, info.type)));
}

// linalg_lu_factor_ex(A, *, pivot=True, check_errors=False) -> (LU, pivots, info)
std::vector<Value> linalg_lu_factor_ex(LoweringContext& c) {
  if (c.has(1) && !c.args[1].b) throw Declined("linalg_lu_factor_ex: pivot=False (CPU has no such LU either)");
  if (c.out(0).numel() == 0)
    return {c.b.constant(0, c.out(0)), c.b.constant_int(1, c.out(1)), c.b.constant(0, c.out(2))};
  Lu f = lu_factor(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), c.out(0).dtype), batch_of(c.out(0).shape)));
  if (c.has(2) && c.args[2].b)
    c.checks.push_back({info_check(c.b, f.info),
                        "torch.linalg.lu_factor_ex: The factorization is singular (a zero pivot): U is not invertible.",
                        false});
  return {c.b.reshape(f.lu, c.out(0).shape), c.b.reshape(f.pivots, c.out(1).shape),
          c.b.reshape(f.info, c.out(2).shape)};
}

// linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False)
std::vector<Value> linalg_lu_solve(LoweringContext& c) {
  const DType t = c.out().dtype;
  const bool left = !c.has(3) || c.args[3].b, adjoint = c.has(4) && c.args[4].b;
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  const Shape batch = batch_of(c.out().shape);
  Value x = lu_solve_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), t), batch), flat_pivots(c.b, c.tensor(1), batch),
                        flat_batch(c.b, c.b.cast(c.tensor(2), t), batch), left, adjoint);
  return {c.b.reshape(x, c.out().shape)};
}

const char* kSingular = ": The solver failed because the input matrix is singular.";

// _linalg_solve_ex(A, B, *, left=True, check_errors=False) -> (result, LU, pivots, info).
// B is a vector when it has A's shape without the last dimension (or is 1-D).
std::vector<Value> linalg_solve_ex(LoweringContext& c) {
  const DType t = c.out(0).dtype;
  const bool left = !c.has(2) || c.args[2].b;
  const TensorType& lu_t = c.out(1);
  if (lu_t.numel() == 0 || c.out(0).numel() == 0)
    return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1)), c.b.constant_int(1, c.out(2)),
            c.b.constant(0, c.out(3))};
  const Shape lu_batch = batch_of(lu_t.shape);
  Lu f = lu_factor(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), t), lu_batch));
  const bool vector = c.out(0).rank() == lu_t.rank() - 1;
  Value rhs = c.b.cast(c.tensor(1), t);
  Shape result_shape = c.out(0).shape;
  if (vector) {
    result_shape.insert(left ? result_shape.end() : result_shape.end() - 1, 1);
    Shape rs = rhs.shape();
    rs.insert(left ? rs.end() : rs.end() - 1, 1);
    rhs = c.b.reshape(rhs, rs);
  }
  const Shape batch = batch_of(result_shape);
  // LU's batch is A's broadcast one; the result's may be larger (B's).
  Value lu = flat_batch(c.b, c.b.reshape(f.lu, lu_t.shape), batch);
  Value piv = flat_pivots(c.b, c.b.reshape(f.pivots, c.out(2).shape), batch);
  Value x = lu_solve_of(c.b, lu, piv, flat_batch(c.b, rhs, batch), left, false);
  if (c.has(3) && c.args[3].b)
    c.checks.push_back({info_check(c.b, f.info), std::string("torch.linalg.solve") + kSingular, false});
  return {c.b.reshape(x, c.out(0).shape), c.b.reshape(f.lu, lu_t.shape), c.b.reshape(f.pivots, c.out(2).shape),
          c.b.reshape(f.info, c.out(3).shape)};
}

// linalg_inv_ex(A, *, check_errors=False) -> (inverse, info)
std::vector<Value> linalg_inv_ex(LoweringContext& c) {
  if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1))};
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), c.out(0).dtype), batch_of(c.out(0).shape));
  Lu f = lu_factor(c.b, a);
  Value x = lu_solve_of(c.b, f.lu, f.pivots, identity_like(c.b, a.type), true, false);
  if (c.has(1) && c.args[1].b)
    c.checks.push_back({info_check(c.b, f.info), std::string("linalg.inv") + kSingular, false});
  return {c.b.reshape(x, c.out(0).shape), c.b.reshape(f.info, c.out(1).shape)};
}

// -1 where the pivots make an odd permutation, else 1 ([B], dtype t).
Value permutation_sign(Builder& b, const Value& pivots, DType t) {
  const TensorType it = pivots.type;
  Value moved = b.compare(Compare::NE, pivots, b.binary(Binary::Add, b.iota(it, 1), b.constant_int(1, it)));
  Value swaps = b.reduce(b.convert(moved, DType::Int32), i32(b, 0), {1}, Binary::Add);
  Value odd = b.compare(Compare::EQ, b.binary(Binary::And, swaps, b.constant_int(1, swaps.type)),
                        b.constant_int(1, swaps.type));
  const TensorType st{t, {pivots.shape()[0]}};
  return b.select(odd, b.constant(-1, st), b.constant(1, st));
}

// The LU that CPU's _linalg_det and _linalg_slogdet return (their backward
// solves with it): of A^T when A is contiguous (det(A^T) = det(A); LAPACK
// wants column-major), else of A.
Lu determinant_lu(LoweringContext& c, const Shape& lu_shape) {
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), c.out(0).dtype), batch_of(lu_shape));
  return lu_factor(c.b, c.args[0].contiguous ? transpose_last(c.b, a) : a);
}

// _linalg_det(A) -> (result, LU, pivots): the product of U's diagonal, signed by the permutation.
std::vector<Value> linalg_det(LoweringContext& c) {
  const DType t = c.out(0).dtype;
  if (c.out(1).numel() == 0)
    return {c.b.constant(1, c.out(0)), c.b.constant(0, c.out(1)), c.b.constant_int(1, c.out(2))};
  Lu f = determinant_lu(c, c.out(1).shape);
  Value det = c.b.reduce(diagonal(c.b, f.lu), c.b.scalar(1, t), {1}, Binary::Multiply);
  det = c.b.binary(Binary::Multiply, det, permutation_sign(c.b, f.pivots, t));
  return {c.b.reshape(det, c.out(0).shape), c.b.reshape(f.lu, c.out(1).shape), c.b.reshape(f.pivots, c.out(2).shape)};
}

// _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots)
std::vector<Value> linalg_slogdet(LoweringContext& c) {
  const DType t = c.out(0).dtype, part = c.out(1).dtype;
  if (c.out(2).numel() == 0)
    return {c.b.constant(1, c.out(0)), c.b.constant(0, c.out(1)), c.b.constant(0, c.out(2)),
            c.b.constant_int(1, c.out(3))};
  Lu f = determinant_lu(c, c.out(2).shape);
  Value d = diagonal(c.b, f.lu);
  Value zero = c.b.constant(0, d.type), mag = c.b.unary(Unary::Abs, d);
  // Each pivot's sign: +-1 (0 for 0 and NaN, as sign()), or d / |d| for complex numbers (sgn()).
  Value signs =
      stablehlo::is_complex(t)
          ? c.b.select(c.b.compare(Compare::EQ, d, zero), zero, c.b.binary(Binary::Divide, d, c.b.cast(mag, d.dtype())))
          : c.b.select(c.b.compare(Compare::GT, d, zero), c.b.constant(1, d.type),
                       c.b.select(c.b.compare(Compare::LT, d, zero), c.b.constant(-1, d.type), zero));
  Value sign = c.b.binary(Binary::Multiply, c.b.reduce(signs, c.b.scalar(1, t), {1}, Binary::Multiply),
                          permutation_sign(c.b, f.pivots, t));
  Value logabs = c.b.reduce(c.b.unary(Unary::Log, mag), c.b.scalar(0, part), {1}, Binary::Add);
  return {c.b.reshape(sign, c.out(0).shape), c.b.reshape(logabs, c.out(1).shape), c.b.reshape(f.lu, c.out(2).shape),
          c.b.reshape(f.pivots, c.out(3).shape)};
}

// P [B, m, m], L [B, m, k] and U [B, k, n] of a packed LU [B, m, n] and its pivots.
std::vector<Value> unpack(Builder& b, const Value& lu, const Value& pivots) {
  const int64_t batch = lu.shape()[0], m = lu.shape()[1], n = lu.shape()[2], k = std::min(m, n);
  Value perm = permutation(b, pivots, m);
  // P[r, c] = 1 where perm[c] == r: A = P L U.
  const TensorType pt{lu.dtype(), {batch, m, m}}, it{DType::Int32, {batch, m, m}};
  Value hit = b.compare(Compare::EQ, b.broadcast_in_dim(perm, it.shape, {0, 2}), b.iota(it, 1));
  Value p = b.select(hit, b.constant(1, pt), b.constant(0, pt));
  Value l = b.slice(lu, {0, 0, 0}, {batch, m, k}, {1, 1, 1});
  l = b.select(diagonal_mask(b, l.type), b.constant(1, l.type), triangle(b, l, false, -1));
  Value u = triangle(b, b.slice(lu, {0, 0, 0}, {batch, k, n}, {1, 1, 1}), true);
  return {p, l, u};
}

// linalg_lu(A, *, pivot=True) -> (P, L, U)
std::vector<Value> linalg_lu(LoweringContext& c) {
  if (c.has(1) && !c.args[1].b) throw Declined("linalg_lu: pivot=False (CPU has no such LU either)");
  const TensorType& a_t = c.out(1);  // L [..., m, k]
  const int64_t m = a_t.shape[a_t.rank() - 2];
  if (c.out(1).numel() == 0 || c.out(2).numel() == 0) {
    const Shape batch = batch_of(c.out(0).shape);
    Value p = identity_like(c.b, {c.out(0).dtype, {product(batch), m, m}});
    return {c.b.reshape(p, c.out(0).shape), c.b.constant(0, c.out(1)), c.b.constant(0, c.out(2))};
  }
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), c.out(1).dtype), batch_of(c.out(1).shape));
  Lu f = lu_factor(c.b, a);
  std::vector<Value> plu = unpack(c.b, f.lu, f.pivots);
  for (size_t i = 0; i < 3; ++i) plu[i] = c.b.reshape(plu[i], c.out(i).shape);
  return plu;
}

// lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True) -> (P, L, U);
// what is not unpacked is empty.
std::vector<Value> lu_unpack(LoweringContext& c) {
  const Value& data = c.tensor(0);
  const Shape batch = batch_of(data.shape());
  if (data.type.numel() == 0) {  // no factors: P is the identity (of m rows), L and U are zeros
    const TensorType& p = c.out(0);
    Value eye =
        p.numel() == 0
            ? c.b.constant(0, p)
            : c.b.reshape(
                  identity_like(c.b, {p.dtype, {product(batch_of(p.shape)), p.shape[p.rank() - 2], p.shape.back()}}),
                  p.shape);
    return {eye, c.b.constant(0, c.out(1)), c.b.constant(0, c.out(2))};
  }
  Value lu = flat_batch(c.b, data, batch);
  std::vector<Value> plu = unpack(c.b, lu, flat_pivots(c.b, c.tensor(1), batch));
  for (size_t i = 0; i < 3; ++i)
    plu[i] = c.out(i).numel() == 0 ? c.b.constant(0, c.out(i))
                                   : c.b.reshape(c.b.cast(plu[i], c.out(i).dtype), c.out(i).shape);
  return plu;
}

// ---- QR (Householder reflectors, LAPACK's geqrf / orgqr / ormqr)

// Reflector j of a geqrf-packed a [B, m, n]: 1 at row j, a's column j below
// it, 0 above ([B, m]).
Value reflector(Builder& r, const Value& a, const Value& j) {
  const int64_t batch = a.shape()[0], m = a.shape()[1];
  Value col = column(r, a, j);
  Value rows = r.iota({DType::Int32, {batch, m}}, 1), jb = r.broadcast_in_dim(j, {batch, m}, {});
  return r.select(r.compare(Compare::EQ, rows, jb), r.constant(1, col.type),
                  r.select(r.compare(Compare::GT, rows, jb), col, r.constant(0, col.type)));
}

// x - tau v (v^H x) for x [B, m, p], v [B, m], tau [B]: H x, H = I - tau v v^H.
Value reflect(Builder& r, const Value& x, const Value& v, const Value& tau) {
  const Shape& s = x.shape();
  Value w = r.dot_general(conj(r, v), x, {0}, {0}, {1}, {1});  // [B, p]
  Value tv = r.binary(Binary::Multiply, v, r.broadcast_in_dim(tau, v.shape(), {0}));
  return r.binary(Binary::Subtract, x,
                  r.binary(Binary::Multiply, r.broadcast_in_dim(tv, s, {0, 1}), r.broadcast_in_dim(w, s, {0, 2})));
}

// geqrf of x [B, m, n]: R on and above the diagonal, reflector j's tail below
// it, tau [B, min(m, n)]. Reflector j as LAPACK's ?larfg makes it: beta =
// -sign(re alpha) |(alpha, x)| (real), tau = (beta - alpha) / beta, tail x /
// (alpha - beta); none (tau 0) when the tail is already 0 and alpha real.
// The trailing columns get H^H (conj(tau)), so that A = H_0 ... H_{k-1} R.
std::pair<Value, Value> geqrf_of(Builder& b, const Value& x) {
  const int64_t batch = x.shape()[0], m = x.shape()[1], n = x.shape()[2], k = std::min(m, n);
  const DType t = x.dtype(), part = stablehlo::real_part_type(t);
  auto state = b.while_loop(
      {i32(b, 0), x, b.constant(0, {t, {batch, k}})},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.compare(Compare::LT, s[0], i32(r, k))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        const Value &j = s[0], &a = s[1], zero = i32(r, 0);
        const TensorType vt{t, {batch, m}}, bt{t, {batch}}, pt{part, {batch}};
        Value col = column(r, a, j);
        Value rows = r.iota({DType::Int32, {batch, m}}, 1), jb = r.broadcast_in_dim(j, {batch, m}, {});
        Value below = r.compare(Compare::GT, rows, jb);
        Value alpha = r.reshape(r.dynamic_slice(a, {zero, j, j}, {batch, 1, 1}), {batch});
        Value tail = r.reduce(r.select(below, abs2(r, col), r.constant(0, {part, {batch, m}})), r.scalar(0, part), {1},
                              Binary::Add);
        Value norm = r.unary(Unary::Sqrt, r.binary(Binary::Add, abs2(r, alpha), tail));
        Value beta_re =
            r.select(r.compare(Compare::GE, r.real(alpha), r.constant(0, pt)), r.unary(Unary::Negate, norm), norm);
        Value beta = r.cast(beta_re, t);
        Value none = r.binary(Binary::And, r.compare(Compare::EQ, tail, r.constant(0, pt)),
                              r.compare(Compare::EQ, r.imag(alpha), r.constant(0, pt)));
        Value tau =
            r.select(none, r.constant(0, bt), r.binary(Binary::Divide, r.binary(Binary::Subtract, beta, alpha), beta));
        Value scale = r.select(none, r.constant(0, bt),
                               r.binary(Binary::Divide, r.constant(1, bt), r.binary(Binary::Subtract, alpha, beta)));
        Value v = r.select(r.compare(Compare::EQ, rows, jb), r.constant(1, vt),
                           r.select(below, r.binary(Binary::Multiply, col, r.broadcast_in_dim(scale, {batch, m}, {0})),
                                    r.constant(0, vt)));
        // The trailing columns get H; column j keeps beta on the diagonal and the tail below.
        const TensorType it{DType::Int32, {batch, m, n}};
        Value cols = r.iota(it, 2), jf = r.broadcast_in_dim(j, {batch, m, n}, {});
        Value new_col = r.select(r.broadcast_in_dim(none, {batch, m}, {0}), col,
                                 r.select(r.compare(Compare::EQ, rows, jb), r.broadcast_in_dim(beta, {batch, m}, {0}),
                                          r.select(below, v, col)));
        Value next =
            r.select(r.compare(Compare::GT, cols, jf), reflect(r, a, v, conj(r, tau)),
                     r.select(r.compare(Compare::EQ, cols, jf), r.broadcast_in_dim(new_col, {batch, m, n}, {0, 1}), a));
        Value at = r.compare(Compare::EQ, r.iota({DType::Int32, {batch, k}}, 1), r.broadcast_in_dim(j, {batch, k}, {}));
        Value taus = r.select(at, r.broadcast_in_dim(tau, {batch, k}, {0}), s[2]);
        return {r.binary(Binary::Add, j, i32(r, 1)), next, taus};
      });
  return {state[1], state[2]};
}

// Applies the reflectors of geqrf-packed a [B, m, *] with tau [B, k] to
// c [B, m, p] from the left: Q c, or Q^H c with `transpose` (Q = H_0 ... H_{k-1}).
Value apply_q(Builder& b, const Value& a, const Value& tau, const Value& c, bool transpose) {
  const int64_t k = tau.shape()[1], batch = tau.shape()[0];
  if (k == 0) return c;  // no reflectors: Q = I
  auto state = b.while_loop(
      {i32(b, 0), c},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.compare(Compare::LT, s[0], i32(r, k))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        // Q c applies H_{k-1} first; Q^H c applies H_0^H (conj(tau)) first.
        Value j = transpose ? s[0] : r.binary(Binary::Subtract, i32(r, k - 1), s[0]);
        Value tau_j = r.reshape(r.dynamic_slice(tau, {i32(r, 0), j}, {batch, 1}), {batch});
        if (transpose) tau_j = conj(r, tau_j);
        return {r.binary(Binary::Add, s[0], i32(r, 1)), reflect(r, s[1], reflector(r, a, j), tau_j)};
      });
  return state[1];
}

// The first `cols` columns of Q (householder_product / orgqr): Q applied to I.
Value q_columns(Builder& b, const Value& a, const Value& tau, int64_t cols) {
  const int64_t batch = a.shape()[0], m = a.shape()[1];
  return apply_q(b, a, tau, identity_like(b, {a.dtype(), {batch, m, cols}}), false);
}

// geqrf(self) -> (a, tau)
std::vector<Value> geqrf(LoweringContext& c) {
  if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1))};
  auto [a, tau] = geqrf_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), c.out(0).dtype), batch_of(c.out(0).shape)));
  return {c.b.reshape(a, c.out(0).shape), c.b.reshape(tau, c.out(1).shape)};
}

Value flat_tau(Builder& b, const Value& tau, const Shape& batch, DType t) {
  Shape full = batch;
  full.push_back(tau.shape().back());
  return b.reshape(b.broadcast_to(b.cast(tau, t), full), {product(batch), full.back()});
}

// linalg_householder_product(input [m, n], tau [k]) -> Q [m, n]
std::vector<Value> householder_product(LoweringContext& c) {
  const DType t = c.out().dtype;
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  const Shape batch = batch_of(c.out().shape);
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), t), batch);
  Value q = q_columns(c.b, a, flat_tau(c.b, c.tensor(1), batch, t), a.shape()[2]);
  return {c.b.reshape(q, c.out().shape)};
}

// ormqr(self [m, n], tau, other, left=True, transpose=False): Q other, Q^H
// other, other Q or other Q^H.
std::vector<Value> ormqr(LoweringContext& c) {
  const DType t = c.out().dtype;
  const bool left = !c.has(3) || c.args[3].b, transpose = c.has(4) && c.args[4].b;
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  const Shape batch = batch_of(c.out().shape);
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), t), batch), tau = flat_tau(c.b, c.tensor(1), batch, t);
  Value other = flat_batch(c.b, c.b.cast(c.tensor(2), t), batch);
  // other Q = (Q^H other^H)^H
  Value y = left ? apply_q(c.b, a, tau, other, transpose)
                 : adjoint(c.b, apply_q(c.b, a, tau, adjoint(c.b, other), !transpose));
  return {c.b.reshape(y, c.out().shape)};
}

// linalg_qr(A, mode="reduced") -> (Q, R): "complete" gives Q [m, m] and R
// [m, n]; "r" gives R only (Q empty).
std::vector<Value> linalg_qr(LoweringContext& c) {
  const std::string mode = c.has(1) ? c.string(1) : "reduced";
  const DType t = c.out(1).dtype;
  const TensorType &q_t = c.out(0), &r_t = c.out(1);
  const Shape batch = batch_of(r_t.shape);
  const int64_t m = c.tensor(0).shape()[c.tensor(0).rank() - 2];
  const int64_t k = r_t.shape[r_t.rank() - 2];  // rows of R
  if (c.tensor(0).type.numel() == 0) {
    Value q = q_t.numel() == 0 ? c.b.constant(0, q_t)
                               : c.b.reshape(identity_like(c.b, {t, {product(batch), m, q_t.shape.back()}}), q_t.shape);
    return {q, c.b.constant(0, r_t)};
  }
  auto [a, tau] = geqrf_of(c.b, flat_batch(c.b, c.b.cast(c.tensor(0), t), batch));
  const int64_t n = a.shape()[2];
  Value r = triangle(c.b, c.b.slice(a, {0, 0, 0}, {product(batch), k, n}, {1, 1, 1}), true);
  if (mode == "r") return {c.b.constant(0, q_t), c.b.reshape(r, r_t.shape)};
  Value q = q_columns(c.b, a, tau, q_t.shape.back());
  return {c.b.reshape(q, q_t.shape), c.b.reshape(r, r_t.shape)};
}

// ---- Symmetric eigendecomposition and SVD (cyclic Jacobi)

double epsilon(DType t) { return t == DType::Float64 ? 2.220446049250313e-16 : 1.1920928955078125e-07; }

// x with columns p and q replaced by new_p and new_q ([B, r]).
Value set_columns(Builder& r, const Value& x, const Value& p, const Value& q, const Value& new_p, const Value& new_q) {
  const Shape& s = x.shape();
  Value cols = r.iota({DType::Int32, s}, 2);
  Value at_p = r.compare(Compare::EQ, cols, r.broadcast_in_dim(p, s, {}));
  Value at_q = r.compare(Compare::EQ, cols, r.broadcast_in_dim(q, s, {}));
  return r.select(at_p, r.broadcast_in_dim(new_p, s, {0, 1}), r.select(at_q, r.broadcast_in_dim(new_q, s, {0, 1}), x));
}

// Columns p, q of x rotated: (c x_p - s x_q, s x_p + c x_q), c and s real
// per batch. A complex x first turns column q by conj(phase) (a unit complex
// number per batch), so that the pair's product becomes real.
Value rotate_columns(Builder& r, const Value& x, const Value& p, const Value& q, const Value& c, const Value& s,
                     const Value* phase = nullptr) {
  Value xp = column(r, x, p), xq = column(r, x, q);
  if (phase) xq = r.binary(Binary::Multiply, xq, r.broadcast_in_dim(conj(r, *phase), xq.shape(), {0}));
  Value cb = r.broadcast_in_dim(r.cast(c, x.dtype()), xp.shape(), {0}),
        sb = r.broadcast_in_dim(r.cast(s, x.dtype()), xp.shape(), {0});
  auto mul = [&](const Value& a, const Value& b) { return r.binary(Binary::Multiply, a, b); };
  return set_columns(r, x, p, q, r.binary(Binary::Subtract, mul(cb, xp), mul(sb, xq)),
                     r.binary(Binary::Add, mul(sb, xp), mul(cb, xq)));
}

// The rotation (c, s) that makes the symmetric 2x2 [[app, apq], [apq, aqq]]
// diagonal (Golub & Van Loan, sym.schur2); the identity where apq is 0.
std::pair<Value, Value> jacobi_rotation(Builder& r, const Value& app, const Value& aqq, const Value& apq) {
  const TensorType& t = apq.type;
  auto k = [&](double v) { return r.constant(v, t); };
  Value theta = r.binary(Binary::Divide, r.binary(Binary::Subtract, aqq, app), r.binary(Binary::Multiply, k(2), apq));
  Value root = r.unary(Unary::Sqrt, r.binary(Binary::Add, r.binary(Binary::Multiply, theta, theta), k(1)));
  Value sign = r.select(r.compare(Compare::LT, theta, k(0)), k(-1), k(1));
  Value tan = r.binary(Binary::Divide, sign, r.binary(Binary::Add, r.unary(Unary::Abs, theta), root));
  tan = r.select(r.compare(Compare::NE, tan, tan), k(0), tan);  // theta infinite: no rotation
  Value none = r.compare(Compare::EQ, apq, k(0));
  Value c = r.unary(Unary::Rsqrt, r.binary(Binary::Add, r.binary(Binary::Multiply, tan, tan), k(1)));
  Value s = r.binary(Binary::Multiply, tan, c);
  return {r.select(none, k(1), c), r.select(none, k(0), s)};
}

// gamma / |gamma| (1 where gamma is 0) and |gamma|, for a complex gamma.
std::pair<Value, Value> phase_of(Builder& r, const Value& gamma) {
  Value g = r.unary(Unary::Abs, gamma);
  Value zero = r.compare(Compare::EQ, g, r.constant(0, g.type));
  Value phase = r.binary(Binary::Divide, gamma, r.cast(r.select(zero, r.constant(1, g.type), g), gamma.dtype()));
  return {r.select(zero, r.constant(1, gamma.type), phase), g};
}

// Cyclic Jacobi sweeps over the pairs (p, q), p < q < n: `step` rotates the
// state for one pair and returns how far from converged that pair was
// (per batch); sweeps stop when a whole sweep stayed under `tolerance`, or
// after 40.
using JacobiStep = std::function<std::pair<std::vector<Value>, Value>(Builder&, const std::vector<Value>&,
                                                                      const Value& p, const Value& q)>;
std::vector<Value> jacobi_sweeps(Builder& b, const std::vector<Value>& init, int64_t n, double tolerance, DType t,
                                 const JacobiStep& step) {
  if (n < 2) return init;
  // State: p, q, sweep, worst (this sweep), done, then the caller's values.
  std::vector<Value> state{i32(b, 0), i32(b, 1), i32(b, 0), b.scalar(0, t), b.scalar(0, DType::Bool)};
  state.insert(state.end(), init.begin(), init.end());
  auto out = b.while_loop(
      state,
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.binary(Binary::And, r.unary(Unary::Not, s[4]), r.compare(Compare::LT, s[2], i32(r, 40)))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        const Value &p = s[0], &q = s[1];
        auto [values, off] = step(r, std::vector<Value>(s.begin() + 5, s.end()), p, q);
        Value worst = r.binary(Binary::Maximum, s[3], r.reduce(off, r.scalar(0, t), {0}, Binary::Maximum));
        // Next pair; the sweep ends after (n-2, n-1).
        Value q1 = r.binary(Binary::Add, q, i32(r, 1));
        Value row_done = r.compare(Compare::EQ, q1, i32(r, n));
        Value p1 = r.select(row_done, r.binary(Binary::Add, p, i32(r, 1)), p);
        q1 = r.select(row_done, r.binary(Binary::Add, p1, i32(r, 1)), q1);
        Value sweep_done = r.compare(Compare::EQ, p1, i32(r, n - 1));
        std::vector<Value> next{
            r.select(sweep_done, i32(r, 0), p1), r.select(sweep_done, i32(r, 1), q1),
            r.select(sweep_done, r.binary(Binary::Add, s[2], i32(r, 1)), s[2]),
            r.select(sweep_done, r.scalar(0, t), worst),
            r.binary(Binary::And, sweep_done, r.compare(Compare::LE, worst, r.scalar(tolerance, t)))};
        next.insert(next.end(), values.begin(), values.end());
        return next;
      });
  return std::vector<Value>(out.begin() + 5, out.end());
}

// Sorts the values [B, k] (ascending or descending, stably) and returns them
// with the permutation [B, k] that sorted them.
std::pair<Value, Value> sort_with_permutation(Builder& b, const Value& values, bool descending) {
  Value index = b.iota({DType::Int32, values.shape()}, 1);
  auto sorted = b.sort({values, index}, 1, true, [&](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    return {before(r, a[0], a[1], descending)};
  });
  return {sorted[0], sorted[1]};
}

Value permute_columns(Builder& b, const Value& x, const Value& perm) {
  return transpose_last(b, permute_rows(b, transpose_last(b, x), perm));
}

// Eigenvalues (ascending, real) and eigenvectors of the symmetric (Hermitian)
// a [B, n, n]. A complex pair first turns its off-diagonal entry real (D^H A D,
// D = diag(1, conj(phase)) on p, q), then rotates as a real one.
std::pair<Value, Value> eigh_of(Builder& b, const Value& a) {
  const int64_t batch = a.shape()[0], n = a.shape()[1];
  const DType part = stablehlo::real_part_type(a.dtype());
  const bool complex = stablehlo::is_complex(a.dtype());
  Value norm = b.unary(Unary::Sqrt, b.reduce(abs2(b, a), b.scalar(0, part), {1, 2}, Binary::Add));
  auto out = jacobi_sweeps(
      b, {a, identity_like(b, a.type), norm}, n, epsilon(part), part,
      [&](Builder& r, const std::vector<Value>& s, const Value& p, const Value& q) {
        const Value &x = s[0], zero = i32(r, 0);
        auto entry = [&](const Value& i, const Value& j) {
          return r.reshape(r.dynamic_slice(x, {zero, i, j}, {batch, 1, 1}), {batch});
        };
        Value app = r.real(entry(p, p)), aqq = r.real(entry(q, q)), apq = entry(p, q);
        auto [phase, g] = complex ? phase_of(r, apq) : std::make_pair(apq, apq);
        const Value* turn = complex ? &phase : nullptr;
        Value conj_phase = complex ? conj(r, phase) : phase;
        auto [c, sn] = jacobi_rotation(r, app, aqq, g);
        // J^T A J: the columns, then the rows (the columns of the transpose).
        Value y = rotate_columns(r, x, p, q, c, sn, turn);
        y = transpose_last(r, rotate_columns(r, transpose_last(r, y), p, q, c, sn, complex ? &conj_phase : nullptr));
        Value v = rotate_columns(r, s[1], p, q, c, sn, turn);
        Value scale = r.select(r.compare(Compare::GT, s[2], r.constant(0, s[2].type)), s[2], r.constant(1, s[2].type));
        Value off = r.binary(Binary::Divide, r.unary(Unary::Abs, g), scale);
        return std::make_pair(std::vector<Value>{y, v, s[2]}, off);
      });
  auto [values, perm] = sort_with_permutation(b, b.real(diagonal(b, out[0])), false);
  return {values, permute_columns(b, out[1], perm)};
}

// _linalg_eigh(A, UPLO="L", compute_v=True) -> (eigenvalues, eigenvectors):
// the matrix is read from the named triangle.
std::vector<Value> linalg_eigh(LoweringContext& c) {
  const DType t = c.out(1).dtype;
  const bool upper = c.has(1) && c.string(1) == "U";
  const bool vectors = !c.has(2) || c.args[2].b;
  if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), c.b.constant(0, c.out(1))};
  const Shape batch = batch_of(c.tensor(0).shape());
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), t), batch);
  Value strict = triangle(c.b, a, upper, upper ? 1 : -1);
  Value sym = c.b.binary(Binary::Add, triangle(c.b, a, upper), adjoint(c.b, strict));
  if (stablehlo::is_complex(t))  // the diagonal's imaginary parts are ignored, as LAPACK does
    sym = c.b.select(diagonal_mask(c.b, sym.type), c.b.cast(c.b.real(sym), t), sym);
  auto [values, vecs] = eigh_of(c.b, sym);
  return {c.b.reshape(values, c.out(0).shape), vectors ? c.b.reshape(vecs, c.out(1).shape) : c.b.constant(0, c.out(1))};
}

// The SVD of a tall x [B, m, n] (m >= n) by one-sided Jacobi: columns of x
// rotated until orthogonal, the rotations gathered in V. Returns U [B, m,
// cols] (cols = n, or m completed to an orthonormal basis), S [B, n]
// descending, V [B, n, n].
std::vector<Value> tall_svd(Builder& b, const Value& x, int64_t cols) {
  const int64_t batch = x.shape()[0], m = x.shape()[1], n = x.shape()[2];
  const DType t = x.dtype(), part = stablehlo::real_part_type(t);
  const bool complex = stablehlo::is_complex(t);
  const double tolerance = std::sqrt(static_cast<double>(m)) * epsilon(part);
  auto out = jacobi_sweeps(
      b, {x, identity_like(b, {t, {batch, n, n}})}, n, tolerance, part,
      [&](Builder& r, const std::vector<Value>& s, const Value& p, const Value& q) {
        Value xp = column(r, s[0], p), xq = column(r, s[0], q);
        auto sum = [&](const Value& v) { return r.reduce(v, r.scalar(0, v.dtype()), {1}, Binary::Add); };
        // x_p^H x_q: a complex one turns column q by its phase first.
        Value alpha = sum(abs2(r, xp)), beta = sum(abs2(r, xq)),
              gamma = sum(r.binary(Binary::Multiply, conj(r, xp), xq));
        auto [phase, g] = complex ? phase_of(r, gamma) : std::make_pair(gamma, gamma);
        const Value* turn = complex ? &phase : nullptr;
        auto [c, sn] = jacobi_rotation(r, alpha, beta, g);
        Value scale = r.unary(Unary::Sqrt, r.binary(Binary::Multiply, alpha, beta));
        Value off = r.select(r.compare(Compare::GT, scale, r.constant(0, scale.type)),
                             r.binary(Binary::Divide, r.unary(Unary::Abs, g), scale), r.constant(0, scale.type));
        return std::make_pair(
            std::vector<Value>{rotate_columns(r, s[0], p, q, c, sn, turn), rotate_columns(r, s[1], p, q, c, sn, turn)},
            off);
      });
  Value norms = b.unary(Unary::Sqrt, b.reduce(abs2(b, out[0]), b.scalar(0, part), {1}, Binary::Add));
  auto [sigma, perm] = sort_with_permutation(b, norms, true);
  Value xs = permute_columns(b, out[0], perm), v = permute_columns(b, out[1], perm);
  const TensorType ut{t, {batch, m, n}};
  Value sigma_b = b.broadcast_in_dim(sigma, ut.shape, {0, 2});
  Value positive = b.compare(Compare::GT, sigma_b, b.constant(0, sigma_b.type));
  Value u = b.select(positive, b.binary(Binary::Divide, xs, b.cast(sigma_b, t)), b.constant(0, ut));
  // Columns of a zero singular value, and those past n, are an orthonormal
  // completion: Householder QR of the known columns.
  auto [packed, tau] = geqrf_of(b, u);
  const TensorType full{t, {batch, m, cols}};
  Value q = q_columns(b, packed, tau, cols);
  Value u_wide = cols == n ? u : b.concatenate({u, b.constant(0, {t, {batch, m, cols - n}})}, 2);
  Value pos_wide =
      cols == n ? positive : b.concatenate({positive, b.constant(0, {DType::Bool, {batch, m, cols - n}})}, 2);
  return {b.select(pos_wide, u_wide, q), sigma, v};
}

// _linalg_svd(A, full_matrices=False, compute_uv=True, driver=None) -> (U, S, Vh)
std::vector<Value> linalg_svd(LoweringContext& c) {
  const DType t = c.out(0).dtype;
  const bool full = c.has(1) && c.args[1].b, uv = !c.has(2) || c.args[2].b;
  const Value& a0 = c.tensor(0);
  const int64_t m = a0.shape()[a0.rank() - 2], n = a0.shape()[a0.rank() - 1];
  const Shape batch = batch_of(a0.shape());
  if (a0.type.numel() == 0) {  // no singular values: U and V are identities (full) or empty
    auto eye = [&](const TensorType& o) {
      if (!uv || o.numel() == 0) return c.b.constant(0, o);
      return c.b.reshape(identity_like(c.b, {o.dtype, {product(batch), o.shape[o.rank() - 2], o.shape.back()}}),
                         o.shape);
    };
    return {eye(c.out(0)), c.b.constant(0, c.out(1)), eye(c.out(2))};
  }
  Value a = flat_batch(c.b, c.b.cast(a0, t), batch);
  const bool wide = m < n;
  // A wide A is the adjoint of a tall one: A^H = U' S V'^H, so U = V', V = U'.
  auto usv = tall_svd(c.b, wide ? adjoint(c.b, a) : a, full ? std::max(m, n) : std::min(m, n));
  Value u = wide ? usv[2] : usv[0], v = wide ? usv[0] : usv[2];
  return {uv ? c.b.reshape(u, c.out(0).shape) : c.b.constant(0, c.out(0)), c.b.reshape(usv[1], c.out(1).shape),
          uv ? c.b.reshape(adjoint(c.b, v), c.out(2).shape) : c.b.constant(0, c.out(2))};
}

// linalg_lstsq(self=A [*, m, n], b, rcond?, *, driver?) -> (solution,
// residuals, rank, singular_values): the minimum-norm least-squares solution
// through the SVD, singular values under rcond * the largest dropped (what
// gelsy / gelsd give, and gels for a full-rank A). rank counts the others;
// residuals are |A x - b|^2 per column where the meta kernel asks for them.
std::vector<Value> linalg_lstsq(LoweringContext& c) {
  const DType t = c.out(0).dtype, part = stablehlo::real_part_type(t);
  const Value& a0 = c.tensor(0);
  const int64_t m = a0.shape()[a0.rank() - 2], n = a0.shape()[a0.rank() - 1];
  const bool vector = c.tensor(1).rank() == a0.rank() - 1;
  if (c.out(0).numel() == 0 || m == 0 || n == 0) throw Declined("linalg_lstsq: empty input");
  Shape solution = c.out(0).shape;
  if (vector) solution.push_back(1);
  const Shape batch(solution.begin(), solution.end() - 2);
  const int64_t k = solution.back(), bt = product(batch);
  Value rhs = c.b.cast(c.tensor(1), t);
  if (vector) {
    Shape s = rhs.shape();
    s.push_back(1);
    rhs = c.b.reshape(rhs, s);
  }
  Value a = flat_batch(c.b, c.b.cast(a0, t), batch), b = flat_batch(c.b, rhs, batch);
  const bool wide = m < n;
  auto usv = tall_svd(c.b, wide ? adjoint(c.b, a) : a, std::min(m, n));
  Value u = wide ? usv[2] : usv[0], s = usv[1], v = wide ? usv[0] : usv[2];  // [B, m, r], [B, r], [B, n, r]
  const int64_t r = std::min(m, n);
  const double rcond = c.has(2) ? c.number(2) : epsilon(part) * static_cast<double>(std::max(m, n));
  Value largest = c.b.reshape(c.b.slice(s, {0, 0}, {bt, 1}, {1, 1}), {bt});
  Value kept = c.b.compare(
      Compare::GT, s,
      c.b.broadcast_in_dim(c.b.binary(Binary::Multiply, largest, c.b.constant(rcond, largest.type)), {bt, r}, {0}));
  Value inverse = c.b.select(kept, c.b.binary(Binary::Divide, c.b.constant(1, s.type), s), c.b.constant(0, s.type));
  Value ut_b = c.b.dot_general(conj(c.b, u), b, {0}, {0}, {1}, {1});  // U^H b [B, r, k]
  ut_b = c.b.binary(Binary::Multiply, ut_b, c.b.broadcast_in_dim(c.b.cast(inverse, t), {bt, r, k}, {0, 1}));
  Value x = c.b.dot_general(v, ut_b, {0}, {0}, {2}, {1});  // [B, n, k]
  std::vector<Value> out{c.b.reshape(x, c.out(0).shape)};
  if (c.out(1).numel() == 0) {
    out.push_back(c.b.constant(0, c.out(1)));
  } else {
    Value fit = c.b.binary(Binary::Subtract, c.b.dot_general(a, x, {0}, {0}, {2}, {1}), b);
    Value squares = c.b.reduce(abs2(c.b, fit), c.b.scalar(0, part), {1}, Binary::Add);
    out.push_back(c.b.reshape(squares, c.out(1).shape));
  }
  out.push_back(c.out(2).numel() == 0 ? c.b.constant(0, c.out(2))
                                      : c.b.reshape(c.b.reduce(c.b.convert(kept, DType::Int64),
                                                               c.b.scalar(0, DType::Int64), {1}, Binary::Add),
                                                    c.out(2).shape));
  out.push_back(c.out(3).numel() == 0 ? c.b.constant(0, c.out(3)) : c.b.reshape(s, c.out(3).shape));
  return out;
}

// linalg_matrix_exp(A) by scaling and squaring: A / 2^s, with s the least
// that brings its 1-norm under theta, through the degree-18 Taylor polynomial
// (Horner), then squared s times. theta is where that polynomial's truncation
// error falls under the dtype's unit roundoff (Bader, Blanes and Casas, 2019).
// Single precision computes in double: the 18 products and the squarings
// would otherwise lose more digits than CPU's shorter evaluation does.
std::vector<Value> linalg_matrix_exp(LoweringContext& c) {
  const TensorType& out = c.out();
  if (out.numel() == 0) return {c.b.constant(0, out)};
  const DType t = stablehlo::is_complex(out.dtype) ? DType::Complex128 : DType::Float64;
  const DType part = stablehlo::real_part_type(t);
  const Shape batch = batch_of(out.shape);
  const int64_t bt = product(batch);
  Value a = flat_batch(c.b, c.b.cast(c.tensor(0), t), batch);  // [B, n, n]
  Value norm = c.b.reduce(c.b.reduce(c.b.unary(Unary::Abs, a), c.b.scalar(0, part), {1}, Binary::Add),
                          c.b.scalar(0, part), {1}, Binary::Maximum);  // [B]
  const double theta = part == DType::Float64 ? 1.090863719290036 : 3.010066362817634;
  const TensorType bt_t{part, {bt}};
  Value log2 =
      c.b.binary(Binary::Divide, c.b.unary(Unary::Log, c.b.binary(Binary::Divide, norm, c.b.constant(theta, bt_t))),
                 c.b.constant(std::log(2.0), bt_t));
  Value sf = c.b.binary(Binary::Maximum, c.b.unary(Unary::Ceil, log2), c.b.constant(0, bt_t));
  sf = c.b.select(c.b.compare(Compare::NE, sf, sf), c.b.constant(0, bt_t),
                  c.b.binary(Binary::Minimum, sf, c.b.constant(2000, bt_t)));  // NaN and inf norms: no squaring
  Value scale = c.b.binary(Binary::Power, c.b.constant(0.5, bt_t), sf);
  a = c.b.binary(Binary::Multiply, a, c.b.broadcast_in_dim(c.b.cast(scale, t), a.shape(), {0}));
  const Value eye = identity_like(c.b, a.type);
  auto matmul = [](Builder& b, const Value& x, const Value& y) { return b.dot_general(x, y, {0}, {0}, {2}, {1}); };
  Value p = eye;
  for (int k = 18; k >= 1; --k)
    p = c.b.binary(Binary::Add, eye, c.b.binary(Binary::Divide, matmul(c.b, a, p), c.b.constant(k, a.type)));
  // Square each matrix its own number of times.
  Value s = c.b.convert(sf, DType::Int32);
  Value most = c.b.reduce(s, i32(c.b, 0), {0}, Binary::Maximum);
  auto state = c.b.while_loop(
      {i32(c.b, 0), p, s, most},
      [&](Builder& r, const std::vector<Value>& v) -> std::vector<Value> {
        return {r.compare(Compare::LT, v[0], v[3])};
      },
      [&](Builder& r, const std::vector<Value>& v) -> std::vector<Value> {
        Value more = r.compare(Compare::LT, r.broadcast_in_dim(v[0], {bt}, {}), v[2]);
        Value squared = r.select(r.broadcast_in_dim(more, v[1].shape(), {0}), matmul(r, v[1], v[1]), v[1]);
        return {r.binary(Binary::Add, v[0], i32(r, 1)), squared, v[2], v[3]};
      });
  return {c.b.cast(c.b.reshape(state[1], out.shape), out.dtype)};
}

}  // namespace

LOWERING("aten::linalg_cholesky_ex", linalg_cholesky_ex);
LOWERING("aten::cholesky", cholesky);
LOWERING("aten::_cholesky_solve_helper", cholesky_solve_helper);
LOWERING("aten::cholesky_inverse", cholesky_inverse);
LOWERING("aten::linalg_solve_triangular", linalg_solve_triangular);
LOWERING("aten::triangular_solve", triangular_solve);
LOWERING("aten::linalg_lu_factor_ex", linalg_lu_factor_ex);
LOWERING("aten::linalg_lu_solve", linalg_lu_solve);
LOWERING("aten::_linalg_solve_ex", linalg_solve_ex);
LOWERING("aten::linalg_inv_ex", linalg_inv_ex);
LOWERING("aten::_linalg_det", linalg_det);
LOWERING("aten::_linalg_slogdet", linalg_slogdet);
LOWERING("aten::linalg_lu", linalg_lu);
LOWERING("aten::lu_unpack", lu_unpack);
LOWERING("aten::geqrf", geqrf);
LOWERING("aten::linalg_householder_product", householder_product);
LOWERING("aten::ormqr", ormqr);
LOWERING("aten::linalg_qr", linalg_qr);
LOWERING("aten::_linalg_eigh", linalg_eigh);
LOWERING("aten::_linalg_svd", linalg_svd);
LOWERING("aten::linalg_matrix_exp", linalg_matrix_exp);
LOWERING("aten::linalg_lstsq", linalg_lstsq);

}  // namespace torch_tpu::lowering
