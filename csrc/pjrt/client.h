// A small C++ client over the PJRT C API: one RAII class per PJRT object.
// Knows nothing of torch.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "pjrt/pjrt_c_api.h"

namespace torch_tpu::pjrt {

// A failed PJRT call: the plugin's own message plus the call that failed.
class Error : public std::runtime_error {
 public:
  Error(const std::string& call, const std::string& message, int code)
      : std::runtime_error(call + " failed: " + message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A loaded plugin: the shared library and its function table. The library is
// never unloaded: plugins register global state (thread pools, allocators)
// that does not survive dlclose.
class Plugin {
 public:
  // dlopen + GetPjrtApi + version check + PJRT_Plugin_Initialize.
  static std::shared_ptr<Plugin> load(const std::string& path);

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return api_->pjrt_api_version.major_version; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }
  std::string version() const;

  // A named value as the plugin gives it (PJRT_NamedValue).
  using Attribute = std::variant<std::string, int64_t, std::vector<int64_t>, double, bool>;
  using Attributes = std::vector<std::pair<std::string, Attribute>>;
  static Attributes named_values(const PJRT_NamedValue* values, size_t n);
  // The plugin's attributes: its XLA version, the StableHLO versions it reads.
  Attributes attributes() const;

  // Throws Error (and frees `error`) when `error` is set.
  void check(PJRT_Error* error, const char* call) const;

  // True in a child forked after a plugin was loaded. The plugin's threads do
  // not survive fork, so the child must not call into it (a call can hang):
  // objects it inherited are leaked instead of destroyed.
  static bool in_forked_child();

 private:
  Plugin(const PJRT_Api* api, std::string path) : api_(api), path_(std::move(path)) {}
  const PJRT_Api* api_;
  std::string path_;
};

class Event {
 public:
  Event(std::shared_ptr<Plugin> plugin, PJRT_Event* event) : plugin_(std::move(plugin)), event_(event) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void await();
  bool ready() const;

 private:
  std::shared_ptr<Plugin> plugin_;
  PJRT_Event* event_;
};

// A device buffer. Buffers are values: nothing writes into one after it is
// created, which is what lets tensors share them freely.
// A placeholder stands for a value a later execution produces (Fused eager
// records programs instead of running them): it has no handle until fill(),
// and every holder of the shared Buffer sees the handle once it is filled.
class Buffer {
 public:
  Buffer(std::shared_ptr<Plugin> plugin, PJRT_Buffer* buffer) : plugin_(std::move(plugin)), buffer_(buffer) {}
  // A placeholder; `tag` is its owner's (which value of which window).
  Buffer(std::shared_ptr<Plugin> plugin, uint64_t tag) : plugin_(std::move(plugin)), buffer_(nullptr), tag_(tag) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  PJRT_Buffer* raw() const { return buffer_.load(std::memory_order_acquire); }
  bool is_placeholder() const { return raw() == nullptr; }
  uint64_t tag() const { return tag_; }
  // Which launch made it, in the runtime's launch order (kUnknownLaunch: not
  // known, ordered after every launch). A filled placeholder takes its source's.
  static constexpr uint64_t kUnknownLaunch = ~uint64_t{0};
  uint64_t launch() const { return launch_; }
  void set_launch(uint64_t launch) { launch_ = launch; }
  // Gives a placeholder the handle (and launch) of `source`, which is left without a handle.
  void fill_from(Buffer& source);
  size_t on_device_size() const;
  // Copies the whole buffer into `dst` (row-major) and waits for the copy.
  void to_host(void* dst, size_t nbytes) const;
  // Starts that copy (after the buffer is computed); it is done when the event is.
  std::unique_ptr<Event> to_host_async(void* dst, size_t nbytes) const;
  // Waits until the computation producing this buffer finished; raises its error.
  void await_ready() const;
  // Whether that computation finished (a placeholder: false).
  bool ready() const;
  // A copy on another device of the same client (not waiting for it).
  std::shared_ptr<Buffer> copy_to_device(PJRT_Device* device) const;
  // Zero-copy interop: the buffer's address (host memory on the CPU plugin),
  // and the count that keeps its memory in place while another library reads
  // it (PJRT neither frees nor donates it meanwhile).
  uintptr_t unsafe_pointer() const;
  void add_external_reference() const;
  void release_external_reference() const;
  // Memory another library owns (Client::view_of): never donated to XLA.
  bool borrowed() const { return borrowed_; }
  void set_borrowed() { borrowed_ = true; }
  // A cached constant that many calls read (a dynamic Scalar's value): never
  // donated, and a Fused window takes each read as an input of its own, so its
  // wiring does not depend on which values happen to be equal.
  bool shared() const { return shared_; }
  void set_shared() { shared_ = true; }

