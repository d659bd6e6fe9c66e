#include "stablehlo/builder.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace torch_tpu::stablehlo {
namespace {

std::string join(const std::vector<int64_t>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}
std::string i64_array(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : "array<i64: " + join(v) + ">";
}
std::string list(const std::vector<int64_t>& v) { return "[" + join(v) + "]"; }

[[noreturn]] void refuse(const std::string& op, const std::string& why, const std::vector<Value>& operands) {
  std::string types;
  for (size_t i = 0; i < operands.size(); ++i) types += (i ? ", " : "") + operands[i].type.str();
  throw std::invalid_argument("stablehlo." + op + ": " + why + " (operands: " + types + ")");
}

void require_same_type(const std::string& op, const std::vector<Value>& xs) {
  for (const auto& x : xs)
    if (x.type != xs[0].type) refuse(op, "operands must have the same type", xs);
}

std::string hex(uint64_t bits, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(bits));
  return buf;
}

// Round-to-nearest-even narrowing of an IEEE float32 to half and bfloat16 bits.
uint16_t to_bfloat16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0x7FC0;
  uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
uint16_t to_half(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t abs = u & 0x7FFFFFFF;
  if (abs > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);   // NaN
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // overflow to inf
  if (abs < 0x38800000) {                                              // subnormal or zero
    float scaled = std::bit_cast<float>(abs) * 16777216.0f;            // * 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t rounded = abs + 0xFFF + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13));
}

// Round-to-nearest-even narrowing of a float to float8 bits: e5m2 is half
// precision's top byte; e4m3fn (bias 7, no infinities) saturates at 448 as
// PyTorch's conversion does.
uint8_t to_float8_e5m2(float f) {
  const uint16_t h = to_half(f);
  if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) return static_cast<uint8_t>((h >> 8) | 0x02);  // NaN stays NaN
  return static_cast<uint8_t>((h + 0x7F + ((h >> 8) & 1)) >> 8);
}
uint8_t to_float8_e4m3fn(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f)) return 0x7F;
  if (a == 0) return sign;
  if (a >= 464) return static_cast<uint8_t>(sign | 0x7E);  // 448 and up (464 rounds past it)
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int biased = e - 1 + 7;
  if (biased < 1) return static_cast<uint8_t>(sign | static_cast<int>(std::nearbyint(std::ldexp(a, 9))));  // subnormal
  int mantissa = static_cast<int>(std::nearbyint((std::ldexp(a, -(e - 1)) - 1) * 8));
  if (mantissa == 8) mantissa = 0, ++biased;
  return static_cast<uint8_t>(sign | (biased << 3) | mantissa);
}

// An integer's literal in an integer dtype: unsigned ones wrap (a uint64
// holds the int64's bits).
std::string int_literal(int64_t v, DType t) {
  switch (t) {
    case DType::Bool: return v ? "true" : "false";
    case DType::UInt8: return std::to_string(static_cast<uint8_t>(v));
    case DType::UInt16: return std::to_string(static_cast<uint16_t>(v));
    case DType::UInt32: return std::to_string(static_cast<uint32_t>(v));
    case DType::UInt64: return std::to_string(static_cast<uint64_t>(v));
    default: return std::to_string(v);
  }
}

// The element literal of a dense attribute, exact for every dtype (a
// complex one is (v, 0)).
std::string literal(double v, DType t) {
  switch (t) {
    case DType::Complex64:
    case DType::Complex128: {
      std::string part = literal(v, real_part_type(t));
      return "(" + part + ", " + literal(0, real_part_type(t)) + ")";
    }
    case DType::Bool: return v != 0 ? "true" : "false";
    case DType::Float64: return hex(std::bit_cast<uint64_t>(v), 16);
    case DType::Float32: return hex(std::bit_cast<uint32_t>(static_cast<float>(v)), 8);
    case DType::Float16: return hex(to_half(static_cast<float>(v)), 4);
    case DType::BFloat16: return hex(to_bfloat16(static_cast<float>(v)), 4);
    case DType::Float8E4M3FN: return hex(to_float8_e4m3fn(static_cast<float>(v)), 2);
    case DType::Float8E5M2: return hex(to_float8_e5m2(static_cast<float>(v)), 2);
    case DType::UInt8:
    case DType::UInt16:
    case DType::UInt32:
    case DType::UInt64:  // past int64's range only uint64 reads it as itself
      return int_literal(v >= 9.2e18 ? static_cast<int64_t>(static_cast<uint64_t>(v)) : static_cast<int64_t>(v), t);
    default: return std::to_string(static_cast<int64_t>(v));
  }
}

const char* unary_name(Unary op) {
  switch (op) {
    case Unary::Abs: return "abs";
    case Unary::Negate: return "negate";
    case Unary::Exp: return "exponential";
    case Unary::Expm1: return "exponential_minus_one";
    case Unary::Log: return "log";
    case Unary::Log1p: return "log_plus_one";
    case Unary::Sqrt: return "sqrt";
    case Unary::Rsqrt: return "rsqrt";
    case Unary::Tanh: return "tanh";
    case Unary::Logistic: return "logistic";
    case Unary::Floor: return "floor";
    case Unary::Ceil: return "ceil";
    case Unary::Sign: return "sign";
    case Unary::Not: return "not";
    case Unary::Cos: return "cosine";
    case Unary::Sin: return "sine";
    case Unary::Tan: return "tan";
    case Unary::RoundNearestEven: return "round_nearest_even";
    case Unary::RoundNearestAfz: return "round_nearest_afz";
    case Unary::IsFinite: return "is_finite";
    case Unary::Cbrt: return "cbrt";
    case Unary::Erf: return "chlo.erf";
    case Unary::Erfc: return "chlo.erfc";
    case Unary::ErfInv: return "chlo.erf_inv";
    case Unary::Lgamma: return "chlo.lgamma";
    case Unary::Digamma: return "chlo.digamma";
    case Unary::Asin: return "chlo.asin";
    case Unary::Acos: return "chlo.acos";
    case Unary::Atan: return "chlo.atan";
    case Unary::Sinh: return "chlo.sinh";
    case Unary::Cosh: return "chlo.cosh";
    case Unary::Asinh: return "chlo.asinh";
    case Unary::Acosh: return "chlo.acosh";
    case Unary::Atanh: return "chlo.atanh";
  }
  return "?";
}

const char* binary_name(Binary op) {
  switch (op) {
    case Binary::Add: return "add";
    case Binary::Subtract: return "subtract";
    case Binary::Multiply: return "multiply";
    case Binary::Divide: return "divide";
    case Binary::Remainder: return "remainder";
    case Binary::Maximum: return "maximum";
    case Binary::Minimum: return "minimum";
    case Binary::Power: return "power";
    case Binary::And: return "and";
    case Binary::Or: return "or";
    case Binary::Xor: return "xor";
    case Binary::Atan2: return "atan2";
    case Binary::ShiftLeft: return "shift_left";
    case Binary::ShiftRightArithmetic: return "shift_right_arithmetic";
    case Binary::ShiftRightLogical: return "shift_right_logical";
    case Binary::NextAfter: return "chlo.next_after";
    case Binary::Polygamma: return "chlo.polygamma";
    case Binary::Zeta: return "chlo.zeta";
  }
  return "?";
}

const char* compare_name(Compare c) {
  switch (c) {
    case Compare::EQ: return "EQ";
    case Compare::NE: return "NE";
    case Compare::LT: return "LT";
    case Compare::LE: return "LE";
    case Compare::GT: return "GT";
    case Compare::GE: return "GE";
  }
  return "?";
}

bool is_permutation(const std::vector<int64_t>& p, int64_t rank) {
  if (static_cast<int64_t>(p.size()) != rank) return false;
  std::vector<int64_t> s = p;
  std::sort(s.begin(), s.end());
  for (int64_t i = 0; i < rank; ++i)
    if (s[i] != i) return false;
  return true;
}

}  // namespace

bool is_float(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64 ||
         t == DType::Float8E4M3FN || t == DType::Float8E5M2;
}
bool is_complex(DType t) { return t == DType::Complex64 || t == DType::Complex128; }
DType real_part_type(DType t) {
  return t == DType::Complex64 ? DType::Float32 : t == DType::Complex128 ? DType::Float64 : t;
}
bool is_signed_int(DType t) { return t == DType::Int8 || t == DType::Int16 || t == DType::Int32 || t == DType::Int64; }
bool is_unsigned_int(DType t) {
  return t == DType::UInt8 || t == DType::UInt16 || t == DType::UInt32 || t == DType::UInt64;
}

size_t byte_size(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::Int8:
    case DType::UInt8:
    case DType::Float8E4M3FN:
    case DType::Float8E5M2: return 1;
    case DType::Int16:
    case DType::UInt16:
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::UInt32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::UInt64:
    case DType::Float64:
    case DType::Complex64: return 8;
    case DType::Complex128: return 16;
  }
  return 0;
}

