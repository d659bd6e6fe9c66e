// The general eager kernel: one boxed kernel serves every op that has a
// lowering rule. Per call: check devices, build the cache key from the
// arguments, and on a miss ask PyTorch's meta kernel for the outputs, run the
// rule and compile; then gather the input buffers, launch, bind the outputs.
// In-place and out= variants reuse the functional op's rule and write the
// result into their destination through the storage model.
#include "aten/general_kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "aten/bounded.h"
#include "aten/cpu_fallback.h"
#include "aten/generator.h"
#include "aten/output_layout.h"
#include "aten/pytorch_checks.h"
#include "aten/tensor_access.h"
#include "lowering/random.h"
#include "lowering/registry.h"

namespace torch_tpu::aten {
namespace {

using lowering::LoweringArg;
using runtime::Runtime;
using stablehlo::TensorType;

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// How a Scalar argument enters the program. Its value is first part of the
// program's key (a constant XLA can fold); after kDynamicAfter distinct values
// it becomes a runtime input instead, so a learning rate or a bias correction
// that changes every step does not compile a program per step. A rule that
// needs the value at compile time (NeedsStaticScalar) pins it to Static.
enum class ScalarUse : uint8_t { None, Tracking, Dynamic, Static };
constexpr size_t kDynamicAfter = 2;

// How an op maps onto a rule, resolved once per op.
struct OpPlan {
  std::string name;  // "aten::add_.Tensor"
  const lowering::LoweringRule* rule = nullptr;
  std::optional<c10::OperatorHandle> functional;  // the op the rule is for, when it is not this one
  bool takes_complex = false;                     // the rule is written for complex values
  std::vector<bool> is_out;                       // out= arguments: written, never read
  std::vector<int> return_alias;                  // for each return: the argument it aliases, or -1
  // Arguments the op writes but does not return (batch norm's running
  // stats): the rule returns their new values after the outputs, one per
  // argument that is a defined tensor, in argument order.
  std::vector<int> mutated;
  // An in-place op that returns nothing (_foreach_add_): the functional op's
  // outputs are the new values of the written arguments.
  bool writes_from_functional = false;
  bool returns_list = false;  // one Tensor[] return (_foreach_norm)
  // Per argument; guarded by scalar_mutex once the plan is shared.
  std::vector<ScalarUse> scalar_use;
  std::vector<std::vector<double>> seen_values;
  // The argument a random in-place op overwrites without reading (self of
  // uniform_, normal_, ...), passed like an out= argument; -1 if none.
  int overwritten = -1;
  // Tagged pointwise by PyTorch: a TensorIterator op (CPU's checks trust its stand-ins fully).
  bool pointwise = false;
  OverlapRule overlap = OverlapRule::None;  // what CPU's kernel checks about the memory the op writes
  bool all_any = false;                     // aten::all / aten::any overloads: a uint8 out= converts the input first
  bool index_put = false;                   // index_put, index_put_, _index_put_impl_ (a mask may make it masked_fill_)
  bool index = false;                       // index.Tensor (x[mask] may keep its count on the device)
  Factory factory = Factory::None;          // arange / fill_: may come out padded (padded_factory)
  // sum, nansum, prod, cumsum, cumprod with out=: their `dtype` argument
  // (-1: none), which CPU takes from the out= tensor when it is None.
  int dtype_from_out = -1, out_index = -1;
};

std::mutex scalar_mutex;

bool is_number_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::NumberType; }
// Scalar and float arguments are tracked (a float such as a fused optimizer's
// lr changes with a schedule); int arguments are sizes and stay static.
bool is_tracked_type(const c10::TypePtr& t) { return is_number_type(t) || t->kind() == c10::TypeKind::FloatType; }

ScalarUse initial_scalar_use(const c10::Argument& a) {
  const auto& t = a.type();
  if (is_tracked_type(t)) return ScalarUse::Tracking;
  if (auto opt = t->cast<c10::OptionalType>(); opt && is_tracked_type(opt->getElementType()))
    return ScalarUse::Tracking;
  // Scalar[] (a foreach op's per-tensor values) changes with every step.
  if (auto list = t->cast<c10::ListType>(); list && is_number_type(list->getElementType())) return ScalarUse::Dynamic;
  return ScalarUse::None;
}

std::string full_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

std::vector<std::string> argument_names(const c10::FunctionSchema& s, bool skip_out) {
  std::vector<std::string> names;
  for (const auto& a : s.arguments())
    if (!(skip_out && a.is_out())) names.push_back(a.name());
  return names;
}

// The functional op whose rule computes this in-place or out= op:
// add_.Tensor -> add.Tensor; add.out -> the overload of add with the same
// non-out arguments.
std::optional<c10::OperatorHandle> functional_counterpart(const c10::FunctionSchema& s) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string& name = s.name();
  // Overloads by op name, indexed once.
  static const auto overloads = [&] {
    std::unordered_map<std::string, std::vector<c10::OperatorName>> index;
    for (const auto& n : dispatcher.getAllOpNames()) index[n.name].push_back(n);
    return index;
  }();
  if (s.is_mutable() && !name.empty() && name.back() == '_' && s.returns().size() <= 1) {
    // add_ -> add; __iand__ -> __and__. The overload with the same arguments
    // (names and types): pow_.Scalar(Tensor self, Scalar exponent) is
    // pow.Tensor_Scalar, not pow.Scalar(Scalar self, Tensor exponent).
    const bool dunder = name.rfind("aten::__i", 0) == 0 && name.size() > 11 && name.substr(name.size() - 2) == "__";
    const std::string base = dunder ? "aten::__" + name.substr(9) : name.substr(0, name.size() - 1);
    auto it = overloads.find(base);
    if (it == overloads.end()) return std::nullopt;
    const auto& args = s.arguments();
    auto same_arguments = [&](const c10::OperatorHandle& op) {
      const auto& fa = op.schema().arguments();
      if (fa.size() != args.size()) return false;
      for (size_t i = 0; i < fa.size(); ++i)
        if (fa[i].name() != args[i].name() || *fa[i].type() != *args[i].type()) return false;
      return true;
    };
    std::vector<c10::OperatorName> candidates = it->second;  // the same overload name first
    std::stable_partition(candidates.begin(), candidates.end(),
                          [&](const c10::OperatorName& n) { return n.overload_name == s.overload_name(); });
    for (const auto& candidate : candidates) {
      if (!lowering::find_rule(full_name(candidate))) continue;
      auto op = dispatcher.findOp(candidate);
      if (op && same_arguments(*op)) return op;
    }
    return std::nullopt;
  }
  bool has_out = false;
  for (const auto& a : s.arguments()) has_out |= a.is_out();
  if (!has_out) return std::nullopt;
  auto it = overloads.find(name);
  if (it == overloads.end()) return std::nullopt;
  auto wanted = argument_names(s, true);
  for (const auto& candidate : it->second) {
    if (candidate.overload_name == s.overload_name() || !lowering::find_rule(full_name(candidate))) continue;
    auto op = dispatcher.findOp(candidate);
    if (op && argument_names(op->schema(), false) == wanted) return op;
  }
  return std::nullopt;
}

std::optional<OpPlan> make_plan(const c10::OperatorHandle& op) {
  OpPlan plan;
  plan.name = full_name(op.operator_name());
  const auto& s = op.schema();
  plan.rule = lowering::find_rule(plan.name);
  if (!plan.rule) {
    plan.functional = functional_counterpart(s);
    if (!plan.functional) return std::nullopt;
    plan.rule = lowering::find_rule(full_name(plan.functional->operator_name()));
  }
  plan.takes_complex =
      lowering::takes_complex(plan.functional ? full_name(plan.functional->operator_name()) : plan.name);
  for (const auto& a : s.arguments()) plan.is_out.push_back(a.is_out());
  // So a fresh tensor is never uploaded just to be overwritten; its shape goes in the key.
  if (!plan.functional && lowering::overwrites_first_argument(plan.name)) {
    plan.overwritten = 0;
    plan.is_out[0] = true;
  }
  for (const auto& r : s.returns()) {
    int alias = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (size_t i = 0; i < s.arguments().size(); ++i) {
        const auto& ai = s.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets()) alias = static_cast<int>(i);
      }
    }
    plan.return_alias.push_back(alias);
  }
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto& ai = s.arguments()[i].alias_info();
    if (!ai || !ai->isWrite() || plan.is_out[i]) continue;
    if (std::find(plan.return_alias.begin(), plan.return_alias.end(), static_cast<int>(i)) != plan.return_alias.end())
      continue;
    plan.mutated.push_back(static_cast<int>(i));
  }
  plan.writes_from_functional = plan.functional && s.returns().empty();
  plan.pointwise = op.hasTag(at::Tag::pointwise) || (plan.functional && plan.functional->hasTag(at::Tag::pointwise));
  plan.overlap = overlap_rule(plan.name, plan.pointwise);
  plan.all_any = s.name() == "aten::all" || s.name() == "aten::any";
  plan.index_put =
      s.name() == "aten::index_put_" || s.name() == "aten::index_put" || s.name() == "aten::_index_put_impl_";
  plan.index = plan.name == "aten::index.Tensor";
  plan.factory = factory_kind(plan.name);
  if (static const std::set<std::string> takes_out_dtype = {"aten::sum", "aten::nansum", "aten::prod", "aten::cumsum",
                                                            "aten::cumprod"};
      takes_out_dtype.count(s.name()))
    for (size_t i = 0; i < s.arguments().size(); ++i) {
      if (s.arguments()[i].name() == "dtype") plan.dtype_from_out = static_cast<int>(i);
      if (plan.is_out[i] && plan.out_index < 0) plan.out_index = static_cast<int>(i);
    }
  if (plan.out_index < 0) plan.dtype_from_out = -1;
  plan.returns_list = s.returns().size() == 1 && s.returns()[0].type()->kind() == c10::TypeKind::ListType;
  // arange's Scalars decide its output shape, and pow's exponent its kernel
  // (x ** 2 is x * x, an int ** -1 raises, as on CPU): they stay in the key.
  const bool shape_from_scalars =
      s.name() == "aten::arange" || s.name() == "aten::range" ||
      ((s.name() == "aten::pow" || s.name() == "aten::pow_") && s.overload_name() != "Tensor_Tensor");
  for (const auto& a : s.arguments())
    plan.scalar_use.push_back(shape_from_scalars ? ScalarUse::Static : initial_scalar_use(a));
  plan.seen_values.resize(s.arguments().size());
  return plan;
}

OpPlan& plan_for(const c10::OperatorHandle& op) {
  // Ops also run on autograd's device threads. Plans are never erased, so a
  // reference stays valid after the lock is released.
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, OpPlan> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(&op.schema());
  if (it != plans.end()) return it->second;
  auto plan = make_plan(op);
  TORCH_CHECK(plan, "torch_tpu: no lowering for ", full_name(op.operator_name()));
  return plans.emplace(&op.schema(), std::move(*plan)).first->second;
}

[[noreturn]] void device_mismatch(const std::string& op, const c10::Device& a, const c10::Device& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
              "! (in ", op, " on tpu; move the tensors to one device with .to(device))");
}

// A tensor the program reads: a tpu tensor, or a CPU scalar (0-d) tensor,
// which PyTorch lets any device's ops take.
struct Input {
  at::Tensor tensor;
  bool on_host = false;
  bool dynamic_scalar = false;  // a Scalar argument's value (describe_dynamic)
  // A padded tensor on a bounded call: read padded (`tensor` is then a meta
  // tensor of its padded shape, for the program's parameter).
  std::shared_ptr<const PaddedRead> padded;
  // A host value kept on the device by value (host_value): a dynamic Scalar
  // or a 0-d CPU argument; not a random op's key, new at every call.
  bool by_value = false;
};

