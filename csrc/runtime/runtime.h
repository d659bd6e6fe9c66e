// The device runtime: the one PJRT client of the process, the executable
// cache shared by every execution path, device storages, and metrics.
// Torch-free: the aten layer translates tensors into these terms.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pjrt/client.h"
#include "runtime/disk_cache.h"
#include "stablehlo/builder.h"

namespace torch_tpu::runtime {

using stablehlo::DType;
using stablehlo::TensorType;

PJRT_Buffer_Type pjrt_type(DType t);
// A program key's op or kind of program: the metric compiles::<family> counts its compiles.
std::string program_family(const std::string& key);

// The positive integer in environment variable `name`, or `fallback` when it
// is unset; anything else throws "NAME='v' is not a positive number of <unit>".
int64_t positive_env(const char* name, int64_t fallback, const std::string& unit);

// What a tensor's storage DataPtr points at (DESIGN.md, "Storage model").
// `value` is a flat 1-D buffer of nbytes / byte_size(dtype) elements, or null
// until something writes the storage. Buffers are immutable values: a write
// computes a new buffer and swaps it in, so every alias sees it.
//
// A bounded storage (torch_tpu.mark_dynamic, README "Bounded dynamic
// shapes") holds a row-major tensor of padding->sizes laid out row-major in
// padding->padded(): a bounded dim takes its bucket's size, and the elements
// past its real size are padding of any value. Programs over it are compiled
// per bucket, not per size. nbytes stays the size PyTorch sees; the padding's
// bytes are accounted as padding_bytes.
//
// A size only the device knows yet (the count of a nonzero recorded in a
// Fused window, README "Data-dependent ops in Fused windows") is a negative
// entry of `sizes`: -id of one of `unknown`, until a host read learns it.
struct DeviceSize {
  int64_t id = 0;                // > 0
  pjrt::BufferPtr count;         // int32[1] on the device
  std::optional<int64_t> value;  // once read
};
struct Padding {
  std::vector<int64_t> sizes;                        // the real tensor the storage holds
  std::vector<int64_t> buckets;                      // per dim: its padded size when bounded, else 0
  std::vector<std::shared_ptr<DeviceSize>> unknown;  // what its negative sizes stand for
  std::vector<int64_t> padded() const {
    std::vector<int64_t> p(sizes);
    for (size_t d = 0; d < p.size(); ++d)
      if (buckets[d]) p[d] = buckets[d];
    return p;
  }
};

struct DeviceStorage {
  size_t nbytes = 0;
  int device = 0;
  DType dtype = DType::Float32;
  pjrt::BufferPtr value;
  std::optional<Padding> padding;  // set: value is padded (above)
  int64_t padding_bytes = 0;       // accounted on top of nbytes while padded
  bool counted_padded = false;     // counted among the live padded storages

  int64_t numel() const { return static_cast<int64_t>(nbytes / stablehlo::byte_size(dtype)); }
};

// A program and the types of its outputs. Its executable is compiled (or
// loaded from the disk cache) on first execution: a program only recorded
// into fused windows is never compiled on its own.
struct Program : std::enable_shared_from_this<Program> {
  std::string key;  // the cache key it was built under
  uint64_t id = 0;  // unique in this process; names it in fused window keys
  std::vector<TensorType> outputs;
  // Per output, its strides when PyTorch lays the result out in another order
  // than row-major (x.t() + 1, a channels_last result). The flat output of a
  // new tensor is in that memory order; an in-place or out= result stays in
  // logical order (it is written through the destination's strides). Empty
  // (or an empty entry): row-major.
  std::vector<std::vector<int64_t>> output_strides;
  std::string mlir;
  // A multi-device program (a collective): one partition per device, in
  // this order, all launched together. Empty: a single-device program that
  // runs on whichever device a launch names.
  std::vector<int> devices;
  std::string disk_key;         // of the executable in the disk cache
  std::string compile_options;  // the serialized xla.CompileOptionsProto it compiles with
  // With checks, the last output is bool[checks.size()]: flags that must be
  // true, entry i named by checks[i] ("index out of range in self"), like
  // CUDA's device asserts. One output, so one copy to verify them all.
  std::vector<std::string> checks;
  // The inputs of the call its module does not read (Builder::prune), in
  // order: a launch passes no buffer for them.
  std::vector<size_t> unread_inputs;
  int64_t output_bytes = 0;  // checked against the device's free capacity before each run

