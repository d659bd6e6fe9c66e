// Random ops: uniform_, normal_ (and normal's tensor overloads), random_,
// exponential_, geometric_, cauchy_, log_normal_, bernoulli, randperm,
// multinomial, and dropout's backward. The generator argument arrives as the
// op's 0-d int64 key (see random.h); the factories (rand, randn, randint,
// rand_like, ...) reach these through PyTorch's own empty + fill_ composites.
// In-place random ops overwrite self without reading it: the general kernel
// passes self like an out= argument, so their rules see only the key and the
// parameters.
#include "lowering/random.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "lowering/registry.h"

namespace torch_tpu::lowering {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

Value random_bits(Builder& b, const Value& key, const Shape& shape, DType bits) {
  if (key.dtype() != DType::Int64 || key.rank() != 0)
    throw std::invalid_argument("random_bits: the key must be a 0-d int64, got " + key.type.str());
  TensorType type{bits, shape};
  if (type.numel() == 0) return b.constant_int(0, type);
  // ThreeFry state [key, counter 0]: each call's key is fresh, so counters never overlap.
  Value state = b.concatenate({b.reshape(key, {1}), b.constant_int(0, {DType::Int64, {1}})}, 0);
  return b.rng_bit_generator(state, shape, bits).second;
}

int significand_digits(DType t) {
  switch (t) {
    case DType::Float8E4M3FN: return 4;
    case DType::Float8E5M2: return 3;
    case DType::Float16: return 11;
    case DType::BFloat16: return 8;
    case DType::Float32: return 24;
    case DType::Float64: return 53;
    default: throw std::invalid_argument("significand_digits: " + stablehlo::mlir_name(t) + " is not a float type");
  }
}

DType random_compute_type(DType t) { return t == DType::Float64 ? DType::Float64 : DType::Float32; }

namespace {

// The top `digits` bits of each word, as a nonnegative integer of the word's type.
Value top_bits(Builder& b, const Value& bits, int digits) {
  const int width = bits.dtype() == DType::Int32 ? 32 : 64;
  const int limit = width == 32 ? 24 : 53;  // what float32 / float64 hold exactly
  if (digits < 1 || digits > limit)
    throw std::invalid_argument("uniform_from_bits: " + std::to_string(digits) + " digits from " + bits.type.str());
  return b.binary(Binary::ShiftRightLogical, bits, b.constant_int(width - digits, bits.type));
}

DType float_of(const Value& bits) { return bits.dtype() == DType::Int32 ? DType::Float32 : DType::Float64; }

}  // namespace

Value uniform_from_bits(Builder& b, const Value& bits, int digits) {
  Value m = b.convert(top_bits(b, bits, digits), float_of(bits));
  return b.binary(Binary::Multiply, m, b.constant(std::ldexp(1.0, -digits), m.type));
}

Value open_uniform_from_bits(Builder& b, const Value& bits, int digits) {
  Value m = b.convert(top_bits(b, bits, digits - 1), float_of(bits));
  m = b.binary(Binary::Add, m, b.constant(0.5, m.type));
  return b.binary(Binary::Multiply, m, b.constant(std::ldexp(1.0, -(digits - 1)), m.type));
}

Value random_uniform(Builder& b, const Value& key, const TensorType& type) {
  DType compute = random_compute_type(type.dtype);
  Value bits = random_bits(b, key, type.shape, compute == DType::Float64 ? DType::Int64 : DType::Int32);
  return uniform_from_bits(b, bits, significand_digits(type.dtype));
}

Value random_normal(Builder& b, const Value& key, const TensorType& type) {
  DType compute = random_compute_type(type.dtype);
  Shape two = type.shape;
  two.insert(two.begin(), 2);
  Value bits = random_bits(b, key, two, compute == DType::Float64 ? DType::Int64 : DType::Int32);
  Value u = open_uniform_from_bits(b, bits, significand_digits(compute));
  std::vector<int64_t> start(two.size(), 0), limit = two, strides(two.size(), 1);
  limit[0] = 1;
  Value u1 = b.reshape(b.slice(u, start, limit, strides), type.shape);
  start[0] = 1;
  limit[0] = 2;
  Value u2 = b.reshape(b.slice(u, start, limit, strides), type.shape);
  TensorType t{compute, type.shape};
  // sqrt(-2 ln u1) * cos(2 pi u2)
  Value r = b.unary(Unary::Sqrt, b.binary(Binary::Multiply, b.constant(-2.0, t), b.unary(Unary::Log, u1)));
  Value angle = b.binary(Binary::Multiply, b.constant(2 * M_PI, t), u2);
  return b.binary(Binary::Multiply, r, b.unary(Unary::Cos, angle));
}

namespace {

std::string str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The dtype as PyTorch users spell it, for messages.
std::string torch_name(DType t) {
  switch (t) {
    case DType::Bool: return "torch.bool";
    case DType::Int8: return "torch.int8";
    case DType::Int16: return "torch.int16";
    case DType::Int32: return "torch.int32";
    case DType::Int64: return "torch.int64";
    case DType::UInt8: return "torch.uint8";
    case DType::UInt16: return "torch.uint16";
    case DType::UInt32: return "torch.uint32";
    case DType::UInt64: return "torch.uint64";
    case DType::Float8E4M3FN: return "torch.float8_e4m3fn";
    case DType::Float8E5M2: return "torch.float8_e5m2";
    case DType::Float16: return "torch.float16";
    case DType::BFloat16: return "torch.bfloat16";
    case DType::Float32: return "torch.float32";
    case DType::Float64: return "torch.float64";
    case DType::Complex64: return "torch.complex64";
    case DType::Complex128: return "torch.complex128";
  }
  return "?";
}

// runtime_error: RuntimeError from Python however the op was called, as on CPU.
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

// The key argument: the general kernel turns the Generator into a 0-d int64.
const Value& key_arg(LoweringContext& c, size_t i) {
  const Value& k = c.tensor(i);
  if (k.dtype() != DType::Int64 || k.rank() != 0) fail("torch_tpu: random op without its key argument");
  return k;
}

Value all_true(Builder& b, const Value& pred) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < pred.rank(); ++d) dims.push_back(d);
  return b.reduce(pred, b.scalar(1, DType::Bool), dims, Binary::And);
}