// A call over padded tensors (README "Bounded dynamic shapes"): the real
// sizes of its bounded parts, one runtime int32 each ("symbols": parts of
// one real size and bucket are one), and each argument's padded read.
struct BoundedCall {
  std::vector<std::pair<int64_t, int64_t>> symbols;      // (real size, bucket)
  std::vector<std::shared_ptr<const PaddedRead>> reads;  // per argument, null when not padded
  // Per argument that is a Tensor[] (cat's): per element, null when not padded.
  std::vector<std::vector<std::shared_ptr<const PaddedRead>>> list_reads;
  void add_symbols(const PaddedRead& read) {
    for (const auto& parts : read.dims)
      for (const Part& p : parts)
        if (p.bucket && symbol(p) < 0) symbols.push_back({p.real, p.bucket});
  }
  int symbol(const Part& p) const {
    for (size_t k = 0; k < symbols.size(); ++k)
      if (symbols[k] == std::make_pair(p.real, p.bucket)) return static_cast<int>(k);
    return -1;
  }
};

// The use of Scalar argument `i` for this call, recording its value.
ScalarUse scalar_use(OpPlan& plan, size_t i, const c10::IValue& v) {
  if (plan.scalar_use[i] == ScalarUse::None || v.isNone()) return ScalarUse::None;
  if (v.isComplexDouble()) return ScalarUse::Static;  // in the key: a complex program input is not worth it
  std::lock_guard<std::mutex> lock(scalar_mutex);
  ScalarUse& use = plan.scalar_use[i];
  if (use != ScalarUse::Tracking || !(v.isDouble() || v.isInt() || v.isBool())) return use;
  double x = v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : v.toBool();
  auto& seen = plan.seen_values[i];
  if (std::find(seen.begin(), seen.end(), x) != seen.end()) return use;
  seen.push_back(x);
  if (seen.size() >= kDynamicAfter) use = ScalarUse::Dynamic;
  return use;
}

// A dynamic Scalar or Scalar[] becomes a host input: a 0-d (or 1-D) CPU
// tensor uploaded with the call. Doubles travel as float32 unless the op
// reads or writes float64 or complex128 tensors (decided in lowered_kernel, after every argument).
void describe_dynamic(const c10::IValue& v, std::string& key, std::vector<Input>& inputs) {
  auto kind_of = [](const c10::IValue& x) { return x.isDouble() ? 'd' : x.isBool() ? 'b' : 'i'; };
  if (v.isList()) {
    std::vector<double> values;
    char kind = 'i';
    for (const c10::IValue& x : v.toListRef()) {
      TORCH_CHECK_TYPE(!x.isComplexDouble(), "torch_tpu: complex scalars are not supported on tpu.");
      values.push_back(x.isDouble() ? x.toDouble() : x.isBool() ? x.toBool() : static_cast<double>(x.toInt()));
      if (kind_of(x) == 'd') kind = 'd';
    }
    key += "S";
    key += kind;
    key += std::to_string(values.size()) + ";";
    at::Tensor t = at::tensor(values, at::kDouble);
    inputs.push_back({kind == 'd' ? t : t.to(at::kLong), true, true, nullptr, /*by_value=*/true});
    return;
  }
  TORCH_CHECK_TYPE(!v.isComplexDouble(), "torch_tpu: complex scalars are not supported on tpu.");
  key += "S";
  key += kind_of(v);
  key += ";";
  at::Tensor t = v.isDouble() ? at::scalar_tensor(v.toDouble(), at::kDouble)
                 : v.isBool() ? at::scalar_tensor(v.toBool(), at::kBool)
                              : at::scalar_tensor(v.toInt(), at::kLong);
  inputs.push_back({t, true, true, nullptr, /*by_value=*/true});
}

// An op on (or writing) double-precision tensors keeps its dynamic Scalars
// double; any other op takes them as float32.
void narrow_double_scalars(const std::vector<c10::IValue>& args, std::vector<Input>& inputs) {
  bool f64 = false;
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().defined())
      f64 |= v.toTensor().scalar_type() == at::kDouble || v.toTensor().scalar_type() == at::kComplexDouble;
  for (auto& in : inputs)
    if (in.dynamic_scalar && in.tensor.scalar_type() == at::kDouble && !f64) in.tensor = in.tensor.to(at::kFloat);
}

// Whether t's strides are the ones a new contiguous tensor of its sizes has
// (also in its size-1 dims, which PyTorch reports and layouts follow).
bool has_row_major_strides(const at::Tensor& t) {
  int64_t expected = 1;
  const auto sizes = t.sizes(), strides = t.strides();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (strides[d] != expected) return false;
    expected *= std::max<int64_t>(sizes[d], 1);
  }
  return true;
}

// Converts one argument: appends its part of the key, records tensor inputs.
void describe(const c10::IValue& v, bool is_out, const std::string& op, std::string& key, std::vector<Input>& inputs,
              std::optional<c10::Device>& device) {
  // Index tensors may live on the CPU (x[cpu_index], as on CUDA): they are uploaded.
  auto tensor = [&](const at::Tensor& t, bool host_ok = false) {
    if (!t.defined()) {
      key += "n;";
      return;
    }
    if (t.device().type() == kTpu) {
      if (device && *device != t.device()) device_mismatch(op, *device, t.device());
      device = t.device();
    } else if (!t.device().is_cpu() || (t.dim() != 0 && !host_ok)) {
      device_mismatch(op, device.value_or(c10::Device(kTpu, 0)), t.device());
    }
    key += t.unsafeGetTensorImpl()->is_wrapped_number() ? "w" : "t";  // a wrapped number promotes as a number
    key += stablehlo::mlir_name(to_dtype(t.scalar_type()));
    if (is_out) {  // only the destination dtype matters
      key += ";";
      return;
    }
    key += '[';
    append_dims(key, t.sizes());
    key += ']';
    // Output layouts follow the inputs' strides (TensorIterator): a tensor
    // laid out otherwise than row-major keys its strides too.
    if (!has_row_major_strides(t)) {
      key += ':';
      append_dims(key, t.strides());
    }
    key += ';';
    const bool on_host = t.device().type() != kTpu;
    inputs.push_back({t, on_host, false, nullptr, /*by_value=*/on_host && t.dim() == 0});
  };
  if (v.isTensor()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    key += "L";
    for (const at::Tensor& t : v.toTensorVector()) tensor(t);
    key += ";";
  } else if (v.isNone()) {
    key += "n;";
  } else if (v.isBool()) {
    key += v.toBool() ? "b1;" : "b0;";
  } else if (v.isInt()) {
    key += 'i';
    key += std::to_string(v.toInt());
    key += ';';
  } else if (v.isDouble()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "d%.17g;", v.toDouble());
    key += buf;
  } else if (v.isComplexDouble()) {
    char buf[80];
    const c10::complex<double> z = v.toComplexDouble();
    std::snprintf(buf, sizeof buf, "c%.17g,%.17g;", z.real(), z.imag());
    key += buf;
  } else if (v.isIntList()) {
    key += 'I';
    append_dims(key, v.toIntVector());
    key += ';';
  } else if (v.isBoolList()) {
    key += "B";
    for (bool b : v.toBoolList()) key += b ? "1" : "0";
    key += ";";
  } else if (v.isString()) {
    key += "s" + v.toStringRef() + ";";
  } else if (v.isOptionalTensorList()) {  // Tensor?[]: the indices of index / index_put
    key += "O";
    for (const auto& t : v.toOptionalTensorList()) {
      const std::optional<at::Tensor>& ot = t;
      if (ot && ot->defined())
        tensor(*ot, true);
      else
        key += "n;";
    }
    key += ";";
  } else if (v.isList()) {  // Scalar[] kept static
    key += "N";
    for (const c10::IValue& x : v.toListRef()) {
      TORCH_CHECK_TYPE(x.isDouble() || x.isInt() || x.isBool(), "torch_tpu: ", op, " got a list of ", x.tagKind(),
                       " that the lowering cannot take.");
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g,", x.isDouble() ? x.toDouble() : x.isBool() ? x.toBool() : x.toInt());
      key += buf;
    }
    key += ";";
  } else if (v.isDevice()) {
    key += "D;";
  } else if (v.isGenerator()) {  // a random op's key: a fresh one per call, a program input
    key += "g;";
    inputs.push_back({next_key_tensor(v.toGenerator(), op), true, false, nullptr});
  } else if (v.isComplexDouble()) {
    TORCH_CHECK_TYPE(false, "torch_tpu: ", op, " got a complex scalar; complex numbers are not supported on tpu.");
  } else {
    TORCH_CHECK(false, "torch_tpu: ", op, " got an argument of type ", v.tagKind(),
                " that the lowering cannot take yet.");
  }
}

// The same arguments on the meta device, for PyTorch's shape/dtype inference.
// CPU 0-d tensors go too: some meta checks want every tensor on one device
// (masked_fill's value), and a 0-d tensor promotes alike on either. Wrapped
// Python numbers stay: they promote differently and would lose that mark.
c10::IValue to_meta(const c10::IValue& v) {
  auto meta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  };
  if (v.isTensor()) return meta(v.toTensor());
  if (v.isGenerator()) return c10::IValue();  // meta kernels draw nothing; some (Python refs) refuse one
  if (v.isTensorList()) {
    std::vector<at::Tensor> ts;
    for (const at::Tensor& t : v.toTensorVector()) ts.push_back(meta(t));
    return ts;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> ts;
    for (const auto& t : v.toOptionalTensorList()) {
      const std::optional<at::Tensor>& ot = t;
      ts.push_back(ot ? std::optional<at::Tensor>(meta(*ot)) : std::nullopt);
    }
    return ts;
  }
  return v;
}

// index_put_ with one bool (or uint8) mask among its indices and a
// one-element value is masked_fill_ with that value cast to x's dtype, as in
// PyTorch's index_put_ (so x[mask] = torch.tensor(2) casts 2 to x's dtype):
// no count, no sync.
// all / any written into a uint8 out= tensor test the input converted to
// uint8 first, as CPU's legacy path does (0.5 counts as zero there).
void uint8_all_any(const OpPlan& plan, std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  if (!plan.all_any || args.empty() || !args[0].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  if (self.scalar_type() == at::kBool || self.scalar_type() == at::kByte) return;
  for (size_t i = 0; i < args.size(); ++i)
    if (plan.is_out[i] && args[i].isTensor() && args[i].toTensor().scalar_type() == at::kByte) {
      args[0] = self.to(at::kByte);
      (*stack)[stack->size() - args.size()] = args[0];
      return;
    }
}

// TorchScript hands a Tensor?[] over as a Tensor[] (x[x < 50] = 1.0 in a
// scripted function): the same indices, as the list type the kernels read.
void optional_tensor_lists(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args,
                           torch::jit::Stack* stack) {
  for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i) {
    if (!args[i].isList() || args[i].isOptionalTensorList()) continue;
    auto list = schema.arguments()[i].type()->cast<c10::ListType>();
    if (!list || list->getElementType()->kind() != c10::TypeKind::OptionalType) continue;
    c10::List<std::optional<at::Tensor>> optional;
    for (const c10::IValue& t : args[i].toListRef())
      optional.push_back(t.isTensor() ? std::optional<at::Tensor>(t.toTensor()) : std::nullopt);
    args[i] = optional;
    (*stack)[stack->size() - args.size() + i] = args[i];
  }
}

// CPU's checks of advanced-indexing arguments, with its error types: index
// dtypes (IndexError), uint8 masks (a deprecation warning per mask), masks
// that do not match the indexed shape are checked where they expand.
void check_index_dtypes(const std::vector<c10::IValue>& args) {
  for (const auto& v : args) {
    if (!v.isOptionalTensorList()) continue;
    for (const auto& t : v.toOptionalTensorList()) {
      const std::optional<at::Tensor>& index = t;
      if (!index || !index->defined()) continue;
      const auto type = index->scalar_type();
      TORCH_CHECK_INDEX(type == at::kLong || type == at::kInt || type == at::kByte || type == at::kBool,
                        "tensors used as indices must be long, int, byte or bool tensors");
      if (type == at::kByte)
        TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.");
    }
  }
}

