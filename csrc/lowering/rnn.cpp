// Recurrent cells. PyTorch's nn.LSTM / nn.GRU on a PrivateUse1 device call the
// fused cell ops (as on CUDA), which have no CPU kernel to fall back to.
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using stablehlo::Binary;
using stablehlo::Unary;

// Columns [k*h, (k+1)*h) of a [N, 4H] value: gate k of i, f, g, o.
Value gate(Builder& b, const Value& v, int64_t k, int64_t h) {
  return b.slice(v, {0, k * h}, {v.shape()[0], (k + 1) * h}, {1, 1});
}

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
// -> (hy, cy, workspace): the workspace keeps the activated gates [i, f, g, o]
// for the backward below (only our own rules read it).
std::vector<Value> fused_lstm_cell(LoweringContext& c) {
  DType t = opmath_type(c.out(0).dtype);
  Value gates = c.b.binary(Binary::Add, c.b.cast(c.tensor(0), t), c.b.cast(c.tensor(1), t));
  for (size_t i : {3, 4})
    if (c.has(i)) gates = c.b.binary(Binary::Add, gates, c.b.broadcast_to(c.b.cast(c.tensor(i), t), gates.shape()));
  Value cx = c.b.cast(c.tensor(2), t);
  const int64_t h = cx.shape()[1];
  Value i = c.b.unary(Unary::Logistic, gate(c.b, gates, 0, h));
  Value f = c.b.unary(Unary::Logistic, gate(c.b, gates, 1, h));
  Value g = c.b.unary(Unary::Tanh, gate(c.b, gates, 2, h));
  Value o = c.b.unary(Unary::Logistic, gate(c.b, gates, 3, h));
  Value cy = c.b.binary(Binary::Add, c.b.binary(Binary::Multiply, f, cx), c.b.binary(Binary::Multiply, i, g));
  Value hy = c.b.binary(Binary::Multiply, o, c.b.unary(Unary::Tanh, cy));
  Value workspace = c.b.concatenate({i, f, g, o}, 1);
  return {c.b.cast(hy, c.out(0).dtype), c.b.cast(cy, c.out(1).dtype), c.b.cast(workspace, c.out(2).dtype)};
}

