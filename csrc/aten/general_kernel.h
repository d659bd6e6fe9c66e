#pragma once

namespace torch_tpu::aten {
// Registers the general kernel for every aten op that has a lowering rule, or
// whose functional form has one (in-place and out= variants). Runs once, after
// every rule's static registration.
void register_general_kernels();
}  // namespace torch_tpu::aten
