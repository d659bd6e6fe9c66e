// Host staging: a collective's tensors go through host memory and a gloo
// group. For ranks in separate processes on a plugin without multi-process
// collectives (the CPU plugin). Emulates what gloo lacks: AVG, PREMUL_SUM,
// reductions of bool; reduce_scatter and scatter reduce or broadcast
// everything and keep this rank's block.
#include <algorithm>
#include <chrono>
#include <cstring>

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

// Waits for a gloo call; its failure (a peer that died: "Connection closed
// by peer") is raised naming our op and rank.
void await(const c10::intrusive_ptr<c10d::Work>& work, const char* op, int rank) {
  try {
    WithoutGil unlocked;
    work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torch_tpu: ", op, " through host memory and gloo failed on rank ", rank, ": ", e.what());
  }
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

void ProcessGroupTPU::agree(const collectives::Call* call, int device) {
  const std::vector<int64_t> mine = words(call, device);
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<at::Tensor> in{at::tensor(mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < size_; ++r) all[0].push_back(at::empty({n}, at::kLong));
  await(host_->allgather(all, in), call ? collectives::name(call->kind) : "barrier", rank_);
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
  runtime.count(std::string("collective::") + collectives::name(call.kind));
  runtime.count(std::string("collective_bytes::") + collectives::name(call.kind), bytes);
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
      await(host_->allreduce(xs, options), op, rank_);
      if (call.reduction == Reduction::Avg)
        x = x.is_floating_point() ? x.div(size_) : x.div(size_, "trunc");  // integers: as NCCL's average
      out = call.kind == Kind::AllReduce ? x : x.narrow(0, rank_ * block, block);
      break;
    }
    case Kind::Broadcast:
    case Kind::Scatter: {
      c10d::BroadcastOptions options;
      options.rootRank = call.root;
      await(host_->broadcast(xs, options), op, rank_);
      out = call.kind == Kind::Broadcast ? x : x.narrow(0, rank_ * block, block);
      break;
    }
    case Kind::AllGather: {
      std::vector<std::vector<at::Tensor>> parts(1);
      for (int r = 0; r < size_; ++r) parts[0].push_back(at::empty_like(x));
      await(host_->allgather(parts, xs), op, rank_);
      out = at::cat(parts[0]);
      break;
    }
    case Kind::AllToAll: {
      out = at::empty_like(x);
      std::vector<int64_t> equal;
      await(host_->alltoall_base(out, x, equal, equal), op, rank_);
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
