// Ops that move data without computing on it: cat, flip, roll, triu/tril,
// constant padding, repeat. Shapes and dtypes come from PyTorch's meta kernel.
#include <algorithm>
#include <stdexcept>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;

// A Scalar argument as a 0-d value of `dtype`, exact for integers.
Value scalar_arg(LoweringContext& c, size_t i, DType dtype) {
  // A program input, not a constant, or a complex number (a 0-d constant already).
  if (c.args[i].dynamic || c.args[i].kind == LoweringArg::Tensor) return c.value_as(i, {dtype, {}});
  if (c.args[i].kind == LoweringArg::Int) return c.b.constant_int(c.args[i].i, {dtype, {}});
  return c.b.scalar(c.number(i), dtype);
}

// cat(tensors, dim): PyTorch skips legacy empty 1-D inputs; any input without
// elements adds nothing, so every empty input is dropped.
std::vector<Value> cat(LoweringContext& c) {
  const TensorType& out = c.out();
  std::vector<Value> parts;
  for (const Value& t : c.args[0].tensors)
    if (t.type.numel() > 0) parts.push_back(c.b.cast(t, out.dtype));
  if (parts.empty() || out.numel() == 0) return {c.b.constant(0, out)};
  return {c.b.concatenate(parts, normalize_dim(c.integer(1), out.rank()))};
}

// _stack(tensors, dim): each tensor with a new dim of size 1 at `dim`, concatenated there.
std::vector<Value> stack(LoweringContext& c) {
  const TensorType& out = c.out();
  if (out.numel() == 0) return {c.b.constant(0, out)};
  const int64_t dim = normalize_dim(c.integer(1), out.rank());
  std::vector<Value> parts;
  for (const Value& t : c.args[0].tensors) {
    Shape shape = t.shape();
    shape.insert(shape.begin() + dim, 1);
    parts.push_back(c.b.reshape(c.b.cast(t, out.dtype), shape));
  }
  return {c.b.concatenate(parts, dim)};
}

// flip(self, dims)
std::vector<Value> flip(LoweringContext& c) {
  const Value& x = c.tensor(0);
  std::vector<int64_t> dims;
  for (int64_t d : c.ints(1)) dims.push_back(normalize_dim(d, x.rank()));
  if (x.rank() == 0) return {x};
  return {c.b.reverse(x, dims)};
}

// x rolled by `shift` along `dim`: the last `shift` elements come first.
Value roll_dim(Builder& b, const Value& x, int64_t shift, int64_t dim) {
  int64_t n = x.shape()[dim];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), strides(x.rank(), 1);
  std::vector<int64_t> mid = start;
  mid[dim] = n - s;
  std::vector<int64_t> head_limit = limit;
  head_limit[dim] = n - s;
  return b.concatenate({b.slice(x, mid, limit, strides), b.slice(x, start, head_limit, strides)}, dim);
}

// roll(self, shifts, dims): without dims, the flattened tensor is rolled.
std::vector<Value> roll(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const auto& shifts = c.ints(1);
  std::vector<int64_t> dims = c.has(2) ? c.ints(2) : std::vector<int64_t>{};
  if (dims.empty()) {
    if (shifts.size() != 1) throw std::invalid_argument("roll: without dims, shifts must have one entry");
    Value flat = c.b.reshape(x, {x.type.numel()});
    return {c.b.reshape(roll_dim(c.b, flat, shifts[0], 0), x.shape())};
  }
  if (dims.size() != shifts.size()) throw std::invalid_argument("roll: shifts and dims must have the same length");
  Value r = x;
  for (size_t k = 0; k < dims.size(); ++k) r = roll_dim(c.b, r, shifts[k], normalize_dim(dims[k], x.rank()));
  return {r};
}

// triu/tril(self, diagonal): keep column - row >= diagonal (triu) or <= (tril)
// in the last two dimensions, zero elsewhere.
LoweringRule triangle(Compare keep) {
  return [keep](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    const int64_t r = x.rank();
    if (r < 2) throw std::invalid_argument("triu/tril: input tensor must have at least 2 dimensions");
    TensorType plane{DType::Int64, {x.shape()[r - 2], x.shape()[r - 1]}};
    Value offset = c.b.binary(stablehlo::Binary::Subtract, c.b.iota(plane, 1), c.b.iota(plane, 0));
    Value mask = c.b.compare(keep, offset, c.b.constant_int(c.integer(1), plane));
    mask = c.b.broadcast_in_dim(mask, x.shape(), {r - 2, r - 1});
    return {c.b.select(mask, x, c.b.constant(0, x.type))};
  };
}

