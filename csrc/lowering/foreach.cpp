// Foreach ops (_foreach_add.List, _foreach_addcdiv.ScalarList, ...), what
// torch.optim and clip_grad_norm_ run by default: each is the per-tensor op's
// rule applied to every element of the lists, all in one program, so a whole
// parameter list is updated by one launch. In-place forms (_foreach_add_)
// reuse these rules through the general kernel.
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

// Element i of argument `a`: a list's i-th entry; any other argument as is.
LoweringArg element(Builder& b, const LoweringArg& a, int64_t i) {
  LoweringArg e;
  if (a.kind == LoweringArg::TensorList) {
    if (!a.tensors.at(i).name.empty()) {
      e.kind = LoweringArg::Tensor;
      e.tensor = a.tensors[i];
    }
    return e;
  }
  if (a.kind != LoweringArg::NumberList) return a;
  e.kind = LoweringArg::Double;
  if (!a.dynamic) {
    e.d = a.numbers.at(i);
    return e;
  }
  if (!stablehlo::is_float(a.tensor.dtype())) e.kind = LoweringArg::Int;
  e.dynamic = true;
  e.source = a.source;
  e.tensor = b.reshape(b.slice(a.tensor, {i}, {i + 1}, {1}), {});
  return e;
}

int64_t list_length(const LoweringContext& c) {
  for (const auto& a : c.args)
    if (a.kind == LoweringArg::TensorList) return static_cast<int64_t>(a.tensors.size());
  throw std::logic_error("torch_tpu: a foreach op without a tensor list");
}

// Runs `rule` on element i's arguments; its checks join the op's.
Value apply(LoweringContext& c, const LoweringRule& rule, std::vector<LoweringArg> args, int64_t i) {
  std::vector<TensorType> outs{c.out(i)};
  LoweringContext sub{c.b, args, outs, {}};
  Value r = rule(sub).at(0);
  for (auto& check : sub.checks) c.checks.push_back(std::move(check));
  return r;
}

// The foreach form of `op`: arguments in the same order, lists indexed.
LoweringRule each(std::string op) {
  return [op](LoweringContext& c) {
    const LoweringRule* rule = find_rule(op);
    if (!rule) throw std::logic_error("torch_tpu: the foreach rule needs a rule for " + op);
    std::vector<Value> results;
    for (int64_t i = 0; i < list_length(c); ++i) {
      std::vector<LoweringArg> args;
      for (const auto& a : c.args) args.push_back(element(c.b, a, i));
      results.push_back(apply(c, *rule, std::move(args), i));
    }
    return results;
  };
}

// _foreach_norm.Scalar(self[], ord, dtype) is linalg_vector_norm(self, ord, None, False, dtype=dtype).
std::vector<Value> foreach_norm(LoweringContext& c) {
  const LoweringRule* rule = find_rule("aten::linalg_vector_norm");
  LoweringArg keepdim;
  keepdim.kind = LoweringArg::Bool;
  std::vector<Value> results;
  for (int64_t i = 0; i < list_length(c); ++i)
    results.push_back(apply(c, *rule, {element(c.b, c.args[0], i), c.args.at(1), {}, keepdim, c.args.at(2)}, i));
  return results;
}

// _foreach_copy(self[], src[]): src converted to self's dtype and shape.
std::vector<Value> foreach_copy(LoweringContext& c) {
  std::vector<Value> results;
  for (int64_t i = 0; i < list_length(c); ++i)
    results.push_back(c.b.broadcast_to(c.b.cast(c.args[1].tensors.at(i), c.out(i).dtype), c.out(i).shape));
  return results;
}

std::vector<Value> foreach_clone(LoweringContext& c) { return c.args[0].tensors; }

}  // namespace

