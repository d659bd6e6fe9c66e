// Pooling over the trailing spatial dimensions (max with indices, average,
// adaptive average) and their backward, as stablehlo.reduce_window. Leading
// dimensions (batch, channels, or channels alone) are carried through.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using Pads = std::vector<std::pair<int64_t, int64_t>>;

// PyTorch passes int[1] for "same for every spatial dimension"; stride [] means the kernel.
std::vector<int64_t> per_dim(const std::vector<int64_t>& v, size_t n, const std::vector<int64_t>& empty_means) {
  if (v.empty()) return empty_means;
  return v.size() == 1 ? std::vector<int64_t>(n, v[0]) : v;
}

// One pooling window over the last n dimensions of a value of rank `rank`.
struct Window {
  size_t n = 0, lead = 0;
  std::vector<int64_t> kernel, stride, padding, dilation;

  // Whole-rank attributes: the leading dimensions get a window of 1.
  std::vector<int64_t> full(const std::vector<int64_t>& spatial, int64_t lead_value) const {
    std::vector<int64_t> v(lead, lead_value);
    v.insert(v.end(), spatial.begin(), spatial.end());
    return v;
  }
  // (low, high) padding giving at least `out` windows over an input of `in`.
  Pads pads(const Shape& in, const Shape& out) const {
    Pads p(lead, {0, 0});
    for (size_t i = 0; i < n; ++i) {
      int64_t needed = (out[lead + i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1 - in[lead + i] - padding[i];
      p.push_back({padding[i], std::max<int64_t>(0, needed)});
    }
    return p;
  }
};

Window window(LoweringContext& c, const Value& x, size_t kernel_arg, size_t n, bool has_dilation) {
  Window w;
  w.n = n;
  if (x.rank() != static_cast<int64_t>(n) + 1 && x.rank() != static_cast<int64_t>(n) + 2)
    throw Declined("pooling: input of rank " + std::to_string(x.rank()));
  w.lead = static_cast<size_t>(x.rank()) - n;
  w.kernel = per_dim(c.ints(kernel_arg), n, {});
  w.stride = per_dim(c.ints(kernel_arg + 1), n, w.kernel);
  w.padding = per_dim(c.ints(kernel_arg + 2), n, std::vector<int64_t>(n, 0));
  w.dilation =
      has_dilation ? per_dim(c.ints(kernel_arg + 3), n, std::vector<int64_t>(n, 1)) : std::vector<int64_t>(n, 1);
  if (w.kernel.size() != n || w.stride.size() != n || w.padding.size() != n || w.dilation.size() != n)
    throw Declined("pooling: window attributes of the wrong length");
  return w;
}

// The first `out` windows of a reduce_window result that may have more.
Value first_windows(Builder& b, const Value& v, const Shape& out) {
  if (v.shape() == out) return v;
  return b.slice(v, std::vector<int64_t>(out.size(), 0), out, std::vector<int64_t>(out.size(), 1));
}

std::vector<Value> add_body(Builder& r, const std::vector<Value>& a) { return {r.binary(Binary::Add, a[0], a[1])}; }

// The flat index of each element within its spatial plane (or volume).
Value plane_index(Builder& b, const Shape& shape, size_t lead) {
  TensorType t{DType::Int64, shape};
  Value index = b.constant_int(0, t);
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > lead;) {
    Value term = b.binary(Binary::Multiply, b.iota(t, static_cast<int64_t>(d)), b.constant_int(step, t));
    index = b.binary(Binary::Add, index, term);
    step *= shape[d];
  }
  return index;
}

// (value, index) max as PyTorch's CPU kernel scans a window: a strictly larger
// value replaces, so the first of equal values wins, and every NaN replaces,
// so the last NaN wins. As a total order it is associative and commutative.
std::vector<Value> max_with_index(Builder& r, const std::vector<Value>& a) {
  const Value &v = a[0], &i = a[1], &w = a[2], &j = a[3];
  Value pick = r.binary(Binary::Or, r.compare(Compare::GT, v, w),
                        r.binary(Binary::And, r.compare(Compare::EQ, v, w), r.compare(Compare::LT, i, j)));
  if (stablehlo::is_float(v.dtype())) {
    Value v_nan = r.compare(Compare::NE, v, v), w_nan = r.compare(Compare::NE, w, w);
    Value nan_wins = r.binary(
        Binary::And, v_nan, r.binary(Binary::Or, r.unary(stablehlo::Unary::Not, w_nan), r.compare(Compare::GT, i, j)));
    pick = r.binary(Binary::Or, pick, nan_wins);
  }
  return {r.select(pick, v, w), r.select(pick, i, j)};
}

// Every window must hold at least one element of the input, or PyTorch's
// index would point at padding.
void require_inside(const Window& w, const Shape& in, const Shape& out) {
  for (size_t i = 0; i < w.n; ++i)
    for (int64_t o = 0; o < out[w.lead + i]; ++o) {
      bool any = false;
      for (int64_t k = 0; k < w.kernel[i] && !any; ++k) {
        int64_t at = o * w.stride[i] - w.padding[i] + k * w.dilation[i];
        any = at >= 0 && at < in[w.lead + i];
      }
      if (!any) throw Declined("max_pool: a window lies entirely in the padding");
    }
}

// max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) -> (values, indices)
LoweringRule max_pool_with_indices(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    Window w = window(c, x, 1, n, true);
    const Shape& out = c.out(0).shape;
    if (c.out(0).numel() == 0) return {c.b.constant(0, c.out(0)), c.b.constant_int(0, c.out(1))};
    require_inside(w, x.shape(), out);
    Value index = plane_index(c.b, x.shape(), w.lead);
    auto r = c.b.reduce_window({x, index}, {lowest(c.b, x.dtype()), c.b.constant_int(INT64_MAX, {DType::Int64, {}})},
                               w.full(w.kernel, 1), w.full(w.stride, 1), {}, w.full(w.dilation, 1),
                               w.pads(x.shape(), out), max_with_index);
    return {c.b.cast(first_windows(c.b, r[0], out), c.out(0).dtype), first_windows(c.b, r[1], out)};
  };
}

