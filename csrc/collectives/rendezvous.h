// Where the ranks of one group meet when they are threads of this process
// (one device each, one PJRT client): the last rank to reach a collective (or
// a compiled graph holding collectives) checks that every rank called the
// same one, launches its program once over all their devices, and hands each
// rank its outputs. Torch-free.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/programs.h"

namespace torch_tpu::collectives {

// A rank that never came, a mismatch between the ranks' calls, an abort:
// raised on every rank of the collective.
struct GroupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The ranks launched different programs that each may replace by its own
// eager form (compiled graphs traced with rank-dependent constants): nothing
// ran, and every rank of the meeting gets this.
struct Diverged : GroupError {
  using GroupError::GroupError;
};

class Rendezvous {
 public:
  // The meeting point of the group named `key` (every rank passes the same
  // key and size); it lives while a rank holds it.
  static std::shared_ptr<Rendezvous> of(const std::string& key, int size);

  // A program every rank of the group runs at once, one partition each.
  struct Launch {
    std::string key;   // identifies the program: the ranks' keys must be equal
    std::string what;  // this rank's call, as a mismatch error lists it
    std::function<runtime::ProgramSpec()> build;
    int device = -1;
    std::vector<pjrt::BufferPtr> args;
    // When every rank's launch may, programs that differ raise Diverged (not
    // a mismatch): the ranks then run their own eager forms.
    bool may_diverge = false;
    // A collective a Fused window recorded, run on its own (the window was
    // replayed): it may meet other ranks' windows (Diverged), but a meeting
    // of only such calls that differ is a mismatch.
    bool alone = false;
  };
  // Rank `rank`'s `seq`-th meeting: blocks until every rank joined (the last
  // one runs the program over their devices) and returns this rank's outputs,
  // or throws GroupError naming the ranks that did not come within `timeout`.
  std::vector<pjrt::BufferPtr> launch(uint64_t seq, int rank, Launch launch, std::chrono::milliseconds timeout);
  // A collective: `call` on `input` (on `device`); returns the flat result.
  // `recorded`: a collective a Fused window recorded (Launch::alone).
  pjrt::BufferPtr join(uint64_t seq, int rank, const Call& call, int device, pjrt::BufferPtr input,
                       std::chrono::milliseconds timeout, bool recorded = false);
  // A barrier: the `seq`-th meeting, no data.
  void meet(uint64_t seq, int rank, std::chrono::milliseconds timeout);

  // Point to point: send never waits; recv waits for the matching send
  // (messages of one (src, dst, tag) arrive in order). A message is a flat
  // value of `numel` elements of `dtype`.
  struct Message {
    pjrt::BufferPtr value;
    DType dtype = DType::Float32;
    int64_t numel = 0;
  };
  void send(int src, int dst, int tag, Message message);
  Message recv(int src, int dst, int tag, std::chrono::milliseconds timeout);

  // Fails every waiting and later meeting with `why` (a rank raised).
  void abort(const std::string& why);

  int size() const { return size_; }

 private:
  Rendezvous(std::string key, int size) : key_(std::move(key)), size_(size) {}
  struct Arrival {
    bool joined = false;
    Launch launch;  // key empty: a barrier
  };
  struct Slot {
    std::vector<Arrival> ranks;
    int arrived = 0, left = 0;
    bool done = false, diverged = false;
    std::string error;
    std::vector<std::vector<pjrt::BufferPtr>> outputs;  // per rank
  };
  // Waits (lock held) for the slot to finish; the last arriver calls `run`.
  void wait_or_run(std::unique_lock<std::mutex>& lock, uint64_t seq, int rank, Slot& slot,
                   std::chrono::milliseconds timeout, const char* what);
  void run(Slot& slot);  // the last arriver, without the lock
  std::string mismatch(const Slot& slot) const;

  std::string key_;
  int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Slot> slots_;
  std::map<std::tuple<int, int, int>, std::vector<Message>> mail_;
  std::string aborted_;
};

}  // namespace torch_tpu::collectives
