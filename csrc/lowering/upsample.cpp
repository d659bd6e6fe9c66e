// Upsampling by nearest neighbour (legacy and exact) and by linear
// interpolation (1-d, 2-d, 3-d), forward and backward. Every source index and
// weight depends only on static sizes and scales, so they are computed here
// with PyTorch's own float arithmetic (ATen/native/UpSample.h) and embedded as
// constants: the forward gathers along each spatial dimension, the backward
// scatter-adds. The .vec overloads are composite and reach us as these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;

// A float? scale argument.
std::optional<double> scale_arg(const LoweringContext& c, size_t i) {
  if (!c.has(i)) return std::nullopt;
  return c.number(i);
}

// compute_scales_value: 1/scale when one is given (> 0), else in/out, in T.
template <class T>
T scales_value(std::optional<double> scale, int64_t in, int64_t out) {
  return scale && *scale > 0. ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
}

// nearest_idx / nearest_exact_idx: the source index of output index o.
int64_t nearest_index(int64_t o, int64_t in, int64_t out, std::optional<double> scale, bool exact) {
  if (!exact) {
    if (out == in) return o;
    if (out == 2 * in) return o >> 1;
    float s = scales_value<float>(scale, in, out);
    return std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * s)), in - 1);
  }
  float s = scales_value<float>(scale, in, out);
  // (dst_index + 0.5) * scale is double; floorf takes it as a float.
  double at = (static_cast<double>(o) + 0.5) * static_cast<double>(s);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(at))), in - 1);
}

// The two source indices and weights of each output index of linear interpolation.
struct LinearTaps {
  std::vector<int64_t> i0, i1;
  std::vector<double> w0, w1;
};

// compute_source_index_and_lambda over area_pixel_compute_scale, in T (the
// opmath type of a float or double input).
template <class T>
LinearTaps linear_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0))
                          : scales_value<T>(scale, in, out);
  LinearTaps t;
  for (int64_t o = 0; o < out; ++o) {
    if (out == in) {
      t.i0.push_back(o);
      t.i1.push_back(o);
      t.w0.push_back(1);
      t.w1.push_back(0);
      continue;
    }
    T real;
    if (align_corners) {
      real = ratio * static_cast<T>(o);
    } else {
      real = ratio * (static_cast<T>(o) + static_cast<T>(0.5)) - static_cast<T>(0.5);
      if (real < T(0)) real = T(0);
    }
    // guard_index_and_lambda: floorf, so a double index is floored as a float.
    int64_t i0 = std::min(static_cast<int64_t>(std::floor(static_cast<float>(real))), in - 1);
    T lambda1 = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
    t.i0.push_back(i0);
    t.i1.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    t.w0.push_back(static_cast<double>(T(1) - lambda1));
    t.w1.push_back(static_cast<double>(lambda1));
  }
  return t;
}

LinearTaps taps(DType t, int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  return t == DType::Float64 ? linear_taps<double>(in, out, align_corners, scale)
                             : linear_taps<float>(in, out, align_corners, scale);
}

// The four source indices (clamped to the input) and weights of each output
// index of bicubic interpolation (A = -0.75), as get_cubic_upsample_coefficients
// computes them in T: the source index is not clamped below 0 first.
struct CubicTaps {
  std::vector<int64_t> index[4];
  std::vector<double> weight[4];
};

template <class T>
CubicTaps cubic_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  const T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0))
                                : scales_value<T>(scale, in, out);
  const T a = static_cast<T>(-0.75);
  auto near = [a](T x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };       // |x| <= 1
  auto far = [a](T x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };  // 1 < |x| < 2
  CubicTaps t;
  for (int64_t o = 0; o < out; ++o) {
    const T real = align_corners ? ratio * static_cast<T>(o)
                                 : ratio * (static_cast<T>(o) + static_cast<T>(0.5)) - static_cast<T>(0.5);
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(static_cast<float>(real))), in - 1);
    const T lambda = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
    const T w[4] = {far(lambda + 1), near(lambda), near(1 - lambda), far(2 - lambda)};
    for (int k = 0; k < 4; ++k) {
      t.index[k].push_back(std::clamp<int64_t>(i0 - 1 + k, 0, in - 1));
      t.weight[k].push_back(static_cast<double>(w[k]));
    }
  }
  return t;
}

