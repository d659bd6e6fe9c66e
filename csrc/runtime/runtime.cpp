#include "runtime/runtime.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <sstream>

#include "runtime/fused_window.h"

namespace torch_tpu::runtime {
namespace {

std::vector<std::string>& search_paths() {
  static std::vector<std::string> paths;
  return paths;
}
std::atomic<Runtime*> instance{nullptr};

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// The identity of this build of the library (path, size, modification time
// of the shared object holding this code): index entries of the disk cache
// name programs by op keys, whose lowering may change with any rebuild.
const std::string& library_identity() {
  static const std::string id = [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<const void*>(&library_identity), &info) || !info.dli_fname) return std::string("?");
    std::error_code ec;
    std::filesystem::path path(info.dli_fname);
    auto size = std::filesystem::file_size(path, ec);
    auto time = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
    return path.string() + ":" + std::to_string(size) + ":" + std::to_string(time);
  }();
  return id;
}

int64_t output_bytes(const std::vector<TensorType>& outputs) {
  int64_t bytes = 0;
  for (const auto& t : outputs) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= std::max<int64_t>(d, 0);  // -1: an undefined output
    bytes += n * static_cast<int64_t>(stablehlo::byte_size(t.dtype));
  }
  return bytes;
}

// An index entry: the executable's disk key, the output types, layouts and
// check messages, one per line ("o <dtype> <dims...>", "s <output> <strides...>",
// "c <message>"), then the
// MLIR ("m <size>" and the text: fused windows call the program's function).
std::string encode_index(const Program& program) {
  std::string out = std::to_string(program.disk_key.size()) + "\n" + program.disk_key;
  for (const auto& t : program.outputs) {
    out += "o " + std::to_string(static_cast<int>(t.dtype));
    for (int64_t d : t.shape) {
      out += ' ';
      out += std::to_string(d);
    }
    out += "\n";
  }
  for (size_t k = 0; k < program.output_strides.size(); ++k) {
    if (program.output_strides[k].empty()) continue;
    out += "s " + std::to_string(k);
    for (int64_t s : program.output_strides[k]) out.append(" ").append(std::to_string(s));
    out += "\n";
  }
  for (const auto& c : program.checks) out += "c " + c + "\n";
  if (!program.unread_inputs.empty()) {
    out += "u";
    for (size_t i : program.unread_inputs) out.append(" ").append(std::to_string(i));
    out += "\n";
  }
  out += "m " + std::to_string(program.mlir.size()) + "\n" + program.mlir;
  return out;
}

int64_t microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

// FNV-1a, for file names of the on-disk cache.
std::string hash_hex(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  std::ostringstream o;
  o << std::hex << h;
  return o.str();
}

// The memory mappings this process holds (lines of /proc/self/maps); 0 where
// the system does not say.
int64_t process_mappings() {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return 0;
  static thread_local char buffer[1 << 16];
  int64_t lines = 0;
  for (size_t got; (got = std::fread(buffer, 1, sizeof buffer, f)) > 0;)
    lines += std::count(buffer, buffer + got, '\n');
  std::fclose(f);
  return lines;
}

// The kernel's limit on one process's mappings (vm.max_map_count).
int64_t mapping_limit() {
  std::ifstream in("/proc/sys/vm/max_map_count");
  int64_t limit = 0;
  return (in >> limit) && limit > 0 ? limit : 65530;
}

// Bytes device `d` can hold (Runtime::memory_capacity).
int64_t find_capacity(const pjrt::Client& client, size_t d) {
  if (int64_t bytes = positive_env("TORCH_TPU_MEMORY_LIMIT", 0, "bytes (e.g. 8589934592 for 8 GiB)")) return bytes;
  if (auto stats = client.device_memory_stats(d); stats && stats->bytes_limit > 0) return stats->bytes_limit;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<int64_t>(pages) * page;
  return std::numeric_limits<int64_t>::max();
}

}  // namespace

int64_t positive_env(const char* name, int64_t fallback, const std::string& unit) {
  const std::string v = env(name);
  if (v.empty()) return fallback;
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
  }
  if (n < 1 || used != v.size())
    throw std::runtime_error("torch_tpu: " + std::string(name) + "='" + v + "' is not a positive number of " + unit +
                             ".");
  return n;
}

int64_t Runtime::clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
// Waits for a launch's outputs; a device failure names the op.
void await_outputs(const std::vector<pjrt::BufferPtr>& outputs, const char* what) {
  for (const auto& o : outputs) {
    try {
      o->await_ready();
    } catch (const pjrt::Error& e) {
      throw std::runtime_error(std::string("torch_tpu: ") + what + " failed on the device: " + e.what());
    }
  }
}

thread_local std::vector<uint64_t> correlations;
thread_local std::string program_context;
std::function<void(const Runtime::ProgramNote&)>& program_listener() {
  static std::function<void(const Runtime::ProgramNote&)> listener;
  return listener;
}
void tell_listener(const Program& program, const char* how, double ms) {
  if (!program_listener()) return;
  Runtime::ProgramNote note{program_family(program.key), program.key, program.mlir, how, program_context, ms};
  program_listener()(note);
}
}  // namespace

// What a program key names before its first '|': the op ("aten::mm"), or
// the kind of program ("view_read"; "bounded|aten::sum.dim_IntList" keeps the op).
std::string program_family(const std::string& key) {
  size_t end = key.find('|');
  if (key.compare(0, end, "bounded") == 0 && end != std::string::npos) end = key.find('|', end + 1);
  return key.substr(0, end);
}

PJRT_Buffer_Type pjrt_type(DType t) {
  switch (t) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::Int8: return PJRT_Buffer_Type_S8;
    case DType::Int16: return PJRT_Buffer_Type_S16;
    case DType::Int32: return PJRT_Buffer_Type_S32;
    case DType::Int64: return PJRT_Buffer_Type_S64;
    case DType::UInt8: return PJRT_Buffer_Type_U8;
    case DType::UInt16: return PJRT_Buffer_Type_U16;
    case DType::UInt32: return PJRT_Buffer_Type_U32;
    case DType::UInt64: return PJRT_Buffer_Type_U64;
    case DType::Float8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case DType::Float8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case DType::Float16: return PJRT_Buffer_Type_F16;
    case DType::BFloat16: return PJRT_Buffer_Type_BF16;
    case DType::Float32: return PJRT_Buffer_Type_F32;
    case DType::Float64: return PJRT_Buffer_Type_F64;
    case DType::Complex64: return PJRT_Buffer_Type_C64;
    case DType::Complex128: return PJRT_Buffer_Type_C128;
  }
  return PJRT_Buffer_Type_INVALID;
}

