// The lowering registry: aten op overload name ("aten::add.Tensor") -> a rule
// that builds the op's StableHLO. One table serves every execution path.
// Torch-free: the general kernel translates the op's arguments into
// LoweringArgs and the meta kernel's outputs into TensorTypes.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "stablehlo/builder.h"

namespace torch_tpu::lowering {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::Shape;
using stablehlo::TensorType;
using stablehlo::Value;

// One argument of the op, in schema order. Tensors are values of the module;
// everything else is static (part of the executable's cache key).
struct LoweringArg {
  enum Kind { None, Tensor, TensorList, Int, Double, Bool, IntList, String, NumberList } kind = None;
  Value tensor;
  std::vector<Value> tensors;
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::vector<int64_t> ints;
  std::string s;
  std::vector<double> numbers;  // a Scalar[] argument
  // A Scalar (or Scalar[]) whose value is a runtime input of the program, so
  // that a value changing every call (a learning rate, a bias correction) does
  // not compile a program per value. `tensor` holds it (0-d, or 1-D for a
  // list); `source` is the argument's position in the op's schema.
  bool dynamic = false;
  int source = -1;
  // A Tensor that is a Python number PyTorch wrapped (x + 2 as add.Tensor):
  // it promotes as a number does.
  bool wrapped_number = false;
  // A Tensor's layout is PyTorch-contiguous (what a few CPU kernels branch on:
  // _linalg_det factors A^T then, and its backward relies on it).
  bool contiguous = true;

  // A Scalar argument as a double, whatever its kind.
  double number() const { return kind == Double ? d : kind == Bool ? (b ? 1 : 0) : static_cast<double>(i); }
};

// Thrown when a rule asks for the compile-time value of a dynamic Scalar: the
// general kernel then keeps that argument of the op static (in the program's
// key) and lowers again.
struct NeedsStaticScalar {
  int arg;
};

// Bounded dynamic shapes (README): a tensor argument read padded. Each of
// its dims is the row-major merge of one or more padded parts; a bounded
// part's real size is a runtime value, and the elements past it are padding
// of any value.
struct BoundedPart {
  int64_t padded = 1;  // the part's size in the padded value
  Value real;          // its real size, 0-d int32; no name: static (all real)
};
using BoundedDims = std::vector<std::vector<BoundedPart>>;  // per dim, outermost part first

struct LoweringContext {
  Builder& b;
  const std::vector<LoweringArg>& args;
  const std::vector<TensorType>& outputs;  // from PyTorch's meta kernel

  const Value& tensor(size_t i) const;
  bool has(size_t i) const { return i < args.size() && args[i].kind != LoweringArg::None; }
  int64_t integer(size_t i) const;
  // A Scalar's value at compile time (a dynamic Scalar becomes static).
  double number(size_t i) const;
  // Whether argument `i` is known at compile time to be the number `v`
  // (false for a dynamic Scalar): for shortcuts such as alpha == 1.
  bool is_number(size_t i, double v) const;
  const std::vector<int64_t>& ints(size_t i) const;
  // An optional string argument, "" when None.
  std::string string(size_t i) const { return has(i) ? args[i].s : std::string(); }
  const TensorType& out(size_t k = 0) const { return outputs.at(k); }

  // Operand `i` converted to the output dtype and broadcast to the output shape:
  // what elementwise rules start from (PyTorch already decided both).
  Value operand_as_output(size_t i, size_t k = 0) const;
  // Argument `i` (a tensor or a Scalar, static or dynamic) as a value of `type`.
  Value value_as(size_t i, const TensorType& type) const;

  // Device-side checks the op's program also computes: each a 0-d bool that
  // must be true, raised as IndexError with its message (at the op in Debug
  // mode, at the next sync or host read in Strict mode, like CUDA's asserts).
  struct Check {
    Value ok;
    std::string message;
    // CPU raises IndexError for this check (index_select, x[i], embedding),
    // else RuntimeError (gather, scatter, index_add, random ops' arguments).
    bool index_error = true;
  };
  std::vector<Check> checks{};
  // CPU reads a tensor value (argument `i`) of fill_ / masked_fill /
  // index_fill as a Scalar and refuses one the output dtype cannot hold
  // (c10::checked_convert): "value cannot be converted to type int without
  // overflow". The same as a device check; a Python number (a static or
  // dynamic Scalar) is checked on the host.
  void check_value_fits(size_t i);
  // Every entry of integer `index` lies in [0, size), or [-size, size) when
  // negative indices count from the end.
  void check_indices(const Value& index, int64_t size, bool allow_negative, const std::string& message,
                     bool index_error = true);

