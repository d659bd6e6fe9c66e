// Host staging: a collective's tensors go through host memory and a gloo
// group. For ranks in separate processes on a plugin without multi-process
// collectives (the CPU plugin). Emulates what gloo lacks: AVG, PREMUL_SUM,
// reductions of bool; reduce_scatter and scatter reduce or broadcast
// everything and keep this rank's block.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "aten/tensor_access.h"
#include "distributed/completed_work.h"
#include "distributed/process_group_tpu.h"

namespace torch_tpu::distributed {
namespace {

using collectives::Kind;
using collectives::Reduction;

c10d::ReduceOp gloo_op(Reduction r, bool is_bool) {
  if (is_bool) {  // as uint8: or is max, and is min
    if (r == Reduction::Sum || r == Reduction::Max || r == Reduction::BitOr) return c10d::ReduceOp::MAX;
    if (r == Reduction::Product || r == Reduction::Min || r == Reduction::BitAnd) return c10d::ReduceOp::MIN;
  }
  switch (r) {
    case Reduction::Sum:
    case Reduction::Avg: return c10d::ReduceOp::SUM;
    case Reduction::Product: return c10d::ReduceOp::PRODUCT;
    case Reduction::Min: return c10d::ReduceOp::MIN;
    case Reduction::Max: return c10d::ReduceOp::MAX;
    case Reduction::BitAnd: return c10d::ReduceOp::BAND;
    case Reduction::BitOr: return c10d::ReduceOp::BOR;
    case Reduction::BitXor: return c10d::ReduceOp::BXOR;
  }
  return c10d::ReduceOp::SUM;
}

// Whether process `pid` of this host has ended (gone, or a zombie not yet reaped).
bool exited(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');  // the state follows the command name
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

// A call as int64 words, for comparing across ranks: kind (-1: barrier),
// reduction, dtype, numel, root, factor's bits, device.
std::vector<int64_t> words(const collectives::Call* call, int device) {
  if (!call) return {-1, 0, 0, 0, 0, 0, device};
  int64_t factor = 0;
  std::memcpy(&factor, &call->factor, sizeof factor);
  return {static_cast<int64_t>(call->kind),
          static_cast<int64_t>(call->reduction),
          static_cast<int64_t>(call->dtype),
          call->numel,
          call->root,
          factor,
          device};
}

std::string describe_words(const int64_t* w) {
  if (w[0] < 0) return "barrier";
  collectives::Call call;
  call.kind = static_cast<Kind>(w[0]);
  call.reduction = static_cast<Reduction>(w[1]);
  call.dtype = static_cast<stablehlo::DType>(w[2]);
  call.numel = w[3];
  call.root = w[4];
  return collectives::describe(call, static_cast<int>(w[6]));
}

}  // namespace

std::string ProcessGroupTPU::exited_ranks() const {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string gone;
  for (size_t r = 0; r < places_.size(); ++r) {
    const auto colon = places_[r].rfind(':');
    if (static_cast<int>(r) == rank_ || colon == std::string::npos || places_[r].substr(0, colon) != name) continue;
    const int64_t pid = std::stoll(places_[r].substr(colon + 1));
    if (exited(pid)) gone += (gone.empty() ? "" : ", ") + std::to_string(r) + " (pid " + std::to_string(pid) + ")";
  }
  return gone;
}

void ProcessGroupTPU::await_host(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const {
  try {
    WithoutGil unlocked;
    work->wait();
  } catch (const std::exception& e) {
    const std::string gone = exited_ranks();
    TORCH_CHECK(false, "torch_tpu: ", op, " through host memory and gloo failed on rank ", rank_, ": ", e.what(),
                gone.empty() ? std::string()
                             : "\nThe process of rank " + gone + " has exited: it died or returned without this " + op +
                                   "; the group cannot go on without it.");
  }
}

void ProcessGroupTPU::agree(const collectives::Call* call, int device) {
  const std::vector<int64_t> mine = words(call, device);
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<at::Tensor> in{at::tensor(mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < size_; ++r) all[0].push_back(at::empty({n}, at::kLong));
  await_host(host_->allgather(all, in), call ? collectives::name(call->kind) : "barrier");
  bool same = true;
  for (int r = 0; r < size_; ++r)  // the device may differ: each process has its own
    same = same && std::equal(mine.begin(), mine.end() - 1, all[0][r].data_ptr<int64_t>());
  if (same) return;
  std::vector<std::string> calls;
  for (int r = 0; r < size_; ++r) calls.push_back(describe_words(all[0][r].data_ptr<int64_t>()));
  TORCH_CHECK(false, collectives::mismatch_message(calls));
}

pjrt::BufferPtr ProcessGroupTPU::staged(const collectives::Call& call, const at::Tensor& input) {
  auto& runtime = runtime::Runtime::get();
  const int64_t bytes = static_cast<int64_t>(input.numel() * input.element_size());
  runtime.count("host_staging_bytes", bytes);
  const auto start = std::chrono::steady_clock::now();
  const char* op = collectives::name(call.kind);
  agree(&call, aten::device_index(input));
  const bool is_bool = input.scalar_type() == at::kBool;
  at::Tensor x = input.reshape({-1}).cpu();
  if (is_bool) x = x.to(at::kByte);
  std::vector<at::Tensor> xs{x};
  at::Tensor out;
  const int64_t block = call.numel / size_;
  switch (call.kind) {
    case Kind::AllReduce:
    case Kind::ReduceScatter: {
      if (call.factor != 1) x.mul_(call.factor);
      c10d::AllreduceOptions options;
      options.reduceOp = gloo_op(call.reduction, is_bool);
      await_host(host_->allreduce(xs, options), op);
      if (call.reduction == Reduction::Avg)
        x = x.is_floating_point() ? x.div(size_) : x.div(size_, "trunc");  // integers: as NCCL's average
      out = call.kind == Kind::AllReduce ? x : x.narrow(0, rank_ * block, block);
      break;
    }
    case Kind::Broadcast:
    case Kind::Scatter: {
      c10d::BroadcastOptions options;
      options.rootRank = call.root;
      await_host(host_->broadcast(xs, options), op);
      out = call.kind == Kind::Broadcast ? x : x.narrow(0, rank_ * block, block);
      break;
    }
    case Kind::AllGather: {
      std::vector<std::vector<at::Tensor>> parts(1);
      for (int r = 0; r < size_; ++r) parts[0].push_back(at::empty_like(x));
      await_host(host_->allgather(parts, xs), op);
      out = at::cat(parts[0]);
      break;
    }
    case Kind::AllToAll: {
      out = at::empty_like(x);
      std::vector<int64_t> equal;
      await_host(host_->alltoall_base(out, x, equal, equal), op);
      break;
    }
  }
  if (is_bool) out = out.to(at::kBool);
  auto result = aten::upload(out.contiguous(), aten::device_index(input));
  runtime.count(
      "host_staging_us",
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
  return result;
}

}  // namespace torch_tpu::distributed
