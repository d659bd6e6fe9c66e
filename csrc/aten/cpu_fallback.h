#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <string>

namespace torch_tpu::aten {
// Runs `op` on CPU (or raises when the fallback is off): for ops whose
// lowering declines a particular use.
// `why` says what is missing, e.g. "for this use (a boolean mask)".
void run_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why);

// Whether an op without a lowering raises (true) or runs on CPU (false).
void set_fallback_raises(bool raises);
bool fallback_raises_errors();
// Per op that ran on the CPU fallback: the user's frame that first called it.
std::map<std::string, std::string> fallback_call_sites();
}  // namespace torch_tpu::aten
