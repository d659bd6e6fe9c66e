// PyTorch's own checks that an op's meta kernel does not make but its CPU and
// CUDA kernels do: many meta kernels are Python functions that decide shapes
// and dtypes only. The general kernel runs these so a bad call raises what
// CPU raises, with CPU's message, instead of computing something else.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <string_view>
#include <vector>

namespace torch_tpu::aten {

// A tensor an op writes, and the argument it is.
struct Written {
  at::Tensor tensor;
  int argument;
};

// What CPU's kernel of an op checks about the memory the op writes.
enum class OverlapRule {
  None,      // nothing (fill_, reductions, sort)
  Internal,  // a written tensor may not have elements that share memory (an expanded out=)
  Partial,   // ... nor overlap an input partly (a[1:].add_(a[:-1])): TensorIterator's rule
  Full,      // ... nor overlap an input at all (torch.cat([x, x], out=x), index_add_(0, i, self))
  Cat,       // Full, but cat skips (and so does not check) its legacy empty inputs (1-D, 0 elements)
  Mask,      // masked_fill_: the mask may not overlap self partly (the value is read first)
  IndexPut,  // Full, but an expanded self only warns (deprecated, as in index_put_)
  Copy,      // Internal when the value (argument 1) is on the device: fill_(tensor) is self.copy_(value) there
};
// The rule for an op ("aten::add_.Tensor"): pointwise ops follow TensorIterator's.
OverlapRule overlap_rule(const std::string& op, bool pointwise);

// Raises CPU's error when the tensors an op writes break `rule`. `inputs`
// pairs each input with its argument; a written argument is not its own input.
void check_overlap(const std::vector<Written>& written, const std::vector<Written>& inputs, OverlapRule rule);

// Runs `op`'s CPU kernel on stand-ins of `args` (same dtypes and ranks, every
// non-empty dimension of size 1) so that CPU's dtype checks raise: a dtype the
// op does not take (NotImplementedError), a result that cannot be cast into an
// in-place or out= tensor, a Scalar that does not fit the dtype, bool
// subtraction. For a `pointwise` op the stand-ins broadcast exactly as the
// real arguments do, so every error they raise is the op's; for other ops
// only dtype errors are trusted (their shapes and values are not the op's).
// Returns the dtypes of the stand-in's outputs: CPU's result types, which
// for a pointwise op the program follows where a meta kernel says otherwise
// (bool ** False is bool on CPU, int64 by the meta kernel).
// Whether check_like_cpu applies to `op` (its CPU kernel is safe and
// meaningful on stand-ins): see kNoCpuProbe for the ops it does not.
bool cpu_probe_applies(std::string_view op);

// `meta_refused`: the meta kernel raised for these arguments; a dtype CPU's
// kernel lacks is then raised as NotImplementedError (no kernel takes it).
std::vector<at::ScalarType> check_like_cpu(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                           bool pointwise, bool meta_refused = false);

}  // namespace torch_tpu::aten