Value add(Builder& b, const Value& x, const Value& y) { return b.binary(Binary::Add, x, y); }
Value mul(Builder& b, const Value& x, const Value& y) { return b.binary(Binary::Multiply, x, y); }
Value div(Builder& b, const Value& x, const Value& y) { return b.binary(Binary::Divide, x, y); }

// The type a continuous distribution is computed in; its output must be a float.
TensorType compute_type(LoweringContext& c, const char* op) {
  if (!stablehlo::is_float(c.out().dtype))
    fail(std::string(op) + " needs a floating-point tensor, got " + torch_name(c.out().dtype));
  return {random_compute_type(c.out().dtype), c.out().shape};
}

// uniform_(self, from=0, to=1, *, generator): from + (to - from) * u, in [from, to).
std::vector<Value> uniform(LoweringContext& c) {
  const double from = c.number(1), to = c.number(2);
  TensorType t = compute_type(c, "uniform_");
  if (from > to)
    fail("uniform_ expects to return a [from, to) range, but found from=" + str(from) + " > to=" + str(to));
  Value u = random_uniform(c.b, key_arg(c, 3), c.out());
  Value x = add(c.b, c.value_as(1, t), mul(c.b, u, c.b.constant(to - from, t)));
  // Rounding to a narrow dtype may reach `to`; that value goes to `from`, as on CUDA.
  Value y = c.b.cast(x, c.out().dtype), hi = c.b.constant(to, c.out()), lo = c.b.constant(from, c.out());
  return {c.b.select(c.b.compare(Compare::GE, y, hi), lo, y)};
}

// mean + std * z with mean and std tensors or numbers (argument 0 and 1, or 1 and 2).
Value normal_of(LoweringContext& c, size_t mean, size_t std, size_t key) {
  TensorType t = compute_type(c, "normal");
  Value z = random_normal(c.b, key_arg(c, key), c.out());
  return c.b.cast(add(c.b, c.value_as(mean, t), mul(c.b, c.value_as(std, t), z)), c.out().dtype);
}

// normal_(self, mean=0, std=1, *, generator)
std::vector<Value> normal_inplace(LoweringContext& c) { return {normal_of(c, 1, 2, 3)}; }

