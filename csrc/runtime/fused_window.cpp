#include "runtime/fused_window.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <unordered_set>

namespace torch_tpu::runtime {
namespace {

void append_int(std::string& s, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, end);
}

std::vector<std::string> split_types(const std::string& list, bool named) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(", ", pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    if (named) item = item.substr(item.find(": ") + 2);  // "%arg0: tensor<4xf32>"
    item = item.substr(0, item.find(" {"));              // without attributes (a graph's aliasing)
    if (!item.empty()) out.push_back(item);
    pos = end + 2;
  }
  return out;
}

}  // namespace

// Builder::module's text split into main's parameter and result types and
// the rest of the function (from its parameter list on).
const FusedWindow::Signature& FusedWindow::signature(const Program& program) {
  auto it = signatures_.find(program.id);
  if (it != signatures_.end()) return it->second;
  const std::string& m = program.mlir;
  const std::string head = "  func.func public @main(", marker = "\n  // function @";
  size_t begin = m.find(head), last = m.rfind("\n}");
  if (begin == std::string::npos || last == std::string::npos)
    throw std::logic_error("torch_tpu: program " + program.key + " is not a module with a @main");
  Signature f;
  // Functions @main calls follow it, each behind a marker line (Builder::module).
  const size_t module_end = last;
  for (size_t at = m.find(marker, begin), end; at != std::string::npos && at < module_end; at = end) {
    if (f.functions.empty()) last = at;  // @main ends where the first function begins
    const size_t name_begin = at + marker.size(), name_end = m.find('\n', name_begin);
    end = std::min(m.find(marker, name_end), module_end);
    f.functions.emplace_back(m.substr(name_begin, name_end - name_begin), m.substr(name_end + 1, end - name_end - 1));
  }
  size_t params_begin = begin + head.size();
  size_t params_end = m.find(") -> (", params_begin);
  size_t results_end = m.find(") {", params_end);
  f.params = split_types(m.substr(params_begin, params_end - params_begin), true);
  f.results = split_types(m.substr(params_end + 6, results_end - params_end - 6), false);
  f.tail = "(";
  f.tail.append(m, params_begin, last - params_begin);
  f.tail += "\n";
  // A compiled graph donates the inputs it overwrites; called in a window, the
  // window's own aliasing decides that.
  for (size_t at; (at = f.tail.find(" {tf.aliasing_output = ")) != std::string::npos;)
    f.tail.erase(at, f.tail.find('}', at) + 1 - at);
  return signatures_.emplace(program.id, std::move(f)).first->second;
}

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

}  // namespace

namespace {
std::atomic<uint64_t> next_generation{1};
thread_local int current_thread_rank = -1;  // FusedWindow::set_thread_rank's

// The rank recording: the thread's (a world rank, under run_threads), else
// the group's.
int recording_rank(const CollectiveGroup* group) {
  return current_thread_rank >= 0 ? current_thread_rank : group ? group->rank : -1;
}

// A group's key hash (never 0) over its recording rank, in one word.
uint64_t identity_of(const CollectiveGroup& group) {
  return (std::hash<std::string>{}(group.key) | 1) << 16 | static_cast<uint64_t>(recording_rank(&group) & 0xffff);
}
}  // namespace

FusedWindow::FusedWindow(Runtime& runtime, int device)
    : runtime_(runtime),
      limit_(static_cast<size_t>(positive_env("TORCH_TPU_FUSED_WINDOW", 2048, "ops per fused window"))),
      debug_(std::getenv("TORCH_TPU_FUSED_DEBUG") != nullptr &&
             std::string(std::getenv("TORCH_TPU_FUSED_DEBUG")) == "1"),
      generation_(next_generation.fetch_add(1)),
      device_(device) {}

namespace {
std::function<std::string()>& stack_provider() {
  static std::function<std::string()> provider;
  return provider;
}
}  // namespace

void FusedWindow::set_stack_provider(std::function<std::string()> provider) { stack_provider() = std::move(provider); }

void FusedWindow::set_thread_rank(int rank) { current_thread_rank = rank; }

int FusedWindow::thread_rank() { return current_thread_rank; }

std::string FusedWindow::stack() { return stack_provider() ? stack_provider()() : std::string(); }

bool FusedWindow::empty() {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.empty();
}