std::string find_plugin(const std::string& device, const std::vector<std::string>& paths) {
  std::string override_path = env("TORCH_TPU_PJRT_PLUGIN");
  if (!override_path.empty()) {
    if (!std::filesystem::exists(override_path))
      throw std::runtime_error("torch_tpu: TORCH_TPU_PJRT_PLUGIN='" + override_path + "' does not exist.");
    return override_path;
  }
  std::vector<std::string> candidates;
  if (device == "CPU") {
    candidates = {"lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"};
  } else if (device == "CUDA" || device == "GPU") {
    candidates = {"jax_plugins/xla_cuda13/xla_cuda_plugin.so", "jax_plugins/xla_cuda12/xla_cuda_plugin.so"};
  } else if (device == "TPU") {
    candidates = {"libtpu/libtpu.so"};
  } else {
    throw std::runtime_error("torch_tpu: unknown PJRT_DEVICE='" + device +
                             "'. Use CPU (default), CUDA or TPU, or set TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so.");
  }
  std::string looked;
  for (const auto& dir : paths) {
    for (const auto& c : candidates) {
      std::filesystem::path p = std::filesystem::path(dir) / c;
      if (std::filesystem::exists(p)) return p.string();
      looked += "\n  " + p.string();
    }
  }
  std::string package = device == "CPU"   ? "lammps-jax-pjrt-cpu==0.11.2"
                        : device == "TPU" ? "libtpu"
                                          : "jax-cuda13-pjrt (or jax-cuda12-pjrt)";
  throw std::runtime_error("torch_tpu: no PJRT plugin found for PJRT_DEVICE=" + device +
                           ". Looked in:" + (looked.empty() ? std::string("\n  (no search paths)") : looked) +
                           "\nInstall " + package + ", or set TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so.");
}

void Runtime::set_search_paths(std::vector<std::string> paths) { search_paths() = std::move(paths); }
// A child forked after the runtime started cannot use it (pjrt::Plugin::in_forked_child):
// every use raises this error rather than hang in the plugin.
bool Runtime::initialized() { return instance.load() != nullptr && !pjrt::Plugin::in_forked_child(); }
bool Runtime::in_bad_fork() { return instance.load() != nullptr && pjrt::Plugin::in_forked_child(); }

Runtime& Runtime::get() {
  if (Runtime* r = instance.load()) {
    if (in_bad_fork())
      throw std::runtime_error(
          "torch_tpu: tpu cannot be used in a process forked after its parent used tpu: the PJRT "
          "plugin's threads do not survive fork(). Start child processes with the 'spawn' method "
          "(multiprocessing.set_start_method('spawn'), torch.multiprocessing.spawn, or "
          "VLLM_WORKER_MULTIPROC_METHOD=spawn for vLLM).");
    return *r;
  }
  static std::mutex init_mutex;
  std::lock_guard<std::mutex> lock(init_mutex);
  if (!instance.load()) instance.store(new Runtime());  // lives for the process, like the plugin
  return *instance.load();
}

namespace {
// XLA may compute float16/bfloat16 chains in float32 without rounding between
// ops (excess precision); PyTorch rounds after every op, eager or compiled,
// so a compiled graph would differ from CPU. The plugin reads XLA_FLAGS when
// it first compiles; a user's own setting of the flag wins.
std::string disallow_excess_precision() {
  std::string flags = env("XLA_FLAGS");
  if (flags.find("xla_allow_excess_precision") == std::string::npos) {
    flags += std::string(flags.empty() ? "" : " ") + "--xla_allow_excess_precision=false";
    setenv("XLA_FLAGS", flags.c_str(), 1);
  }
  return flags;
}

// The XLA options programs of `kind` compile with on `device`:
// TORCH_TPU_XLA_OPTIONS (name=value,...) for every program when set, else
// the defaults measured per path (README "XLA options").
std::vector<pjrt::XlaOption> xla_options_for(const std::string& device, ProgramKind kind) {
  if (const char* v = std::getenv("TORCH_TPU_XLA_OPTIONS"); v && *v) return pjrt::parse_xla_options(v);
  // The CPU plugin compiles a Fused window 17-20% faster, a compiled graph
  // ~10% faster, at LLVM's O1, with the same step time; an op's program no
  // faster (benchmarks/xla_options.py). Other plugins read the level their
  // own way: their defaults stand until measured there.
  if (device == "CPU" && kind != ProgramKind::Op) return {{"xla_backend_optimization_level", "1"}};
  return {};
}

std::string describe(const std::vector<pjrt::XlaOption>& options) {
  std::string text;
  for (const auto& [name, value] : options) text += (text.empty() ? "" : ",") + name + "=" + value;
  return text;
}

}  // namespace

std::string Runtime::xla_options(ProgramKind kind) const { return describe(xla_options_[static_cast<size_t>(kind)]); }

Runtime::Runtime() {
  device_name_ = upper(env("PJRT_DEVICE", "CPU"));
  const std::string cache_only = env("TORCH_TPU_CACHE_ONLY", "0");
  if (cache_only != "0" && cache_only != "1")
    throw std::invalid_argument("TORCH_TPU_CACHE_ONLY='" + cache_only + "' is not 0 or 1");
  cache_only_ = cache_only == "1";
  plugin_path_ = find_plugin(device_name_, search_paths());
  xla_flags_ = disallow_excess_precision();
  auto plugin = pjrt::Plugin::load(plugin_path_);
  std::vector<pjrt::NamedOption> options;
  if (device_name_ == "CPU") {
    // TORCH_TPU_NUM_DEVICES: how many devices the CPU plugin makes (its default is 4).
    if (const int64_t n = positive_env("TORCH_TPU_NUM_DEVICES", 0, "devices"); n > 0) {
      pjrt::NamedOption o{};
      o.name = "cpu_device_count";
      o.kind = pjrt::NamedOption::kInt64;
      o.int_value = n;
      options.push_back(o);
    }
  }
  if (device_name_ == "CUDA" || device_name_ == "GPU") {
    // Allocate as needed instead of reserving most of the GPU up front.
    pjrt::NamedOption o{};
    o.name = "preallocate";
    o.kind = pjrt::NamedOption::kBool;
    o.bool_value = false;
    options.push_back(o);
  }
  client_ = std::make_unique<pjrt::Client>(plugin, options);
  for (auto kind : {ProgramKind::Op, ProgramKind::Window, ProgramKind::Graph}) {
    const auto k = static_cast<size_t>(kind);
    xla_options_[k] = xla_options_for(device_name_, kind);
    compile_options_[k] = pjrt::single_device_compile_options(xla_options_[k]);
  }
  disk_ = DiskCache::from_environment();
  max_executables_ =
      static_cast<size_t>(positive_env("TORCH_TPU_MAX_EXECUTABLES", 4096, "executables to keep loaded (default 4096)"));
  mapping_budget_ = positive_env("TORCH_TPU_MAX_MAPPINGS", mapping_limit() / 2,
                                 "memory mappings (default: half of vm.max_map_count)");
  compile_lock_timeout_s_ = positive_env("TORCH_TPU_COMPILE_LOCK_TIMEOUT", 600,
                                         "seconds to wait for another process's compile of a program (default 600)");
  check_nan_ = env("TORCH_TPU_DEBUG_CHECK_NAN") == "1";
  if (std::string m = env("TORCH_TPU_EAGER_MODE"); !m.empty()) {
    if (m == "debug")
      mode_ = EagerMode::Debug;
    else if (m == "fused")
      mode_ = EagerMode::Fused;
    else if (m != "strict")
      throw std::runtime_error("torch_tpu: TORCH_TPU_EAGER_MODE='" + m + "' is not one of: strict, debug, fused.");
  }
  memory_.resize(device_count());
  capacity_.resize(device_count());
  for (size_t d = 0; d < device_count(); ++d) capacity_[d] = find_capacity(*client_, d);
  pending_.resize(device_count());
  host_copies_.resize(device_count());
  last_record_.resize(device_count());
  synchronized_.resize(device_count());
  if (device_count() > FusedWindow::kMaxDevices)
    throw std::runtime_error("torch_tpu: the plugin has " + std::to_string(device_count()) +
                             " devices; Fused mode handles at most " + std::to_string(FusedWindow::kMaxDevices) +
                             " per process.");
  for (size_t d = 0; d < device_count(); ++d)
    windows_.push_back(std::make_unique<FusedWindow>(*this, static_cast<int>(d)));
}

