// Convolutions (any spatial rank, groups, dilation, transposed) and their
// backward, as stablehlo.convolution in PyTorch's NC... / OI... layouts.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::ConvDims;

// PyTorch passes int[1] for "same for every spatial dimension".
std::vector<int64_t> per_dim(const std::vector<int64_t>& v, size_t n) {
  return v.size() == 1 ? std::vector<int64_t>(n, v[0]) : v;
}

struct Window {
  size_t n;
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups;
};

// The weight of a transposed convolution [Cin, Cout/G, k...] as the weight of
// the equivalent forward convolution [Cout, Cin/G, k...], spatially flipped.
Value transposed_weight(Builder& b, const Value& w, int64_t groups) {
  const Shape& s = w.shape();
  int64_t cin = s[0], cout_g = s[1];
  Shape grouped{groups, cin / groups, cout_g};
  grouped.insert(grouped.end(), s.begin() + 2, s.end());
  std::vector<int64_t> perm{0, 2, 1};
  for (size_t i = 3; i < grouped.size(); ++i) perm.push_back(static_cast<int64_t>(i));
  Value t = b.transpose(b.reshape(w, grouped), perm);
  Shape merged{groups * cout_g, cin / groups};
  merged.insert(merged.end(), s.begin() + 2, s.end());
  std::vector<int64_t> spatial;
  for (int64_t d = 2; d < w.rank(); ++d) spatial.push_back(d);
  return b.reverse(b.reshape(t, merged), spatial);
}