std::vector<pjrt::BufferPtr> FusedWindow::record(const ProgramPtr& program, const std::vector<pjrt::BufferPtr>& args,
                                                 const char* what, const std::shared_ptr<const CollectiveGroup>& group,
                                                 RunAlone alone, bool graph) {
  std::string stack;
  if (debug_ && stack_provider()) stack = stack_provider()();  // before the lock: it takes the GIL
  const uint64_t identity = group ? identity_of(*group) : 0;
  // Checked before the lock: the other rank may hold it, waiting for this one.
  const uint64_t held = group_identity_.load();
  const int rank = recording_rank(group.get());
  if (held != 0 && rank >= 0 && static_cast<int>(held & 0xffff) != rank && (!group || held >> 16 == identity >> 16))
    throw std::runtime_error("torch_tpu: ranks " + std::to_string(held & 0xffff) + " and " + std::to_string(rank) +
                             " of a process group use the same device (tpu:" + std::to_string(device_) +
                             ") in Fused mode. Each rank needs its own device: call torch.tpu.set_device(rank) in "
                             "each rank.");
  std::lock_guard<std::mutex> lock(mutex_);
  if (group && group_ && group->key != group_->key) flush_locked("collective_group");
  // A value's index fills the tag's low 24 bits.
  if (values_.size() + program->outputs.size() >= (size_t{1} << 24)) flush_locked("window_limit");
  if (graph && !graphs_.insert(program->id).second) {  // the graph again: a loop's next step
    flush_locked("graph_repeat");
    graphs_.insert(program->id);
  }
  if (group) {
    group_ = group;
    group_identity_ = identity;
    runtime_.count("fused_collectives");
  }
  Call call{program, {}, static_cast<int>(values_.size()), what, std::move(stack), std::move(alone)};
  call.args.reserve(args.size());
  key_ += 'p';
  append_int(key_, program->id);
  key_ += '(';
  for (const auto& a : args) {
    if (a->is_placeholder()) {
      const int v = value_index(*a);
      if (v < 0)
        throw std::runtime_error(std::string("torch_tpu: ") + what +
                                 " reads a value that was never computed: the fused window that was to compute it "
                                 "failed (see the earlier error). Compute it again.");
      call.args.push_back({false, v});
      key_ += 'v';
      append_int(key_, v);
    } else {
      // A shared constant is an input of its own at every read (Buffer::shared).
      auto found = a->shared() ? input_index_.end() : input_index_.find(a->raw());
      int index = found != input_index_.end() ? found->second : static_cast<int>(inputs_.size());
      if (found == input_index_.end()) {
        if (!a->shared()) input_index_.emplace(a->raw(), index);
        inputs_.push_back(a);
        input_first_use_.emplace_back(static_cast<int>(calls_.size()), static_cast<int>(call.args.size()));
      }
      call.args.push_back({true, index});
      key_ += 'i';
      append_int(key_, index);
    }
    key_ += ',';
  }
  key_ += ')';
  std::vector<pjrt::BufferPtr> outputs;
  const size_t n = program->outputs.size();
  outputs.reserve(n);
  const auto& plugin = runtime_.client().plugin();
  for (size_t k = 0; k < n; ++k) {
    const uint64_t tag =
        generation_ << 32 | static_cast<uint64_t>(device_) << 24 | static_cast<uint64_t>(values_.size());
    outputs.push_back(std::make_shared<pjrt::Buffer>(plugin, tag));
    values_.push_back({outputs.back(), static_cast<int>(calls_.size()), static_cast<int>(k)});
  }
  calls_.push_back(std::move(call));
  if (calls_.size() >= limit_) flush_locked("window_limit");
  return outputs;
}

std::vector<pjrt::BufferPtr> FusedWindow::record_graph(const ProgramPtr& program,
                                                       const std::vector<pjrt::BufferPtr>& args, const char* what) {
  return record(program, args, what, nullptr, {}, /*graph=*/true);
}

void FusedWindow::flush(const char* reason, bool with_collectives) {
  if (with_collectives) {
    std::lock_guard<std::mutex> lock(mutex_);
    return flush_locked(reason);
  }
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock() && !group_) flush_locked(reason);
}

void FusedWindow::discard_collectives() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!group_) return;
  runtime_.count("fused_discarded_windows");
  clear();
}

bool FusedWindow::owns(const pjrt::Buffer& b) const {
  return b.is_placeholder() && b.tag() >> 32 == generation_.load(std::memory_order_relaxed);
}

bool FusedWindow::add_check(const pjrt::BufferPtr& flags, std::vector<std::string>& messages) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int v = value_index(*flags);
  if (v < 0) return false;
  // The op just recorded made them: where it was called from, if kept.
  if (const std::string& stack = calls_.back().stack; !stack.empty())
    for (auto& message : messages) message += "\nCalled from:\n" + stack;
  key_ += 'c';
  append_int(key_, static_cast<uint64_t>(v));
  checks_.push_back({v, std::move(messages)});
  return true;
}