  // Per argument: its bounded dims when it is a padded tensor, else empty.
  // Null when no argument is padded (every program but a bounded one).
  const std::vector<BoundedDims>* bounds = nullptr;
  // Tensor argument `i` with its padding set to the 0-d `fill` (the
  // identity of what a rule reduces): the tensor itself when not padded.
  Value masked(size_t i, const Value& fill) const;
  // How many real elements tensor argument `i` has over `dims`, a 0-d value
  // of `dtype` (a mean's divisor): a constant unless a dim is bounded.
  Value count(size_t i, const std::vector<int64_t>& dims, DType dtype) const;
  // Set by in_float32(rule, Operands::Rounded): operands of another dtype
  // (Scalars, 0-d tensors) are rounded to this one, the op's narrow dtype,
  // before value_as widens them.
  std::optional<DType> operands_rounded_to = std::nullopt;
};

// Where an element of a padded value of `shape` with these dims is real: a bool tensor of `shape`.
Value real_elements(Builder& b, const BoundedDims& dims, const Shape& shape);

// Thrown by a rule that cannot lower this use of its op (a shape that depends
// on the data, a mode not written yet): the op then runs on the CPU fallback.
struct Declined : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by a bounded rule (find_bounded_rule) for a use it cannot run on
// padded values (a layer norm over a bounded dim): the op reads exact shapes.
struct NotBounded : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using LoweringRule = std::function<std::vector<Value>(LoweringContext&)>;

// Whether `op`'s rule is written for complex values (csrc/lowering/complex.cpp);
// the others decline them.
bool takes_complex(std::string_view op);

void register_rule(std::string op, LoweringRule rule);
const LoweringRule* find_rule(std::string_view op);
// The rule an op that is not pointwise runs with on padded values
// (csrc/lowering/bounded.cpp): it fills the padding of what it reduces or
// contracts. nullptr: the op reads exact shapes (its padded inputs are cut
// to their real sizes first), one program per size.
const LoweringRule* find_bounded_rule(std::string_view op);
std::vector<std::string> registered_ops();

// An op whose body is a function written outside this table: a kernel in
// JAX (torch_tpu.jax_op). Its schema is (Tensor[] inputs, str statics) ->
// Tensor[]; `lower` gives, per statics and input types, the functions to
// add to the module (Builder::add_function) and the one to call. Lowered
// once per signature, then kept. Registering an op again replaces its lowerer.
struct ForeignFunction {
  std::string entry;
  std::vector<std::pair<std::string, std::string>> functions;  // (name, func.func text)
  std::vector<TensorType> results;
};
using ForeignLowerer =
    std::function<ForeignFunction(const std::string& statics, const std::vector<TensorType>& inputs)>;
void register_foreign_op(const std::string& op, ForeignLowerer lower);

// The type PyTorch computes a dtype's math in (its opmath / accumulation
// type): float32 for bfloat16 and float16, the dtype itself otherwise.
inline DType opmath_type(DType t) {
  return t == DType::BFloat16 || t == DType::Float16 || t == DType::Float8E4M3FN || t == DType::Float8E5M2
             ? DType::Float32
             : t;
}

// How a rule computed in float32 reads an operand of another dtype than its
// output (a Scalar, a 0-d float32 tensor): exactly (the kernels of mul, div,
// lerp and the activations read it as float), or first rounded to the op's
// dtype (add, sub, remainder: TensorIterator casts it to the common dtype).
// Either way an integer tensor of rank > 0 is an operand TensorIterator casts
// to the op's dtype first, unless the op takes integer tensors as Indices
// (segment_reduce's lengths).
enum class Operands { Exact, Rounded, Indices };

// `rule` computed in float32 where the outputs are bfloat16 or float16 and
// rounded once at the end (PyTorch's opmath: what its CPU and CUDA kernels
// do): a formula of several ops (gelu, lerp, or log2 and sigmoid, which XLA
// expands) rounded at every step would lose digits (1 + erf(x) near -1), and
// `x * 0.1` would multiply by 0.1 rounded to the narrow type.
LoweringRule in_float32(LoweringRule rule, Operands operands = Operands::Exact);

// Static registration, one line per op next to its rule.
struct RuleRegistrar {
  RuleRegistrar(std::string op, LoweringRule rule) { register_rule(std::move(op), std::move(rule)); }
};
#define TORCH_TPU_CONCAT_(a, b) a##b
#define TORCH_TPU_CONCAT(a, b) TORCH_TPU_CONCAT_(a, b)
#define LOWERING(op, rule) \
  static const ::torch_tpu::lowering::RuleRegistrar TORCH_TPU_CONCAT(lowering_rule_, __LINE__)(op, rule)

// How an operand takes part in PyTorch's type promotion (ResultTypeState):
// tensors with dimensions decide, then 0-d tensors, then Python numbers (whose
// dtype is float32, int64 or bool); a later class only lifts the result to a
// higher category.
enum class Operand { Number, ZeroDim, Tensor };
DType promote(DType a, Operand a_class, DType b, Operand b_class);
// torch.promote_types: the smallest dtype both fit in.
DType promote_types(DType a, DType b);

// The smallest / largest value of a dtype (0-d): the identities of max / min,
// and what max pooling pads with. -inf / +inf for floats.
Value lowest(Builder& b, DType t);
Value highest(Builder& b, DType t);

// max / min of two values of one type as PyTorch computes them: a NaN in
// either wins (XLA CPU's maximum returns the second operand when it is NaN),
// and on bool they are or / and. Every max-, min- and clamp-like rule uses them.
Value maximum(Builder& b, const Value& l, const Value& r);
Value minimum(Builder& b, const Value& l, const Value& r);

// x.shape[:dim] + index.shape + x.shape[dim+1:]: the rows of `dim` of `x`
// picked by the integer `index` (in range).
Value take_along(Builder& b, const Value& x, int64_t dim, const Value& index);
// torch.gather's pick along `dim`: index has x's rank and its other dims' sizes.
Value gather_along(Builder& b, const Value& x, int64_t dim, const Value& index);

// Inclusive scan of `x` along `dim` with the associative `op` and its identity.
Value scan(Builder& b, Value x, int64_t dim, stablehlo::Binary op, double identity);
// "l goes before r" when sorting (a sort comparator): NaN above every number,
// as PyTorch sorts; ties keep their order when the sort is stable.
Value before(Builder& b, const Value& l, const Value& r, bool descending);

// A dimension argument normalized to [0, rank).
int64_t normalize_dim(int64_t dim, int64_t rank);

// The order of a layout's dims in memory, outermost first (dims by
// decreasing stride), when it is dense and not row-major: what a result laid
// out like PyTorch's (x.t() + 1, channels_last) is transposed to before it is
// flattened into its storage. Empty for row-major or non-dense layouts.
std::vector<int64_t> memory_order(const Shape& sizes, const std::vector<int64_t>& strides);
// The permutation that undoes `perm` (inverse[perm[i]] = i): a transpose's way back.
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);
// Whether (sizes, strides) lay out every element exactly once, in some order of the dims.
bool is_dense(const Shape& sizes, const std::vector<int64_t>& strides);