std::string mlir_name(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::Int8: return "i8";
    case DType::Int16: return "i16";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::UInt8: return "ui8";
    case DType::UInt16: return "ui16";
    case DType::UInt32: return "ui32";
    case DType::UInt64: return "ui64";
    case DType::Float8E4M3FN: return "f8E4M3FN";
    case DType::Float8E5M2: return "f8E5M2";
    case DType::Float16: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
    case DType::Complex64: return "complex<f32>";
    case DType::Complex128: return "complex<f64>";
  }
  return "?";
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorType::str() const {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  return s + mlir_name(dtype) + ">";
}

// ------------------------------------------------------------------ plumbing

std::string Builder::fresh() { return "%v" + std::to_string(next_++); }

Value Builder::parameter(const TensorType& type) {
  if (!body_.empty()) throw std::logic_error("stablehlo: parameters must be declared before ops");
  Value v{"%p" + std::to_string(params_.size()), type};
  params_.push_back(v);
  return v;
}

Value Builder::emit(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
                    const TensorType& result, const std::string& region) {
  Value out{fresh(), result};
  // Ops outside StableHLO carry their dialect ("chlo.erf").
  std::string qualified = op.find('.') == std::string::npos ? "stablehlo." + op : op;
  std::string line = out.name + " = \"" + qualified + "\"(";
  std::string types;
  for (size_t i = 0; i < operands.size(); ++i) {
    line += (i ? ", " : "") + operands[i].name;
    types += (i ? ", " : "") + operands[i].type.str();
  }
  line += ")";
  if (!region.empty()) line += " (" + region + ")";
  if (!attrs.empty()) line += " {" + attrs + "}";
  line += " : (" + types + ") -> " + result.str();
  body_.push_back(line);
  return out;
}

std::string Builder::module(const std::vector<Value>& results,
                            const std::vector<std::pair<size_t, size_t>>& aliases) const {
  std::ostringstream s;
  s << "module @torch_tpu";
  if (partitions_ > 1)
    s << " attributes {mhlo.num_partitions = " << partitions_ << " : i32, mhlo.num_replicas = 1 : i32}";
  s << " {\n";
  if (!mesh_.empty()) {
    s << "  sdy.mesh @mesh = <[";
    for (size_t a = 0; a < mesh_.size(); ++a) s << (a ? ", " : "") << "\"a" << a << "\"=" << mesh_[a];
    s << "]>\n";
  }
  s << "  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    s << (i ? ", " : "") << params_[i].name << ": " << params_[i].type.str();
    std::vector<std::string> attrs;
    for (const auto& [param, result] : aliases) {
      if (param != i) continue;
      if (result >= results.size() || results[result].type.str() != params_[i].type.str())
        throw std::logic_error("stablehlo: an aliased parameter and its result must have the same type");
      attrs.push_back("tf.aliasing_output = " + std::to_string(result) + " : i32");
    }
    if (auto it = parameter_shardings_.find(params_[i].name); it != parameter_shardings_.end())
      attrs.push_back("sdy.sharding = " + it->second);
    for (size_t a = 0; a < attrs.size(); ++a) s << (a ? ", " : " {") << attrs[a] << (a + 1 == attrs.size() ? "}" : "");
  }
  s << ") -> (";
  for (size_t i = 0; i < results.size(); ++i) {
    s << (i ? ", " : "") << results[i].type.str();
    if (replicate_results_) s << " {sdy.sharding = " << sdy_sharding(Sharding(results[i].type.shape.size())) << "}";
  }
  s << ") {\n";
  for (const auto& line : body_) s << "    " << line << "\n";
  s << "    \"func.return\"(";
  for (size_t i = 0; i < results.size(); ++i) s << (i ? ", " : "") << results[i].name;
  s << ") : (";
  for (size_t i = 0; i < results.size(); ++i) s << (i ? ", " : "") << results[i].type.str();
  s << ") -> ()\n  }\n";
  for (const auto& [name, text] : functions_) s << "  // function @" << name << "\n  " << text << "\n";
  s << "}\n";
  return s.str();
}

namespace {

// The SSA names a line mentions ("%v12", "%p3"; "%v5#0" as "%v5"), its own
// definitions and its regions' inner names included.
std::vector<std::string> names_in(const std::string& line) {
  std::vector<std::string> names;
  for (size_t at = line.find('%'); at != std::string::npos; at = line.find('%', at + 1)) {
    size_t end = at + 1;
    while (end < line.size() && (std::isalnum(static_cast<unsigned char>(line[end])) || line[end] == '_')) ++end;
    if (end > at + 1) names.push_back(line.substr(at, end - at));
  }
  return names;
}

}  // namespace

std::vector<bool> Builder::prune(const std::vector<Value>& results) {
  std::unordered_set<std::string> live;
  for (const auto& r : results) live.insert(names_in(r.name).at(0));
  std::vector<bool> keep(body_.size());
  for (size_t i = body_.size(); i-- > 0;) {
    const std::string& line = body_[i];
    // The names a top-level line defines come before " = "; a line that
    // defines nothing (a call for its effect) always stays.
    const size_t eq = line.find(" = ");
    const auto defined =
        eq == std::string::npos || line[0] != '%' ? std::vector<std::string>{} : names_in(line.substr(0, eq));
    keep[i] = defined.empty() ||
              std::any_of(defined.begin(), defined.end(), [&](const std::string& d) { return live.count(d) > 0; });
    if (!keep[i]) continue;
    for (auto& name : names_in(line)) live.insert(std::move(name));
  }
  std::vector<std::string> body;
  for (size_t i = 0; i < body_.size(); ++i)
    if (keep[i]) body.push_back(std::move(body_[i]));
  body_ = std::move(body);
  std::vector<bool> kept;
  std::vector<Value> params;
  for (auto& p : params_) {
    kept.push_back(live.count(p.name) > 0);
    if (kept.back()) params.push_back(std::move(p));
  }
  params_ = std::move(params);
  return kept;
}

void Builder::add_function(const std::string& name, const std::string& text) {
  for (const auto& f : functions_)
    if (f.first == name) return;
  functions_.emplace_back(name, text);
}

std::vector<Value> Builder::call(const std::string& name, const std::vector<Value>& args,
                                 const std::vector<TensorType>& results) {
  bool known = false;
  for (const auto& f : functions_) known = known || f.first == name;
  if (!known) refuse("func.call", "calls @" + name + ", a function the module does not have", args);
  std::string base = fresh(), line = base, types, result_types;
  std::vector<Value> outs;
  for (size_t i = 0; i < results.size(); ++i) {
    outs.push_back({results.size() == 1 ? base : base + "#" + std::to_string(i), results[i]});
    result_types += (i ? ", " : "") + results[i].str();
  }
  if (results.size() > 1) line += ":" + std::to_string(results.size());
  line += " = \"func.call\"(";
  for (size_t i = 0; i < args.size(); ++i) {
    line += (i ? ", " : "") + args[i].name;
    types += (i ? ", " : "") + args[i].type.str();
  }
  line += ") <{callee = @" + name + "}> : (" + types + ") -> (" + result_types + ")";
  if (results.empty()) line = line.substr(line.find(" = ") + 3);
  body_.push_back(line);
  return outs;
}

// ------------------------------------------------------------------ ops

Value Builder::constant(double v, const TensorType& type) {
  return emit("constant", {}, "value = dense<" + literal(v, type.dtype) + "> : " + type.str(), type);
}

Value Builder::constant_int(int64_t v, const TensorType& type) {
  if (is_float(type.dtype) || is_complex(type.dtype)) return constant(static_cast<double>(v), type);
  return emit("constant", {}, "value = dense<" + int_literal(v, type.dtype) + "> : " + type.str(), type);
}

Value Builder::iota(const TensorType& type, int64_t dimension) {
  if (dimension < 0 || dimension >= type.rank())
    throw std::invalid_argument("stablehlo.iota: dimension " + std::to_string(dimension) + " out of range for " +
                                type.str());
  return emit("iota", {}, "iota_dimension = " + std::to_string(dimension) + " : i64", type);
}

Value Builder::unary(Unary op, const Value& x) {
  const std::string name = unary_name(op);
  bool float_only = op != Unary::Abs && op != Unary::Negate && op != Unary::Sign && op != Unary::Not;
  if (float_only && !is_float(x.dtype()) && !is_complex(x.dtype()))
    refuse(name, "needs a floating-point or complex operand", {x});
  if (op == Unary::Not && (is_float(x.dtype()) || is_complex(x.dtype())))
    refuse(name, "needs a boolean or integer operand", {x});
  const bool real_only = op == Unary::Floor || op == Unary::Ceil || op == Unary::RoundNearestEven ||
                         op == Unary::RoundNearestAfz || op == Unary::IsFinite || op == Unary::Erf ||
                         op == Unary::Erfc || op == Unary::ErfInv || op == Unary::Lgamma || op == Unary::Digamma;
  if (real_only && is_complex(x.dtype())) refuse(name, "needs a real operand", {x});
  if ((op == Unary::Abs || op == Unary::Negate || op == Unary::Sign) && x.dtype() == DType::Bool)
    refuse(name, "does not take a boolean operand", {x});
  TensorType result = x.type;
  if (op == Unary::IsFinite) result.dtype = DType::Bool;
  if (op == Unary::Abs) result.dtype = real_part_type(x.dtype());  // |a + bi| is real
  return emit(name, {x}, "", result);
}

