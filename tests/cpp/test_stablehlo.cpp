#include <cmath>

#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Binary;
using stablehlo::Builder;
using stablehlo::Compare;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Unary;
using stablehlo::Value;
using test::run;

const TensorType f32x4{DType::Float32, {4}};

TEST(StableHloText, GoldenAddModule) {
  Builder b;
  Value x = b.parameter(f32x4), y = b.parameter(f32x4);
  std::string text = b.module({b.binary(Binary::Add, x, y)});
  EXPECT_EQ(text,
            "module @torch_tpu {\n"
            "  func.func public @main(%p0: tensor<4xf32>, %p1: tensor<4xf32>) -> (tensor<4xf32>) {\n"
            "    %v0 = \"stablehlo.add\"(%p0, %p1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    \"func.return\"(%v0) : (tensor<4xf32>) -> ()\n"
            "  }\n"
            "}\n");
}

TEST(StableHloText, GoldenConstantsAreExactBitPatterns) {
  Builder b;
  Value one = b.scalar(1.0, DType::Float32);
  Value half = b.scalar(1.0, DType::BFloat16);
  Value h = b.scalar(1.0, DType::Float16);
  Value i = b.constant_int(-3, {DType::Int64, {2}});
  std::string text = b.module({one, half, h, i});
  EXPECT_NE(text.find("dense<0x3F800000> : tensor<f32>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<0x3F80> : tensor<bf16>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<0x3C00> : tensor<f16>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<-3> : tensor<2xi64>"), std::string::npos) << text;
}

TEST(StableHloText, GoldenTransposeAndReduce) {
  Builder b;
  Value x = b.parameter({DType::Float32, {2, 3}});
  Value t = b.transpose(x, {1, 0});
  Value r = b.reduce(t, b.scalar(0, DType::Float32), {1}, Binary::Add);
  std::string text = b.module({r});
  EXPECT_NE(text.find("{permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>"), std::string::npos)
      << text;
  EXPECT_NE(text.find("{dimensions = array<i64: 1>} : (tensor<3x2xf32>, tensor<f32>) -> tensor<3xf32>"),
            std::string::npos)
      << text;
}

TEST(StableHloText, PruneDropsDeadOpsAndUnreadParameters) {
  Builder b;
  Value x = b.parameter(f32x4), y = b.parameter(f32x4), z = b.parameter(f32x4);
  Value dead = b.binary(Binary::Add, x, y);  // computed, never returned
  (void)dead;
  // y is read only by the dead add; x through reshapes, z directly.
  Value kept = b.binary(Binary::Multiply, z, b.reshape(b.reshape(x, {2, 2}), {4}));
  auto r = b.reduce(kept, b.scalar(0, DType::Float32), {0}, Binary::Add);
  EXPECT_EQ(b.prune({r}), (std::vector<bool>{true, false, true}));
  std::string text = b.module({r});
  EXPECT_NE(text.find("@main(%p0: tensor<4xf32>, %p2: tensor<4xf32>)"), std::string::npos) << text;
  EXPECT_EQ(text.find("%p1"), std::string::npos) << text;
  EXPECT_EQ(text.find("stablehlo.add\"(%p0"), std::string::npos) << text;
  // A module with no parameter left (fill_'s program: self is not read).
  Builder c;
  Value self = c.parameter(f32x4);
  Value filled = c.binary(Binary::Add, c.reshape(self, {4}), c.constant(0, f32x4));
  Value fill = c.constant(7, f32x4);
  (void)filled;
  EXPECT_EQ(c.prune({fill}), (std::vector<bool>{false}));
  EXPECT_NE(c.module({fill}).find("@main() -> (tensor<4xf32>)"), std::string::npos) << c.module({fill});
}

