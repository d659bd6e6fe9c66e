// The strides PyTorch's CPU (and CUDA) kernels give an op's new outputs, so
// that a tpu result reports CPU's strides: x.t() + 1 is transposed, a
// convolution of a channels_last input is channels_last. PyTorch's meta
// kernels decide most of it; where they differ from the CPU kernels
// (TensorIterator's rule in size-1 dims, ambiguous memory formats, ops that
// allocate like their input), the CPU kernels' rule wins.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "stablehlo/builder.h"

namespace torch_tpu::aten {

// Adjusts `strides` (the meta kernel's, one per output of `outs`) of op `op`
// called with `args` (out= arguments marked in `is_out`).
void lay_out_like_cpu(const std::string& op, bool pointwise, const std::vector<bool>& is_out,
                      const std::vector<c10::IValue>& args, const std::vector<stablehlo::TensorType>& outs,
                      std::vector<std::vector<int64_t>>& strides);

}  // namespace torch_tpu::aten