Value Builder::binary(Binary op, const Value& a, const Value& b) {
  const std::string name = binary_name(op);
  require_same_type(name, {a, b});
  bool logical = op == Binary::And || op == Binary::Or || op == Binary::Xor;
  bool shift = op == Binary::ShiftLeft || op == Binary::ShiftRightArithmetic || op == Binary::ShiftRightLogical;
  if ((logical || shift) && (is_float(a.dtype()) || is_complex(a.dtype())))
    refuse(name, "needs boolean or integer operands", {a, b});
  if (is_complex(a.dtype()) && (op == Binary::Maximum || op == Binary::Minimum || op == Binary::Remainder))
    refuse(name, "needs real operands: complex numbers are not ordered", {a, b});
  const bool float_only =
      op == Binary::Atan2 || op == Binary::NextAfter || op == Binary::Polygamma || op == Binary::Zeta;
  if (float_only && !is_float(a.dtype())) refuse(name, "needs floating-point operands", {a, b});
  return emit(name, {a, b}, "", a.type);
}

Value Builder::compare(Compare dir, const Value& a, const Value& b) {
  require_same_type("compare", {a, b});
  if (is_complex(a.dtype()) && dir != Compare::EQ && dir != Compare::NE)
    refuse("compare", "complex numbers are not ordered", {a, b});
  const char* kind = is_float(a.dtype()) || is_complex(a.dtype()) ? "FLOAT"
                     : is_signed_int(a.dtype())                   ? "SIGNED"
                                                                  : "UNSIGNED";
  std::string attrs = std::string("comparison_direction = #stablehlo<comparison_direction ") + compare_name(dir) +
                      ">, compare_type = #stablehlo<comparison_type " + kind + ">";
  return emit("compare", {a, b}, attrs, {DType::Bool, a.shape()});
}

Value Builder::select(const Value& pred, const Value& on_true, const Value& on_false) {
  require_same_type("select", {on_true, on_false});
  if (pred.dtype() != DType::Bool || (pred.rank() != 0 && pred.shape() != on_true.shape()))
    refuse("select", "the predicate must be i1 of the operands' shape or a scalar", {pred, on_true, on_false});
  return emit("select", {pred, on_true, on_false}, "", on_true.type);
}

Value Builder::clamp(const Value& lo, const Value& x, const Value& hi) {
  for (const Value* bound : {&lo, &hi})
    if (bound->dtype() != x.dtype() || (bound->rank() != 0 && bound->shape() != x.shape()))
      refuse("clamp", "bounds must be scalars or match the operand's type", {lo, x, hi});
  return emit("clamp", {lo, x, hi}, "", x.type);
}

Value Builder::rounded(const Value& x) { return emit("optimization_barrier", {x}, "", x.type); }

Value Builder::convert(const Value& x, DType to) {
  if (x.dtype() == to) return x;
  // XLA converts neither complex to real nor integers to complex: through the parts.
  if (is_complex(x.dtype()) && !is_complex(to)) return convert(real(x), to);
  if (is_complex(to) && !is_complex(x.dtype())) {
    const DType part = real_part_type(to);
    return complex(convert(x, part), constant(0, {part, x.shape()}));
  }
  // bool -> float as a select: XLA rewrites convert(pred) * c into
  // select(pred, c, 0), so false * inf (or false / 0) gave 0 instead of NaN.
  if (x.dtype() == DType::Bool && is_float(to))
    return select(x, constant(1, {to, x.shape()}), constant(0, {to, x.shape()}));
  // float8_e4m3fn has no infinities: PyTorch saturates at +-448 where XLA gives NaN.
  if (to == DType::Float8E4M3FN && is_float(x.dtype()) && byte_size(x.dtype()) > 1)
    return emit("convert", {clamp(constant(-448, {x.dtype(), {}}), x, constant(448, {x.dtype(), {}}))}, "",
                {to, x.shape()});
  // PyTorch casts floats to uint8 through int64 (c10's TypeCast, on CPU and
  // CUDA alike): -1.5 -> 255 and 300.7 -> 44, where XLA's convert saturates.
  if (to == DType::UInt8 && is_float(x.dtype())) return convert(convert(x, DType::Int64), to);
  return emit("convert", {x}, "", {to, x.shape()});
}

Value Builder::fft(const Value& x, FftType type, const std::vector<int64_t>& length) {
  const auto n = static_cast<int64_t>(length.size());
  if (n < 1 || n > 3 || n > x.rank()) refuse("fft", "transforms 1 to 3 innermost dimensions", {x});
  const bool real_in = type == FftType::RFFT;
  if (real_in ? !is_float(x.dtype()) : !is_complex(x.dtype()))
    refuse("fft", real_in ? "RFFT needs a real operand" : "needs a complex operand", {x});
  TensorType result = x.type;
  const int64_t last = x.rank() - 1;
  if (type == FftType::RFFT) {
    result.dtype = x.dtype() == DType::Float64 ? DType::Complex128 : DType::Complex64;
    result.shape[last] = length.back() / 2 + 1;
  } else if (type == FftType::IRFFT) {
    result.dtype = real_part_type(x.dtype());
    result.shape[last] = length.back();
  }
  const char* kind = type == FftType::FFT ? "FFT" : type == FftType::IFFT ? "IFFT" : real_in ? "RFFT" : "IRFFT";
  return emit("fft", {x},
              std::string("fft_type = #stablehlo<fft_type ") + kind + ">, fft_length = " + i64_array(length), result);
}

Value Builder::real(const Value& x) {
  if (!is_complex(x.dtype())) return x;
  return emit("real", {x}, "", {real_part_type(x.dtype()), x.shape()});
}

Value Builder::imag(const Value& x) {
  if (!is_complex(x.dtype())) return constant(0, x.type);
  return emit("imag", {x}, "", {real_part_type(x.dtype()), x.shape()});
}

Value Builder::complex(const Value& re, const Value& im) {
  require_same_type("complex", {re, im});
  if (re.dtype() != DType::Float32 && re.dtype() != DType::Float64)
    refuse("complex", "the parts must be float32 or float64", {re, im});
  return emit("complex", {re, im}, "",
              {re.dtype() == DType::Float32 ? DType::Complex64 : DType::Complex128, re.shape()});
}

Value Builder::bitcast_convert(const Value& x, const TensorType& to) {
  size_t from_bytes = byte_size(x.dtype()), to_bytes = byte_size(to.dtype);
  Shape expected = x.shape();
  if (from_bytes > to_bytes) {
    expected.push_back(static_cast<int64_t>(from_bytes / to_bytes));
  } else if (from_bytes < to_bytes) {
    if (expected.empty() || expected.back() != static_cast<int64_t>(to_bytes / from_bytes))
      refuse("bitcast_convert", "the last dimension must hold exactly one wider element", {x});
    expected.pop_back();
  }
  if (to.shape != expected)
    refuse("bitcast_convert", "result shape must be " + TensorType{to.dtype, expected}.str(), {x});
  return emit("bitcast_convert", {x}, "", to);
}

Value Builder::broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims) {
  if (static_cast<int64_t>(dims.size()) != x.rank())
    refuse("broadcast_in_dim", "needs one dimension per operand dimension", {x});
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= static_cast<int64_t>(shape.size()) ||
        (x.shape()[i] != 1 && x.shape()[i] != shape[dims[i]]))
      refuse("broadcast_in_dim",
             "operand dimension " + std::to_string(i) + " cannot map to result dimension " + std::to_string(dims[i]) +
                 " of " + TensorType{x.dtype(), shape}.str(),
             {x});
  }
  return emit("broadcast_in_dim", {x}, "broadcast_dimensions = " + i64_array(dims), {x.dtype(), shape});
}

Value Builder::reshape(const Value& x, const Shape& shape) {
  TensorType result{x.dtype(), shape};
  if (result.numel() != x.type.numel()) refuse("reshape", "cannot reshape to " + result.str(), {x});
  if (result == x.type) return x;
  return emit("reshape", {x}, "", result);
}

Value Builder::transpose(const Value& x, const std::vector<int64_t>& permutation) {
  if (!is_permutation(permutation, x.rank())) refuse("transpose", "invalid permutation " + list(permutation), {x});
  Shape shape;
  for (int64_t p : permutation) shape.push_back(x.shape()[p]);
  return emit("transpose", {x}, "permutation = " + i64_array(permutation), {x.dtype(), shape});
}