// After masks became coordinates: the indices broadcast together, a dimension
// of size 0 takes no index, and index_put's values broadcast to the indexed
// result, each raised as CPU raises it.
void check_index_shapes(const OpPlan& plan, const std::vector<c10::IValue>& args) {
  for (size_t a = 0; a < args.size(); ++a) {
    if (!args[a].isOptionalTensorList() || !args[0].isTensor()) continue;
    const at::Tensor& self = args[0].toTensor();
    std::vector<at::Tensor> defined;
    int64_t dim = 0;
    for (const auto& t : args[a].toOptionalTensorList()) {
      const std::optional<at::Tensor>& index = t;
      if (index && index->defined()) {
        TORCH_CHECK_INDEX(dim >= self.dim() || self.size(dim) != 0 || index->numel() == 0,
                          "index is out of bounds for dimension with size 0");
        defined.push_back(*index);
      }
      ++dim;
    }
    if (defined.empty()) continue;
    std::vector<int64_t> shape = defined[0].sizes().vec();
    for (size_t k = 1; k < defined.size(); ++k) {
      bool ok = true;
      try {
        shape = at::infer_size(shape, defined[k].sizes());
      } catch (const c10::Error&) {
        ok = false;
      }
      if (!ok) {
        std::string shapes;
        for (size_t j = 0; j < defined.size(); ++j) shapes += (j ? ", " : "") + c10::str(defined[j].sizes());
        TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ",
                          shapes);
      }
    }
    if (plan.index_put && args.size() > a + 1 && args[a + 1].isTensor()) {
      // The indexed result's shape, from PyTorch's meta kernel for index.
      c10::List<std::optional<at::Tensor>> meta_indices;
      for (const auto& t : args[a].toOptionalTensorList()) {
        const std::optional<at::Tensor>& index = t;
        meta_indices.push_back(index && index->defined() ? std::optional<at::Tensor>(index->to(at::kMeta))
                                                         : std::nullopt);
      }
      const at::Tensor result = at::index(self.to(at::kMeta), meta_indices);
      const at::Tensor& values = args[a + 1].toTensor();
      TORCH_CHECK(at::is_expandable_to(values.sizes(), result.sizes()), "shape mismatch: value tensor of shape ",
                  values.sizes(), " cannot be broadcast to indexing result of shape ", result.sizes());
    }
  }
}

bool index_put_as_masked_fill(const OpPlan& plan, const std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  if (!plan.index_put) return false;
  if (args.size() < 4 || args[3].toBool() || !args[2].isTensor()) return false;  // accumulate
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& value = args[2].toTensor();
  if (value.numel() != 1 || (!value.is_cpu() && value.device() != self.device())) return false;
  // A device value of another dtype: index_put_'s dtype error, as on CUDA
  // (only a CPU value is a number there, filled in as masked_fill_ does).
  if (!value.is_cpu() && value.scalar_type() != self.scalar_type()) return false;
  at::Tensor mask;
  int64_t dim = 0;
  for (const auto& t : args[1].toOptionalTensorList()) {
    const std::optional<at::Tensor>& index = t;
    if (!index || !index->defined()) {
      ++dim;
      continue;
    }
    const auto type = index->scalar_type();
    if ((type != at::kBool && type != at::kByte) || index->device() != self.device() || mask.defined()) return false;
    for (int64_t j = 0; j < index->dim(); ++j)
      TORCH_CHECK_INDEX(dim + j < self.dim() && index->size(j) == self.size(dim + j), "The shape of the mask ",
                        index->sizes(), " at index ", j, " does not match the shape of the indexed tensor ",
                        self.sizes(), " at index ", dim + j);
    mask = type == at::kBool ? *index : index->to(at::kBool);
    dim += index->dim();
  }
  if (!mask.defined()) return false;
  for (int64_t j = dim; j < self.dim(); ++j) mask = mask.unsqueeze(-1);
  at::Tensor target = plan.name == "aten::index_put" ? self.clone(at::MemoryFormat::Preserve) : self;
  if (value.is_cpu())
    target.masked_fill_(mask, value.item());
  else
    target.masked_fill_(mask, value.reshape({}));
  torch::jit::drop(*stack, args.size());
  stack->push_back(target);
  return true;
}

// A boolean (or uint8) mask among the index tensors of index / index_put
// makes the shape depend on the data. As PyTorch does, each k-dim mask
// becomes k int64 index tensors, its nonzero() coordinates (computed on the
// device with one sync), and the op proceeds with int indices.
void expand_index_masks(std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  const size_t n = args.size();
  for (size_t a = 0; a < n; ++a) {
    if (!args[a].isOptionalTensorList()) continue;
    bool any_mask = false;
    for (const auto& t : args[a].toOptionalTensorList()) {
      const std::optional<at::Tensor>& ot = t;
      any_mask |= ot && ot->defined() && (ot->scalar_type() == at::kBool || ot->scalar_type() == at::kByte);
    }
    if (!any_mask) continue;
    const at::Tensor& self = args[0].toTensor();
    c10::List<std::optional<at::Tensor>> expanded;
    int64_t dim = 0;
    for (const auto& t : args[a].toOptionalTensorList()) {
      const std::optional<at::Tensor>& ot = t;
      if (!ot || !ot->defined() || (ot->scalar_type() != at::kBool && ot->scalar_type() != at::kByte)) {
        expanded.push_back(ot);
        ++dim;
        continue;
      }
      const at::Tensor& mask = *ot;
      for (int64_t j = 0; j < mask.dim(); ++j) {
        TORCH_CHECK_INDEX(dim + j < self.dim() && mask.size(j) == self.size(dim + j), "The shape of the mask ",
                          mask.sizes(), " at index ", j, " does not match the shape of the indexed tensor ",
                          self.sizes(), " at index ", dim + j);
      }
      at::Tensor coords = at::nonzero(mask.scalar_type() == at::kBool ? mask : mask.to(at::kBool));
      for (int64_t j = 0; j < mask.dim(); ++j) expanded.push_back(coords.select(1, j));
      dim += mask.dim();
    }
    args[a] = expanded;
    (*stack)[stack->size() - n + a] = args[a];
  }
}

// The placeholder for an output the op leaves undefined (a backward's
// output_mask): a shape no tensor has. The rule returns an empty Value for it,
// the program a bool[0] so outputs stay aligned, the kernel an undefined tensor.
const TensorType kUndefinedOutput{stablehlo::DType::Bool, {-1}};

bool is_undefined_output(const TensorType& t) { return t.shape.size() == 1 && t.shape[0] < 0; }

std::vector<TensorType> meta_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                     const std::vector<bool>* skip, std::vector<std::vector<int64_t>>* strides) {
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i)
    if (!skip || !(*skip)[i]) stack.push_back(to_meta(args[i]));
  // PyTorch 2.13's meta kernels of these ops use their optional tensors
  // without checking (nn.LSTM(bias=False) and batch norm without an affine
  // bias fail in them): they see zeros of shape [size(1) of argument 0]
  // (the biases', weight's and bias' shape), which change no output shape.
  struct OptionalTensors {
    const char* op;
    size_t first, last;
  };
  static constexpr OptionalTensors kMetaReadsOptionals[] = {{"aten::_thnn_fused_lstm_cell", 3, 4},
                                                            {"aten::_batch_norm_with_update", 1, 2}};
  for (const auto& o : kMetaReadsOptionals)
    if (op.operator_name().name == o.op && stack.size() > o.last && stack[0].isTensor())
      for (size_t i = o.first; i <= o.last; ++i)
        if (stack[i].isNone() || (stack[i].isTensor() && !stack[i].toTensor().defined()))
          stack[i] = at::zeros({stack[0].toTensor().size(1)}, stack[0].toTensor().options());
  op.callBoxed(stack);
  std::vector<TensorType> types;
  for (const auto& r : stack) {
    auto add = [&](const at::Tensor& t) {
      if (strides) strides->emplace_back(t.defined() ? t.strides().vec() : std::vector<int64_t>());
      if (!t.defined()) {
        types.push_back(kUndefinedOutput);
        return;
      }
      types.push_back({to_dtype(t.scalar_type()), std::vector<int64_t>(t.sizes().begin(), t.sizes().end())});
    };
    if (r.isTensor())
      add(r.toTensor());
    else if (r.isTensorList())
      for (const auto& t : r.toTensorVector()) add(t);
  }
  // PyTorch 2.13's meta kernel gives _native_batch_norm_legit in evaluation
  // saved statistics of shape [C]; CPU returns them empty.
  if (op.operator_name().name == "aten::_native_batch_norm_legit" && op.operator_name().overload_name.empty() &&
      args.size() > 5 && args[5].isBool() && !args[5].toBool() && types.size() >= 3) {
    for (size_t k = 1; k < 3; ++k) {
      types[k].shape = {0};
      if (strides) (*strides)[k] = {1};
    }
  }
  // PyTorch 2.13's meta kernel gives multilabel_margin_loss of one unbatched
  // sample the shape [1]; CPU and CUDA give a 0-d loss.
  if (op.operator_name().name == "aten::multilabel_margin_loss_forward" && !args.empty() && args[0].isTensor() &&
      args[0].toTensor().dim() <= 1 && !types.empty()) {
    types[0].shape.clear();
    if (strides) (*strides)[0].clear();
  }
  return types;
}

LoweringArg lowering_arg(stablehlo::Builder& b, const c10::IValue& v, bool is_out, bool dynamic, int source,
                         size_t& next_param, const std::vector<stablehlo::Value>& params) {
  LoweringArg a;
  if (is_out) return a;
  if (dynamic) {
    const c10::IValue& first = v.isList() && !v.toListRef().empty() ? v.toListRef()[0] : v;
    a.kind = v.isList()         ? LoweringArg::NumberList
             : first.isDouble() ? LoweringArg::Double
             : first.isBool()   ? LoweringArg::Bool
                                : LoweringArg::Int;
    a.dynamic = true;
    a.source = source;
    a.tensor = params[next_param++];
    return a;
  }
  auto tensor = [&](const at::Tensor& t) { return params[next_param++]; };
  if (v.isTensor() && v.toTensor().defined()) {
    a.kind = LoweringArg::Tensor;
    a.tensor = tensor(v.toTensor());
    a.wrapped_number = v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
    a.contiguous = v.toTensor().is_contiguous();  // keyed: other layouts key their strides
  } else if (v.isTensorList()) {
    a.kind = LoweringArg::TensorList;
    for (const at::Tensor& t : v.toTensorVector()) a.tensors.push_back(tensor(t));
  } else if (v.isBool()) {
    a.kind = LoweringArg::Bool;
    a.b = v.toBool();
  } else if (v.isInt()) {
    a.kind = LoweringArg::Int;
    a.i = v.toInt();
  } else if (v.isDouble()) {
    a.kind = LoweringArg::Double;
    a.d = v.toDouble();
  } else if (v.isComplexDouble()) {  // a complex Python number: a 0-d constant that promotes as a number
    const c10::complex<double> z = v.toComplexDouble();
    a.kind = LoweringArg::Tensor;
    a.wrapped_number = true;
    a.tensor = b.complex(b.scalar(z.real(), stablehlo::DType::Float64), b.scalar(z.imag(), stablehlo::DType::Float64));
  } else if (v.isIntList()) {
    a.kind = LoweringArg::IntList;
    a.ints = v.toIntVector();
  } else if (v.isBoolList()) {  // e.g. output_mask: as 0/1 ints
    a.kind = LoweringArg::IntList;
    for (bool b : v.toBoolList()) a.ints.push_back(b ? 1 : 0);
  } else if (v.isString()) {
    a.kind = LoweringArg::String;
    a.s = v.toStringRef();
  } else if (v.isGenerator()) {  // the 0-d int64 key
    a.kind = LoweringArg::Tensor;
    a.tensor = params[next_param++];
  } else if (v.isOptionalTensorList()) {  // a None entry is a Value without a name
    a.kind = LoweringArg::TensorList;
    for (const auto& t : v.toOptionalTensorList()) {
      const std::optional<at::Tensor>& ot = t;
      a.tensors.push_back(ot && ot->defined() ? tensor(*ot) : stablehlo::Value{});
    }
  } else if (v.isList()) {  // a static Scalar[]
    a.kind = LoweringArg::NumberList;
    for (const c10::IValue& x : v.toListRef())
      a.numbers.push_back(x.isDouble() ? x.toDouble() : x.isBool() ? x.toBool() : static_cast<double>(x.toInt()));
  }
  return a;
}