TEST(StableHloChecks, MalformedUsesAreRefusedAtBuildTime) {
  Builder b;
  Value x = b.parameter(f32x4), y = b.parameter({DType::Float32, {3}}), i = b.parameter({DType::Int32, {4}});
  EXPECT_THROW(b.binary(Binary::Add, x, y), std::invalid_argument);
  EXPECT_THROW(b.binary(Binary::Add, x, i), std::invalid_argument);
  EXPECT_THROW(b.unary(Unary::Exp, i), std::invalid_argument);
  EXPECT_THROW(b.reshape(x, {3}), std::invalid_argument);
  EXPECT_THROW(b.transpose(x, {1}), std::invalid_argument);
  EXPECT_THROW(b.slice(x, {0}, {5}, {1}), std::invalid_argument);
  EXPECT_THROW(b.dot_general(b.reshape(x, {2, 2}), b.reshape(y, {3, 1}), {}, {}, {1}, {0}), std::invalid_argument);
  EXPECT_THROW(b.broadcast_in_dim(x, {4, 3}, {1}), std::invalid_argument);
  try {
    b.binary(Binary::Add, x, y);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stablehlo.add"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tensor<3xf32>"), std::string::npos);
  }
}

// Every op, executed through the plugin against numbers computed by hand.
TEST(StableHloRun, ElementwiseArithmeticAndMath) {
  std::vector<float> a{1, 2, 3, 4}, c{4, 3, 2, 1};
  struct Case {
    Binary op;
    std::vector<float> want;
  } cases[] = {{Binary::Add, {5, 5, 5, 5}},      {Binary::Subtract, {-3, -1, 1, 3}},
               {Binary::Multiply, {4, 6, 6, 4}}, {Binary::Divide, {0.25f, 2.f / 3, 1.5f, 4}},
               {Binary::Maximum, {4, 3, 3, 4}},  {Binary::Minimum, {1, 2, 2, 1}},
               {Binary::Power, {1, 8, 9, 4}},    {Binary::Remainder, {1, 2, 1, 0}}};
  for (const auto& k : cases) {
    Builder b;
    Value x = b.parameter(f32x4), y = b.parameter(f32x4);
    auto got = run<float>(b, b.binary(k.op, x, y), {f32x4, f32x4}, std::vector<std::vector<float>>{a, c});
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], k.want[i], 1e-6) << "op " << static_cast<int>(k.op);
  }
  struct UCase {
    Unary op;
    float (*f)(float);
  } ucases[] = {{Unary::Exp, [](float v) { return std::exp(v); }},
                {Unary::Log, [](float v) { return std::log(v); }},
                {Unary::Sqrt, [](float v) { return std::sqrt(v); }},
                {Unary::Tanh, [](float v) { return std::tanh(v); }},
                {Unary::Negate, [](float v) { return -v; }},
                {Unary::Abs, [](float v) { return std::fabs(v); }},
                {Unary::Logistic, [](float v) { return 1 / (1 + std::exp(-v)); }}};
  for (const auto& k : ucases) {
    Builder b;
    Value x = b.parameter(f32x4);
    auto got = run<float>(b, b.unary(k.op, x), {f32x4}, std::vector<std::vector<float>>{a});
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], k.f(a[i]), 1e-5) << "unary " << static_cast<int>(k.op);
  }
}

TEST(StableHloRun, CompareSelectConvert) {
  Builder b;
  Value x = b.parameter(f32x4), y = b.parameter(f32x4);
  Value lt = b.compare(Compare::LT, x, y);
  Value s = b.select(lt, x, y);  // elementwise min
  Value r = b.convert(b.binary(Binary::Add, s, b.convert(b.convert(lt, DType::Int32), DType::Float32)), DType::Int32);
  auto got = run<int32_t>(b, r, {f32x4, f32x4}, std::vector<std::vector<float>>{{1, 5, 3, -2.5}, {2, 4, 3, 0}});
  EXPECT_EQ(got, (std::vector<int32_t>{2, 4, 3, -1}));
}