  // Set by Runtime::executable(); unloaded again when it is the least recently
  // used of more than TORCH_TPU_MAX_EXECUTABLES loaded ones.
  mutable std::mutex compile_mutex;
  mutable std::shared_ptr<pjrt::Executable> executable;
  mutable std::list<std::weak_ptr<const Program>>::iterator loaded_at;  // valid while executable is set
};

// What building a program yields: MLIR text, output types, and check messages.
struct ProgramSpec {
  std::string mlir;
  std::vector<TensorType> outputs;
  std::vector<std::string> checks;
  std::vector<std::vector<int64_t>> output_strides;  // see Program
  std::vector<size_t> unread_inputs;                 // see Program
  ProgramSpec(std::string m, std::vector<TensorType> o, std::vector<std::string> c = {})
      : mlir(std::move(m)), outputs(std::move(o)), checks(std::move(c)) {}
  ProgramSpec(std::pair<std::string, std::vector<TensorType>> p)
      : ProgramSpec(std::move(p.first), std::move(p.second)) {}
};

// A device check that failed (an index out of range): reported at the op in
// Debug mode, at the next synchronize or host read in Strict mode. Raised as
// IndexError, or as RuntimeError for a check whose message starts with
// kRuntimeErrorCheck (the class CPU raises for that check).
struct DeviceCheckFailed : std::out_of_range {
  using std::out_of_range::out_of_range;
};
inline constexpr std::string_view kRuntimeErrorCheck = "RuntimeError: ";
inline bool raises_runtime_error(const std::string& check) { return check.rfind(kRuntimeErrorCheck, 0) == 0; }
// The check's message without the class mark.
inline std::string check_message(const std::string& check) {
  return raises_runtime_error(check) ? check.substr(kRuntimeErrorCheck.size()) : check;
}
using ProgramPtr = std::shared_ptr<const Program>;

// An allocation the device cannot hold; the aten layer raises it as
// torch.OutOfMemoryError. Nothing was allocated, so the process stays usable.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Our accounting of device storages on one device (CUDA's memory_stats names).
struct MemoryStats {
  int64_t allocated_bytes = 0, peak_allocated_bytes = 0;
  int64_t total_allocated_bytes = 0, total_freed_bytes = 0;  // cumulative
  int64_t allocations = 0, peak_allocations = 0;
  int64_t total_allocations = 0, total_frees = 0;  // cumulative
  int64_t ooms = 0;
  int64_t capacity = 0;  // what the allocation check allows (memory_capacity)
  // What the device holds for us: the plugin's bytes_in_use where it reports
  // it (program temporaries included), else allocated_bytes (nothing is cached).
  int64_t reserved_bytes = 0, peak_reserved_bytes = 0;
};

enum class EagerMode { Strict, Debug, Fused };

class FusedWindow;

// The process group of a collective recorded into a Fused window (ranks that
// are threads of this process, one device each): the window then runs as one
// program over the group's devices, every rank launching its own window at
// once (README "Collectives in Fused windows").
struct CollectiveGroup {
  std::string key;  // which group: a window holds one group's collectives
  int size = 1;     // its ranks: the window program's partitions
  int rank = 0;     // the recording rank
  // Launches the window's program (`key` names it, `build` makes it) with this
  // rank's `args` together with the other ranks' windows; this rank's
  // outputs, or nullopt when the ranks' windows differ (nothing ran: each
  // rank then replays its window op by op).
  std::function<std::optional<std::vector<pjrt::BufferPtr>>(const std::string& key,
                                                            const std::function<ProgramSpec()>& build,
                                                            const std::vector<pjrt::BufferPtr>& args, int device)>
      launch;
};
// How a recorded collective runs on its own (a window replayed op by op).
using RunAlone = std::function<std::vector<pjrt::BufferPtr>(const std::vector<pjrt::BufferPtr>&)>;

// Where Runtime::program found a program: this process's memory, the disk
// cache (an index entry or an executable for the same StableHLO), or nowhere
// (compiled now).
enum class ProgramSource { Memory, Disk, Compiled };
// What a program is, for the XLA options it compiles with (README "XLA
// options"): an eager op's, a Fused window's, or a compiled graph's.
enum class ProgramKind { Op, Window, Graph };

class Runtime {
 public:
  // The process's runtime, created on first use (loads the plugin).
  static Runtime& get();
  // Where Python packages live, to find plugins installed from PyPI. Call
  // before first use; the C++ tests use TORCH_TPU_PJRT_PLUGIN instead.
  static void set_search_paths(std::vector<std::string> paths);
  static bool initialized();
  // A child forked after this process started the runtime: every use raises.
  static bool in_bad_fork();

