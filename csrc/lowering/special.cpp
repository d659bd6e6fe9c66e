// torch.special functions that neither StableHLO nor CHLO has, each by a
// method of its own (no coefficient tables), computed in the output's opmath
// type and rounded once:
// - the classical orthogonal polynomials (chebyshev_polynomial_t/u/v/w, their
//   shifted forms, hermite h/he, laguerre, legendre) by the recurrences and
//   special points PyTorch's kernels use, so the results round alike;
// - Bessel functions: I0, I1 (i0, i0e, i1, i1e) by power series and asymptotic
//   expansions; K0, K1 (and the scaled forms) by series, the trapezoidal rule
//   on K_v(x) = int_0^inf exp(-x cosh t) cosh(v t) dt (geometric convergence:
//   an analytic integrand that decays doubly exponentially) and asymptotics;
//   J0, J1 by the trapezoidal rule over a period of Bessel's integral, Y0, Y1
//   by series and Gauss-Legendre on theirs, both by Hankel's expansion past 20;
// - erfcx, log_ndtr, ndtri, and the incomplete gamma functions.
#include <cmath>
#include <functional>
#include <utility>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

std::vector<int64_t> all_dims(const Value& x) {
  std::vector<int64_t> dims(x.rank());
  for (int64_t d = 0; d < x.rank(); ++d) dims[d] = d;
  return dims;
}

// The degree n as PyTorch's kernels take it, static_cast<int64_t> of the
// computed value: NaN, infinities and values past int64 come out as x86's
// INT64_MIN, a negative degree (the polynomial is 0 there).
Value degree(Builder& b, const Value& n) {
  if (!stablehlo::is_float(n.dtype())) return b.cast(n, DType::Int64);
  Value in_range = b.compare(Compare::LT, b.unary(Unary::Abs, n), b.constant(9.2e18, n.type));  // false for NaN
  return b.select(in_range, b.convert(n, DType::Int64), b.constant_int(-1, {DType::Int64, n.shape()}));
}

// P_{k+1} from k (in x's type), x, P_{k-1} and P_k.
using Step = std::function<Value(Math& m, const Value& k, const Value& x, const Value& p, const Value& q)>;

// P_n(x) elementwise from P_0 = 1 and P_1 = p1 by `next`, looping to the
// largest degree: each element stops at its own n (PyTorch's kernels also
// stop on NaN; a NaN stays NaN, so going on changes nothing). n < 0 gives 0.
Value recurrence(Builder& b, const Value& x, const Value& n, const Value& p1, const Step& next) {
  const TensorType t = x.type;
  const TensorType k_type{DType::Int64, {}};
  auto state = b.while_loop(
      {b.constant_int(1, k_type), b.constant(1, t), p1, x, n},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value live = r.compare(Compare::LT, r.broadcast_to(s[0], t.shape), s[4]);
        return {r.reduce(live, r.scalar(0, DType::Bool), all_dims(x), Binary::Or)};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Math m{r};
        Value live = r.compare(Compare::LT, r.broadcast_to(s[0], t.shape), s[4]);
        Value k = r.broadcast_to(r.convert(s[0], t.dtype), t.shape);
        Value next_q = next(m, k, s[3], s[1], s[2]);
        return {r.binary(Binary::Add, s[0], r.constant_int(1, k_type)), r.select(live, s[2], s[1]),
                r.select(live, next_q, s[2]), s[3], s[4]};
      });
  Value zero_n = b.constant_int(0, n.type);
  Value r = b.select(b.compare(Compare::EQ, n, zero_n), b.constant(1, t), state[2]);
  return b.select(b.compare(Compare::LT, n, zero_n), b.constant(0, t), r);
}

// x and the degree of an (x, n) polynomial op, x in the result's type.
struct PolynomialArgs {
  Value x, n;
};
PolynomialArgs polynomial_args(LoweringContext& c) {
  return {c.operand_as_output(0), degree(c.b, c.operand_as_output(1))};
}

// (-1)^n, in x's type.
Value parity_sign(Builder& b, const Value& n, const TensorType& t) {
  Value even =
      b.compare(Compare::EQ, b.binary(Binary::Remainder, n, b.constant_int(2, n.type)), b.constant_int(0, n.type));
  return b.select(even, b.constant(1, t), b.constant(-1, t));
}

// Chebyshev polynomials of the four kinds, T U V W, and their shifted forms
// (of 2x - 1). As PyTorch: the values at y = +-1 exactly, the trigonometric
// closed form for |y| < 1 past a degree (6 or 8; 4 for shifted W), else the
// three-term recurrence P_{k+1} = 2y P_k - P_{k-1}.
enum class Kind { T, U, V, W };