std::string describe_inputs(const std::vector<Input>& inputs);
// The strides of output k when it is not row-major, else empty.
at::IntArrayRef layout_of(const runtime::Program& program, size_t k) {
  return k < program.output_strides.size() ? at::IntArrayRef(program.output_strides[k]) : at::IntArrayRef();
}
void check_finite(const std::string& op, const std::vector<Input>& inputs, const std::vector<TensorType>& types,
                  const std::vector<pjrt::BufferPtr>& results, int dev);
void check_written_shapes(const OpPlan& plan, const std::vector<c10::IValue>& args,
                          const std::vector<TensorType>& outputs);

// Builds the op's program (on a cache miss): PyTorch's meta kernel decides
// the outputs, the rule lowers the op, and the outputs are flattened in the
// memory order PyTorch gives them.
runtime::ProgramSpec build_program(const c10::OperatorHandle& op, const OpPlan& plan,
                                   const std::vector<c10::IValue>& args, const std::vector<Input>& inputs,
                                   const std::vector<bool>& dynamic, const std::vector<at::Tensor>& mutated,
                                   const std::vector<at::ScalarType>& dest_dtypes,
                                   const BoundedCall* bounded = nullptr) {
  const size_t n = args.size();
  // PyTorch's meta kernels decide output shapes and dtypes and raise
  // PyTorch's own errors for bad shapes; the in-place op's own meta check
  // runs too (e.g. "output with shape [...] doesn't match the broadcast shape").
  std::vector<TensorType> outs;
  std::vector<std::vector<int64_t>> strides;  // of each output, as PyTorch lays it out
  // Not for random ops (CPU's kernel wants a CPU generator), nor the ops
  // whose CPU kernel does not apply to stand-ins (pytorch_checks.cpp).
  const bool probe = plan.overwritten < 0 && cpu_probe_applies(plan.name);
  try {
    if (plan.functional) {
      bool has_out = std::find(plan.is_out.begin(), plan.is_out.end(), true) != plan.is_out.end();
      if (!has_out) meta_outputs(op, args, nullptr, nullptr);
      outs = meta_outputs(*plan.functional, args, &plan.is_out, &strides);
    } else if (!op.schema().returns().empty() || op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
      outs = meta_outputs(op, args, nullptr, &strides);
    }  // else: an op that only writes its arguments and has no meta kernel (_fused_sgd_)
  } catch (const std::exception&) {
    // Where CPU's kernel refuses the call too, its error (class and message) is the one to raise.
    if (probe) check_like_cpu(op, args, plan.pointwise, /*meta_refused=*/true);
    throw;
  }
  // The checks of CPU's kernel that the meta kernel skips (dtypes, casts),
  // and its result types for a pointwise op.
  if (probe) {
    if (plan.pointwise) check_written_shapes(plan, args, outs);
    auto cpu_dtypes = check_like_cpu(op, args, plan.pointwise);
    if (plan.pointwise && !plan.functional && cpu_dtypes.size() == outs.size())
      for (size_t k = 0; k < outs.size(); ++k) outs[k].dtype = to_dtype(cpu_dtypes[k]);
  }
  if (!plan.takes_complex)
    for (const auto& t : outs)
      if (stablehlo::is_complex(t.dtype)) throw lowering::Declined(plan.name + " has no rule for complex values yet");
  lay_out_like_cpu(plan.name, plan.pointwise, plan.is_out, args, outs, strides);
  stablehlo::Builder b;
  std::vector<stablehlo::Value> params;
  for (const auto& in : inputs) {
    TensorType flat{to_dtype(in.tensor.scalar_type()), {in.tensor.numel()}};
    params.push_back(b.parameter(flat));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& sizes = inputs[i].tensor.sizes();
    params[i] = inputs[i].padded ? padded_value(b, params[i], *inputs[i].padded)
                                 : b.reshape(params[i], std::vector<int64_t>(sizes.begin(), sizes.end()));
  }
  std::vector<LoweringArg> largs;
  size_t next_param = 0;
  for (size_t i = 0; i < n; ++i)
    largs.push_back(lowering_arg(b, args[i], plan.is_out[i], dynamic[i], static_cast<int>(i), next_param, params));
  lowering::LoweringContext ctx{b, largs, outs, {}};
  const lowering::LoweringRule* rule = plan.rule;
  std::vector<lowering::BoundedDims> bounds;
  if (bounded) {  // the last parameter: the symbols' real sizes
    std::vector<stablehlo::Value> reals;
    for (size_t k = 0; k < bounded->symbols.size(); ++k) {
      const int64_t at = static_cast<int64_t>(k);
      reals.push_back(b.reshape(b.slice(params.back(), {at}, {at + 1}, {1}), {}));
    }
    for (size_t i = 0; i < n; ++i) {
      bounds.emplace_back();
      if (!bounded->reads[i]) continue;
      for (const auto& parts : bounded->reads[i]->dims) {
        bounds.back().emplace_back();
        for (const Part& p : parts) {
          const int k = p.bucket ? bounded->symbol(p) : -1;
          bounds.back().back().push_back({p.padded(), k >= 0 ? reals[k] : stablehlo::Value{}});
        }
      }
    }
    ctx.bounds = &bounds;
    if (const auto* r =
            lowering::find_bounded_rule(plan.functional ? full_name(plan.functional->operator_name()) : plan.name))
      rule = r;
  }
  std::vector<stablehlo::Value> results = (*rule)(ctx);
  const size_t written = plan.writes_from_functional ? 0 : mutated.size();
  TORCH_CHECK(results.size() == outs.size() + written, "torch_tpu: the lowering of ", plan.name, " returned ",
              results.size(), " values for ", outs.size(), " outputs and ", written, " written arguments");
  if (plan.writes_from_functional) {  // the functional op's outputs land in the written arguments
    TORCH_CHECK(outs.size() == mutated.size(), "torch_tpu: ", plan.name, " computes ", outs.size(), " values for ",
                mutated.size(), " written tensors");
    for (size_t k = 0; k < outs.size(); ++k) outs[k].dtype = to_dtype(mutated[k].scalar_type());
  }
  for (size_t k = 0; k < written; ++k)
    outs.push_back({to_dtype(mutated[k].scalar_type()),
                    std::vector<int64_t>(mutated[k].sizes().begin(), mutated[k].sizes().end())});
  std::vector<stablehlo::Value> flat;
  std::vector<TensorType> flat_types;
  std::vector<std::vector<int64_t>> layouts(results.size());
  const size_t n_returns = results.size() - mutated.size();
  size_t dest = 0;
  for (size_t k = 0; k < results.size(); ++k) {
    stablehlo::DType dtype = outs[k].dtype;
    if (k < plan.return_alias.size() && plan.return_alias[k] >= 0) dtype = to_dtype(dest_dtypes[dest++]);
    // An empty Value: an output left out of output_mask (the meta kernel
    // may still describe it, e.g. native_batch_norm_backward's).
    if (results[k].name.empty()) {
      TORCH_CHECK(k + mutated.size() < results.size() && !plan.writes_from_functional, "torch_tpu: the lowering of ",
                  plan.name, " left a written argument undefined");
      flat.push_back(b.constant(0, {stablehlo::DType::Bool, {0}}));
      flat_types.push_back(kUndefinedOutput);
      continue;
    }
    // A rule that does not read output_mask: the CPU kernel, as before.
    if (is_undefined_output(outs[k]))
      throw lowering::Declined(plan.name + ": output " + std::to_string(k) + " is undefined (output_mask)");
    TORCH_CHECK(results[k].type.numel() == outs[k].numel(), "torch_tpu: the lowering of ", plan.name, " produced ",
                results[k].type.str(), " where PyTorch expects shape [", dims_key(outs[k].shape), "]");
    stablehlo::Value value = b.cast(results[k], dtype);
    // A new tensor is laid out as PyTorch lays it out (TensorIterator
    // follows its inputs' layout: x.t() + 1 is transposed too).
    // An out= tensor that must be resized takes that layout too (its value is
    // written through its strides, so stays in logical order here).
    const bool new_tensor =
        k < n_returns && !plan.writes_from_functional && (k >= plan.return_alias.size() || plan.return_alias[k] < 0);
    const bool out_tensor =
        k < plan.return_alias.size() && plan.return_alias[k] >= 0 && plan.is_out[plan.return_alias[k]];
    if ((new_tensor || out_tensor) && k < strides.size()) {
      auto order = lowering::memory_order(outs[k].shape, strides[k]);
      if (new_tensor && !order.empty()) value = b.transpose(value, order);
      // Strides of size-1 dims do not move elements, but PyTorch reports them.
      if (!order.empty() || (lowering::is_dense(outs[k].shape, strides[k]) &&
                             at::IntArrayRef(strides[k]) != at::IntArrayRef(c10::contiguous_strides(outs[k].shape))))
        layouts[k] = strides[k];
    }
    flat.push_back(b.reshape(value, {outs[k].numel()}));
    flat_types.push_back({dtype, outs[k].shape});
  }
  std::vector<std::string> checks;
  std::vector<stablehlo::Value> flags;
  for (const auto& check : ctx.checks) {
    flags.push_back(b.reshape(check.ok, {1}));
    checks.push_back(std::string(check.index_error ? "" : runtime::kRuntimeErrorCheck) + check.message + " (in " +
                     plan.name + " on tpu)");
  }
  if (!flags.empty()) {  // one trailing bool[k] output: see Program::checks
    flat.push_back(flags.size() == 1 ? flags[0] : b.concatenate(flags, 0));
    flat_types.push_back({stablehlo::DType::Bool, {static_cast<int64_t>(flags.size())}});
  }
  // An input the lowering ignores (fill_'s self) is no parameter: a launch
  // reads no buffer for it, so a never-written storage gets no zeros first.
  std::vector<size_t> unread;
  if (!bounded) {
    const std::vector<bool> kept = b.prune(flat);
    for (size_t i = 0; i < kept.size(); ++i)
      if (!kept[i]) unread.push_back(i);
  }
  runtime::ProgramSpec spec(b.module(flat), flat_types, checks);
  spec.unread_inputs = std::move(unread);
  layouts.resize(flat.size());
  spec.output_strides = std::move(layouts);
  return spec;
}

// The overlap checks of the tensors this call writes (its in-place self,
// out= tensors, written arguments), against its other tensor inputs.
void check_writes(const OpPlan& plan, const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& mutated) {
  // Foreach lists order their own writes; a random op overwrites self without reading it.
  if (plan.overlap == OverlapRule::None || plan.writes_from_functional || plan.overwritten >= 0) return;
  std::vector<Written> written, inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    const int a = static_cast<int>(i);
    const bool writes =
        plan.is_out[i] || std::find(plan.return_alias.begin(), plan.return_alias.end(), a) != plan.return_alias.end();
    auto add = [&](const at::Tensor& t) {
      if (t.defined()) (writes ? written : inputs).push_back({t, a});
    };
    if (args[i].isTensor()) add(args[i].toTensor());
    if (args[i].isTensorList())
      for (const at::Tensor& t : args[i].toTensorVector()) add(t);
    if (args[i].isOptionalTensorList())
      for (const auto& t : args[i].toOptionalTensorList()) {
        const std::optional<at::Tensor>& ot = t;
        if (ot) add(*ot);
      }
  }
  for (int i : plan.mutated)
    for (auto& w : inputs)
      if (w.argument == i) written.push_back(w);
  if (!written.empty()) check_overlap(written, inputs, plan.overlap);
}

// TensorIterator's shape checks of the tensors an op writes: an in-place
// result must have self's shape (x.div_(y) with y broadcasting x to a larger
// shape), and an out= tensor that is also an input is not resized.
// Also before CPU's kernel runs on stand-ins, whose sizes would hide it.
void check_written_shapes(const OpPlan& plan, const std::vector<c10::IValue>& args,
                          const std::vector<TensorType>& outputs) {
  for (size_t k = 0; k < plan.return_alias.size() && k < outputs.size(); ++k) {
    const int alias = plan.return_alias[k];
    if (alias < 0) continue;
    const at::Tensor& out = args[alias].toTensor();
    const auto& shape = outputs[k].shape;
    if (out.sizes() == at::IntArrayRef(shape)) continue;
    bool resizable = plan.is_out[alias];
    for (size_t i = 0; i < args.size() && resizable; ++i)
      resizable = static_cast<int>(i) == alias || !args[i].isTensor() || !args[i].toTensor().is_same(out);
    TORCH_CHECK(resizable, "output with shape ", out.sizes(), " doesn't match the broadcast shape ",
                at::IntArrayRef(shape));
  }
}

