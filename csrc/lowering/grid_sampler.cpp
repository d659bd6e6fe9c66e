// grid_sampler_2d / grid_sampler_3d (F.grid_sample): every output point reads
// the input at the grid's coordinates in [-1, 1] (x for the last dim, then y,
// z), bilinearly (2^d taps), at the nearest point, or bicubically (4 x 4
// taps, 2-D), with zeros, border or reflection padding, as PyTorch's CPU
// kernel (ATen/native/GridSampler.h) computes them. Each tap is one gather of
// the channel vectors, weighted and summed in the opmath type.
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

enum Interpolation : int64_t { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum Padding : int64_t { kZeros = 0, kBorder = 1, kReflection = 2 };

struct Sampler {
  Builder& b;
  Math m;
  int64_t padding;
  bool align_corners;

  Value k(double v, const Value& like) { return m.k(v, like); }

  // [-1, 1] to a pixel coordinate of an axis of `size`.
  Value unnormalize(const Value& coord, int64_t size) {
    const double s = static_cast<double>(size);
    if (align_corners) return m.mul(m.mul(m.add(coord, k(1, coord)), k(0.5, coord)), k(s - 1, coord));
    return m.mul(m.sub(m.mul(m.add(coord, k(1, coord)), k(s, coord)), k(1, coord)), k(0.5, coord));
  }

  Value clip(const Value& coord, int64_t size) {
    return b.clamp(k(0, coord), coord, k(static_cast<double>(size - 1), coord));
  }

  // Reflects `in` into [twice_low / 2, twice_high / 2] as often as it takes.
  Value reflect(const Value& in, int64_t twice_low, int64_t twice_high) {
    if (twice_low == twice_high) return k(0, in);
    const double low = twice_low / 2.0, span = (twice_high - twice_low) / 2.0;
    Value x = b.unary(Unary::Abs, m.sub(in, k(low, in)));
    Value extra = b.binary(Binary::Remainder, x, k(span, x));
    Value flips = b.unary(Unary::Floor, m.div(x, k(span, x)));
    Value even = b.compare(Compare::EQ, b.binary(Binary::Remainder, flips, k(2, flips)), k(0, flips));
    return b.select(even, m.add(extra, k(low, x)), m.add(m.sub(k(span, x), extra), k(low, x)));
  }