LoweringRule chebyshev(Kind kind, bool shifted) {
  return [kind, shifted](LoweringContext& c) -> std::vector<Value> {
    auto [x, n] = polynomial_args(c);
    Builder& b = c.b;
    Math m{b};
    const TensorType t = x.type;
    auto k = [&](double v) { return b.constant(v, t); };
    Value y = shifted ? m.sub(m.add(x, x), k(1)) : x;
    Value two_y = m.add(y, y);
    Value p1 = kind == Kind::T   ? y
               : kind == Kind::U ? two_y
               : kind == Kind::V ? m.sub(two_y, k(1))
                                 : m.add(two_y, k(1));
    Value r = recurrence(b, y, n, p1, [](Math& r, const Value&, const Value& y, const Value& p, const Value& q) {
      return r.sub(r.mul(r.add(y, y), q), p);
    });
    // The closed forms in theta = acos(y).
    Value nf = b.convert(n, t.dtype), sign = parity_sign(b, n, t);
    Value n1 = m.add(nf, k(1)), two_n1 = m.add(m.add(nf, nf), k(1)), n_half = m.add(nf, k(0.5));
    Value theta = b.unary(Unary::Acos, y), half = m.div(theta, k(2));
    auto sin = [&](const Value& v) { return b.unary(Unary::Sin, v); };
    auto cos = [&](const Value& v) { return b.unary(Unary::Cos, v); };
    Value closed, at_plus, at_minus;
    int64_t from = 8;
    switch (kind) {
      case Kind::T:
        closed = cos(m.mul(nf, theta));
        at_plus = k(1), at_minus = sign, from = 6;
        break;
      case Kind::U:
        closed = b.select(b.compare(Compare::NE, sin(theta), k(0)), m.div(sin(m.mul(n1, theta)), sin(theta)),
                          m.div(m.mul(n1, cos(m.mul(n1, theta))), y));
        at_plus = n1, at_minus = m.mul(sign, n1), from = shifted ? 6 : 8;
        break;
      case Kind::V:
        closed = b.select(b.compare(Compare::NE, sin(half), k(1)), m.div(cos(m.mul(n_half, theta)), cos(half)),
                          m.mul(sign, two_n1));
        at_plus = k(1), at_minus = m.mul(sign, two_n1), from = shifted ? 6 : 8;
        break;
      case Kind::W:
        closed = b.select(b.compare(Compare::NE, cos(half), k(1)), m.div(sin(m.mul(n_half, theta)), sin(half)),
                          shifted ? sign : two_n1);
        at_plus = two_n1, at_minus = sign, from = shifted ? 4 : 8;
        break;
    }
    Value use_closed = b.binary(Binary::And, b.compare(Compare::GT, n, b.constant_int(from, n.type)),
                                b.compare(Compare::LT, b.unary(Unary::Abs, y), k(1)));
    r = b.select(use_closed, closed, r);
    r = b.select(b.compare(Compare::EQ, x, k(shifted ? 0 : -1)), at_minus, r);
    r = b.select(b.compare(Compare::EQ, x, k(1)), at_plus, r);
    return {b.select(b.compare(Compare::LT, n, b.constant_int(0, n.type)), k(0), r)};
  };
}

// Hermite polynomials, physicists' H (P_{k+1} = 2x P_k - 2k P_{k-1}) and
// probabilists' He (x P_k - k P_{k-1}); NaN past PyTorch's degree limit
// (128 in float32, 512 in float64).
LoweringRule hermite(bool physicists) {
  return [physicists](LoweringContext& c) -> std::vector<Value> {
    auto [x, n] = polynomial_args(c);
    Builder& b = c.b;
    Math m{b};
    const int64_t limit = x.dtype() == DType::Float32 ? 128 : x.dtype() == DType::Float64 ? 512 : 1024;
    Value past = b.compare(Compare::GT, n, b.constant_int(limit, n.type));
    Value looped = b.select(past, b.constant_int(0, n.type), n);
    Value p1 = physicists ? m.add(x, x) : x;
    Value r = recurrence(
        b, x, looped, p1, [physicists](Math& r, const Value& k, const Value& x, const Value& p, const Value& q) {
          return physicists ? r.sub(r.mul(r.add(x, x), q), r.mul(r.add(k, k), p)) : r.sub(r.mul(x, q), r.mul(k, p));
        });
    return {b.select(past, b.constant(NAN, x.type), r)};
  };
}

// Laguerre L: P_{k+1} = ((2k + 1 - x) P_k - k P_{k-1}) / (k + 1); 1 at x = 0.
std::vector<Value> laguerre(LoweringContext& c) {
  auto [x, n] = polynomial_args(c);
  Math m{c.b};
  Value one = m.k(1, x);
  Value r =
      recurrence(c.b, x, n, m.sub(one, x), [](Math& r, const Value& k, const Value& x, const Value& p, const Value& q) {
        Value one = r.k(1, x);
        return r.div(r.sub(r.mul(r.add(r.add(k, k), r.sub(one, x)), q), r.mul(k, p)), r.add(k, one));
      });
  Value at_zero = c.b.binary(Binary::And, c.b.compare(Compare::EQ, x, m.k(0, x)),
                             c.b.compare(Compare::GE, n, c.b.constant_int(0, n.type)));
  return {c.b.select(at_zero, one, r)};
}

// Legendre P: P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1); +-1 at x = +-1.
std::vector<Value> legendre(LoweringContext& c) {
  auto [x, n] = polynomial_args(c);
  Builder& b = c.b;
  Math m{b};
  Value r = recurrence(b, x, n, x, [](Math& r, const Value& k, const Value& x, const Value& p, const Value& q) {
    Value one = r.k(1, x);
    return r.div(r.sub(r.mul(r.mul(r.add(r.add(k, k), one), x), q), r.mul(k, p)), r.add(k, one));
  });
  Value ends = b.binary(Binary::And, b.compare(Compare::EQ, b.unary(Unary::Abs, x), m.k(1, x)),
                        b.compare(Compare::GE, n, b.constant_int(0, n.type)));
  Value end_value = b.select(b.compare(Compare::GT, x, m.k(0, x)), m.k(1, x), parity_sign(b, n, x.type));
  return {b.select(ends, end_value, r)};
}

// sum_k c_k z^k by Horner's rule, c given lowest power first.
Value horner(Math& m, const std::vector<double>& coefficients, const Value& z) {
  Value r = m.k(coefficients.back(), z);
  for (size_t i = coefficients.size() - 1; i-- > 0;) r = m.add(m.mul(r, z), m.k(coefficients[i], z));
  return r;
}