const std::string& FusedWindow::value_type(int v) {
  return signature(*calls_[values_[v].call].program).results.at(values_[v].output);
}

std::string FusedWindow::module_text(const std::vector<int>& live, const std::vector<std::pair<int, int>>& aliases,
                                     bool with_checks) {
  // Functions are named by first use (@f0, @f1, ...), not by program ids: the
  // text, the disk cache's key, is then the same in every process.
  std::unordered_map<uint64_t, std::string> names;
  std::unordered_set<std::string> added;  // functions the programs call, named by content: once each
  std::string functions;
  for (const auto& c : calls_) {
    auto [it, inserted] = names.emplace(c.program->id, "@f" + std::to_string(names.size()));
    if (!inserted) continue;
    const Signature& f = signature(*c.program);
    functions += "  func.func private " + it->second + f.tail;
    for (const auto& [name, text] : f.functions)
      if (added.insert(name).second) functions += "  // function @" + name + "\n" + text + "\n";
  }
  auto value_name = [&](int v) {
    const Value& value = values_[v];
    std::string name = "%c" + std::to_string(value.call);
    if (calls_[value.call].program->outputs.size() > 1) {
      name += '#';
      name += std::to_string(value.output);
    }
    return name;
  };
  std::vector<std::string> params, results, result_names;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    auto [c, pos] = input_first_use_[i];
    params.push_back("%i" + std::to_string(i) + ": " + signature(*calls_[c].program).params.at(pos));
  }
  for (auto [input, output] : aliases) params[input] += " {tf.aliasing_output = " + std::to_string(output) + " : i32}";
  std::string body;
  for (size_t c = 0; c < calls_.size(); ++c) {
    const Call& call = calls_[c];
    const Signature& f = signature(*call.program);
    std::vector<std::string> args;
    for (const Ref& r : call.args) args.push_back(r.input ? "%i" + std::to_string(r.index) : value_name(r.index));
    body += "    ";
    if (!f.results.empty())
      body += "%c" + std::to_string(c) + (f.results.size() > 1 ? ":" + std::to_string(f.results.size()) : "") + " = ";
    body += "func.call " + names.at(call.program->id) + "(" + join(args) + ") : (" + join(f.params) + ") -> (" +
            join(f.results) + ")\n";
  }
  for (int v : live) {
    result_names.push_back(value_name(v));
    results.push_back(value_type(v));
  }
  if (with_checks) {  // every op's check flags (1-D bools) as one array
    std::vector<std::string> names, types;
    for (const Check& c : checks_) {
      names.push_back(value_name(c.value));
      types.push_back(value_type(c.value));
    }
    const std::string type = "tensor<" + std::to_string(check_count()) + "xi1>";
    body += "    %checks = \"stablehlo.concatenate\"(" + join(names) + ") {dimension = 0 : i64} : (" + join(types) +
            ") -> " + type + "\n";
    result_names.push_back("%checks");
    results.push_back(type);
  }
  const std::string attributes = group_ ? " attributes {mhlo.num_partitions = " + std::to_string(group_->size) +
                                              " : i32, mhlo.num_replicas = 1 : i32}"
                                        : "";
  return "module @torch_tpu" + attributes + " {\n" + functions + "  func.func public @main(" + join(params) + ") -> (" +
         join(results) + ") {\n" + body + "    \"func.return\"(" + join(result_names) + ") : (" + join(results) +
         ") -> ()\n  }\n}\n";
}

// Inputs the window holds the only reference to (a storage overwritten in the
// window: an optimizer's parameters and state) are donated to a live output
// of the same type, so XLA updates them in place instead of allocating.
std::vector<std::pair<int, int>> FusedWindow::donations(const std::vector<int>& live, const Kept& kept) {
  std::unordered_map<std::string, std::vector<int>> free_outputs;  // type -> live indices, last first
  std::vector<std::pair<int, int>> aliases;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    auto k = kept.find(inputs_[i].get());
    if (inputs_[i].use_count() != 1 + (k == kept.end() ? 0 : k->second)) continue;
    if (inputs_[i]->borrowed() || inputs_[i]->shared()) continue;  // never written
    if (free_outputs.empty())
      for (int j = static_cast<int>(live.size()) - 1; j >= 0; --j) free_outputs[value_type(live[j])].push_back(j);
    auto [c, pos] = input_first_use_[i];
    auto it = free_outputs.find(signature(*calls_[c].program).params.at(pos));
    if (it == free_outputs.end() || it->second.empty()) continue;
    aliases.emplace_back(static_cast<int>(i), it->second.back());
    it->second.pop_back();
  }
  return aliases;
}

