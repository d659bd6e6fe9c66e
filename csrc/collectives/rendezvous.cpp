#include "collectives/rendezvous.h"

#include <set>
#include <sstream>

namespace torch_tpu::collectives {
namespace {

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream s;
  s.precision(3);
  s << static_cast<double>(t.count()) / 1000 << " s";
  return s.str();
}

}  // namespace

std::shared_ptr<Rendezvous> Rendezvous::of(const std::string& key, int size) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<Rendezvous>> groups;
  std::lock_guard<std::mutex> lock(mutex);
  auto& weak = groups[key];
  auto group = weak.lock();
  if (!group) {
    group = std::shared_ptr<Rendezvous>(new Rendezvous(key, size));
    weak = group;
  } else if (group->size_ != size) {
    throw std::invalid_argument("torch_tpu: ranks disagree on the size of process group '" + key +
                                "': " + std::to_string(group->size_) + " and " + std::to_string(size));
  }
  return group;
}

std::vector<pjrt::BufferPtr> Rendezvous::launch(uint64_t seq, int rank, Launch launch,
                                                std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!aborted_.empty()) throw GroupError(aborted_);
  Slot& slot = slots_[seq];
  if (slot.ranks.empty()) {
    slot.ranks.resize(size_);
    slot.outputs.resize(size_);
  }
  const std::string what = launch.key.empty() ? "barrier" : launch.what;
  slot.ranks.at(rank) = {true, std::move(launch)};
  ++slot.arrived;
  wait_or_run(lock, seq, rank, slot, timeout, what.c_str());
  std::vector<pjrt::BufferPtr> out = std::move(slot.outputs[rank]);
  std::string error = slot.error;
  const bool diverged = slot.diverged;
  if (++slot.left == size_) slots_.erase(seq);
  if (diverged) throw Diverged(error);
  if (!error.empty()) throw GroupError(error);
  return out;
}

pjrt::BufferPtr Rendezvous::join(uint64_t seq, int rank, const Call& call, int device, pjrt::BufferPtr input,
                                 std::chrono::milliseconds timeout, bool recorded) {
  Launch l{call.key(), describe(call, device), [call] { return build(call); }, device, {std::move(input)}, recorded,
           recorded};
  return launch(seq, rank, std::move(l), timeout).at(0);
}

void Rendezvous::meet(uint64_t seq, int rank, std::chrono::milliseconds timeout) { launch(seq, rank, {}, timeout); }

void Rendezvous::wait_or_run(std::unique_lock<std::mutex>& lock, uint64_t seq, int rank, Slot& slot,
                             std::chrono::milliseconds timeout, const char* what) {
  if (slot.arrived == size_ && !slot.done) {
    lock.unlock();
    run(slot);
    lock.lock();
    slot.done = true;
    changed_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!slot.done) {
    if (!aborted_.empty()) {
      slot.error = aborted_;
      slot.done = true;
      changed_.notify_all();
      break;
    }
    const bool timed_out = changed_.wait_until(lock, deadline) == std::cv_status::timeout;
    // Once everyone came, the last rank is running the program: wait for it.
    if (timed_out && !slot.done && slot.arrived < size_) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (!slot.ranks[r].joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      slot.error = "torch_tpu: rank " + std::to_string(rank) + " waited " + seconds(timeout) + " at " + what +
                   " (collective #" + std::to_string(seq) + " of its process group) for ranks [" + missing +
                   "], which did not call it: a rank died, hangs, or skipped this collective (the timeout is "
                   "init_process_group's timeout).";
      slot.done = true;
      changed_.notify_all();
    }
  }
}

std::string Rendezvous::mismatch(const Slot& slot) const {
  const Launch& first = slot.ranks[0].launch;
  bool same = true;
  for (const auto& a : slot.ranks) same = same && a.launch.key == first.key;
  std::set<int> devices;
  for (const auto& a : slot.ranks) devices.insert(a.launch.device);
  const bool distinct = first.key.empty() || devices.size() == slot.ranks.size();
  if (same && distinct) return {};
  std::vector<std::string> calls;
  std::string list;
  for (size_t r = 0; r < slot.ranks.size(); ++r) {
    const Launch& l = slot.ranks[r].launch;
    calls.push_back(l.key.empty() ? "barrier" : l.what);
    list += "\n  rank " + std::to_string(r) + ": " + calls.back();
  }
  if (!same) return mismatch_message(calls);
  return "torch_tpu: two ranks of a process group use the same device:" + list +
         "\nEach rank needs its own device: call torch.tpu.set_device(rank) in each rank.";
}

void Rendezvous::run(Slot& slot) {
  try {
    if (std::string why = mismatch(slot); !why.empty()) {
      bool may_diverge = true, all_alone = true;
      std::set<int> devices;
      for (const auto& a : slot.ranks) {
        may_diverge = may_diverge && a.launch.may_diverge;
        all_alone = all_alone && a.launch.alone;
        devices.insert(a.launch.device);
      }
      slot.diverged = may_diverge && !all_alone && devices.size() == slot.ranks.size();
      throw GroupError(why);
    }
    const Launch& first = slot.ranks[0].launch;
    if (first.key.empty()) return;  // a barrier
    std::vector<int> devices;
    std::vector<std::vector<pjrt::BufferPtr>> args;
    for (auto& a : slot.ranks) {
      devices.push_back(a.launch.device);
      args.push_back(std::move(a.launch.args));
    }
    auto& runtime = runtime::Runtime::get();
    auto program = runtime.multi_device_program(first.key, devices, first.build);
    slot.outputs = runtime.execute_on_devices(*program, args, first.what.c_str());
  } catch (const std::exception& e) {
    slot.error = e.what();
  }
}

void Rendezvous::send(int src, int dst, int tag, Message message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!aborted_.empty()) throw GroupError(aborted_);
  mail_[{src, dst, tag}].push_back(std::move(message));
  changed_.notify_all();
}

Rendezvous::Message Rendezvous::recv(int src, int dst, int tag, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& box = mail_[{src, dst, tag}];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (box.empty()) {
    if (!aborted_.empty()) throw GroupError(aborted_);
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && box.empty())
      throw GroupError("torch_tpu: rank " + std::to_string(dst) + " waited " + seconds(timeout) +
                       " in recv for a send from rank " + std::to_string(src) + " (tag " + std::to_string(tag) +
                       ") that never came: a rank died, hangs, or sent elsewhere.");
  }
  Message message = std::move(box.front());
  box.erase(box.begin());
  return message;
}

void Rendezvous::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.empty()) aborted_ = why.empty() ? "torch_tpu: the process group was aborted" : why;
  changed_.notify_all();
}

}  // namespace torch_tpu::collectives