// normal.Tensor_float / float_Tensor / Tensor_Tensor(mean, std, *, generator):
// a tensor std must be >= 0 everywhere (a device check, as CUDA asserts).
std::vector<Value> normal_tensors(LoweringContext& c) {
  if (c.args[1].kind == LoweringArg::Tensor) {
    const Value& s = c.tensor(1);
    if (s.type.numel() > 0)
      c.checks.push_back({all_true(c.b, c.b.compare(Compare::GE, s, c.b.constant(0, s.type))),
                          "normal expects all elements of std >= 0.0", /*index_error=*/false});
  } else if (c.number(1) < 0) {
    fail("normal expects std >= 0.0, but found std " + str(c.number(1)));
  }
  return {normal_of(c, 0, 1, 2)};
}

// Integers from + [0, range) from 64-bit words, as int64; range 0 means 2^64.
Value random_integers(Builder& b, const Value& key, const Shape& shape, int64_t from, uint64_t range) {
  TensorType t{DType::Int64, shape};
  Value bits = random_bits(b, key, shape, DType::Int64);
  Value offset;
  constexpr uint64_t kHalf = uint64_t{1} << 63;
  if (range == 0) {
    offset = bits;
  } else if (range <= kHalf) {
    offset = b.binary(Binary::ShiftRightLogical, bits, b.constant_int(1, t));
    if (range < kHalf) offset = b.binary(Binary::Remainder, offset, b.constant_int(static_cast<int64_t>(range), t));
  } else {  // (2^63, 2^64): an even split of the top 63 bits, then the lowest bit
    Value high = b.binary(Binary::ShiftRightLogical, bits, b.constant_int(1, t));
    high = b.binary(Binary::Remainder, high, b.constant_int(static_cast<int64_t>(range / 2), t));
    offset = add(b, mul(b, high, b.constant_int(2, t)), b.binary(Binary::And, bits, b.constant_int(1, t)));
  }
  return add(b, offset, b.constant_int(from, t));  // wraps like uint64 arithmetic
}

// The largest value random_ draws for a dtype: 2^digits for floats (every
// integer up to it is exact), the dtype's maximum for integers.
int64_t random_max(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::UInt8: return 255;
    case DType::UInt16: return 65535;
    case DType::UInt32: return std::numeric_limits<uint32_t>::max();
    case DType::UInt64: return std::numeric_limits<int64_t>::max();  // what an int64 bound holds
    case DType::Int8: return 127;
    case DType::Int16: return 32767;
    case DType::Int32: return std::numeric_limits<int32_t>::max();
    case DType::Int64: return std::numeric_limits<int64_t>::max();
    default: return int64_t{1} << significand_digits(t);
  }
}
int64_t random_min(DType t) {
  switch (t) {
    case DType::Int8: return -128;
    case DType::Int16: return -32768;
    case DType::Int32: return std::numeric_limits<int32_t>::min();
    case DType::Int64: return std::numeric_limits<int64_t>::min();
    case DType::Bool:
    case DType::UInt8:
    case DType::UInt16:
    case DType::UInt32:
    case DType::UInt64: return 0;
    default: return -(int64_t{1} << significand_digits(t));
  }
}

// Integers in [from, last] (inclusive) of the output dtype.
std::vector<Value> random_range(LoweringContext& c, int64_t from, int64_t last, size_t key) {
  const DType t = c.out().dtype;
  if (from < random_min(t) || last > random_max(t))
    fail("random_ expects 'from' and 'to' - 1 within the range of " + torch_name(t) + " ([" +
         std::to_string(random_min(t)) + ", " + std::to_string(random_max(t)) +
         "]), but got from=" + std::to_string(from) + " and to - 1=" + std::to_string(last));
  uint64_t range = static_cast<uint64_t>(last) - static_cast<uint64_t>(from) + 1;
  return {c.b.cast(random_integers(c.b, key_arg(c, key), c.out().shape, from, range), t)};
}

// random_(self, *, generator): [0, 2^digits] for floats, [0, max] for integers.
std::vector<Value> random_all(LoweringContext& c) { return random_range(c, 0, random_max(c.out().dtype), 1); }

// random_.from(self, from, to=None, *, generator): [from, to), or [from, max] without to.
std::vector<Value> random_from(LoweringContext& c) {
  const int64_t from = c.integer(1);
  if (!c.has(2)) return random_range(c, from, random_max(c.out().dtype), 3);
  const int64_t to = c.integer(2);
  if (from >= to)
    fail("random_ expects 'from' to be less than 'to', but got from=" + std::to_string(from) +
         " >= to=" + std::to_string(to));
  return random_range(c, from, to - 1, 3);
}

