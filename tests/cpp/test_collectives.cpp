// Each collective's program run over the CPU plugin's devices (one partition
// per device) with exact expected values.
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "collectives/programs.h"
#include "collectives/rendezvous.h"
#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using collectives::Call;
using collectives::Kind;
using collectives::Reduction;
using stablehlo::DType;

PJRT_Buffer_Type type_of(DType t) {
  switch (t) {
    case DType::Float32: return PJRT_Buffer_Type_F32;
    case DType::Int64: return PJRT_Buffer_Type_S64;
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::BFloat16: return PJRT_Buffer_Type_BF16;
    default: throw std::runtime_error("test: unsupported dtype");
  }
}

// Runs `call` with rank r on devices[r] holding inputs[r]; returns each rank's output.
template <class T>
std::vector<std::vector<T>> run(const Call& call, const std::vector<int>& devices,
                                const std::vector<std::vector<T>>& inputs) {
  auto& c = test::client();
  std::vector<int> ids;
  for (int d : devices) ids.push_back(c.device_id(d));
  auto spec = collectives::build(call);
  auto exe = c.compile(spec.mlir, pjrt::multi_device_compile_options(ids));
  std::vector<pjrt::BufferPtr> keep;
  std::vector<std::vector<PJRT_Buffer*>> args;
  for (size_t r = 0; r < devices.size(); ++r) {
    keep.push_back(c.buffer_from_host(inputs[r].data(), type_of(call.dtype), {call.numel}, c.devices()[devices[r]]));
    args.push_back({keep.back()->raw()});
  }
  auto outs = exe->execute_on_devices(args);
  std::vector<std::vector<T>> host;
  for (auto& o : outs) {
    host.emplace_back(call.output_numel());
    o[0]->to_host(host.back().data(), host.back().size() * sizeof(T));
  }
  return host;
}

Call make(Kind kind, Reduction r, DType dtype, int64_t numel, int64_t size = 4) {
  Call c;
  c.kind = kind;
  c.reduction = r;
  c.dtype = dtype;
  c.numel = numel;
  c.size = size;
  return c;
}

const std::vector<int> kAll = {0, 1, 2, 3};

TEST(Collectives, AllReduceEveryFloatReduction) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> in = {{1, -2, 0.5f}, {2, 3, nan}, {-4, 5, 1}, {8, 0.25f, 2}};
  auto sum = run(make(Kind::AllReduce, Reduction::Sum, DType::Float32, 3), kAll, in);
  for (const auto& out : sum) {
    EXPECT_EQ(out[0], 7);
    EXPECT_EQ(out[1], 6.25f);
    EXPECT_TRUE(std::isnan(out[2]));
  }
  auto avg = run(make(Kind::AllReduce, Reduction::Avg, DType::Float32, 3), kAll, in);
  EXPECT_EQ(avg[2][0], 1.75f);
  auto prod = run(make(Kind::AllReduce, Reduction::Product, DType::Float32, 3), kAll, in);
  EXPECT_EQ(prod[1][0], -64);
  auto max = run(make(Kind::AllReduce, Reduction::Max, DType::Float32, 3), kAll, in);
  EXPECT_EQ(max[0][0], 8);
  EXPECT_EQ(max[3][1], 5);
  EXPECT_TRUE(std::isnan(max[0][2]));  // NaN wins, as torch.maximum
  auto min = run(make(Kind::AllReduce, Reduction::Min, DType::Float32, 3), kAll, in);
  EXPECT_EQ(min[1][0], -4);
  EXPECT_TRUE(std::isnan(min[2][2]));
  Call premul = make(Kind::AllReduce, Reduction::Sum, DType::Float32, 3);
  premul.factor = 0.5;
  EXPECT_EQ(run(premul, kAll, in)[0][0], 3.5f);
}

