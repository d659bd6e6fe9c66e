// The torch-free pieces that make results match CPU PyTorch: NaN-propagating
// max/min, PyTorch's type promotion classes, a while loop (integer pow), and
// reading and writing storages laid out in another dimension order.
#include <cmath>
#include <limits>

#include "lowering/registry.h"
#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using lowering::Operand;
using stablehlo::Binary;
using stablehlo::Builder;
using stablehlo::Compare;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;
using test::run;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(NanPropagatingExtremes, ANanInEitherOperandWins) {
  for (bool is_max : {true, false}) {
    Builder b;
    TensorType t{DType::Float32, {4}};
    Value x = b.parameter(t), y = b.parameter(t);
    Value m = is_max ? lowering::maximum(b, x, y) : lowering::minimum(b, x, y);
    auto out = run<float, float>(b, m, {t, t}, {{1, kNaN, kNaN, -2}, {kNaN, 3, kNaN, 5}});
    EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]) && std::isnan(out[2]));
    EXPECT_EQ(out[3], is_max ? 5 : -2);
  }
}

TEST(TypePromotion, ThreeClassesAsPyTorch) {
  // A Python number lifts only the category: uint8 tensor + -2 stays uint8.
  EXPECT_EQ(lowering::promote(DType::UInt8, Operand::Tensor, DType::Int64, Operand::Number), DType::UInt8);
  // Two 0-d tensors promote normally; a 0-d uint8 with a number stays uint8.
  EXPECT_EQ(lowering::promote(DType::UInt8, Operand::ZeroDim, DType::Int64, Operand::Number), DType::UInt8);
  EXPECT_EQ(lowering::promote(DType::UInt8, Operand::ZeroDim, DType::Int64, Operand::ZeroDim), DType::Int64);
  // A 0-d float16 lifts an int32 tensor to float16 (not to the default float32).
  EXPECT_EQ(lowering::promote(DType::Int32, Operand::Tensor, DType::Float16, Operand::ZeroDim), DType::Float16);
  // A Python float is a float32 number (the default dtype): it lifts an int32 tensor to float32.
  EXPECT_EQ(lowering::promote(DType::Int32, Operand::Tensor, DType::Float32, Operand::Number), DType::Float32);
  EXPECT_EQ(lowering::promote(DType::Float16, Operand::Tensor, DType::Float32, Operand::Number), DType::Float16);
  EXPECT_EQ(lowering::promote(DType::Bool, Operand::Tensor, DType::Int64, Operand::Number), DType::Int64);
  EXPECT_EQ(lowering::promote(DType::BFloat16, Operand::Tensor, DType::Float16, Operand::Tensor), DType::Float32);
}

TEST(WhileLoop, ComputesAPowerBySquaring) {
  // 3 ** 13 by squaring: state (result, base, exponent) while exponent != 0.
  Builder b;
  TensorType t{DType::Int64, {}};
  Value base = b.parameter(t), e = b.parameter(t);
  auto state = b.while_loop(
      {b.constant_int(1, t), base, e},
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        return {r.compare(Compare::NE, s[2], r.constant_int(0, t))};
      },
      [&](Builder& r, const std::vector<Value>& s) -> std::vector<Value> {
        Value one = r.constant_int(1, t);
        Value odd = r.compare(Compare::NE, r.binary(Binary::And, s[2], one), r.constant_int(0, t));
        return {r.select(odd, r.binary(Binary::Multiply, s[0], s[1]), s[0]), r.binary(Binary::Multiply, s[1], s[1]),
                r.binary(Binary::ShiftRightLogical, s[2], one)};
      });
  ASSERT_EQ(state.size(), 3u);
  auto out = run<int64_t, int64_t>(b, state[0], {t, t}, {{3}, {13}});
  EXPECT_EQ(out[0], 1594323);
}

TEST(WhileLoop, RefusesAStateChangingItsType) {
  Builder b;
  Value x = b.parameter({DType::Int32, {2}});
  EXPECT_THROW(
      b.while_loop(
          {x}, [](Builder& r, const std::vector<Value>& s) { return std::vector<Value>{r.scalar(1, DType::Bool)}; },
          [](Builder& r, const std::vector<Value>& s) { return std::vector<Value>{r.convert(s[0], DType::Int64)}; }),
      std::invalid_argument);
}

TEST(MemoryOrder, OfTransposedAndChannelsLastLayouts) {
  EXPECT_TRUE(lowering::memory_order({2, 3}, {3, 1}).empty());  // row-major
  EXPECT_EQ(lowering::memory_order({3, 2}, {1, 3}), (std::vector<int64_t>{1, 0}));
  // N, C, H, W in channels_last: N, H, W, C in memory.
  EXPECT_EQ(lowering::memory_order({2, 3, 4, 5}, {60, 1, 15, 3}), (std::vector<int64_t>{0, 2, 3, 1}));
  EXPECT_TRUE(lowering::memory_order({3, 2}, {2, 2}).empty());  // overlapping: not a layout
  EXPECT_TRUE(lowering::is_dense({1, 4}, {8, 1}));              // a size-1 dim's stride is free
  EXPECT_FALSE(lowering::is_dense({2, 2}, {4, 1}));
}

TEST(StridedAccess, ReadsAndWritesATransposedStorageByTranspose) {
  // A storage of 6 elements holding a [3, 2] tensor laid out with strides (1, 3).
  Builder b;
  TensorType flat{DType::Float32, {6}};
  Value storage = b.parameter(flat);
  Value read = lowering::strided_read(b, storage, {3, 2}, {1, 3}, 0);
  EXPECT_EQ(b.module({read}).find("gather"), std::string::npos);
  auto out = run<float, float>(b, read, {flat}, {{0, 1, 2, 3, 4, 5}});
  EXPECT_EQ(out, (std::vector<float>{0, 3, 1, 4, 2, 5}));

  Builder w;
  Value s = w.parameter(flat), update = w.parameter(flat);
  Value written = lowering::strided_write(w, s, update, {3, 2}, {1, 3}, 0);
  auto stored = run<float, float>(w, written, {flat, flat}, {{0, 0, 0, 0, 0, 0}, {0, 3, 1, 4, 2, 5}});
  EXPECT_EQ(stored, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace torch_tpu