// random_.to(self, to, *, generator): [0, to).
std::vector<Value> random_to(LoweringContext& c) {
  const int64_t to = c.integer(1);
  if (to <= 0) fail("random_ expects 'from' to be less than 'to', but got from=0 >= to=" + std::to_string(to));
  return random_range(c, 0, to - 1, 2);
}

// An open uniform (0, 1) of the output's shape in the compute type.
Value open_uniform(LoweringContext& c, size_t key) {
  DType compute = random_compute_type(c.out().dtype);
  Value bits =
      random_bits(c.b, key_arg(c, key), c.out().shape, compute == DType::Float64 ? DType::Int64 : DType::Int32);
  return open_uniform_from_bits(c.b, bits, significand_digits(compute));
}

// exponential_(self, lambd=1, *, generator): -ln(u) / lambd, never 0 or inf.
std::vector<Value> exponential(LoweringContext& c) {
  const double lambd = c.number(1);
  if (!(lambd > 0)) fail("exponential_ expects lambda > 0.0, but found lambda=" + str(lambd));
  TensorType t = compute_type(c, "exponential_");
  Value x = div(c.b, c.b.unary(Unary::Negate, c.b.unary(Unary::Log, open_uniform(c, 2))), c.value_as(1, t));
  return {c.b.cast(x, c.out().dtype)};
}

// geometric_(self, p, *, generator): trials to the first success, >= 1:
// ceil(ln(u) / ln(1 - p)).
std::vector<Value> geometric(LoweringContext& c) {
  const double p = c.number(1);
  if (!(p > 0 && p < 1)) fail("geometric_ expects p to be in (0, 1), but got p=" + str(p));
  TensorType t{random_compute_type(c.out().dtype), c.out().shape};  // integer outputs too
  Value x = div(c.b, c.b.unary(Unary::Log, open_uniform(c, 2)), c.b.constant(std::log1p(-p), t));
  x = c.b.binary(Binary::Maximum, c.b.unary(Unary::Ceil, x), c.b.constant(1, t));
  return {c.b.cast(x, c.out().dtype)};
}

// cauchy_(self, median=0, sigma=1, *, generator): median + sigma * tan(pi (u - 1/2)).
std::vector<Value> cauchy(LoweringContext& c) {
  if (!(c.number(2) > 0)) fail("cauchy_ expects sigma > 0.0, but found sigma=" + str(c.number(2)));
  TensorType t = compute_type(c, "cauchy_");
  Value angle = mul(c.b, c.b.binary(Binary::Subtract, open_uniform(c, 3), c.b.constant(0.5, t)), c.b.constant(M_PI, t));
  Value x = add(c.b, c.value_as(1, t), mul(c.b, c.value_as(2, t), c.b.unary(Unary::Tan, angle)));
  return {c.b.cast(x, c.out().dtype)};
}

// log_normal_(self, mean=1, std=2, *, generator): exp(mean + std * z).
std::vector<Value> log_normal(LoweringContext& c) {
  if (!(c.number(2) > 0)) fail("log_normal_ expects std > 0.0, but found std=" + str(c.number(2)));
  TensorType t = compute_type(c, "log_normal_");
  Value z = random_normal(c.b, key_arg(c, 3), c.out());
  return {c.b.cast(c.b.unary(Unary::Exp, add(c.b, c.value_as(1, t), mul(c.b, c.value_as(2, t), z))), c.out().dtype)};
}

// 1 where u < p, else 0, in the output dtype; u on the compute type's full grid.
Value bernoulli_of(LoweringContext& c, const Value& p, size_t key) {
  DType compute = p.dtype();
  Value bits =
      random_bits(c.b, key_arg(c, key), c.out().shape, compute == DType::Float64 ? DType::Int64 : DType::Int32);
  Value u = uniform_from_bits(c.b, bits, significand_digits(compute));
  return c.b.cast(c.b.compare(Compare::LT, u, p), c.out().dtype);
}

// A tensor of probabilities: in the compute type, shaped like the output, and
// checked on the device to lie in [0, 1].
Value probabilities(LoweringContext& c, size_t i) {
  const Value& p = c.tensor(i);
  DType compute = p.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  if (p.type.numel() > 0) {
    Value q = c.b.cast(p, compute);
    Value ok = c.b.binary(Binary::And, c.b.compare(Compare::GE, q, c.b.constant(0, q.type)),
                          c.b.compare(Compare::LE, q, c.b.constant(1, q.type)));
    c.checks.push_back({all_true(c.b, ok), "bernoulli expects all elements of p to be in [0, 1]", false});
  }
  return c.value_as(i, {compute, c.out().shape});
}