PJRT_Device* Runtime::device(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= device_count())
    throw std::out_of_range("torch_tpu: device index " + std::to_string(index) + " is out of range: there are " +
                            std::to_string(device_count()) + " tpu devices.");
  return client_->devices()[index];
}

std::shared_ptr<Program> Runtime::load_indexed(DiskCache& disk, const std::string& index_key) {
  auto index = disk.load(index_key);
  if (!index) return nullptr;
  std::istringstream in(*index);
  size_t key_size = 0;
  in >> key_size;
  in.get();
  auto program = std::make_shared<Program>();
  program->disk_key.resize(key_size);
  if (!in.read(program->disk_key.data(), static_cast<std::streamsize>(key_size))) return nullptr;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("c ", 0) == 0) {
      program->checks.push_back(line.substr(2));
    } else if (line.rfind("o ", 0) == 0) {
      std::istringstream fields(line.substr(2));
      int dtype = 0;
      fields >> dtype;
      TensorType t{static_cast<DType>(dtype), {}};
      for (int64_t d; fields >> d;) t.shape.push_back(d);
      program->outputs.push_back(std::move(t));
    } else if (line.rfind("s ", 0) == 0) {
      std::istringstream fields(line.substr(2));
      size_t k = 0;
      fields >> k;
      if (k >= program->outputs.size()) return nullptr;
      program->output_strides.resize(program->outputs.size());
      for (int64_t s; fields >> s;) program->output_strides[k].push_back(s);
    } else if (line.rfind("u ", 0) == 0) {
      std::istringstream fields(line.substr(2));
      for (size_t i; fields >> i;) program->unread_inputs.push_back(i);
    } else if (line.rfind("m ", 0) == 0) {
      program->mlir.resize(std::stoull(line.substr(2)));
      if (!in.read(program->mlir.data(), static_cast<std::streamsize>(program->mlir.size()))) return nullptr;
      break;
    }
  }
  if (program->mlir.empty()) return nullptr;  // an entry of an older format
  program->output_bytes = output_bytes(program->outputs);
  return program;
}

ProgramPtr Runtime::program(const std::string& key, const std::function<ProgramSpec()>& build, bool indexed,
                            ProgramSource* source, ProgramKind kind) {
  auto found = [source](ProgramSource s) {
    if (source) *source = s;
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = programs_.find(key);
    if (it != programs_.end()) {
      cache_hits_.fetch_add(1, std::memory_order_relaxed);
      found(ProgramSource::Memory);
      return it->second;
    }
  }
  DiskCache& disk = *disk_;
  // Index entry: this process's program key -> the output types, checks,
  // MLIR and executable key, so a warm process skips PyTorch's meta kernels
  // and the lowering too. Keyed by the library build as well: rules change with it.
  const std::string& options = compile_options_[static_cast<size_t>(kind)];
  const std::string index_key =
      "index|" + library_identity() + "|" + plugin_path_ + "|" + hash_hex(options + xla_flags_) + "|" + key;
  std::shared_ptr<Program> program;
  found(ProgramSource::Compiled);
  if (indexed && disk.enabled()) {
    const auto load_start = std::chrono::steady_clock::now();
    if ((program = load_indexed(disk, index_key))) {
      program->compile_options = options;
      found(ProgramSource::Disk);
      count("disk_index_hits");
      count("disk_load_us", microseconds_since(load_start));
    }
  }
  const bool built = !program;
  if (built) {
    ProgramSpec spec = build();
    program = std::make_shared<Program>();
    program->outputs = std::move(spec.outputs);
    program->checks = std::move(spec.checks);
    program->output_strides = std::move(spec.output_strides);
    program->unread_inputs = std::move(spec.unread_inputs);
    program->output_bytes = output_bytes(program->outputs);
    program->mlir = std::move(spec.mlir);
    program->compile_options = options;
    // The executable entry is keyed by what was compiled, how, and by which plugin.
    program->disk_key = plugin_path_ + "|" + client_->plugin()->version() + "|" +
                        hash_hex(program->compile_options + xla_flags_) + "|" + program->mlir;
  }
  program->key = key;
  program->id = next_program_id_.fetch_add(1);
  // Compiled now so that a compile error surfaces at its op; Fused mode
  // compiles only the windows that call it, as does Strict mode for compiled
  // graphs (Runtime::record_graph).
  bool from_disk = false;
  const EagerMode now = mode();
  if (now == EagerMode::Debug || (now == EagerMode::Strict && kind != ProgramKind::Graph))
    executable(*program, &from_disk);
  if (from_disk) found(ProgramSource::Disk);
  if (built && indexed && disk.enabled() && serializable_.load())
    disk.store(index_key, encode_index(*program), "index of " + program_family(key));
  std::lock_guard<std::mutex> lock(mutex_);
  return programs_.emplace(key, std::move(program)).first->second;
}