TEST(Collectives, AllReduceIntegersAndBools) {
  std::vector<std::vector<int64_t>> in = {{6, 12}, {3, 5}, {7, -9}, {1, 1LL << 40}};
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::Sum, DType::Int64, 2), kAll, in)[3],
            (std::vector<int64_t>{17, 8 + (1LL << 40)}));
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::Avg, DType::Int64, 2), kAll, in)[0],
            (std::vector<int64_t>{4, (8 + (1LL << 40)) / 4}));
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::BitAnd, DType::Int64, 2), kAll, in)[1][0], 6 & 3 & 7 & 1);
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::BitOr, DType::Int64, 2), kAll, in)[1][0], 6 | 3 | 7 | 1);
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::BitXor, DType::Int64, 2), kAll, in)[1][0], 6 ^ 3 ^ 7 ^ 1);
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::Min, DType::Int64, 2), kAll, in)[2][1], -9);
  std::vector<std::vector<bool>> bools = {{true, false}, {false, false}, {true, false}, {true, false}};
  std::vector<std::vector<uint8_t>> b8;
  for (const auto& v : bools) b8.push_back({v[0], v[1]});
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::Sum, DType::Bool, 2), kAll, b8)[0], (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(run(make(Kind::AllReduce, Reduction::Product, DType::Bool, 2), kAll, b8)[0], (std::vector<uint8_t>{0, 0}));
}

TEST(Collectives, BroadcastIsBitExact) {
  const float neg_zero = -0.0f;
  uint32_t payload = 0x7fc01234;  // a NaN with a payload
  float nan;
  std::memcpy(&nan, &payload, 4);
  std::vector<std::vector<float>> in = {{1, 2}, {3, 4}, {neg_zero, nan}, {7, 8}};
  Call call = make(Kind::Broadcast, Reduction::Sum, DType::Float32, 2);
  call.root = 2;
  for (const auto& out : run(call, kAll, in)) {
    EXPECT_TRUE(std::signbit(out[0]) && out[0] == 0);
    uint32_t bits;
    std::memcpy(&bits, &out[1], 4);
    EXPECT_EQ(bits, payload);
  }
}

TEST(Collectives, GatherScatterAndAllToAll) {
  std::vector<std::vector<float>> in = {{0, 1, 2, 3}, {10, 11, 12, 13}, {20, 21, 22, 23}, {30, 31, 32, 33}};
  auto gathered = run(make(Kind::AllGather, Reduction::Sum, DType::Float32, 4), kAll, in);
  EXPECT_EQ(gathered[1].size(), 16u);
  EXPECT_EQ(gathered[1][5], 11);
  EXPECT_EQ(gathered[3][15], 33);
  auto scattered = run(make(Kind::ReduceScatter, Reduction::Sum, DType::Float32, 4), kAll, in);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(scattered[r], (std::vector<float>{60.f + 4 * r}));
  auto exchanged = run(make(Kind::AllToAll, Reduction::Sum, DType::Float32, 4), kAll, in);
  EXPECT_EQ(exchanged[2], (std::vector<float>{2, 12, 22, 32}));
  Call scatter = make(Kind::Scatter, Reduction::Sum, DType::Float32, 4);
  scatter.root = 1;
  auto from_root = run(scatter, kAll, in);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(from_root[r], (std::vector<float>{10.f + r}));
}

TEST(Collectives, SubgroupInAnyDeviceOrder) {
  // Ranks 0..2 on devices 3, 0, 2: results follow rank order, not device order.
  std::vector<std::vector<int64_t>> in = {{100}, {200}, {300}};
  auto out = run(make(Kind::AllGather, Reduction::Sum, DType::Int64, 1, 3), {3, 0, 2}, in);
  for (const auto& o : out) EXPECT_EQ(o, (std::vector<int64_t>{100, 200, 300}));
  std::vector<std::vector<int64_t>> two = {{5}, {7}};
  auto pair = run(make(Kind::AllReduce, Reduction::Max, DType::Int64, 1, 2), {1, 3}, two);
  EXPECT_EQ(pair[0][0], 7);
}