TEST(StableHloRun, ConstantIotaBroadcastReshapeTranspose) {
  Builder b;
  Value i = b.iota({DType::Float32, {2, 3}}, 1);                                     // [[0,1,2],[0,1,2]]
  Value c = b.broadcast_in_dim(b.constant(10, {DType::Float32, {2}}), {2, 3}, {0});  // 10s
  Value t = b.transpose(b.binary(Binary::Add, i, c), {1, 0});                        // 3x2
  Value r = b.reshape(t, {6});
  auto got = run<float>(b, r, {}, std::vector<std::vector<float>>{});
  EXPECT_EQ(got, (std::vector<float>{10, 10, 11, 11, 12, 12}));
}

TEST(StableHloRun, SlicesAndUpdates) {
  TensorType t{DType::Float32, {6}};
  std::vector<float> x{0, 1, 2, 3, 4, 5};
  {
    Builder b;
    Value p = b.parameter(t);
    auto got = run<float>(b, b.slice(p, {1}, {6}, {2}), {t}, std::vector<std::vector<float>>{x});
    EXPECT_EQ(got, (std::vector<float>{1, 3, 5}));
  }
  {
    Builder b;
    Value p = b.parameter(t);
    Value d = b.dynamic_slice(p, {b.constant_int(2, {DType::Int64, {}})}, {3});
    auto got = run<float>(b, d, {t}, std::vector<std::vector<float>>{x});
    EXPECT_EQ(got, (std::vector<float>{2, 3, 4}));
  }
  {
    Builder b;
    Value p = b.parameter(t);
    Value u = b.dynamic_update_slice(p, b.constant(-1, {DType::Float32, {2}}), {b.constant_int(4, {DType::Int32, {}})});
    auto got = run<float>(b, u, {t}, std::vector<std::vector<float>>{x});
    EXPECT_EQ(got, (std::vector<float>{0, 1, 2, 3, -1, -1}));
  }
  {
    Builder b;
    Value p = b.parameter(t);
    Value cat = b.concatenate({b.slice(p, {3}, {6}, {1}), b.slice(p, {0}, {3}, {1})}, 0);
    auto got = run<float>(b, cat, {t}, std::vector<std::vector<float>>{x});
    EXPECT_EQ(got, (std::vector<float>{3, 4, 5, 0, 1, 2}));
  }
}

TEST(StableHloRun, DotGeneralAndReduce) {
  TensorType a{DType::Float32, {2, 3}}, w{DType::Float32, {3, 2}};
  Builder b;
  Value x = b.parameter(a), y = b.parameter(w);
  Value mm = b.dot_general(x, y, {}, {}, {1}, {0});                       // 2x2
  Value s = b.reduce(mm, b.scalar(0, DType::Float32), {0}, Binary::Add);  // column sums
  auto got = run<float>(b, b.concatenate({b.reshape(mm, {4}), s}, 0), {a, w},
                        std::vector<std::vector<float>>{{1, 2, 3, 4, 5, 6}, {1, 0, 0, 1, 1, 1}});
  EXPECT_EQ(got, (std::vector<float>{4, 5, 10, 11, 14, 16}));
}

TEST(StableHloRun, GatherAndScatter) {
  TensorType t{DType::Float32, {5}};
  Builder b;
  Value p = b.parameter(t);
  Value idx = b.constant_int(0, {DType::Int32, {2, 2}});
  idx = b.binary(Binary::Add, idx, b.iota({DType::Int32, {2, 2}}, 0));  // [[0,0],[1,1]]
  Value g = b.gather_1d(p, idx);                                        // [[p0,p0],[p1,p1]]
  Value sidx = b.iota({DType::Int32, {2}}, 0);
  Value s =
      b.scatter_1d(p, b.binary(Binary::Add, sidx, b.constant_int(3, sidx.type)), b.constant(9, {DType::Float32, {2}}));
  auto got =
      run<float>(b, b.concatenate({b.reshape(g, {4}), s}, 0), {t}, std::vector<std::vector<float>>{{5, 6, 7, 8, 9}});
  EXPECT_EQ(got, (std::vector<float>{5, 5, 6, 6, 5, 6, 7, 9, 9}));
}

}  // namespace
}  // namespace torch_tpu