ProgramPtr Runtime::multi_device_program(const std::string& key, const std::vector<int>& devices,
                                         const std::function<ProgramSpec()>& build) {
  std::string full_key = key + "|on";
  for (int d : devices) full_key.append(" ").append(std::to_string(d));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = programs_.find(full_key); it != programs_.end()) {
      cache_hits_.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  for (int d : devices) device(d);  // range checks
  ProgramSpec spec = build();
  auto program = std::make_shared<Program>();
  program->outputs = std::move(spec.outputs);
  program->checks = std::move(spec.checks);
  program->output_strides = std::move(spec.output_strides);
  program->output_bytes = output_bytes(program->outputs);
  program->mlir = std::move(spec.mlir);
  program->devices = devices;
  program->key = full_key;
  program->id = next_program_id_.fetch_add(1);
  executable(*program);
  std::lock_guard<std::mutex> lock(mutex_);
  return programs_.emplace(full_key, std::move(program)).first->second;
}

std::vector<std::vector<pjrt::BufferPtr>> Runtime::execute_on_devices(
    const Program& program, const std::vector<std::vector<pjrt::BufferPtr>>& args, const char* what) {
  if (args.size() != program.devices.size())
    throw std::invalid_argument(std::string("torch_tpu: ") + what + " runs on " +
                                std::to_string(program.devices.size()) + " devices but was given arguments for " +
                                std::to_string(args.size()));
  std::vector<std::vector<PJRT_Buffer*>> raw(args.size());
  for (size_t p = 0; p < args.size(); ++p)
    for (const auto& a : args[p]) {
      if (a->is_placeholder()) resolve(*a, "collective");
      raw[p].push_back(a->raw());
    }
  const auto exe = executable(program);
  for (int d : program.devices) check_fits(d, program.output_bytes);
  executions_.fetch_add(1, std::memory_order_relaxed);
  auto outputs = exe->execute_on_devices(raw);
  const uint64_t launch = ++launches_;
  for (const auto& per_device : outputs)
    for (const auto& o : per_device) o->set_launch(launch);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t p = 0; p < outputs.size(); ++p)
      for (const auto& o : outputs[p]) pending_[program.devices[p]].push_back({o, what, launch});
  }
  if (mode() == EagerMode::Debug)
    for (const auto& per_device : outputs)
      for (const auto& o : per_device) {
        try {
          o->await_ready();
        } catch (const pjrt::Error& e) {
          throw std::runtime_error(std::string("torch_tpu: ") + what + " failed on the device: " + e.what());
        }
      }
  return outputs;
}

void Runtime::set_compile_fault(std::string marker) {
  std::lock_guard<std::mutex> lock(mutex_);
  compile_fault_ = std::move(marker);
}

std::shared_ptr<pjrt::Executable> Runtime::executable(const Program& program, bool* from_disk) {
  std::lock_guard<std::mutex> lock(program.compile_mutex);
  if (program.executable) {
    mark_loaded(program, false);
    return program.executable;
  }
  {
    std::lock_guard<std::mutex> fault_lock(mutex_);
    if (!compile_fault_.empty() && program.mlir.find(compile_fault_) != std::string::npos)
      throw std::runtime_error("torch_tpu: compile failure injected for testing: the program contains \"" +
                               compile_fault_ + "\"");
  }
  if (!program.devices.empty()) return compile_on_devices(program);
  // Threads that need the same program at once (ranks running one model)
  // compile it once: the others wait for that executable and share it.
  std::shared_future<std::shared_ptr<pjrt::Executable>> other;
  std::promise<std::shared_ptr<pjrt::Executable>> mine;
  {
    std::lock_guard<std::mutex> compiling_lock(compiling_mutex_);
    if (auto it = compiling_.find(program.disk_key); it != compiling_.end())
      other = it->second;
    else
      compiling_.emplace(program.disk_key, mine.get_future().share());
  }
  if (other.valid()) {
    program.executable = other.get();  // rethrows that compile's error
    count("compiles_shared");
    mark_loaded(program, true);
    return program.executable;
  }
  auto finished = [&] {
    std::lock_guard<std::mutex> compiling_lock(compiling_mutex_);
    compiling_.erase(program.disk_key);
  };
  try {
    auto exe = load_or_compile(program, from_disk);
    finished();
    mine.set_value(exe);
    return exe;
  } catch (...) {
    finished();
    mine.set_exception(std::current_exception());
    throw;
  }
}

namespace {
// A program key's parts: its family, then one per argument of an op's key.
std::vector<std::string> key_parts(const std::string& key) {
  std::vector<std::string> parts;
  for (size_t at = 0; at <= key.size();) {
    size_t end = key.find_first_of(";|", at);
    if (end == std::string::npos) end = key.size();
    parts.push_back(key.substr(at, end - at));
    at = end + 1;
  }
  return parts;
}
}  // namespace

void Runtime::note_compile(const Program& program) {
  const std::string family = program_family(program.key);
  count("compiles");
  count("compiles::" + family);
  {
    // Why a family compiled again: the first part of its key that differs from its last compile's.
    std::lock_guard<std::mutex> lock(compile_notes_mutex_);
    auto& [last_key, change] = compile_notes_[family];
    if (!last_key.empty()) {
      const auto before = key_parts(last_key), now = key_parts(program.key);
      for (size_t i = 0; i < std::max(before.size(), now.size()); ++i) {
        const std::string a = i < before.size() ? before[i] : "", b = i < now.size() ? now[i] : "";
        if (a == b) continue;
        change = "key part " + std::to_string(i) + ": " + a.substr(0, 120) + " -> " + b.substr(0, 120);
        break;
      }
    }
    last_key = program.key;
  }
  // TORCH_TPU_DUMP_ON_MISS=<dir>: every program compiled (missed both caches), its key and StableHLO.
  static const char* dump = std::getenv("TORCH_TPU_DUMP_ON_MISS");
  if (dump && *dump) {
    std::error_code ec;
    std::filesystem::create_directories(dump, ec);
    std::string name = family.substr(0, 60);
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
    const auto path = std::filesystem::path(dump) / (name + "-" + hash_hex(program.key).substr(0, 12) + ".mlir");
    if (std::FILE* f = std::fopen(path.c_str(), "w")) {
      std::string key = program.key;
      for (char& c : key)
        if (c == '\n') c = ' ';
      std::fprintf(f, "// torch_tpu program key: %s\n%s", key.c_str(), program.mlir.c_str());
      std::fclose(f);
    }
  }
}

std::map<std::string, std::string> Runtime::compile_changes() {
  std::lock_guard<std::mutex> lock(compile_notes_mutex_);
  std::map<std::string, std::string> out;
  for (const auto& [family, note] : compile_notes_)
    if (!note.second.empty()) out[family] = note.second;
  return out;
}

void Runtime::refuse_if_cache_only(const Program& program) {
  if (!cache_only()) return;
  count("cache_only_misses");
  std::string name = program.key.size() > 300 ? program.key.substr(0, 300) + "..." : program.key;
  throw std::runtime_error(
      "torch_tpu: cache-only run (TORCH_TPU_CACHE_ONLY=1 or torch_tpu.cache_only()): the program \"" + name +
      "\" is not in the compilation cache (" + (disk_->enabled() ? disk_->dir() : std::string("disabled")) +
      ") and would compile now; run this code once without cache-only to fill the cache");
}

