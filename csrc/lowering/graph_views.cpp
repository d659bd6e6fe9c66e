// View, copy and factory ops as values, for compiled graphs only (registered
// as "graph:aten::..."; csrc/python/graph.cpp looks there first). In eager
// these are metadata over a storage (csrc/aten/kernels.cpp) or composites; in
// a functional graph each is just a new value, its shape given by the graph.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

std::vector<Value> reshaped(LoweringContext& c) { return {c.b.reshape(c.tensor(0), c.out().shape)}; }
std::vector<Value> same(LoweringContext& c) { return {c.tensor(0)}; }
std::vector<Value> converted(LoweringContext& c) { return {c.b.cast(c.tensor(0), c.out().dtype)}; }

std::vector<Value> permute(LoweringContext& c) {
  const Value& x = c.tensor(0);
  std::vector<int64_t> perm;
  for (int64_t d : c.ints(1)) perm.push_back(normalize_dim(d, x.rank()));
  return {c.b.transpose(x, perm)};
}

std::vector<Value> transpose(LoweringContext& c) {
  const Value& x = c.tensor(0);
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.rank(); ++d) perm.push_back(d);
  if (x.rank() >= 2 || c.has(1)) {
    int64_t a = c.has(1) ? normalize_dim(c.integer(1), x.rank()) : 0,
            b = c.has(2) ? normalize_dim(c.integer(2), x.rank()) : 1;
    if (x.rank() >= 2) std::swap(perm[a], perm[b]);
  }
  return {c.b.transpose(x, perm)};
}

std::vector<Value> expand(LoweringContext& c) { return {c.b.broadcast_to(c.tensor(0), c.out().shape)}; }

// slice.Tensor(self, dim, start, end, step): the graph's output size fixes the extent.
std::vector<Value> slice(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const int64_t d = normalize_dim(c.has(1) ? c.integer(1) : 0, x.rank()), size = x.shape()[d];
  const int64_t step = c.has(4) ? c.integer(4) : 1, n = c.out().shape[d];
  int64_t start = c.has(2) ? c.integer(2) : 0;
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  std::vector<int64_t> lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
  lo[d] = start;
  hi[d] = n == 0 ? start : start + (n - 1) * step + 1;
  st[d] = step;
  return {c.b.slice(x, lo, hi, st)};
}

// select.int(self, dim, index).
std::vector<Value> select(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const int64_t d = normalize_dim(c.integer(1), x.rank());
  int64_t i = c.integer(2);
  if (i < 0) i += x.shape()[d];
  if (i < 0 || i >= x.shape()[d]) throw std::out_of_range("select: index out of range in a compiled graph");
  std::vector<int64_t> lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
  lo[d] = i;
  hi[d] = i + 1;
  return {c.b.reshape(c.b.slice(x, lo, hi, st), c.out().shape)};
}

// split.Tensor / split_with_sizes / unbind: consecutive slices along dim,
// each output's size from the graph.
LoweringRule pieces(size_t dim_arg) {
  return [dim_arg](LoweringContext& c) {
    const Value& x = c.tensor(0);
    const int64_t d = normalize_dim(c.has(dim_arg) ? c.integer(dim_arg) : 0, x.rank());
    const bool unbind = c.outputs.size() > 0 && static_cast<int64_t>(c.out().shape.size()) == x.rank() - 1;
    std::vector<Value> out;
    int64_t at = 0;
    for (const auto& t : c.outputs) {
      const int64_t n = unbind ? 1 : t.shape[d];
      std::vector<int64_t> lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
      lo[d] = at;
      hi[d] = at + n;
      out.push_back(c.b.reshape(c.b.slice(x, lo, hi, st), t.shape));
      at += n;
    }
    return out;
  };
}

// as_strided(base, size, stride, storage_offset): torch_tpu/_compile.py passes
// the value that holds the view's whole storage as `base` (row-major from
// offset 0), so element i is base's flat element offset + sum(i_k * stride_k),
// wherever in the storage the traced input of as_strided started.
std::vector<Value> as_strided(LoweringContext& c) {
  const Value& base = c.tensor(0);
  const std::vector<int64_t>& size = c.ints(1);
  const std::vector<int64_t>& stride = c.ints(2);
  const int64_t offset = c.has(3) ? c.integer(3) : 0;
  int64_t count = 1;
  for (int64_t n : size) count *= n;
  if (count == 0) return {c.b.constant(0, c.out())};
  TensorType index{DType::Int64, size};
  Value at = c.b.constant_int(offset, index);
  for (size_t k = 0; k < size.size(); ++k)
    at = c.b.binary(stablehlo::Binary::Add, at,
                    c.b.binary(stablehlo::Binary::Multiply, c.b.iota(index, static_cast<int64_t>(k)),
                               c.b.constant_int(stride[k], index)));
  Value flat = c.b.reshape(base, {base.type.numel()});
  return {c.b.reshape(c.b.gather_1d(flat, c.b.reshape(at, {count})), c.out().shape)};
}

// copy(self, src, non_blocking): src in self's dtype and shape.
std::vector<Value> copy(LoweringContext& c) {
  return {c.b.broadcast_to(c.b.cast(c.tensor(1), c.out().dtype), c.out().shape)};
}

// full(size, fill_value, ...), scalar_tensor(s, ...): a constant.
LoweringRule filled(size_t value_arg) {
  return [value_arg](LoweringContext& c) -> std::vector<Value> { return {c.b.constant(c.number(value_arg), c.out())}; };
}
// empty: its contents are unspecified; zeros are a valid choice.
std::vector<Value> empty(LoweringContext& c) { return {c.b.constant(0, c.out())}; }

}  // namespace

LOWERING("graph:aten::view", reshaped);
LOWERING("graph:aten::_unsafe_view", reshaped);
LOWERING("graph:aten::reshape", reshaped);
LOWERING("graph:aten::squeeze", reshaped);
LOWERING("graph:aten::squeeze.dim", reshaped);
LOWERING("graph:aten::squeeze.dims", reshaped);
LOWERING("graph:aten::unsqueeze", reshaped);
LOWERING("graph:aten::flatten.using_ints", reshaped);
LOWERING("graph:aten::permute", permute);
LOWERING("graph:aten::transpose.int", transpose);
LOWERING("graph:aten::t", transpose);
LOWERING("graph:aten::expand", expand);
LOWERING("graph:aten::as_strided", as_strided);
LOWERING("graph:aten::slice.Tensor", slice);
LOWERING("graph:aten::select.int", select);
LOWERING("graph:aten::split.Tensor", pieces(2));
LOWERING("graph:aten::split_with_sizes", pieces(2));
LOWERING("graph:aten::unbind.int", pieces(1));
LOWERING("graph:aten::alias", same);
LOWERING("graph:aten::clone", same);
LOWERING("graph:aten::detach", same);
LOWERING("graph:aten::lift_fresh_copy", same);
LOWERING("graph:aten::contiguous", same);
LOWERING("graph:aten::_to_copy", converted);
LOWERING("graph:aten::copy", copy);
LOWERING("graph:aten::full", filled(1));
LOWERING("graph:aten::scalar_tensor", filled(0));
LOWERING("graph:aten::full_like", filled(1));
LOWERING("graph:aten::empty_like", empty);
LOWERING("graph:aten::empty.memory_format", empty);
LOWERING("graph:aten::empty_strided", empty);
LOWERING("graph:aten::empty_permuted", empty);

}  // namespace torch_tpu::lowering
