#include "lowering/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>

namespace torch_tpu::lowering {
namespace {

std::map<std::string, LoweringRule, std::less<>>& table() {
  static std::map<std::string, LoweringRule, std::less<>> rules;
  return rules;
}

const LoweringArg& arg(const std::vector<LoweringArg>& args, size_t i, LoweringArg::Kind want, const char* what) {
  bool number = want == LoweringArg::Double && i < args.size() &&
                (args[i].kind == LoweringArg::Int || args[i].kind == LoweringArg::Bool);
  if (i >= args.size() || (args[i].kind != want && !number))
    throw std::invalid_argument(std::string("torch_tpu lowering: argument ") + std::to_string(i) + " is not " + what);
  return args[i];
}

bool row_major(const Shape& sizes, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// The order of the dims in memory, outermost first, when (sizes, strides) lay
// out every element of a storage of `storage_numel` elements exactly once
// from offset 0 (a transposed or channels_last tensor); empty otherwise.
std::vector<int64_t> dense_memory_order(const Shape& sizes, const std::vector<int64_t>& strides, int64_t offset,
                                        int64_t storage_numel) {
  std::vector<int64_t> order(sizes.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (sizes[*it] == 1) continue;
    if (strides[*it] != expected) return {};
    expected *= sizes[*it];
  }
  if (offset != 0 || expected != storage_numel) return {};
  return order;
}

Shape permuted(const Shape& sizes, const std::vector<int64_t>& order) {
  Shape out;
  for (int64_t d : order) out.push_back(sizes[d]);
  return out;
}

// The flat storage index of every element of the view, shaped like the view.
Value flat_indices(Builder& b, int64_t storage_numel, const Shape& sizes, const std::vector<int64_t>& strides,
                   int64_t offset) {
  DType index_type = storage_numel < (int64_t{1} << 31) ? DType::Int32 : DType::Int64;
  TensorType type{index_type, sizes};
  Value index = b.constant_int(offset, type);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1 || strides[d] == 0) continue;
    Value term =
        b.binary(stablehlo::Binary::Multiply, b.iota(type, static_cast<int64_t>(d)), b.constant_int(strides[d], type));
    index = b.binary(stablehlo::Binary::Add, index, term);
  }
  return index;
}

// A view whose dims, largest stride first, each step over whole blocks of the
// next (q of qkv.view(b, t, 3, h, dh).unbind(2), a column, every other row):
// the storage from the view's offset reshaped into those blocks holds the view
// as the box at the blocks' origin. Read and written with a slice, a reshape
// and a transpose instead of a gather or scatter of every element.
struct Blocks {
  std::vector<int64_t> dims;  // the view's dims of size > 1, largest stride first
  Shape shape;                // sizes[dims[0]], then each stride over the next, then the last stride
  Shape box;                  // the view's part of each: the sizes in `dims` order, then 1
  int64_t span = 0;           // storage elements the blocks cover from the offset

  static std::optional<Blocks> of(const Shape& sizes, const std::vector<int64_t>& strides) {
    Blocks b;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 1) continue;
      if (strides[d] <= 0) return std::nullopt;  // broadcast or negative: a gather
      b.dims.push_back(static_cast<int64_t>(d));
    }
    if (b.dims.empty()) return std::nullopt;
    std::stable_sort(b.dims.begin(), b.dims.end(), [&](int64_t x, int64_t y) { return strides[x] > strides[y]; });
    b.shape.push_back(sizes[b.dims[0]]);
    for (size_t j = 0; j < b.dims.size(); ++j) {
      const int64_t outer = strides[b.dims[j]];
      const int64_t inner = j + 1 < b.dims.size() ? strides[b.dims[j + 1]] : 1;
      const int64_t inner_size = j + 1 < b.dims.size() ? sizes[b.dims[j + 1]] : 1;
      if (outer % inner != 0 || inner_size * inner > outer) return std::nullopt;  // overlapping or uneven
      b.shape.push_back(outer / inner);
      b.box.push_back(sizes[b.dims[j]]);
    }
    b.box.push_back(1);
    b.span = sizes[b.dims[0]] * strides[b.dims[0]];
    return b;
  }

  // The view's dims in its own order, from the blocks' order.
  std::vector<int64_t> to_view_order() const {
    std::vector<int64_t> sorted = dims, perm;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t d : sorted) perm.push_back(std::find(dims.begin(), dims.end(), d) - dims.begin());
    return perm;
  }
};

