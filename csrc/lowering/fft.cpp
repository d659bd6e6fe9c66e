// The discrete Fourier transforms torch.fft lowers to: _fft_c2c, _fft_r2c and
// _fft_c2r, on stablehlo.fft. It transforms the innermost 1 to 3 dimensions,
// so the transformed dims are moved there and back.
#include <cmath>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::FftType;

// The transformed dims, normalized, in the op's order.
std::vector<int64_t> fft_dims(LoweringContext& c, const Value& x) {
  std::vector<int64_t> dims;
  for (int64_t d : c.ints(1)) dims.push_back(normalize_dim(d, x.rank()));
  return dims;
}

// x's dims reordered: the others first, then `dims` in order (the innermost).
std::vector<int64_t> to_innermost(int64_t rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  perm.insert(perm.end(), dims.begin(), dims.end());
  return perm;
}

// `type` over `dims` of x, with signal sizes `length` (one per dim).
Value transform(Builder& b, const Value& x, const std::vector<int64_t>& dims, FftType type,
                const std::vector<int64_t>& length) {
  const auto perm = to_innermost(x.rank(), dims);
  return b.transpose(b.fft(b.transpose(x, perm), type, length), inverse_permutation(perm));
}

// PyTorch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n, for a signal of n elements.
double norm_scale(int64_t mode, double n) { return mode == 1 ? 1 / std::sqrt(n) : mode == 2 ? 1 / n : 1; }

Value scaled(Builder& b, const Value& x, double factor) {
  return factor == 1 ? x : b.binary(stablehlo::Binary::Multiply, x, b.constant(factor, x.type));
}

// _fft_c2c(self, dim, normalization, forward). XLA's IFFT divides by n; PyTorch's inverse does not.
std::vector<Value> c2c(LoweringContext& c) {
  Value x = c.tensor(0);
  const auto dims = fft_dims(c, x);
  const bool forward = c.args[3].b;
  if (dims.empty()) return {x};
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(x.shape()[d]);
  const FftType type = forward ? FftType::FFT : FftType::IFFT;
  if (dims.size() <= 3) {
    std::vector<int64_t> length;
    for (int64_t d : dims) length.push_back(x.shape()[d]);
    x = transform(c.b, x, dims, type, length);
  } else {  // separable: one dim at a time
    for (int64_t d : dims) x = transform(c.b, x, {d}, type, {x.shape()[d]});
  }
  return {scaled(c.b, x, (forward ? 1 : n) * norm_scale(c.integer(2), n))};
}

// _fft_r2c(self, dim, normalization, onesided): the last dim of `dim` keeps
// n / 2 + 1 frequencies when onesided, all of them otherwise.
std::vector<Value> r2c(LoweringContext& c) {
  Value x = c.tensor(0);
  const auto dims = fft_dims(c, x);
  if (dims.empty() || dims.size() > 3) throw Declined("_fft_r2c: over " + std::to_string(dims.size()) + " dims");
  std::vector<int64_t> length;
  double n = 1;
  for (int64_t d : dims) {
    length.push_back(x.shape()[d]);
    n *= static_cast<double>(x.shape()[d]);
  }
  const double scale = norm_scale(c.integer(2), n);
  if (!c.args[3].b)
    return {scaled(c.b, transform(c.b, c.b.convert(x, c.out().dtype), dims, FftType::FFT, length), scale)};
  return {scaled(
      c.b, transform(c.b, c.b.cast(x, stablehlo::real_part_type(c.out().dtype)), dims, FftType::RFFT, length), scale)};
}

// _fft_c2r(self, dim, normalization, last_dim_size): the inverse of a onesided
// r2c; the last dim of `dim` grows back to last_dim_size.
std::vector<Value> c2r(LoweringContext& c) {
  Value x = c.tensor(0);
  const auto dims = fft_dims(c, x);
  if (dims.empty() || dims.size() > 3) throw Declined("_fft_c2r: over " + std::to_string(dims.size()) + " dims");
  std::vector<int64_t> length;
  for (int64_t d : dims) length.push_back(x.shape()[d]);
  length.back() = c.integer(3);
  if (x.shape()[dims.back()] != length.back() / 2 + 1) throw Declined("_fft_c2r: input not of n / 2 + 1 frequencies");
  double n = 1;
  for (int64_t l : length) n *= static_cast<double>(l);
  return {scaled(c.b, transform(c.b, x, dims, FftType::IRFFT, length), n * norm_scale(c.integer(2), n))};
}

LOWERING("aten::_fft_c2c", c2c);
LOWERING("aten::_fft_r2c", r2c);
LOWERING("aten::_fft_c2r", c2r);

}  // namespace
}  // namespace torch_tpu::lowering