// constant_pad_nd(self, pad, value): pad pairs (low, high) from the last
// dimension backwards; negative pads crop.
std::vector<Value> constant_pad_nd(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const auto& pad = c.ints(1);
  const int64_t r = x.rank();
  if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size()) > 2 * r)
    throw std::invalid_argument("constant_pad_nd: pad must hold pairs, at most two per dimension");
  std::vector<int64_t> low(r, 0), high(r, 0), interior(r, 0);
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    low[r - 1 - k] = pad[2 * k];
    high[r - 1 - k] = pad[2 * k + 1];
  }
  Value value = c.has(2) ? scalar_arg(c, 2, x.dtype()) : c.b.scalar(0, x.dtype());
  return {c.b.pad(x, value, low, high, interior)};
}

// Where each position of a dimension of n elements padded by (low, high)
// reads from: mirrored at the edges (reflection) or clamped (replication).
std::vector<int64_t> pad_sources(int64_t n, int64_t low, int64_t high, bool reflect) {
  std::vector<int64_t> sources;
  for (int64_t j = 0; j < n + low + high; ++j) {
    int64_t i = j - low;
    if (reflect) {
      i = i < 0 ? -i : i;
      i = i >= n ? 2 * (n - 1) - i : i;
    }
    sources.push_back(std::clamp<int64_t>(i, 0, n - 1));
  }
  return sources;
}

// reflection_pad{1,2,3}d / replication_pad{1,2,3}d(self, padding): pairs
// (low, high) from the last dimension backwards; each padded dimension is a
// gather of fixed positions.
LoweringRule edge_pad(bool reflect) {
  return [reflect](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    const auto& pad = c.ints(1);
    if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
    for (size_t k = 0; k < pad.size() / 2; ++k) {
      const int64_t d = x.rank() - 1 - static_cast<int64_t>(k);
      auto sources = pad_sources(x.shape()[d], pad[2 * k], pad[2 * k + 1], reflect);
      const int64_t m = static_cast<int64_t>(sources.size());
      x = take_along(c.b, x, d, c.b.constant_array_int(sources, {DType::Int64, {m}}));
    }
    return {x};
  };
}

// reflection_pad*_backward / replication_pad*_backward(grad_output, self,
// padding): each padded dimension's gradient added back where it was read.
LoweringRule edge_pad_backward(bool reflect) {
  return [reflect](LoweringContext& c) -> std::vector<Value> {
    // Low-precision floats add up in float32 and round once, as CPU's kernel does.
    const DType out = c.out().dtype, acc = out == DType::BFloat16 || out == DType::Float16 ? DType::Float32 : out;
    Value g = c.b.cast(c.b.cast(c.tensor(0), out), acc);
    const Shape& in = c.tensor(1).shape();
    const auto& pad = c.ints(2);
    if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
    for (size_t k = 0; k < pad.size() / 2; ++k) {
      const int64_t d = g.rank() - 1 - static_cast<int64_t>(k);
      auto sources = pad_sources(in[d], pad[2 * k], pad[2 * k + 1], reflect);
      const int64_t m = static_cast<int64_t>(sources.size());
      Shape shape = g.shape();
      shape[d] = in[d];
      stablehlo::ScatterDims dims;
      for (int64_t e = 0; e < g.rank(); ++e)
        if (e != d) dims.update_window_dims.push_back(e);
      dims.inserted_window_dims = {d};
      dims.scatter_dims_to_operand_dims = {d};
      dims.index_vector_dim = 1;
      g = c.b.scatter(c.b.constant(0, {g.dtype(), shape}), c.b.constant_array_int(sources, {DType::Int64, {m, 1}}), g,
                      dims, stablehlo::ScatterCombine::Add);
    }
    return {c.b.cast(g, out)};
  };
}