// storage[offset, offset + span), padded past the storage's end (the padding
// is never part of the view).
Value slab_of(Builder& b, const Value& storage, int64_t offset, int64_t span) {
  const int64_t n = storage.type.numel();
  if (offset == 0 && span == n) return storage;
  if (offset + span <= n) return b.slice(storage, {offset}, {offset + span}, {1});
  return b.pad(b.slice(storage, {offset}, {n}, {1}), b.scalar(0, storage.dtype()), {0}, {offset + span - n}, {0});
}

}  // namespace

void register_rule(std::string op, LoweringRule rule) {
  if (!table().emplace(op, std::move(rule)).second)
    throw std::logic_error("torch_tpu: two lowering rules registered for " + op);
}

const LoweringRule* find_rule(std::string_view op) {
  auto it = table().find(op);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, rule] : table()) ops.push_back(name);
  return ops;
}

namespace {
int category(DType t) { return t == DType::Bool ? 0 : stablehlo::is_complex(t) ? 3 : stablehlo::is_float(t) ? 2 : 1; }
// complex64 / complex128 for a float of the width of float32 / float64 or less.
DType complex_of(DType t) {
  return t == DType::Float64 || t == DType::Complex128 ? DType::Complex128 : DType::Complex64;
}
int rank_within(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::UInt8: return 1;
    case DType::UInt16: return 2;
    case DType::UInt32: return 3;
    case DType::UInt64: return 4;
    case DType::Int8: return 1;
    case DType::Int16: return 2;
    case DType::Int32: return 3;
    case DType::Int64: return 4;
    case DType::Float8E4M3FN:
    case DType::Float8E5M2: return 0;
    case DType::Float16: return 1;
    case DType::BFloat16: return 1;
    case DType::Float32: return 3;
    case DType::Float64: return 4;
    case DType::Complex64: return 3;
    case DType::Complex128: return 4;
  }
  return 0;
}
DType promote_same_priority(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::UInt8 && b == DType::Int8) || (a == DType::Int8 && b == DType::UInt8)) return DType::Int16;
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return rank_within(a) >= rank_within(b) ? a : b;
}
}  // namespace

DType promote_types(DType a, DType b) {
  // complex64 with float64 is complex128: the parts keep the wider float.
  if (stablehlo::is_complex(a) && stablehlo::is_float(b)) return promote_types(a, complex_of(b));
  if (stablehlo::is_complex(b) && stablehlo::is_float(a)) return promote_types(complex_of(a), b);
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  return promote_same_priority(a, b);
}

DType promote(DType a, Operand a_class, DType b, Operand b_class) {
  std::optional<DType> by_class[3];  // Number, ZeroDim, Tensor
  for (auto [t, k] : {std::pair{a, a_class}, std::pair{b, b_class}}) {
    auto& r = by_class[static_cast<int>(k)];
    r = r ? promote_types(*r, t) : t;
  }
  // PyTorch's combine_categories(higher, lower).
  auto combine = [](std::optional<DType> higher, std::optional<DType> lower) -> std::optional<DType> {
    if (!higher) return lower;
    if (!lower || stablehlo::is_complex(*higher)) return higher;
    if (stablehlo::is_complex(*lower)) return stablehlo::is_float(*higher) ? complex_of(*higher) : *lower;
    if (stablehlo::is_float(*higher)) return higher;
    if (*higher == DType::Bool || stablehlo::is_float(*lower)) return promote_types(*higher, *lower);
    return higher;
  };
  return *combine(by_class[2], combine(by_class[1], by_class[0]));
}

Value lowest(Builder& b, DType t) {
  switch (t) {
    case DType::Bool: return b.constant_int(0, {t, {}});
    case DType::UInt8:
    case DType::UInt16:
    case DType::UInt32:
    case DType::UInt64: return b.constant_int(0, {t, {}});
    case DType::Int8: return b.constant_int(INT8_MIN, {t, {}});
    case DType::Int16: return b.constant_int(INT16_MIN, {t, {}});
    case DType::Int32: return b.constant_int(INT32_MIN, {t, {}});
    case DType::Int64: return b.constant_int(INT64_MIN, {t, {}});
    case DType::Float8E4M3FN: return b.scalar(-448, t);  // no infinities
    default: return b.scalar(-INFINITY, t);
  }
}
Value highest(Builder& b, DType t) {
  switch (t) {
    case DType::Bool: return b.constant_int(1, {t, {}});
    case DType::UInt8: return b.constant_int(UINT8_MAX, {t, {}});
    case DType::UInt16: return b.constant_int(UINT16_MAX, {t, {}});
    case DType::UInt32: return b.constant_int(UINT32_MAX, {t, {}});
    case DType::UInt64: return b.constant_int(-1, {t, {}});  // all bits set
    case DType::Int8: return b.constant_int(INT8_MAX, {t, {}});
    case DType::Int16: return b.constant_int(INT16_MAX, {t, {}});
    case DType::Int32: return b.constant_int(INT32_MAX, {t, {}});
    case DType::Int64: return b.constant_int(INT64_MAX, {t, {}});
    case DType::Float8E4M3FN: return b.scalar(448, t);
    default: return b.scalar(INFINITY, t);
  }
}

