// The "tpu" device as PyTorch sees it: a device guard with streams and
// events, an allocator whose DataPtrs are DeviceStorage objects, and the
// PrivateUse1 hooks.
//
// Streams and events are honest about PJRT: it orders work by the buffers an
// execution reads, not by queues, so every stream of a device is the same
// ordered flow (a stream id is a name PyTorch can pass around; waiting on an
// event orders nothing more). An event is the work launched on its device
// before it was recorded, non_blocking copies to pinned host memory included:
// it completes when that is all computed and copied, and its synchronize()
// raises a failed device check of that work.
// GCC warns that the header's cache-line constant may differ between compilers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winterference-size"
#endif
#include <ATen/core/CachingHostAllocator.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "aten/bounded.h"
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

// Per thread, per device: the current stream's id (0: the default stream).
constexpr int kMaxDevices = 64;
thread_local std::array<c10::StreamId, kMaxDevices> current_stream{};
std::atomic<c10::StreamId> next_stream_id{1};

void check_device(c10::DeviceIndex index) {
  // Runtime::get() raises what stops it (no plugin, a forked child) before any range error.
  const auto n = static_cast<c10::DeviceIndex>(Runtime::get().device_count());
  TORCH_CHECK_INDEX(index >= 0 && index < n && index < kMaxDevices, "torch_tpu: device index ", index,
                    " is out of range: there are ", n,
                    " tpu devices (TORCH_TPU_NUM_DEVICES sets how many the CPU "
                    "plugin makes)");
}

struct TpuEvent {
  c10::DeviceIndex device = 0;
  std::shared_ptr<Runtime::Launched> work;  // launched (and copies started) before the record
  bool timing = false;
  std::chrono::steady_clock::time_point done;  // timing events: when the work was complete
};

// Waits for an event's work; a failed check of it raises as the op would (IndexError or RuntimeError).
void await_work(const std::shared_ptr<Runtime::Launched>& work) {
  try {
    Runtime::get().await(work);
  } catch (const runtime::DeviceCheckFailed& e) {
    raise_check(e.what(), " (reported at an event's synchronize: ops run asynchronously)");
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
    if (!d.has_index()) return;
    check_device(d.index());
    current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) current_device = d.index();
  }
  c10::DeviceIndex deviceCount() const noexcept override { return count_devices(); }

  // ---- streams
  static c10::Stream stream(c10::DeviceIndex device, c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, device), id);
  }
  static c10::DeviceIndex index(c10::Device d) { return d.has_index() ? d.index() : current_device; }
  c10::Stream getStream(c10::Device d) const noexcept override {
    const c10::DeviceIndex i = index(d);
    return stream(i, i >= 0 && i < kMaxDevices ? current_stream[i] : 0);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream(index(d), 0); }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return stream(index(d), next_stream_id.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return stream(index(d), next_stream_id.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::DeviceIndex i = s.device_index();
    if (i < 0 || i >= kMaxDevices) return s;
    c10::Stream old = stream(i, current_stream[i]);
    current_stream[i] = s.id();
    return old;
  }
  bool queryStream(const c10::Stream& s) const override {
    return Runtime::get().ready(Runtime::get().launched(s.device_index()));
  }
  void synchronizeStream(const c10::Stream& s) const override { Runtime::get().synchronize(s.device_index()); }
  void synchronizeDevice(const c10::DeviceIndex device) const override { Runtime::get().synchronize(device); }

  // ---- events
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device == -1 || device == stream.device_index(), "torch_tpu: an event of tpu:", device,
                " cannot be recorded on a stream of tpu:", stream.device_index());
    auto* e = static_cast<TpuEvent*>(*event);
    if (!e) {
      e = new TpuEvent();
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
    }
    e->device = stream.device_index();
    e->work = Runtime::get().launched(e->device);
    if (e->timing) {  // elapsed time is between completions: a timing event waits for its work here
      await_work(e->work);
      e->done = std::chrono::steady_clock::now();
    }
  }
  // Nothing to insert: a later execution that reads these outputs already waits for them.
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* event) const override {
    return !event || Runtime::get().ready(static_cast<TpuEvent*>(event)->work);
  }
  void synchronizeEvent(void* event) const override {
    if (event) await_work(static_cast<TpuEvent*>(event)->work);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device*/) const override {
    TORCH_CHECK(start && end, "torch_tpu: elapsed_time needs two recorded events");
    const auto* a = static_cast<TpuEvent*>(start);
    const auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a->timing && b->timing, "torch_tpu: elapsed_time needs events created with enable_timing=True");
    return std::chrono::duration<double, std::milli>(b->done - a->done).count();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device*/) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data*/, const c10::Stream& /*stream*/) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

