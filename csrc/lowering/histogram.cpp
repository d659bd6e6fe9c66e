// torch.histogram and torch.histogramdd's pieces (_histogramdd_bin_edges,
// _histogramdd_from_bin_cts, _histogramdd_from_bin_tensors), as PyTorch's CPU
// kernel: the input's last dim D is the coordinate, the rest its samples;
// edges are torch.linspace over the range (the data's min and max when none
// is given, widened by 1/2 each way when they are equal); an element falls in
// the bin whose edges hold it, the last bin closed on the right, and counts
// (or adds its weight) only inside every dim's range. Without a host sync:
// the data's range is computed and checked on the device.
#include <cmath>
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

// The input as [M, D] (D = 1 for histogram's flat input).
Value samples(LoweringContext& c, bool flat) {
  const Value& x = c.tensor(0);
  if (flat) return c.b.reshape(x, {x.type.numel(), 1});
  const int64_t d = x.shape().back();
  return c.b.reshape(x, {d == 0 ? 0 : x.type.numel() / d, d});
}

Value column(Builder& b, const Value& x, int64_t d) {
  const int64_t m = x.shape()[0];
  return b.reshape(b.slice(x, {0, d}, {m, d + 1}, {1, 1}), {m});
}

// Dim d's bins + 1 edges: linspace over `range` (2 per dim) or the data's min and max.
Value edges_for(LoweringContext& c, const Value& x, int64_t d, int64_t bins, const std::vector<double>* range) {
  Builder& b = c.b;
  const DType t = x.dtype();
  Value lo, hi;
  if (range) {
    double l = (*range)[2 * d], h = (*range)[2 * d + 1];
    if (!std::isfinite(l) || !std::isfinite(h))
      throw std::invalid_argument("torch.histogramdd: dimension " + std::to_string(d) + "'s range [" +
                                  std::to_string(l) + ", " + std::to_string(h) + "] is not finite");
    if (l > h)
      throw std::invalid_argument("torch.histogramdd: min should not exceed max, but got min " + std::to_string(l) +
                                  " max " + std::to_string(h) + " for dimension " + std::to_string(d));
    if (l == h) l -= 0.5, h += 0.5;
    lo = b.scalar(l, t), hi = b.scalar(h, t);
  } else if (x.shape()[0] == 0) {
    lo = b.scalar(0, t), hi = b.scalar(1, t);  // numpy's default for empty input
  } else {
    Value col = column(b, x, d);
    lo = b.reduce(col, highest(b, t), {0}, Binary::Minimum);
    hi = b.reduce(col, lowest(b, t), {0}, Binary::Maximum);
    // NaN anywhere makes the range NaN, as aminmax does.
    Value any_nan = b.reduce(b.compare(Compare::NE, col, col), b.scalar(0, DType::Bool), {0}, Binary::Or);
    lo = b.select(any_nan, b.scalar(NAN, t), lo);
    hi = b.select(any_nan, b.scalar(NAN, t), hi);
    Value finite = b.binary(Binary::And, b.unary(Unary::IsFinite, lo), b.unary(Unary::IsFinite, hi));
    c.checks.push_back({finite, "torch.histogramdd: dimension " + std::to_string(d) + "'s range is not finite", false});
    Value equal = b.compare(Compare::EQ, lo, hi);
    lo = b.select(equal, b.binary(Binary::Subtract, lo, b.scalar(0.5, t)), lo);
    hi = b.select(equal, b.binary(Binary::Add, hi, b.scalar(0.5, t)), hi);
  }
  return spaced_values(b, lo, hi, bins + 1);
}