// repeat(self, repeats): self (with leading 1s added) broadcast into
// [r0, s0, r1, s1, ...] and merged pairwise into [r0*s0, r1*s1, ...].
std::vector<Value> repeat(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const auto& repeats = c.ints(1);
  const int64_t k = static_cast<int64_t>(repeats.size());
  if (k < x.rank()) throw std::invalid_argument("repeat: fewer repeats than the tensor's dimensions");
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  Shape sizes(k - x.rank(), 1);
  sizes.insert(sizes.end(), x.shape().begin(), x.shape().end());
  Value padded = c.b.reshape(x, sizes);
  Shape wide;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < k; ++d) {
    wide.push_back(repeats[d]);
    wide.push_back(sizes[d]);
    dims.push_back(2 * d + 1);
  }
  return {c.b.reshape(c.b.broadcast_in_dim(padded, wide, dims), c.out().shape)};
}

// `self` with the entries start, start + step, ... along `dim` replaced by
// `src` (of self's rank; what slicing's backward and functionalized slice
// writes produce): src padded into place (interior padding for the step) and
// selected by a mask padded the same way.
Value scatter_slices(LoweringContext& c, const Value& src, int64_t dim, int64_t start, int64_t step) {
  const TensorType& out = c.out();
  Value self = c.b.cast(c.tensor(0), out.dtype);
  const int64_t n = src.shape()[dim];
  if (n == 0 || out.numel() == 0) return self;
  std::vector<int64_t> low(out.rank(), 0), high(out.rank(), 0), interior(out.rank(), 0);
  low[dim] = start;
  interior[dim] = step - 1;
  high[dim] = out.shape[dim] - (start + (n - 1) * step + 1);
  Value placed = c.b.pad(c.b.cast(src, out.dtype), c.b.scalar(0, out.dtype), low, high, interior);
  Value mask = c.b.pad(c.b.constant(1, {DType::Bool, src.shape()}), c.b.scalar(0, DType::Bool), low, high, interior);
  return c.b.select(mask, placed, self);
}

// slice_scatter(self, src, dim, start, end, step)
std::vector<Value> slice_scatter(LoweringContext& c) {
  const int64_t rank = c.out().rank(), d = normalize_dim(c.has(2) ? c.integer(2) : 0, rank);
  const int64_t size = c.out().shape[d];
  int64_t start = c.has(3) ? c.integer(3) : 0;
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  return {scatter_slices(c, c.tensor(1), d, start, c.has(5) ? c.integer(5) : 1)};
}

// select_scatter(self, src, dim, index)
std::vector<Value> select_scatter(LoweringContext& c) {
  const int64_t rank = c.out().rank(), d = normalize_dim(c.integer(2), rank);
  int64_t i = c.integer(3);
  if (i < 0) i += c.out().shape[d];
  if (i < 0 || i >= c.out().shape[d]) throw std::out_of_range("select_scatter: index out of range");
  Shape one = c.out().shape;
  one[d] = 1;
  return {scatter_slices(c, c.b.reshape(c.tensor(1), one), d, i, 1)};
}

// pixel_shuffle(self [*, C r r, H, W], r) -> [*, C, H r, W r] and
// pixel_unshuffle, its inverse: a reshape, a transpose, a reshape.
LoweringRule pixel_shuffle(bool shuffle) {
  return [shuffle](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    const int64_t r = c.integer(1), n = x.rank() - 3;
    Shape lead(x.shape().begin(), x.shape().begin() + n);
    const int64_t ch = shuffle ? x.shape()[n] / (r * r) : x.shape()[n];
    const int64_t h = shuffle ? x.shape()[n + 1] : x.shape()[n + 1] / r;
    const int64_t w = shuffle ? x.shape()[n + 2] : x.shape()[n + 2] / r;
    Shape split = lead;
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < n; ++d) perm.push_back(d);
    if (shuffle) {  // [*, C, r, r, H, W] -> [*, C, H, r, W, r]
      for (int64_t v : {ch, r, r, h, w}) split.push_back(v);
      for (int64_t d : {0, 3, 1, 4, 2}) perm.push_back(n + d);
    } else {  // [*, C, H, r, W, r] -> [*, C, r, r, H, W]
      for (int64_t v : {ch, h, r, w, r}) split.push_back(v);
      for (int64_t d : {0, 2, 4, 1, 3}) perm.push_back(n + d);
    }
    return {c.b.reshape(c.b.transpose(c.b.reshape(x, split), perm), c.out().shape)};
  };
}

