// A StableHLO module builder: typed values and ops, emitted as MLIR text in
// the generic op form (stable across StableHLO versions). Every op infers its
// result type and refuses a malformed use with std::invalid_argument naming
// the op and the operand types, so bad programs fail here, not in the plugin.
// Knows nothing of torch or PJRT.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torch_tpu::stablehlo {

// New dtypes go last: a dtype's number is part of the disk cache's keys.
enum class DType {
  Bool,
  Int8,
  Int16,
  Int32,
  Int64,
  UInt8,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Complex64,
  Complex128,
  UInt16,
  UInt32,
  UInt64,
  Float8E4M3FN,
  Float8E5M2
};

bool is_float(DType t);  // real floating point (not complex)
bool is_complex(DType t);
// The real type of a complex one's parts (complex64 -> float32); the dtype itself otherwise.
DType real_part_type(DType t);
bool is_signed_int(DType t);
bool is_unsigned_int(DType t);  // uint8 .. uint64 (not bool)
size_t byte_size(DType t);
std::string mlir_name(DType t);  // "f32", "i1", "ui8", ...

using Shape = std::vector<int64_t>;

struct TensorType {
  DType dtype = DType::Float32;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  std::string str() const;  // "tensor<2x3xf32>"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// An SSA value of the module being built.
struct Value {
  std::string name;  // "%3"
  TensorType type;
  DType dtype() const { return type.dtype; }
  const Shape& shape() const { return type.shape; }
  int64_t rank() const { return type.rank(); }
};

enum class Unary {
  Abs,
  Negate,
  Exp,
  Expm1,
  Log,
  Log1p,
  Sqrt,
  Rsqrt,
  Tanh,
  Logistic,
  Floor,
  Ceil,
  Sign,
  Not,
  Cos,
  Sin,
  Tan,
  RoundNearestEven,
  RoundNearestAfz,
  IsFinite,
  Cbrt,
  // CHLO ops: XLA expands them; StableHLO has no primitive for these.
  Erf,
  Erfc,
  ErfInv,
  Lgamma,
  Digamma,
  Asin,
  Acos,
  Atan,
  Sinh,
  Cosh,
  Asinh,
  Acosh,
  Atanh
};
enum class Binary {
  Add,
  Subtract,
  Multiply,
  Divide,
  Remainder,
  Maximum,
  Minimum,
  Power,
  And,
  Or,
  Xor,
  Atan2,
  ShiftLeft,
  ShiftRightArithmetic,
  ShiftRightLogical,
  // CHLO ops on floats: XLA expands them.
  NextAfter,  // the next float after a toward b
  Polygamma,  // polygamma(n, x), n a whole number of x's type
  Zeta        // Hurwitz zeta(x, q)
};
enum class Compare { EQ, NE, LT, LE, GT, GE };

// stablehlo.fft's kinds. IFFT and IRFFT divide by the signal's size, as numpy does.
enum class FftType { FFT, IFFT, RFFT, IRFFT };

// The dimension numbers of stablehlo.gather (see the StableHLO spec).
struct GatherDims {
  std::vector<int64_t> offset_dims;
  std::vector<int64_t> collapsed_slice_dims;
  std::vector<int64_t> operand_batching_dims;
  std::vector<int64_t> start_indices_batching_dims;
  std::vector<int64_t> start_index_map;
  int64_t index_vector_dim = 0;
};

// The dimension numbers of stablehlo.scatter (see the StableHLO spec).
struct ScatterDims {
  std::vector<int64_t> update_window_dims;
  std::vector<int64_t> inserted_window_dims;
  std::vector<int64_t> input_batching_dims;
  std::vector<int64_t> scatter_indices_batching_dims;
  std::vector<int64_t> scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
};

// How scatter combines an update with the value already there.
enum class ScatterCombine { Replace, Add, Multiply, Maximum, Minimum };

// The dimension numbers of stablehlo.convolution: which dimension of each
// operand is batch / feature, and the spatial dimensions in order.
struct ConvDims {
  int64_t lhs_batch = 0, lhs_feature = 1;
  std::vector<int64_t> lhs_spatial;
  int64_t rhs_input_feature = 1, rhs_output_feature = 0;
  std::vector<int64_t> rhs_spatial;
  int64_t out_batch = 0, out_feature = 1;
  std::vector<int64_t> out_spatial;
  // PyTorch's layout: N, C, spatial... for input/output and O, I, spatial... for weights.
  static ConvDims nchw(int64_t spatial_rank);
};

class Builder {
 public:
  // A function argument, in order of creation.
  Value parameter(const TensorType& type);
  // The whole module with `results` returned by @main. `aliases` pairs a
  // parameter with the result that may reuse its buffer (tf.aliasing_output):
  // a donated input becomes that output without a copy.
  std::string module(const std::vector<Value>& results,
                     const std::vector<std::pair<size_t, size_t>>& aliases = {}) const;
  // Drops the ops `results` do not depend on and the parameters no kept op
  // reads; returns, per parameter in order of creation, whether it stays.
  // An op's program then takes no buffer for an input it ignores (fill_'s
  // self): a never-written storage needs no value for it.
  std::vector<bool> prune(const std::vector<Value>& results);