void delete_storage(void* ptr) {
  auto* s = static_cast<DeviceStorage*>(ptr);
  if (Runtime::initialized()) Runtime::get().free(s->device, static_cast<int64_t>(s->nbytes) + s->padding_bytes);
  s->padding.reset();
  note_padding(*s);
  delete s;
}

// A DeviceAllocator, so torch.accelerator's memory calls work on tpu. Nothing
// is cached: a storage's buffer is freed when its last tensor dies, so
// empty_cache has nothing to release. Every storage counts in the large pool.
struct TpuAllocator final : c10::DeviceAllocator {
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
    auto* s = static_cast<DeviceStorage*>(const_cast<void*>(src));
    learn_sizes(*s);  // a copy of a deferred storage is an ordinary one
    d->value = s->value;
    d->dtype = s->dtype;
    if (s->padding) {  // the copy is padded alike, its padding accounted too
      Runtime::get().resize(d->device, s->padding_bytes - d->padding_bytes);
      d->padding = s->padding;
      d->padding_bytes = s->padding_bytes;
      note_padding(*d);
    }
  }

  bool initialized() override { return Runtime::initialized(); }
  void emptyCache(c10::MempoolId_t /*pool*/) override {}
  // PJRT orders work by the buffers it reads: no stream to tie a storage to.
  void recordStream(const c10::DataPtr& /*data*/, c10::Stream /*stream*/) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    const runtime::MemoryStats m = Runtime::get().memory_stats(device);
    c10::CachingDeviceAllocator::DeviceStats d;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, int64_t current, int64_t peak, int64_t allocated,
                   int64_t freed) {
      using c10::CachingDeviceAllocator::StatType;
      a[static_cast<size_t>(StatType::AGGREGATE)] =
          a[static_cast<size_t>(StatType::LARGE_POOL)] = {current, peak, allocated, freed};
    };
    fill(d.allocation, m.allocations, m.peak_allocations, m.total_allocations, m.total_frees);
    fill(d.active, m.allocations, m.peak_allocations, m.total_allocations, m.total_frees);
    fill(d.segment, m.allocations, m.peak_allocations, m.total_allocations, m.total_frees);
    for (auto* a : {&d.allocated_bytes, &d.active_bytes, &d.requested_bytes})
      fill(*a, m.allocated_bytes, m.peak_allocated_bytes, m.total_allocated_bytes, m.total_freed_bytes);
    fill(d.reserved_bytes, m.reserved_bytes, m.peak_reserved_bytes, m.total_allocated_bytes, m.total_freed_bytes);
    d.num_ooms = m.ooms;
    d.num_device_alloc = m.total_allocations;
    d.num_device_free = m.total_frees;
    return d;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device);
    Runtime::get().reset_accumulated_memory_stats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    Runtime::get().reset_peak_memory_stats(device);
  }
  // (free, total): total is the capacity allocations are checked against.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device(device);
    const runtime::MemoryStats m = Runtime::get().memory_stats(device);
    return {static_cast<size_t>(std::max<int64_t>(m.capacity - m.reserved_bytes, 0)), static_cast<size_t>(m.capacity)};
  }
};

TpuAllocator allocator;
REGISTER_ALLOCATOR(kTpu, &allocator);