// The power series of I_v(x) / (x/2)^v = sum_k t^k / (k! (k+v)!), t = x^2/4,
// nested as (1 + t/(1 (1+v)) (1 + t/(2 (2+v)) (...))) / v! so no coefficient
// underflows in float32: every term positive, so it loses nothing; 48 terms
// reach full float64 accuracy up to |x| = kSeriesUpTo.
constexpr double kSeriesUpTo = 20;
Value bessel_i_series(Math& m, const Value& t, int v) {
  Value r = m.k(1, t);
  for (int k = 48; k >= 1; --k) r = m.add(m.k(1, t), m.mul(m.mul(t, m.k(1.0 / (k * (k + v)), t)), r));
  return r;  // 1/v! is 1 for v = 0, 1
}

// The asymptotic series of I_v(x) e^-x sqrt(2 pi x) (+) and of
// K_v(x) e^x sqrt(2x / pi) (-) in 1/x: sum_k (-+1)^k a_k(v) / x^k with
// a_k = prod_{j<=k} (4v^2 - (2j-1)^2) / (k! 8^k). Past |x| = 20 its smallest
// term is below 1e-17 of the sum; 30 terms stop before it.
std::vector<double> bessel_asymptotic(int v, bool for_i) {
  std::vector<double> c(30);
  double a = 1;
  for (size_t k = 0; k < c.size(); ++k) {
    c[k] = for_i && k % 2 ? -a : a;
    const double j = static_cast<double>(k + 1);
    a *= (4.0 * v * v - (2 * j - 1) * (2 * j - 1)) / (j * 8);
  }
  return c;
}

// e^-|x| I_v(x) for v = 0, 1 (even and odd in x), in x's type.
Value scaled_bessel_i(Builder& b, const Value& x, int v) {
  Math m{b};
  Value ax = b.unary(Unary::Abs, x);
  Value half = m.mul(ax, m.k(0.5, ax));
  Value series = bessel_i_series(m, m.mul(half, half), v);
  if (v == 1) series = m.mul(series, half);
  series = m.mul(series, b.unary(Unary::Exp, b.unary(Unary::Negate, ax)));
  // Past the series' range: the asymptotic one (its argument kept away from 0).
  Value big = b.select(b.compare(Compare::GT, ax, m.k(kSeriesUpTo, ax)), ax, m.k(kSeriesUpTo, ax));
  Value asymptotic = m.mul(horner(m, bessel_asymptotic(v, true), m.div(m.k(1, big), big)),
                           b.unary(Unary::Rsqrt, m.mul(big, m.k(2 * M_PI, big))));
  Value r = b.select(b.compare(Compare::GT, ax, m.k(kSeriesUpTo, ax)), asymptotic, series);
  return v == 1 ? b.select(b.compare(Compare::LT, x, m.k(0, x)), b.unary(Unary::Negate, r), r) : r;
}

// i0, i0e, i1, i1e (and special.modified_bessel_i0/i1): `scaled` keeps the
// factor e^-|x|.
LoweringRule bessel_i(int v, bool scaled) {
  return [v, scaled](LoweringContext& c) -> std::vector<Value> {
    Value x = c.b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
    Value r = scaled_bessel_i(c.b, x, v);
    // Unscaled: times e^|x| (0 * inf = NaN at the infinities, as on CPU).
    if (!scaled) r = c.b.binary(Binary::Multiply, r, c.b.unary(Unary::Exp, c.b.unary(Unary::Abs, x)));
    return {c.b.cast(r, c.out().dtype)};
  };
}

// e^x K_v(x) for v = 0, 1 and x > 0. Below 1 the series
// K0 = -(log(x/2) + gamma) I0 + sum_k (x^2/4)^k / k!^2 H_k and
// K1 = 1/x + log(x/2) I1 - (x/4) sum_k (x^2/4)^k / (k! (k+1)!) (psi(k+1) + psi(k+2));
// up to 20 the trapezoidal rule with step 1/8 on e^x times the integral (for
// an integrand analytic in a strip its error falls like exp(-2 pi d / h):
// below 1e-20 here; 46 nodes cover e^-(x (cosh t - 1)) > 1e-18); past 20 the
// asymptotic series.
Value scaled_bessel_k(Builder& b, const Value& x, int v) {
  Math m{b};
  constexpr double euler_gamma = 0.57721566490153286061;
  auto clamp_to = [&](double lo, double hi) { return b.clamp(m.k(lo, x), x, m.k(hi, x)); };
  // Near 0: the series.
  Value small = clamp_to(0, 1), half = m.mul(small, m.k(0.5, x)), t = m.mul(half, half);
  Value log_half = b.unary(Unary::Log, half), i_v = bessel_i_series(m, t, v);
  std::vector<double> c(24);
  double term = 1, harmonic = 0;
  Value series;
  if (v == 0) {
    for (size_t k = 0; k < c.size(); ++k) {
      c[k] = term * term * harmonic;
      harmonic += 1.0 / static_cast<double>(k + 1);
      term /= static_cast<double>(k + 1);
    }
    series = m.sub(horner(m, c, t), m.mul(m.add(log_half, m.k(euler_gamma, x)), i_v));
  } else {
    double psi1 = -euler_gamma, psi2 = 1 - euler_gamma;  // psi(k+1), psi(k+2)
    for (size_t k = 0; k < c.size(); ++k) {
      const double next = term / static_cast<double>(k + 1);  // 1 / (k+1)!
      c[k] = term * next * (psi1 + psi2);
      psi1 += 1.0 / static_cast<double>(k + 1);
      psi2 += 1.0 / static_cast<double>(k + 2);
      term = next;
    }
    series = m.sub(m.add(m.div(m.k(1, x), small), m.mul(m.mul(log_half, half), i_v)),
                   m.mul(m.mul(small, m.k(0.25, x)), horner(m, c, t)));
  }
  series = m.mul(series, b.unary(Unary::Exp, small));
  // The middle: the integral.
  const double h = 0.125;
  Value middle = clamp_to(1, kSeriesUpTo), integral = m.k(0.5 * h, x);
  for (int j = 1; j <= 46; ++j) {
    Value w = b.unary(Unary::Exp, m.mul(middle, m.k(1 - std::cosh(j * h), x)));
    integral = m.add(integral, m.mul(w, m.k(h * (v == 0 ? 1 : std::cosh(j * h)), x)));
  }
  // Far out: the asymptotic series.
  Value big = b.select(b.compare(Compare::GT, x, m.k(kSeriesUpTo, x)), x, m.k(kSeriesUpTo, x));
  Value asymptotic = m.mul(horner(m, bessel_asymptotic(v, false), m.div(m.k(1, big), big)),
                           b.unary(Unary::Sqrt, m.div(m.k(M_PI / 2, big), big)));
  Value r = b.select(b.compare(Compare::LT, x, m.k(1, x)), series,
                     b.select(b.compare(Compare::GT, x, m.k(kSeriesUpTo, x)), asymptotic, integral));
  r = b.select(b.compare(Compare::EQ, x, m.k(0, x)), m.k(INFINITY, x), r);
  return b.select(b.compare(Compare::LT, x, m.k(0, x)), m.k(NAN, x), r);
}

