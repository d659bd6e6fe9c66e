// torch.compile graphs' functional collectives (_c10d_functional::*), for
// compiled graphs only: the graph becomes one program with a partition per
// rank of the group (csrc/python/graph.cpp launches it over the ranks'
// devices). torch_tpu/_compile.py replaces each op's group name with the
// group's size, its last argument here. In eager, collectives go through the
// c10d backend (csrc/distributed/) instead.
#include "collectives/programs.h"
#include "lowering/registry.h"

namespace torch_tpu::lowering {
namespace {

using collectives::Call;
using collectives::Kind;
using collectives::Reduction;

// functional collectives name reductions in lower case ("sum", "avg", ...).
Reduction reduction_of(const std::string& op) {
  static const std::pair<const char*, Reduction> names[] = {
      {"sum", Reduction::Sum},   {"avg", Reduction::Avg},     {"product", Reduction::Product},
      {"min", Reduction::Min},   {"max", Reduction::Max},     {"band", Reduction::BitAnd},
      {"bor", Reduction::BitOr}, {"bxor", Reduction::BitXor},
  };
  for (const auto& [name, r] : names)
    if (op == name) return r;
  throw Declined("the reduction \"" + op + "\" of a functional collective");
}

// `kind` over the group on argument 0, flattened (collectives move flat
// buffers; dimension 0 blocks are flat blocks in row-major order).
std::vector<Value> collective(LoweringContext& c, Kind kind, Reduction reduction = Reduction::Sum, int64_t root = 0) {
  const Value& x = c.tensor(0);
  Call call;
  call.kind = kind;
  call.reduction = reduction;
  call.dtype = x.dtype();
  call.numel = x.type.numel();
  call.size = c.integer(c.args.size() - 1);
  call.root = root;
  if (c.b.partitions() == 1 && call.size > 1) c.b.set_partitions(call.size);
  if (c.b.partitions() != call.size)
    throw Declined("collectives over groups of different sizes in one graph (" + std::to_string(c.b.partitions()) +
                   " and " + std::to_string(call.size) + " ranks)");
  if (call.size == 1) return {x};  // a group of one: the value itself
  try {
    return {collectives::lower(c.b, call, c.b.reshape(x, {call.numel}))};
  } catch (const std::invalid_argument& e) {  // eager raises it, naming the op
    throw Declined(e.what());
  }
}

std::vector<Value> all_to_all_single(LoweringContext& c) {
  // Uneven splits give shapes that depend on other ranks' data: eager only.
  for (size_t i : {1, 2}) {
    if (!c.has(i)) continue;
    const auto& splits = c.ints(i);
    for (int64_t s : splits)
      if (s != splits.at(0)) throw Declined("all_to_all_single with uneven splits in a compiled graph");
  }
  return collective(c, Kind::AllToAll);
}

LOWERING("graph:_c10d_functional::all_reduce",
         [](LoweringContext& c) { return collective(c, Kind::AllReduce, reduction_of(c.string(1))); });
LOWERING("graph:_c10d_functional::all_gather_into_tensor",
         [](LoweringContext& c) { return collective(c, Kind::AllGather); });
LOWERING("graph:_c10d_functional::reduce_scatter_tensor",
         [](LoweringContext& c) { return collective(c, Kind::ReduceScatter, reduction_of(c.string(1))); });
LOWERING("graph:_c10d_functional::all_to_all_single", all_to_all_single);
LOWERING("graph:_c10d_functional::broadcast",
         [](LoweringContext& c) { return collective(c, Kind::Broadcast, Reduction::Sum, c.integer(1)); });

}  // namespace
}  // namespace torch_tpu::lowering
