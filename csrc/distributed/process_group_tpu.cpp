#include "distributed/process_group_tpu.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>

#include "aten/tensor_access.h"
#include "distributed/completed_work.h"

namespace torch_tpu::distributed {
namespace {

using collectives::Call;
using collectives::Kind;
using collectives::Reduction;
using runtime::Runtime;

void check_tpu(const at::Tensor& t, const char* op, const char* role) {
  TORCH_CHECK(t.defined(), "torch_tpu: ", op, ": the ", role, " tensor is undefined");
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "torch_tpu: ", op, ": the ", role, " tensor is on ",
              t.device(), ", but the tpu backend's collectives take tpu tensors; move it with .to(\"tpu\")");
}

const at::Tensor& one(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "torch_tpu: ", op, " takes one tensor per rank (each rank has one device), not ",
              tensors.size());
  check_tpu(tensors[0], op, "input");
  return tensors[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, int64_t numel_ratio) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "torch_tpu: ", op, ": the output is ", a.scalar_type(),
              " but the input is ", b.scalar_type(), "; they must have one dtype");
  TORCH_CHECK(a.numel() == b.numel() * numel_ratio, "torch_tpu: ", op, ": the output has ", a.numel(),
              " elements (shape ", a.sizes(), ") but must have ", b.numel() * numel_ratio, " (input shape ", b.sizes(),
              numel_ratio == 1 ? ")" : " times the group size)");
}

Reduction reduction_of(const c10d::ReduceOp& op, double* factor, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return Reduction::Sum;
    case c10d::ReduceOp::AVG: return Reduction::Avg;
    case c10d::ReduceOp::PRODUCT: return Reduction::Product;
    case c10d::ReduceOp::MIN: return Reduction::Min;
    case c10d::ReduceOp::MAX: return Reduction::Max;
    case c10d::ReduceOp::BAND: return Reduction::BitAnd;
    case c10d::ReduceOp::BOR: return Reduction::BitOr;
    case c10d::ReduceOp::BXOR: return Reduction::BitXor;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s, "torch_tpu: ", name, ": PREMUL_SUM without its factor");
      *factor = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      return Reduction::Sum;
    }
    default: TORCH_CHECK(false, "torch_tpu: ", name, ": ReduceOp ", static_cast<int>(op.op_), " is not supported");
  }
}

// TORCH_TPU_FUSED_COLLECTIVES=0: in Fused mode a collective flushes the
// window and runs as its own program (as in Strict mode) instead of joining it.
std::atomic<bool>& fused_collectives() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("TORCH_TPU_FUSED_COLLECTIVES");
    return !v || std::string(v) != "0";
  }()};
  return on;
}

// A flat tpu tensor of `numel` elements holding `value`.
at::Tensor flat(pjrt::BufferPtr value, int64_t numel, at::ScalarType dtype, int device) {
  return aten::wrap_buffer(std::move(value), {numel}, dtype, device);
}

// The tensors' elements one after another, as one flat tpu tensor.
at::Tensor concat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flats;
  for (const auto& t : tensors) flats.push_back(t.reshape({-1}));
  return at::cat(flats);
}

}  // namespace

ProcessGroupTPU::ProcessGroupTPU(int rank, int size, const std::string& group_key, std::chrono::milliseconds timeout,
                                 c10::intrusive_ptr<c10d::Backend> host, std::vector<std::string> places)
    : Backend(rank, size),
      places_(std::move(places)),
      host_(std::move(host)),
      rendezvous_(collectives::Rendezvous::of(group_key, size)),
      rendezvous_key_(group_key),
      timeout_(timeout) {}

std::optional<std::vector<pjrt::BufferPtr>> ProcessGroupTPU::launch(collectives::Rendezvous::Launch launch) {
  TORCH_CHECK(!host_,
              "torch_tpu: a compiled graph with collectives runs as one program over the group's devices, "
              "but this group's ranks are processes (host staging); it runs eagerly instead");
  for (const auto& a : launch.args) Runtime::get().resolve(*a, "collective");
  WithoutGil unlocked;
  try {
    return rendezvous_->launch(seq_++, rank_, std::move(launch), timeout_);
  } catch (const collectives::Diverged&) {
    return std::nullopt;
  } catch (const collectives::GroupError& e) {
    TORCH_CHECK(false, e.what());
  }
}