// Called with program.compile_mutex held: the executable from the disk
// cache, or compiled now (and stored there). Processes of one host compile
// it once: the compiler holds the entry's lock, the others wait and load.
std::shared_ptr<pjrt::Executable> Runtime::load_or_compile(const Program& program, bool* from_disk) {
  DiskCache& disk = *disk_;
  DiskCache::Lookup lookup = DiskCache::Lookup::Miss;
  auto load = [&] {
    const auto load_start = std::chrono::steady_clock::now();
    auto bytes = disk.load(program.disk_key, &lookup);
    if (!bytes) return false;
    try {
      program.executable = client_->deserialize(*bytes);
    } catch (const pjrt::Error&) {
      lookup = DiskCache::Lookup::Rejected;  // a valid file the plugin refuses: compile afresh below
      return false;
    }
    count("disk_cache_hits");
    count("disk_load_us", microseconds_since(load_start));
    tell_listener(program, "disk cache hit", static_cast<double>(microseconds_since(load_start)) / 1e3);
    if (from_disk) *from_disk = true;
    mark_loaded(program, true);
    return true;
  };
  if (load()) return program.executable;
  if (lookup == DiskCache::Lookup::Rejected) count("disk_cache_rejected");
  if (disk.enabled()) count("disk_cache_misses");
  refuse_if_cache_only(program);
  DiskCache::LockWait wait;
  DiskCache::EntryLock entry_lock =
      disk.lock_entry(program.disk_key, static_cast<double>(compile_lock_timeout_s_), &wait);
  if (wait.waited_us > 0 || wait.timed_out) {
    count("compile_lock_waits");
    count("compile_lock_wait_us", wait.waited_us);
  }
  if (wait.timed_out) {
    count("compile_lock_timeouts");
    std::fprintf(stderr,
                 "torch_tpu: warning: waited %lld s for another process to compile %s; compiling it here too "
                 "(TORCH_TPU_COMPILE_LOCK_TIMEOUT sets the wait).\n",
                 static_cast<long long>(compile_lock_timeout_s_), program_family(program.key).c_str());
  }
  // Whoever held the lock has stored the entry by now (unless it failed).
  if (entry_lock.held() && lookup != DiskCache::Lookup::Rejected && load()) return program.executable;
  const auto compile_start = std::chrono::steady_clock::now();
  try {
    program.executable = client_->compile(program.mlir, program.compile_options);
  } catch (const pjrt::Error& e) {
    const std::string what = e.what();
    if (what.find("compile option") != std::string::npos && std::getenv("TORCH_TPU_XLA_OPTIONS"))
      throw std::invalid_argument(what + " (from TORCH_TPU_XLA_OPTIONS='" + std::getenv("TORCH_TPU_XLA_OPTIONS") +
                                  "': name XLA DebugOptions fields, e.g. xla_backend_optimization_level=1)");
    throw std::runtime_error(what + "\nwhile compiling:\n" + program.mlir);
  }
  const int64_t compile_us = microseconds_since(compile_start);
  note_compile(program);
  count("compile_us", compile_us);
  tell_listener(program, "compiled", static_cast<double>(compile_us) / 1e3);
  if (disk.enabled() && serializable_.load()) {
    // No exception here: one thrown at this point (a long Fused run, the
    // first program the plugin would not serialize) crashed libgcc's
    // unwinder (_Unwind_Find_FDE) in a process that had compiled thousands
    // of programs.
    std::string error;
    std::string bytes = program.executable->serialize(&error);
    if (!error.empty() && serializable_.exchange(false))  // warned once; the cache stays in memory
      std::fprintf(stderr,
                   "torch_tpu: warning: the PJRT plugin cannot serialize executables (%s); "
                   "compiled programs are cached in memory only.\n",
                   error.c_str());
    if (!bytes.empty() &&
        disk.store(program.disk_key, bytes, program_family(program.key), static_cast<double>(compile_us) / 1e3))
      count("disk_cache_writes");
  }
  mark_loaded(program, true);
  return program.executable;
}

// Called with program.compile_mutex held: a multi-device program, compiled
// for its device assignment (checked: a permuted assignment would hand rank p
// rank q's result).
std::shared_ptr<pjrt::Executable> Runtime::compile_on_devices(const Program& program) {
  refuse_if_cache_only(program);
  std::vector<int> ids;
  for (int d : program.devices) ids.push_back(client_->device_id(static_cast<size_t>(d)));
  const auto compile_start = std::chrono::steady_clock::now();
  try {
    program.executable = client_->compile(
        program.mlir, pjrt::multi_device_compile_options(ids, xla_options_[static_cast<size_t>(ProgramKind::Graph)]));
  } catch (const pjrt::Error& e) {
    throw std::runtime_error(std::string(e.what()) + "\nwhile compiling:\n" + program.mlir);
  }
  note_compile(program);
  count("compile_us", microseconds_since(compile_start));
  std::vector<PJRT_Device*> expected;
  for (int d : program.devices) expected.push_back(device(d));
  if (program.executable->addressable_devices() != expected) {
    program.executable.reset();
    throw std::logic_error(
        "torch_tpu: the plugin placed a multi-device program's partitions in another order "
        "than its device assignment");
  }
  mark_loaded(program, true);
  return program.executable;
}

// Called with program.compile_mutex held. Another program is unloaded only if
// its compile_mutex is free (try_lock): two threads never wait on each other.
void Runtime::mark_loaded(const Program& program, bool fresh) {
  std::lock_guard<std::mutex> lock(loaded_mutex_);
  if (!fresh) {
    loaded_.splice(loaded_.begin(), loaded_, program.loaded_at);
    return;
  }
  loaded_.push_front(program.weak_from_this());
  program.loaded_at = loaded_.begin();
  unload_oldest(max_executables_);
  // The count alone does not bound the mappings: a large fused window's
  // executable holds hundreds. (A JIT that ran out of mappings left libgcc's
  // unwinder a dangling frame table: the next C++ exception crashed the
  // process.) Counting them reads /proc/self/maps, milliseconds at tens of
  // thousands, so the next count waits as many loads as could not reach the
  // budget at 256 mappings each.
  if (loads_until_mapping_check_-- > 0) return;
  int64_t maps = process_mappings();
  if (maps > mapping_budget_) {
    // The oldest eighth at a time, down to three quarters of the budget (room
    // for the loads to come).
    while (maps > mapping_budget_ / 4 * 3 && loaded_.size() > 1) {
      const size_t before = loaded_.size();
      unload_oldest(before - std::max<size_t>(before / 8, 1));
      if (loaded_.size() == before) break;  // the rest are in use by other threads
      ++mapping_pressure_unloads_;
      maps = process_mappings();
    }
  }
  loads_until_mapping_check_ = std::max<int64_t>(mapping_budget_ - maps, 0) / 256;
}