// _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
// -> (grad_gates, grad_cx, grad_bias): grad_bias is the gates' gradient summed
// over the batch, undefined without bias.
std::vector<Value> fused_lstm_cell_backward(LoweringContext& c) {
  if (!c.has(0) && !c.has(1)) return {Value{}, Value{}, Value{}};  // no gradient flows: all undefined
  DType t = opmath_type(c.tensor(2).dtype());
  Value cx = c.b.cast(c.tensor(2), t), cy = c.b.cast(c.tensor(3), t), ws = c.b.cast(c.tensor(4), t);
  const int64_t h = cx.shape()[1];
  Value zero = c.b.constant(0, cx.type), one = c.b.constant(1, cx.type);
  Value ghy = c.has(0) ? c.b.cast(c.tensor(0), t) : zero, gcy = c.has(1) ? c.b.cast(c.tensor(1), t) : zero;
  Value i = gate(c.b, ws, 0, h), f = gate(c.b, ws, 1, h), g = gate(c.b, ws, 2, h), o = gate(c.b, ws, 3, h);
  auto mul = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); };
  auto sub = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Subtract, a, b); };
  Value tanh_cy = c.b.unary(Unary::Tanh, cy);
  // d cy = grad_cy + grad_hy * o * (1 - tanh(cy)^2)
  Value dcy = c.b.binary(Binary::Add, gcy, mul(mul(ghy, o), sub(one, mul(tanh_cy, tanh_cy))));
  Value di = mul(mul(dcy, g), mul(i, sub(one, i)));
  Value df = mul(mul(dcy, cx), mul(f, sub(one, f)));
  Value dg = mul(mul(dcy, i), sub(one, mul(g, g)));
  Value d_o = mul(mul(ghy, tanh_cy), mul(o, sub(one, o)));
  Value grad_gates = c.b.concatenate({di, df, dg, d_o}, 1);
  std::vector<Value> r{c.b.cast(grad_gates, c.out(0).dtype), c.b.cast(mul(dcy, f), c.out(1).dtype), Value{}};
  if (c.args[5].b) r[2] = c.b.cast(c.b.reduce(grad_gates, c.b.scalar(0, t), {0}, Binary::Add), c.out(2).dtype);
  return r;
}

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
// -> (hy, workspace). Gates are [r, z, n]: r and z sigmoids, n = tanh(n_i +
// r * n_h), hy = n + z * (hx - n). The workspace [r, z, n, hx, n_h] is read
// only by the backward below.
std::vector<Value> fused_gru_cell(LoweringContext& c) {
  DType t = opmath_type(c.out(0).dtype);
  Value ig = c.b.cast(c.tensor(0), t), hg = c.b.cast(c.tensor(1), t), hx = c.b.cast(c.tensor(2), t);
  if (c.has(3)) ig = c.b.binary(Binary::Add, ig, c.b.broadcast_to(c.b.cast(c.tensor(3), t), ig.shape()));
  if (c.has(4)) hg = c.b.binary(Binary::Add, hg, c.b.broadcast_to(c.b.cast(c.tensor(4), t), hg.shape()));
  const int64_t h = hx.shape()[1];
  auto add = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Add, a, b); };
  auto mul = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); };
  Value r = c.b.unary(Unary::Logistic, add(gate(c.b, ig, 0, h), gate(c.b, hg, 0, h)));
  Value z = c.b.unary(Unary::Logistic, add(gate(c.b, ig, 1, h), gate(c.b, hg, 1, h)));
  Value nh = gate(c.b, hg, 2, h);
  Value n = c.b.unary(Unary::Tanh, add(gate(c.b, ig, 2, h), mul(r, nh)));
  Value hy = add(n, mul(z, c.b.binary(Binary::Subtract, hx, n)));
  Value workspace = c.b.concatenate({r, z, n, hx, nh}, 1);
  return {c.b.cast(hy, c.out(0).dtype), c.b.cast(workspace, c.out(1).dtype)};
}

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias) -> (grad_input_gates,
// grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias); the bias
// gradients are the gates' gradients summed over the batch, undefined without bias.
std::vector<Value> fused_gru_cell_backward(LoweringContext& c) {
  DType t = opmath_type(c.tensor(1).dtype());
  Value g = c.b.cast(c.tensor(0), t), ws = c.b.cast(c.tensor(1), t);
  const int64_t h = g.shape()[1];
  Value r = gate(c.b, ws, 0, h), z = gate(c.b, ws, 1, h), n = gate(c.b, ws, 2, h), hx = gate(c.b, ws, 3, h),
        nh = gate(c.b, ws, 4, h);
  Value one = c.b.constant(1, g.type);
  auto mul = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Multiply, a, b); };
  auto sub = [&](const Value& a, const Value& b) { return c.b.binary(Binary::Subtract, a, b); };
  Value dn = mul(mul(g, sub(one, z)), sub(one, mul(n, n)));  // through tanh
  Value dz = mul(mul(g, sub(hx, n)), mul(z, sub(one, z)));   // through sigmoid
  Value dr = mul(mul(dn, nh), mul(r, sub(one, r)));
  Value grad_input = c.b.concatenate({dr, dz, dn}, 1);
  Value grad_hidden = c.b.concatenate({dr, dz, mul(dn, r)}, 1);
  std::vector<Value> out{c.b.cast(grad_input, c.out(0).dtype), c.b.cast(grad_hidden, c.out(1).dtype),
                         c.b.cast(mul(g, z), c.out(2).dtype), Value{}, Value{}};
  if (c.args[2].b) {
    out[3] = c.b.cast(c.b.reduce(grad_input, c.b.scalar(0, t), {0}, Binary::Add), c.out(3).dtype);
    out[4] = c.b.cast(c.b.reduce(grad_hidden, c.b.scalar(0, t), {0}, Binary::Add), c.out(4).dtype);
  }
  return out;
}
}  // namespace

LOWERING("aten::_thnn_fused_lstm_cell", fused_lstm_cell);
LOWERING("aten::_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward);
LOWERING("aten::_thnn_fused_gru_cell", fused_gru_cell);
LOWERING("aten::_thnn_fused_gru_cell_backward", fused_gru_cell_backward);

}  // namespace torch_tpu::lowering