  // A function of the module besides @main (a kernel written in JAX): `text`
  // is one func.func op, private, named @`name`, with every function it calls
  // added too. A name already added is kept (names are content hashes). The
  // module prints each after @main behind a `// function @name` line, which
  // is how a Fused window finds them again (FusedWindow::signature).
  void add_function(const std::string& name, const std::string& text);
  // func.call @`name`: its results typed `results`.
  std::vector<Value> call(const std::string& name, const std::vector<Value>& args,
                          const std::vector<TensorType>& results);

  // A splat constant: every element is `v` converted to `type.dtype`.
  Value constant(double v, const TensorType& type);
  Value constant_int(int64_t v, const TensorType& type);
  // A scalar (0-d) constant.
  Value scalar(double v, DType dtype) { return constant(v, {dtype, {}}); }
  Value iota(const TensorType& type, int64_t dimension);

  Value unary(Unary op, const Value& x);
  Value binary(Binary op, const Value& a, const Value& b);
  Value compare(Compare dir, const Value& a, const Value& b);
  Value select(const Value& pred, const Value& on_true, const Value& on_false);
  Value clamp(const Value& lo, const Value& x, const Value& hi);
  // `x` as it is, behind an optimization barrier: XLA's CPU backend always lets
  // LLVM fuse a multiply into the add that reads it (one rounding, where
  // PyTorch rounds the product, then the sum); a barrier keeps them apart.
  Value rounded(const Value& x);
  // A complex value converted to a real dtype keeps its real part (as PyTorch's casts do).
  Value convert(const Value& x, DType to);
  // The discrete Fourier transform over the innermost `length.size()` (1 to 3)
  // dimensions, of signal sizes `length` (RFFT: the real input's; IRFFT: the real output's).
  Value fft(const Value& x, FftType type, const std::vector<int64_t>& length);
  // The parts of a complex value, and a complex value from its parts.
  Value real(const Value& x);
  Value imag(const Value& x);
  Value complex(const Value& re, const Value& im);
  Value bitcast_convert(const Value& x, const TensorType& to);

