// What torch.optim and torch.amp call beyond the foreach ops: the fused
// optimizers (Adam(fused=True), AdamW, SGD) and GradScaler's two ops. Each is
// an in-place op over lists; its rule returns the new value of every written
// list element, list by list in argument order.
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Compare;
using stablehlo::Unary;

DType opmath(DType t) { return t == DType::Float64 ? DType::Float64 : DType::Float32; }

// The optional grad_scale / found_inf arguments of the fused optimizers:
// grads are divided by the scale, and a found_inf of 1 skips the whole step.
struct AmpArgs {
  std::optional<Value> grad_scale, found_inf;
};

AmpArgs amp_args(const LoweringContext& c, size_t scale_arg) {
  AmpArgs a;
  if (c.has(scale_arg)) a.grad_scale = c.tensor(scale_arg);
  if (c.has(scale_arg + 1)) a.found_inf = c.tensor(scale_arg + 1);
  return a;
}

// `updated` where no overflow was found, else `old`.
Value unless_found_inf(Builder& b, const AmpArgs& amp, const Value& old, const Value& updated) {
  if (!amp.found_inf) return updated;
  Value found = b.compare(Compare::NE, b.reshape(*amp.found_inf, {}), b.constant(0, {amp.found_inf->dtype(), {}}));
  return b.select(b.broadcast_to(found, old.shape()), old, updated);
}

// _fused_adam_ / _fused_adamw_(self[], grads[], exp_avgs[], exp_avg_sqs[],
// max_exp_avg_sqs[], state_steps[], lr, beta1, beta2, weight_decay, eps,
// amsgrad, maximize, grad_scale, found_inf).
LoweringRule fused_adam(bool adamw) {
  return [adamw](LoweringContext& c) {
    const auto &params = c.args[0].tensors, &grads = c.args[1].tensors, &avgs = c.args[2].tensors,
               &sqs = c.args[3].tensors, &maxs = c.args[4].tensors, &steps = c.args[5].tensors;
    const double beta1 = c.number(7), beta2 = c.number(8), wd = c.number(9), eps = c.number(10);
    const bool amsgrad = c.args[11].b, maximize = c.args[12].b;
    AmpArgs amp = amp_args(c, 13);
    Math m{c.b};
    std::vector<Value> new_params, new_grads, new_avgs, new_sqs, new_maxs;
    for (size_t i = 0; i < params.size(); ++i) {
      DType t = opmath(params[i].dtype());
      Value p = c.b.cast(params[i], t), g = c.b.cast(grads[i], t);
      Value avg = c.b.cast(avgs[i], t), sq = c.b.cast(sqs[i], t);
      if (amp.grad_scale) g = m.div(g, m.bcast(*amp.grad_scale, g));
      new_grads.push_back(unless_found_inf(c.b, amp, grads[i], c.b.cast(g, grads[i].dtype())));
      if (maximize) g = c.b.unary(Unary::Negate, g);
      Value lr = m.bcast(c.value_as(6, {t, {}}), p);
      if (wd != 0) {
        if (adamw)
          p = m.sub(p, m.mul(m.mul(lr, m.k(wd, p)), p));
        else
          g = m.add(g, m.mul(p, m.k(wd, p)));
      }
      avg = m.add(m.mul(avg, m.k(beta1, avg)), m.mul(g, m.k(1 - beta1, g)));
      sq = m.add(m.mul(sq, m.k(beta2, sq)), m.mul(m.mul(g, g), m.k(1 - beta2, g)));
      // Bias corrections from the step count (a device tensor), as scalars.
      Value step = c.b.cast(c.b.reshape(steps[i], {}), t);
      Value one = c.b.scalar(1, t);
      Value bc1 = m.sub(one, c.b.binary(Binary::Power, c.b.scalar(beta1, t), step));
      Value bc2 = m.sub(one, c.b.binary(Binary::Power, c.b.scalar(beta2, t), step));
      Value second = sq;
      if (amsgrad) {
        second = c.b.binary(Binary::Maximum, c.b.cast(maxs[i], t), sq);
        new_maxs.push_back(unless_found_inf(c.b, amp, maxs[i], c.b.cast(second, maxs[i].dtype())));
      }
      Value denom = m.add(m.div(c.b.unary(Unary::Sqrt, second), m.bcast(c.b.unary(Unary::Sqrt, bc2), p)), m.k(eps, p));
      Value step_size = m.div(lr, m.bcast(bc1, p));
      p = m.sub(p, m.div(m.mul(step_size, avg), denom));
      new_params.push_back(unless_found_inf(c.b, amp, params[i], c.b.cast(p, params[i].dtype())));
      new_avgs.push_back(unless_found_inf(c.b, amp, avgs[i], c.b.cast(avg, avgs[i].dtype())));
      new_sqs.push_back(unless_found_inf(c.b, amp, sqs[i], c.b.cast(sq, sqs[i].dtype())));
    }
    std::vector<Value> out = new_params;
    for (auto* list : {&new_grads, &new_avgs, &new_sqs, &new_maxs}) out.insert(out.end(), list->begin(), list->end());
    if (!amsgrad)  // the max_exp_avg_sqs list is written back unchanged
      out.insert(out.end(), maxs.begin(), maxs.end());
    return out;
  };
}

