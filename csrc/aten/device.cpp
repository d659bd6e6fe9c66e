// The "tpu" device as PyTorch sees it: a device guard, an allocator whose
// DataPtrs are DeviceStorage objects, and the PrivateUse1 hooks.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "aten/generator.h"
#include "aten/tensor_access.h"

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;

constexpr auto kTpu = c10::DeviceType::PrivateUse1;
thread_local c10::DeviceIndex current_device = 0;

c10::DeviceIndex count_devices() noexcept {
  try {
    return static_cast<c10::DeviceIndex>(Runtime::get().device_count());
  } catch (...) {
    return 0;  // no plugin: no devices (the error surfaces when a tensor is made)
  }
}

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kTpu, current_device}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "torch_tpu: expected a tpu device, got ", d);
    if (d.has_index()) current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return count_devices(); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

void delete_storage(void* ptr) {
  auto* s = static_cast<DeviceStorage*>(ptr);
  if (Runtime::initialized()) Runtime::get().free(s->device, static_cast<int64_t>(s->nbytes));
  delete s;
}

struct TpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    try {
      Runtime::get().allocate(current_device, static_cast<int64_t>(nbytes));
    } catch (const runtime::OutOfMemory& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    auto* s = new DeviceStorage();
    s->nbytes = nbytes;
    s->device = current_device;
    return {s, s, &delete_storage, c10::Device(kTpu, current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_storage; }
  // Storage values are immutable buffers, so a copy shares the value.
  void copy_data(void* dst, const void* src, std::size_t) const override {
    auto* d = static_cast<DeviceStorage*>(dst);
    const auto* s = static_cast<const DeviceStorage*>(src);
    d->value = s->value;
    d->dtype = s->dtype;
  }
};

TpuAllocator allocator;
REGISTER_ALLOCATOR(kTpu, &allocator);

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count_devices() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  // Host staging memory for non_blocking copies: plain CPU memory (PJRT copies from any host pointer).
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  return true;
}();

}  // namespace
}  // namespace torch_tpu::aten
