// torch._assert_async and its functional form: the program checks the value
// on the device and the error is raised at the next sync, as CUDA's
// device-side asserts are (at the op in Debug mode).
#include <string>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

// The check that self (one element) is nonzero, with CPU's messages.
void check_nonzero(LoweringContext& c, const std::string& message) {
  const Value& x = c.tensor(0);
  if (x.type.numel() != 1)
    throw std::invalid_argument(std::string("Boolean value of Tensor with ") +
                                (x.type.numel() == 0 ? "no values" : "more than one value") + " is ambiguous");
  Value v = c.b.reshape(x, {});
  Value zero = c.b.constant(0, v.type);
  c.checks.push_back({c.b.compare(stablehlo::Compare::NE, v, zero), message, false});
}

// _assert_async(self) / _assert_async.msg(self, assert_msg)
std::vector<Value> assert_async(LoweringContext& c) {
  std::string message = c.has(1) ? c.string(1) : "Expected Tensor with single nonzero value, but got zero";
  check_nonzero(c, message.empty() ? "Assertion is failed" : message);
  return {};
}

// _functional_assert_async.msg(self, assert_msg, dep_token) -> a copy of dep_token.
std::vector<Value> functional_assert_async(LoweringContext& c) {
  check_nonzero(c, c.string(1).empty() ? "Assertion is failed" : c.string(1));
  return {c.tensor(2)};
}

}  // namespace

LOWERING("aten::_assert_async", assert_async);
LOWERING("aten::_assert_async.msg", assert_async);
LOWERING("aten::_functional_assert_async.msg", functional_assert_async);

}  // namespace torch_tpu::lowering