 private:
  std::shared_ptr<Plugin> plugin_;
  std::atomic<PJRT_Buffer*> buffer_;
  uint64_t tag_ = 0;
  uint64_t launch_ = kUnknownLaunch;
  bool borrowed_ = false;
  bool shared_ = false;
};

using BufferPtr = std::shared_ptr<Buffer>;

class Executable {
 public:
  Executable(std::shared_ptr<Plugin> plugin, PJRT_LoadedExecutable* exe);
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  size_t num_outputs() const { return num_outputs_; }
  // Launches on `device`; returns the outputs without waiting for them.
  // An argument that the program aliases to an output is donated (its buffer
  // becomes that output and is deleted) unless its index is in `keep`.
  std::vector<BufferPtr> execute(const std::vector<PJRT_Buffer*>& args, PJRT_Device* device,
                                 const std::vector<int64_t>& keep = {}) const;
  // Launches a multi-device program once over all its devices: `args[p]` are
  // partition p's arguments, in the order of the program's device assignment;
  // returns each partition's outputs, same order.
  std::vector<std::vector<BufferPtr>> execute_on_devices(const std::vector<std::vector<PJRT_Buffer*>>& args) const;
  // The devices a launch covers, in argument-list order.
  std::vector<PJRT_Device*> addressable_devices() const;
  // The executable's bytes (for the disk cache), or empty with `error` set.
  // Never throws: a plugin that cannot serialize a program is not an error,
  // and unwinding an exception right after XLA:CPU compiled a program has
  // crashed inside libgcc's unwinder (see runtime.cpp, load_or_compile).
  std::string serialize(std::string* error) const;

 private:
  std::shared_ptr<Plugin> plugin_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_ = 0;
};

// What PJRT_Device_MemoryStats reports; -1 for a field the plugin leaves unset.
struct DeviceMemoryStats {
  int64_t bytes_in_use = -1;
  int64_t peak_bytes_in_use = -1;
  int64_t num_allocs = -1;
  int64_t bytes_limit = -1;
  int64_t bytes_reserved = -1;
  int64_t peak_bytes_reserved = -1;
};

struct NamedOption {
  std::string name;
  enum Kind { kString, kInt64, kFloat, kBool } kind;
  std::string string_value;
  int64_t int_value = 0;
  float float_value = 0;
  bool bool_value = false;
};

class Client {
 public:
  Client(std::shared_ptr<Plugin> plugin, const std::vector<NamedOption>& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::shared_ptr<Plugin>& plugin() const { return plugin_; }
  const std::vector<PJRT_Device*>& devices() const { return devices_; }
  std::string platform_name() const;
  std::string platform_version() const;
  std::string device_kind(size_t index) const;
  // The plugin's description of device `index`: named values (a GPU's
  // compute capability and core count, a TPU's coordinates), as it gives them.
  Plugin::Attributes device_attributes(size_t index) const;
  // The plugin's global id of a device: what a device assignment names.
  int device_id(size_t index) const;
  // The plugin's memory statistics of a device; nullopt where the plugin
  // does not implement them (the XLA CPU plugin).
  std::optional<DeviceMemoryStats> device_memory_stats(size_t index) const;
  // bytes_in_use as the plugin reports it, or -1 where it reports nothing.
  int64_t device_bytes_in_use(size_t index) const;

  BufferPtr buffer_from_host(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims,
                             PJRT_Device* device) const;
  // A buffer over `data`, memory another library owns (a zero-copy import):
  // dense, row-major. `on_delete(data, arg)` runs when PJRT is done with it.
  // nullptr where the plugin lacks PJRT_Client_CreateViewOfDeviceBuffer.
  BufferPtr view_of(void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims, PJRT_Device* device,
                    void (*on_delete)(void*, void*), void* arg) const;
  // Compiles a StableHLO module given as MLIR text.
  std::unique_ptr<Executable> compile(const std::string& mlir, const std::string& compile_options) const;
  std::unique_ptr<Executable> deserialize(const std::string& bytes) const;

 private:
  PJRT_DeviceDescription* device_description(size_t index) const;
  std::shared_ptr<Plugin> plugin_;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
};

// An XLA debug option by name ("xla_backend_optimization_level", "1"), as
// JAX's compiler_options pass them: the plugin sets the DebugOptions field
// of that name (a bool, integer, float or string by how the value reads).
struct XlaOption {
  std::string name, value;
};
// "name=value,name=value" (TORCH_TPU_XLA_OPTIONS); throws on an entry without '='.
std::vector<XlaOption> parse_xla_options(const std::string& text);

// A serialized xla.CompileOptionsProto for a single-device program that runs
// on whichever device each launch names (a portable executable).
std::string single_device_compile_options(const std::vector<XlaOption>& overrides = {});

// A serialized xla.CompileOptionsProto for a program of one partition per
// device of `device_ids` (global ids, in partition order): its collectives
// span those devices, and one launch runs it on all of them.
std::string multi_device_compile_options(const std::vector<int>& device_ids,
                                         const std::vector<XlaOption>& overrides = {});

// Bytes of one element of `type`.
size_t element_size(PJRT_Buffer_Type type);

}  // namespace torch_tpu::pjrt