void FusedWindow::flush_locked(const char* reason) {
  if (calls_.empty()) return;
  // Outputs: the values some tensor (or a deferred check) still holds. A
  // storage's earlier value that only previous_ keeps (for a replay: an
  // optimizer's parameter after its weight decay, before its update) is not
  // one: it would double the outputs of a training step.
  Kept kept;  // references previous_ holds
  for (const auto& [v, before] : previous_) ++kept[before.get()];
  std::vector<int> live;
  std::vector<pjrt::BufferPtr> holders;
  for (size_t v = 0; v < values_.size(); ++v) {
    if (auto p = values_[v].placeholder.lock()) {
      auto k = kept.find(p.get());
      if (k != kept.end() && p.use_count() - 1 <= k->second) continue;
      live.push_back(static_cast<int>(v));
      holders.push_back(std::move(p));
    }
  }
  const int64_t ops = static_cast<int64_t>(calls_.size());
  // Nothing recorded is still wanted: nothing to run (but collectives, which the other ranks wait for).
  if (live.empty() && checks_.empty() && !group_) {
    runtime_.count("fused_dead_windows");
    clear();
    return;
  }
  runtime_.count("fused_flushes");
  runtime_.count(std::string("fused_flush_") + reason);
  runtime_.count("fused_ops", ops);
  runtime_.count("fused_outputs", static_cast<int64_t>(live.size()));
  runtime_.count_max("fused_ops_max", ops);
  std::string key = "fused|" + key_ + "|o";
  for (int v : live) {
    append_int(key, static_cast<uint64_t>(v));
    key += ',';
  }
  const auto aliases = donations(live, kept);  // among `live` only: the checks array, after them, is never donated to
  key += "|a";
  for (auto [input, output] : aliases) {
    append_int(key, static_cast<uint64_t>(input));
    key += ':';
    append_int(key, static_cast<uint64_t>(output));
    key += ',';
  }
  bool built = false;
  auto build = [&] {
    built = true;
    std::vector<TensorType> types;
    for (int v : live) {
      const Value& value = values_[v];
      const TensorType& t = calls_[value.call].program->outputs.at(value.output);
      types.push_back({t.dtype, {t.numel()}});
    }
    if (!checks_.empty()) types.push_back({DType::Bool, {check_count()}});
    return ProgramSpec(module_text(live, aliases, !checks_.empty()), types);
  };
  std::vector<pjrt::BufferPtr> results;
  if (group_) {  // with the other ranks' windows, over the group's devices
    std::optional<std::vector<pjrt::BufferPtr>> launched;
    try {
      launched = group_->launch(key, build, inputs_, device_);
    } catch (...) {  // a rank failed or never came: the collectives cannot run alone either
      clear();
      throw;
    }
    if (!launched) {
      runtime_.count("fused_collective_replays");
      try {
        replay(live, holders, {});
      } catch (...) {
        clear();
        throw;
      }
      clear();
      return;
    }
    runtime_.count("fused_collective_windows");
    results = std::move(*launched);
  } else {  // on this device alone
    try {
      auto program = runtime_.program(key, build, /*indexed=*/false, nullptr, ProgramKind::Window);
      if (built) {
        runtime_.count("fused_window_compiles");
        if (!compiled_sequences_.insert(std::hash<std::string>{}(sequence_key())).second)
          runtime_.count("fused_recompiles");
      } else {
        runtime_.count("fused_window_hits");
      }
      // Its outputs are storages already accounted for: no second memory check.
      const auto launch = std::chrono::steady_clock::now();
      struct ClearContext {
        ~ClearContext() { Runtime::set_program_context({}); }
      } clear_context;
      if (built && Runtime::has_program_listener()) {  // what the structured trace says of the window
        std::string context = "Fused window of " + std::to_string(ops) + " ops, flushed by " + reason + ":";
        for (const Call& c : calls_) context += std::string(" ") + (c.what ? c.what : "?");
        Runtime::set_program_context(std::move(context));
      }
      results = runtime_.execute_now(*program, inputs_, device_, "fused window", /*check_memory=*/false, /*keep=*/{},
                                     /*note=*/false);
      runtime_.count(
          "fused_launch_us",
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - launch).count());
      runtime_.count("fused_donated_buffers", static_cast<int64_t>(aliases.size()));
      if (debug_)
        for (const auto& r : results) r->await_ready();
    } catch (const std::exception& e) {
      std::string error = e.what();
      try {
        replay(live, holders, error);
      } catch (...) {
        clear();
        throw;
      }
      clear();
      return;
    }
  }
  for (size_t i = 0; i < live.size(); ++i) holders[i]->fill_from(*results[i]);
  runtime_.note_launched(device_, holders, "fused window");  // results lost their handles to them
  if (!checks_.empty()) {
    std::vector<std::string> messages;
    for (Check& c : checks_) std::move(c.messages.begin(), c.messages.end(), std::back_inserter(messages));
    runtime_.queue_check(results.back(), std::move(messages));
  }
  clear();
}