// Unloads the least recently used executables until `keep` remain (the newest
// always stays), skipping those in use. Called with loaded_mutex_ held.
void Runtime::unload_oldest(size_t keep) {
  auto it = loaded_.end();
  while (loaded_.size() > keep && it != std::next(loaded_.begin())) {
    --it;
    auto victim = it->lock();
    if (!victim) {  // a program dropped (a duplicate build): its executable went with it
      it = loaded_.erase(it);
      continue;
    }
    std::unique_lock<std::mutex> victim_lock(victim->compile_mutex, std::try_to_lock);
    if (!victim_lock.owns_lock()) continue;  // in use by another thread right now
    victim->executable.reset();
    it = loaded_.erase(it);
    ++unloaded_executables_;
  }
}

std::vector<pjrt::BufferPtr> Runtime::execute(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                              int device, const char* what, bool join_pending) {
  const EagerMode m = mode();
  if (join_pending && m == EagerMode::Strict)
    join_pending = std::any_of(args.begin(), args.end(), [&](const pjrt::BufferPtr& a) {
      return a->is_placeholder() && windows_.at(device)->owns(*a);
    });
  if (m == EagerMode::Fused || (join_pending && m == EagerMode::Strict)) {
    resolve_foreign(args, device);
    return windows_.at(device)->record(program, args, what);
  }
  return execute_now(*program, args, device, what);
}

std::vector<pjrt::BufferPtr> Runtime::record_graph(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                                   int device, const char* what) {
  resolve_foreign(args, device);
  return windows_.at(device)->record_graph(program, args, what);
}

std::vector<pjrt::BufferPtr> Runtime::record_collective(const ProgramPtr& program,
                                                        const std::vector<pjrt::BufferPtr>& args, int device,
                                                        const char* what,
                                                        const std::shared_ptr<const CollectiveGroup>& group,
                                                        RunAlone alone) {
  resolve_foreign(args, device);
  return windows_.at(device)->record(program, args, what, group, std::move(alone));
}

FusedWindow* Runtime::window_of(const pjrt::Buffer& placeholder) const {
  if (!placeholder.is_placeholder()) return nullptr;
  const auto d = static_cast<size_t>(FusedWindow::device_of(placeholder));
  return d < windows_.size() && windows_[d]->owns(placeholder) ? windows_[d].get() : nullptr;
}

void Runtime::resolve_foreign(const std::vector<pjrt::BufferPtr>& args, int device) {
  for (const auto& a : args)
    if (a->is_placeholder() && !windows_.at(device)->owns(*a)) resolve(*a, "device");
}

std::vector<pjrt::BufferPtr> Runtime::execute_now(const Program& program, const std::vector<pjrt::BufferPtr>& args,
                                                  int device, const char* what, bool check_memory,
                                                  const std::vector<int64_t>& keep, bool note) {
  std::vector<PJRT_Buffer*> raw;
  raw.reserve(args.size());
  for (const auto& a : args) {
    if (a->is_placeholder()) resolve(*a, "compiled_graph");
    raw.push_back(a->raw());
  }
  const bool traced = tracing();
  const int64_t prepared = traced ? clock_ns() : 0;
  const auto exe = executable(program);
  if (check_memory) check_fits(device, program.output_bytes);
  executions_.fetch_add(1, std::memory_order_relaxed);
  const int64_t started = traced ? clock_ns() : 0;
  auto outputs = exe->execute(raw, this->device(device), keep);
  if (traced) trace_execution(program, device, prepared, started, args, outputs, what);
  const uint64_t launch = ++launches_;
  for (const auto& o : outputs) o->set_launch(launch);
  if (note) note_launched(device, outputs, what);
  if (mode() == EagerMode::Debug) await_outputs(outputs, what);
  return outputs;
}

void Runtime::note_launched(int device, const std::vector<pjrt::BufferPtr>& outputs, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& pending = pending_[device];
  if (pending.size() >= 4096)  // forget outputs already freed: they were awaited or dropped
    std::erase_if(pending, [](const Pending& p) { return p.buffer.expired(); });
  for (const auto& o : outputs) pending.push_back({o, what, o->launch()});
}

void Runtime::flush(const char* reason) {
  // A rank's thread leaves the other ranks' windows alone: cut at another
  // rank's moment, theirs would differ from the others'.
  if (FusedWindow::thread_rank() >= 0) return;
  for (const auto& w : windows_) w->flush(reason, /*with_collectives=*/false);
}

void Runtime::flush(int device, const char* reason) { windows_.at(device)->flush(reason); }

void Runtime::discard_collectives(int device) { windows_.at(device)->discard_collectives(); }

void Runtime::replaced(const pjrt::BufferPtr& now, const pjrt::BufferPtr& before) {
  if (!before || !now || !now->is_placeholder()) return;
  if (FusedWindow* w = window_of(*now)) w->replaced(now, before);
}

void Runtime::resolve(const pjrt::Buffer& buffer, const char* reason) {
  if (!buffer.is_placeholder()) return;
  if (FusedWindow* w = window_of(buffer)) w->flush(reason);
  if (buffer.is_placeholder())
    throw std::runtime_error(
        "torch_tpu: this tensor's value was never computed: the fused window that was to compute it failed (see "
        "the earlier error). Compute it again.");
}

std::string Runtime::python_stack() { return FusedWindow::stack(); }

void Runtime::set_program_listener(std::function<void(const ProgramNote&)> listener) {
  program_listener() = std::move(listener);
}
void Runtime::set_program_context(std::string context) { program_context = std::move(context); }
bool Runtime::has_program_listener() { return static_cast<bool>(program_listener()); }

void Runtime::push_correlation(uint64_t id) { correlations.push_back(id); }
void Runtime::pop_correlation() {
  if (!correlations.empty()) correlations.pop_back();
}

void Runtime::start_trace() {
  std::lock_guard<std::mutex> lock(trace_mutex_);
  trace_.clear();
  tracing_.store(true);
}

std::vector<Runtime::TraceEvent> Runtime::stop_trace() {
  tracing_.store(false);
  std::lock_guard<std::mutex> lock(trace_mutex_);
  return std::move(trace_);
}