// bernoulli(self, *, generator): self holds the probabilities.
std::vector<Value> bernoulli(LoweringContext& c) { return {bernoulli_of(c, probabilities(c, 0), 1)}; }
// bernoulli_.Tensor(self, p, *, generator): p broadcasts to self.
std::vector<Value> bernoulli_tensor(LoweringContext& c) { return {bernoulli_of(c, probabilities(c, 1), 2)}; }
// bernoulli_.float(self, p=0.5, *, generator) and bernoulli.p(self, p, *, generator).
std::vector<Value> bernoulli_float(LoweringContext& c) {
  const double p = c.number(1);
  if (!(p >= 0 && p <= 1)) fail("bernoulli_ expects p to be in [0, 1], but got p=" + str(p));
  DType compute = c.out().dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  return {bernoulli_of(c, c.value_as(1, {compute, c.out().shape}), 2)};
}

// native_dropout_backward(grad_output, mask, scale): grad * mask * scale, the
// product rounded once per step as PyTorch does (dropout's forward is this
// with the input in place of the gradient).
std::vector<Value> dropout_backward(LoweringContext& c) {
  const DType out = c.out().dtype;
  TensorType t{stablehlo::is_float(out) ? random_compute_type(out) : out, c.out().shape};
  Value masked = c.b.cast(mul(c.b, c.operand_as_output(0), c.operand_as_output(1)), t.dtype);
  return {c.b.cast(mul(c.b, masked, c.value_as(2, t)), out)};
}

// In compiled graphs (csrc/python/graph.cpp passes the key as argument 3):
// native_dropout(input, p, train) -> (input * mask / (1 - p), mask), the mask
// a bernoulli(1 - p) draw, as eager's dropout kernel computes it.
std::vector<Value> graph_native_dropout(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const double p = c.number(1);
  const bool train = !c.has(2) || c.args[2].b;
  TensorType mask_type = c.out(1);
  if (!train || p == 0) return {x, c.b.constant(1, mask_type)};
  DType compute = random_compute_type(x.dtype());
  Value bits = random_bits(c.b, key_arg(c, 3), x.shape(), compute == DType::Float64 ? DType::Int64 : DType::Int32);
  Value u = uniform_from_bits(c.b, bits, significand_digits(compute));
  Value keep = c.b.compare(Compare::LT, u, c.b.constant(1 - p, u.type));
  TensorType t{compute, x.shape()};
  Value masked = c.b.cast(mul(c.b, x, c.b.cast(keep, x.dtype())), compute);
  Value scale = c.b.constant(p == 1 ? 0.0 : 1.0 / (1.0 - p), t);
  return {c.b.cast(mul(c.b, masked, scale), x.dtype()), c.b.cast(keep, mask_type.dtype)};
}

// The largest n whose permutation dtype t holds exactly (PyTorch's check).
int64_t randperm_limit(DType t) {
  if (stablehlo::is_float(t)) return (int64_t{1} << significand_digits(t)) + 1;
  return t == DType::Int64 ? random_max(t) : random_max(t) + 1;
}

// randperm.generator_out(n, *, generator, out): sort 0..n-1 by random 64-bit keys.
std::vector<Value> randperm(LoweringContext& c) {
  const int64_t n = c.integer(0);
  const DType t = c.out().dtype;
  if (n < 0) fail("n must be non-negative, got" + std::to_string(n));
  if (t != DType::Bool && n > randperm_limit(t))
    fail("n cannot be greater than " + std::to_string(randperm_limit(t)) + " for " + torch_name(t) + " type.");
  if (n == 0) return {c.b.constant_int(0, c.out())};
  Value keys = random_bits(c.b, key_arg(c, 1), {n}, DType::Int64);
  auto sorted = c.b.sort({keys, c.b.iota({DType::Int64, {n}}, 0)}, 0, /*is_stable=*/true,
                         [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                           return {r.compare(Compare::LT, a[0], a[1])};
                         });
  return {c.b.cast(sorted[1], t)};
}