CubicTaps cubic(DType t, int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  return t == DType::Float64 ? cubic_taps<double>(in, out, align_corners, scale)
                             : cubic_taps<float>(in, out, align_corners, scale);
}

bool is_identity(const std::vector<int64_t>& idx, int64_t size) {
  if (static_cast<int64_t>(idx.size()) != size) return false;
  for (int64_t i = 0; i < size; ++i)
    if (idx[i] != i) return false;
  return true;
}

// x with dimension d replaced by x[..., idx[k], ...] for each k.
Value take(Builder& b, const Value& x, int64_t d, const std::vector<int64_t>& idx) {
  if (is_identity(idx, x.shape()[d])) return x;
  const int64_t k = static_cast<int64_t>(idx.size());
  stablehlo::GatherDims g;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != d) g.offset_dims.push_back(i);
  g.collapsed_slice_dims = {d};
  g.start_index_map = {d};
  g.index_vector_dim = 1;
  Shape sizes = x.shape();
  sizes[d] = 1;
  return b.gather(x, b.constant_array_int(idx, {DType::Int64, {k, 1}}), g, sizes);
}

// The gradient of take: zeros of `size` along d with updates[..., k, ...]
// added at idx[k].
Value put_add(Builder& b, const Value& updates, int64_t d, const std::vector<int64_t>& idx, int64_t size) {
  if (is_identity(idx, size)) return updates;
  const int64_t k = static_cast<int64_t>(idx.size());
  stablehlo::ScatterDims s;
  for (int64_t i = 0; i < updates.rank(); ++i)
    if (i != d) s.update_window_dims.push_back(i);
  s.inserted_window_dims = {d};
  s.scatter_dims_to_operand_dims = {d};
  s.index_vector_dim = 1;
  Shape shape = updates.shape();
  shape[d] = size;
  return b.scatter(b.constant(0, {updates.dtype(), shape}), b.constant_array_int(idx, {DType::Int64, {k, 1}}), updates,
                   s, stablehlo::ScatterCombine::Add);
}

// weights (one per index along d) broadcast over x and multiplied in.
Value weigh(Builder& b, const Value& x, int64_t d, const std::vector<double>& w) {
  Value c = b.constant_array(w, {x.dtype(), {static_cast<int64_t>(w.size())}});
  return b.binary(Binary::Multiply, x, b.broadcast_in_dim(c, x.shape(), {d}));
}

void require_rank(const TensorType& t, size_t n, const char* op) {
  if (t.rank() != static_cast<int64_t>(n) + 2)
    throw Declined(std::string(op) + ": input of rank " + std::to_string(t.rank()));
}

// upsample_nearest{n}d(self, output_size, scales...) and _upsample_nearest_exact{n}d.
LoweringRule nearest(size_t n, bool exact) {
  return [n, exact](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    const TensorType& out = c.out();
    require_rank(x.type, n, "upsample_nearest");
    if (out.numel() == 0) return {c.b.constant(0, out)};
    for (size_t i = n; i-- > 0;) {
      const int64_t d = static_cast<int64_t>(i) + 2, in_size = x.shape()[d], out_size = out.shape[d];
      std::vector<int64_t> idx;
      for (int64_t o = 0; o < out_size; ++o)
        idx.push_back(nearest_index(o, in_size, out_size, scale_arg(c, 2 + i), exact));
      x = take(c.b, x, d, idx);
    }
    return {x};
  };
}