void Runtime::trace_execution(const Program& program, int device, int64_t prepared, int64_t started,
                              const std::vector<pjrt::BufferPtr>& inputs, const std::vector<pjrt::BufferPtr>& outputs,
                              const char* what) {
  TraceEvent e;
  e.prepare_ns = started - prepared;
  for (const auto& b : inputs) e.bytes_in += static_cast<int64_t>(b->on_device_size());
  await_outputs(outputs, what);
  e.end_ns = clock_ns();
  for (const auto& o : outputs) e.bytes_out += static_cast<int64_t>(o->on_device_size());
  e.name = program_family(program.key);
  e.device = device;
  e.start_ns = started;
  e.correlation = correlations.empty() ? 0 : correlations.back();
  std::lock_guard<std::mutex> lock(trace_mutex_);
  if (tracing_.load() && trace_.size() < (size_t{1} << 22)) trace_.push_back(std::move(e));
}

void Runtime::set_stack_provider(std::function<std::string()> provider) {
  FusedWindow::set_stack_provider(std::move(provider));
}

void Runtime::set_mode(EagerMode m) {
  const EagerMode before = mode_.load();
  if (before != m && (before == EagerMode::Fused || m == EagerMode::Debug))
    for (const auto& w : windows_) w->flush("mode_switch");
  mode_.store(m);
}

void Runtime::defer_check(pjrt::BufferPtr flags, std::vector<std::string> messages) {
  if (flags->is_placeholder())
    if (FusedWindow* w = window_of(*flags); w && w->add_check(flags, messages)) return;  // the op just recorded
  queue_check(std::move(flags), std::move(messages));
}

void Runtime::queue_check(pjrt::BufferPtr flags, std::vector<std::string> messages) {
  std::lock_guard<std::mutex> lock(mutex_);
  deferred_checks_.push_back({std::move(flags), std::move(messages)});
  has_deferred_checks_ = true;
}

void Runtime::verify_checks(uint64_t upto) {
  if (!has_deferred_checks_.load()) return;
  std::vector<DeferredCheck> checks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A host read verifies the checks launched no later than the value it reads,
    // as a CUDA stream's would: waiting for later launches (a flag still in the
    // window, or launched after) would undo the overlap of host and device work.
    const auto later = std::stable_partition(deferred_checks_.begin(), deferred_checks_.end(), [&](const auto& c) {
      return upto == pjrt::Buffer::kUnknownLaunch || (!c.flags->is_placeholder() && c.flags->launch() <= upto);
    });
    checks.assign(std::make_move_iterator(deferred_checks_.begin()), std::make_move_iterator(later));
    deferred_checks_.erase(deferred_checks_.begin(), later);
    has_deferred_checks_ = !deferred_checks_.empty();
  }
  // Every program's flags copied at once (one copy each), then awaited: one wait.
  size_t total = 0;
  for (const auto& c : checks) total += c.messages.size();
  std::unique_ptr<bool[]> ok(new bool[total]);
  std::vector<std::unique_ptr<pjrt::Event>> copies;
  std::exception_ptr error;
  try {
    for (size_t i = 0, at = 0; i < checks.size(); at += checks[i].messages.size(), ++i) {
      resolve(*checks[i].flags);
      copies.push_back(checks[i].flags->to_host_async(&ok[at], checks[i].messages.size()));
    }
  } catch (...) {
    error = std::current_exception();
  }
  for (const auto& copy : copies) {  // all awaited before `ok` goes
    try {
      copy->await();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  count("transfers_to_host", static_cast<int64_t>(copies.size()));
  if (error) std::rethrow_exception(error);
  for (size_t i = 0, at = 0; i < checks.size(); at += checks[i].messages.size(), ++i)
    for (size_t j = 0; j < checks[i].messages.size(); ++j)
      if (!ok[at + j]) throw DeviceCheckFailed(checks[i].messages[j]);
}

std::shared_ptr<Runtime::Launched> Runtime::launched(int device) {
  windows_.at(device)->flush("event");
  auto work = std::make_shared<Launched>();
  work->device = device;
  std::lock_guard<std::mutex> lock(mutex_);
  work->launch = launches_.load();
  work->previous = last_record_.at(device).lock();
  // Since the previous record (it still covers what came before), else since
  // the last synchronize; pending_ is in launch order.
  const uint64_t since = work->previous ? work->previous->launch : synchronized_.at(device);
  const auto& pending = pending_.at(device);
  for (auto p = pending.rbegin(); p != pending.rend() && p->launch > since; ++p)
    if (!p->buffer.expired()) work->outputs.push_back(p->buffer);
  auto& copies = host_copies_.at(device);
  std::erase_if(copies, [](const auto& c) { return c->done->ready(); });
  work->copies = copies;
  last_record_.at(device) = work;
  return work;
}

void Runtime::mark_done(const std::vector<std::shared_ptr<Launched>>& chain) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& w : chain) {
    w->done = true;
    w->outputs.clear();
    w->copies.clear();
    w->previous.reset();
  }
}

// The records of `work`'s chain not yet done (none before the last
// synchronize), and what they wait for, copied under the lock: another thread
// may mark the same records done meanwhile.
Runtime::Launched Runtime::to_wait_for(const std::shared_ptr<Launched>& work,
                                       std::vector<std::shared_ptr<Launched>>* chain) {
  Launched all;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t synced = synchronized_.at(work->device);
  for (auto w = work; w && !w->done && w->launch > synced; w = w->previous) chain->push_back(w);
  for (auto w = chain->rbegin(); w != chain->rend(); ++w) {  // oldest first
    all.outputs.insert(all.outputs.end(), (*w)->outputs.begin(), (*w)->outputs.end());
    all.copies.insert(all.copies.end(), (*w)->copies.begin(), (*w)->copies.end());
  }
  return all;
}

bool Runtime::ready(const std::shared_ptr<Launched>& work) {
  if (!work) return true;
  std::vector<std::shared_ptr<Launched>> chain;
  const Launched all = to_wait_for(work, &chain);
  for (const auto& o : all.outputs)
    if (auto b = o.lock(); b && !b->ready()) return false;
  for (const auto& c : all.copies)
    if (!c->done->ready()) return false;
  mark_done(chain);  // a device error among them still surfaces at synchronize or at a read of its value
  return true;
}

void Runtime::await(const std::shared_ptr<Launched>& work) {
  if (!work) return;
  std::vector<std::shared_ptr<Launched>> chain;
  const Launched all = to_wait_for(work, &chain);
  for (const auto& o : all.outputs)
    if (auto b = o.lock()) b->await_ready();
  for (const auto& c : all.copies) c->done->await();
  mark_done(chain);
  verify_checks(work->launch);
}

void Runtime::synchronize(int device) {
  windows_.at(device)->flush("synchronize");
  verify_checks();
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_.at(device));
    synchronized_.at(device) = launches_.load();
  }
  for (const auto& p : pending) {
    auto b = p.buffer.lock();
    if (!b) continue;
    try {
      b->await_ready();
    } catch (const pjrt::Error& e) {
      throw std::runtime_error(std::string("torch_tpu: ") + p.op +
                               " failed on the device (reported at synchronize): " + e.what());
    }
  }
  std::vector<std::shared_ptr<HostCopy>> copies;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copies.swap(host_copies_.at(device));
  }
  for (const auto& c : copies) c->done->await();
}