int64_t FusedWindow::check_count() const {
  int64_t n = 0;
  for (const Check& c : checks_) n += static_cast<int64_t>(c.messages.size());
  return n;
}

// The program ids in order: what a recompile of the same ops shares.
std::string FusedWindow::sequence_key() const {
  std::string s;
  for (const auto& c : calls_) {
    append_int(s, c.program->id);
    s += ',';
  }
  return s;
}

int FusedWindow::value_index(const pjrt::Buffer& b) const {
  if (!owns(b)) return -1;
  return static_cast<int>(b.tag() & 0xffffffu);
}

void FusedWindow::replaced(const pjrt::BufferPtr& now, const pjrt::BufferPtr& before) {
  if (!before) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (int v = value_index(*now); v >= 0) previous_[v] = before;
}

void FusedWindow::replay(const std::vector<int>& live, const std::vector<pjrt::BufferPtr>& holders,
                         const std::string& error) {
  std::vector<pjrt::BufferPtr> values(values_.size());  // null: not computed
  std::string failure;
  for (size_t c = 0; c < calls_.size(); ++c) {
    const Call& call = calls_[c];
    std::vector<pjrt::BufferPtr> args;
    bool computable = true;
    for (const Ref& r : call.args) {
      args.push_back(r.input ? inputs_[r.index] : values[r.index]);
      computable &= args.back() != nullptr;
    }
    if (!computable) continue;  // it reads a result of a failed op: it fails with it
    std::vector<pjrt::BufferPtr> outs;
    try {
      std::vector<int64_t> keep(args.size());  // donating nothing: the window may still need every input
      std::iota(keep.begin(), keep.end(), 0);
      outs = call.alone ? call.alone(args)
                        : runtime_.execute_now(*call.program, args, device_, call.what, /*check_memory=*/true, keep);
      for (const auto& o : outs) o->await_ready();
    } catch (const std::exception& e) {
      if (failure.empty())
        failure = std::string("torch_tpu: ") + call.what + " failed (op " + std::to_string(c + 1) +
                  " of a fused window of " + std::to_string(calls_.size()) +
                  " ops, recorded in Fused mode and run at the flush; the ops before it took effect)" +
                  (call.stack.empty() ? ". Set TORCH_TPU_FUSED_DEBUG=1 to see where it was called from"
                                      : ". Called from:\n" + call.stack) +
                  "\n" + e.what();
      continue;
    }
    for (size_t k = 0; k < outs.size(); ++k) values[call.first_value + k] = std::move(outs[k]);
  }
  // A value not computed that replaced a storage's value: the storage keeps what it held.
  std::function<pjrt::BufferPtr(int)> resolved = [&](int v) -> pjrt::BufferPtr {
    if (values[v]) return values[v];
    auto it = previous_.find(v);
    if (it == previous_.end()) return nullptr;
    int before = value_index(*it->second);
    return before < 0 ? it->second : before < v ? resolved(before) : nullptr;
  };
  for (size_t i = 0; i < live.size(); ++i)
    if (auto value = resolved(live[i])) holders[i]->fill_from(*value);
  for (Check& c : checks_)  // the checks of the ops that ran
    if (values[c.value]) runtime_.queue_check(values[c.value], std::move(c.messages));
  runtime_.count("fused_replays");
  if (!failure.empty()) throw std::runtime_error(failure);
  static bool warned = false;
  if (!warned && !error.empty()) {  // (empty: a window of collectives the ranks recorded differently)
    warned = true;
    std::fprintf(stderr,
                 "torch_tpu: warning: a fused window of %zu ops failed as one program and ran op by op instead "
                 "(results are correct). The error was:\n%s\n",
                 calls_.size(), error.c_str());
  }
}

void FusedWindow::clear() {
  calls_.clear();
  values_.clear();
  checks_.clear();
  inputs_.clear();
  input_index_.clear();
  input_first_use_.clear();
  previous_.clear();
  key_.clear();
  graphs_.clear();
  group_.reset();
  group_identity_ = 0;
  generation_ = next_generation.fetch_add(1);
}

}  // namespace torch_tpu::runtime