// max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
// ceil_mode, indices): each gradient added into its plane at the index the forward chose.
// The gradient of a max pool with `indices` (each output's flat position in
// its input plane): grad added back at those positions, plane by plane, into
// the rule's output shape (`combine` Replace: max_unpool's placement).
Value indexed_gradient(LoweringContext& c, const Value& grad, const Value& indices, size_t n,
                       stablehlo::ScatterCombine combine = stablehlo::ScatterCombine::Add) {
  const TensorType& in = c.out();
  if (in.rank() != static_cast<int64_t>(n) + 1 && in.rank() != static_cast<int64_t>(n) + 2)
    throw Declined("max_pool backward: input of rank " + std::to_string(in.rank()));
  const size_t lead = static_cast<size_t>(in.rank()) - n;
  int64_t planes = 1, plane = 1;
  for (size_t d = 0; d < lead; ++d) planes *= in.shape[d];
  for (size_t d = lead; d < in.shape.size(); ++d) plane *= in.shape[d];
  const int64_t per_plane = grad.type.numel() / planes, total = grad.type.numel();
  TensorType grid{DType::Int64, {planes, per_plane}};
  Value offset = c.b.binary(Binary::Multiply, c.b.iota(grid, 0), c.b.constant_int(plane, grid));
  Value flat = c.b.binary(Binary::Add, c.b.reshape(c.b.cast(indices, DType::Int64), grid.shape), offset);
  stablehlo::ScatterDims s;
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  Value updates = c.b.reshape(c.b.cast(grad, in.dtype), {total});
  Value result =
      c.b.scatter(c.b.constant(0, {in.dtype, {planes * plane}}), c.b.reshape(flat, {total, 1}), updates, s, combine);
  return c.b.reshape(result, in.shape);
}

// max_unpool{2,3}d(self, indices, output_size, ...): each value placed at its
// index in a zero plane of output_size.
LoweringRule max_unpool(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &x = c.tensor(0), &indices = c.tensor(1);
    if (c.out().numel() == 0 || x.type.numel() == 0) return {c.b.constant(0, c.out())};
    int64_t plane = 1;
    for (size_t d = c.out().shape.size() - n; d < c.out().shape.size(); ++d) plane *= c.out().shape[d];
    c.check_indices(indices, plane, false, "max_unpool: found an invalid max index (outside the output size)",
                    /*index_error=*/false);
    return {indexed_gradient(c, x, indices, n, stablehlo::ScatterCombine::Replace)};
  };
}

// fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples)
// -> (output, indices): window starts from each plane's random samples as
// PyTorch's generate_intervals draws them (int((i + u) alpha) - int(u alpha),
// alpha = (in - k) / (out - 1), truncated; the last window at the end), then the max of
// each window and its flat index in the plane (the first of equal values; a
// NaN wins, the last one scanned). Samples [N, C, n] give W, H (2-D) or T, H, W (3-D).
LoweringRule fractional_max_pool(int64_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    Builder& b = c.b;
    Value x = c.tensor(0);
    if (x.rank() == n + 1) {
      Shape batched = x.shape();
      batched.insert(batched.begin(), 1);
      x = b.reshape(x, batched);
    }
    if (c.out(0).numel() == 0) return {b.constant(0, c.out(0)), b.constant_int(0, c.out(1))};
    const std::vector<int64_t>& kernel = c.ints(1);
    const std::vector<int64_t>& out_size = c.ints(2);
    const int64_t batch = x.shape()[0], channels = x.shape()[1];
    // In the input's dtype, every step rounded, as PyTorch's scalar_t arithmetic.
    const DType t = x.dtype();
    Value samples = b.cast(c.tensor(3), t);
    // The window grid: [N, C, O_0 .. O_n-1, K_0 .. K_n-1].
    Shape grid{batch, channels};
    for (int64_t i = 0; i < n; ++i) grid.push_back(out_size[i]);
    for (int64_t i = 0; i < n; ++i) grid.push_back(kernel[i]);
    const TensorType it{DType::Int64, grid};
    Value flat = b.constant_int(0, it), order = b.constant_int(0, it);
    std::vector<Value> columns;
    Shape column_shape = grid;
    column_shape.push_back(1);
    int64_t plane_stride = 1, kernel_stride = 1;
    for (int64_t i = n - 1; i >= 0; --i) {
      const int64_t in = x.shape()[2 + i], k = kernel[i], o = out_size[i];
      const int64_t sample = n == 2 ? n - 1 - i : i;
      std::vector<int64_t> start(3, 0), limit{batch, channels, sample + 1};
      start[2] = sample;
      Value u = b.reshape(b.slice(samples, start, limit, {1, 1, 1}), {batch, channels});
      const TensorType seq_t{t, {batch, channels, o}};
      Value starts;
      if (o > 1) {
        Value alpha = b.scalar(static_cast<double>(in - k) / static_cast<double>(o - 1), t);
        Value alpha_b = b.broadcast_to(alpha, seq_t.shape);
        Value ub = b.broadcast_in_dim(u, seq_t.shape, {0, 1});
        Value j = b.iota(seq_t, 2);
        // Truncated to integers each (static_cast, as PyTorch), then subtracted.
        Value first = b.convert(b.binary(Binary::Multiply, b.binary(Binary::Add, j, ub), alpha_b), DType::Int64);
        Value base = b.convert(b.binary(Binary::Multiply, ub, alpha_b), DType::Int64);
        starts = b.binary(Binary::Subtract, first, base);
        Value last = b.compare(Compare::EQ, b.iota({DType::Int64, seq_t.shape}, 2),
                               b.constant_int(o - 1, {DType::Int64, seq_t.shape}));
        starts = b.select(last, b.constant_int(in - k, {DType::Int64, seq_t.shape}), starts);
      } else {
        starts = b.constant_int(in - k, {DType::Int64, seq_t.shape});
      }
      Value offset = b.iota(it, 2 + n + i);
      Value pos = b.binary(Binary::Add, b.broadcast_in_dim(starts, grid, {0, 1, 2 + i}), offset);
      flat = b.binary(Binary::Add, flat, b.binary(Binary::Multiply, pos, b.constant_int(plane_stride, it)));
      order = b.binary(Binary::Add, order, b.binary(Binary::Multiply, offset, b.constant_int(kernel_stride, it)));
      columns.insert(columns.begin(), b.reshape(pos, column_shape));
      plane_stride *= in;
      kernel_stride *= k;
    }
    stablehlo::GatherDims g;
    g.operand_batching_dims = {0, 1};
    g.start_indices_batching_dims = {0, 1};
    for (int64_t i = 0; i < n; ++i) g.collapsed_slice_dims.push_back(2 + i), g.start_index_map.push_back(2 + i);
    g.index_vector_dim = static_cast<int64_t>(grid.size());
    Value v = b.gather(x, b.concatenate(columns, g.index_vector_dim), g, std::vector<int64_t>(x.rank(), 1));
    std::vector<int64_t> window_dims;
    for (int64_t i = 0; i < n; ++i) window_dims.push_back(2 + n + i);
    std::vector<int64_t> kept(2 + n);
    for (int64_t i = 0; i < 2 + n; ++i) kept[i] = i;
    Value nan = b.compare(Compare::NE, v, v);
    Value any_nan = b.reduce(nan, b.scalar(0, DType::Bool), window_dims, Binary::Or);
    Value top = b.reduce(v, lowest(b, v.dtype()), window_dims, Binary::Maximum);
    top = b.select(any_nan, b.constant(NAN, top.type), top);
    // The chosen element's scan position: the last NaN, else the first maximum.
    Value is_top = b.compare(Compare::EQ, v, b.broadcast_in_dim(top, grid, kept));
    Value last_nan = b.reduce(b.select(nan, order, b.constant_int(-1, it)), b.constant_int(-1, {DType::Int64, {}}),
                              window_dims, Binary::Maximum);
    Value first_top = b.reduce(b.select(is_top, order, b.constant_int(INT64_MAX, it)),
                               b.constant_int(INT64_MAX, {DType::Int64, {}}), window_dims, Binary::Minimum);
    Value chosen = b.select(any_nan, last_nan, first_top);
    Value at = b.compare(Compare::EQ, order, b.broadcast_in_dim(chosen, grid, kept));
    Value index = b.reduce(b.select(at, flat, b.constant_int(-1, it)), b.constant_int(-1, {DType::Int64, {}}),
                           window_dims, Binary::Maximum);
    return {b.reshape(b.cast(top, c.out(0).dtype), c.out(0).shape), b.reshape(index, c.out(1).shape)};
  };
}