pjrt::BufferPtr Runtime::upload(const void* data, DType dtype, const std::vector<int64_t>& dims, int device) {
  count("transfers_to_device");
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  count("bytes_to_device", n * static_cast<int64_t>(stablehlo::byte_size(dtype)));
  auto buffer = client_->buffer_from_host(data, pjrt_type(dtype), dims, this->device(device));
  buffer->set_launch(launches_.load());  // ordered after what was launched before it
  return buffer;
}

void Runtime::download(const pjrt::Buffer& buffer, void* dst, size_t nbytes) {
  resolve(buffer);
  verify_checks(buffer.launch());  // a host read is where an earlier op's failed check surfaces
  count("transfers_to_host");
  try {
    buffer.to_host(dst, nbytes);
  } catch (const pjrt::Error&) {
    // A host read waits for the op that produced the value: name the op that failed.
    for (size_t d = 0; d < pending_.size(); ++d) synchronize(static_cast<int>(d));
    throw;
  }
}

void Runtime::download_async(const pjrt::BufferPtr& buffer, void* dst, size_t nbytes, std::shared_ptr<void> target,
                             int device) {
  resolve(*buffer);
  count("transfers_to_host");
  auto copy = std::make_shared<HostCopy>(HostCopy{buffer->to_host_async(dst, nbytes), buffer, std::move(target)});
  std::lock_guard<std::mutex> lock(mutex_);
  host_copies_.at(device).push_back(std::move(copy));
}

void Runtime::count(const std::string& name, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_[name] += n;
}

void Runtime::count_max(const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& v = counters_[name];
  v = std::max(v, value);
}

std::map<std::string, int64_t> Runtime::metrics() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto m = counters_;
  m["executions"] = executions_.load();
  m["cache_hits"] = cache_hits_.load();
  m["cached_programs"] = static_cast<int64_t>(programs_.size());
  {
    std::lock_guard<std::mutex> loaded_lock(loaded_mutex_);
    m["loaded_executables"] = static_cast<int64_t>(loaded_.size());
    m["unloaded_executables"] = unloaded_executables_;
    m["mapping_pressure_unloads"] = mapping_pressure_unloads_;
  }
  return m;
}

void Runtime::reset_metrics() {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.clear();
  executions_ = 0;
  cache_hits_ = 0;
  std::lock_guard<std::mutex> loaded_lock(loaded_mutex_);
  unloaded_executables_ = 0;
  mapping_pressure_unloads_ = 0;
}

namespace {

std::string gib(int64_t bytes) {
  std::ostringstream o;
  o.precision(2);
  o << std::fixed << static_cast<double>(bytes) / (1ll << 30) << " GiB";
  return o.str();
}

}  // namespace

void Runtime::check_fits(int device, int64_t nbytes) {
  if (device < 0 || static_cast<size_t>(device) >= memory_.size()) return;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  check_fits_locked(device, nbytes);
}

void Runtime::check_fits_locked(int device, int64_t nbytes) {
  MemoryStats& m = memory_[device];
  if (nbytes > capacity_[device] - m.allocated_bytes) {
    ++m.ooms;
    throw OutOfMemory("torch_tpu: out of memory on tpu:" + std::to_string(device) + ": tried to allocate " +
                      std::to_string(nbytes) + " bytes (" + gib(nbytes) + "); the device holds " +
                      std::to_string(capacity_[device]) + " bytes (" + gib(capacity_[device]) + ") and " +
                      std::to_string(m.allocated_bytes) + " bytes (" + gib(m.allocated_bytes) +
                      ") are allocated by tensors. Free tensors, use smaller sizes, or (host-memory devices) set "
                      "TORCH_TPU_MEMORY_LIMIT=<bytes> to change the capacity.");
  }
}

void Runtime::allocate(int device, int64_t nbytes) {
  if (device < 0 || static_cast<size_t>(device) >= memory_.size()) return;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  check_fits_locked(device, nbytes);
  MemoryStats& m = memory_[device];
  m.allocated_bytes += nbytes;
  m.total_allocated_bytes += nbytes;
  m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, m.allocated_bytes);
  ++m.allocations;
  ++m.total_allocations;
  m.peak_allocations = std::max(m.peak_allocations, m.allocations);
}

void Runtime::free(int device, int64_t nbytes) {
  if (device < 0 || static_cast<size_t>(device) >= memory_.size()) return;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  MemoryStats& m = memory_[device];
  m.allocated_bytes -= nbytes;
  m.total_freed_bytes += nbytes;
  --m.allocations;
  ++m.total_frees;
}

void Runtime::resize(int device, int64_t delta) {
  if (device < 0 || static_cast<size_t>(device) >= memory_.size()) return;
  if (delta > 0) {
    allocate(device, delta);
    std::lock_guard<std::mutex> lock(memory_mutex_);
    MemoryStats& m = memory_[device];  // the same storage: not a new allocation
    --m.allocations;
    --m.total_allocations;
    return;
  }
  std::lock_guard<std::mutex> lock(memory_mutex_);
  memory_[device].allocated_bytes += delta;
  memory_[device].total_freed_bytes -= delta;
}

int64_t Runtime::memory_allocated(int device) const { return memory_stats(device).allocated_bytes; }
int64_t Runtime::max_memory_allocated(int device) const { return memory_stats(device).peak_allocated_bytes; }

MemoryStats Runtime::memory_stats(int device) const {
  this->device(device);  // range check with its message
  MemoryStats m;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    m = memory_[device];
    m.capacity = capacity_[device];
  }
  m.reserved_bytes = m.allocated_bytes;
  m.peak_reserved_bytes = m.peak_allocated_bytes;
  if (auto p = client().device_memory_stats(device)) {
    m.reserved_bytes = std::max(m.reserved_bytes, p->bytes_in_use);
    m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, p->peak_bytes_in_use);
  }
  m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, m.reserved_bytes);
  return m;
}

void Runtime::reset_peak_memory_stats(int device) {
  this->device(device);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  MemoryStats& m = memory_[device];
  m.peak_allocated_bytes = m.allocated_bytes;
  m.peak_allocations = m.allocations;
}

void Runtime::reset_accumulated_memory_stats(int device) {
  this->device(device);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  MemoryStats& m = memory_[device];
  m.total_allocated_bytes = m.total_freed_bytes = m.total_allocations = m.total_frees = m.ooms = 0;
}

int64_t Runtime::memory_capacity(int device) const {
  this->device(device);
  return capacity_[device];
}

}  // namespace torch_tpu::runtime
