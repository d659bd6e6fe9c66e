// Reductions over dimensions. Low-precision floats accumulate in float32, as
// PyTorch does on CPU and CUDA.
#include <algorithm>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;

DType accumulation_type(DType out) { return out == DType::Float16 || out == DType::BFloat16 ? DType::Float32 : out; }

// The reduced dimensions: argument `i` as an int list; None or [] means all.
std::vector<int64_t> reduced_dims(LoweringContext& c, size_t i, int64_t rank) {
  std::vector<int64_t> dims;
  if (rank == 0) return dims;  // a 0-d tensor reduces over nothing (dim 0 and -1 are allowed)
  if (c.has(i)) {
    for (int64_t d : c.ints(i)) dims.push_back(normalize_dim(d, rank));
  }
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

Value sum_over(LoweringContext& c, const std::vector<int64_t>& dims, DType acc) {
  Value x = c.b.cast(c.tensor(0), acc);
  return c.b.reduce(x, c.b.scalar(0, acc), dims, Binary::Add);
}

// sum.dim_IntList(self, dim, keepdim, *, dtype)
std::vector<Value> sum(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = accumulation_type(c.out().dtype);
  Value s = sum_over(c, reduced_dims(c, 1, x.rank()), acc);
  return {c.b.reshape(c.b.cast(s, c.out().dtype), c.out().shape)};
}

// sum(self, *, dtype): all dimensions.
std::vector<Value> sum_all(LoweringContext& c) {
  DType acc = accumulation_type(c.out().dtype);
  Value s = sum_over(c, reduced_dims(c, 99, c.tensor(0).rank()), acc);
  return {c.b.reshape(c.b.cast(s, c.out().dtype), c.out().shape)};
}

// mean.dim(self, dim, keepdim, *, dtype)
std::vector<Value> mean(LoweringContext& c) {
  const Value& x = c.tensor(0);
  DType acc = accumulation_type(c.out().dtype);
  std::vector<int64_t> dims = reduced_dims(c, 1, x.rank());
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape().at(d);
  Value s = sum_over(c, dims, acc);
  Value m = c.b.binary(Binary::Divide, s, c.b.constant(static_cast<double>(count), s.type));
  return {c.b.reshape(c.b.cast(m, c.out().dtype), c.out().shape)};
}

}  // namespace

LOWERING("aten::sum.dim_IntList", sum);
LOWERING("aten::sum", sum_all);
LOWERING("aten::mean.dim", mean);

}  // namespace torch_tpu::lowering