// upsample_nearest{n}d_backward(grad_output, output_size, input_size, scales...) and the exact one.
LoweringRule nearest_backward(size_t n, bool exact) {
  return [n, exact](LoweringContext& c) -> std::vector<Value> {
    const Value& grad = c.tensor(0);
    const TensorType& in = c.out();
    require_rank(in, n, "upsample_nearest backward");
    if (!stablehlo::is_float(in.dtype)) throw Declined("upsample_nearest backward: integer gradient");
    if (in.numel() == 0 || grad.type.numel() == 0) return {c.b.constant(0, in)};
    Value g = c.b.cast(grad, opmath_type(in.dtype));
    for (size_t i = n; i-- > 0;) {
      const int64_t d = static_cast<int64_t>(i) + 2, in_size = in.shape[d], out_size = grad.shape()[d];
      std::vector<int64_t> idx;
      for (int64_t o = 0; o < out_size; ++o)
        idx.push_back(nearest_index(o, in_size, out_size, scale_arg(c, 3 + i), exact));
      g = put_add(c.b, g, d, idx, in_size);
    }
    return {c.b.cast(g, in.dtype)};
  };
}

// Linear interpolation is written for float and double. The forward of a
// half-precision input computes in float32 and rounds once, bit-exactly as
// CPU does; CPU's half backward accumulates in half, so that one declines.
void require_float_or_double(DType t, const char* op) {
  if (t != DType::Float32 && t != DType::Float64) throw Declined(std::string(op) + ": not float32/float64");
}

// upsample_{linear1d,bilinear2d,trilinear3d}(self, output_size, align_corners, scales...).
// The last dimension is interpolated first, as PyTorch's kernel nests them:
// out = (x00 * w0 + x01 * w1) * h0 + (x10 * w0 + x11 * w1) * h1.
LoweringRule linear(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    Value x = c.tensor(0);
    const TensorType& out = c.out();
    require_rank(x.type, n, "upsample_linear");
    if (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16) x = c.b.cast(x, DType::Float32);
    require_float_or_double(x.dtype(), "upsample_linear");
    if (out.numel() == 0) return {c.b.constant(0, out)};
    const bool align_corners = c.args[2].b;
    for (size_t i = n; i-- > 0;) {
      const int64_t d = static_cast<int64_t>(i) + 2, in_size = x.shape()[d], out_size = out.shape[d];
      LinearTaps t = taps(x.dtype(), in_size, out_size, align_corners, scale_arg(c, 3 + i));
      x = c.b.binary(Binary::Add, weigh(c.b, take(c.b, x, d, t.i0), d, t.w0),
                     weigh(c.b, take(c.b, x, d, t.i1), d, t.w1));
    }
    return {c.b.cast(x, out.dtype)};
  };
}

// upsample_{linear1d,bilinear2d,trilinear3d}_backward(grad_output, output_size, input_size,
// align_corners, scales...): per dimension, each gradient times its two weights
// added in at its two source indices.
LoweringRule linear_backward(size_t n) {
  return [n](LoweringContext& c) -> std::vector<Value> {
    Value g = c.tensor(0);
    const TensorType& in = c.out();
    require_rank(in, n, "upsample_linear backward");
    require_float_or_double(in.dtype, "upsample_linear backward");
    if (in.numel() == 0 || g.type.numel() == 0) return {c.b.constant(0, in)};
    const bool align_corners = c.args[3].b;
    g = c.b.cast(g, in.dtype);
    for (size_t i = n; i-- > 0;) {
      const int64_t d = static_cast<int64_t>(i) + 2, in_size = in.shape[d], out_size = g.shape()[d];
      LinearTaps t = taps(in.dtype, in_size, out_size, align_corners, scale_arg(c, 4 + i));
      if (out_size == in_size) continue;  // the identity: weights 1 and 0 at the same index
      std::vector<int64_t> idx = t.i0;
      idx.insert(idx.end(), t.i1.begin(), t.i1.end());
      Value updates = c.b.concatenate({weigh(c.b, g, d, t.w0), weigh(c.b, g, d, t.w1)}, d);
      g = put_add(c.b, updates, d, idx, in_size);
    }
    return {g};
  };
}