  const pjrt::Client& client() const { return *client_; }
  size_t device_count() const { return client_->devices().size(); }
  PJRT_Device* device(int index) const;
  const std::string& device_name() const { return device_name_; }  // "CPU", "CUDA", "TPU"
  const std::string& plugin_path() const { return plugin_path_; }
  // The persistent compilation cache, read from the environment once, when the runtime starts.
  DiskCache& disk_cache() { return *disk_; }

  // The program for `key`, built by `build()` (MLIR text and output types)
  // on the first request only, and compiled then unless the mode is Fused.
  // `indexed`: the disk cache also maps `key` to the program, so that a warm
  // process skips build(); only for keys that mean the same in every process.
  // `source`, if given, says where the program came from.
  ProgramPtr program(const std::string& key, const std::function<ProgramSpec()>& build, bool indexed = true,
                     ProgramSource* source = nullptr, ProgramKind kind = ProgramKind::Op);
  // The XLA options programs of `kind` compile with, as name=value text.
  std::string xla_options(ProgramKind kind) const;
  // Runs `program` on `device`, not waiting for it unless the mode is Debug;
  // in Fused mode records it into the window and returns placeholders.
  // `join_pending`: in Strict mode too, when an argument is a value the
  // window has yet to compute (a view read of a compiled graph's output, read
  // by the next graph: the window runs once, not at each such read).
  // Throws OutOfMemory, before running, when its outputs cannot fit.
  std::vector<pjrt::BufferPtr> execute(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args, int device,
                                       const char* what, bool join_pending = false);
  // A compiled graph's launch outside Debug mode: a call of `device`'s window,
  // so a step's graphs (forward, backward, update) and the Fused ops between
  // them run as one program. The window runs when one of its values is read,
  // at synchronize, or when a graph it holds comes again (the next step); in
  // Strict mode it holds only graphs. Returns placeholders.
  std::vector<pjrt::BufferPtr> record_graph(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                            int device, const char* what);
  // Fused mode: records `program`, a collective of `group` (its one-partition
  // form), into `device`'s window; `alone` runs it when the window is
  // replayed op by op. Returns placeholders.
  std::vector<pjrt::BufferPtr> record_collective(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                                 int device, const char* what,
                                                 const std::shared_ptr<const CollectiveGroup>& group, RunAlone alone);
  // Runs `program` now in any mode (a compiled graph, a fused window); a
  // placeholder argument flushes the window first. `keep`: arguments the
  // program aliases to outputs that must not be donated (see
  // pjrt::Executable::execute). `note`: whether the outputs are noted for
  // synchronize (note_launched); a window notes the placeholders it moves
  // them into instead.
  std::vector<pjrt::BufferPtr> execute_now(const Program& program, const std::vector<pjrt::BufferPtr>& args, int device,
                                           const char* what, bool check_memory = true,
                                           const std::vector<int64_t>& keep = {}, bool note = true);
  // The program's executable, compiled or loaded from the disk cache on first
  // use (then *from_disk is set). Hold it while running it: an executable
  // unused for long may be unloaded (see loaded_).
  std::shared_ptr<pjrt::Executable> executable(const Program& program, bool* from_disk = nullptr);
  // The program for `key` over `devices` (one partition each, in order),
  // built by `build()` on first request and compiled at once. Kept in memory
  // only: its executable names the devices.
  ProgramPtr multi_device_program(const std::string& key, const std::vector<int>& devices,
                                  const std::function<ProgramSpec()>& build);
  // Runs a multi-device program now, in any mode: `args[p]` are the arguments
  // of partition p (on program.devices[p]); returns each partition's outputs.
  std::vector<std::vector<pjrt::BufferPtr>> execute_on_devices(const Program& program,
                                                               const std::vector<std::vector<pjrt::BufferPtr>>& args,
                                                               const char* what);
  // Runs the fused windows (one per device), if they hold anything; `reason`
  // is counted in the metrics as fused_flush_<reason>. A window holding
  // collectives is left to its own rank's thread: flushing it waits for the
  // other ranks' windows (its device's flush, or a read of its values, runs
  // it); so is one another thread is using. In a rank's thread (see
  // FusedWindow::set_thread_rank) it does nothing: flush(device) runs the rank's own.
  void flush(const char* reason);
  // Runs `device`'s fused window.
  void flush(int device, const char* reason);
  // Drops `device`'s window if it holds collectives (its rank raised: the
  // other ranks will not meet it); its values are never computed.
  void discard_collectives(int device);
  // `outputs` of a launch on `device`, for synchronize and events to wait
  // for. execute_now notes its own unless told not to; a window notes the
  // placeholders its results were moved into (the results die at the flush).
  void note_launched(int device, const std::vector<pjrt::BufferPtr>& outputs, const char* what);
  // `now` becomes a storage's value in place of `before`: in Fused mode, if
  // the op computing `now` fails at the flush, the storage keeps `before`.
  void replaced(const pjrt::BufferPtr& now, const pjrt::BufferPtr& before);
  // Waits until `buffer` has a handle, flushing the window if it is a placeholder.
  void resolve(const pjrt::Buffer& buffer, const char* reason = "host_read");
  // Fused mode's debugging aid (TORCH_TPU_FUSED_DEBUG=1): a function that
  // returns where an op was called from (the Python stack), kept per recorded op.
  static void set_stack_provider(std::function<std::string()> provider);
  // The calling Python frames (the user's), "" where no provider is set.
  static std::string python_stack();
  // Program executions while a profiler traces (torch.profiler on "tpu",
  // through Kineto: csrc/aten/profiler.cpp). A traced execution waits for its
  // outputs, so each program's device time is its own (launch to ready);
  // untraced, nothing is recorded or awaited.
  struct TraceEvent {
    std::string name;  // the program's family (its op, or "fused")
    int device = 0;
    int64_t start_ns = 0, end_ns = 0;  // system clock: launch, outputs ready
    int64_t prepare_ns = 0;            // before the launch: finding (compiling, loading) the executable
    int64_t bytes_in = 0, bytes_out = 0;
    uint64_t correlation = 0;  // the profiled op that ran it (0: none)
  };
  void start_trace();
  // The trace's clock: the system clock in ns, as PyTorch's c10::getTime() stamps op events.
  static int64_t clock_ns();
  std::vector<TraceEvent> stop_trace();
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  // The profiler's id of the op the calling thread runs (a stack: ops nest).
  static void push_correlation(uint64_t id);
  static void pop_correlation();
  // Structured trace (TORCH_TRACE for tlparse, set up in Python): a listener
  // told of every program compiled or loaded from the disk cache, with what
  // it is (`context`, set by whoever launches it: a Fused window's flush
  // reason and ops). Called with the program's compile lock held.
  struct ProgramNote {
    std::string family, key, mlir, how, context;  // how: "compiled" or "disk cache hit"
    double ms = 0;
  };
  static void set_program_listener(std::function<void(const ProgramNote&)> listener);
  static void set_program_context(std::string context);
  static bool has_program_listener();
  // Per family of programs compiled more than once: what in its key changed
  // at the last compile (torch_tpu.explain's "why it recompiled").
  std::map<std::string, std::string> compile_changes();