pjrt::BufferPtr ProcessGroupTPU::record(const Call& call, int device, pjrt::BufferPtr value) {
  auto& runtime = Runtime::get();
  auto program = runtime.program(
      "collective|" + call.key(), [&call] { return collectives::build(call); }, /*indexed=*/false);
  // The window holds the group (and so this backend) until it runs.
  auto self = c10::intrusive_ptr<ProcessGroupTPU>::reclaim_copy(this);
  auto group = std::make_shared<runtime::CollectiveGroup>();
  group->key = rendezvous_key_;
  group->size = size_;
  group->rank = rank_;
  group->launch = [self](const std::string& key, const std::function<runtime::ProgramSpec()>& build,
                         const std::vector<pjrt::BufferPtr>& args,
                         int device) -> std::optional<std::vector<pjrt::BufferPtr>> {
    collectives::Rendezvous::Launch launch{key,
                                           "a Fused window holding collectives",
                                           build,
                                           device,
                                           args,
                                           /*may_diverge=*/true};
    WithoutGil unlocked;
    try {
      return self->rendezvous_->launch(self->seq_++, self->rank_, std::move(launch), self->timeout_);
    } catch (const collectives::Diverged&) {
      return std::nullopt;
    } catch (const collectives::GroupError& e) {
      TORCH_CHECK(false, e.what());
    }
  };
  auto alone = [self, call, device](const std::vector<pjrt::BufferPtr>& args) {
    return std::vector<pjrt::BufferPtr>{self->join_recorded(call, device, args.at(0))};
  };
  return runtime.record_collective(program, {std::move(value)}, device, collectives::name(call.kind), group, alone)
      .at(0);
}

pjrt::BufferPtr ProcessGroupTPU::join_recorded(const Call& call, int device, pjrt::BufferPtr value) {
  WithoutGil unlocked;
  // Every rank's next un-run collective is this one: after a meeting where
  // some brought a window, everyone brings this call alone (see README).
  for (int tries = 0;; ++tries) {
    try {
      return rendezvous_->join(seq_++, rank_, call, device, value, timeout_, /*recorded=*/true);
    } catch (const collectives::Diverged& e) {
      TORCH_CHECK(tries < 1000, "torch_tpu: ", collectives::describe(call, device),
                  ": the ranks' Fused windows kept differing; ", e.what());
    } catch (const collectives::GroupError& e) {
      TORCH_CHECK(false, e.what());
    }
  }
}

void ProcessGroupTPU::flush_window(int device) {
  if (!host_ && Runtime::get().mode() == runtime::EagerMode::Fused) Runtime::get().flush(device, "collective");
}

bool ProcessGroupTPU::set_fused_collectives(bool on) { return fused_collectives().exchange(on); }

void ProcessGroupTPU::abort() { rendezvous_->abort("torch_tpu: rank " + std::to_string(rank_) + " aborted the group"); }

Call ProcessGroupTPU::call_of(Kind kind, const at::Tensor& t) const {
  Call call;
  call.kind = kind;
  call.dtype = aten::to_dtype(t.scalar_type());
  call.numel = t.numel();
  call.size = size_;
  return call;
}