// special.modified_bessel_k0/k1 and the scaled (e^x K) forms.
LoweringRule bessel_k(int v, bool scaled) {
  return [v, scaled](LoweringContext& c) -> std::vector<Value> {
    Value x = c.b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
    Value r = scaled_bessel_k(c.b, x, v);
    if (!scaled) r = c.b.binary(Binary::Multiply, r, c.b.unary(Unary::Exp, c.b.unary(Unary::Negate, x)));
    r = c.b.select(c.b.compare(Compare::EQ, x, c.b.constant(INFINITY, x.type)), c.b.constant(0, x.type), r);
    r = c.b.select(c.b.compare(Compare::NE, x, x), x, r);
    return {c.b.cast(r, c.out().dtype)};
  };
}

// Hankel's expansion of J_v (or Y_v) for x > 20: sqrt(2 / (pi x)) times
// P cos(chi) - Q sin(chi) (Y: P sin(chi) + Q cos(chi)), chi = x - (2v+1) pi/4
// rounded in x's type as PyTorch's kernels do (NaN at infinity, as there).
Value bessel_hankel(Builder& b, const Value& x, int v, bool y) {
  Math m{b};
  Value far = b.select(b.compare(Compare::GT, x, m.k(kSeriesUpTo, x)), x, m.k(kSeriesUpTo, x));
  std::vector<double> a = bessel_asymptotic(v, false), p, q;  // a_k(v); P, Q take even and odd k, signs alternating
  for (size_t k = 0; k < 24; ++k) (k % 2 ? q : p).push_back(k % 4 < 2 ? a[k] : -a[k]);
  Value inv = m.div(m.k(1, far), far), inv2 = m.mul(inv, inv);
  Value phase = m.sub(far, m.k((2 * v + 1) * M_PI / 4, x));
  Value big_p = horner(m, p, inv2), big_q = m.mul(horner(m, q, inv2), inv);
  Value cos = b.unary(Unary::Cos, phase), sin = b.unary(Unary::Sin, phase);
  Value sum = y ? m.add(m.mul(big_p, sin), m.mul(big_q, cos)) : m.sub(m.mul(big_p, cos), m.mul(big_q, sin));
  return m.mul(b.unary(Unary::Sqrt, m.div(m.k(2 / M_PI, x), far)), sum);
}

// J_v(x) for v = 0, 1 and x >= 0 up to 20: the trapezoidal rule with 64
// nodes over a period of Bessel's integral
// J_v(x) = 1/(2 pi) int_0^2pi cos(v theta - x sin theta) d theta, exact up to
// J_{64+v}(x) (below 1e-24 there).
Value bessel_j_integral(Builder& b, const Value& x, int v) {
  Math m{b};
  constexpr int nodes = 64;
  Value near = b.clamp(m.k(0, x), x, m.k(kSeriesUpTo, x)), sum = m.k(v == 0 ? 1 : 0, x);
  for (int j = 1; j < nodes; ++j) {  // J0: mean of cos(x sin), J1: of sin(theta) sin(x sin)
    const double theta = 2 * M_PI * j / nodes, sine = std::sin(theta);
    Value arg = m.mul(near, m.k(sine, x));
    sum = m.add(sum, v == 0 ? b.unary(Unary::Cos, arg) : m.mul(m.k(sine, x), b.unary(Unary::Sin, arg)));
  }
  return m.div(sum, m.k(nodes, x));
}