Value Builder::slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                     const std::vector<int64_t>& strides) {
  int64_t r = x.rank();
  if (static_cast<int64_t>(start.size()) != r || static_cast<int64_t>(limit.size()) != r ||
      static_cast<int64_t>(strides.size()) != r)
    refuse("slice", "needs start, limit and strides for every dimension", {x});
  Shape shape;
  for (int64_t i = 0; i < r; ++i) {
    if (start[i] < 0 || limit[i] < start[i] || limit[i] > x.shape()[i] || strides[i] < 1)
      refuse("slice",
             "bad bounds in dimension " + std::to_string(i) + ": start " + std::to_string(start[i]) + ", limit " +
                 std::to_string(limit[i]) + ", stride " + std::to_string(strides[i]),
             {x});
    shape.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
  }
  std::string attrs = "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                      ", strides = " + i64_array(strides);
  return emit("slice", {x}, attrs, {x.dtype(), shape});
}

Value Builder::dynamic_slice(const Value& x, const std::vector<Value>& start, const std::vector<int64_t>& sizes) {
  std::vector<Value> operands{x};
  if (static_cast<int64_t>(start.size()) != x.rank() || static_cast<int64_t>(sizes.size()) != x.rank())
    refuse("dynamic_slice", "needs one start index and size per dimension", {x});
  for (size_t i = 0; i < start.size(); ++i) {
    if (start[i].rank() != 0 || is_float(start[i].dtype()) || start[i].dtype() == DType::Bool)
      refuse("dynamic_slice", "start indices must be 0-d integers", {x, start[i]});
    if (sizes[i] < 0 || sizes[i] > x.shape()[i]) refuse("dynamic_slice", "slice size exceeds the operand", {x});
    operands.push_back(start[i]);
  }
  return emit("dynamic_slice", operands, "slice_sizes = " + i64_array(sizes), {x.dtype(), sizes});
}

Value Builder::dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& start) {
  std::vector<Value> operands{x, update};
  if (update.dtype() != x.dtype() || update.rank() != x.rank() || static_cast<int64_t>(start.size()) != x.rank())
    refuse("dynamic_update_slice", "update must match the operand's dtype and rank, with one start per dimension",
           {x, update});
  for (int64_t i = 0; i < x.rank(); ++i)
    if (update.shape()[i] > x.shape()[i])
      refuse("dynamic_update_slice", "update is larger than the operand", {x, update});
  for (const auto& s : start) {
    if (s.rank() != 0 || is_float(s.dtype()))
      refuse("dynamic_update_slice", "start indices must be 0-d integers", {x, s});
    operands.push_back(s);
  }
  return emit("dynamic_update_slice", operands, "", x.type);
}

Value Builder::concatenate(const std::vector<Value>& xs, int64_t dimension) {
  if (xs.empty()) throw std::invalid_argument("stablehlo.concatenate: needs at least one operand");
  Shape shape = xs[0].shape();
  if (dimension < 0 || dimension >= xs[0].rank()) refuse("concatenate", "dimension out of range", xs);
  shape[dimension] = 0;
  for (const auto& x : xs) {
    if (x.dtype() != xs[0].dtype() || x.rank() != xs[0].rank())
      refuse("concatenate", "operands must share dtype and rank", xs);
    for (int64_t i = 0; i < x.rank(); ++i)
      if (i != dimension && x.shape()[i] != xs[0].shape()[i])
        refuse("concatenate", "operands differ outside the concatenated dimension", xs);
    shape[dimension] += x.shape()[dimension];
  }
  return emit("concatenate", xs, "dimension = " + std::to_string(dimension) + " : i64", {xs[0].dtype(), shape});
}

Value Builder::dot_general(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lhs_batch,
                           const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                           const std::vector<int64_t>& rhs_contract) {
  if (lhs.dtype() != rhs.dtype()) refuse("dot_general", "operands must share a dtype", {lhs, rhs});
  if (lhs_batch.size() != rhs_batch.size() || lhs_contract.size() != rhs_contract.size())
    refuse("dot_general", "batch and contracting dimension lists must pair up", {lhs, rhs});
  auto check = [&](const std::vector<int64_t>& l, const std::vector<int64_t>& r, const char* what) {
    for (size_t i = 0; i < l.size(); ++i) {
      if (l[i] < 0 || l[i] >= lhs.rank() || r[i] < 0 || r[i] >= rhs.rank() || lhs.shape()[l[i]] != rhs.shape()[r[i]])
        refuse("dot_general",
               std::string(what) + " dimensions " + std::to_string(l[i]) + " and " + std::to_string(r[i]) +
                   " do not match",
               {lhs, rhs});
    }
  };
  check(lhs_batch, rhs_batch, "batch");
  check(lhs_contract, rhs_contract, "contracting");
  auto used = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b, int64_t d) {
    return std::find(a.begin(), a.end(), d) != a.end() || std::find(b.begin(), b.end(), d) != b.end();
  };
  Shape shape;
  for (int64_t d : lhs_batch) shape.push_back(lhs.shape()[d]);
  for (int64_t d = 0; d < lhs.rank(); ++d)
    if (!used(lhs_batch, lhs_contract, d)) shape.push_back(lhs.shape()[d]);
  for (int64_t d = 0; d < rhs.rank(); ++d)
    if (!used(rhs_batch, rhs_contract, d)) shape.push_back(rhs.shape()[d]);
  std::string attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " + list(lhs_batch) +
                      ", rhs_batching_dimensions = " + list(rhs_batch) +
                      ", lhs_contracting_dimensions = " + list(lhs_contract) +
                      ", rhs_contracting_dimensions = " + list(rhs_contract) + ">";
  return emit("dot_general", {lhs, rhs}, attrs, {lhs.dtype(), shape});
}

Value Builder::reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims, Binary op) {
  if (init.rank() != 0 || init.dtype() != x.dtype())
    refuse("reduce", "init must be a 0-d value of the operand's dtype", {x, init});
  Shape shape;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(x.shape()[d]);
  }
  for (int64_t d : dims)
    if (d < 0 || d >= x.rank()) refuse("reduce", "dimension " + std::to_string(d) + " out of range", {x, init});
  TensorType scalar{x.dtype(), {}};
  std::string a = fresh(), b = fresh(), r = fresh(), t = scalar.str();
  std::string region = "{\n    ^bb0(" + a + ": " + t + ", " + b + ": " + t + "):\n      " + r + " = \"stablehlo." +
                       binary_name(op) + "\"(" + a + ", " + b + ") : (" + t + ", " + t + ") -> " + t +
                       "\n      \"stablehlo.return\"(" + r + ") : (" + t + ") -> ()\n    }";
  return emit("reduce", {x, init}, "dimensions = " + i64_array(dims), {x.dtype(), shape}, region);
}

// The 1-D forms the storage model and nonzero use: the general gather and
// scatter with one collapsed dimension and an index vector of length 1.
Value Builder::gather_1d(const Value& operand, const Value& indices) {
  if (operand.rank() != 1 || is_float(indices.dtype()) || indices.dtype() == DType::Bool)
    refuse("gather", "needs a 1-D operand and integer indices", {operand, indices});
  Shape with_vector = indices.shape();
  with_vector.push_back(1);
  GatherDims dims;
  dims.collapsed_slice_dims = {0};
  dims.start_index_map = {0};
  dims.index_vector_dim = indices.rank();
  return gather(operand, reshape(indices, with_vector), dims, {1});
}

Value Builder::scatter_1d(const Value& operand, const Value& indices, const Value& updates) {
  if (operand.rank() != 1 || is_float(indices.dtype()) || indices.shape() != updates.shape() ||
      updates.dtype() != operand.dtype())
    refuse("scatter", "needs a 1-D operand, integer indices and updates of the indices' shape",
           {operand, indices, updates});
  Shape with_vector = indices.shape();
  with_vector.push_back(1);
  ScatterDims dims;
  dims.inserted_window_dims = {0};
  dims.scatter_dims_to_operand_dims = {0};
  dims.index_vector_dim = indices.rank();
  return scatter(operand, reshape(indices, with_vector), updates, dims, ScatterCombine::Replace);
}

Value Builder::broadcast_to(const Value& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int64_t offset = static_cast<int64_t>(shape.size()) - x.rank();
  if (offset < 0) refuse("broadcast_in_dim", "cannot broadcast to " + TensorType{x.dtype(), shape}.str(), {x});
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(i + offset);
  return broadcast_in_dim(x, shape, dims);
}

// ------------------------------------------------------------------ regions, several results