// fractional_max_pool{2,3}d_backward(grad_output, self, kernel_size, output_size, indices)
LoweringRule fractional_max_pool_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &grad = c.tensor(0), &indices = c.tensor(4);
    if (c.out().numel() == 0 || grad.type.numel() == 0) return {c.b.constant(0, c.out())};
    return {indexed_gradient(c, grad, indices, n)};
  };
}

LoweringRule max_pool_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &grad = c.tensor(0), &indices = c.tensor(7);
    if (c.out().numel() == 0 || grad.type.numel() == 0) return {c.b.constant(0, c.out())};
    return {indexed_gradient(c, grad, indices, n)};
  };
}

// adaptive_max_pool{2,3}d(self, output_size) -> (values, indices): window j
// of a dimension of a elements pooled to o spans [floor(j a / o),
// ceil((j + 1) a / o)). Each spatial dimension gathers its windows padded to
// the longest (by repeating a window's last element), then one reduction
// keeps the largest value with the first index, or a NaN with the last (as
// CPU's scan in row-major order does).
LoweringRule adaptive_max_pool(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    const TensorType& out = c.out(0);
    if (out.numel() == 0 || x.type.numel() == 0) throw Declined("adaptive_max_pool: empty");
    if (x.rank() != static_cast<int64_t>(n) + 1 && x.rank() != static_cast<int64_t>(n) + 2)
      throw Declined("adaptive_max_pool: input of rank " + std::to_string(x.rank()));
    const int64_t lead = x.rank() - static_cast<int64_t>(n);
    // Each element's flat position in its plane, gathered alongside.
    Shape spatial(x.shape().begin() + lead, x.shape().end());
    Value position = c.b.constant_int(0, {DType::Int64, spatial});
    int64_t stride = 1;
    for (int64_t d = static_cast<int64_t>(n) - 1; d >= 0; --d) {
      TensorType t{DType::Int64, spatial};
      position =
          c.b.binary(Binary::Add, position, c.b.binary(Binary::Multiply, c.b.iota(t, d), c.b.constant_int(stride, t)));
      stride *= spatial[d];
    }
    std::vector<int64_t> spatial_dims;
    for (int64_t d = lead; d < x.rank(); ++d) spatial_dims.push_back(d);
    position = c.b.broadcast_in_dim(position, x.shape(), spatial_dims);
    Shape windows(x.shape().begin(), x.shape().begin() + lead);
    std::vector<int64_t> reduced;
    for (size_t i = 0; i < n; ++i) {
      const int64_t d = lead + static_cast<int64_t>(i), a = spatial[i], o = out.shape[d];
      int64_t longest = 0;
      for (int64_t j = 0; j < o; ++j) longest = std::max(longest, ((j + 1) * a + o - 1) / o - j * a / o);
      std::vector<int64_t> sources;
      for (int64_t j = 0; j < o; ++j) {
        const int64_t start = j * a / o, end = ((j + 1) * a + o - 1) / o;
        for (int64_t l = 0; l < longest; ++l) sources.push_back(std::min(start + l, end - 1));
      }
      Value index = c.b.constant_array_int(sources, {DType::Int64, {o * longest}});
      x = take_along(c.b, x, d, index);
      position = take_along(c.b, position, d, index);
      windows.push_back(o);
      windows.push_back(longest);
      reduced.push_back(lead + 2 * static_cast<int64_t>(i) + 1);
    }
    // [lead..., o1 * L1, ...] -> [lead..., o1, L1, ...]: the window positions are reduced.
    Shape split(x.shape().begin(), x.shape().begin() + lead);
    for (size_t i = 0; i < n; ++i) {
      split.push_back(windows[lead + 2 * i]);
      split.push_back(windows[lead + 2 * i + 1]);
    }
    x = c.b.reshape(x, split);
    position = c.b.reshape(position, split);
    const bool is_float = stablehlo::is_float(x.dtype());
    auto best = c.b.reduce({x, position}, {lowest(c.b, x.dtype()), c.b.constant_int(INT64_MAX, {DType::Int64, {}})},
                           reduced, [is_float](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                             // a[0], a[1]: one candidate (value, position); a[2], a[3]: the other.
                             Value greater = r.compare(stablehlo::Compare::GT, a[0], a[2]);
                             Value tie = r.binary(Binary::And, r.compare(stablehlo::Compare::EQ, a[0], a[2]),
                                                  r.compare(stablehlo::Compare::LT, a[1], a[3]));
                             Value first = r.binary(Binary::Or, greater, tie);
                             if (is_float) {
                               Value nan0 = r.compare(stablehlo::Compare::NE, a[0], a[0]),
                                     nan2 = r.compare(stablehlo::Compare::NE, a[2], a[2]);
                               Value later_nan = r.binary(Binary::And, nan0,
                                                          r.binary(Binary::Or, r.unary(stablehlo::Unary::Not, nan2),
                                                                   r.compare(stablehlo::Compare::GT, a[1], a[3])));
                               first = r.select(r.binary(Binary::Or, nan0, nan2), later_nan, first);
                             }
                             return {r.select(first, a[0], a[2]), r.select(first, a[1], a[3])};
                           });
    return {c.b.reshape(best[0], out.shape), c.b.reshape(best[1], c.out(1).shape)};
  };
}