// The D-dim histogram of x [M, D] over the edges of each dim, weighted and
// normalized as asked: [n_0, ..., n_D-1].
Value histogram_of(LoweringContext& c, const Value& x, const std::vector<Value>& edges, size_t weight_arg,
                   bool density) {
  Builder& b = c.b;
  const DType t = x.dtype();
  const int64_t m = x.shape()[0];
  Shape bins;
  for (const Value& e : edges) bins.push_back(e.shape()[0] - 1);
  int64_t total = 1;
  for (int64_t n : bins) total *= n;
  if (total == 0) return b.constant(0, {t, bins});
  Value hist = b.constant(0, {t, bins});
  if (m > 0) {
    const TensorType it{DType::Int64, {m}};
    Value flat = b.constant_int(0, it), valid = b.constant(1, {DType::Bool, {m}});
    for (size_t d = 0; d < edges.size(); ++d) {
      const Value& e = edges[d];
      const int64_t n = bins[d];
      Value col = column(b, x, static_cast<int64_t>(d));
      Value first = b.reshape(b.slice(e, {0}, {1}, {1}), {}), last = b.reshape(b.slice(e, {n}, {n + 1}, {1}), {});
      Value inside = b.binary(Binary::And, b.compare(Compare::GE, col, b.broadcast_to(first, {m})),
                              b.compare(Compare::LE, col, b.broadcast_to(last, {m})));  // false for NaN
      valid = b.binary(Binary::And, valid, inside);
      // The bin: how many edges are <= the element, less one; the last bin keeps its right edge.
      Value le =
          b.compare(Compare::LE, b.broadcast_in_dim(e, {m, n + 1}, {1}), b.broadcast_in_dim(col, {m, n + 1}, {0}));
      Value count = b.reduce(
          b.select(le, b.constant_int(1, {DType::Int64, {m, n + 1}}), b.constant_int(0, {DType::Int64, {m, n + 1}})),
          b.constant_int(0, {DType::Int64, {}}), {1}, Binary::Add);
      Value pos = b.clamp(b.constant_int(0, it), b.binary(Binary::Subtract, count, b.constant_int(1, it)),
                          b.constant_int(n - 1, it));
      flat = b.binary(Binary::Add, b.binary(Binary::Multiply, flat, b.constant_int(n, it)), pos);
    }
    Value w = c.has(weight_arg) ? b.reshape(b.cast(c.tensor(weight_arg), t), {m}) : b.constant(1, {t, {m}});
    w = b.select(valid, w, b.constant(0, {t, {m}}));
    stablehlo::ScatterDims s;
    s.inserted_window_dims = {0};
    s.scatter_dims_to_operand_dims = {0};
    s.index_vector_dim = 1;
    hist = b.reshape(
        b.scatter(b.constant(0, {t, {total}}), b.reshape(flat, {m, 1}), w, s, stablehlo::ScatterCombine::Add), bins);
  }
  // Empty input: zeros, which density turns into 0 / 0 = NaN as on CPU.
  if (density) {
    std::vector<int64_t> all(bins.size());
    for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int64_t>(d);
    Value sum = b.reduce(hist, b.scalar(0, t), all, Binary::Add);
    hist = b.binary(Binary::Divide, hist, b.broadcast_to(sum, bins));
    for (size_t d = 0; d < edges.size(); ++d) {
      const int64_t n = bins[d];
      Value width = b.binary(Binary::Subtract, b.slice(edges[d], {1}, {n + 1}, {1}), b.slice(edges[d], {0}, {n}, {1}));
      hist = b.binary(Binary::Divide, hist, b.broadcast_in_dim(width, bins, {static_cast<int64_t>(d)}));
    }
  }
  return hist;
}

const std::vector<double>* range_arg(const LoweringContext& c, size_t i) {
  return c.has(i) ? &c.args[i].numbers : nullptr;
}

// histogram.bin_ct(self, bins, *, range, weight, density) -> (hist, bin_edges)
std::vector<Value> histogram_bin_ct(LoweringContext& c) {
  Value x = samples(c, true);
  Value edges = edges_for(c, x, 0, c.integer(1), range_arg(c, 2));
  return {histogram_of(c, x, {edges}, 3, c.has(4) && c.args[4].b), edges};
}

// histogram.bins_tensor(self, bins, *, weight, density) -> (hist, bin_edges)
std::vector<Value> histogram_bins_tensor(LoweringContext& c) {
  Value x = samples(c, true), edges = c.b.cast(c.tensor(1), x.dtype());
  return {histogram_of(c, x, {edges}, 2, c.has(3) && c.args[3].b), edges};
}

// Every dim's edges from the bin counts (argument 1) and range (argument 2).
std::vector<Value> edges_from_counts(LoweringContext& c, const Value& x) {
  std::vector<Value> edges;
  const std::vector<int64_t>& bins = c.ints(1);
  for (size_t d = 0; d < bins.size(); ++d)
    edges.push_back(edges_for(c, x, static_cast<int64_t>(d), bins[d], range_arg(c, 2)));
  return edges;
}

// _histogramdd_bin_edges(self, bins, *, range, weight, density) -> Tensor[]
std::vector<Value> histogramdd_bin_edges(LoweringContext& c) { return edges_from_counts(c, samples(c, false)); }

// _histogramdd_from_bin_cts(self, bins, *, range, weight, density) -> hist
std::vector<Value> histogramdd_from_bin_cts(LoweringContext& c) {
  Value x = samples(c, false);
  return {histogram_of(c, x, edges_from_counts(c, x), 3, c.has(4) && c.args[4].b)};
}

// _histogramdd_from_bin_tensors(self, bins, *, weight, density) -> hist
std::vector<Value> histogramdd_from_bin_tensors(LoweringContext& c) {
  Value x = samples(c, false);
  std::vector<Value> edges;
  for (const Value& e : c.args[1].tensors) edges.push_back(c.b.cast(e, x.dtype()));
  return {histogram_of(c, x, edges, 2, c.has(3) && c.args[3].b)};
}

}  // namespace

LOWERING("aten::histogram.bin_ct", histogram_bin_ct);
LOWERING("aten::histogram.bins_tensor", histogram_bins_tensor);
LOWERING("aten::_histogramdd_bin_edges", histogramdd_bin_edges);
LOWERING("aten::_histogramdd_from_bin_cts", histogramdd_from_bin_cts);
LOWERING("aten::_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors);

}  // namespace torch_tpu::lowering