// Whether a dynamic Scalar's value may not fit the op's dtype (-1.5 for a
// uint8 fill_): CPU's checks then run for this call, since a dynamic Scalar's
// value is not part of the program's key (its kind is).
bool needs_value_check(const std::vector<c10::IValue>& args, const std::vector<bool>& dynamic) {
  std::optional<at::ScalarType> dtype;
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().defined()) {
      dtype = v.toTensor().scalar_type();
      break;
    }
  if (!dtype) return false;
  auto fits = [&](const c10::Scalar& v) {
    if (v.isBoolean()) return true;
    if (*dtype == at::kBool) return false;
    if (at::isIntegralType(*dtype, false)) {
      if (v.isFloatingPoint()) return false;
      const int64_t x = v.toLong();
      switch (*dtype) {
        case at::kByte: return x >= 0 && x <= 255;
        case at::kChar: return x >= -128 && x <= 127;
        case at::kShort: return x >= INT16_MIN && x <= INT16_MAX;
        case at::kInt: return x >= INT32_MIN && x <= INT32_MAX;
        default: return true;
      }
    }
    const double x = v.toDouble(), max = *dtype == at::kHalf ? 65504.0 : 3.3895313892515355e38;
    return *dtype == at::kDouble || !std::isfinite(x) || std::abs(x) <= max;
  };
  for (size_t i = 0; i < args.size(); ++i)
    if (dynamic[i] && args[i].isScalar() && !fits(args[i].toScalar())) return true;
  return false;
}

// Complex values reach only the rules written for them (lowering/complex.cpp).
void decline_complex(const OpPlan& plan, const std::vector<c10::IValue>& args) {
  if (plan.takes_complex) return;
  auto complex = [](const at::Tensor& t) { return t.defined() && t.is_complex(); };
  for (const auto& v : args) {
    bool any = v.isComplexDouble() || (v.isTensor() && complex(v.toTensor()));
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) any |= complex(t);
    if (any) throw lowering::Declined(plan.name + " has no rule for complex values yet");
  }
}

// PyTorch lets a conjugate or negative view through to a few ops with its
// bit set (mm, dot, addmm: BLAS conjugates as it reads): an input is read as
// its values. (Written arguments keep their bits; their ops do not get them.)
void resolve_math_views(const OpPlan& plan, std::vector<c10::IValue>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor() || plan.is_out[i]) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined() || (!t.is_conj() && !t.is_neg())) continue;
    const int k = static_cast<int>(i);
    if (std::count(plan.mutated.begin(), plan.mutated.end(), k) ||
        std::count(plan.return_alias.begin(), plan.return_alias.end(), k))
      continue;
    args[i] = t.resolve_conj().resolve_neg();
  }
}

// Verifies (Debug mode) or defers the program's check flags, its last
// result, and removes them from `results`.
void take_checks(const runtime::Program& program, std::vector<pjrt::BufferPtr>& results) {
  const auto& checks = program.checks;
  if (checks.empty()) return;
  auto& runtime = Runtime::get();
  if (runtime.mode() == runtime::EagerMode::Debug) {
    std::unique_ptr<bool[]> ok(new bool[checks.size()]);
    runtime.download(*results.back(), ok.get(), checks.size());
    for (size_t j = 0; j < checks.size(); ++j)
      if (!ok[j]) raise_check(checks[j]);
  } else {
    runtime.defer_check(results.back(), checks);
  }
  results.pop_back();
}

std::vector<pjrt::BufferPtr> launch(const runtime::ProgramPtr& program, const std::vector<pjrt::BufferPtr>& buffers,
                                    int dev, const OpPlan& plan, const std::vector<Input>& inputs) {
  try {
    return Runtime::get().execute(program, buffers, dev, plan.name.c_str());
  } catch (const runtime::OutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what(), "\n  op: ", plan.name, " with inputs ",
                     describe_inputs(inputs));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what(), "\n  op: ", plan.name, " with inputs ", describe_inputs(inputs));
  }
}

// Sizes for a bounded call's meta run, one per symbol: primes no static size
// is likely to be, so an output dim's size tells which input dim it follows.
constexpr int64_t kProbe[] = {7919, 7927, 7933, 7937, 7949, 7951, 7963, 7993};
constexpr size_t kMaxSymbols = sizeof kProbe / sizeof kProbe[0];

// A bounded call's program and, per output and dim, its parts: (the symbol
// whose real size it has, or -1 for a static part; its padded size).
struct BoundedProgram {
  runtime::ProgramPtr program;
  std::vector<std::vector<std::vector<std::pair<int, int64_t>>>> outputs;
  // Per output: its dims in memory order when PyTorch lays it out permuted
  // (the neg of a transposed box), else empty.
  std::vector<std::vector<int64_t>> orders;
};

// The program of a bounded call and its outputs' parts, built on the first
// call of `key`; null when the op cannot run on these padded values.
std::shared_ptr<const BoundedProgram> bounded_program(const std::string& key, const c10::OperatorHandle& op,
                                                      OpPlan& plan, const std::vector<c10::IValue>& args,
                                                      const std::vector<Input>& inputs,
                                                      const std::vector<bool>& dynamic, const BoundedCall& call) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<const BoundedProgram>> programs;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = programs.find(key); it != programs.end()) return it->second;
  }
  // The arguments at their padded shapes (what the program is built for),
  // and at probe sizes (what maps output dims to input dims).
  std::vector<c10::IValue> padded_args(args), probe_args(args);
  std::vector<std::pair<const PaddedRead*, std::vector<int64_t>>> probes;  // each read's probe shape
  auto stand_ins = [&](const at::Tensor& t, const PaddedRead& read) {
    auto& shape = probes.emplace_back(&read, std::vector<int64_t>()).second;
    for (const auto& parts : read.dims) {
      int64_t size = 1;
      for (const Part& p : parts) size *= p.bucket ? kProbe[call.symbol(p)] : p.real;
      shape.push_back(size);
    }
    // Laid out in the tensor's memory order, so PyTorch lays out the outputs as for the real tensor
    // (x.t() * 2 is transposed; such an output reads exact shapes).
    auto in_order = [&](const std::vector<int64_t>& sizes) {
      if (!read.box_strides.empty() && sizes == read.shape())
        return at::empty_strided(sizes, read.box_strides, t.options().device(at::kMeta));
      std::vector<int64_t> strides(sizes.size(), 1);
      int64_t inner = 1;
      for (auto d = read.memory_dims.rbegin(); d != read.memory_dims.rend(); ++d) {
        strides[*d] = inner;
        inner *= sizes[*d];
      }
      return at::empty_strided(sizes, strides, t.options().device(at::kMeta));
    };
    return std::make_pair(in_order(read.shape()), in_order(shape));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    if (call.reads[i]) std::tie(padded_args[i], probe_args[i]) = stand_ins(args[i].toTensor(), *call.reads[i]);
    if (call.list_reads[i].empty()) continue;
    std::vector<at::Tensor> padded_list = args[i].toTensorVector(), probe_list = padded_list;
    for (size_t e = 0; e < padded_list.size(); ++e)
      if (call.list_reads[i][e])
        std::tie(padded_list[e], probe_list[e]) = stand_ins(padded_list[e], *call.list_reads[i][e]);
    padded_args[i] = padded_list;
    probe_args[i] = probe_list;
  }
  auto result = std::make_shared<BoundedProgram>();
  try {
    const auto probe_outputs = meta_outputs(op, probe_args, nullptr, nullptr);
    result->program = Runtime::get().program(
        key,
        [&] {
          Runtime::get().count("bucket_compiles");
          std::vector<at::ScalarType> dest;  // an in-place op's: self's dtype
          for (int a : plan.return_alias)
            if (a >= 0) dest.push_back(args[a].toTensor().scalar_type());
          return build_program(op, plan, padded_args, inputs, dynamic, {}, dest, &call);
        },
        /*indexed=*/false);
    const auto& program = *result->program;
    const size_t n_out = program.outputs.size() - (program.checks.empty() ? 0 : 1);
    if (probe_outputs.size() != n_out) throw lowering::NotBounded("outputs differ");
    auto has_probe = [&](int64_t v) {
      for (size_t k = 0; k < call.symbols.size(); ++k)
        if (v != 0 && v % kProbe[k] == 0) return true;
      return false;
    };
    for (size_t k = 0; k < n_out; ++k) {
      const auto& padded = program.outputs[k].shape;
      if (is_undefined_output(program.outputs[k]) || probe_outputs[k].shape.size() != padded.size())
        throw lowering::NotBounded("output layout");
      auto& order = result->orders.emplace_back();
      if (const auto layout = layout_of(program, k); !layout.empty()) {
        order = lowering::memory_order(padded, layout.vec());
        if (order.empty()) throw lowering::NotBounded("output strides of size-1 dims");
      }
      auto& dims = result->outputs.emplace_back();
      for (size_t j = 0; j < padded.size(); ++j) {
        const int64_t probe = probe_outputs[k].shape[j];
        auto& parts = dims.emplace_back();
        if (probe == padded[j] && !has_probe(probe)) {
          parts.push_back({-1, probe});
          continue;
        }
        for (const auto& [read, probe_shape] : probes) {
          const auto shape = read->shape();
          for (size_t d = 0; d < shape.size() && parts.empty(); ++d) {
            if (probe_shape[d] != probe || shape[d] != padded[j]) continue;
            for (const Part& p : read->dims[d]) parts.push_back({p.bucket ? call.symbol(p) : -1, p.padded()});
          }
          if (!parts.empty()) break;
        }
        if (parts.empty()) throw lowering::NotBounded("an output dim no input dim explains");
      }
    }
  } catch (const lowering::NeedsStaticScalar& e) {
    // The rule needs this Scalar's value at compile time: keyed on it from
    // now on (the exact path runs this call; the next one has another key).
    std::lock_guard<std::mutex> lock(scalar_mutex);
    plan.scalar_use.at(e.arg) = ScalarUse::Static;
    return nullptr;
  } catch (const std::exception& e) {
    if (std::getenv("TORCH_TPU_DEBUG_BOUNDED")) std::fprintf(stderr, "bounded %s: %s\n", key.c_str(), e.what());
    result = nullptr;  // the exact path runs it (and raises PyTorch's error, if any)
  }
  std::lock_guard<std::mutex> lock(mutex);
  return programs.emplace(key, result).first->second;
}