// J_v(x) for v = 0, 1 (even and odd): the integral, then Hankel.
LoweringRule bessel_j(int v) {
  return [v](LoweringContext& c) -> std::vector<Value> {
    Builder& b = c.b;
    Math m{b};
    Value x = b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
    Value ax = b.unary(Unary::Abs, x);
    Value r = b.select(b.compare(Compare::GT, ax, m.k(kSeriesUpTo, x)), bessel_hankel(b, ax, v, false),
                       bessel_j_integral(b, ax, v));
    if (v == 1) r = b.select(b.compare(Compare::LT, x, m.k(0, x)), b.unary(Unary::Negate, r), r);
    return {b.cast(r, c.out().dtype)};
  };
}

// Gauss-Legendre nodes and weights on [0, 1] (Newton's method on P_n).
std::pair<std::vector<double>, std::vector<double>> gauss_legendre(int n) {
  std::vector<double> nodes(n), weights(n);
  for (int i = 0; i < n; ++i) {
    double z = std::cos(M_PI * (i + 0.75) / (n + 0.5)), derivative = 1;
    for (int iteration = 0; iteration < 100; ++iteration) {
      double p0 = 1, p1 = z;
      for (int k = 2; k <= n; ++k) {
        const double p2 = ((2 * k - 1) * z * p1 - (k - 1) * p0) / k;
        p0 = p1, p1 = p2;
      }
      derivative = n * (z * p1 - p0) / (z * z - 1);
      const double step = p1 / derivative;
      z -= step;
      if (std::abs(step) < 1e-16) break;
    }
    nodes[i] = (1 - z) / 2;
    weights[i] = 1 / ((1 - z * z) * derivative * derivative);  // (2 / ((1 - z^2) P'^2)) / 2
  }
  return {nodes, weights};
}

// Y_v(x) for v = 0, 1: NaN below 0, -inf at 0. Below 1 the series
// Y0 = (2/pi)((log(x/2) + gamma) J0 + sum_k>=1 (-1)^(k+1) H_k t^k / k!^2) and
// Y1 = -2/(pi x) + (2/pi) log(x/2) J1 - (x / 2pi) sum_k (-1)^k (psi(k+1) + psi(k+2)) t^k / (k! (k+1)!),
// t = x^2/4; up to 20 Bessel's integral
// Y_v = (1/pi) int_0^pi sin(x sin th - v th) - (1/pi) int_0^inf (e^(vt) + (-1)^v e^(-vt)) e^(-x sinh t),
// both by 48-node Gauss-Legendre (the second cut where e^(-x sinh t) < 1e-20); then Hankel.
LoweringRule bessel_y(int v) {
  return [v](LoweringContext& c) -> std::vector<Value> {
    Builder& b = c.b;
    Math m{b};
    Value x = b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
    auto k = [&](double value) { return m.k(value, x); };
    constexpr double euler_gamma = 0.57721566490153286061;
    // Near 0.
    Value small = b.clamp(k(0), x, k(1)), half = m.mul(small, k(0.5)), t = m.mul(half, half);
    Value log_half = b.unary(Unary::Log, half);
    std::vector<double> coefficients(24);
    double term = 1, harmonic = 0, psi1 = -euler_gamma, psi2 = 1 - euler_gamma;
    for (size_t j = 0; j < coefficients.size(); ++j) {
      const double sign = j % 2 ? -1 : 1;
      if (v == 0) {
        coefficients[j] = -sign * harmonic * term * term;  // (-1)^(j+1) H_j / j!^2
        harmonic += 1.0 / static_cast<double>(j + 1);
      } else {
        coefficients[j] = sign * (psi1 + psi2) * term * term / static_cast<double>(j + 1);  // / (j! (j+1)!)
        psi1 += 1.0 / static_cast<double>(j + 1);
        psi2 += 1.0 / static_cast<double>(j + 2);
      }
      term /= static_cast<double>(j + 1);
    }
    Value j_v = bessel_j_integral(b, small, v), sum = horner(m, coefficients, t);
    Value series = v == 0 ? m.mul(k(2 / M_PI), m.add(m.mul(m.add(log_half, k(euler_gamma)), j_v), sum))
                          : m.sub(m.add(m.div(k(-2 / M_PI), small), m.mul(k(2 / M_PI), m.mul(log_half, j_v))),
                                  m.mul(m.mul(small, k(0.5 / M_PI)), sum));
    // The middle: the two integrals.
    auto [nodes, weights] = gauss_legendre(48);
    Value mid = b.clamp(k(1), x, k(kSeriesUpTo));
    Value oscillating = k(0), decaying = k(0);
    Value span = b.unary(Unary::Asinh, m.div(k(46), mid));  // e^(-x sinh t) < 1e-20 past it
    for (size_t i = 0; i < nodes.size(); ++i) {
      const double theta = M_PI * nodes[i];
      Value arg = m.sub(m.mul(mid, k(std::sin(theta))), k(v * theta));
      oscillating = m.add(oscillating, m.mul(k(M_PI * weights[i]), b.unary(Unary::Sin, arg)));
      Value at = m.mul(span, k(nodes[i]));
      Value factor = v == 0 ? k(2) : m.mul(k(2), b.unary(Unary::Sinh, at));  // e^(vt) + (-1)^v e^(-vt)
      Value decay = b.unary(Unary::Exp, m.mul(b.unary(Unary::Negate, mid), b.unary(Unary::Sinh, at)));
      decaying = m.add(decaying, m.mul(m.mul(span, k(weights[i])), m.mul(factor, decay)));
    }
    Value integral = m.div(m.sub(oscillating, decaying), k(M_PI));
    Value r = b.select(b.compare(Compare::LT, x, k(1)), series,
                       b.select(b.compare(Compare::GT, x, k(kSeriesUpTo)), bessel_hankel(b, x, v, true), integral));
    r = b.select(b.compare(Compare::EQ, x, k(0)), k(-INFINITY), r);
    r = b.select(b.compare(Compare::LT, x, k(0)), k(NAN), r);
    return {b.cast(r, c.out().dtype)};
  };
}

