// The StableHLO program of each collective: one partition per rank of a
// group, every tensor a flat buffer (a storage's value), the group's ranks in
// partition order. Torch-free: the c10d backend (csrc/distributed/) maps
// ProcessGroup calls onto these, and the C++ tests run them on the CPU
// plugin's devices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tpu::collectives {

using stablehlo::DType;

enum class Kind {
  AllReduce,      // [n] -> [n], every rank
  Broadcast,      // [n] -> [n], the root's value, bit exact
  AllGather,      // [n] -> [size * n], rank order
  ReduceScatter,  // [size * n] -> [n], rank r keeps block r of the reduction
  AllToAll,       // [size * n] -> [size * n], block q goes to rank q
  Scatter,        // [size * n] -> [n], block r of the root's input to rank r
};
const char* name(Kind kind);

// PyTorch's ReduceOp, less what has no program (PREMUL_SUM is Sum with a factor).
enum class Reduction { Sum, Avg, Product, Min, Max, BitAnd, BitOr, BitXor };
const char* name(Reduction reduction);

struct Call {
  Kind kind = Kind::AllReduce;
  Reduction reduction = Reduction::Sum;
  DType dtype = DType::Float32;
  int64_t numel = 0;  // of each rank's input
  int64_t size = 1;   // ranks in the group
  int64_t root = 0;   // Broadcast, Scatter
  double factor = 1;  // PREMUL_SUM: inputs are multiplied by it first

  // Identifies the program (not the devices it runs on).
  std::string key() const;
  int64_t output_numel() const;
  // What is wrong with the call ("MIN of bool is ..."), or empty: checked
  // before a program is built, so the error names PyTorch's terms.
  std::string invalid() const;
};

// "all_reduce SUM of f32[1024] on tpu:0": how errors name a rank's call.
std::string describe(const Call& call, int device);
// The message of ranks whose calls differ; `calls[r]` describes rank r's.
std::string mismatch_message(const std::vector<std::string>& calls);

// `call` on this partition's flat value `x` inside a program of `call.size`
// partitions being built in `b`: this partition's flat result. Throws
// std::invalid_argument for an invalid call.
stablehlo::Value lower(stablehlo::Builder& b, const Call& call, stablehlo::Value x);

// The program of `call`: one parameter and one result, both flat.
runtime::ProgramSpec build(const Call& call);

}  // namespace torch_tpu::collectives