// _fused_sgd_(self[], grads[], momentum_buffer_list[], weight_decay,
// momentum, lr, dampening, nesterov, maximize, is_first_step, grad_scale, found_inf).
std::vector<Value> fused_sgd(LoweringContext& c) {
  const auto &params = c.args[0].tensors, &grads = c.args[1].tensors, &bufs = c.args[2].tensors;
  const double wd = c.number(3), momentum = c.number(4), dampening = c.number(6);
  const bool nesterov = c.args[7].b, maximize = c.args[8].b, first = c.args[9].b;
  AmpArgs amp = amp_args(c, 10);
  Math m{c.b};
  std::vector<Value> new_params, new_grads, new_bufs;
  for (size_t i = 0; i < params.size(); ++i) {
    DType t = opmath(params[i].dtype());
    Value p = c.b.cast(params[i], t), g = c.b.cast(grads[i], t);
    if (amp.grad_scale) g = m.div(g, m.bcast(*amp.grad_scale, g));
    new_grads.push_back(unless_found_inf(c.b, amp, grads[i], c.b.cast(g, grads[i].dtype())));
    if (maximize) g = c.b.unary(Unary::Negate, g);
    if (wd != 0) g = m.add(g, m.mul(p, m.k(wd, p)));
    if (momentum != 0) {
      Value buf = first ? g : m.add(m.mul(c.b.cast(bufs.at(i), t), m.k(momentum, g)), m.mul(g, m.k(1 - dampening, g)));
      new_bufs.push_back(unless_found_inf(c.b, amp, bufs[i], c.b.cast(buf, bufs[i].dtype())));
      g = nesterov ? m.add(g, m.mul(buf, m.k(momentum, g))) : buf;
    }
    p = m.sub(p, m.mul(m.bcast(c.value_as(5, {t, {}}), p), g));
    new_params.push_back(unless_found_inf(c.b, amp, params[i], c.b.cast(p, params[i].dtype())));
  }
  std::vector<Value> out = new_params;
  out.insert(out.end(), new_grads.begin(), new_grads.end());
  if (momentum == 0) out.insert(out.end(), bufs.begin(), bufs.end());
  out.insert(out.end(), new_bufs.begin(), new_bufs.end());
  return out;
}

// GradScaler.unscale_: every grad times inv_scale, and found_inf set to 1
// when any grad holds a NaN or Inf. Returns the grads, then found_inf.
std::vector<Value> non_finite_check_and_unscale(LoweringContext& c) {
  const auto& grads = c.args[0].tensors;
  const Value& found_inf = c.tensor(1);
  Value any_bad = c.b.scalar(0, DType::Bool);
  std::vector<Value> results;
  for (const Value& g : grads) {
    DType t = g.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;  // CUDA's opmath
    Value x = c.b.cast(g, t);
    if (g.type.numel() > 0) {
      std::vector<int64_t> all;
      for (int64_t d = 0; d < g.rank(); ++d) all.push_back(d);
      Value finite = c.b.reduce(c.b.unary(Unary::IsFinite, x), c.b.scalar(1, DType::Bool), all, Binary::And);
      any_bad = c.b.binary(Binary::Or, any_bad, c.b.unary(Unary::Not, finite));
    }
    Value inv = c.b.broadcast_to(c.b.cast(c.b.reshape(c.tensor(2), {}), t), g.shape());
    results.push_back(c.b.cast(c.b.binary(Binary::Multiply, x, inv), g.dtype()));
  }
  Value one = c.b.constant(1, found_inf.type);
  results.push_back(c.b.select(c.b.broadcast_to(any_bad, found_inf.shape()), one, found_inf));
  return results;
}

// GradScaler.update: on an overflow the scale backs off and the growth
// tracker resets; after growth_interval clean steps the scale grows (if the
// grown scale is finite). Returns the new scale, then the new tracker.
std::vector<Value> update_scale(LoweringContext& c) {
  const Value &scale = c.tensor(0), &tracker = c.tensor(1);
  Value found = c.b.compare(Compare::NE, c.b.cast(c.tensor(2), scale.dtype()), c.b.constant(0, scale.type));
  Value successful = c.b.binary(Binary::Add, tracker, c.b.constant(1, tracker.type));
  Value grow = c.b.compare(Compare::EQ, successful, c.b.constant(static_cast<double>(c.integer(5)), tracker.type));
  Value grown = c.b.binary(Binary::Multiply, scale, c.b.constant(c.number(3), scale.type));
  Value grown_ok = c.b.binary(Binary::And, grow, c.b.unary(Unary::IsFinite, grown));
  Value backed_off = c.b.binary(Binary::Multiply, scale, c.b.constant(c.number(4), scale.type));
  Value zero = c.b.constant(0, tracker.type);
  Value new_scale = c.b.select(found, backed_off, c.b.select(grown_ok, grown, scale));
  Value new_tracker = c.b.select(found, zero, c.b.select(grow, zero, successful));
  return {new_scale, new_tracker};
}

}  // namespace

LOWERING("aten::_fused_adam_", fused_adam(false));
LOWERING("aten::_fused_adam_.tensor_lr", fused_adam(false));
LOWERING("aten::_fused_adamw_", fused_adam(true));
LOWERING("aten::_fused_adamw_.tensor_lr", fused_adam(true));
LOWERING("aten::_fused_sgd_", fused_sgd);
LOWERING("aten::_fused_sgd_.tensor_lr", fused_sgd);
LOWERING("aten::_amp_foreach_non_finite_check_and_unscale_", non_finite_check_and_unscale);
LOWERING("aten::_amp_update_scale_", update_scale);

}  // namespace torch_tpu::lowering
