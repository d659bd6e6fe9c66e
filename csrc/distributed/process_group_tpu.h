// ProcessGroupTPU: the c10d backend of device "tpu", with two transports.
// XLA: every collective is an XLA collective program over the group's devices
// (csrc/collectives/); the ranks are threads of this process, one device
// each, meeting at a collectives::Rendezvous. Host staging (where the ranks
// are processes and the plugin has no multi-process collectives, as the CPU
// plugin): the tensors go through host memory and a gloo group.
// Results are written into the callers' tensors before the call returns, so
// each Work is complete when handed out.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "collectives/rendezvous.h"

namespace torch_tpu::distributed {

// Hidden, like pybind11's own types: only this extension names it.
class __attribute__((visibility("hidden"))) ProcessGroupTPU final : public c10d::Backend {
 public:
  // `group_key` names the group in this process (every rank passes the same);
  // `host`, if given, is the gloo group of host staging; `places[r]` is
  // "hostname:pid" of rank r's process (to name a rank that died).
  ProcessGroupTPU(int rank, int size, const std::string& group_key, std::chrono::milliseconds timeout,
                  c10::intrusive_ptr<c10d::Backend> host = {}, std::vector<std::string> places = {});
  bool host_staged() const { return static_cast<bool>(host_); }

  const std::string getBackendName() const override { return "tpu"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void abort() override;
  void shutdown() override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;

  // A compiled graph holding this group's collectives: every rank launches
  // `launch` (the same program, its own device and arguments) as its next
  // collective; returns this rank's outputs, or nothing when the ranks'
  // programs differ and `launch.may_diverge` (each rank then runs its graph
  // eagerly). XLA transport only.
  std::optional<std::vector<pjrt::BufferPtr>> launch(collectives::Rendezvous::Launch launch);

  // Whether Fused mode records collectives into windows (TORCH_TPU_FUSED_COLLECTIVES,
  // default on) from now on; returns the previous setting.
  static bool set_fused_collectives(bool on);

 private:
  // Runs `call` on this rank's flat `input`; returns this rank's flat result.
  // In Fused mode the call is recorded into the rank's window (a placeholder).
  pjrt::BufferPtr run(collectives::Call call, const at::Tensor& input, const char* op);
  // Fused mode: `call` recorded into `device`'s window (README "Collectives in Fused windows").
  pjrt::BufferPtr record(const collectives::Call& call, int device, pjrt::BufferPtr value);
  // A recorded collective run on its own (its window was replayed): a meeting
  // that, when the other ranks bring something else (their windows), is
  // tried again at the next one, as theirs will be.
  pjrt::BufferPtr join_recorded(const collectives::Call& call, int device, pjrt::BufferPtr value);
  // Before this rank waits for the others outside a collective (a barrier, a
  // recv): its window runs first, since it may hold collectives they wait for.
  void flush_window(int device);
  collectives::Call call_of(collectives::Kind kind, const at::Tensor& t) const;
  // all_to_all of a flat tensor whose chunks differ in length: send_counts[r]
  // elements go to rank r, recv_counts[r] come from it. Returns the received
  // chunks one after another.
  at::Tensor uneven_all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts, const char* op);
  // run() through host memory and the gloo group (host_staging.cpp).
  pjrt::BufferPtr staged(const collectives::Call& call, const at::Tensor& input);
  // Host staging: every rank checks that all made the same call (`call` null:
  // a barrier) before gloo sees mismatched tensors (it would hang or crash).
  void agree(const collectives::Call* call, int device);
  // Waits for a gloo call; its failure is raised naming `op`, this rank, and
  // the ranks whose processes are gone.
  void await_host(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const;
  std::string exited_ranks() const;
  std::vector<std::string> places_;

  c10::intrusive_ptr<c10d::Backend> host_;

  std::shared_ptr<collectives::Rendezvous> rendezvous_;
  std::string rendezvous_key_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> seq_{0};  // this rank's collectives so far: the ranks meet at equal numbers
};

}  // namespace torch_tpu::distributed
