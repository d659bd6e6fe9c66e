#include "collectives/programs.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace torch_tpu::collectives {
namespace {

using stablehlo::Binary;
using stablehlo::Builder;
using stablehlo::Compare;
using stablehlo::Value;

// The combining region of a reduction on 0-d values of `dtype`. Bool sums
// and maxima are "or", products and minima "and" (as NCCL on bool); float
// max/min propagate NaN, as torch.maximum does.
Builder::RegionBody combiner(Reduction r, DType dtype) {
  const bool is_bool = dtype == DType::Bool;
  auto binary = [](Binary op) {
    return [op](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{b.binary(op, a[0], a[1])}; };
  };
  switch (r) {
    case Reduction::Sum:
    case Reduction::Avg: return binary(is_bool ? Binary::Or : Binary::Add);
    case Reduction::Product: return binary(is_bool ? Binary::And : Binary::Multiply);
    case Reduction::BitAnd: return binary(Binary::And);
    case Reduction::BitOr: return binary(Binary::Or);
    case Reduction::BitXor: return binary(Binary::Xor);
    case Reduction::Max:
    case Reduction::Min: {
      const Binary op =
          r == Reduction::Max ? (is_bool ? Binary::Or : Binary::Maximum) : (is_bool ? Binary::And : Binary::Minimum);
      if (!stablehlo::is_float(dtype)) return binary(op);
      return [op](Builder& b, const std::vector<Value>& a) {
        Value m = b.binary(op, a[0], a[1]);
        m = b.select(b.compare(Compare::NE, a[1], a[1]), a[1], m);
        return std::vector<Value>{b.select(b.compare(Compare::NE, a[0], a[0]), a[0], m)};
      };
    }
  }
  throw std::logic_error("collectives: unknown reduction");
}

// Whether XLA's collectives take `r` on `dtype` as their region (backends
// implement the plain add/multiply/min/max kinds); otherwise the program
// moves the data and reduces it locally with the exact combiner.
bool native(Reduction r, DType dtype) {
  if (dtype == DType::Bool) return false;
  if (stablehlo::is_float(dtype)) return r == Reduction::Sum || r == Reduction::Avg || r == Reduction::Product;
  return r == Reduction::Sum || r == Reduction::Avg || r == Reduction::Product || r == Reduction::Min ||
         r == Reduction::Max;
}

// The identity of `r` on `dtype`, as a 0-d constant.
Value identity(Builder& b, Reduction r, DType dtype) {
  const stablehlo::TensorType scalar{dtype, {}};
  const bool is_float = stablehlo::is_float(dtype);
  const double inf = std::numeric_limits<double>::infinity();
  const int bits = static_cast<int>(stablehlo::byte_size(dtype)) * 8;
  const bool is_unsigned = stablehlo::is_unsigned_int(dtype) || dtype == DType::Bool;
  switch (r) {
    case Reduction::Product: return b.constant(1, scalar);
    case Reduction::BitAnd:
      return dtype == DType::Bool ? b.constant(1, scalar) : b.constant_int(is_unsigned ? 255 : -1, scalar);
    case Reduction::Max:
      if (is_float) return b.constant(-inf, scalar);
      return is_unsigned ? b.constant_int(0, scalar)
                         : b.constant_int(bits == 64 ? INT64_MIN : -(int64_t{1} << (bits - 1)), scalar);
    case Reduction::Min:
      if (is_float) return b.constant(inf, scalar);
      if (dtype == DType::Bool) return b.constant(1, scalar);
      if (is_unsigned) return b.constant_int(255, scalar);
      return b.constant_int(bits == 64 ? INT64_MAX : (int64_t{1} << (bits - 1)) - 1, scalar);
    default: return b.constant(0, scalar);
  }
}

// Rows [size, n] combined over the ranks (dimension 0) -> [n].
Value reduce_rows(Builder& b, const Value& rows, Reduction r) {
  return b.reduce({rows}, {identity(b, r, rows.dtype())}, {0}, combiner(r, rows.dtype()))[0];
}

}  // namespace

const char* name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Scatter: return "scatter";
  }
  return "?";
}

const char* name(Reduction r) {
  switch (r) {
    case Reduction::Sum: return "SUM";
    case Reduction::Avg: return "AVG";
    case Reduction::Product: return "PRODUCT";
    case Reduction::Min: return "MIN";
    case Reduction::Max: return "MAX";
    case Reduction::BitAnd: return "BAND";
    case Reduction::BitOr: return "BOR";
    case Reduction::BitXor: return "BXOR";
  }
  return "?";
}

std::string Call::key() const {
  std::ostringstream k;
  k.precision(17);
  k << "collective|" << name(kind) << "|" << name(reduction) << "|" << stablehlo::mlir_name(dtype) << "|" << numel
    << "|" << size << "|" << root << "|" << factor;
  return k.str();
}

