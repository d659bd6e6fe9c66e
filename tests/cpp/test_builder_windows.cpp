// The builder's windowed reductions (reduce_window): golden text, refusals,
// and executed through the plugin.
#include <cmath>
#include <cstring>
#include <limits>

#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Binary;
using stablehlo::Builder;
using stablehlo::Compare;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;

std::vector<Value> add_body(Builder& r, const std::vector<Value>& a) { return {r.binary(Binary::Add, a[0], a[1])}; }

using test::as;
using test::run_all;

TEST(StableHloWindowText, GoldenReduceWindow) {
  Builder b;
  Value x = b.parameter({DType::Float32, {4, 5}});
  auto r = b.reduce_window({x}, {b.scalar(0, DType::Float32)}, {2, 3}, {2, 1}, {}, {1, 2}, {{0, 1}, {1, 0}}, add_body);
  ASSERT_EQ(r.size(), 1u);
  // rows: (4 + 1 - 2) / 2 + 1 = 2; columns: (5 + 1 - 5) / 1 + 1 = 2
  EXPECT_EQ(r[0].type, (TensorType{DType::Float32, {2, 2}}));
  std::string text = b.module(r);
  EXPECT_NE(text.find("%v4 = \"stablehlo.reduce_window\"(%p0, %v0) ({\n    ^bb0(%v1: tensor<f32>, %v2: tensor<f32>):\n"
                      "      %v3 = \"stablehlo.add\"(%v1, %v2) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
                      "      \"stablehlo.return\"(%v3) : (tensor<f32>) -> ()\n"
                      "    }) {base_dilations = array<i64: 1, 1>, padding = dense<[[0, 1], [1, 0]]> : "
                      "tensor<2x2xi64>, window_dilations = array<i64: 1, 2>, window_dimensions = array<i64: 2, 3>, "
                      "window_strides = array<i64: 2, 1>} : (tensor<4x5xf32>, tensor<f32>) -> tensor<2x2xf32>\n"),
            std::string::npos)
      << text;
}

TEST(StableHloWindowChecks, MalformedUsesAreRefused) {
  Builder b;
  Value x = b.parameter({DType::Float32, {4, 5}});
  Value i = b.iota({DType::Int64, {4, 5}}, 1), j = b.iota({DType::Int64, {5, 4}}, 1);
  Value f0 = b.scalar(0, DType::Float32), i0 = b.constant_int(0, {DType::Int64, {}});
  auto first = [](Builder&, const std::vector<Value>& a) -> std::vector<Value> { return {a[0], a[1]}; };
  std::vector<std::pair<int64_t, int64_t>> no_pad{{0, 0}, {0, 0}};
  // one 0-d init per operand, of its dtype; operands share a shape
  EXPECT_THROW(b.reduce_window({x, i}, {f0}, {2, 2}, {}, {}, {}, no_pad, first), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x, i}, {i0, f0}, {2, 2}, {}, {}, {}, no_pad, first), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x, j}, {f0, i0}, {2, 2}, {}, {}, {}, no_pad, first), std::invalid_argument);
  // an attribute for every dimension, positive sizes
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2}, {}, {}, {}, no_pad, add_body), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 2}, {}, {}, {}, {{0, 0}}, add_body), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 0}, {}, {}, {}, no_pad, add_body), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 2}, {1, 0}, {}, {}, no_pad, add_body), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 2}, {}, {}, {0, 1}, no_pad, add_body), std::invalid_argument);
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 2}, {}, {}, {}, {{-5, 0}, {0, 0}}, add_body), std::invalid_argument);
  // the body yields one value per operand, of the init's type
  EXPECT_THROW(b.reduce_window({x}, {f0}, {2, 2}, {}, {}, {}, no_pad, first), std::invalid_argument);
}

TEST(StableHloWindowExecuted, PaddedStridedSum) {
  Builder b;
  TensorType t{DType::Float32, {3, 4}};
  Value x = b.parameter(t);
  // 2x2 windows, stride 2, one row/column of zero padding on each side.
  auto r = b.reduce_window({x}, {b.scalar(0, DType::Float32)}, {2, 2}, {2, 2}, {}, {}, {{1, 1}, {1, 1}}, add_body);
  ASSERT_EQ(r[0].type, (TensorType{DType::Float32, {2, 3}}));
  std::vector<float> in(12);
  for (int k = 0; k < 12; ++k) in[k] = static_cast<float>(k);  // [[0 1 2 3] [4 5 6 7] [8 9 10 11]]
  auto out = as<float>(run_all(b, r, t, in)[0]);
  std::vector<float> expected{0, 1 + 2, 3, 4 + 8, 5 + 6 + 9 + 10, 7 + 11};
  EXPECT_EQ(out, expected);
}

TEST(StableHloWindowExecuted, DilatedMaxWithIndex) {
  Builder b;
  TensorType t{DType::Float32, {1, 6}};
  Value x = b.parameter(t);
  Value idx = b.iota({DType::Int64, {1, 6}}, 1);
  // window of 2 taps, dilation 2, stride 1: (0,2) (1,3) (2,4) (3,5); larger value, first index on ties.
  auto body = [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    Value gt = r.compare(Compare::GT, a[0], a[2]), eq = r.compare(Compare::EQ, a[0], a[2]);
    Value pick = r.binary(Binary::Or, gt, r.binary(Binary::And, eq, r.compare(Compare::LT, a[1], a[3])));
    return {r.select(pick, a[0], a[2]), r.select(pick, a[1], a[3])};
  };
  auto r = b.reduce_window({x, idx}, {b.scalar(-INFINITY, DType::Float32), b.constant_int(99, {DType::Int64, {}})},
                           {1, 2}, {}, {}, {1, 2}, {{0, 0}, {0, 0}}, body);
  ASSERT_EQ(r[1].type, (TensorType{DType::Int64, {1, 4}}));
  auto host = run_all(b, r, t, {5, 1, 5, 7, 2, 0});
  EXPECT_EQ(as<float>(host[0]), (std::vector<float>{5, 7, 5, 7}));
  EXPECT_EQ(as<int64_t>(host[1]), (std::vector<int64_t>{0, 3, 2, 3}));
}

TEST(StableHloWindowExecuted, BaseDilation) {
  Builder b;
  TensorType t{DType::Float32, {3}};
  Value x = b.parameter(t);
  // base dilation 2: [1 . 2 . 3] (holes hold the init); windows of 2, stride 1.
  auto r = b.reduce_window({x}, {b.scalar(0, DType::Float32)}, {2}, {}, {2}, {}, {{0, 0}}, add_body);
  ASSERT_EQ(r[0].type, (TensorType{DType::Float32, {4}}));
  EXPECT_EQ(as<float>(run_all(b, r, t, {1, 2, 3})[0]), (std::vector<float>{1, 2, 2, 3}));
}

}  // namespace
}  // namespace torch_tpu