// Inclusive prefix sums of `x` along dimension 1 (Hillis-Steele: log2(n) steps).
Value prefix_sum(Builder& b, Value x) {
  const int64_t n = x.shape()[1];
  for (int64_t k = 1; k < n; k *= 2) {
    Shape pad = x.shape();
    pad[1] = k;
    Shape limit = x.shape();
    limit[1] = n - k;
    Value shifted = b.concatenate({b.constant(0, {x.dtype(), pad}), b.slice(x, {0, 0}, limit, {1, 1})}, 1);
    x = add(b, x, shifted);
  }
  return x;
}

// The float just below a positive float.
Value previous_float(Builder& b, const Value& x) {
  TensorType bits{x.dtype() == DType::Float64 ? DType::Int64 : DType::Int32, x.shape()};
  Value i = b.bitcast_convert(x, bits);
  return b.bitcast_convert(b.binary(Binary::Subtract, i, b.constant_int(1, bits)), x.type);
}

// multinomial(self, num_samples, replacement=False, *, generator): int64
// category indices drawn by the rows of nonnegative weights in self.
// With replacement: inverse CDF, a binary search of each uniform in the row's
// prefix sums (log2(categories) gathers). Without: the categories with the
// num_samples largest ln(u) / w (weighted sampling without replacement, in
// draw order).
std::vector<Value> multinomial(LoweringContext& c) {
  const Value& self = c.tensor(0);
  const int64_t n = c.integer(1);
  const bool replacement = c.has(2) && c.args[2].b;
  if (self.rank() < 1 || self.rank() > 2) fail("prob_dist must be 1 or 2 dim");
  if (!stablehlo::is_float(self.dtype()))
    fail("multinomial only supports floating-point dtypes for input, got: " + torch_name(self.dtype()));
  if (n <= 0) fail("cannot sample n_sample <= 0 samples");
  const int64_t cats = self.shape().back(), rows = self.rank() == 2 ? self.shape()[0] : 1;
  if (!replacement && n > cats) fail("cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (cats > (int64_t{1} << 24)) fail("number of categories cannot exceed 2^24");
  if (rows == 0) return {c.b.constant_int(0, c.out())};
  if (cats == 0) fail("multinomial: the input has no categories (size 0 in its last dimension)");

  const DType compute = random_compute_type(self.dtype());
  Value w = c.b.reshape(c.b.cast(self, compute), {rows, cats});
  Value zero = c.b.constant(0, w.type);
  Value valid = c.b.binary(Binary::And, c.b.unary(Unary::IsFinite, w), c.b.compare(Compare::GE, w, zero));
  c.checks.push_back({all_true(c.b, valid), "probability tensor contains either `inf`, `nan` or element < 0", false});
  Value total = c.b.reduce(w, c.b.scalar(0, compute), {1}, Binary::Add);
  c.checks.push_back({all_true(c.b, c.b.compare(Compare::GT, total, c.b.constant(0, total.type))),
                      "invalid multinomial distribution (sum of probabilities <= 0)", false});

  Value index;
  if (replacement) {
    const TensorType samples{compute, {rows, n}};
    Value cdf = prefix_sum(c.b, w);
    Value last = c.b.reshape(c.b.slice(cdf, {0, cats - 1}, {rows, cats}, {1, 1}), {rows});
    Value u = uniform_from_bits(
        c.b, random_bits(c.b, key_arg(c, 3), {rows, n}, compute == DType::Float64 ? DType::Int64 : DType::Int32),
        significand_digits(compute));
    // u * total < total, so a zero-weight category at the end is never drawn.
    Value t = c.b.broadcast_in_dim(last, samples.shape, {0});
    Value target = c.b.binary(Binary::Minimum, mul(c.b, u, t), previous_float(c.b, t));
    // Count the prefix sums <= target by binary lifting: the drawn index.
    const TensorType idx{DType::Int64, {rows, n}};
    Value flat = c.b.reshape(cdf, {rows * cats});
    Value row_start = mul(c.b, c.b.iota(idx, 0), c.b.constant_int(cats, idx));
    Value count = c.b.constant_int(0, idx);
    int64_t step = 1;
    while (step * 2 <= cats) step *= 2;
    for (; step >= 1; step /= 2) {
      Value candidate = add(c.b, count, c.b.constant_int(step, idx));
      Value in_range = c.b.compare(Compare::LE, candidate, c.b.constant_int(cats, idx));
      Value at = c.b.binary(Binary::Subtract, c.b.binary(Binary::Minimum, candidate, c.b.constant_int(cats, idx)),
                            c.b.constant_int(1, idx));
      Value v = c.b.reshape(c.b.gather_1d(flat, add(c.b, row_start, at)), idx.shape);
      Value take = c.b.binary(Binary::And, in_range, c.b.compare(Compare::LE, v, target));
      count = c.b.select(take, candidate, count);
    }
    index = c.b.binary(Binary::Minimum, count, c.b.constant_int(cats - 1, idx));
  } else {
    Value bits = random_bits(c.b, key_arg(c, 3), {rows, cats}, compute == DType::Float64 ? DType::Int64 : DType::Int32);
    Value keys = div(c.b, c.b.unary(Unary::Log, open_uniform_from_bits(c.b, bits, significand_digits(compute))), w);
    auto sorted = c.b.sort({keys, c.b.iota({DType::Int64, {rows, cats}}, 1)}, 1, /*is_stable=*/true,
                           [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                             return {r.compare(Compare::GT, a[0], a[1])};
                           });
    index = c.b.slice(sorted[1], {0, 0}, {rows, n}, {1, 1});
  }
  return {c.b.reshape(index, c.out().shape)};
}

// rrelu_with_noise(self, noise(b!), lower, upper, training, generator):
// training: negative (<= 0) elements times r ~ U(lower, upper), noise = r
// there and 1 elsewhere; evaluation: leaky_relu with the mean slope, noise
// kept. Returns the output and noise's new value (the general kernel writes it).
std::vector<Value> rrelu_with_noise(LoweringContext& c) {
  TensorType t = compute_type(c, "rrelu_with_noise");
  Value x = c.b.cast(c.tensor(0), t.dtype);
  Value lower = c.value_as(2, t), upper = c.value_as(3, t);
  if (!(c.has(4) && c.args[4].b)) {
    Value slope = mul(c.b, add(c.b, lower, upper), c.b.constant(0.5, t));
    Value y = c.b.select(c.b.compare(Compare::GT, x, c.b.constant(0, t)), x, mul(c.b, x, slope));
    return {c.b.cast(y, c.out().dtype), c.tensor(1)};
  }
  Value u = random_uniform(c.b, key_arg(c, 5), c.out());
  Value r = add(c.b, lower, mul(c.b, u, c.b.binary(Binary::Subtract, upper, lower)));
  Value negative = c.b.compare(Compare::LE, x, c.b.constant(0, t));
  Value y = c.b.select(negative, mul(c.b, x, r), x);
  Value noise = c.b.select(negative, r, c.b.constant(1, t));
  return {c.b.cast(y, c.out().dtype), c.b.cast(noise, c.tensor(1).dtype())};
}

}  // namespace