  // A copy into host memory started by download_async.
  struct HostCopy {
    std::unique_ptr<pjrt::Event> done;
    pjrt::BufferPtr source;        // kept until the copy is done
    std::shared_ptr<void> target;  // the host memory's owner, likewise
  };
  // What an event recorded now waits for: the outputs launched on its device
  // since the previous record (the fused window flushed first), the host
  // copies in flight, the deferred checks up to now, and the previous
  // record's work. Each record walks only what is new since the one before,
  // and work found done is dropped, so recording an event every step stays
  // cheap however long the program runs without a synchronize.
  struct Launched {
    int device = 0;
    uint64_t launch = 0;  // launches_ at the record
    std::vector<std::weak_ptr<pjrt::Buffer>> outputs;
    std::vector<std::shared_ptr<HostCopy>> copies;
    std::shared_ptr<Launched> previous;  // null: nothing before it to wait for
    bool done = false;                   // awaited: everything above is cleared
  };
  std::shared_ptr<Launched> launched(int device);
  bool ready(const std::shared_ptr<Launched>& work);  // null: nothing recorded, ready
  // Waits for it; raises a device error or a failed check of it.
  void await(const std::shared_ptr<Launched>& work);

  // Waits for everything launched on `device` so far; raises the first device
  // error, or DeviceCheckFailed for a failed deferred check.
  void synchronize(int device);
  // A program's check flags (its last output, see Program::checks) to verify
  // at the next synchronize or host read (Strict and Fused modes).
  void defer_check(pjrt::BufferPtr flags, std::vector<std::string> messages);
  // Queues flags that are (or will be) a launched program's output as they are.
  void queue_check(pjrt::BufferPtr flags, std::vector<std::string> messages);
  // Verifies the deferred checks of launches up to `upto` (by default all, the
  // fused window flushed); throws DeviceCheckFailed naming the first that
  // failed. Later ones stay deferred.
  void verify_checks(uint64_t upto = pjrt::Buffer::kUnknownLaunch);