TEST(Collectives, RefusesBadCallsAndLaunches) {
  Call bad = make(Kind::AllReduce, Reduction::BitAnd, DType::Float32, 4);
  EXPECT_NE(bad.invalid().find("bitwise reductions need an integer or bool tensor"), std::string::npos)
      << bad.invalid();
  EXPECT_THROW(collectives::build(bad), std::invalid_argument);
  Call uneven = make(Kind::ReduceScatter, Reduction::Sum, DType::Float32, 6);
  EXPECT_NE(uneven.invalid().find("do not split into 4 equal blocks"), std::string::npos);
  Call root = make(Kind::Broadcast, Reduction::Sum, DType::Float32, 4);
  root.root = 4;
  EXPECT_NE(root.invalid().find("root 4 is not a rank"), std::string::npos);
  // A launch with arguments for 2 of the program's 4 devices is refused.
  auto& c = test::client();
  auto spec = collectives::build(make(Kind::AllReduce, Reduction::Sum, DType::Float32, 1));
  std::vector<int> ids;
  for (int d : kAll) ids.push_back(c.device_id(d));
  auto exe = c.compile(spec.mlir, pjrt::multi_device_compile_options(ids));
  float v = 1;
  auto b0 = c.buffer_from_host(&v, PJRT_Buffer_Type_F32, {1}, c.devices()[0]);
  auto b1 = c.buffer_from_host(&v, PJRT_Buffer_Type_F32, {1}, c.devices()[1]);
  EXPECT_THROW(exe->execute_on_devices({{b0->raw()}, {b1->raw()}}), pjrt::Error);
  EXPECT_THROW(exe->execute_on_devices({{b0->raw()}, {}, {}, {}}), std::invalid_argument);
}

// Ranks launching different programs: a mismatch naming each rank's call, or,
// when every launch may run its own eager form instead (compiled graphs),
// Diverged on every rank. Nothing runs either way.
TEST(Collectives, RendezvousTellsDivergedGraphsFromMismatches) {
  auto outcome = [](bool rank1_may_diverge) {
    auto group = collectives::Rendezvous::of("test-diverge", 2);
    static uint64_t seq = 0;
    const uint64_t s = seq++;
    std::vector<std::string> got(2);
    auto rank = [&](int r) {
      collectives::Rendezvous::Launch l{"graph|" + std::to_string(r), "graph " + std::to_string(r), nullptr, r, {},
                                        r == 0 || rank1_may_diverge};
      try {
        group->launch(s, r, std::move(l), std::chrono::seconds(10));
        got[r] = "ran";
      } catch (const collectives::Diverged&) {
        got[r] = "diverged";
      } catch (const collectives::GroupError& e) {
        got[r] = e.what();
      }
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    return got;
  };
  EXPECT_EQ(outcome(true), (std::vector<std::string>{"diverged", "diverged"}));
  for (const auto& message : outcome(false)) {
    EXPECT_NE(message.find("made different collective calls"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1: graph 1"), std::string::npos) << message;
  }
}

TEST(Collectives, PortableProgramRunsOnEveryDevice) {
  auto& c = test::client();
  stablehlo::Builder b;
  auto x = b.parameter({DType::Float32, {2}});
  auto y = b.binary(stablehlo::Binary::Add, x, x);
  auto exe = c.compile(b.module({y}), pjrt::single_device_compile_options());
  for (size_t d = 0; d < c.devices().size(); ++d) {
    std::vector<float> in{1, 2}, out(2);
    auto buf = c.buffer_from_host(in.data(), PJRT_Buffer_Type_F32, {2}, c.devices()[d]);
    exe->execute({buf->raw()}, c.devices()[d])[0]->to_host(out.data(), 8);
    EXPECT_EQ(out, (std::vector<float>{2, 4}));
    auto moved = buf->copy_to_device(c.devices()[(d + 1) % c.devices().size()]);
    moved->to_host(out.data(), 8);
    EXPECT_EQ(out, in);
  }
}

}  // namespace
}  // namespace torch_tpu