namespace {
Value extreme(Builder& b, stablehlo::Binary op, const Value& l, const Value& r) {
  if (l.dtype() == DType::Bool)
    return b.binary(op == stablehlo::Binary::Maximum ? stablehlo::Binary::Or : stablehlo::Binary::And, l, r);
  Value m = b.binary(op, l, r);
  if (!stablehlo::is_float(l.dtype())) return m;
  auto is_nan = [&](const Value& x) { return b.compare(stablehlo::Compare::NE, x, x); };
  return b.select(is_nan(l), l, b.select(is_nan(r), r, m));
}
}  // namespace

Value maximum(Builder& b, const Value& l, const Value& r) { return extreme(b, stablehlo::Binary::Maximum, l, r); }
Value minimum(Builder& b, const Value& l, const Value& r) { return extreme(b, stablehlo::Binary::Minimum, l, r); }

int64_t normalize_dim(int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  if (dim < -r || dim >= r)
    throw std::out_of_range("Dimension out of range (expected to be in range of [" + std::to_string(-r) + ", " +
                            std::to_string(r - 1) + "], but got " + std::to_string(dim) + ")");
  return dim < 0 ? dim + r : dim;
}

LoweringRule in_float32(LoweringRule rule, Operands operands) {
  return [rule = std::move(rule), operands](LoweringContext& c) -> std::vector<Value> {
    std::vector<TensorType> wide = c.outputs;
    bool low = false;
    for (TensorType& t : wide) {
      low |= opmath_type(t.dtype) != t.dtype;
      t.dtype = opmath_type(t.dtype);
    }
    if (!low) return rule(c);
    // A tensor operand of another dtype (integers: float16 x int64 [n] is
    // float16) is cast to the narrow dtype first, as TensorIterator casts its
    // inputs to the common dtype: int64 2^62 is inf in float16.
    std::vector<LoweringArg> args = c.args;
    for (LoweringArg& a : args)
      if (operands != Operands::Indices && a.kind == LoweringArg::Tensor && a.tensor.rank() > 0 &&
          a.tensor.dtype() != c.out().dtype && !stablehlo::is_float(a.tensor.dtype()))
        a.tensor = c.b.cast(a.tensor, c.out().dtype);
    LoweringContext w{c.b, args, wide};
    w.bounds = c.bounds;
    if (operands == Operands::Rounded) w.operands_rounded_to = c.out().dtype;
    std::vector<Value> out = rule(w);
    c.checks.insert(c.checks.end(), w.checks.begin(), w.checks.end());
    for (size_t i = 0; i < out.size() && i < c.outputs.size(); ++i)
      if (!out[i].name.empty()) out[i] = c.b.cast(out[i], c.outputs[i].dtype);
    return out;
  };
}

const Value& LoweringContext::tensor(size_t i) const { return arg(args, i, LoweringArg::Tensor, "a tensor").tensor; }
int64_t LoweringContext::integer(size_t i) const {
  // A Scalar read as an int is part of the program too (multi_margin_loss's p).
  if (i < args.size() && args[i].dynamic) throw NeedsStaticScalar{args[i].source};
  return arg(args, i, LoweringArg::Int, "an int").i;
}
double LoweringContext::number(size_t i) const {
  if (i < args.size() && args[i].dynamic) throw NeedsStaticScalar{args[i].source};
  return arg(args, i, LoweringArg::Double, "a number").number();
}
bool LoweringContext::is_number(size_t i, double v) const {
  return i < args.size() && !args[i].dynamic &&
         (args[i].kind == LoweringArg::Double || args[i].kind == LoweringArg::Int ||
          args[i].kind == LoweringArg::Bool) &&
         args[i].number() == v;
}
const std::vector<int64_t>& LoweringContext::ints(size_t i) const {
  return arg(args, i, LoweringArg::IntList, "an int list").ints;
}

Value LoweringContext::value_as(size_t i, const TensorType& type) const {
  const bool value = i < args.size() && (args[i].kind == LoweringArg::Tensor || args[i].dynamic);
  if (operands_rounded_to && stablehlo::is_float(type.dtype)) {
    Value narrow =
        value ? b.cast(args[i].tensor, *operands_rounded_to) : b.constant(number(i), {*operands_rounded_to, {}});
    return b.broadcast_to(b.cast(narrow, type.dtype), type.shape);
  }
  if (value) return b.broadcast_to(b.cast(args[i].tensor, type.dtype), type.shape);
  return b.constant(number(i), type);
}

