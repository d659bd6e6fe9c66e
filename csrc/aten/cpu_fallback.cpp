// Ops with no lowering rule run on CPU: inputs copied to the host, PyTorch's
// CPU kernel run, mutated arguments copied back through the storage model (so
// aliasing and in-place semantics hold), new outputs moved to the device.
// Each fallen-back op is counted and warned about once;
// TORCH_TPU_FALLBACK=error (or torch_tpu.set_fallback("error")) raises instead.
#include "aten/cpu_fallback.h"

#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "aten/generator.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

std::atomic<bool> fallback_raises{[] {
  const char* v = std::getenv("TORCH_TPU_FALLBACK");
  return v && std::string(v) == "error";
}()};

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

std::mutex& warned_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, std::string>& fallback_sites() {  // op -> the user's frame that first called it
  static std::map<std::string, std::string> sites;
  return sites;
}

void fallback_with_reason(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why) {
  std::string name = op_name(op);
  TORCH_CHECK_NOT_IMPLEMENTED(!fallback_raises.load(), "torch_tpu: ", name, " has no tpu lowering", why,
                              " (and the CPU fallback is off: TORCH_TPU_FALLBACK=error). "
                              "Move the tensors to CPU for this op (x.cpu()), or add a rule in csrc/lowering/.");
  {
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(warned_mutex());
    if (warned.insert(name).second) {
      // Where the user's code first called it (torch_tpu.explain lists it).
      std::string stack = runtime::Runtime::python_stack();
      const size_t last = stack.rfind("  File ");
      fallback_sites()[name] =
          last == std::string::npos ? "" : stack.substr(last + 2, stack.find('\n', last) - last - 2);
      TORCH_WARN("torch_tpu: ", name, " has no tpu lowering", why,
                 "; it runs on CPU with copies in and out. "
                 "Set TORCH_TPU_FALLBACK=error to raise instead.");
    }
  }
  auto& runtime = runtime::Runtime::get();
  runtime.count("fallbacks");
  runtime.count("fallback::" + name);
  runtime.flush("fallback");  // an op Fused mode cannot record: what it reads is computed first
  generators_to_cpu(stack, op.schema().arguments().size());
  at::native::cpu_fallback(op, stack);
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { fallback_with_reason(op, stack, ""); }

}  // namespace

std::map<std::string, std::string> fallback_call_sites() {
  std::lock_guard<std::mutex> lock(warned_mutex());
  return fallback_sites();
}

void run_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why) {
  fallback_with_reason(op, stack, why);
}

void set_fallback_raises(bool raises) { fallback_raises.store(raises); }
bool fallback_raises_errors() { return fallback_raises.load(); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

}  // namespace torch_tpu::aten