  Value broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims);
  Value reshape(const Value& x, const Shape& shape);
  Value transpose(const Value& x, const std::vector<int64_t>& permutation);
  Value slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides);
  Value dynamic_slice(const Value& x, const std::vector<Value>& start, const std::vector<int64_t>& sizes);
  Value dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& start);
  Value concatenate(const std::vector<Value>& xs, int64_t dimension);
  Value dot_general(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lhs_batch,
                    const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                    const std::vector<int64_t>& rhs_contract);
  // Reduces `x` over `dims` with the associative `op`, starting from `init` (0-d).
  Value reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims, Binary op);
  // result[i] = operand[indices[i]] for a 1-D operand and integer indices of any shape.
  Value gather_1d(const Value& operand, const Value& indices);
  // operand with operand[indices[i]] = updates[i]; indices and updates share a shape.
  Value scatter_1d(const Value& operand, const Value& indices, const Value& updates);

  // Conveniences built from the ops above.
  Value broadcast_to(const Value& x, const Shape& shape);  // numpy-style, trailing-aligned
  Value cast(const Value& x, DType to) { return x.dtype() == to ? x : convert(x, to); }

  // General gather: slices of `slice_sizes` starting at the integer
  // `start_indices`, laid out by `dims`. Out-of-range starts are clamped (XLA).
  Value gather(const Value& operand, const Value& start_indices, const GatherDims& dims,
               const std::vector<int64_t>& slice_sizes, bool indices_are_sorted = false);
  // General scatter: `operand` with `updates` combined in at `scatter_indices`,
  // laid out by `dims`. Out-of-range updates are dropped (XLA). On booleans,
  // Add and Maximum mean or, Multiply and Minimum mean and.
  Value scatter(const Value& operand, const Value& scatter_indices, const Value& updates, const ScatterDims& dims,
                ScatterCombine combine, bool indices_are_sorted = false, bool unique_indices = false);
  // Edge padding `low`/`high` (negative crops) and `interior` padding (>= 0)
  // with the 0-d `padding_value`.
  Value pad(const Value& x, const Value& padding_value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
  // x with the order of elements reversed along each of `dims`.
  Value reverse(const Value& x, const std::vector<int64_t>& dims);
  // The Cholesky factor of each matrix of the batch [..., n, n], from its
  // lower (or upper) triangle; the other triangle of the result is undefined,
  // and a matrix that is not positive-definite gives NaNs from its failing minor on.
  Value cholesky(const Value& a, bool lower);
  // Solves op(a) x = b (left_side) or x op(a) = b for x, with a triangular
  // [..., n, n] and b [..., n, k] / [..., k, n] of the same batch.
  // op(a) is a, its transpose, or its conjugate transpose (adjoint).
  enum class TriangularOp { None, Transpose, Adjoint };
  Value triangular_solve(const Value& a, const Value& b, bool left_side, bool lower, bool unit_diagonal,
                         TriangularOp op);

 private:
  Value emit(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
             const TensorType& result, const std::string& region = "");
  std::string fresh();

  std::vector<Value> params_;
  std::vector<std::string> body_;
  std::vector<std::pair<std::string, std::string>> functions_;  // (name, text), in order added
  int next_ = 0;

  // ---- Convolution.
 public:
  // stablehlo.convolution. padding holds (low, high) per spatial dimension;
  // negative padding crops. The result shape is inferred.
  Value convolution(const Value& lhs, const Value& rhs, const ConvDims& dims,
                    const std::vector<int64_t>& window_strides, const std::vector<std::pair<int64_t, int64_t>>& padding,
                    const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                    int64_t feature_group_count, int64_t batch_group_count);

  // ---- Ops with a region and several results: variadic reduce, sort.
 public:
  // Builds a region's body with this builder: it gets the block arguments
  // (0-d values) and returns the values the region yields. A region is
  // isolated from above: its body may use only its arguments and what it builds.
  using RegionBody = std::function<std::vector<Value>(Builder&, const std::vector<Value>& args)>;

  // Reduces N operands of one shape together over `dims`, from N 0-d inits
  // (init k has operand k's dtype). `body` gets (acc_0..acc_{N-1},
  // x_0..x_{N-1}) and returns N values typed like the inits; it must be
  // associative and commutative (XLA may combine in any order).
  std::vector<Value> reduce(const std::vector<Value>& xs, const std::vector<Value>& inits,
                            const std::vector<int64_t>& dims, const RegionBody& body);
  // Sorts N operands of one shape together along `dimension`. `comparator` gets
  // (lhs_0, rhs_0, lhs_1, rhs_1, ...) and returns one 0-d i1: true when lhs
  // goes before rhs (a strict weak order). Stable keeps equal elements in order.
  std::vector<Value> sort(const std::vector<Value>& xs, int64_t dimension, bool is_stable,
                          const RegionBody& comparator);
  // stablehlo.while: threads `state` through `body` (which returns the next
  // state, same types) while `condition` (which returns one 0-d i1) holds.
  // Both regions see only the state.
  std::vector<Value> while_loop(const std::vector<Value>& state, const RegionBody& condition, const RegionBody& body);

 private:
  // The text of a region with block arguments of `arg_types`, built by `body`.
  std::string region(const std::string& op, const std::vector<TensorType>& arg_types, const RegionBody& body,
                     const std::vector<TensorType>& yields);
  std::vector<Value> emit_results(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
                                  const std::vector<TensorType>& results, const std::string& region);

  // ---- Windowed reductions.
 public:
  // stablehlo.reduce_window: N operands of one shape reduced over sliding
  // windows, from N 0-d inits, with a body as for the variadic reduce
  // (associative and commutative). Per dimension: window size, stride, base
  // and window dilation (empty = all 1) and (low, high) padding, which holds
  // the inits. The result shape is inferred.
  std::vector<Value> reduce_window(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                   const std::vector<int64_t>& window_dimensions,
                                   const std::vector<int64_t>& window_strides,
                                   const std::vector<int64_t>& base_dilations,
                                   const std::vector<int64_t>& window_dilations,
                                   const std::vector<std::pair<int64_t, int64_t>>& padding, const RegionBody& body);

  // ---- Constants of given elements.
 public:
  // A constant holding `values` (row-major, one per element of `type`), each
  // converted to `type.dtype` and written exactly as the splat constant writes it.
  Value constant_array(const std::vector<double>& values, const TensorType& type);
  Value constant_array_int(const std::vector<int64_t>& values, const TensorType& type);

 private:
  Value constant_elements(const std::vector<std::string>& literals, const TensorType& type);

  // ---- Collectives. The module runs as one partition per device of a group
  // (set_partitions), and each collective spans every partition, in group order.
 public:
  void set_partitions(int64_t n);
  int64_t partitions() const { return partitions_; }
  // Every partition gets x combined over all of them; `combine` gets two 0-d
  // values of x's dtype and returns their combination.
  Value all_reduce(const Value& x, const RegionBody& combine);
  // The partitions' x concatenated along `dimension`, in group order.
  Value all_gather(const Value& x, int64_t dimension);
  // all_reduce, then partition p keeps block p of `dimension` (its size divided by the group size).
  Value reduce_scatter(const Value& x, int64_t dimension, const RegionBody& combine);
  // Partition p sends block q of `dimension` to partition q and gets the blocks
  // sent to it concatenated in group order.
  Value all_to_all(const Value& x, int64_t dimension);

 private:
  // replica_groups (every partition, in order) and a fresh channel handle.
  std::string group_attrs();
  int64_t partitions_ = 1;
  int64_t next_channel_ = 1;

  // ---- SPMD: a program written over whole values, which XLA's partitioner
  // (Shardy) splits over the partitions of a device mesh by their shardings,
  // inserting the collectives itself. Partition p is mesh position p, row-major.
  // A sharding names, per dimension of a value, the mesh axes cutting it
  // (major first); a dimension with none, and every axis not named, replicate.
 public:
  using Sharding = std::vector<std::vector<int>>;
  void set_mesh(std::vector<int64_t> axis_sizes);
  void set_parameter_sharding(const Value& parameter, const Sharding& sharding);
  // Every result of module() whole on every partition.
  void replicate_results() { replicate_results_ = true; }
  // `x`, laid out as `sharding` from here on (JAX's with_sharding_constraint).
  Value sharding_constraint(const Value& x, const Sharding& sharding);

 private:
  std::string sdy_sharding(const Sharding& sharding) const;
  std::vector<int64_t> mesh_;
  std::map<std::string, std::string> parameter_shardings_;  // by parameter name
  bool replicate_results_ = false;

  // ---- Random bits.
 public:
  enum class RngAlgorithm { ThreeFry, Philox };
  // stablehlo.rng_bit_generator. `state` holds the bits of the generator's
  // ui64 state as int64 (ThreeFry: [key, counter]; Philox: 2 or 3 words).
  // Returns {the next state, same type; random bits of `shape`}, with `bits`
  // Int32 or Int64: XLA's unsigned words reinterpreted, every pattern equally
  // likely. The algorithm is named, never DEFAULT, so every plugin draws the
  // same numbers from the same state.
  std::pair<Value, Value> rng_bit_generator(const Value& state, const Shape& shape, DType bits,
                                            RngAlgorithm algorithm = RngAlgorithm::ThreeFry);
};

}  // namespace torch_tpu::stablehlo