// spherical_bessel_j0(x) = sin(x) / x, by its Taylor series below |x| = 1/2
// as PyTorch's kernel; 0 at the infinities.
std::vector<Value> spherical_bessel_j0(LoweringContext& c) {
  Builder& b = c.b;
  Math m{b};
  Value x = b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
  std::vector<double> taylor;
  double factorial = 1;
  for (int k = 0; k <= 6; ++k) {
    taylor.push_back((k % 2 ? -1 : 1) / factorial);
    factorial *= (2 * k + 2) * (2 * k + 3);
  }
  Value r = b.select(b.compare(Compare::LT, b.unary(Unary::Abs, x), m.k(0.5, x)), horner(m, taylor, m.mul(x, x)),
                     m.div(b.unary(Unary::Sin, x), x));
  r = b.select(b.compare(Compare::EQ, b.unary(Unary::Abs, x), m.k(INFINITY, x)), m.k(0, x), r);
  return {b.cast(r, c.out().dtype)};
}

// erfcx(x) = exp(x^2) erfc(x) for x >= 0: directly below 2, past it by
// Laplace's continued fraction 1 / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / ...)))
// with 60 terms (below 1e-16 from 2 on); nothing underflows.
Value erfcx_nonnegative(Builder& b, const Value& x) {
  Math m{b};
  Value small = b.clamp(m.k(0, x), x, m.k(2, x));
  Value direct = m.mul(b.unary(Unary::Exp, m.mul(small, small)), b.unary(Unary::Erfc, small));
  Value big = b.select(b.compare(Compare::GT, x, m.k(2, x)), x, m.k(2, x)), f = big;
  for (int k = 60; k >= 1; --k) f = m.add(big, m.div(m.k(k / 2.0, x), f));
  Value fraction = m.div(m.k(1 / std::sqrt(M_PI), x), f);
  return b.select(b.compare(Compare::GT, x, m.k(2, x)), fraction, direct);
}

// erfcx(x) for any x: 2 exp(x^2) - erfcx(-x) below 0 (inf once exp(x^2) is).
Value erfcx_of(Builder& b, const Value& x) {
  Math m{b};
  Value positive = erfcx_nonnegative(b, b.unary(Unary::Abs, x));
  Value negative = m.sub(m.mul(m.k(2, x), b.unary(Unary::Exp, m.mul(x, x))), positive);
  return b.select(b.compare(Compare::LT, x, m.k(0, x)), negative, positive);
}

std::vector<Value> erfcx(LoweringContext& c) {
  Value x = c.b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
  return {c.b.cast(erfcx_of(c.b, x), c.out().dtype)};
}

// log_ndtr(x) = log(Phi(x)), as PyTorch's kernel: log(erfcx(-x/sqrt 2) / 2) - x^2/2
// below -1 (Phi underflows long before its log), else log1p(-erfc(x/sqrt 2) / 2).
std::vector<Value> log_ndtr(LoweringContext& c) {
  Builder& b = c.b;
  Math m{b};
  Value x = b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
  Value t = m.mul(x, m.k(M_SQRT1_2, x));
  Value low = m.sub(b.unary(Unary::Log, m.mul(erfcx_of(b, b.unary(Unary::Negate, t)), m.k(0.5, x))), m.mul(t, t));
  Value high = b.unary(Unary::Log1p, b.unary(Unary::Negate, m.mul(b.unary(Unary::Erfc, t), m.k(0.5, x))));
  return {b.cast(b.select(b.compare(Compare::LT, x, m.k(-1, x)), low, high), c.out().dtype)};
}

// ndtri(p): the x with Phi(x) = p. From q = min(p, 1 - p) (exact), the lower
// tail's x starts at Abramowitz & Stegun 26.2.23 (within 4.5e-4) and takes
// three Newton steps on log Phi(x) - log q, Phi through erfcx so nothing
// underflows however small q is; the sign follows p.
std::vector<Value> ndtri(LoweringContext& c) {
  Builder& b = c.b;
  Math m{b};
  Value p = b.cast(c.operand_as_output(0), opmath_type(c.out().dtype));
  auto k = [&](double v) { return m.k(v, p); };
  Value upper = b.compare(Compare::GT, p, k(0.5));
  Value q = b.select(upper, m.sub(k(1), p), p);
  Value safe_q = b.clamp(k(1e-37), q, k(0.5));  // the guess's log stays finite
  Value t = b.unary(Unary::Sqrt, m.mul(k(-2), b.unary(Unary::Log, safe_q)));
  Value num = m.add(k(2.515517), m.mul(t, m.add(k(0.802853), m.mul(t, k(0.010328)))));
  Value den = m.add(k(1), m.mul(t, m.add(k(1.432788), m.mul(t, m.add(k(0.189269), m.mul(t, k(0.001308)))))));
  Value x = b.unary(Unary::Negate, m.sub(t, m.div(num, den)));
  Value log_q = b.unary(Unary::Log, q);
  for (int step = 0; step < 3; ++step) {
    Value scaled = erfcx_of(b, m.mul(b.unary(Unary::Negate, x), k(M_SQRT1_2)));  // Phi(x) = scaled e^(-x^2/2) / 2
    Value log_cdf = m.sub(b.unary(Unary::Log, m.mul(scaled, k(0.5))), m.mul(k(0.5), m.mul(x, x)));
    Value slope = m.div(k(2 / std::sqrt(2 * M_PI)), scaled);  // d log Phi / dx = pdf / Phi
    x = m.sub(x, m.div(m.sub(log_cdf, log_q), slope));
  }
  Value r = b.select(upper, b.unary(Unary::Negate, x), x);
  r = b.select(b.compare(Compare::EQ, p, k(0.5)), k(0), r);
  r = b.select(b.compare(Compare::EQ, p, k(0)), k(-INFINITY), r);
  r = b.select(b.compare(Compare::EQ, p, k(1)), k(INFINITY), r);
  Value outside = b.binary(Binary::Or, b.compare(Compare::LT, p, k(0)), b.compare(Compare::GT, p, k(1)));
  return {b.cast(b.select(outside, k(NAN), r), c.out().dtype)};
}