std::string Builder::region(const std::string& op, const std::vector<TensorType>& arg_types, const RegionBody& body,
                            const std::vector<TensorType>& yields) {
  std::vector<Value> args;
  std::string header;
  for (const auto& t : arg_types) {
    args.push_back({fresh(), t});
    header += (header.empty() ? "" : ", ") + args.back().name + ": " + t.str();
  }
  // The body's ops go into their own block: build them on an empty body.
  std::vector<std::string> outer;
  outer.swap(body_);
  const size_t params_before = params_.size();
  std::vector<Value> results;
  try {
    results = body(*this, args);
  } catch (...) {
    body_.swap(outer);
    throw;
  }
  std::vector<std::string> inner;
  inner.swap(body_);
  body_.swap(outer);
  if (params_.size() != params_before) {
    params_.resize(params_before);
    throw std::logic_error("stablehlo." + op + ": a region cannot add parameters");
  }
  if (results.size() != yields.size())
    refuse(op,
           "the region must yield " + std::to_string(yields.size()) + " values, not " + std::to_string(results.size()),
           results);
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].type != yields[i])
      refuse(op, "region result " + std::to_string(i) + " must be " + yields[i].str(), results);
  std::string names, types;
  for (size_t i = 0; i < results.size(); ++i) {
    names += (i ? ", " : "") + results[i].name;
    types += (i ? ", " : "") + results[i].type.str();
  }
  std::string text = "{\n    ^bb0(" + header + "):\n";
  for (const auto& line : inner) text += "      " + line + "\n";
  return text + "      \"stablehlo.return\"(" + names + ") : (" + types + ") -> ()\n    }";
}

std::vector<Value> Builder::emit_results(const std::string& op, const std::vector<Value>& operands,
                                         const std::string& attrs, const std::vector<TensorType>& results,
                                         const std::string& region) {
  if (results.size() == 1) return {emit(op, operands, attrs, results[0], region)};
  std::string base = fresh();
  std::vector<Value> outs;
  std::string line = base + ":" + std::to_string(results.size()) + " = \"stablehlo." + op + "\"(", types, result_types;
  for (size_t i = 0; i < operands.size(); ++i) {
    line += (i ? ", " : "") + operands[i].name;
    types += (i ? ", " : "") + operands[i].type.str();
  }
  for (size_t i = 0; i < results.size(); ++i) {
    outs.push_back({base + "#" + std::to_string(i), results[i]});
    result_types += (i ? ", " : "") + results[i].str();
  }
  line += ")";
  if (!region.empty()) line += " (" + region + ")";
  if (!attrs.empty()) line += " {" + attrs + "}";
  line += " : (" + types + ") -> (" + result_types + ")";
  body_.push_back(line);
  return outs;
}

std::vector<Value> Builder::reduce(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                   const std::vector<int64_t>& dims, const RegionBody& body) {
  std::vector<Value> all = xs;
  all.insert(all.end(), inits.begin(), inits.end());
  if (xs.empty() || xs.size() != inits.size()) refuse("reduce", "needs one init per operand, at least one", all);
  std::vector<TensorType> scalars, results;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].shape() != xs[0].shape()) refuse("reduce", "operands must share a shape", all);
    if (inits[i].rank() != 0 || inits[i].dtype() != xs[i].dtype())
      refuse("reduce", "init " + std::to_string(i) + " must be a 0-d value of its operand's dtype", all);
    scalars.push_back(inits[i].type);
  }
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    refuse("reduce", "dimensions " + list(dims) + " repeat", all);
  for (int64_t d : dims)
    if (d < 0 || d >= xs[0].rank()) refuse("reduce", "dimension " + std::to_string(d) + " out of range", all);
  Shape shape;
  for (int64_t d = 0; d < xs[0].rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(xs[0].shape()[d]);
  for (const auto& x : xs) results.push_back({x.dtype(), shape});
  std::vector<TensorType> block = scalars;
  block.insert(block.end(), scalars.begin(), scalars.end());
  std::string text = region("reduce", block, body, scalars);
  return emit_results("reduce", all, "dimensions = " + i64_array(dims), results, text);
}

std::vector<Value> Builder::sort(const std::vector<Value>& xs, int64_t dimension, bool is_stable,
                                 const RegionBody& comparator) {
  if (xs.empty()) throw std::invalid_argument("stablehlo.sort: needs at least one operand");
  std::vector<TensorType> block, results;
  for (const auto& x : xs) {
    if (x.shape() != xs[0].shape()) refuse("sort", "operands must share a shape", xs);
    block.push_back({x.dtype(), {}});
    block.push_back({x.dtype(), {}});
    results.push_back(x.type);
  }
  if (dimension < 0 || dimension >= xs[0].rank())
    refuse("sort", "dimension " + std::to_string(dimension) + " out of range", xs);
  std::string text = region("sort", block, comparator, {{DType::Bool, {}}});
  std::string attrs =
      "dimension = " + std::to_string(dimension) + " : i64, is_stable = " + (is_stable ? "true" : "false");
  return emit_results("sort", xs, attrs, results, text);
}

std::vector<Value> Builder::while_loop(const std::vector<Value>& state, const RegionBody& condition,
                                       const RegionBody& body) {
  if (state.empty()) throw std::invalid_argument("stablehlo.while: needs at least one state value");
  std::vector<TensorType> types;
  for (const auto& v : state) types.push_back(v.type);
  std::string regions =
      region("while", types, condition, {{DType::Bool, {}}}) + ", " + region("while", types, body, types);
  return emit_results("while", state, "", types, regions);
}

// ------------------------------------------------------------------ indexing

namespace {

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Dimension lists of gather/scatter: each entry in [0, rank), no repeats; sorted where the spec asks.
bool valid_dims(const std::vector<int64_t>& v, int64_t rank, bool sorted) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= rank) return false;
    if (sorted && i > 0 && v[i] <= v[i - 1]) return false;
    if (std::count(v.begin(), v.end(), v[i]) != 1) return false;
  }
  return true;
}

bool is_integer(DType t) { return t != DType::Bool && !is_float(t); }

// A dimension-numbers field of a gather/scatter attribute; empty fields are omitted.
void field(std::string& s, const char* name, const std::vector<int64_t>& v) {
  if (v.empty()) return;
  s += std::string(s.empty() ? "" : ", ") + name + " = " + list(v);
}

// The shape of the index tensor's batch dimensions (all but index_vector_dim)
// and the length of one index vector.
std::pair<Shape, int64_t> index_batch(const Value& indices, int64_t index_vector_dim) {
  Shape batch;
  for (int64_t d = 0; d < indices.rank(); ++d)
    if (d != index_vector_dim) batch.push_back(indices.shape()[d]);
  int64_t vector = index_vector_dim < indices.rank() ? indices.shape()[index_vector_dim] : 1;
  return {batch, vector};
}

}  // namespace

Value Builder::gather(const Value& operand, const Value& start_indices, const GatherDims& dims,
                      const std::vector<int64_t>& slice_sizes, bool indices_are_sorted) {
  std::vector<Value> ops{operand, start_indices};
  const int64_t r = operand.rank();
  if (!is_integer(start_indices.dtype())) refuse("gather", "start indices must be integers", ops);
  if (dims.index_vector_dim < 0 || dims.index_vector_dim > start_indices.rank())
    refuse("gather", "index_vector_dim out of range", ops);
  if (static_cast<int64_t>(slice_sizes.size()) != r)
    refuse("gather", "needs one slice size per operand dimension", ops);
  for (int64_t d = 0; d < r; ++d)
    if (slice_sizes[d] < 0 || slice_sizes[d] > operand.shape()[d])
      refuse("gather", "slice size " + std::to_string(slice_sizes[d]) + " does not fit dimension " + std::to_string(d),
             ops);
  auto [batch, vector] = index_batch(start_indices, dims.index_vector_dim);
  if (!valid_dims(dims.collapsed_slice_dims, r, true) || !valid_dims(dims.operand_batching_dims, r, true) ||
      !valid_dims(dims.start_index_map, r, false) ||
      !valid_dims(dims.start_indices_batching_dims, start_indices.rank(), false) ||
      contains(dims.start_indices_batching_dims, dims.index_vector_dim))
    refuse("gather", "bad dimension numbers", ops);
  if (static_cast<int64_t>(dims.start_index_map.size()) != vector)
    refuse("gather", "start_index_map must have one entry per index vector element", ops);
  if (dims.operand_batching_dims.size() != dims.start_indices_batching_dims.size())
    refuse("gather", "operand and start-indices batching dimensions must pair up", ops);
  for (int64_t d : dims.collapsed_slice_dims) {
    if (contains(dims.operand_batching_dims, d)) refuse("gather", "a dimension is both collapsed and batching", ops);
    if (slice_sizes[d] > 1) refuse("gather", "a collapsed dimension must have slice size 0 or 1", ops);
  }
  for (int64_t d : dims.operand_batching_dims)
    if (slice_sizes[d] > 1) refuse("gather", "a batching dimension must have slice size 0 or 1", ops);
  Shape offsets;
  for (int64_t d = 0; d < r; ++d)
    if (!contains(dims.collapsed_slice_dims, d) && !contains(dims.operand_batching_dims, d))
      offsets.push_back(slice_sizes[d]);
  const int64_t result_rank = static_cast<int64_t>(offsets.size() + batch.size());
  if (dims.offset_dims.size() != offsets.size() || !valid_dims(dims.offset_dims, result_rank, true))
    refuse("gather", "offset_dims must list, sorted, one result dimension per uncollapsed operand dimension", ops);
  Shape shape;
  size_t next_offset = 0, next_batch = 0;
  for (int64_t d = 0; d < result_rank; ++d)
    shape.push_back(contains(dims.offset_dims, d) ? offsets[next_offset++] : batch[next_batch++]);
  std::string numbers;
  field(numbers, "offset_dims", dims.offset_dims);
  field(numbers, "collapsed_slice_dims", dims.collapsed_slice_dims);
  field(numbers, "operand_batching_dims", dims.operand_batching_dims);
  field(numbers, "start_indices_batching_dims", dims.start_indices_batching_dims);
  field(numbers, "start_index_map", dims.start_index_map);
  numbers += std::string(numbers.empty() ? "" : ", ") + "index_vector_dim = " + std::to_string(dims.index_vector_dim);
  std::string attrs = "dimension_numbers = #stablehlo.gather<" + numbers +
                      ">, indices_are_sorted = " + (indices_are_sorted ? "true" : "false") +
                      ", slice_sizes = " + i64_array(slice_sizes);
  return emit("gather", ops, attrs, {operand.dtype(), shape});
}