bool overwrites_first_argument(std::string_view op) {
  static const std::vector<std::string_view> ops = {
      "aten::uniform_",    "aten::normal_",           "aten::random_",         "aten::random_.from",
      "aten::random_.to",  "aten::exponential_",      "aten::geometric_",      "aten::cauchy_",
      "aten::log_normal_", "aten::bernoulli_.Tensor", "aten::bernoulli_.float"};
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

LOWERING("aten::uniform_", uniform);
LOWERING("aten::normal_", normal_inplace);
LOWERING("aten::normal.Tensor_float", normal_tensors);
LOWERING("aten::normal.float_Tensor", normal_tensors);
LOWERING("aten::normal.Tensor_Tensor", normal_tensors);
LOWERING("aten::random_", random_all);
LOWERING("aten::random_.from", random_from);
LOWERING("aten::random_.to", random_to);
LOWERING("aten::exponential_", exponential);
LOWERING("aten::geometric_", geometric);
LOWERING("aten::cauchy_", cauchy);
LOWERING("aten::log_normal_", log_normal);
LOWERING("aten::bernoulli", bernoulli);
LOWERING("aten::bernoulli_.Tensor", bernoulli_tensor);
LOWERING("aten::bernoulli_.float", bernoulli_float);
LOWERING("aten::bernoulli.p", bernoulli_float);
LOWERING("aten::native_dropout_backward", dropout_backward);
LOWERING("graph:aten::native_dropout", graph_native_dropout);
LOWERING("aten::randperm.generator_out", randperm);
LOWERING("aten::multinomial", multinomial);
LOWERING("aten::rrelu_with_noise", rrelu_with_noise);

}  // namespace torch_tpu::lowering