  // The padding mode applied to a pixel coordinate.
  Value pad(const Value& coord, int64_t size) {
    if (padding == kBorder) return clip(coord, size);
    if (padding != kReflection) return coord;
    Value r = align_corners ? reflect(coord, 0, 2 * (size - 1)) : reflect(coord, -1, 2 * size - 1);
    return clip(r, size);
  }
};

// The channel vectors of x [N, S1..Sd, C] at integer points [N, O1..Od] per
// spatial dim, 0 where any point is out of range: [N, O1..Od, C].
Value taps(Builder& b, const Value& x, const std::vector<Value>& points) {
  const int64_t d = static_cast<int64_t>(points.size()), rank = x.rank();
  const Shape& out = points[0].shape();
  const TensorType it{DType::Int64, out};
  Value valid = b.constant(1, {DType::Bool, out});
  std::vector<Value> columns;
  Shape column_shape = out;
  column_shape.push_back(1);
  for (int64_t i = 0; i < d; ++i) {
    const int64_t size = x.shape()[i + 1];
    Value in = b.binary(Binary::And, b.compare(Compare::GE, points[i], b.constant_int(0, it)),
                        b.compare(Compare::LT, points[i], b.constant_int(size, it)));
    valid = b.binary(Binary::And, valid, in);
    columns.push_back(b.reshape(b.select(in, points[i], b.constant_int(0, it)), column_shape));
  }
  stablehlo::GatherDims g;
  g.offset_dims = {d + 1};
  for (int64_t i = 1; i <= d; ++i) g.collapsed_slice_dims.push_back(i), g.start_index_map.push_back(i);
  g.operand_batching_dims = {0};
  g.start_indices_batching_dims = {0};
  g.index_vector_dim = d + 1;
  std::vector<int64_t> slice(rank, 1);
  slice[rank - 1] = x.shape()[rank - 1];
  Value picked = b.gather(x, b.concatenate(columns, d + 1), g, slice);
  Shape full = picked.shape();
  std::vector<int64_t> dims(out.size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  return b.select(b.broadcast_in_dim(valid, full, dims), picked, b.constant(0, picked.type));
}

// PyTorch's cubic convolution weights (A = -0.75) of the four taps around t in [0, 1).
std::vector<Value> cubic_weights(Math& m, const Value& t) {
  const double a = -0.75;
  auto near = [&](const Value& x) {  // |x| <= 1
    return m.add(m.mul(m.mul(m.sub(m.mul(m.k(a + 2, x), x), m.k(a + 3, x)), x), x), m.k(1, x));
  };
  auto far = [&](const Value& x) {  // 1 < |x| < 2
    return m.sub(m.mul(m.add(m.mul(m.sub(m.mul(m.k(a, x), x), m.k(5 * a, x)), x), m.k(8 * a, x)), x), m.k(4 * a, x));
  };
  Value one = m.k(1, t);
  return {far(m.add(t, one)), near(t), near(m.sub(one, t)), far(m.sub(m.k(2, t), t))};
}

// grid_sampler_2d / 3d(input [N, C, S1..Sd], grid [N, O1..Od, d],
// interpolation_mode, padding_mode, align_corners) -> [N, C, O1..Od].
std::vector<Value> grid_sampler(LoweringContext& c) {
  const TensorType& out = c.out();
  if (out.numel() == 0) return {c.b.constant(0, out)};
  Builder& b = c.b;
  const DType t = opmath_type(out.dtype);
  Value input = b.cast(c.tensor(0), t), grid = b.cast(c.tensor(1), t);
  const int64_t d = input.rank() - 2, mode = c.integer(2);
  Sampler s{b, Math{b}, c.integer(3), c.args[4].b};
  // Channels last: [N, S1..Sd, C].
  std::vector<int64_t> to_last{0};
  for (int64_t i = 2; i < input.rank(); ++i) to_last.push_back(i);
  to_last.push_back(1);
  Value x = b.transpose(input, to_last);
  Shape points_shape(grid.shape().begin(), grid.shape().end() - 1);
  std::vector<Value> coord(d);  // per spatial dim, outermost first: the grid's last component is x (innermost)
  for (int64_t i = 0; i < d; ++i) {
    std::vector<int64_t> start(grid.rank(), 0), limit = grid.shape(), step(grid.rank(), 1);
    start.back() = d - 1 - i, limit.back() = d - i;
    coord[i] = b.reshape(b.slice(grid, start, limit, step), points_shape);
    coord[i] = s.unnormalize(coord[i], input.shape()[i + 2]);
  }
  const TensorType it{DType::Int64, points_shape};
  const int64_t channels = input.shape()[1];
  Shape sample_shape = points_shape;
  sample_shape.push_back(channels);
  std::vector<int64_t> point_dims(points_shape.size());
  for (size_t i = 0; i < point_dims.size(); ++i) point_dims[i] = static_cast<int64_t>(i);
  auto weighted = [&](const Value& tap, const Value& w) {
    return s.m.mul(tap, b.broadcast_in_dim(w, sample_shape, point_dims));
  };
  Value sum = b.constant(0, {t, sample_shape});
  if (mode == kBicubic) {
    if (d != 2) throw std::invalid_argument("grid_sampler: bicubic interpolation takes 4-D input");
    std::vector<Value> base(2), weights[2];
    for (int64_t i = 0; i < 2; ++i) {
      base[i] = b.unary(Unary::Floor, coord[i]);
      weights[i] = cubic_weights(s.m, s.m.sub(coord[i], base[i]));
    }
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t q = 0; q < 4; ++q) {
        const int64_t offset[2] = {r - 1, q - 1};
        std::vector<Value> points(2);
        for (int64_t i = 0; i < 2; ++i) {
          Value at = s.pad(s.m.add(base[i], s.k(static_cast<double>(offset[i]), base[i])), input.shape()[i + 2]);
          points[i] = b.convert(at, DType::Int64);  // truncation, as static_cast
        }
        sum = s.m.add(sum, weighted(taps(b, x, points), s.m.mul(weights[0][r], weights[1][q])));
      }
  } else {
    for (int64_t i = 0; i < d; ++i) coord[i] = s.pad(coord[i], input.shape()[i + 2]);
    if (mode == kNearest) {
      std::vector<Value> points(d);
      for (int64_t i = 0; i < d; ++i) points[i] = b.convert(b.unary(Unary::RoundNearestEven, coord[i]), DType::Int64);
      sum = taps(b, x, points);
    } else {
      std::vector<Value> low(d), frac(d);
      for (int64_t i = 0; i < d; ++i) {
        low[i] = b.unary(Unary::Floor, coord[i]);
        frac[i] = s.m.sub(coord[i], low[i]);
      }
      for (int64_t corner = 0; corner < (int64_t{1} << d); ++corner) {
        std::vector<Value> points(d);
        Value w = s.k(1, coord[0]);
        for (int64_t i = 0; i < d; ++i) {
          const bool high = (corner >> (d - 1 - i)) & 1;
          Value li = b.convert(low[i], DType::Int64);
          points[i] = high ? b.binary(Binary::Add, li, b.constant_int(1, it)) : li;
          // The weight of the low tap is (low + 1) - coord, of the high one coord - low.
          w = s.m.mul(w, high ? frac[i] : s.m.sub(s.m.add(low[i], s.k(1, low[i])), coord[i]));
        }
        sum = s.m.add(sum, weighted(taps(b, x, points), w));
      }
    }
  }
  // [N, O1..Od, C] back to [N, C, O1..Od].
  std::vector<int64_t> to_first{0, d + 1};
  for (int64_t i = 1; i <= d; ++i) to_first.push_back(i);
  return {b.cast(b.transpose(sum, to_first), out.dtype)};
}

}  // namespace

LOWERING("aten::grid_sampler_2d", grid_sampler);
LOWERING("aten::grid_sampler_3d", grid_sampler);

}  // namespace torch_tpu::lowering