Value Builder::scatter(const Value& operand, const Value& scatter_indices, const Value& updates,
                       const ScatterDims& dims, ScatterCombine combine, bool indices_are_sorted, bool unique_indices) {
  std::vector<Value> ops{operand, scatter_indices, updates};
  const int64_t r = operand.rank();
  if (!is_integer(scatter_indices.dtype())) refuse("scatter", "scatter indices must be integers", ops);
  if (updates.dtype() != operand.dtype()) refuse("scatter", "updates must have the operand's dtype", ops);
  if (dims.index_vector_dim < 0 || dims.index_vector_dim > scatter_indices.rank())
    refuse("scatter", "index_vector_dim out of range", ops);
  auto [batch, vector] = index_batch(scatter_indices, dims.index_vector_dim);
  if (!valid_dims(dims.inserted_window_dims, r, true) || !valid_dims(dims.input_batching_dims, r, true) ||
      !valid_dims(dims.scatter_dims_to_operand_dims, r, false) ||
      !valid_dims(dims.scatter_indices_batching_dims, scatter_indices.rank(), false) ||
      contains(dims.scatter_indices_batching_dims, dims.index_vector_dim) ||
      !valid_dims(dims.update_window_dims, updates.rank(), true))
    refuse("scatter", "bad dimension numbers", ops);
  if (static_cast<int64_t>(dims.scatter_dims_to_operand_dims.size()) != vector)
    refuse("scatter", "scatter_dims_to_operand_dims must have one entry per index vector element", ops);
  if (dims.input_batching_dims.size() != dims.scatter_indices_batching_dims.size())
    refuse("scatter", "input and scatter-indices batching dimensions must pair up", ops);
  for (int64_t d : dims.inserted_window_dims)
    if (contains(dims.input_batching_dims, d)) refuse("scatter", "a dimension is both inserted and batching", ops);
  // Window dimensions of the operand, in order, and their bounds.
  Shape window_bounds;
  for (int64_t d = 0; d < r; ++d)
    if (!contains(dims.inserted_window_dims, d) && !contains(dims.input_batching_dims, d))
      window_bounds.push_back(operand.shape()[d]);
  if (dims.update_window_dims.size() != window_bounds.size() ||
      updates.rank() != static_cast<int64_t>(window_bounds.size() + batch.size()))
    refuse("scatter", "updates must have one dimension per index batch dimension and per operand window dimension",
           ops);
  size_t next_window = 0, next_batch = 0;
  for (int64_t d = 0; d < updates.rank(); ++d) {
    int64_t size = updates.shape()[d];
    if (contains(dims.update_window_dims, d)) {
      if (size > window_bounds[next_window++]) refuse("scatter", "an update window is larger than the operand", ops);
    } else if (size != batch[next_batch++]) {
      refuse("scatter", "update dimension " + std::to_string(d) + " does not match the indices' batch shape", ops);
    }
  }
  const bool logical = operand.dtype() == DType::Bool;
  const char* op = nullptr;
  switch (combine) {
    case ScatterCombine::Replace: break;
    case ScatterCombine::Add: op = logical ? "or" : "add"; break;
    case ScatterCombine::Multiply: op = logical ? "and" : "multiply"; break;
    case ScatterCombine::Maximum: op = logical ? "or" : "maximum"; break;
    case ScatterCombine::Minimum: op = logical ? "and" : "minimum"; break;
  }
  std::string t = TensorType{operand.dtype(), {}}.str(), a = fresh(), b = fresh();
  std::string region = "{\n    ^bb0(" + a + ": " + t + ", " + b + ": " + t + "):\n";
  if (op) {
    std::string c = fresh();
    region +=
        "      " + c + " = \"stablehlo." + op + "\"(" + a + ", " + b + ") : (" + t + ", " + t + ") -> " + t + "\n";
    b = c;
  }
  region += "      \"stablehlo.return\"(" + b + ") : (" + t + ") -> ()\n    }";
  std::string numbers;
  field(numbers, "update_window_dims", dims.update_window_dims);
  field(numbers, "inserted_window_dims", dims.inserted_window_dims);
  field(numbers, "input_batching_dims", dims.input_batching_dims);
  field(numbers, "scatter_indices_batching_dims", dims.scatter_indices_batching_dims);
  field(numbers, "scatter_dims_to_operand_dims", dims.scatter_dims_to_operand_dims);
  numbers += std::string(numbers.empty() ? "" : ", ") + "index_vector_dim = " + std::to_string(dims.index_vector_dim);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<" + numbers +
                      ">, indices_are_sorted = " + (indices_are_sorted ? "true" : "false") +
                      ", unique_indices = " + (unique_indices ? "true" : "false");
  return emit("scatter", ops, attrs, operand.type, region);
}

Value Builder::pad(const Value& x, const Value& padding_value, const std::vector<int64_t>& low,
                   const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  std::vector<Value> ops{x, padding_value};
  const int64_t r = x.rank();
  if (padding_value.rank() != 0 || padding_value.dtype() != x.dtype())
    refuse("pad", "the padding value must be a 0-d value of the operand's dtype", ops);
  if (static_cast<int64_t>(low.size()) != r || static_cast<int64_t>(high.size()) != r ||
      static_cast<int64_t>(interior.size()) != r)
    refuse("pad", "needs low, high and interior padding for every dimension", ops);
  Shape shape;
  for (int64_t d = 0; d < r; ++d) {
    if (interior[d] < 0) refuse("pad", "interior padding must be non-negative", ops);
    int64_t n = x.shape()[d];
    int64_t size = low[d] + high[d] + n + (n > 0 ? (n - 1) * interior[d] : 0);
    if (size < 0)
      refuse("pad",
             "padding " + std::to_string(low[d]) + ", " + std::to_string(high[d]) + " leaves dimension " +
                 std::to_string(d) + " with a negative size",
             ops);
    shape.push_back(size);
  }
  std::string attrs = "edge_padding_low = " + i64_array(low) + ", edge_padding_high = " + i64_array(high) +
                      ", interior_padding = " + i64_array(interior);
  return emit("pad", ops, attrs, {x.dtype(), shape});
}

Value Builder::reverse(const Value& x, const std::vector<int64_t>& dims) {
  if (!valid_dims(dims, x.rank(), false)) refuse("reverse", "bad dimensions " + list(dims), {x});
  if (dims.empty()) return x;
  return emit("reverse", {x}, "dimensions = " + i64_array(dims), x.type);
}

Value Builder::cholesky(const Value& a, bool lower) {
  if (a.rank() < 2 || a.shape()[a.rank() - 1] != a.shape()[a.rank() - 2] ||
      !(is_float(a.dtype()) || is_complex(a.dtype())))
    refuse("cholesky", "needs a batch of square float or complex matrices", {a});
  return emit("cholesky", {a}, std::string("lower = ") + (lower ? "true" : "false"), a.type);
}