// channel_shuffle(self [N, C, *], groups): channels regrouped as [C / g, g].
std::vector<Value> channel_shuffle(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const int64_t g = c.integer(1);
  Shape split{x.shape()[0], g, x.shape()[1] / g};
  split.insert(split.end(), x.shape().begin() + 2, x.shape().end());
  std::vector<int64_t> perm{0, 2, 1};
  for (int64_t d = 3; d < static_cast<int64_t>(split.size()); ++d) perm.push_back(d);
  return {c.b.reshape(c.b.transpose(c.b.reshape(x, split), perm), c.out().shape)};
}

// narrow_copy(self, dim, start, length): the slice, as a new tensor.
std::vector<Value> narrow_copy(LoweringContext& c) {
  const Value& x = c.tensor(0);
  const int64_t dim = normalize_dim(c.integer(1), x.rank());
  int64_t start = c.integer(2);
  if (start < 0) start += x.shape()[dim];
  std::vector<int64_t> lo(x.rank(), 0), hi(x.shape()), step(x.rank(), 1);
  lo[dim] = start;
  hi[dim] = start + c.integer(3);
  return {c.b.slice(x, lo, hi, step)};
}

// unfold_backward(grad_in, input_sizes, dim, size, step): Tensor.unfold's
// gradient. grad_in is the input's shape with `dim` replaced by the windows,
// plus a last dim of `size`; element (w, k) adds into position w * step + k.
std::vector<Value> unfold_backward(LoweringContext& c) {
  const Value& g = c.tensor(0);
  const TensorType& out = c.out();
  if (out.rank() == 0 || out.numel() == 0 || g.type.numel() == 0) return {c.b.constant(0, out)};
  const int64_t rank = out.rank(), dim = normalize_dim(c.integer(2), rank), size = c.integer(3), step = c.integer(4);
  const int64_t windows = g.shape()[dim];
  // Updates [windows, size, other dims in order]; indices [windows, size, 1].
  std::vector<int64_t> perm{dim, rank};
  for (int64_t d = 0; d < rank; ++d)
    if (d != dim) perm.push_back(d);
  Value updates = c.b.transpose(c.b.cast(g, out.dtype), perm);
  const TensorType pos{DType::Int64, {windows, size, 1}};
  Value index = c.b.binary(Binary::Add, c.b.binary(Binary::Multiply, c.b.iota(pos, 0), c.b.constant_int(step, pos)),
                           c.b.iota(pos, 1));
  stablehlo::ScatterDims dims;
  for (int64_t d = 2; d < rank + 1; ++d) dims.update_window_dims.push_back(d);
  dims.inserted_window_dims = {dim};
  dims.scatter_dims_to_operand_dims = {dim};
  dims.index_vector_dim = 2;
  return {c.b.scatter(c.b.constant(0, out), index, updates, dims, stablehlo::ScatterCombine::Add)};
}

}  // namespace

LOWERING("aten::cat", cat);
LOWERING("aten::_stack", stack);
LOWERING("aten::flip", flip);
LOWERING("aten::roll", roll);
LOWERING("aten::pixel_shuffle", pixel_shuffle(true));
LOWERING("aten::pixel_unshuffle", pixel_shuffle(false));
LOWERING("aten::channel_shuffle", channel_shuffle);
LOWERING("aten::narrow_copy", narrow_copy);
LOWERING("aten::unfold_backward", unfold_backward);
LOWERING("aten::triu", triangle(Compare::GE));
LOWERING("aten::tril", triangle(Compare::LE));
LOWERING("aten::constant_pad_nd", constant_pad_nd);
LOWERING("aten::reflection_pad1d", edge_pad(true));
LOWERING("aten::reflection_pad1d_backward", edge_pad_backward(true));
LOWERING("aten::reflection_pad2d", edge_pad(true));
LOWERING("aten::reflection_pad2d_backward", edge_pad_backward(true));
LOWERING("aten::reflection_pad3d", edge_pad(true));
LOWERING("aten::reflection_pad3d_backward", edge_pad_backward(true));
LOWERING("aten::replication_pad1d", edge_pad(false));
LOWERING("aten::replication_pad1d_backward", edge_pad_backward(false));
LOWERING("aten::replication_pad2d", edge_pad(false));
LOWERING("aten::replication_pad2d_backward", edge_pad_backward(false));
LOWERING("aten::replication_pad3d", edge_pad(false));
LOWERING("aten::replication_pad3d_backward", edge_pad_backward(false));
LOWERING("aten::repeat", repeat);
LOWERING("aten::slice_scatter", slice_scatter);
LOWERING("aten::select_scatter", select_scatter);

}  // namespace torch_tpu::lowering