Value LoweringContext::operand_as_output(size_t i, size_t k) const { return value_as(i, out(k)); }

void LoweringContext::check_value_fits(size_t i) {
  using stablehlo::Compare;
  if (!has(i) || args[i].kind != LoweringArg::Tensor || args[i].dynamic) return;
  const Value& value = tensor(i);
  const DType from = value.dtype(), to = out().dtype;
  // Bool takes any number (Scalar::toBool); complex values are not checked.
  if (to == DType::Bool || from == DType::Bool || stablehlo::is_complex(to) || stablehlo::is_complex(from)) return;
  struct Limits {
    double lowest, max;
    const char* name;  // as CPU's message names the type
  };
  std::optional<Limits> limits;
  switch (to) {
    case DType::Int8: limits = Limits{-128.0, 127.0, "int8_t"}; break;
    case DType::Int16: limits = Limits{-32768.0, 32767.0, "int16_t"}; break;
    case DType::Int32: limits = Limits{-2147483648.0, 2147483647.0, "int"}; break;
    case DType::Int64: limits = Limits{-9223372036854775808.0, 9223372036854775807.0, "int64_t"}; break;
    case DType::UInt8: limits = Limits{0.0, 255.0, "uint8_t"}; break;
    case DType::Float16: limits = Limits{-65504.0, 65504.0, "c10::Half"}; break;
    case DType::BFloat16: limits = Limits{-3.3895313892515355e38, 3.3895313892515355e38, "c10::BFloat16"}; break;
    case DType::Float32: limits = Limits{-3.4028234663852886e38, 3.4028234663852886e38, "float"}; break;
    default: return;
  }
  Value v = b.reshape(value, {});
  Value ok;
  if (stablehlo::is_float(to)) {
    if (!stablehlo::is_float(from) && (to != DType::Float16 || from == DType::UInt8 || from == DType::Int8)) return;
    if (stablehlo::is_float(from) && stablehlo::byte_size(from) <= stablehlo::byte_size(to) &&
        from != DType::BFloat16 && to != DType::BFloat16)
      return;  // a wider type holds every value
    // Infinities and NaN convert; a finite value past the type's largest does not.
    Value x = b.cast(v, from == DType::Float64 ? DType::Float64 : DType::Float32);
    Value big = b.compare(Compare::GT, b.unary(stablehlo::Unary::Abs, x), b.constant(limits->max, x.type));
    ok = b.unary(stablehlo::Unary::Not, b.binary(stablehlo::Binary::And, b.unary(stablehlo::Unary::IsFinite, x), big));
  } else if (stablehlo::is_float(from)) {
    // CPU compares in double; in float32 the largest value not above the
    // limit stands for it (2147483647 is 2^31 in float32, which overflows).
    const DType wide = from == DType::Float64 ? DType::Float64 : DType::Float32;
    double hi = limits->max;
    if (wide == DType::Float32 && static_cast<double>(static_cast<float>(hi)) > hi)
      hi = std::nextafter(static_cast<float>(hi), 0.0f);
    Value x = b.cast(v, wide);  // NaN fails both comparisons
    ok = b.binary(stablehlo::Binary::And, b.compare(Compare::GE, x, b.constant(limits->lowest, x.type)),
                  b.compare(Compare::LE, x, b.constant(hi, x.type)));
  } else {
    // Integers: an unsigned type also takes negatives down to -max (they wrap).
    if (to == DType::Int64) return;
    Value x = b.cast(v, DType::Int64);
    const double lowest = stablehlo::is_unsigned_int(to) ? -limits->max : limits->lowest;
    ok = b.binary(stablehlo::Binary::And,
                  b.compare(Compare::GE, x, b.constant_int(static_cast<int64_t>(lowest), x.type)),
                  b.compare(Compare::LE, x, b.constant_int(static_cast<int64_t>(limits->max), x.type)));
  }
  checks.push_back({ok, std::string("value cannot be converted to type ") + limits->name + " without overflow", false});
}