Value forward_conv(Builder& b, const Value& x0, const Value& w0, const Window& win, bool transposed) {
  ConvDims dims = ConvDims::nchw(static_cast<int64_t>(win.n));
  // Widened operands (exact), as XLA:CPU runs no bfloat16 x bfloat16 -> float32 convolution.
  const DType acc = opmath_type(x0.dtype());
  const Value x = b.cast(x0, acc), w = b.cast(w0, acc);
  std::vector<std::pair<int64_t, int64_t>> pad;
  std::vector<int64_t> ones(win.n, 1);
  if (!transposed) {
    for (size_t i = 0; i < win.n; ++i) pad.push_back({win.padding[i], win.padding[i]});
    return b.convolution(x, w, dims, win.stride, pad, ones, win.dilation, win.groups, 1);
  }
  for (size_t i = 0; i < win.n; ++i) {
    int64_t k = w.shape()[2 + i], edge = win.dilation[i] * (k - 1) - win.padding[i];
    pad.push_back({edge, edge + win.output_padding[i]});
  }
  return b.convolution(x, transposed_weight(b, w, win.groups), dims, ones, pad, win.stride, win.dilation, win.groups,
                       1);
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
std::vector<Value> convolution(LoweringContext& c) {
  DType t = c.out().dtype;
  Value x = c.b.cast(c.tensor(0), t), w = c.b.cast(c.tensor(1), t);
  size_t n = static_cast<size_t>(x.rank() - 2);
  Window win{n,           per_dim(c.ints(3), n), per_dim(c.ints(4), n), per_dim(c.ints(5), n), per_dim(c.ints(7), n),
             c.integer(8)};
  Value y = forward_conv(c.b, x, w, win, c.args[6].b);
  if (c.has(2))
    y = c.b.binary(stablehlo::Binary::Add, y, c.b.broadcast_in_dim(c.b.cast(c.tensor(2), y.dtype()), y.shape(), {1}));
  return {c.b.cast(y, t)};
}

// The weight gradient of a forward convolution from `in` to `out` (grad_output):
// grad_weight[o, c, k] = sum_{n, x} in[n, c, k*d + x*s - p] * out[n, o, x], a
// convolution with in's channels as batch and batch as features, `out` as the
// kernel, stride and dilation swapped.
Value weight_grad(Builder& b, const Value& in, const Value& out, const Shape& kernel, const Window& win) {
  const size_t n = win.n;
  ConvDims d;
  d.lhs_batch = 1;
  d.lhs_feature = 0;
  d.rhs_input_feature = 0;
  d.rhs_output_feature = 1;
  d.out_batch = 1;
  d.out_feature = 0;
  std::vector<std::pair<int64_t, int64_t>> pad;
  std::vector<int64_t> ones(n, 1);
  for (size_t i = 0; i < n; ++i) {
    d.lhs_spatial.push_back(2 + static_cast<int64_t>(i));
    d.rhs_spatial.push_back(2 + static_cast<int64_t>(i));
    d.out_spatial.push_back(2 + static_cast<int64_t>(i));
    int64_t k = kernel[2 + i], size_in = in.shape()[2 + i], size_out = out.shape()[2 + i];
    int64_t high = win.dilation[i] * (k - 1) + win.stride[i] * (size_out - 1) + 1 - size_in - win.padding[i];
    pad.push_back({win.padding[i], high});
  }
  const DType acc = opmath_type(in.dtype());
  return b.convolution(b.cast(in, acc), b.cast(out, acc), d, win.dilation, pad, ones, win.stride, 1, win.groups);
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
//                      transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
std::vector<Value> convolution_backward(LoweringContext& c) {
  const std::vector<int64_t>& mask = c.ints(10);
  if (mask.size() != 3) throw Declined("convolution_backward: output_mask of size != 3");
  const bool transposed = c.args[7].b;
  // Outputs left out of output_mask are undefined (an empty Value).
  std::vector<Value> grads(3);
  DType t = c.tensor(1).dtype();
  Value go = c.b.cast(c.tensor(0), t), x = c.b.cast(c.tensor(1), t), w = c.b.cast(c.tensor(2), t);
  size_t n = static_cast<size_t>(x.rank() - 2);
  Window win{n, per_dim(c.ints(4), n), per_dim(c.ints(5), n), per_dim(c.ints(6), n), {}, c.integer(9)};

  if (!transposed) {
    // grad_input: the transposed convolution of grad_output with the same
    // weight, with output_padding restoring the input's exact size.
    if (mask[0]) {
      win.output_padding.resize(n);
      for (size_t i = 0; i < n; ++i) {
        int64_t k = w.shape()[2 + i], out = go.shape()[2 + i];
        win.output_padding[i] =
            x.shape()[2 + i] - ((out - 1) * win.stride[i] - 2 * win.padding[i] + win.dilation[i] * (k - 1) + 1);
      }
      grads[0] = c.b.cast(forward_conv(c.b, go, w, win, true), c.out(0).dtype);
    }
    if (mask[1]) grads[1] = c.b.cast(weight_grad(c.b, x, go, w.shape(), win), c.out(1).dtype);
  } else {
    // A transposed convolution is the adjoint of the forward one with the
    // same weight ([Cin, Cout/G, k...] read as [out, in/G, k...]): grad_input
    // is that forward convolution of grad_output, and grad_weight is its
    // weight gradient with grad_output as the input and input as the output.
    const std::vector<int64_t> output_padding = per_dim(c.ints(8), n);
    for (size_t i = 0; i < n; ++i)  // else the forward convolution's floor would keep one more row
      if (output_padding[i] >= win.stride[i])
        throw Declined("convolution_backward: transposed with output_padding >= stride");
    if (mask[0]) grads[0] = c.b.cast(forward_conv(c.b, go, w, win, false), c.out(0).dtype);
    if (mask[1]) grads[1] = c.b.cast(weight_grad(c.b, go, x, w.shape(), win), c.out(1).dtype);
  }

  if (mask[2]) {
    std::vector<int64_t> not_channel{0};
    for (int64_t i = 2; i < go.rank(); ++i) not_channel.push_back(i);
    // Low-precision sums accumulate in float32.
    DType st = opmath_type(t);
    Value sum = c.b.reduce(c.b.cast(go, st), c.b.scalar(0, st), not_channel, stablehlo::Binary::Add);
    grads[2] = c.b.cast(sum, c.out(2).dtype);
  }
  return grads;
}

// im2col(self [N?, C, H, W], kernel_size, dilation, padding, stride) ->
// [N?, C * kh * kw, L] (nn.Unfold): each kernel offset is a strided slice of
// the zero-padded input; column c * kh * kw + i * kw + j holds offset (i, j).
std::vector<Value> im2col(LoweringContext& c) {
  Value x = c.tensor(0);
  const bool batched = x.rank() == 4;
  if (!batched) x = c.b.reshape(x, {1, x.shape()[0], x.shape()[1], x.shape()[2]});
  const auto k = per_dim(c.ints(1), 2), d = per_dim(c.ints(2), 2), p = per_dim(c.ints(3), 2), s = per_dim(c.ints(4), 2);
  const int64_t n = x.shape()[0], ch = x.shape()[1];
  const int64_t oh = (x.shape()[2] + 2 * p[0] - d[0] * (k[0] - 1) - 1) / s[0] + 1;
  const int64_t ow = (x.shape()[3] + 2 * p[1] - d[1] * (k[1] - 1) - 1) / s[1] + 1;
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  Value padded = c.b.pad(x, c.b.scalar(0, x.dtype()), {0, 0, p[0], p[1]}, {0, 0, p[0], p[1]}, {0, 0, 0, 0});
  std::vector<Value> offsets;
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j) {
      Value block =
          c.b.slice(padded, {0, 0, i * d[0], j * d[1]},
                    {n, ch, i * d[0] + (oh - 1) * s[0] + 1, j * d[1] + (ow - 1) * s[1] + 1}, {1, 1, s[0], s[1]});
      offsets.push_back(c.b.reshape(block, {n, ch, 1, oh * ow}));
    }
  return {c.b.reshape(c.b.concatenate(offsets, 2), c.out().shape)};
}

// col2im(self [N?, C * kh * kw, L], output_size, kernel_size, dilation,
// padding, stride) -> [N?, C, H, W] (nn.Fold): each kernel offset's block is
// spread by interior padding to where it came from and the blocks are added.
std::vector<Value> col2im(LoweringContext& c) {
  Value x = c.tensor(0);
  const bool batched = x.rank() == 3;
  if (!batched) x = c.b.reshape(x, {1, x.shape()[0], x.shape()[1]});
  const auto size = per_dim(c.ints(1), 2), k = per_dim(c.ints(2), 2), d = per_dim(c.ints(3), 2),
             p = per_dim(c.ints(4), 2), s = per_dim(c.ints(5), 2);
  const int64_t n = x.shape()[0], ch = x.shape()[1] / (k[0] * k[1]);
  const int64_t hp = size[0] + 2 * p[0], wp = size[1] + 2 * p[1];
  const int64_t oh = (hp - d[0] * (k[0] - 1) - 1) / s[0] + 1, ow = (wp - d[1] * (k[1] - 1) - 1) / s[1] + 1;
  if (c.out().numel() == 0) return {c.b.constant(0, c.out())};
  const DType t = c.out().dtype, acc = opmath_type(t);
  Value cols = c.b.reshape(c.b.cast(x, acc), {n, ch, k[0] * k[1], oh, ow});
  Value sum = c.b.constant(0, {acc, {n, ch, hp, wp}});
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j) {
      const int64_t o = i * k[1] + j;
      Value block =
          c.b.reshape(c.b.slice(cols, {0, 0, o, 0, 0}, {n, ch, o + 1, oh, ow}, {1, 1, 1, 1, 1}), {n, ch, oh, ow});
      const int64_t top = i * d[0], left = j * d[1];
      Value placed =
          c.b.pad(block, c.b.scalar(0, acc), {0, 0, top, left},
                  {0, 0, hp - top - (oh - 1) * s[0] - 1, wp - left - (ow - 1) * s[1] - 1}, {0, 0, s[0] - 1, s[1] - 1});
      sum = c.b.binary(stablehlo::Binary::Add, sum, placed);
    }
  Value out = c.b.slice(sum, {0, 0, p[0], p[1]}, {n, ch, p[0] + size[0], p[1] + size[1]}, {1, 1, 1, 1});
  return {c.b.reshape(c.b.cast(out, t), c.out().shape)};
}

}  // namespace

LOWERING("aten::convolution", convolution);
LOWERING("aten::convolution_backward", convolution_backward);
LOWERING("aten::im2col", im2col);
LOWERING("aten::col2im", col2im);

}  // namespace torch_tpu::lowering