int64_t Call::output_numel() const {
  switch (kind) {
    case Kind::AllGather: return numel * size;
    case Kind::ReduceScatter:
    case Kind::Scatter: return numel / size;
    default: return numel;
  }
}

std::string Call::invalid() const {
  const bool reduces = kind == Kind::AllReduce || kind == Kind::ReduceScatter;
  const std::string what = std::string(name(kind)) + " with ReduceOp." + name(reduction) + " of a " +
                           stablehlo::mlir_name(dtype) + " tensor";
  if (size < 1) return std::string(name(kind)) + ": a group needs at least one rank";
  if ((kind == Kind::Broadcast || kind == Kind::Scatter) && (root < 0 || root >= size))
    return std::string(name(kind)) + ": root " + std::to_string(root) + " is not a rank of a group of " +
           std::to_string(size);
  if ((kind == Kind::ReduceScatter || kind == Kind::AllToAll || kind == Kind::Scatter) && numel % size != 0)
    return std::string(name(kind)) + ": the input's " + std::to_string(numel) + " elements do not split into " +
           std::to_string(size) + " equal blocks";
  if (!reduces) return {};
  const bool bitwise =
      reduction == Reduction::BitAnd || reduction == Reduction::BitOr || reduction == Reduction::BitXor;
  if (bitwise && stablehlo::is_float(dtype)) return what + ": bitwise reductions need an integer or bool tensor";
  if (reduction == Reduction::Avg && dtype == DType::Bool) return what + ": AVG needs a number tensor";
  if (factor != 1 && !stablehlo::is_float(dtype)) return what + ": PREMUL_SUM needs a floating-point tensor";
  return {};
}

std::string describe(const Call& call, int device) {
  std::string d = name(call.kind);
  if (call.kind == Kind::AllReduce || call.kind == Kind::ReduceScatter) d += std::string(" ") + name(call.reduction);
  if (call.kind == Kind::Broadcast || call.kind == Kind::Scatter) d += " root " + std::to_string(call.root);
  return d + " of " + stablehlo::mlir_name(call.dtype) + "[" + std::to_string(call.numel) +
         "] on tpu:" + std::to_string(device);
}

std::string mismatch_message(const std::vector<std::string>& calls) {
  std::string list;
  for (size_t r = 0; r < calls.size(); ++r) list += "\n  rank " + std::to_string(r) + ": " + calls[r];
  return "torch_tpu: the ranks of a process group made different collective calls:" + list +
         "\nEvery rank must call the same collectives in the same order, with the same dtypes and element counts.";
}

Value lower(Builder& b, const Call& call, Value x) {
  if (std::string why = call.invalid(); !why.empty()) throw std::invalid_argument(why);
  if (b.partitions() != call.size)
    throw std::invalid_argument(std::string(name(call.kind)) + " over " + std::to_string(call.size) +
                                " ranks in a program of " + std::to_string(b.partitions()) + " partitions");
  Value out;
  switch (call.kind) {
    case Kind::AllReduce:
    case Kind::ReduceScatter: {
      if (call.factor != 1) x = b.binary(Binary::Multiply, x, b.constant(call.factor, x.type));
      if (native(call.reduction, call.dtype)) {
        auto combine = combiner(call.reduction, call.dtype);
        out = call.kind == Kind::AllReduce ? b.all_reduce(x, combine) : b.reduce_scatter(x, 0, combine);
      } else if (call.kind == Kind::AllReduce) {  // every rank's x, reduced here
        out = reduce_rows(b, b.reshape(b.all_gather(x, 0), {call.size, call.numel}), call.reduction);
      } else {  // block r of every rank (as reduce_scatter moves them), reduced here
        out = reduce_rows(b, b.reshape(b.all_to_all(x, 0), {call.size, call.numel / call.size}), call.reduction);
      }
      if (call.reduction == Reduction::Avg)  // integers: truncating division, as NCCL's average
        out = b.binary(Binary::Divide, out, b.constant(static_cast<double>(call.size), out.type));
      break;
    }
    case Kind::Broadcast:  // the root's block of everyone's: bit exact, and no partition_id (SPMD refuses it)
      out = b.slice(b.all_gather(x, 0), {call.root * call.numel}, {(call.root + 1) * call.numel}, {1});
      break;
    case Kind::AllGather: out = b.all_gather(x, 0); break;
    case Kind::AllToAll: out = b.all_to_all(x, 0); break;
    case Kind::Scatter: {
      // Every rank sends its blocks (non-roots zeros); rank r keeps what the root sent it.
      const int64_t block = call.numel / call.size;
      Value received = b.all_to_all(x, 0);
      out = b.slice(received, {call.root * block}, {(call.root + 1) * block}, {1});
      break;
    }
  }
  return out;
}

runtime::ProgramSpec build(const Call& call) {
  Builder b;
  b.set_partitions(call.size);
  Value out = lower(b, call, b.parameter({call.dtype, {call.numel}}));
  return runtime::ProgramSpec(b.module({out}), {out.type});
}

}  // namespace torch_tpu::collectives