void LoweringContext::check_indices(const Value& index, int64_t size, bool allow_negative, const std::string& message,
                                    bool index_error) {
  if (index.type.numel() == 0) return;
  Value i = b.cast(index, DType::Int64);
  Value low = b.compare(stablehlo::Compare::GE, i, b.constant_int(allow_negative ? -size : 0, i.type));
  Value high = b.compare(stablehlo::Compare::LT, i, b.constant_int(size, i.type));
  std::vector<int64_t> all;
  for (int64_t d = 0; d < i.rank(); ++d) all.push_back(d);
  Value ok =
      b.reduce(b.binary(stablehlo::Binary::And, low, high), b.scalar(1, DType::Bool), all, stablehlo::Binary::And);
  checks.push_back({ok, message, index_error});
}

std::vector<int64_t> memory_order(const Shape& sizes, const std::vector<int64_t>& strides) {
  if (strides.size() != sizes.size()) return {};  // none given: row-major
  int64_t numel = 1;
  for (int64_t n : sizes) numel *= n;
  if (numel == 0 || row_major(sizes, strides)) return {};
  return dense_memory_order(sizes, strides, 0, numel);
}

bool is_dense(const Shape& sizes, const std::vector<int64_t>& strides) {
  if (strides.size() != sizes.size()) return false;
  int64_t numel = 1;
  for (int64_t n : sizes) numel *= n;
  return numel == 0 || row_major(sizes, strides) || !dense_memory_order(sizes, strides, 0, numel).empty();
}

Value strided_read(Builder& b, const Value& storage, const Shape& sizes, const std::vector<int64_t>& strides,
                   int64_t offset) {
  TensorType view{storage.dtype(), sizes};
  int64_t numel = view.numel();
  if (numel == 0) return b.slice(storage, {0}, {0}, {1});
  if (row_major(sizes, strides)) {
    if (offset == 0 && numel == storage.type.numel()) return storage;
    return b.slice(storage, {offset}, {offset + numel}, {1});
  }
  if (auto order = dense_memory_order(sizes, strides, offset, storage.type.numel()); !order.empty()) {
    Value in_memory_order = b.reshape(storage, permuted(sizes, order));
    return b.reshape(b.transpose(in_memory_order, inverse_permutation(order)), {numel});
  }
  if (auto blocks = Blocks::of(sizes, strides)) {
    Value in_blocks = b.reshape(slab_of(b, storage, offset, blocks->span), blocks->shape);
    Value box = b.slice(in_blocks, std::vector<int64_t>(blocks->box.size(), 0), blocks->box,
                        std::vector<int64_t>(blocks->box.size(), 1));
    Shape dims_sizes(blocks->box.begin(), blocks->box.end() - 1);
    return b.reshape(b.transpose(b.reshape(box, dims_sizes), blocks->to_view_order()), {numel});
  }
  Value index = flat_indices(b, storage.type.numel(), sizes, strides, offset);
  return b.reshape(b.gather_1d(storage, index), {numel});
}

Value strided_write(Builder& b, const Value& storage, const Value& update, const Shape& sizes,
                    const std::vector<int64_t>& strides, int64_t offset) {
  TensorType view{storage.dtype(), sizes};
  int64_t numel = view.numel();
  if (numel == 0) return storage;
  if (row_major(sizes, strides)) {
    if (offset == 0 && numel == storage.type.numel()) return update;
    return b.dynamic_update_slice(storage, update, {b.constant_int(offset, {DType::Int64, {}})});
  }
  if (auto order = dense_memory_order(sizes, strides, offset, storage.type.numel()); !order.empty())
    return b.reshape(b.transpose(b.reshape(update, sizes), order), {numel});
  if (auto blocks = Blocks::of(sizes, strides)) {
    const std::vector<int64_t> to_view = blocks->to_view_order();
    Shape view_sizes;  // the update's dims of size > 1, in the view's order
    for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d)
      if (sizes[d] != 1) view_sizes.push_back(sizes[d]);
    Value box = b.reshape(b.transpose(b.reshape(update, view_sizes), inverse_permutation(to_view)), blocks->box);
    Value in_blocks = b.reshape(slab_of(b, storage, offset, blocks->span), blocks->shape);
    std::vector<Value> origin(blocks->box.size(), b.constant_int(0, {DType::Int64, {}}));
    Value slab = b.reshape(b.dynamic_update_slice(in_blocks, box, origin), {blocks->span});
    const int64_t inside = std::min(blocks->span, storage.type.numel() - offset);
    if (inside < blocks->span) slab = b.slice(slab, {0}, {inside}, {1});
    if (offset == 0 && inside == storage.type.numel()) return slab;
    return b.dynamic_update_slice(storage, slab, {b.constant_int(offset, {DType::Int64, {}})});
  }
  Value index = flat_indices(b, storage.type.numel(), sizes, strides, offset);
  return b.scatter_1d(storage, index, b.reshape(update, sizes));
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

}  // namespace torch_tpu::lowering