// The regularized incomplete gamma functions P(a, x) (igamma) and
// Q(a, x) = 1 - P (igammac). Below x = a + 1 P by its series
// e^-x x^a / Gamma(a) sum_n x^n / (a (a+1) ... (a+n)), from there Q by
// Legendre's continued fraction (modified Lentz), the other by subtraction
// (which then loses nothing: the one subtracted stays below about 1/2). Both
// loops run until every element's next term is below the dtype's epsilon
// (at most 2000 steps). Boundary values as PyTorch's (after SciPy).
LoweringRule incomplete_gamma(bool upper) {
  return [upper](LoweringContext& c) -> std::vector<Value> {
    Builder& b = c.b;
    Math m{b};
    const DType t = opmath_type(c.out().dtype);
    Value a = b.cast(c.operand_as_output(0), t), x = b.cast(c.operand_as_output(1), t);
    auto k = [&](double v) { return m.k(v, x); };
    const double eps = t == DType::Float64 ? 1e-16 : 6e-8, tiny = 1e-30;
    // Kept inside the domain so the loops stay finite; the boundaries are selected after.
    Value inside =
        b.binary(Binary::And, b.binary(Binary::And, b.compare(Compare::GT, a, k(0)), b.compare(Compare::GT, x, k(0))),
                 b.binary(Binary::And, b.unary(Unary::IsFinite, a), b.unary(Unary::IsFinite, x)));
    Value sa = b.select(inside, a, k(1)), sx = b.select(inside, x, k(1));
    Value use_series = b.compare(Compare::LT, sx, m.add(sa, k(1)));
    // x^a e^-x / Gamma(a). From a = 10 through Stirling's series, as
    // sqrt(a / 2pi) exp(a (log1p(u) - u) - (lgamma(a) - Stirling(a))), u = x/a - 1:
    // a log x - lgamma(a) would lose a log(x) ulps (1e-4 relative at a = 250 in float32).
    Value direct =
        b.unary(Unary::Exp, m.sub(m.sub(m.mul(sa, b.unary(Unary::Log, sx)), sx), b.unary(Unary::Lgamma, sa)));
    Value big_a = b.select(b.compare(Compare::GE, sa, k(10)), sa, k(10)), u = m.sub(m.div(sx, big_a), k(1));
    Value inv = m.div(k(1), big_a), inv2 = m.mul(inv, inv);
    Value stirling_rest = m.mul(inv, horner(m, {1.0 / 12, -1.0 / 360, 1.0 / 1260, -1.0 / 1680, 1.0 / 1188}, inv2));
    Value exponent = m.sub(m.mul(big_a, m.sub(b.unary(Unary::Log1p, u), u)), stirling_rest);
    Value stirling = m.mul(b.unary(Unary::Sqrt, m.div(big_a, k(2 * M_PI))), b.unary(Unary::Exp, exponent));
    Value prefactor = b.select(b.compare(Compare::GE, sa, k(10)), stirling, direct);
    const TensorType counter{DType::Int32, {}};
    auto not_done = [&](Builder& r, const Value& done, const Value& step) {
      Value any = r.reduce(r.unary(Unary::Not, done), r.scalar(0, DType::Bool), all_dims(done), Binary::Or);
      return r.binary(Binary::And, any, r.compare(Compare::LT, step, r.constant_int(2000, counter)));
    };
    auto small = [&](Builder& r, const Value& v, double bound) {
      return r.compare(Compare::LT, r.unary(Unary::Abs, v), r.constant(bound, v.type));
    };
    // Series: sum of term_n, term_0 = 1/a, term_n = term_(n-1) x / (a + n). State: step, a + n, term, sum, done.
    Value first = m.div(k(1), sa);
    auto series = b.while_loop(
        {b.constant_int(0, counter), sa, first, first, b.unary(Unary::Not, use_series)},
        [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> { return {not_done(r, s[4], s[0])}; },
        [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
          Math q{r};
          Value ap = q.add(s[1], q.k(1, s[1]));
          Value term = q.mul(s[2], q.div(sx, ap)), sum = q.add(s[3], term);
          Value done = r.binary(
              Binary::Or, s[4],
              r.compare(Compare::LT, r.unary(Unary::Abs, term), q.mul(r.unary(Unary::Abs, sum), q.k(eps, sum))));
          return {r.binary(Binary::Add, s[0], r.constant_int(1, counter)), r.select(s[4], s[1], ap),
                  r.select(s[4], s[2], term), r.select(s[4], s[3], sum), done};
        });
    Value p_series = m.mul(prefactor, series[3]);
    // Continued fraction (modified Lentz). State: step, b_i, c, d, h, done.
    Value b0 = m.sub(m.add(sx, k(1)), sa), d0 = m.div(k(1), b0);
    auto fraction = b.while_loop(
        {b.constant_int(1, counter), b0, k(1 / tiny), d0, d0, use_series},
        [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> { return {not_done(r, s[5], s[0])}; },
        [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
          Math q{r};
          Value i = r.broadcast_to(r.convert(s[0], t), sx.shape());
          Value an = q.mul(r.unary(Unary::Negate, i), q.sub(i, sa));
          Value bi = q.add(s[1], q.k(2, s[1]));
          Value d = q.add(q.mul(an, s[3]), bi);
          d = r.select(small(r, d, tiny), q.k(tiny, d), d);
          Value cc = q.add(bi, q.div(an, s[2]));
          cc = r.select(small(r, cc, tiny), q.k(tiny, cc), cc);
          d = q.div(q.k(1, d), d);
          Value delta = q.mul(d, cc), h = q.mul(s[4], delta);
          Value done = r.binary(Binary::Or, s[5], small(r, q.sub(delta, q.k(1, delta)), eps));
          return {r.binary(Binary::Add, s[0], r.constant_int(1, counter)),
                  r.select(s[5], s[1], bi),
                  r.select(s[5], s[2], cc),
                  r.select(s[5], s[3], d),
                  r.select(s[5], s[4], h),
                  done};
        });
    Value q_fraction = m.mul(prefactor, fraction[4]);
    Value lower = b.select(use_series, p_series, m.sub(k(1), q_fraction));
    Value upper_value = b.select(use_series, m.sub(k(1), p_series), q_fraction);
    Value r = upper ? upper_value : lower;
    // The boundaries, in PyTorch's order (the first that applies wins).
    auto at = [&](const Value& where, double value, const Value& rest) { return b.select(where, k(value), rest); };
    Value inf_a = b.compare(Compare::EQ, a, k(INFINITY)), inf_x = b.compare(Compare::EQ, x, k(INFINITY));
    r = at(inf_x, upper ? 0 : 1, r);
    r = at(inf_a, upper ? 1 : 0, r);
    r = at(b.binary(Binary::And, inf_a, inf_x), NAN, r);
    r = at(b.compare(Compare::EQ, x, k(0)), upper ? 1 : 0, r);
    Value a_zero = b.compare(Compare::EQ, a, k(0));
    r = b.select(a_zero, b.select(b.compare(Compare::GT, x, k(0)), k(upper ? 0 : 1), k(NAN)), r);
    r = at(b.binary(Binary::Or, b.compare(Compare::LT, x, k(0)), b.compare(Compare::LT, a, k(0))), NAN, r);
    r = b.select(b.binary(Binary::Or, b.compare(Compare::NE, a, a), b.compare(Compare::NE, x, x)), k(NAN), r);
    return {b.cast(r, c.out().dtype)};
  };
}

// Each polynomial op has a (Tensor, Tensor), (Scalar, Tensor) and (Tensor, Scalar) form.
struct PolynomialOps {
  PolynomialOps(const std::string& name, const LoweringRule& rule) {
    for (const char* suffix : {"", ".x_scalar", ".n_scalar"}) register_rule("aten::special_" + name + suffix, rule);
  }
};
const PolynomialOps polynomials[] = {
    {"chebyshev_polynomial_t", chebyshev(Kind::T, false)},
    {"chebyshev_polynomial_u", chebyshev(Kind::U, false)},
    {"chebyshev_polynomial_v", chebyshev(Kind::V, false)},
    {"chebyshev_polynomial_w", chebyshev(Kind::W, false)},
    {"shifted_chebyshev_polynomial_t", chebyshev(Kind::T, true)},
    {"shifted_chebyshev_polynomial_u", chebyshev(Kind::U, true)},
    {"shifted_chebyshev_polynomial_v", chebyshev(Kind::V, true)},
    {"shifted_chebyshev_polynomial_w", chebyshev(Kind::W, true)},
    {"hermite_polynomial_h", hermite(true)},
    {"hermite_polynomial_he", hermite(false)},
    {"laguerre_polynomial_l", laguerre},
    {"legendre_polynomial_p", legendre},
};

}  // namespace

LOWERING("aten::i0", bessel_i(0, false));
LOWERING("aten::special_i0e", bessel_i(0, true));
LOWERING("aten::special_i1", bessel_i(1, false));
LOWERING("aten::special_i1e", bessel_i(1, true));
LOWERING("aten::special_modified_bessel_i0", bessel_i(0, false));
LOWERING("aten::special_modified_bessel_i1", bessel_i(1, false));
LOWERING("aten::igamma", incomplete_gamma(false));
LOWERING("aten::igammac", incomplete_gamma(true));
LOWERING("aten::special_erfcx", erfcx);
LOWERING("aten::special_log_ndtr", log_ndtr);
LOWERING("aten::special_ndtri", ndtri);
LOWERING("aten::special_bessel_j0", bessel_j(0));
LOWERING("aten::special_bessel_j1", bessel_j(1));
LOWERING("aten::special_bessel_y0", bessel_y(0));
LOWERING("aten::special_bessel_y1", bessel_y(1));
LOWERING("aten::special_spherical_bessel_j0", spherical_bessel_j0);
LOWERING("aten::special_modified_bessel_k0", bessel_k(0, false));
LOWERING("aten::special_modified_bessel_k1", bessel_k(1, false));
LOWERING("aten::special_scaled_modified_bessel_k0", bessel_k(0, true));
LOWERING("aten::special_scaled_modified_bessel_k1", bessel_k(1, true));

}  // namespace torch_tpu::lowering