// Host memory for non_blocking copies (pin_memory, torch.accelerator's host
// calls): plain CPU memory, since PJRT copies from any host pointer. Nothing is
// cached, so empty_cache has nothing to release; the stats count what is live.
struct TpuHostAllocator final : at::HostAllocator {
  struct Block {
    c10::DataPtr memory;  // from the CPU allocator
    size_t nbytes;
  };
  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    {
      std::lock_guard<std::mutex> lock(instance().mutex);
      instance().stats.allocations.decrease(1);
      instance().stats.allocated_bytes.decrease(block->nbytes);
      instance().stats.active_requests.decrease(1);
      instance().stats.active_bytes.decrease(block->nbytes);
      ++instance().stats.num_host_free;
      instance().live.erase(block->memory.get());
    }
    delete block;
  }
  static TpuHostAllocator& instance() {
    static TpuHostAllocator allocator;
    return allocator;
  }
  c10::DataPtr allocate(size_t nbytes) override {
    auto* block = new Block{c10::GetCPUAllocator()->allocate(nbytes), nbytes};
    void* data = block->memory.get();
    {
      std::lock_guard<std::mutex> lock(mutex);
      stats.allocations.increase(1);
      stats.allocated_bytes.increase(nbytes);
      stats.active_requests.increase(1);
      stats.active_bytes.increase(nbytes);
      ++stats.num_host_alloc;
      if (data) live.insert(data);
    }
    return {data, block, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex);
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto* s : {&stats.allocations, &stats.allocated_bytes, &stats.active_requests, &stats.active_bytes})
      s->reset_accumulated();
    stats.num_host_alloc = stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto* s : {&stats.allocations, &stats.allocated_bytes, &stats.active_requests, &stats.active_bytes})
      s->reset_peak();
  }

  bool owns(const void* data) {
    std::lock_guard<std::mutex> lock(mutex);
    return live.count(data) > 0;
  }

  std::mutex mutex;
  at::HostStats stats;
  std::unordered_set<const void*> live;  // what Tensor.is_pinned() asks about
};

const bool host_allocator_registered = [] {
  at::setHostAllocator(kTpu, &TpuHostAllocator::instance());
  return true;
}();

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count_devices() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  at::Allocator* getPinnedMemoryAllocator() const override { return &TpuHostAllocator::instance(); }
  bool isPinnedPtr(const void* data) const override { return TpuHostAllocator::instance().owns(data); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }

  // UntypedStorage.resize_ (FSDP2 frees and re-allocates parameter storage
  // this way): the bytes both sizes hold are kept; new bytes read as zeros.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    TORCH_CHECK(is_device_storage(storage.data_ptr()), "torch_tpu: resize_ of a storage torch_tpu did not allocate");
    auto* s = static_cast<DeviceStorage*>(storage.data_ptr().get());
    if (newsize == s->nbytes) return;
    make_plain(*s);
    try {
      Runtime::get().resize(s->device, static_cast<int64_t>(newsize) - static_cast<int64_t>(s->nbytes));
    } catch (const runtime::OutOfMemory& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    if (newsize % stablehlo::byte_size(s->dtype) != 0) s->dtype = stablehlo::DType::UInt8;
    if (newsize == 0 || !s->value) {
      s->value = nullptr;  // nothing to keep
    } else {
      std::vector<char> bytes(std::max(newsize, s->nbytes), 0);
      Runtime::get().download(*s->value, bytes.data(), s->nbytes);
      bytes.resize(newsize);
      s->value = Runtime::get().upload(bytes.data(), s->dtype,
                                       {static_cast<int64_t>(newsize / stablehlo::byte_size(s->dtype))}, s->device);
    }
    s->nbytes = newsize;
    storage.unsafeGetStorageImpl()->set_nbytes(newsize);
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  return true;
}();

}  // namespace

bool is_device_storage(const c10::DataPtr& data) {
  return data.get_deleter() == &delete_storage && data.get() == data.get_context();
}

}  // namespace torch_tpu::aten