// adaptive_max_pool{2,3}d_backward(grad_output, self, indices)
LoweringRule adaptive_max_pool_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &grad = c.tensor(0), &indices = c.tensor(2);
    if (c.out().numel() == 0 || grad.type.numel() == 0) return {c.b.constant(0, c.out())};
    return {indexed_gradient(c, grad, indices, n)};
  };
}

// The divisor of each average-pooling window, broadcast to the output shape:
// how many input elements it covers, or with count_include_pad how many
// input and padding elements (not the extra windows of ceil_mode).
Value avg_divisor(Builder& b, const Window& w, const Shape& in, const Shape& out, bool count_include_pad, DType t) {
  Shape spatial_in(in.begin() + w.lead, in.end()), spatial_out(out.begin() + w.lead, out.end());
  Value ones = b.constant(1, {t, spatial_in});
  Pads pads;
  if (count_include_pad) {
    ones = b.pad(ones, b.scalar(1, t), w.padding, w.padding, std::vector<int64_t>(w.n, 0));
    for (size_t i = 0; i < w.n; ++i)
      pads.push_back({0, std::max<int64_t>(0, (spatial_out[i] - 1) * w.stride[i] + w.kernel[i] - ones.shape()[i])});
  } else {
    for (size_t i = 0; i < w.n; ++i)
      pads.push_back({w.padding[i], std::max<int64_t>(0, (spatial_out[i] - 1) * w.stride[i] + w.kernel[i] -
                                                             spatial_in[i] - w.padding[i])});
  }
  Value count = b.reduce_window({ones}, {b.scalar(0, t)}, w.kernel, w.stride, {}, {}, pads, add_body)[0];
  std::vector<int64_t> dims;
  for (size_t i = 0; i < w.n; ++i) dims.push_back(static_cast<int64_t>(w.lead + i));
  return b.broadcast_in_dim(first_windows(b, count, spatial_out), out, dims);
}

