// torch.profiler on "tpu": a Kineto activity profiler, registered through
// PyTorch's PrivateUse1 profiler registry (torch >= 2.13; older torch builds
// without it). While a profile records, the runtime traces every program it
// runs (Runtime::start_trace); each becomes a kernel on the tpu's row, linked
// to the aten op that launched it (Kineto's correlation ids), so
// key_averages() gives each op its device time ("Self TPU"); the op's own
// CPU time covers its launch.
#if __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>) && __has_include(<IActivityProfiler.h>)
#ifndef USE_KINETO
#define USE_KINETO 1
#endif
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include "runtime/runtime.h"

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;

class TpuProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    start_ns_ = Runtime::clock_ns();
    Runtime::get().start_trace();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    events_ = Runtime::get().stop_trace();
    end_ns_ = Runtime::clock_ns();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }
  // (No `override`, and the callback's type spelled out: an older Kineto
  // (torch 2.11's) may lack this overload; Kineto then calls the one above.)
  void processTrace(libkineto::ActivityLogger& logger, std::function<const libkineto::ITraceActivity*(int32_t)> linked,
                    int64_t /*start*/, int64_t /*end*/) {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "tpu");
    buffer_->gpuOpCount = static_cast<int>(events_.size());
    for (const auto& e : events_) {
      // The device's run of the program, launch to outputs ready.
      auto kernel = std::make_unique<libkineto::GenericTraceActivity>(
          buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL, "tpu: " + e.name);
      kernel->startTime = e.start_ns;
      kernel->endTime = e.end_ns;
      kernel->id = static_cast<int32_t>(e.correlation);
      kernel->device = e.device;
      kernel->resource = 0;
      if (linked && e.correlation) kernel->linked = linked(static_cast<int32_t>(e.correlation));
      // (Quoted: addMetadata formats through fmt, whose library libtorch does not export.)
      kernel->addMetadataQuoted("bytes in", std::to_string(e.bytes_in));
      kernel->addMetadataQuoted("bytes out", std::to_string(e.bytes_out));
      kernel->addMetadataQuoted("compile or load us", std::to_string(e.prepare_ns / 1000));  // ~0 when ready
      logger.handleGenericActivity(*kernel);
      buffer_->activities.push_back(std::move(kernel));  // (the logger keeps pointers: the buffer keeps them alive)
    }
    events_.clear();
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::unique_ptr<libkineto::DeviceInfo>(new libkineto::DeviceInfo{0, 0, "tpu", "tpu 0"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }
  void pushCorrelationId(uint64_t id) override { Runtime::push_correlation(id); }
  void popCorrelationId() override { Runtime::pop_correlation(); }

 private:
  int64_t start_ns_ = 0, end_ns_ = 0;
  std::vector<Runtime::TraceEvent> events_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>&,
                                                                 const libkineto::Config&) override {
    return std::make_unique<TpuProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "torch_tpu";
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::PRIVATEUSE1_RUNTIME,
                                                libkineto::ActivityType::PRIVATEUSE1_DRIVER,
                                                libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace
}  // namespace torch_tpu::aten
#endif