  pjrt::BufferPtr upload(const void* data, DType dtype, const std::vector<int64_t>& dims, int device);
  void download(const pjrt::Buffer& buffer, void* dst, size_t nbytes);
  // Starts copying `buffer` of `device` into host memory `dst`, owned by
  // `target`, and returns: a non_blocking copy to pinned memory. An event
  // recorded after it, or synchronize, waits for it (and verifies the checks).
  void download_async(const pjrt::BufferPtr& buffer, void* dst, size_t nbytes, std::shared_ptr<void> target,
                      int device);

  EagerMode mode() const { return mode_.load(); }
  // Leaving Fused mode, or entering Debug mode, runs the windows first.
  void set_mode(EagerMode m);
  // Debug mode also checks every float output for NaN/Inf (TORCH_TPU_DEBUG_CHECK_NAN=1).
  bool check_nan() const { return check_nan_.load(); }
  void set_check_nan(bool on) { check_nan_.store(on); }

  // Cache-only runs (production warm starts): a program that is neither in
  // memory nor in the disk cache fails instead of compiling, naming it.
  // TORCH_TPU_CACHE_ONLY=1 at start, torch_tpu.cache_only() around a block.
  bool cache_only() const { return cache_only_.load(); }
  void set_cache_only(bool on) { cache_only_.store(on); }

  // Testing the error paths: every compile of a program whose MLIR contains
  // `marker` fails (empty: none), as a plugin's compile error would.
  void set_compile_fault(std::string marker);

  // Counters: compiles, cache hits, executions, transfers.
  void count(const std::string& name, int64_t n = 1);
  // Keeps the largest value seen under `name`.
  void count_max(const std::string& name, int64_t value);
  std::map<std::string, int64_t> metrics();
  void reset_metrics();

  // Device storage accounting. allocate() throws OutOfMemory when the
  // storages of `device` would exceed its capacity; resize() grows or shrinks
  // a live storage by `delta` bytes (same check when growing).
  void allocate(int device, int64_t nbytes);
  void free(int device, int64_t nbytes);
  void resize(int device, int64_t delta);
  // Throws OutOfMemory when `nbytes` more do not fit on `device`.
  void check_fits(int device, int64_t nbytes);
  int64_t memory_allocated(int device) const;
  int64_t max_memory_allocated(int device) const;
  MemoryStats memory_stats(int device) const;
  void reset_peak_memory_stats(int device);
  void reset_accumulated_memory_stats(int device);
  // Bytes the device can hold: TORCH_TPU_MEMORY_LIMIT if set, else the
  // plugin's bytes_limit, else (a host-memory plugin) the machine's physical RAM.
  int64_t memory_capacity(int device) const;

