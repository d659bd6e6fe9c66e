// PyTorch's own checks that an op's meta kernel does not make but its CPU and
// CUDA kernels do: many meta kernels are Python functions that decide shapes
// and dtypes only. The general kernel runs these so a bad call raises what
// CPU raises, with CPU's message, instead of computing something else.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

namespace torch_tpu::aten {

// A tensor an op writes, and the argument it is.
struct Written {
  at::Tensor tensor;
  int argument;
};

// TensorIterator's memory-overlap rules for the tensors an op writes: none
// may have elements that share memory (an expanded tensor); a pointwise op's
// input may be the written tensor itself but not overlap it partly
// (a[1:].add_(a[:-1])); any other op's inputs may not overlap it at all
// (torch.cat([x, x], out=x)). `inputs` pairs each input with its argument.
void check_overlap(const std::vector<Written>& written, const std::vector<Written>& inputs, bool pointwise);

// Runs `op`'s CPU kernel on stand-ins of `args` (same dtypes and ranks, every
// non-empty dimension of size 1) so that CPU's dtype checks raise: a dtype the
// op does not take (NotImplementedError), a result that cannot be cast into an
// in-place or out= tensor, a Scalar that does not fit the dtype, bool
// subtraction. For a `pointwise` op the stand-ins broadcast exactly as the
// real arguments do, so every error they raise is the op's; for other ops
// only dtype errors are trusted (their shapes and values are not the op's).
void check_like_cpu(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, bool pointwise);

}  // namespace torch_tpu::aten