// cat along a bounded dim (a KV cache that grows by a token): the output's
// real size there is the sum of the inputs', padded to its own bucket. Each
// input is written at the running sum of the real sizes before it (a runtime
// offset), padding and all, into scratch room for every input's padded size;
// what an input's padding spills is overwritten by the next input or lies in
// the output's padding. A program per input buckets and output bucket.
// False when the call is no such cat (the general path decides).
bool bounded_cat(const OpPlan& plan, const std::vector<c10::IValue>& args, const BoundedCall& call,
                 torch::jit::Stack* stack) {
  if (plan.name != "aten::cat" || args.size() != 2 || !args[1].isInt() || call.list_reads[0].empty()) return false;
  const auto list = args[0].toTensorVector();
  const int64_t rank = list[0].dim();
  if (rank == 0) return false;
  const int64_t dim = args[1].toInt() < 0 ? args[1].toInt() + rank : args[1].toInt();
  // Per input: its padded shape and its parts (a plain input's are static).
  std::vector<std::vector<int64_t>> shapes;
  std::vector<PaddedDims> dims;
  bool grows = false;
  for (size_t e = 0; e < list.size(); ++e) {
    const at::Tensor& t = list[e];
    if (t.dim() != rank || t.scalar_type() != list[0].scalar_type() || t.device() != list[0].device() ||
        t.numel() == 0 || dim < 0 || dim >= rank)
      return false;
    if (const auto& read = call.list_reads[0][e]) {
      shapes.push_back(read->shape());
      dims.push_back(read->dims);
    } else {
      shapes.push_back(t.sizes().vec());
      auto& parts = dims.emplace_back();
      for (int64_t size : t.sizes()) parts.push_back({Part{size, 0}});
    }
    if (dims.back()[dim].size() != 1) return false;
    grows |= dims.back()[dim][0].bucket != 0;
  }
  if (!grows) return false;
  // The other dims alike: the same parts, or static in both (a view's
  // static dim may be split in parts, [2][1], where a plain tensor has one).
  auto is_static = [](const std::vector<Part>& parts) {
    return std::all_of(parts.begin(), parts.end(), [](const Part& p) { return p.bucket == 0 && p.real >= 0; });
  };
  for (size_t e = 1; e < list.size(); ++e)
    for (int64_t d = 0; d < rank; ++d) {
      if (d == dim) continue;
      const auto &a = dims[0][d], &b = dims[e][d];
      if (shapes[0][d] != shapes[e][d]) return false;
      if (is_static(a) && is_static(b)) continue;
      if (a.size() != b.size()) return false;
      for (size_t j = 0; j < a.size(); ++j)
        if (a[j].real != b[j].real || a[j].bucket != b[j].bucket) return false;
    }
  int64_t total = 0, room = 0;
  for (size_t e = 0; e < list.size(); ++e) {
    total += list[e].size(dim);
    room += shapes[e][dim];
  }
  const int64_t bucket = bucket_for(total, std::nullopt);
  room = std::max(room, bucket);
  const DType dtype = to_dtype(list[0].scalar_type());
  std::string key = "bounded_cat|" + stablehlo::mlir_name(dtype) + "|" + std::to_string(dim) + "|";
  for (size_t e = 0; e < list.size(); ++e) {
    key += "[" + dims_key(shapes[e]) + "]";
    if (const auto& read = call.list_reads[0][e])
      key += "P" + dims_key(read->stored) + "/" + dims_key(read->memory_dims);
    const Part& p = dims[e][dim][0];
    key += p.bucket ? "s" + std::to_string(call.symbol(p)) : "";
    key += ";";
  }
  key += "|" + std::to_string(bucket) + "#" + std::to_string(call.symbols.size());
  auto program = Runtime::get().program(key, [&] {
    Runtime::get().count("bucket_compiles");
    stablehlo::Builder b;
    std::vector<stablehlo::Value> xs;
    for (size_t e = 0; e < list.size(); ++e)
      xs.push_back(b.parameter(TensorType{dtype, {c10::multiply_integers(shapes[e])}}));
    auto sizes = b.parameter(TensorType{DType::Int32, {static_cast<int64_t>(call.symbols.size())}});
    for (size_t e = 0; e < list.size(); ++e) {
      const auto& read = call.list_reads[0][e];
      xs[e] = read ? padded_value(b, xs[e], *read) : b.reshape(xs[e], shapes[e]);
    }
    std::vector<int64_t> scratch_shape = shapes[0];
    scratch_shape[dim] = room;
    auto out = b.constant(0, TensorType{dtype, scratch_shape});
    const TensorType index{DType::Int32, {}};
    auto offset = b.constant_int(0, index);
    for (size_t e = 0; e < list.size(); ++e) {
      std::vector<stablehlo::Value> start(static_cast<size_t>(rank), b.constant_int(0, index));
      start[dim] = offset;
      out = b.dynamic_update_slice(out, xs[e], start);
      const Part& p = dims[e][dim][0];
      const int64_t k = p.bucket ? call.symbol(p) : -1;
      auto real = k >= 0 ? b.reshape(b.slice(sizes, {k}, {k + 1}, {1}), {}) : b.constant_int(p.real, index);
      offset = b.binary(stablehlo::Binary::Add, offset, real);
    }
    std::vector<int64_t> limit = scratch_shape;
    limit[dim] = bucket;
    out = b.reshape(b.slice(out, std::vector<int64_t>(rank, 0), limit, std::vector<int64_t>(rank, 1)),
                    {c10::multiply_integers(limit)});
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  const int dev = device_index(list[0]);
  std::vector<pjrt::BufferPtr> buffers;
  for (size_t e = 0; e < list.size(); ++e)
    buffers.push_back(call.list_reads[0][e] ? call.list_reads[0][e]->value : read_dense(list[e]));
  std::vector<int64_t> reals;
  for (const auto& s : call.symbols) reals.push_back(s.first);
  buffers.push_back(sizes_buffer(reals, {}, dev));
  auto results = Runtime::get().execute(program, buffers, dev, plan.name.c_str());
  PaddedDims out_dims = dims[0];
  out_dims[dim] = {Part{total, bucket > 1 ? bucket : 0}};
  Runtime::get().count("bounded_ops");
  torch::jit::drop(*stack, args.size());
  stack->push_back(wrap_padded(results[0], out_dims, list[0].scalar_type(), dev));
  return true;
}

// Whether a call over deferred tensors (a nonzero's count still on the
// device) can run without learning their sizes: a pointwise op over tensors
// of one deferred shape and single elements, or a reduction that is defined
// over no elements (a max of none raises on CPU, so it learns the count).
bool takes_deferred(const OpPlan& plan, const std::vector<c10::IValue>& args) {
  static const std::set<std::string> reductions{"aten::sum",  "aten::mean", "aten::nansum",
                                                "aten::prod", "aten::any",  "aten::all"};
  if (!plan.pointwise && !reductions.count(plan.name.substr(0, plan.name.find('.')))) return false;
  std::optional<PaddedRead> first;
  for (const auto& v : args) {
    if (v.isTensorList() || v.isOptionalTensorList()) return false;
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const at::Tensor& t = v.toTensor();
    if (!deferred(t)) {
      if (!plan.pointwise || t.numel() != 1) return false;
      continue;
    }
    auto read = padded_read(t);
    if (!read) return false;
    if (!first) {
      first = std::move(read);
      continue;
    }
    if (read->dims.size() != first->dims.size()) return false;
    for (size_t d = 0; d < read->dims.size(); ++d) {
      if (read->dims[d].size() != first->dims[d].size()) return false;
      for (size_t j = 0; j < read->dims[d].size(); ++j)
        if (read->dims[d][j].real != first->dims[d][j].real || read->dims[d][j].bucket != first->dims[d][j].bucket)
          return false;
    }
  }
  return true;
}

// A padded output's strides come from its memory order, found at probe
// sizes; they can differ from CPU's (lay_out_like_cpu at the real sizes) in
// size-1 dims, where TensorIterator places a dim by its stride
// (bitwise_not(x.unfold(0, 2, 3)[:1]) keeps the input's stride 6) and
// masked_fill is contiguous. Those take CPU's strides, which moves no
// element. Only where a layout is not row-major: batch-1 work pays nothing.
void cpu_strides_in_size_one_dims(at::Tensor& out, const OpPlan& plan, const std::vector<c10::IValue>& args) {
  // (is_contiguous() ignores size-1 dims' strides, which are the point here.)
  auto row_major = [](const at::Tensor& t) { return t.strides() == c10::contiguous_strides(t.sizes()); };
  const auto sizes = out.sizes();
  if (std::find(sizes.begin(), sizes.end(), 1) == sizes.end() ||
      (row_major(out) && std::all_of(args.begin(), args.end(), [&](const c10::IValue& a) {
         return !a.isTensor() || !a.toTensor().defined() || row_major(a.toTensor());
       })))
    return;
  std::vector<std::vector<int64_t>> strides{out.strides().vec()};
  lay_out_like_cpu(plan.name, plan.pointwise, plan.is_out, args, {{to_dtype(out.scalar_type()), sizes.vec()}}, strides);
  const std::vector<int64_t>& cpu = strides[0];
  if (at::IntArrayRef(cpu) == out.strides()) return;
  for (int64_t d = 0; d < out.dim(); ++d)
    if (out.size(d) != 1 && cpu[d] != out.stride(d)) return;
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes.vec(), cpu);
}

// Runs the op on its inputs' padded values when it can (see BoundedCall):
// true when it did. Otherwise the op takes the exact path, which reads padded
// tensors cut to their real sizes.
bool bounded_kernel(const c10::OperatorHandle& op, OpPlan& plan, const std::vector<c10::IValue>& original,
                    torch::jit::Stack* stack) {
  if (!padded_storages_exist()) return false;  // the per-op path of a program that never padded pays one load
  auto padded = [](const at::Tensor& t) { return t.defined() && t.device().type() == kTpu && is_padded(t); };
  bool any = false;
  for (const auto& v : original) {
    if (v.isTensor()) any |= padded(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) any |= padded(t);
    if (v.isOptionalTensorList())
      for (const auto& t : v.toOptionalTensorList()) {
        const std::optional<at::Tensor>& ot = t;
        any |= ot && padded(*ot);
      }
  }
  if (!any) return false;
  auto& runtime = Runtime::get();
  const size_t n = original.size();
  // Deferred tensors (in lists too: cat, stack) of a call that cannot take
  // them are learned first: a sync, then the ordinary padded path.
  std::vector<at::Tensor> deferred_args;
  for (const auto& v : original) {
    if (v.isTensor() && deferred(v.toTensor())) deferred_args.push_back(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector())
        if (deferred(t)) deferred_args.push_back(t);
    if (v.isOptionalTensorList())
      for (const auto& t : v.toOptionalTensorList()) {
        const std::optional<at::Tensor>& ot = t;
        if (ot && deferred(*ot)) deferred_args.push_back(*ot);
      }
  }
  const bool has_deferred = !deferred_args.empty();
  if (has_deferred && !takes_deferred(plan, original)) {
    runtime.count("deferred_size_reads::" + plan.name);
    for (const at::Tensor& t : deferred_args) (void)t.sizes();  // learned: a sync
    return bounded_kernel(op, plan, original, stack);
  }
  // A pointwise op broadcasts: a plain tensor expanded along a bounded dim
  // (the gradient of a sum) is read unexpanded there (size 1: no size in
  // the key), as long as the output keeps the shape PyTorch gives it.
  std::vector<c10::IValue> args(original);
  std::optional<std::vector<int64_t>> broadcast_shape;
  if (plan.pointwise && !has_deferred) {  // (takes_deferred checked a deferred call's shapes)
    std::vector<int64_t> shape;
    for (size_t i = 0; i < n; ++i) {
      auto& v = args[i];
      if (plan.is_out[i] || !v.isTensor() || !v.toTensor().defined()) continue;
      const at::Tensor t = v.toTensor();
      try {
        shape = at::infer_size(shape, t.sizes());
      } catch (const c10::Error&) {
        return false;  // the exact path raises PyTorch's error
      }
      if (t.device().type() != kTpu || padded(t)) continue;
      std::vector<int64_t> sizes = t.sizes().vec();
      bool expanded = false;
      for (int64_t d = 0; d < t.dim(); ++d)
        if (t.stride(d) == 0 && sizes[d] > 1) {
          sizes[d] = 1;
          expanded = true;
        }
      if (expanded) v = t.as_strided(sizes, t.strides(), t.storage_offset());
    }
    broadcast_shape = shape;
  }
  // Which write the op makes: none (functional), or self's value, returned as
  // its only result (x.add_(y), x.index_copy_(...)). Everything else reads exact.
  const bool plain_writes = plan.mutated.empty() && plan.overwritten < 0 && !plan.returns_list;
  const bool functional = !plan.functional && plain_writes &&
                          std::all_of(plan.return_alias.begin(), plan.return_alias.end(), [](int a) { return a < 0; });
  const bool writes_self = plan.functional && plain_writes && !plan.writes_from_functional &&
                           plan.return_alias.size() == 1 && plan.return_alias[0] == 0 && !plan.is_out[0] &&
                           args[0].isTensor() && args[0].toTensor().device().type() == kTpu;
  // x.add_(y) on a padded x: the functional op's padded result becomes x's
  // value, when x is its storage in row-major order and keeps its parts.
  const bool in_place = writes_self && padded(args[0].toTensor());
  // x.index_copy_(dim, padded index, padded source) on a plain x (a static KV
  // cache written at a padded cache_position): the functional op's result is
  // plain, x's shape, and is written into x.
  const bool into_plain = writes_self && !plan.pointwise && !padded(args[0].toTensor());
  // x.sub_(x[1]) raises as CPU does (not over deferred sizes, which it would learn: a sync).
  if ((in_place || into_plain) && !has_deferred) check_writes(plan, args, {});
  const std::string& rule_op = plan.functional ? full_name(plan.functional->operator_name()) : plan.name;
  BoundedCall call;
  call.reads.resize(n);
  call.list_reads.resize(n);
  bool readable = (functional || in_place || into_plain) && (plan.pointwise || lowering::find_bounded_rule(rule_op));
  auto read_padded = [&](const at::Tensor& t) -> std::shared_ptr<const PaddedRead> {
    auto read = padded_read(t);
    readable = read.has_value();
    if (!readable) return nullptr;
    auto shared = std::make_shared<const PaddedRead>(std::move(*read));
    call.add_symbols(*shared);
    return shared;
  };
  for (size_t i = 0; i < n && readable; ++i) {
    readable = !args[i].isOptionalTensorList();
    if (readable && args[i].isTensorList()) {
      const auto list = args[i].toTensorVector();
      if (std::none_of(list.begin(), list.end(), padded)) continue;
      for (size_t e = 0; e < list.size() && readable; ++e)
        call.list_reads[i].push_back(padded(list[e]) ? read_padded(list[e]) : nullptr);
    } else if (readable && args[i].isTensor() && padded(args[i].toTensor())) {
      call.reads[i] = read_padded(args[i].toTensor());
    }
    readable = readable && call.symbols.size() <= kMaxSymbols;
  }
  if (!readable) {
    runtime.count("bounded_exact::" + plan.name);
    return false;
  }
  if (bounded_cat(plan, args, call, stack)) return true;

  std::string key = "bounded|" + plan.name + "|";
  std::vector<Input> inputs;
  std::optional<c10::Device> device;
  std::vector<bool> dynamic(n, false);
  // A padded tensor's part of the key: its padded shape, memory order and parts.
  auto describe_padded = [&](const at::Tensor& t, const std::shared_ptr<const PaddedRead>& read) {
    if (device && *device != t.device()) device_mismatch(plan.name, *device, t.device());
    device = t.device();
    key += "P" + stablehlo::mlir_name(to_dtype(t.scalar_type())) + "[" + dims_key(read->stored) + "/" +
           dims_key(read->memory_dims) + "]{";
    for (const auto& parts : read->dims) {
      for (const Part& p : parts) {
        if (p.bucket) {
          key += 's';
          key += std::to_string(call.symbol(p));
          key += '/';
          key += std::to_string(p.bucket);
        } else {
          key += std::to_string(p.real);
        }
        key += '*';
      }
      key += ",";
    }
    key += "};";
    inputs.push_back({at::empty(read->shape(), t.options().device(at::kMeta)), false, false, read});
  };
  for (size_t i = 0; i < n; ++i) {
    dynamic[i] = scalar_use(plan, i, args[i]) == ScalarUse::Dynamic;
    if (dynamic[i]) {
      describe_dynamic(args[i], key, inputs);
    } else if (call.reads[i]) {
      describe_padded(args[i].toTensor(), call.reads[i]);
    } else if (!call.list_reads[i].empty()) {
      key += "L";
      const auto list = args[i].toTensorVector();
      for (size_t e = 0; e < list.size(); ++e)
        if (call.list_reads[i][e])
          describe_padded(list[e], call.list_reads[i][e]);
        else
          describe(list[e], false, plan.name, key, inputs, device);
      key += ";";
    } else {
      describe(args[i], plan.is_out[i], plan.name, key, inputs, device);
    }
  }
  key += "#" + std::to_string(call.symbols.size());
  // As lowered_kernel: a dynamic Scalar the dtype may not hold meets CPU's checks.
  if (needs_value_check(args, dynamic)) check_like_cpu(op, args, plan.pointwise);
  narrow_double_scalars(args, inputs);
  inputs.push_back(
      {at::empty({static_cast<int64_t>(call.symbols.size())}, at::kInt), true, false, nullptr});  // the real sizes

  if (in_place) {  // self's value is its storage's, in row-major order
    const auto& order = call.reads[0]->memory_dims;
    if (!call.reads[0]->whole || !std::is_sorted(order.begin(), order.end())) {
      runtime.count("bounded_exact::" + plan.name);
      return false;
    }
  }
  auto bounded = bounded_program(key, op, plan, args, inputs, dynamic, call);
  if (bounded && in_place && (bounded->outputs.size() != 1 || [&] {
        // Per dim, its parts (bounded?, padded size) other than static size-1 ones.
        using Parts = std::vector<std::pair<bool, int64_t>>;
        const auto& dims = call.reads[0]->dims;
        if (bounded->outputs[0].size() != dims.size()) return true;
        for (size_t d = 0; d < dims.size(); ++d) {
          Parts out, self;
          for (const auto& [symbol, padded_size] : bounded->outputs[0][d])
            if (symbol >= 0 || padded_size != 1) out.emplace_back(symbol >= 0, padded_size);
          for (const Part& p : dims[d])
            if (p.bucket != 0 || p.padded() != 1) self.emplace_back(p.bucket != 0, p.padded());
          if (out != self) return true;
        }
        return false;
      }()))
    bounded = nullptr;  // the result is not laid out as x is
  if (bounded && into_plain &&
      (bounded->outputs.size() != 1 ||
       std::any_of(bounded->outputs[0].begin(), bounded->outputs[0].end(), [](const auto& parts) {
         return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.first >= 0; });
       })))
    bounded = nullptr;  // the result is padded: not x's value
  if (!bounded) {
    runtime.count("bounded_exact::" + plan.name);
    return false;
  }
  const int dev = device->index() < 0 ? 0 : device->index();
  std::vector<pjrt::BufferPtr> buffers;
  for (size_t i = 0; i + 1 < inputs.size(); ++i) {
    const Input& in = inputs[i];
    buffers.push_back(in.padded    ? in.padded->value
                      : in.on_host ? upload(in.tensor.contiguous(), dev)
                                   : read_dense(in.tensor));
  }
  std::vector<int64_t> reals;
  for (const auto& s : call.symbols) reals.push_back(s.first);
  std::vector<std::shared_ptr<runtime::DeviceSize>> unknown;
  for (const auto& read : call.reads)
    if (read) unknown.insert(unknown.end(), read->unknown.begin(), read->unknown.end());
  buffers.push_back(sizes_buffer(reals, unknown, dev));
  if (broadcast_shape && bounded->outputs.size() == 1) {  // the unexpanded inputs did not shrink it
    std::vector<int64_t> sizes;
    for (const auto& parts : bounded->outputs[0]) {
      int64_t size = 1;
      for (const auto& [symbol, padded_size] : parts) size *= symbol >= 0 ? call.symbols[symbol].first : padded_size;
      sizes.push_back(size);
    }
    if (sizes != *broadcast_shape) {
      runtime.count("bounded_exact::" + plan.name);
      return false;
    }
  }
  auto results = launch(bounded->program, buffers, dev, plan, inputs);
  take_checks(*bounded->program, results);
  if (into_plain) {
    const at::Tensor& self = args[0].toTensor();
    write_dense(self, results[0]);
    runtime.count("bounded_ops");
    torch::jit::drop(*stack, n);
    stack->push_back(self);
    return true;
  }
  if (in_place) {
    const at::Tensor& self = args[0].toTensor();
    DeviceStorage& s = storage_of(self);
    runtime.replaced(results[0], s.value);
    s.value = std::move(results[0]);
    runtime.count("bounded_ops");
    torch::jit::drop(*stack, n);
    stack->push_back(self);
    return true;
  }
  std::vector<at::Tensor> outputs;
  for (size_t k = 0; k < results.size(); ++k) {
    const auto dtype = to_scalar_type(bounded->program->outputs[k].dtype);
    PaddedDims dims;
    bool any_bounded = false;
    std::vector<int64_t> sizes;
    for (const auto& parts : bounded->outputs[k]) {
      auto& out = dims.emplace_back();
      int64_t size = 1;
      for (const auto& [symbol, padded_size] : parts) {
        out.push_back(symbol >= 0 ? Part{call.symbols[symbol].first, call.symbols[symbol].second}
                                  : Part{padded_size, 0});
        size *= out.back().real;
        any_bounded |= symbol >= 0;
      }
      sizes.push_back(size);
    }
    const auto& order = bounded->orders[k];
    if (!any_bounded) {
      outputs.push_back(wrap_buffer(results[k], sizes, dtype, dev, layout_of(*bounded->program, k)));
    } else if (order.empty()) {
      outputs.push_back(wrap_padded(results[k], dims, dtype, dev, unknown));
    } else {  // stored in memory order, seen permuted back
      PaddedDims stored;
      std::vector<int64_t> back(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        stored.push_back(dims[static_cast<size_t>(order[i])]);
        back[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
      }
      outputs.push_back(wrap_padded(results[k], stored, dtype, dev, unknown).permute(back));
    }
    // A static output's layout was built for the padded arguments: size-1 dims take the real ones'.
    if (!has_deferred) cpu_strides_in_size_one_dims(outputs.back(), plan, args);
  }
  if (runtime.mode() == runtime::EagerMode::Debug && runtime.check_nan()) {
    std::vector<TensorType> types;
    std::vector<pjrt::BufferPtr> real;
    for (const at::Tensor& t : outputs) {
      types.push_back({to_dtype(t.scalar_type()), t.sizes().vec()});
      real.push_back(read_dense(t));
    }
    check_finite(plan.name, inputs, types, real, dev);
  }
  runtime.count("bounded_ops");
  torch::jit::drop(*stack, n);
  for (auto& t : outputs) stack->push_back(std::move(t));
  return true;
}

