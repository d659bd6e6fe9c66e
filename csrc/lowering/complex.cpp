// Complex numbers: which rules take complex values, and the ops only complex
// numbers need. A rule not listed here never sees a complex value: the op
// runs on the CPU fallback instead (or raises with TORCH_TPU_FALLBACK=error),
// so a rule written for real numbers cannot give a silent wrong answer.
#include <cmath>
#include <set>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

// conj_physical: a + bi -> a - bi (real values are their own conjugate).
std::vector<Value> conj_physical(LoweringContext& c) {
  Value x = c.operand_as_output(0);
  if (!stablehlo::is_complex(x.dtype())) return {x};
  return {c.b.complex(c.b.real(x), c.b.unary(Unary::Negate, c.b.imag(x)))};
}

// complex(real, imag).
std::vector<Value> complex(LoweringContext& c) {
  const TensorType part{stablehlo::real_part_type(c.out().dtype), c.out().shape};
  return {c.b.complex(c.value_as(0, part), c.value_as(1, part))};
}

// polar(abs, angle) = abs * (cos(angle) + i sin(angle)).
std::vector<Value> polar(LoweringContext& c) {
  const TensorType part{stablehlo::real_part_type(c.out().dtype), c.out().shape};
  Value r = c.value_as(0, part), theta = c.value_as(1, part);
  return {c.b.complex(c.b.binary(Binary::Multiply, r, c.b.unary(Unary::Cos, theta)),
                      c.b.binary(Binary::Multiply, r, c.b.unary(Unary::Sin, theta)))};
}

// angle: atan2(imag, real); for real numbers pi below zero, 0 otherwise, NaN kept.
std::vector<Value> angle(LoweringContext& c) {
  Value x = c.tensor(0);
  if (stablehlo::is_complex(x.dtype())) return {c.b.binary(Binary::Atan2, c.b.imag(x), c.b.real(x))};
  x = c.operand_as_output(0);
  Value negative = c.b.compare(stablehlo::Compare::LT, x, c.b.constant(0, x.type));
  Value a = c.b.select(negative, c.b.constant(M_PI, x.type), c.b.constant(0, x.type));
  return {c.b.select(c.b.compare(stablehlo::Compare::NE, x, x), x, a)};
}

LOWERING("aten::_conj_physical", conj_physical);
LOWERING("aten::conj_physical", conj_physical);
LOWERING("aten::complex", complex);
LOWERING("aten::polar", polar);
LOWERING("aten::angle", angle);

}  // namespace

bool takes_complex(std::string_view op) {
  // Each checked against CPU on complex inputs (tests/python/test_complex.py):
  // its rule either does not care (data movement) or handles complex values.
  static const std::set<std::string, std::less<>> ops = {
      // the rules above, and the Fourier transforms (fft.cpp)
      "aten::_conj_physical", "aten::conj_physical", "aten::complex", "aten::polar", "aten::angle", "aten::_fft_c2c",
      "aten::_fft_r2c", "aten::_fft_c2r",
      // arithmetic and functions (Builder handles complex operands)
      "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar", "aten::mul.Tensor",
      "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar", "aten::neg", "aten::reciprocal", "aten::exp",
      "aten::log", "aten::log2", "aten::log10", "aten::sqrt", "aten::rsqrt", "aten::sin", "aten::cos", "aten::tan",
      "aten::tanh", "aten::sigmoid", "aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar",
      "aten::abs", "aten::sgn", "aten::eq.Tensor", "aten::eq.Scalar", "aten::ne.Tensor", "aten::ne.Scalar",
      "aten::where.self", "aten::fill.Tensor", "aten::fill.Scalar", "aten::zero", "aten::rsub.Tensor",
      "aten::rsub.Scalar", "aten::expm1", "aten::log1p", "aten::exp2", "aten::asin", "aten::acos", "aten::sinh",
      "aten::cosh", "aten::asinh", "aten::acosh", "aten::atanh", "aten::isnan", "aten::isinf", "aten::addcmul",
      "aten::addcdiv", "aten::logical_and", "aten::logical_or", "aten::logical_xor", "aten::logical_not",
      "aten::eye.m_out", "aten::eye.out", "aten::linspace.out", "aten::logspace.out", "aten::linalg_matrix_exp",
      "aten::unfold_backward", "aten::im2col", "aten::col2im", "aten::put", "aten::nonzero_static",
      "aten::count_nonzero", "aten::count_nonzero.dim_IntList", "aten::any", "aten::all", "aten::any.dim",
      "aten::all.dim", "aten::any.dims", "aten::all.dims", "aten::norm.Scalar", "aten::norm.ScalarOpt_dim",
      "aten::norm.ScalarOpt_dim_dtype", "aten::addbmm", "aten::scatter.reduce", "aten::logsumexp", "aten::lerp.Scalar",
      "aten::lerp.Tensor", "aten::sinc", "aten::silu", "aten::narrow_copy", "aten::pixel_shuffle",
      "aten::pixel_unshuffle", "aten::channel_shuffle", "aten::masked_scatter", "aten::trace", "aten::linalg_cross",
      "aten::scatter.value_reduce",
      // linear algebra (factorizations.cpp: conjugates, adjoints and |x|^2 where real code transposes and squares)
      "aten::linalg_cholesky_ex", "aten::cholesky", "aten::_cholesky_solve_helper", "aten::cholesky_inverse",
      "aten::linalg_solve_triangular", "aten::triangular_solve", "aten::linalg_lu_factor_ex", "aten::linalg_lu_solve",
      "aten::_linalg_solve_ex", "aten::linalg_inv_ex", "aten::_linalg_det", "aten::_linalg_slogdet", "aten::linalg_lu",
      "aten::lu_unpack", "aten::geqrf", "aten::linalg_householder_product", "aten::ormqr", "aten::linalg_qr",
      "aten::_linalg_eigh", "aten::_linalg_svd", "aten::linalg_lstsq",
      // reductions and products
      "aten::sum", "aten::sum.dim_IntList", "aten::mean", "aten::mean.dim", "aten::prod", "aten::prod.dim_int",
      "aten::var.correction", "aten::std.correction", "aten::var_mean.correction", "aten::std_mean.correction",
      "aten::linalg_vector_norm", "aten::mm", "aten::bmm", "aten::dot", "aten::vdot", "aten::addmm", "aten::baddbmm",
      "aten::addmv", "aten::addr", "aten::cumsum", "aten::cumprod",
      // data movement
      "aten::cat", "aten::flip", "aten::roll", "aten::repeat", "aten::index_select", "aten::gather",
      "aten::index.Tensor", "aten::slice_scatter", "aten::select_scatter", "aten::masked_fill.Tensor",
      "aten::masked_fill.Scalar", "aten::index_put", "aten::_index_put_impl", "aten::index_copy", "aten::index_add",
      "aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor", "aten::scatter.src", "aten::scatter.value",
      "aten::scatter_add", "aten::take", "aten::constant_pad_nd", "aten::triu", "aten::tril", "aten::reflection_pad1d",
      "aten::reflection_pad2d", "aten::reflection_pad3d", "aten::replication_pad1d", "aten::replication_pad2d",
      "aten::replication_pad3d"};
  return ops.count(op) > 0;
}

}  // namespace torch_tpu::lowering