// upsample_bicubic2d(self, output_size, align_corners, scales_h, scales_w):
// the width interpolated first, then the height, as PyTorch's kernel nests them.
std::vector<Value> bicubic(LoweringContext& c) {
  Value x = c.tensor(0);
  const TensorType& out = c.out();
  require_rank(x.type, 2, "upsample_bicubic2d");
  if (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16) x = c.b.cast(x, DType::Float32);
  require_float_or_double(x.dtype(), "upsample_bicubic2d");
  if (out.numel() == 0) return {c.b.constant(0, out)};
  const bool align_corners = c.args[2].b;
  for (size_t i = 2; i-- > 0;) {
    const int64_t d = static_cast<int64_t>(i) + 2;
    CubicTaps t = cubic(x.dtype(), x.shape()[d], out.shape[d], align_corners, scale_arg(c, 3 + i));
    Value sum = weigh(c.b, take(c.b, x, d, t.index[0]), d, t.weight[0]);
    for (int k = 1; k < 4; ++k)
      sum = c.b.binary(Binary::Add, sum, weigh(c.b, take(c.b, x, d, t.index[k]), d, t.weight[k]));
    x = sum;
  }
  return {c.b.cast(x, out.dtype)};
}

// upsample_bicubic2d_backward(grad_output, output_size, input_size,
// align_corners, scales_h, scales_w): each gradient times its four weights
// added in at its four source indices, per dimension.
std::vector<Value> bicubic_backward(LoweringContext& c) {
  Value g = c.tensor(0);
  const TensorType& in = c.out();
  require_rank(in, 2, "upsample_bicubic2d backward");
  const DType t = in.dtype == DType::BFloat16 || in.dtype == DType::Float16 ? DType::Float32 : in.dtype;
  require_float_or_double(t, "upsample_bicubic2d backward");
  if (in.numel() == 0 || g.type.numel() == 0) return {c.b.constant(0, in)};
  const bool align_corners = c.args[3].b;
  g = c.b.cast(g, t);
  for (size_t i = 2; i-- > 0;) {
    const int64_t d = static_cast<int64_t>(i) + 2, in_size = in.shape[d];
    CubicTaps taps = cubic(t, in_size, g.shape()[d], align_corners, scale_arg(c, 4 + i));
    std::vector<int64_t> idx;
    std::vector<Value> parts;
    for (int k = 0; k < 4; ++k) {
      idx.insert(idx.end(), taps.index[k].begin(), taps.index[k].end());
      parts.push_back(weigh(c.b, g, d, taps.weight[k]));
    }
    g = put_add(c.b, c.b.concatenate(parts, d), d, idx, in_size);
  }
  return {c.b.cast(g, in.dtype)};
}

}  // namespace

LOWERING("aten::upsample_nearest1d", nearest(1, false));
LOWERING("aten::upsample_nearest2d", nearest(2, false));
LOWERING("aten::upsample_nearest3d", nearest(3, false));
LOWERING("aten::_upsample_nearest_exact1d", nearest(1, true));
LOWERING("aten::_upsample_nearest_exact2d", nearest(2, true));
LOWERING("aten::_upsample_nearest_exact3d", nearest(3, true));
LOWERING("aten::upsample_nearest1d_backward", nearest_backward(1, false));
LOWERING("aten::upsample_nearest2d_backward", nearest_backward(2, false));
LOWERING("aten::upsample_nearest3d_backward", nearest_backward(3, false));
LOWERING("aten::_upsample_nearest_exact1d_backward", nearest_backward(1, true));
LOWERING("aten::_upsample_nearest_exact2d_backward", nearest_backward(2, true));
LOWERING("aten::_upsample_nearest_exact3d_backward", nearest_backward(3, true));
LOWERING("aten::upsample_linear1d", linear(1));
LOWERING("aten::upsample_bilinear2d", linear(2));
LOWERING("aten::upsample_bicubic2d", bicubic);
LOWERING("aten::upsample_bicubic2d_backward", bicubic_backward);
LOWERING("aten::upsample_trilinear3d", linear(3));
LOWERING("aten::upsample_linear1d_backward", linear_backward(1));
LOWERING("aten::upsample_bilinear2d_backward", linear_backward(2));
LOWERING("aten::upsample_trilinear3d_backward", linear_backward(3));

}  // namespace torch_tpu::lowering