void lowered_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The general kernel's phases, in order: prepare the arguments, describe the
// call (its program key and inputs), the program (cached or built), launch,
// bind the results to the op's returns and written arguments.

// Arguments as the rules see them: index lists made explicit, generators and
// math views resolved. True when a path of its own (a masked fill, a deferred
// mask index, a padded factory, a bounded op) already ran the op.
bool prepare_arguments(const c10::OperatorHandle& op, OpPlan& plan, std::vector<c10::IValue>& args,
                       torch::jit::Stack* stack) {
  optional_tensor_lists(op.schema(), args, stack);
  uint8_all_any(plan, args, stack);
  check_index_dtypes(args);
  if (index_put_as_masked_fill(plan, args, stack)) return true;
  if (plan.index_put && deferred_mask_put(plan.name, args, stack)) return true;
  if (plan.index && args[1].isOptionalTensorList())
    if (auto result = deferred_mask_index(args[0].toTensor(), args[1].toOptionalTensorList())) {
      torch::jit::drop(*stack, args.size());
      stack->push_back(std::move(*result));
      return true;
    }
  expand_index_masks(args, stack);
  check_index_shapes(plan, args);
  resolve_generators(op.schema(), args);
  decline_complex(plan, args);
  resolve_math_views(plan, args);
  // CPU reduces in the out= tensor's dtype when none is given (it casts the
  // input first): an int64 sum into a float32 out= adds float32 values.
  if (plan.dtype_from_out >= 0 && args[plan.dtype_from_out].isNone() && args[plan.out_index].isTensor())
    args[plan.dtype_from_out] = args[plan.out_index].toTensor().scalar_type();
  return padded_factory(plan.factory, args, stack) || bounded_kernel(op, plan, args, stack);
}

// What the program cache is asked for: the key (op, input dtypes and shapes,
// static arguments), the program's inputs in order, the device, and which
// Scalars are runtime inputs.
struct CallDescription {
  std::string key;
  std::vector<Input> inputs;
  std::optional<c10::Device> device;
  std::vector<bool> dynamic;
  int device_index() const { return device->index() < 0 ? 0 : device->index(); }
};