LOWERING("aten::_foreach_add.List", each("aten::add.Tensor"));
LOWERING("aten::_foreach_add.Scalar", each("aten::add.Scalar"));
LOWERING("aten::_foreach_add.ScalarList", each("aten::add.Scalar"));
LOWERING("aten::_foreach_add.Tensor", each("aten::add.Tensor"));
LOWERING("aten::_foreach_sub.List", each("aten::sub.Tensor"));
LOWERING("aten::_foreach_sub.Scalar", each("aten::sub.Scalar"));
LOWERING("aten::_foreach_sub.ScalarList", each("aten::sub.Scalar"));
LOWERING("aten::_foreach_mul.List", each("aten::mul.Tensor"));
LOWERING("aten::_foreach_mul.Scalar", each("aten::mul.Scalar"));
LOWERING("aten::_foreach_mul.ScalarList", each("aten::mul.Scalar"));
LOWERING("aten::_foreach_mul.Tensor", each("aten::mul.Tensor"));
LOWERING("aten::_foreach_div.List", each("aten::div.Tensor"));
LOWERING("aten::_foreach_div.Scalar", each("aten::div.Scalar"));
LOWERING("aten::_foreach_div.ScalarList", each("aten::div.Scalar"));
LOWERING("aten::_foreach_div.Tensor", each("aten::div.Tensor"));
LOWERING("aten::_foreach_addcmul.Scalar", each("aten::addcmul"));
LOWERING("aten::_foreach_addcmul.ScalarList", each("aten::addcmul"));
LOWERING("aten::_foreach_addcdiv.Scalar", each("aten::addcdiv"));
LOWERING("aten::_foreach_addcdiv.ScalarList", each("aten::addcdiv"));
LOWERING("aten::_foreach_lerp.List", each("aten::lerp.Tensor"));
LOWERING("aten::_foreach_lerp.Scalar", each("aten::lerp.Scalar"));
LOWERING("aten::_foreach_lerp.ScalarList", each("aten::lerp.Scalar"));
LOWERING("aten::_foreach_pow.List", each("aten::pow.Tensor_Tensor"));
LOWERING("aten::_foreach_pow.Scalar", each("aten::pow.Tensor_Scalar"));
LOWERING("aten::_foreach_pow.ScalarList", each("aten::pow.Tensor_Scalar"));
LOWERING("aten::_foreach_pow.ScalarAndTensor", each("aten::pow.Scalar"));
LOWERING("aten::_foreach_maximum.List", each("aten::maximum"));
LOWERING("aten::_foreach_maximum.Scalar", each("aten::clamp_min"));
LOWERING("aten::_foreach_maximum.ScalarList", each("aten::clamp_min"));
LOWERING("aten::_foreach_minimum.List", each("aten::minimum"));
LOWERING("aten::_foreach_minimum.Scalar", each("aten::clamp_max"));
LOWERING("aten::_foreach_minimum.ScalarList", each("aten::clamp_max"));
LOWERING("aten::_foreach_clamp_min.List", each("aten::clamp_min.Tensor"));
LOWERING("aten::_foreach_clamp_min.Scalar", each("aten::clamp_min"));
LOWERING("aten::_foreach_clamp_min.ScalarList", each("aten::clamp_min"));
LOWERING("aten::_foreach_clamp_max.List", each("aten::clamp_max.Tensor"));
LOWERING("aten::_foreach_clamp_max.Scalar", each("aten::clamp_max"));
LOWERING("aten::_foreach_clamp_max.ScalarList", each("aten::clamp_max"));
LOWERING("aten::_foreach_max", each("aten::max"));
LOWERING("aten::_foreach_zero", each("aten::zero"));
LOWERING("aten::_foreach_norm.Scalar", foreach_norm);
LOWERING("aten::_foreach_copy", foreach_copy);
LOWERING("aten::_foreach_clone", foreach_clone);
// Unary ops.
LOWERING("aten::_foreach_abs", each("aten::abs"));
LOWERING("aten::_foreach_acos", each("aten::acos"));
LOWERING("aten::_foreach_asin", each("aten::asin"));
LOWERING("aten::_foreach_atan", each("aten::atan"));
LOWERING("aten::_foreach_ceil", each("aten::ceil"));
LOWERING("aten::_foreach_cos", each("aten::cos"));
LOWERING("aten::_foreach_cosh", each("aten::cosh"));
LOWERING("aten::_foreach_erf", each("aten::erf"));
LOWERING("aten::_foreach_exp", each("aten::exp"));
LOWERING("aten::_foreach_expm1", each("aten::expm1"));
LOWERING("aten::_foreach_floor", each("aten::floor"));
LOWERING("aten::_foreach_frac", each("aten::frac"));
LOWERING("aten::_foreach_lgamma", each("aten::lgamma"));
LOWERING("aten::_foreach_log", each("aten::log"));
LOWERING("aten::_foreach_log10", each("aten::log10"));
LOWERING("aten::_foreach_log1p", each("aten::log1p"));
LOWERING("aten::_foreach_log2", each("aten::log2"));
LOWERING("aten::_foreach_neg", each("aten::neg"));
LOWERING("aten::_foreach_reciprocal", each("aten::reciprocal"));
LOWERING("aten::_foreach_round", each("aten::round"));
LOWERING("aten::_foreach_rsqrt", each("aten::rsqrt"));
LOWERING("aten::_foreach_sigmoid", each("aten::sigmoid"));
LOWERING("aten::_foreach_sign", each("aten::sign"));
LOWERING("aten::_foreach_sin", each("aten::sin"));
LOWERING("aten::_foreach_sinh", each("aten::sinh"));
LOWERING("aten::_foreach_sqrt", each("aten::sqrt"));
LOWERING("aten::_foreach_tan", each("aten::tan"));
LOWERING("aten::_foreach_tanh", each("aten::tanh"));
LOWERING("aten::_foreach_trunc", each("aten::trunc"));

}  // namespace torch_tpu::lowering
