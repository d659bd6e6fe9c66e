#pragma once

#include <string>

namespace torch_tpu::aten {
// Registers the general kernel for every aten op that has a lowering rule, or
// whose functional form has one (in-place and out= variants). Runs once, after
// every rule's static registration.
void register_general_kernels();
// Registers the general kernel for one more op, "ns::name" or
// "ns::name.overload" (an op defined at run time: torch_tpu.jax_op).
void register_general_kernel(const std::string& op);
// Meta kernels for ops torch ships without one (csrc/aten/meta_kernels.cpp);
// called by register_general_kernels.
void register_missing_meta_kernels();
}  // namespace torch_tpu::aten