 private:
  void trace_execution(const Program& program, int device, int64_t prepared, int64_t started,
                       const std::vector<pjrt::BufferPtr>& inputs, const std::vector<pjrt::BufferPtr>& outputs,
                       const char* what);
  std::atomic<bool> tracing_{false};
  std::mutex trace_mutex_;
  std::vector<TraceEvent> trace_;
  Runtime();
  // A program from the disk cache's index entry (see program()), or null.
  std::shared_ptr<Program> load_indexed(DiskCache& disk, const std::string& index_key);
  friend class FusedWindow;
  std::vector<std::unique_ptr<FusedWindow>> windows_;  // Fused mode's, one per device
  // The window whose value `placeholder` is, or null (a failed window's).
  FusedWindow* window_of(const pjrt::Buffer& placeholder) const;
  // Placeholders among `args` that another device's window computes are computed first.
  void resolve_foreign(const std::vector<pjrt::BufferPtr>& args, int device);
  std::atomic<uint64_t> next_program_id_{1};
  std::unique_ptr<pjrt::Client> client_;
  std::unique_ptr<DiskCache> disk_;
  std::string device_name_, plugin_path_;
  std::string compile_options_[3];  // per ProgramKind
  std::vector<pjrt::XlaOption> xla_options_[3];
  std::string xla_flags_;  // XLA_FLAGS the plugin compiles with: part of the disk cache's key
  std::mutex mutex_;
  std::unordered_map<std::string, ProgramPtr> programs_;
  // Programs whose executable is loaded, most recently used first. Each holds
  // JIT code mappings (about three on the CPU plugin for one op, hundreds for
  // a large fused window; the kernel's limit is vm.max_map_count, 65530 per
  // process) and device-side code, so a process that makes many programs (a
  // long test run, many shapes) unloads the least recently used beyond
  // max_executables_, or while the process holds more than mapping_budget_
  // mappings; the next use loads it from the disk cache or compiles it again.
  std::mutex loaded_mutex_;
  std::list<std::weak_ptr<const Program>> loaded_;
  size_t max_executables_ = 4096;         // TORCH_TPU_MAX_EXECUTABLES
  int64_t mapping_budget_ = 32765;        // TORCH_TPU_MAX_MAPPINGS, half of vm.max_map_count
  int64_t compile_lock_timeout_s_ = 600;  // TORCH_TPU_COMPILE_LOCK_TIMEOUT: the longest wait for another's compile
  int64_t unloaded_executables_ = 0;
  int64_t mapping_pressure_unloads_ = 0;  // rounds of unloading for mappings
  int64_t loads_until_mapping_check_ = 0;
  void mark_loaded(const Program& program, bool fresh);
  void unload_oldest(size_t keep);
  std::shared_ptr<pjrt::Executable> compile_on_devices(const Program& program);
  std::shared_ptr<pjrt::Executable> load_or_compile(const Program& program, bool* from_disk);
  void refuse_if_cache_only(const Program& program);  // throws in a cache-only run
  // Counts a compile (compiles::<family>), notes what changed since the
  // family's last compile, dumps it under TORCH_TPU_DUMP_ON_MISS.
  void note_compile(const Program& program);
  std::mutex compile_notes_mutex_;
  std::map<std::string, std::pair<std::string, std::string>> compile_notes_;  // family -> (last key, change)
  // Compiles in progress, by disk key: a second thread waits for the first.
  std::mutex compiling_mutex_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<pjrt::Executable>>> compiling_;
  std::map<std::string, int64_t> counters_;
  std::atomic<int64_t> executions_{0}, cache_hits_{0};  // the per-op counters, kept lock-free
  std::atomic<uint64_t> launches_{0};                   // launch order, see pjrt::Buffer::launch
  std::atomic<EagerMode> mode_{EagerMode::Strict};
  std::atomic<bool> check_nan_{false};
  std::atomic<bool> serializable_{true};  // false once the plugin failed to serialize
  std::atomic<bool> cache_only_{false};   // set_cache_only
  std::string compile_fault_;             // set_compile_fault; guarded by mutex_
  mutable std::mutex memory_mutex_;       // the accounting only: held for a few additions
  std::vector<MemoryStats> memory_;
  std::vector<int64_t> capacity_;
  void check_fits_locked(int device, int64_t nbytes);
  // Outputs launched since the last synchronize, with the op that made them,
  // so that an asynchronous device error names its op.
  struct Pending {
    std::weak_ptr<pjrt::Buffer> buffer;
    const char* op;  // a plan's name or a literal: lives for the process
    uint64_t launch;
  };
  std::vector<std::vector<Pending>> pending_;
  std::vector<std::weak_ptr<Launched>> last_record_;  // per device: the newest event record
  std::vector<uint64_t> synchronized_;                // per device: launches_ at its last synchronize
  void mark_done(const std::vector<std::shared_ptr<Launched>>& chain);
  Launched to_wait_for(const std::shared_ptr<Launched>& work, std::vector<std::shared_ptr<Launched>>* chain);
  std::vector<std::vector<std::shared_ptr<HostCopy>>> host_copies_;  // per device, since its last synchronize
  struct DeferredCheck {
    pjrt::BufferPtr flags;  // bool[messages.size()]
    std::vector<std::string> messages;
  };
  std::vector<DeferredCheck> deferred_checks_;
  std::atomic<bool> has_deferred_checks_{false};
};

// The plugin library for PJRT_DEVICE (CPU | CUDA | TPU), or the
// TORCH_TPU_PJRT_PLUGIN override. Throws naming every place looked in.
std::string find_plugin(const std::string& device, const std::vector<std::string>& search_paths);

}  // namespace torch_tpu::runtime
