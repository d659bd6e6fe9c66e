#include "aten/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;
constexpr size_t kStateBytes = 2 * sizeof(uint64_t);

// SplitMix64's finalizer: a bijection whose every output bit depends on every
// input bit, so nearby (seed, offset) pairs give unrelated keys.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  if (device < 0) device = c10::impl::getDeviceGuardImpl(kTpu)->getDevice().index();
  const auto count = static_cast<c10::DeviceIndex>(runtime::Runtime::get().device_count());
  TORCH_CHECK(device >= 0 && device < count, "torch_tpu: no tpu device ", static_cast<int>(device), "; there are ",
              static_cast<int>(count));
  return device;
}

bool is_generator_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

}  // namespace

TpuGeneratorImpl::TpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kTpu, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)), seed_(seed) {}

void TpuGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
void TpuGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t TpuGeneratorImpl::get_offset() const { return offset_; }
uint64_t TpuGeneratorImpl::current_seed() const { return seed_; }

uint64_t TpuGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom();
  set_current_seed(s);
  return s;
}

c10::intrusive_ptr<c10::TensorImpl> TpuGeneratorImpl::get_state() const {
  auto state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte, std::nullopt, std::nullopt,
                                     std::nullopt, std::nullopt);
  uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

void TpuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  TORCH_CHECK(new_state.numel() == static_cast<int64_t>(kStateBytes), "torch_tpu: a tpu RNG state is ", kStateBytes,
              " bytes (seed and offset), got ", new_state.numel(), " bytes; use the state of a tpu generator");
  uint64_t words[2];
  std::memcpy(words, new_state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

uint64_t TpuGeneratorImpl::next_key() {
  runtime::Runtime::get().count("random_keys");  // metrics(): how many random draws ran
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t offset = offset_++;
  return mix64(mix64(seed_) + offset * 0x9E3779B97F4A7C15ULL);
}

TpuGeneratorImpl* TpuGeneratorImpl::clone_impl() const {
  auto* copy = new TpuGeneratorImpl(device_.index(), seed_);
  copy->offset_ = offset_;
  return copy;
}

namespace {
std::mutex pending_mutex;
std::optional<uint64_t> pending_seed;  // from manual_seed_all before the generators exist
std::atomic<bool> generators_made{false};
}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    const int count = runtime::Runtime::get().device_count();
    std::lock_guard<std::mutex> lock(pending_mutex);
    for (int i = 0; i < count; ++i)
      generators.push_back(at::make_generator<TpuGeneratorImpl>(static_cast<c10::DeviceIndex>(i),
                                                                pending_seed.value_or(c10::default_rng_seed_val)));
    generators_made = true;
  });
  return generators[resolve(device)];
}

void manual_seed_all(uint64_t seed) {
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!generators_made && !runtime::Runtime::initialized()) {
      pending_seed = seed;
      return;
    }
  }
  const int count = runtime::Runtime::get().device_count();
  for (int i = 0; i < count; ++i) {
    at::Generator g = default_generator(static_cast<c10::DeviceIndex>(i));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  }
}

at::Generator new_generator(c10::DeviceIndex device) { return at::make_generator<TpuGeneratorImpl>(resolve(device)); }

at::Tensor next_key_tensor(const at::Generator& gen, const std::string& op) {
  TORCH_CHECK(gen.defined() && gen.device().type() == kTpu, op, ": expected a tpu generator for tpu tensors, got ",
              gen.defined() ? c10::str("a ", gen.device().type(), " generator") : std::string("an undefined one"),
              "; make one with torch.Generator(device=\"tpu\")");
  const uint64_t key = gen.get<TpuGeneratorImpl>()->next_key();
  auto t = at::detail::empty_cpu({}, at::kLong, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  std::memcpy(t.data_ptr(), &key, sizeof key);
  return t;
}

void resolve_generators(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args) {
  const auto& params = schema.arguments();
  std::optional<size_t> slot;
  for (size_t i = 0; i < params.size() && i < args.size(); ++i)
    if (args[i].isNone() && is_generator_type(params[i].type())) slot = i;
  if (!slot) return;
  std::optional<c10::Device> device;
  for (const auto& a : args) {
    if (device) break;
    if (a.isTensor() && a.toTensor().defined() && a.toTensor().device().type() == kTpu) device = a.toTensor().device();
  }
  args[*slot] = default_generator(device ? device->index() : -1);
}

void generators_to_cpu(torch::jit::Stack* stack, size_t num_arguments) {
  for (size_t i = stack->size() - num_arguments; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isGenerator() || v.toGenerator().device().type() != kTpu) continue;
    const uint64_t key = v.toGenerator().get<TpuGeneratorImpl>()->next_key();
    v = at::make_generator<at::CPUGeneratorImpl>(key);
  }
}

}  // namespace torch_tpu::aten