Value Builder::triangular_solve(const Value& a, const Value& b, bool left_side, bool lower, bool unit_diagonal,
                                TriangularOp op) {
  const int64_t r = a.rank();
  const bool shapes_ok = r >= 2 && b.rank() == r && a.shape()[r - 1] == a.shape()[r - 2] &&
                         std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin()) &&
                         b.shape()[left_side ? r - 2 : r - 1] == a.shape()[r - 1];
  if (!shapes_ok || a.dtype() != b.dtype() || !(is_float(a.dtype()) || is_complex(a.dtype())))
    refuse("triangular_solve", "needs float or complex a [..., n, n] and b of the same batch and dtype sharing n",
           {a, b});
  auto flag = [](bool v) { return v ? "true" : "false"; };
  return emit("triangular_solve", {a, b},
              std::string("left_side = ") + flag(left_side) + ", lower = " + flag(lower) +
                  ", unit_diagonal = " + flag(unit_diagonal) + ", transpose_a = #stablehlo<transpose " +
                  (op == TriangularOp::Adjoint     ? "ADJOINT"
                   : op == TriangularOp::Transpose ? "TRANSPOSE"
                                                   : "NO_TRANSPOSE") +
                  ">",
              b.type);
}

// ------------------------------------------------------------------ convolution

ConvDims ConvDims::nchw(int64_t spatial_rank) {
  ConvDims d;
  for (int64_t i = 0; i < spatial_rank; ++i) {
    d.lhs_spatial.push_back(2 + i);
    d.rhs_spatial.push_back(2 + i);
    d.out_spatial.push_back(2 + i);
  }
  return d;
}

namespace {
// "[b, f, 0, 1]": the letter or spatial index that each dimension holds.
std::string conv_spec(int64_t rank, int64_t first, char first_name, int64_t second, char second_name,
                      const std::vector<int64_t>& spatial) {
  std::vector<std::string> names(rank, "?");
  names.at(first) = std::string(1, first_name);
  names.at(second) = std::string(1, second_name);
  for (size_t i = 0; i < spatial.size(); ++i) names.at(spatial[i]) = std::to_string(i);
  std::string s = "[";
  for (int64_t i = 0; i < rank; ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}
}  // namespace

Value Builder::convolution(const Value& lhs, const Value& rhs, const ConvDims& d,
                           const std::vector<int64_t>& window_strides,
                           const std::vector<std::pair<int64_t, int64_t>>& padding,
                           const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                           int64_t feature_group_count, int64_t batch_group_count) {
  size_t n = d.lhs_spatial.size();
  if (lhs.dtype() != rhs.dtype()) refuse("convolution", "operands must share a dtype", {lhs, rhs});
  if (lhs.rank() != static_cast<int64_t>(n) + 2 || rhs.rank() != lhs.rank() || d.rhs_spatial.size() != n ||
      d.out_spatial.size() != n || window_strides.size() != n || padding.size() != n || lhs_dilation.size() != n ||
      rhs_dilation.size() != n)
    refuse("convolution", "ranks, spatial dimensions and window attributes must agree", {lhs, rhs});
  int64_t in_features = lhs.shape()[d.lhs_feature], kernel_in = rhs.shape()[d.rhs_input_feature];
  int64_t kernel_out = rhs.shape()[d.rhs_output_feature], batch = lhs.shape()[d.lhs_batch];
  if (feature_group_count < 1 || batch_group_count < 1 || in_features != kernel_in * feature_group_count ||
      kernel_out % feature_group_count != 0 || kernel_out % batch_group_count != 0 || batch % batch_group_count != 0)
    refuse("convolution", "feature/batch group counts do not match the operands", {lhs, rhs});
  Shape shape(lhs.rank());
  shape[d.out_batch] = batch / batch_group_count;
  shape[d.out_feature] = kernel_out;
  std::string pad;
  for (size_t i = 0; i < n; ++i) {
    int64_t in = lhs.shape()[d.lhs_spatial[i]], k = rhs.shape()[d.rhs_spatial[i]];
    int64_t dilated_in = in == 0 ? 0 : (in - 1) * lhs_dilation[i] + 1;
    int64_t dilated_k = k == 0 ? 0 : (k - 1) * rhs_dilation[i] + 1;
    int64_t padded = dilated_in + padding[i].first + padding[i].second;
    if (window_strides[i] < 1) refuse("convolution", "window strides must be positive", {lhs, rhs});
    shape[d.out_spatial[i]] = padded < dilated_k ? 0 : (padded - dilated_k) / window_strides[i] + 1;
    pad += std::string(i ? ", " : "") + "[" + std::to_string(padding[i].first) + ", " +
           std::to_string(padding[i].second) + "]";
  }
  std::string spec = conv_spec(lhs.rank(), d.lhs_batch, 'b', d.lhs_feature, 'f', d.lhs_spatial) + "x" +
                     conv_spec(rhs.rank(), d.rhs_output_feature, 'o', d.rhs_input_feature, 'i', d.rhs_spatial) + "->" +
                     conv_spec(lhs.rank(), d.out_batch, 'b', d.out_feature, 'f', d.out_spatial);
  std::string attrs = "batch_group_count = " + std::to_string(batch_group_count) +
                      " : i64, dimension_numbers = #stablehlo.conv<" + spec +
                      ">, feature_group_count = " + std::to_string(feature_group_count) +
                      " : i64, lhs_dilation = " + i64_array(lhs_dilation) + ", padding = dense<[" + pad +
                      "]> : tensor<" + std::to_string(n) + "x2xi64>, rhs_dilation = " + i64_array(rhs_dilation) +
                      ", window_strides = " + i64_array(window_strides);
  return emit("convolution", {lhs, rhs}, attrs, {lhs.dtype(), shape});
}

// ------------------------------------------------------------------ windowed reductions

std::vector<Value> Builder::reduce_window(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                          const std::vector<int64_t>& window_dimensions,
                                          const std::vector<int64_t>& window_strides,
                                          const std::vector<int64_t>& base_dilations,
                                          const std::vector<int64_t>& window_dilations,
                                          const std::vector<std::pair<int64_t, int64_t>>& padding,
                                          const RegionBody& body) {
  std::vector<Value> all = xs;
  all.insert(all.end(), inits.begin(), inits.end());
  if (xs.empty() || xs.size() != inits.size()) refuse("reduce_window", "needs one init per operand, at least one", all);
  std::vector<TensorType> scalars;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].shape() != xs[0].shape()) refuse("reduce_window", "operands must share a shape", all);
    if (inits[i].rank() != 0 || inits[i].dtype() != xs[i].dtype())
      refuse("reduce_window", "init " + std::to_string(i) + " must be a 0-d value of its operand's dtype", all);
    scalars.push_back(inits[i].type);
  }
  const size_t r = static_cast<size_t>(xs[0].rank());
  auto ones_if_empty = [r](const std::vector<int64_t>& v) { return v.empty() ? std::vector<int64_t>(r, 1) : v; };
  std::vector<int64_t> strides = ones_if_empty(window_strides), base = ones_if_empty(base_dilations),
                       dil = ones_if_empty(window_dilations);
  if (window_dimensions.size() != r || strides.size() != r || base.size() != r || dil.size() != r ||
      padding.size() != r)
    refuse("reduce_window", "needs a window size, stride, dilations and padding for every dimension", all);
  Shape shape;
  std::vector<int64_t> pad_flat;
  for (size_t d = 0; d < r; ++d) {
    if (window_dimensions[d] < 1 || strides[d] < 1 || base[d] < 1 || dil[d] < 1)
      refuse("reduce_window", "window sizes, strides and dilations must be positive", all);
    int64_t n = xs[0].shape()[d];
    int64_t padded = (n == 0 ? 0 : (n - 1) * base[d] + 1) + padding[d].first + padding[d].second;
    int64_t window = (window_dimensions[d] - 1) * dil[d] + 1;
    if (padded < 0) refuse("reduce_window", "padding leaves dimension " + std::to_string(d) + " negative", all);
    shape.push_back(padded < window ? 0 : (padded - window) / strides[d] + 1);
    pad_flat.push_back(padding[d].first);
    pad_flat.push_back(padding[d].second);
  }
  std::vector<TensorType> results, block = scalars;
  for (const auto& x : xs) results.push_back({x.dtype(), shape});
  block.insert(block.end(), scalars.begin(), scalars.end());
  std::string text = region("reduce_window", block, body, scalars);
  std::string pads;
  for (size_t d = 0; d < r; ++d)
    pads += std::string(d ? ", " : "") + "[" + std::to_string(pad_flat[2 * d]) + ", " +
            std::to_string(pad_flat[2 * d + 1]) + "]";
  std::string attrs =
      "base_dilations = " + i64_array(base) + ", padding = dense<" + (r == 0 ? std::string("") : "[" + pads + "]") +
      "> : tensor<" + std::to_string(r) + "x2xi64>, window_dilations = " + i64_array(dil) +
      ", window_dimensions = " + i64_array(window_dimensions) + ", window_strides = " + i64_array(strides);
  return emit_results("reduce_window", all, attrs, results, text);
}

// ------------------------------------------------------------------ constants of given elements