// Sums of each window of x, in the accumulation type.
Value window_sums(Builder& b, const Value& x, const Window& w, const Shape& out) {
  Value zero = b.scalar(0, x.dtype());
  Value s = b.reduce_window({x}, {zero}, w.full(w.kernel, 1), w.full(w.stride, 1), {}, {}, w.pads(x.shape(), out),
                            add_body)[0];
  return first_windows(b, s, out);
}

// The gradient of window_sums: each input element gets the sum of the
// gradients of the windows that cover it. grad is spread out by the stride
// (interior padding) and summed over stride-1 windows of the kernel's size.
Value window_sums_backward(Builder& b, const Value& grad, const Window& w, const Shape& in) {
  std::vector<int64_t> low(w.lead, 0), high(w.lead, 0), interior(w.lead, 0);
  for (size_t i = 0; i < w.n; ++i) {
    int64_t k = w.kernel[i], out = grad.shape()[w.lead + i];
    int64_t before = k - 1 - w.padding[i];
    low.push_back(before);
    high.push_back(in[w.lead + i] + k - 1 - (1 + w.stride[i] * (out - 1)) - before);
    interior.push_back(w.stride[i] - 1);
  }
  Value spread = b.pad(grad, b.scalar(0, grad.dtype()), low, high, interior);
  return b.reduce_window({spread}, {b.scalar(0, grad.dtype())}, w.full(w.kernel, 1), {}, {}, {},
                         Pads(in.size(), {0, 0}), add_body)[0];
}

void require_float(const Value& x, const char* op) {
  if (!stablehlo::is_float(x.dtype())) throw Declined(std::string(op) + ": integer input");
}

// avg_pool{2,3}d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
LoweringRule avg_pool(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    require_float(x, "avg_pool");
    const TensorType& out = c.out();
    if (out.numel() == 0) return {c.b.constant(0, out)};
    Window w = window(c, x, 1, n, false);
    DType t = opmath_type(out.dtype);
    Value sums = window_sums(c.b, c.b.cast(x, t), w, out.shape);
    Value divisor = c.has(6) ? c.b.constant(static_cast<double>(c.integer(6)), sums.type)
                             : avg_divisor(c.b, w, x.shape(), out.shape, c.args[5].b, t);
    return {c.b.cast(c.b.binary(Binary::Divide, sums, divisor), out.dtype)};
  };
}

// avg_pool{2,3}d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
// count_include_pad, divisor_override)
LoweringRule avg_pool_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &grad = c.tensor(0), &x = c.tensor(1);
    require_float(x, "avg_pool backward");
    const TensorType& in = c.out();
    if (in.numel() == 0 || grad.type.numel() == 0) return {c.b.constant(0, in)};
    Window w = window(c, x, 2, n, false);
    DType t = opmath_type(in.dtype);
    Value g = c.b.cast(grad, t);
    Value divisor = c.has(7) ? c.b.constant(static_cast<double>(c.integer(7)), g.type)
                             : avg_divisor(c.b, w, x.shape(), grad.shape(), c.args[6].b, t);
    Value per_element = c.b.binary(Binary::Divide, g, divisor);
    return {c.b.cast(window_sums_backward(c.b, per_element, w, in.shape), in.dtype)};
  };
}