CallDescription describe_call(OpPlan& plan, std::vector<c10::IValue>& args) {
  const size_t n = args.size();
  CallDescription call;
  call.key.reserve(128);
  call.key += plan.name;
  call.key += '|';
  call.dynamic.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    call.dynamic[i] = scalar_use(plan, i, args[i]) == ScalarUse::Dynamic;
    if (call.dynamic[i])
      describe_dynamic(args[i], call.key, call.inputs);
    else
      describe(args[i], plan.is_out[i], plan.name, call.key, call.inputs, call.device);
  }
  if (plan.overwritten >= 0) {
    call.key += '[';
    append_dims(call.key, args[plan.overwritten].toTensor().sizes());
    call.key += ']';
  }
  TORCH_CHECK(call.device, "torch_tpu: ", plan.name, " was dispatched to tpu without a tpu tensor argument");
  narrow_double_scalars(args, call.inputs);
  return call;
}

// The arguments the op writes: the dtypes of those it returns (they decide
// the program's output types) and those it does not return, lists flattened.
struct Writes {
  std::vector<at::ScalarType> dest_dtypes;
  std::vector<at::Tensor> mutated;
};

Writes writes_of(const OpPlan& plan, const std::vector<c10::IValue>& args) {
  Writes w;
  for (int alias : plan.return_alias)
    if (alias >= 0) w.dest_dtypes.push_back(args[alias].toTensor().scalar_type());
  for (int i : plan.mutated) {
    if (args[i].isTensor() && args[i].toTensor().defined()) w.mutated.push_back(args[i].toTensor());
    if (args[i].isTensorList())
      for (const at::Tensor& t : args[i].toTensorVector()) w.mutated.push_back(t);
  }
  return w;
}

// One program reads every element of a written list before any is written;
// elements that share a storage need the per-tensor order: then the op runs
// one element at a time (true).
bool run_overlapping_writes_in_order(const c10::OperatorHandle& op, const OpPlan& plan,
                                     const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& mutated,
                                     torch::jit::Stack* stack) {
  if (!plan.writes_from_functional || mutated.size() < 2) return false;
  std::vector<const void*> storages;
  for (const at::Tensor& t : mutated) storages.push_back(t.storage().unsafeGetStorageImpl());
  std::sort(storages.begin(), storages.end());
  if (std::adjacent_find(storages.begin(), storages.end()) == storages.end()) return false;
  for (size_t k = 0; k < mutated.size(); ++k) {
    torch::jit::Stack one;
    for (const auto& v : args) {
      if (v.isTensorList()) {
        one.push_back(std::vector<at::Tensor>{v.toTensorVector().at(k)});
      } else if (v.isList() && v.toListRef().size() == mutated.size()) {
        c10::impl::GenericList element(v.toList().elementType());
        element.push_back(v.toListRef()[k]);
        one.push_back(std::move(element));
      } else {
        one.push_back(v);
      }
    }
    lowered_kernel(op, &one);
  }
  torch::jit::drop(*stack, args.size());
  return true;
}

// The program for this call, built on the first call of its key. Null when
// the rule asked for a Scalar's value at compile time: that Scalar is part of
// the key from now on, and the caller describes the call again.
runtime::ProgramPtr program_for(const c10::OperatorHandle& op, OpPlan& plan, const std::vector<c10::IValue>& args,
                                const CallDescription& call, const Writes& writes) {
  try {
    return Runtime::get().program(call.key, [&] {
      return build_program(op, plan, args, call.inputs, call.dynamic, writes.mutated, writes.dest_dtypes);
    });
  } catch (const lowering::NeedsStaticScalar& e) {
    std::lock_guard<std::mutex> lock(scalar_mutex);
    plan.scalar_use.at(e.arg) = ScalarUse::Static;
    return nullptr;
  }
}

// A host value on the device (Input::by_value). The same values come back at
// every step (a learning rate, 1 - beta1): each is uploaded once and kept by
// value, not uploaded at every op (an upload costs several times an op's
// dispatch).
pjrt::BufferPtr host_value(const at::Tensor& value, int device) {
  static std::mutex mutex;
  static auto& cache = *new std::unordered_map<std::string, pjrt::BufferPtr>;  // kept past exit, as the client
  if (value.numel() > 64) return upload(value.contiguous(), device);
  const at::Tensor v = value.contiguous();
  std::string key(static_cast<const char*>(v.data_ptr()), v.nbytes());
  key += static_cast<char>(v.scalar_type());
  key += std::to_string(device) + "|" + std::to_string(v.numel());
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 4096) cache.clear();  // values that keep changing (a step count) do not pile up
  pjrt::BufferPtr buffer = upload(v, device);
  buffer->set_shared();
  return cache.emplace(std::move(key), std::move(buffer)).first->second;
}

// The input buffers (host Scalars uploaded, views read through their
// storage), the launch, and the program's device checks taken off its outputs.
std::vector<pjrt::BufferPtr> launch_call(const runtime::ProgramPtr& program, const OpPlan& plan,
                                         const CallDescription& call) {
  const int dev = call.device_index();
  std::vector<pjrt::BufferPtr> buffers;
  buffers.reserve(call.inputs.size());
  auto unread = program->unread_inputs.begin();
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    if (unread != program->unread_inputs.end() && *unread == i) {
      ++unread;
      continue;
    }
    const Input& in = call.inputs[i];
    buffers.push_back(in.by_value  ? host_value(in.tensor, dev)
                      : in.on_host ? upload(in.tensor.contiguous(), dev)
                                   : read_dense(in.tensor));
  }
  std::vector<pjrt::BufferPtr> results = launch(program, buffers, dev, plan, call.inputs);
  take_checks(*program, results);
  auto& runtime = Runtime::get();
  if (runtime.mode() == runtime::EagerMode::Debug && runtime.check_nan())
    check_finite(plan.name, call.inputs, program->outputs, results, dev);
  return results;
}

// The results become the op's returns (new tensors, or the out=/in-place
// destination they alias) and the new values of the arguments it writes.
void bind_results(const OpPlan& plan, const std::vector<c10::IValue>& args, const runtime::Program& program,
                  std::vector<pjrt::BufferPtr>& results, const std::vector<at::Tensor>& mutated, int dev,
                  torch::jit::Stack* stack) {
  const size_t n_returns = results.size() - mutated.size();
  for (size_t j = 0; j < mutated.size(); ++j) write_dense(mutated[j], results[n_returns + j]);
  auto wrap = [&](size_t k) {
    const TensorType& type = program.outputs[k];
    return wrap_buffer(results[k], type.shape, to_scalar_type(type.dtype), dev, layout_of(program, k));
  };
  if (plan.returns_list) {
    std::vector<at::Tensor> list;
    for (size_t k = 0; k < n_returns; ++k) list.push_back(wrap(k));
    stack->push_back(std::move(list));
    return;
  }
  for (size_t k = 0; k < n_returns; ++k) {
    const TensorType& type = program.outputs[k];
    int alias = k < plan.return_alias.size() ? plan.return_alias[k] : -1;
    if (is_undefined_output(type)) {
      stack->push_back(at::Tensor());
    } else if (alias < 0) {
      stack->push_back(wrap(k));
    } else {
      const at::Tensor& dst = args[alias].toTensor();
      if (plan.is_out[alias] && dst.sizes() != at::IntArrayRef(type.shape)) {
        dst.resize_(type.shape);  // then laid out as TensorIterator lays out a resized output
        if (auto layout = layout_of(program, k); !layout.empty())
          dst.unsafeGetTensorImpl()->set_sizes_and_strides(type.shape, layout);
      }
      write_dense(dst, results[k]);
      stack->push_back(dst);
    }
  }
}

void lowered_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpPlan& plan = plan_for(op);
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  if (prepare_arguments(op, plan, args, stack)) return;
  const CallDescription call = describe_call(plan, args);
  const Writes writes = writes_of(plan, args);
  if (run_overlapping_writes_in_order(op, plan, args, writes.mutated, stack)) return;
  // CPU's cat checks dtypes (its meta kernel) before overlaps; TensorIterator the other way round.
  const bool meta_first = plan.overlap == OverlapRule::Cat;
  if (!meta_first) check_writes(plan, args, writes.mutated);
  if (needs_value_check(args, call.dynamic)) check_like_cpu(op, args, plan.pointwise);
  const runtime::ProgramPtr program = program_for(op, plan, args, call, writes);
  if (!program) return lowered_kernel(op, stack);
  if (meta_first) check_writes(plan, args, writes.mutated);
  if (plan.pointwise) check_written_shapes(plan, args, program->outputs);
  std::vector<pjrt::BufferPtr> results = launch_call(program, plan, call);
  torch::jit::drop(*stack, n);
  bind_results(plan, args, *program, results, writes.mutated, call.device_index(), stack);
}

// The op's tensor inputs as "(float32[2, 3], int64[4])", for error messages.
std::string describe_inputs(const std::vector<Input>& inputs) {
  std::string s = "(";
  for (size_t i = 0; i < inputs.size(); ++i)
    s += (i ? ", " : "") + std::string(c10::getDtypeNames(inputs[i].tensor.scalar_type()).first) + "[" +
         dims_key(inputs[i].tensor.sizes()) + "]" + (inputs[i].on_host ? " on cpu" : "");
  return s + ")";
}

// Debug mode's NaN/Inf check: one all(is_finite) program per float output.
void check_finite(const std::string& op, const std::vector<Input>& inputs, const std::vector<TensorType>& types,
                  const std::vector<pjrt::BufferPtr>& results, int dev) {
  for (size_t k = 0; k < results.size(); ++k) {
    if (!stablehlo::is_float(types[k].dtype) || types[k].numel() == 0) continue;
    TensorType flat{types[k].dtype, {types[k].numel()}};
    auto program = Runtime::get().program("finite|" + flat.str(), [&] {
      stablehlo::Builder b;
      auto x = b.parameter(flat);
      auto all = b.reduce(b.unary(stablehlo::Unary::IsFinite, x), b.scalar(1, stablehlo::DType::Bool), {0},
                          stablehlo::Binary::And);
      return std::make_pair(b.module({all}), std::vector<TensorType>{all.type});
    });
    bool finite = false;
    auto out = Runtime::get().execute(program, {results[k]}, dev, "NaN check");
    Runtime::get().download(*out[0], &finite, 1);
    TORCH_CHECK(finite, "torch_tpu: ", op, " produced NaN or Inf in output ", k, " (", types[k].str(), ") from inputs ",
                describe_inputs(inputs), ". (TORCH_TPU_DEBUG_CHECK_NAN=1 in debug mode)");
  }
}

// A rule that declines (lowering::Declined) does so while the program is
// built, before the stack is touched: the op then runs on the CPU fallback.
void general_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  try {
    lowered_kernel(op, stack);
  } catch (const lowering::Declined& e) {
    run_cpu_fallback(op, stack, std::string(" for this use (") + e.what() + ")");
  }
}

}  // namespace

void register_general_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  register_missing_meta_kernels();
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;  // an explicit kernel wins
    if (!lowering::find_rule(full_name(name)) && !functional_counterpart(op->schema())) continue;
    // out= lists (_foreach_add.List_out) exist for functionalization; no write-back for them yet.
    const auto& schema_args = op->schema().arguments();
    if (std::any_of(schema_args.begin(), schema_args.end(),
                    [](const c10::Argument& x) { return x.is_out() && x.type()->kind() == c10::TypeKind::ListType; }))
      continue;
    std::string overload = full_name(name).substr(6);  // without "aten::"
    library->impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&general_kernel>());
  }
}

void register_general_kernel(const std::string& op) {
  const size_t dot = op.find('.'), colons = op.find("::");
  const std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findOp({name, overload});
  TORCH_CHECK(handle, "torch_tpu: no op ", op, " to register a tpu kernel for");
  if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return;
  // One library per namespace, kept for the process (PyTorch unregisters a library it destroys).
  static std::map<std::string, std::unique_ptr<torch::Library>> libraries;
  const std::string ns = op.substr(0, colons);
  auto& library = libraries[ns];
  if (!library)
    library =
        std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl(op.substr(colons + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&general_kernel>());
}

}  // namespace torch_tpu::aten