namespace {

// The literals of a dense attribute nested by `shape`: [[a, b], [c, d]].
void nest(const std::vector<std::string>& literals, const Shape& shape, size_t dim, size_t& next, std::string& out) {
  if (dim == shape.size()) {
    out += literals[next++];
    return;
  }
  out += "[";
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i) out += ", ";
    nest(literals, shape, dim + 1, next, out);
  }
  out += "]";
}

}  // namespace

Value Builder::constant_elements(const std::vector<std::string>& literals, const TensorType& type) {
  if (static_cast<int64_t>(literals.size()) != type.numel())
    throw std::invalid_argument("constant_array: " + std::to_string(literals.size()) + " values for " + type.str());
  std::string text;
  size_t next = 0;
  nest(literals, type.shape, 0, next, text);
  return emit("constant", {}, "value = dense<" + text + "> : " + type.str(), type);
}

Value Builder::constant_array(const std::vector<double>& values, const TensorType& type) {
  std::vector<std::string> literals;
  literals.reserve(values.size());
  for (double v : values) literals.push_back(literal(v, type.dtype));
  return constant_elements(literals, type);
}

Value Builder::constant_array_int(const std::vector<int64_t>& values, const TensorType& type) {
  std::vector<std::string> literals;
  literals.reserve(values.size());
  for (int64_t v : values)
    literals.push_back(is_float(type.dtype) || is_complex(type.dtype) ? literal(static_cast<double>(v), type.dtype)
                                                                      : int_literal(v, type.dtype));
  return constant_elements(literals, type);
}

// ------------------------------------------------------------------ random bits

std::pair<Value, Value> Builder::rng_bit_generator(const Value& state, const Shape& shape, DType bits,
                                                   RngAlgorithm algorithm) {
  const bool three_fry = algorithm == RngAlgorithm::ThreeFry;
  const int64_t words = state.rank() == 1 ? state.shape()[0] : -1;
  if (state.dtype() != DType::Int64 || (three_fry ? words != 2 : (words != 2 && words != 3)))
    refuse("rng_bit_generator",
           three_fry ? "the ThreeFry state must be int64[2]" : "the Philox state must be int64[2] or int64[3]",
           {state});
  if (bits != DType::Int32 && bits != DType::Int64)
    refuse("rng_bit_generator", "bits must be Int32 or Int64, not " + mlir_name(bits), {state});
  for (int64_t d : shape)
    if (d < 0) refuse("rng_bit_generator", "negative dimension in the result shape " + list(shape), {state});
  // StableHLO wants unsigned words; the builder's dtypes are signed, so
  // bitcasts on both sides (free in XLA).
  auto unsigned_type = [](const Shape& dims, DType t) {
    std::string s = "tensor<";
    for (int64_t d : dims) s += std::to_string(d) + "x";
    return s + "u" + mlir_name(t) + ">";
  };
  const std::string u_state = unsigned_type(state.shape(), DType::Int64), u_bits = unsigned_type(shape, bits);
  const std::string in = fresh(), rng = fresh();
  body_.push_back(in + " = \"stablehlo.bitcast_convert\"(" + state.name + ") : (" + state.type.str() + ") -> " +
                  u_state);
  body_.push_back(rng + ":2 = \"stablehlo.rng_bit_generator\"(" + in + ") {rng_algorithm = #stablehlo<rng_algorithm " +
                  (three_fry ? "THREE_FRY" : "PHILOX") + ">} : (" + u_state + ") -> (" + u_state + ", " + u_bits + ")");
  Value next{fresh(), state.type}, out{fresh(), {bits, shape}};
  body_.push_back(next.name + " = \"stablehlo.bitcast_convert\"(" + rng + "#0) : (" + u_state + ") -> " +
                  next.type.str());
  body_.push_back(out.name + " = \"stablehlo.bitcast_convert\"(" + rng + "#1) : (" + u_bits + ") -> " + out.type.str());
  return {next, out};
}

}  // namespace torch_tpu::stablehlo

// ------------------------------------------------------------------ collectives

namespace torch_tpu::stablehlo {

void Builder::set_partitions(int64_t n) {
  if (n < 1) throw std::invalid_argument("stablehlo: a program needs at least one partition, not " + std::to_string(n));
  partitions_ = n;
}

void Builder::set_mesh(std::vector<int64_t> axis_sizes) {
  int64_t devices = 1;
  for (int64_t n : axis_sizes) devices *= n;
  if (devices != partitions_)
    throw std::logic_error("stablehlo: a mesh of " + std::to_string(devices) + " devices over " +
                           std::to_string(partitions_) + " partitions");
  mesh_ = std::move(axis_sizes);
}

std::string Builder::sdy_sharding(const Sharding& sharding) const {
  if (mesh_.empty()) throw std::logic_error("stablehlo: a sharding needs a mesh (set_mesh)");
  std::string s = "#sdy.sharding<@mesh, [";
  for (size_t d = 0; d < sharding.size(); ++d) {
    s += d ? ", {" : "{";
    for (size_t k = 0; k < sharding[d].size(); ++k) {
      const int axis = sharding[d][k];
      if (axis < 0 || static_cast<size_t>(axis) >= mesh_.size())
        throw std::logic_error("stablehlo: mesh axis " + std::to_string(axis) + " of a " +
                               std::to_string(mesh_.size()) + "-axis mesh");
      s += (k ? ", \"a" : "\"a") + std::to_string(axis) + "\"";
    }
    s += "}";
  }
  return s + "]>";
}

void Builder::set_parameter_sharding(const Value& parameter, const Sharding& sharding) {
  bool known = false;
  for (const auto& p : params_) known = known || p.name == parameter.name;
  if (!known) throw std::logic_error("stablehlo: " + parameter.name + " is not a parameter");
  if (sharding.size() != parameter.type.shape.size())
    throw std::logic_error("stablehlo: a sharding of " + std::to_string(sharding.size()) + " dims for " +
                           parameter.type.str());
  parameter_shardings_[parameter.name] = sdy_sharding(sharding);
}

Value Builder::sharding_constraint(const Value& x, const Sharding& sharding) {
  return emit("sdy.sharding_constraint", {x}, "sharding = " + sdy_sharding(sharding), x.type);
}

std::string Builder::group_attrs() {
  std::string ids;
  for (int64_t p = 0; p < partitions_; ++p) ids += (p ? ", " : "") + std::to_string(p);
  // type 1: DEVICE_TO_DEVICE. Channels are unique per collective of a module.
  return "replica_groups = dense<[[" + ids + "]]> : tensor<1x" + std::to_string(partitions_) +
         "xi64>, channel_handle = #stablehlo.channel_handle<handle = " + std::to_string(next_channel_++) +
         ", type = 1>";
}

Value Builder::all_reduce(const Value& x, const RegionBody& combine) {
  TensorType scalar{x.dtype(), {}};
  std::string text = region("all_reduce", {scalar, scalar}, combine, {scalar});
  return emit("all_reduce", {x}, group_attrs() + ", use_global_device_ids", x.type, text);
}

Value Builder::all_gather(const Value& x, int64_t dimension) {
  if (dimension < 0 || dimension >= x.rank())
    refuse("all_gather", "dimension " + std::to_string(dimension) + " out of range", {x});
  TensorType out = x.type;
  out.shape[dimension] *= partitions_;
  return emit("all_gather", {x},
              "all_gather_dim = " + std::to_string(dimension) + " : i64, " + group_attrs() + ", use_global_device_ids",
              out);
}

Value Builder::reduce_scatter(const Value& x, int64_t dimension, const RegionBody& combine) {
  if (dimension < 0 || dimension >= x.rank() || x.shape()[dimension] % partitions_ != 0)
    refuse("reduce_scatter",
           "dimension " + std::to_string(dimension) + " must exist and split into " + std::to_string(partitions_) +
               " equal blocks",
           {x});
  TensorType scalar{x.dtype(), {}};
  std::string text = region("reduce_scatter", {scalar, scalar}, combine, {scalar});
  TensorType out = x.type;
  out.shape[dimension] /= partitions_;
  return emit(
      "reduce_scatter", {x},
      "scatter_dimension = " + std::to_string(dimension) + " : i64, " + group_attrs() + ", use_global_device_ids", out,
      text);
}

Value Builder::all_to_all(const Value& x, int64_t dimension) {
  if (dimension < 0 || dimension >= x.rank() || x.shape()[dimension] % partitions_ != 0)
    refuse("all_to_all",
           "dimension " + std::to_string(dimension) + " must exist and split into " + std::to_string(partitions_) +
               " equal blocks",
           {x});
  const std::string d = std::to_string(dimension) + " : i64";
  return emit("all_to_all", {x},
              "split_dimension = " + d + ", concat_dimension = " + d +
                  ", split_count = " + std::to_string(partitions_) + " : i64, " + group_attrs(),
              x.type);
}

}  // namespace torch_tpu::stablehlo