pjrt::BufferPtr ProcessGroupTPU::run(Call call, const at::Tensor& input, const char* op) {
  if (std::string why = call.invalid(); !why.empty()) TORCH_CHECK(false, "torch_tpu: ", op, ": ", why);
  // Counted here, once per call: a recorded collective replayed alone is not counted again.
  Runtime::get().count(std::string("collective::") + collectives::name(call.kind));
  Runtime::get().count(std::string("collective_bytes::") + collectives::name(call.kind),
                       call.numel * static_cast<int64_t>(stablehlo::byte_size(call.dtype)));
  if (host_) return staged(call, input);
  auto value = aten::read_dense(input);
  const int device = aten::device_index(input);
  if (Runtime::get().mode() == runtime::EagerMode::Fused && fused_collectives()) return record(call, device, value);
  Runtime::get().resolve(*value, "collective");
  WithoutGil unlocked;
  try {
    return rendezvous_->join(seq_++, rank_, call, device, value, timeout_);
  } catch (const collectives::GroupError& e) {
    TORCH_CHECK(false, e.what());
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = one(tensors, "all_reduce");
  Call call = call_of(Kind::AllReduce, t);
  call.reduction = reduction_of(opts.reduceOp, &call.factor, "all_reduce");
  aten::write_dense(t, run(call, t, "all_reduce"));
  return done(rank_, c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> single{t};
    allreduce(single, opts);
  }
  return done(rank_, c10d::OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = one(tensors, "broadcast");
  Call call = call_of(Kind::Broadcast, t);
  call.root = opts.rootRank;
  aten::write_dense(t, run(call, t, "broadcast"));
  return done(rank_, c10d::OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const at::Tensor& t = one(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "torch_tpu: reduce: root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  Call call = call_of(Kind::AllReduce, t);
  call.reduction = reduction_of(opts.reduceOp, &call.factor, "reduce");
  auto result = run(call, t, "reduce");
  if (rank_ == opts.rootRank) aten::write_dense(t, result);  // other ranks keep their input, as NCCL
  return done(rank_, c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& /*opts*/) {
  check_tpu(input, "all_gather_into_tensor", "input");
  check_tpu(output, "all_gather_into_tensor", "output");
  check_same(output, input, "all_gather_into_tensor", size_);
  aten::write_dense(output, run(call_of(Kind::AllGather, input), input, "all_gather_into_tensor"));
  return done(rank_, c10d::OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& /*opts*/) {
  const at::Tensor& in = one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "torch_tpu: all_gather: needs one output list of ", size_, " tensors (the group size)");
  for (auto& o : outputs[0]) {
    check_tpu(o, "all_gather", "output");
    check_same(o, in, "all_gather", 1);
  }
  auto gathered = flat(run(call_of(Kind::AllGather, in), in, "all_gather"), size_ * in.numel(), in.scalar_type(),
                       aten::device_index(in));
  for (int r = 0; r < size_; ++r)
    outputs[0][r].copy_(gathered.narrow(0, r * in.numel(), in.numel()).view(outputs[0][r].sizes()));
  return done(rank_, c10d::OpType::ALLGATHER, outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "torch_tpu: all_gather_coalesced: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> out{outputs[i]};
    std::vector<at::Tensor> in{inputs[i]};
    allgather(out, in, opts);
  }
  return done(rank_, c10d::OpType::ALLGATHER_COALESCED, inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "torch_tpu: all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  return done(rank_, c10d::OpType::COALESCED, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  const at::Tensor& in = one(inputs, "gather");
  const bool root = rank_ == opts.rootRank;
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "torch_tpu: gather: root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  if (root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "torch_tpu: gather: the root needs one output list of ", size_, " tensors (the group size)");
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "torch_tpu: gather: only the root (rank ", opts.rootRank, ") passes output tensors");
  }
  if (root)
    for (auto& o : outputs[0]) {
      check_tpu(o, "gather", "output");
      check_same(o, in, "gather", 1);
    }
  auto gathered = run(call_of(Kind::AllGather, in), in, "gather");
  if (root) {
    auto all = flat(gathered, size_ * in.numel(), in.scalar_type(), aten::device_index(in));
    for (int r = 0; r < size_; ++r)
      outputs[0][r].copy_(all.narrow(0, r * in.numel(), in.numel()).view(outputs[0][r].sizes()));
  }
  return done(rank_, c10d::OpType::GATHER, root ? outputs[0] : std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const at::Tensor& out = one(outputs, "scatter");
  const bool root = rank_ == opts.rootRank;
  if (root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "torch_tpu: scatter: the root needs one input list of ", size_, " tensors (the group size)");
    for (auto& i : inputs[0]) {
      check_tpu(i, "scatter", "input");
      check_same(out, i, "scatter", 1);
    }
  }
  // Non-roots send zeros: every rank of the program passes a block per rank.
  at::Tensor send = root ? concat(inputs[0]) : at::zeros({size_ * out.numel()}, out.options());
  Call call = call_of(Kind::Scatter, send);
  call.root = opts.rootRank;
  aten::write_dense(out, run(call, send, "scatter"));
  return done(rank_, c10d::OpType::SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  check_tpu(input, "reduce_scatter_tensor", "input");
  check_tpu(output, "reduce_scatter_tensor", "output");
  check_same(input, output, "reduce_scatter_tensor", size_);
  Call call = call_of(Kind::ReduceScatter, input);
  call.reduction = reduction_of(opts.reduceOp, &call.factor, "reduce_scatter");
  aten::write_dense(output, run(call, input, "reduce_scatter_tensor"));
  return done(rank_, c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "torch_tpu: reduce_scatter: needs one input list of ", size_, " tensors (the group size)");
  for (auto& i : inputs[0]) {
    check_tpu(i, "reduce_scatter", "input");
    check_same(out, i, "reduce_scatter", 1);
  }
  at::Tensor in = concat(inputs[0]);
  at::Tensor result = out;
  _reduce_scatter_base(result, in, opts);
  return done(rank_, c10d::OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "torch_tpu: reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  return done(rank_, c10d::OpType::COALESCED, outputs);
}

at::Tensor ProcessGroupTPU::uneven_all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                                              const std::vector<int64_t>& recv_counts, const char* op) {
  // One collective program must fit every rank: each chunk is padded to the
  // group's largest chunk (agreed by a MAX all_reduce), exchanged as an equal
  // all_to_all, and the padding dropped again.
  const int device = aten::device_index(send);
  int64_t largest = 0;
  for (int r = 0; r < size_; ++r) largest = std::max({largest, send_counts[r], recv_counts[r]});
  at::Tensor local = at::full({1}, largest, send.options().dtype(at::kLong));
  Call agree = call_of(Kind::AllReduce, local);
  agree.reduction = Reduction::Max;
  const int64_t chunk = flat(run(agree, local, op), 1, at::kLong, device).item<int64_t>();
  at::Tensor padded = at::zeros({size_, chunk}, send.options());
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    padded[r].narrow(0, 0, send_counts[r]).copy_(send.narrow(0, offset, send_counts[r]));
    offset += send_counts[r];
  }
  at::Tensor received =
      flat(run(call_of(Kind::AllToAll, padded), padded, op), padded.numel(), send.scalar_type(), device)
          .view({size_, chunk});
  std::vector<at::Tensor> parts;
  for (int r = 0; r < size_; ++r) parts.push_back(received[r].narrow(0, 0, recv_counts[r]));
  return at::cat(parts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& /*opts*/) {
  check_tpu(input, "all_to_all_single", "input");
  check_tpu(output, "all_to_all_single", "output");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "torch_tpu: all_to_all_single: the output is ",
              output.scalar_type(), " but the input is ", input.scalar_type(), "; they must have one dtype");
  TORCH_CHECK(input.dim() > 0 && output.dim() > 0,
              "torch_tpu: all_to_all_single: input and output need a first "
              "dimension to split (shapes ",
              input.sizes(), " and ", output.sizes(), ")");
  // Rows per peer; no split sizes: dim 0 in group-size equal parts.
  auto rows = [&](std::vector<int64_t> splits, const at::Tensor& t, const char* role) {
    if (splits.empty()) {
      TORCH_CHECK(t.size(0) % size_ == 0, "torch_tpu: all_to_all_single: the ", role, "'s first dimension (shape ",
                  t.sizes(), ") must split into ", size_, " equal chunks (the group size), or pass ", role,
                  "_split_sizes");
      splits.assign(size_, t.size(0) / size_);
    }
    int64_t total = 0;
    for (int64_t s : splits) {
      TORCH_CHECK(s >= 0, "torch_tpu: all_to_all_single: ", role, "_split_sizes ", splits, " has a negative size");
      total += s;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_ && total == t.size(0), "torch_tpu: all_to_all_single: ", role,
                "_split_sizes ", splits, " must have ", size_, " entries (the group size) that sum to the ", role,
                "'s first dimension ", t.size(0), " (shape ", t.sizes(), ")");
    return splits;
  };
  const auto sent = rows(input_split_sizes, input, "input");
  const auto got = rows(output_split_sizes, output, "output");
  auto row_of = [](const at::Tensor& t) { return t.size(0) ? t.numel() / t.size(0) : int64_t{-1}; };
  const int64_t in_row = row_of(input), out_row = row_of(output);
  TORCH_CHECK(in_row < 0 || out_row < 0 || in_row == out_row, "torch_tpu: all_to_all_single: input rows (shape ",
              input.sizes(), ") and output rows (shape ", output.sizes(), ") must have one size");
  const int64_t row = std::max<int64_t>(std::max(in_row, out_row), 0);
  if (sent == got && std::all_of(sent.begin(), sent.end(), [&](int64_t s) { return s == sent[0]; })) {
    aten::write_dense(output, run(call_of(Kind::AllToAll, input), input, "all_to_all_single"));
    return done(rank_, c10d::OpType::ALLTOALL_BASE, {output});
  }
  std::vector<int64_t> send_counts, recv_counts;
  for (int r = 0; r < size_; ++r) {
    send_counts.push_back(sent[r] * row);
    recv_counts.push_back(got[r] * row);
  }
  output.copy_(
      uneven_all_to_all(input.reshape({-1}), send_counts, recv_counts, "all_to_all_single").view(output.sizes()));
  return done(rank_, c10d::OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& /*opts*/) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "torch_tpu: all_to_all: needs ", size_, " inputs and outputs (the group size), got ", inputs.size(),
              " and ", outputs.size());
  bool equal = true;
  for (int r = 0; r < size_; ++r) {
    check_tpu(inputs[r], "all_to_all", "input");
    check_tpu(outputs[r], "all_to_all", "output");
    TORCH_CHECK(
        inputs[r].scalar_type() == inputs[0].scalar_type() && outputs[r].scalar_type() == inputs[0].scalar_type(),
        "torch_tpu: all_to_all: every input and output must have one dtype (input 0 is ", inputs[0].scalar_type(),
        ", input ", r, " ", inputs[r].scalar_type(), ", output ", r, " ", outputs[r].scalar_type(), ")");
    equal = equal && inputs[r].numel() == inputs[0].numel() && outputs[r].numel() == inputs[0].numel();
  }
  at::Tensor send = concat(inputs);
  at::Tensor received;
  if (equal) {
    received = flat(run(call_of(Kind::AllToAll, send), send, "all_to_all"), send.numel(), send.scalar_type(),
                    aten::device_index(send));
  } else {
    std::vector<int64_t> send_counts, recv_counts;
    for (int r = 0; r < size_; ++r) {
      send_counts.push_back(inputs[r].numel());
      recv_counts.push_back(outputs[r].numel());
    }
    received = uneven_all_to_all(send, send_counts, recv_counts, "all_to_all");
  }
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    outputs[r].copy_(received.narrow(0, offset, outputs[r].numel()).view(outputs[r].sizes()));
    offset += outputs[r].numel();
  }
  return done(rank_, c10d::OpType::ALLTOALL, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = one(tensors, "send");
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "torch_tpu: send: destination rank ", dst,
              " is not another rank of this group of ", size_);
  if (host_) {
    std::vector<at::Tensor> cpu{t.cpu()};
    await_host(host_->send(cpu, dst, tag), "send");
    return done(rank_, c10d::OpType::SEND, tensors);
  }
  auto value = aten::read_dense(t);
  Runtime::get().resolve(*value, "collective");
  rendezvous_->send(rank_, dst, tag, {value, aten::to_dtype(t.scalar_type()), t.numel()});
  return done(rank_, c10d::OpType::SEND, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = one(tensors, "recv");
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "torch_tpu: recv: source rank ", src,
              " is not another rank of this group of ", size_);
  if (host_) {
    std::vector<at::Tensor> cpu{at::empty(t.sizes(), t.options().device(at::kCPU))};
    await_host(host_->recv(cpu, src, tag), "recv");
    t.copy_(cpu[0]);
    return done(rank_, c10d::OpType::RECV, tensors);
  }
  flush_window(aten::device_index(t));
  collectives::Rendezvous::Message message;
  {
    WithoutGil unlocked;
    try {
      message = rendezvous_->recv(src, rank_, tag, timeout_);
    } catch (const collectives::GroupError& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  TORCH_CHECK(message.dtype == aten::to_dtype(t.scalar_type()) && message.numel == t.numel(),
              "torch_tpu: recv from rank ", src, ": rank ", src, " sent ", message.numel, " elements of ",
              aten::to_scalar_type(message.dtype), ", the receiving tensor has ", t.numel(), " of ", t.scalar_type(),
              "; send and recv tensors must match");
  aten::write_dense(t, message.value->copy_to_device(Runtime::get().device(aten::device_index(t))));
  return done(rank_, c10d::OpType::RECV, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTPU::barrier(const c10d::BarrierOptions& /*opts*/) {
  if (host_) {
    agree(nullptr, -1);  // everyone came, and all to a barrier
    return done(rank_, c10d::OpType::BARRIER, {});
  }
  flush_window(c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index());
  {
    WithoutGil unlocked;
    try {
      rendezvous_->meet(seq_++, rank_, timeout_);
    } catch (const collectives::GroupError& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  return done(rank_, c10d::OpType::BARRIER, {});
}

}  // namespace torch_tpu::distributed
