// The tpu random number generator: PyTorch's Generator for PrivateUse1, one
// default per device. Its state is (seed, offset). Every random op takes a
// fresh 64-bit key, a strong mix of (seed, offset), and advances the offset
// by one; the op's program reads that key as an input (a 0-d int64 uploaded
// per call), so one compiled program serves every call of the same shapes and
// keys of different calls never share a stream.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/stack.h>
#include <c10/core/GeneratorImpl.h>

#include <vector>

namespace torch_tpu::aten {

class TpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;  // also resets the offset, as CUDA's does
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;  // a nondeterministic seed
  // The state as a CPU uint8 tensor of 16 bytes: seed and offset, little-endian uint64s.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The key of the next random op; advances the offset. Thread-safe.
  uint64_t next_key();

 private:
  TpuGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of tpu device `device` (-1: the current device).
const at::Generator& default_generator(c10::DeviceIndex device = -1);
at::Generator new_generator(c10::DeviceIndex device = -1);
// Seeds every device's default generator; before the runtime starts, the
// seed waits until they are made (torch.manual_seed must not load a plugin).
void manual_seed_all(uint64_t seed);

// The key of one random op from the tpu generator `gen`, as a 0-d int64 CPU
// tensor (the program's input); advances the generator. Raises for a
// generator of another device type.
at::Tensor next_key_tensor(const at::Generator& gen, const std::string& op);

// A random op's arguments for the general kernel: a `Generator?` argument left
// None becomes the default generator of the op's tpu device, so that every
// random op reads exactly one key. No-op for ops without a generator argument.
void resolve_generators(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args);

// For the CPU fallback of a random op that has no rule: a tpu generator
// argument becomes a CPU generator seeded from its next key, so the CPU
// kernel accepts it and the numbers still follow the tpu generator's seed.
void generators_to_cpu(torch::jit::Stack* stack, size_t num_arguments);

}  // namespace torch_tpu::aten