// Shorthands for elementwise math on same-typed values.
struct Math {
  Builder& b;
  Value add(const Value& x, const Value& y) { return b.binary(stablehlo::Binary::Add, x, y); }
  Value sub(const Value& x, const Value& y) { return b.binary(stablehlo::Binary::Subtract, x, y); }
  Value mul(const Value& x, const Value& y) { return b.binary(stablehlo::Binary::Multiply, x, y); }
  Value div(const Value& x, const Value& y) { return b.binary(stablehlo::Binary::Divide, x, y); }
  Value k(double v, const Value& like) { return b.constant(v, like.type); }
  // A 0-d value broadcast to `like`'s shape, in its dtype.
  Value bcast(const Value& scalar, const Value& like) {
    return b.broadcast_to(b.cast(b.reshape(scalar, {}), like.dtype()), like.shape());
  }
};

// torch.linspace's values from 0-d start and end (of a float dtype) in steps:
// CPU's formula, each half counted from its own end.
Value spaced_values(Builder& b, const Value& start, const Value& end, int64_t steps);

// Builds the program that reads a strided view of a flat storage value as a
// flat dense array of the view's elements (row-major).
Value strided_read(Builder& b, const Value& storage, const Shape& sizes, const std::vector<int64_t>& strides,
                   int64_t offset);
// Builds the program that writes a flat dense `update` into the strided view
// of `storage`, returning the new storage value.
Value strided_write(Builder& b, const Value& storage, const Value& update, const Shape& sizes,
                    const std::vector<int64_t>& strides, int64_t offset);

}  // namespace torch_tpu::lowering
