// Ops whose body is a function written elsewhere (a JAX kernel): the module
// gets that function and a func.call to it, so every path (Strict, Fused,
// torch.compile) runs it like any rule's ops, fused with its neighbours.
#include <map>
#include <memory>
#include <mutex>

#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

struct ForeignOp {
  ForeignLowerer lower;
  std::map<std::string, std::shared_ptr<const ForeignFunction>> lowered;  // by statics and input types
};

std::mutex& foreign_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ForeignOp>& foreign_ops() {
  static std::map<std::string, ForeignOp> ops;
  return ops;
}

std::string types_of(const std::vector<TensorType>& types) {
  std::string s;
  for (const auto& t : types) s += (s.empty() ? "" : ", ") + t.str();
  return "(" + s + ")";
}

std::shared_ptr<const ForeignFunction> lowered(const std::string& op, const std::string& statics,
                                               const std::vector<TensorType>& inputs) {
  const std::string key = statics + "|" + types_of(inputs);
  ForeignLowerer lower;
  {
    std::lock_guard<std::mutex> lock(foreign_mutex());
    ForeignOp& f = foreign_ops().at(op);
    if (auto it = f.lowered.find(key); it != f.lowered.end()) return it->second;
    lower = f.lower;
  }
  // Outside the lock: the lowerer may run Python, which may call other ops.
  auto result = std::make_shared<const ForeignFunction>(lower(statics, inputs));
  std::lock_guard<std::mutex> lock(foreign_mutex());
  return foreign_ops().at(op).lowered.emplace(key, std::move(result)).first->second;
}

}  // namespace

void register_foreign_op(const std::string& op, ForeignLowerer lower) {
  {
    std::lock_guard<std::mutex> lock(foreign_mutex());
    auto [it, inserted] = foreign_ops().try_emplace(op);
    it->second = ForeignOp{std::move(lower), {}};
    if (!inserted) return;
  }
  register_rule(op, [op](LoweringContext& ctx) {
    std::vector<Value> inputs;
    std::vector<TensorType> types;
    for (const auto& v : ctx.args.at(0).tensors) {
      inputs.push_back(v);
      types.push_back(v.type);
    }
    const auto f = lowered(op, ctx.args.at(1).s, types);
    if (f->results != ctx.outputs)
      throw std::invalid_argument(op + ": the function gives " + types_of(f->results) + " for inputs " +
                                  types_of(types) + ", but its fake kernel said " + types_of(ctx.outputs) +
                                  ". Both come from the same function: was it redefined under the same name?");
    for (const auto& [name, text] : f->functions) ctx.b.add_function(name, text);
    return ctx.b.call(f->entry, inputs, f->results);
  });
}

}  // namespace torch_tpu::lowering