// Whether every spatial size of `in` is a multiple of `out`'s (then the
// windows are a plain reduce_window).
bool evenly_pooled(const Shape& in, const Shape& out, size_t n) {
  if (in.size() != n + 1 && in.size() != n + 2) return true;  // adaptive_window refuses it
  for (size_t i = in.size() - n; i < in.size(); ++i)
    if (out[i] <= 0 || in[i] % out[i] != 0) return false;
  return true;
}

// The window of an adaptive average pool from `in` to `out` when every
// spatial size divides evenly: then PyTorch's windows are exactly these.
Window adaptive_window(const Shape& in, const Shape& out, size_t n) {
  Window w;
  w.n = n;
  if (in.size() != n + 1 && in.size() != n + 2)
    throw Declined("adaptive_avg_pool: input of rank " + std::to_string(in.size()));
  w.lead = in.size() - n;
  for (size_t i = 0; i < n; ++i) {
    int64_t a = in[w.lead + i], o = out[w.lead + i];
    if (o <= 0 || a % o != 0) throw Declined("adaptive_avg_pool: input size not a multiple of the output size");
    w.kernel.push_back(a / o);
  }
  w.stride = w.kernel;
  w.padding.assign(n, 0);
  w.dilation.assign(n, 1);
  return w;
}

double window_size(const Window& w) {
  double k = 1;
  for (int64_t v : w.kernel) k *= static_cast<double>(v);
  return k;
}

// Any sizes: PyTorch's window j of a dimension of a elements pooled to o
// spans [floor(j a / o), ceil((j + 1) a / o)). Each spatial dimension is a
// contraction with its 0/1 membership matrix [a, o] (the windows' sums, one
// dimension at a time), then the sums are divided by the windows' areas.
struct AdaptiveWindows {
  std::vector<Value> members;  // per spatial dimension, [a, o] of the accumulation type
  Value area;                  // [o1, ..., on]
};

AdaptiveWindows adaptive_windows(Builder& b, const Shape& in, const Shape& out, size_t lead, DType t) {
  AdaptiveWindows w;
  std::vector<double> area{1};
  Shape area_shape;
  for (size_t i = lead; i < in.size(); ++i) {
    const int64_t a = in[i], o = out[i];
    std::vector<double> member(a * o, 0), lengths;
    for (int64_t j = 0; j < o; ++j) {
      const int64_t start = j * a / o, end = ((j + 1) * a + o - 1) / o;
      for (int64_t k = start; k < end; ++k) member[k * o + j] = 1;
      lengths.push_back(static_cast<double>(end - start));
    }
    w.members.push_back(b.constant_array(member, {t, {a, o}}));
    std::vector<double> next;
    for (double x : area)
      for (double l : lengths) next.push_back(x * l);
    area = std::move(next);
    area_shape.push_back(o);
  }
  w.area = b.constant_array(area, {t, area_shape});
  return w;
}

// x [lead..., s1, ..., sn] contracted with one matrix per spatial dimension
// (its dimension `from`): [lead..., t1, ..., tn].
Value contract_spatial(Builder& b, Value x, const std::vector<Value>& matrices, size_t lead, int64_t from) {
  for (const Value& m : matrices)
    x = b.dot_general(x, m, {}, {}, {static_cast<int64_t>(lead)}, {from});  // moves the dimension to the end
  return x;
}

Value divided_by_area(Builder& b, const Value& x, const Value& area, size_t lead) {
  std::vector<int64_t> dims;
  for (int64_t d = static_cast<int64_t>(lead); d < x.rank(); ++d) dims.push_back(d);
  return b.binary(Binary::Divide, x, b.broadcast_in_dim(area, x.shape(), dims));
}

