// Fused eager mode: programs launched in Fused mode are recorded into a
// window instead of run, and a flush runs the whole window as one program.
// Each recorded program's function is called from the window's main
// function; XLA inlines the calls and fuses across them, and values no live
// tensor holds never leave the program.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tpu::runtime {

class FusedWindow {
 public:
  FusedWindow(Runtime& runtime, int device);
  // Records `program` applied to `args` on the window's device; returns its outputs as
  // placeholder buffers, filled at the flush. `group`: the program is a
  // collective of that group, run by `alone` when the window is replayed;
  // the window then runs over the group's devices (a collective of another
  // group flushes it first). `graph`: see record_graph.
  std::vector<pjrt::BufferPtr> record(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                      const char* what, const std::shared_ptr<const CollectiveGroup>& group = nullptr,
                                      RunAlone alone = {}, bool graph = false);
  // Records a compiled graph. A window that already calls this graph runs
  // first: the graph coming again starts a loop's next step, so each step is
  // one program instead of one window growing over steps until a read.
  std::vector<pjrt::BufferPtr> record_graph(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                            const char* what);
  // Runs the window as one program and fills the placeholders still held.
  // `with_collectives` false: a window that holds collectives, or that
  // another thread holds (a rank's thread, maybe waiting in it for the
  // other ranks), is left as it is.
  void flush(const char* reason, bool with_collectives = true);
  // Whether `b` is a placeholder of this window.
  bool owns(const pjrt::Buffer& b) const;
  // The device of the window a placeholder came from (its tag says).
  static int device_of(const pjrt::Buffer& placeholder) { return static_cast<int>(placeholder.tag() >> 24 & 0xff); }
  static constexpr int kMaxDevices = 256;
  // Drops the window, unrun, if it holds collectives (see Runtime::discard_collectives).
  void discard_collectives();
  // Takes the check flags of an op recorded in this window (a placeholder it
  // made): at the flush every such op's flags leave the window as one array,
  // verified with one copy to the host; the messages get where the op was
  // called from (TORCH_TPU_FUSED_DEBUG=1). False when `flags` is not the window's.
  bool add_check(const pjrt::BufferPtr& flags, std::vector<std::string>& messages);
  // `now`, a placeholder of this window, is the new value of a storage that
  // held `before`: if the op computing `now` fails at the flush, the storage
  // keeps `before`, as in Strict mode where the failing op raises and writes nothing.
  void replaced(const pjrt::BufferPtr& now, const pjrt::BufferPtr& before);
  bool empty();
  static void set_stack_provider(std::function<std::string()> provider);
  // The rank of a process group whose ranks are threads (run_threads) that
  // the calling thread runs, or -1: a rank recording into a window that
  // holds another rank's collectives raises instead of waiting on it.
  static void set_thread_rank(int rank);
  static int thread_rank();
  static std::string stack();  // the provider's frames, or ""

 private:
  // A value of the window: an input (a concrete buffer it reads) or an output of a recorded call.
  struct Ref {
    bool input;
    int index;
  };
  struct Call {
    ProgramPtr program;
    std::vector<Ref> args;
    int first_value;  // its outputs are values first_value, first_value + 1, ...
    const char* what;
    std::string stack;  // where it was recorded (TORCH_TPU_FUSED_DEBUG=1)
    RunAlone alone;     // a collective's: how it runs when replayed
  };
  struct Value {
    std::weak_ptr<pjrt::Buffer> placeholder;
    int call, output;
  };
  struct Check {
    int value;  // a bool[messages.size()] value
    std::vector<std::string> messages;
  };

  // A recorded program's main: parameter and result types, and its text from
  // the parameter list on (what a window's function of it is made of).
  struct Signature {
    std::vector<std::string> params, results;
    std::string tail;
    // The module's other functions (Builder::add_function): (name, text).
    std::vector<std::pair<std::string, std::string>> functions;
  };

  void flush_locked(const char* reason);
  void clear();
  const Signature& signature(const Program& program);
  const std::string& value_type(int v);
  // How many references previous_ holds to each buffer.
  using Kept = std::unordered_map<const pjrt::Buffer*, long>;
  std::vector<std::pair<int, int>> donations(const std::vector<int>& live, const Kept& kept);
  std::string module_text(const std::vector<int>& live, const std::vector<std::pair<int, int>>& aliases,
                          bool with_checks);
  // Runs the calls one program at a time (after the window failed as a
  // whole). A call that fails fails alone: the calls before it and those
  // that do not read its results still fill their values, a storage it wrote
  // keeps its value from before; then the first failure is raised, naming its op.
  void replay(const std::vector<int>& live, const std::vector<pjrt::BufferPtr>& holders, const std::string& error);
  // The value index of a placeholder of this window, or -1.
  int value_index(const pjrt::Buffer& b) const;
  std::string sequence_key() const;
  int64_t check_count() const;  // the flags of checks_, all together

  Runtime& runtime_;
  std::mutex mutex_;
  const size_t limit_;
  const bool debug_;
  // Placeholders carry (generation << 32 | device << 24 | value);
  // generations are unique across windows, so a placeholder names its
  // window, and the device finds it in one step.
  std::atomic<uint64_t> generation_;
  const int device_;
  std::vector<Call> calls_;
  std::vector<Value> values_;
  std::vector<Check> checks_;  // their flags: the program's last output, one array
  std::vector<pjrt::BufferPtr> inputs_;
  std::unordered_map<PJRT_Buffer*, int> input_index_;
  std::vector<std::pair<int, int>> input_first_use_;   // (call, argument): where its type is declared
  std::unordered_map<int, pjrt::BufferPtr> previous_;  // value -> what its storage held before (replaced())
  std::string key_;
  std::unordered_map<uint64_t, Signature> signatures_;  // by program id
  std::unordered_set<size_t> compiled_sequences_;       // hashes of op sequences (recompile detection)
  std::unordered_set<uint64_t> graphs_;                 // ids of the compiled graphs recorded (record_graph)
  std::shared_ptr<const CollectiveGroup> group_;        // of the collectives recorded, if any
  // group_'s key hash and recording rank, readable without the lock (which a
  // rank waiting at a meeting holds): 0 when no collective is recorded.
  std::atomic<uint64_t> group_identity_{0};
};

}  // namespace torch_tpu::runtime