// _adaptive_avg_pool{2,3}d(self, output_size)
LoweringRule adaptive_avg_pool(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value& x = c.tensor(0);
    require_float(x, "adaptive_avg_pool");
    const TensorType& out = c.out();
    if (out.numel() == 0 || x.type.numel() == 0) throw Declined("adaptive_avg_pool: empty");
    DType t = opmath_type(out.dtype);
    if (!evenly_pooled(x.shape(), out.shape, n)) {
      const size_t lead = x.rank() - n;
      AdaptiveWindows w = adaptive_windows(c.b, x.shape(), out.shape, lead, t);
      Value sums = contract_spatial(c.b, c.b.cast(x, t), w.members, lead, 0);
      return {c.b.cast(divided_by_area(c.b, sums, w.area, lead), out.dtype)};
    }
    Window w = adaptive_window(x.shape(), out.shape, n);
    Value sums = window_sums(c.b, c.b.cast(x, t), w, out.shape);
    return {c.b.cast(c.b.binary(Binary::Divide, sums, c.b.constant(window_size(w), sums.type)), out.dtype)};
  };
}

// _adaptive_avg_pool{2,3}d_backward(grad_output, self)
LoweringRule adaptive_avg_pool_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    const Value &grad = c.tensor(0), &x = c.tensor(1);
    require_float(x, "adaptive_avg_pool backward");
    const TensorType& in = c.out();
    if (in.numel() == 0 || grad.type.numel() == 0) throw Declined("adaptive_avg_pool backward: empty");
    DType t = opmath_type(in.dtype);
    Value g = c.b.cast(grad, t);
    if (!evenly_pooled(x.shape(), grad.shape(), n)) {
      const size_t lead = x.rank() - n;
      AdaptiveWindows w = adaptive_windows(c.b, x.shape(), grad.shape(), lead, t);
      Value spread = contract_spatial(c.b, divided_by_area(c.b, g, w.area, lead), w.members, lead, 1);
      return {c.b.cast(spread, in.dtype)};
    }
    Window w = adaptive_window(x.shape(), grad.shape(), n);
    Value per_element = c.b.binary(Binary::Divide, g, c.b.constant(window_size(w), g.type));
    return {c.b.cast(window_sums_backward(c.b, per_element, w, in.shape), in.dtype)};
  };
}

}  // namespace

LOWERING("aten::max_pool2d_with_indices", max_pool_with_indices(2));
LOWERING("aten::max_pool3d_with_indices", max_pool_with_indices(3));
LOWERING("aten::max_pool2d_with_indices_backward", max_pool_backward(2));
LOWERING("aten::max_pool3d_with_indices_backward", max_pool_backward(3));
LOWERING("aten::avg_pool2d", avg_pool(2));
LOWERING("aten::avg_pool3d", avg_pool(3));
LOWERING("aten::avg_pool2d_backward", avg_pool_backward(2));
LOWERING("aten::avg_pool3d_backward", avg_pool_backward(3));
LOWERING("aten::_adaptive_avg_pool2d", adaptive_avg_pool(2));
LOWERING("aten::adaptive_max_pool2d", adaptive_max_pool(2));
LOWERING("aten::max_unpool2d", max_unpool(2));
LOWERING("aten::fractional_max_pool2d", fractional_max_pool(2));
LOWERING("aten::fractional_max_pool3d", fractional_max_pool(3));
LOWERING("aten::fractional_max_pool2d_backward", fractional_max_pool_backward(2));
LOWERING("aten::fractional_max_pool3d_backward", fractional_max_pool_backward(3));
LOWERING("aten::max_unpool3d", max_unpool(3));
LOWERING("aten::adaptive_max_pool3d", adaptive_max_pool(3));
LOWERING("aten::adaptive_max_pool2d_backward", adaptive_max_pool_backward(2));
LOWERING("aten::adaptive_max_pool3d_backward", adaptive_max_pool_backward(3));
LOWERING("aten::_adaptive_avg_pool3d", adaptive_avg_pool(3));
LOWERING("aten::_adaptive_avg_pool2d_backward", adaptive_avg_pool_backward(2));
LOWERING("aten::_adaptive_avg_pool3d_backward", adaptive_avg_pool_backward(3));

}  // namespace torch_tpu::lowering
