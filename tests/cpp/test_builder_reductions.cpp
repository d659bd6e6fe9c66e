// The builder's ops with regions and several results (variadic reduce, sort):
// golden text, refusals, and executed through the plugin.
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
using stablehlo::Unary;
using stablehlo::Value;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

using test::as;
using test::run_all;

// (value, index) argmax combiner: larger value, a NaN above all, first index on ties.
std::vector<Value> argmax_body(Builder& r, const std::vector<Value>& a) {
  Value v_nan = r.compare(Compare::NE, a[0], a[0]), w_nan = r.compare(Compare::NE, a[2], a[2]);
  Value better = r.binary(Binary::Or, r.compare(Compare::GT, a[0], a[2]),
                          r.binary(Binary::And, v_nan, r.unary(Unary::Not, w_nan)));
  Value equal = r.binary(Binary::Or, r.compare(Compare::EQ, a[0], a[2]), r.binary(Binary::And, v_nan, w_nan));
  Value pick = r.binary(Binary::Or, better, r.binary(Binary::And, equal, r.compare(Compare::LT, a[1], a[3])));
  return {r.select(pick, a[0], a[2]), r.select(pick, a[1], a[3])};
}

std::vector<Value> ascending(Builder& r, const std::vector<Value>& a) { return {r.compare(Compare::LT, a[0], a[1])}; }

TEST(StableHloRegionText, GoldenVariadicReduce) {
  Builder b;
  Value x = b.parameter({DType::Float32, {2, 3}});
  Value i = b.iota({DType::Int64, {2, 3}}, 1);
  auto r = b.reduce({x, i}, {b.scalar(-INFINITY, DType::Float32), b.constant_int(0, {DType::Int64, {}})}, {1},
                    [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
                      Value pick = r.compare(Compare::GE, a[0], a[2]);
                      return {r.select(pick, a[0], a[2]), r.select(pick, a[1], a[3])};
                    });
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].type, (TensorType{DType::Float32, {2}}));
  EXPECT_EQ(r[1].type, (TensorType{DType::Int64, {2}}));
  EXPECT_EQ(r[0].name, "%v10#0");
  EXPECT_EQ(r[1].name, "%v10#1");
  std::string text = b.module(r);
  EXPECT_EQ(text,
            "module @torch_tpu {\n"
            "  func.func public @main(%p0: tensor<2x3xf32>) -> (tensor<2xf32>, tensor<2xi64>) {\n"
            "    %v0 = \"stablehlo.iota\"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi64>\n"
            "    %v1 = \"stablehlo.constant\"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>\n"
            "    %v2 = \"stablehlo.constant\"() {value = dense<0> : tensor<i64>} : () -> tensor<i64>\n"
            "    %v10:2 = \"stablehlo.reduce\"(%p0, %v0, %v1, %v2) ({\n"
            "    ^bb0(%v3: tensor<f32>, %v4: tensor<i64>, %v5: tensor<f32>, %v6: tensor<i64>):\n"
            "      %v7 = \"stablehlo.compare\"(%v3, %v5) {comparison_direction = #stablehlo<comparison_direction GE>, "
            "compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
            "      %v8 = \"stablehlo.select\"(%v7, %v3, %v5) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>\n"
            "      %v9 = \"stablehlo.select\"(%v7, %v4, %v6) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>\n"
            "      \"stablehlo.return\"(%v8, %v9) : (tensor<f32>, tensor<i64>) -> ()\n"
            "    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<2x3xi64>, tensor<f32>, tensor<i64>) -> "
            "(tensor<2xf32>, tensor<2xi64>)\n"
            "    \"func.return\"(%v10#0, %v10#1) : (tensor<2xf32>, tensor<2xi64>) -> ()\n"
            "  }\n"
            "}\n");
}

TEST(StableHloRegionText, GoldenSortAndSingleResult) {
  Builder b;
  Value x = b.parameter({DType::Float32, {4}});
  auto s = b.sort({x}, 0, true, ascending);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].name, "%v3");  // one result: a plain name, no #0
  std::string text = b.module(s);
  EXPECT_NE(text.find("%v3 = \"stablehlo.sort\"(%p0) ({\n    ^bb0(%v0: tensor<f32>, %v1: tensor<f32>):\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("}) {dimension = 0 : i64, is_stable = true} : (tensor<4xf32>) -> tensor<4xf32>\n"),
            std::string::npos)
      << text;
}

TEST(StableHloRegionChecks, MalformedUsesAreRefused) {
  Builder b;
  Value x = b.parameter({DType::Float32, {2, 3}});
  Value i = b.iota({DType::Int64, {2, 3}}, 1), j = b.iota({DType::Int64, {3, 2}}, 1);
  Value f0 = b.scalar(0, DType::Float32), i0 = b.constant_int(0, {DType::Int64, {}});
  auto first = [](Builder&, const std::vector<Value>& a) -> std::vector<Value> { return {a[0], a[1]}; };
  // one init per operand, of its dtype, 0-d
  EXPECT_THROW(b.reduce({x, i}, {f0}, {1}, first), std::invalid_argument);
  EXPECT_THROW(b.reduce({x, i}, {i0, f0}, {1}, first), std::invalid_argument);
  EXPECT_THROW(b.reduce({x}, {b.constant(0, {DType::Float32, {1}})}, {1}, first), std::invalid_argument);
  // operands share a shape; dimensions in range and distinct
  EXPECT_THROW(b.reduce({x, j}, {f0, i0}, {1}, first), std::invalid_argument);
  EXPECT_THROW(b.reduce({x, i}, {f0, i0}, {2}, first), std::invalid_argument);
  EXPECT_THROW(b.reduce({x, i}, {f0, i0}, {1, 1}, first), std::invalid_argument);
  // the region yields one value per operand, typed like the inits
  auto wrong_type = [](Builder&, const std::vector<Value>& a) -> std::vector<Value> { return {a[1], a[0]}; };
  EXPECT_THROW(b.reduce({x, i}, {f0, i0}, {1}, wrong_type), std::invalid_argument);
  auto too_few = [](Builder&, const std::vector<Value>& a) -> std::vector<Value> { return {a[0]}; };
  EXPECT_THROW(b.reduce({x, i}, {f0, i0}, {1}, too_few), std::invalid_argument);
  // sort: a comparator yields one i1; dimension in range; a 0-d operand has none
  EXPECT_THROW(b.sort({x}, 0, true, first), std::invalid_argument);
  EXPECT_THROW(b.sort({x}, 2, true, ascending), std::invalid_argument);
  EXPECT_THROW(b.sort({f0}, 0, true, ascending), std::invalid_argument);
  EXPECT_THROW(b.sort({x, j}, 0, true, ascending), std::invalid_argument);
  // a region cannot declare parameters
  auto adds_param = [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    r.parameter({DType::Float32, {}});
    return {a[0]};
  };
  EXPECT_THROW(b.reduce({x}, {f0}, {1}, adds_param), std::logic_error);
  // after a refusal, the outer body is intact and still compiles
  Value s = b.reduce(x, f0, {1}, Binary::Add);
  auto out = run_all(b, {s}, x.type, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(as<float>(out[0]), (std::vector<float>{6, 15}));
  try {
    b.reduce({x, i}, {f0}, {1}, first);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stablehlo.reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor<2x3xi64>"), std::string::npos) << e.what();
  }
}

TEST(StableHloRegionRun, VariadicReduceArgmaxFirstIndexAndNaN) {
  Builder b;
  TensorType t{DType::Float32, {3, 4}};
  Value x = b.parameter(t);
  Value i = b.iota({DType::Int64, t.shape}, 1);
  auto r = b.reduce(
      {x, i},
      {b.scalar(-INFINITY, DType::Float32), b.constant_int(std::numeric_limits<int64_t>::max(), {DType::Int64, {}})},
      {1}, argmax_body);
  auto out = run_all(b, r, t, {1, 5, 5, 2, /**/ kNaN, 1, kNaN, 9, /**/ -INFINITY, -INFINITY, -INFINITY, -INFINITY});
  auto v = as<float>(out[0]);
  EXPECT_EQ(v[0], 5);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], -INFINITY);
  EXPECT_EQ(as<int64_t>(out[1]), (std::vector<int64_t>{1, 0, 0}));
}

TEST(StableHloRun, MaximumAndMinimumPropagateNaN) {
  // Elementwise, XLA's maximum and minimum propagate NaN as PyTorch's do
  // (a reduce with a plain maximum region does not: the lowering of amax
  // selects NaN explicitly, see VariadicReduceArgmaxFirstIndexAndNaN).
  Builder b;
  TensorType t{DType::Float32, {4}};
  Value x = b.parameter(t);
  Value y = b.constant(1, t);
  auto out = run_all(b, {b.binary(Binary::Maximum, x, y), b.binary(Binary::Minimum, y, x)}, t, {kNaN, 0, 2, kNaN});
  auto mx = as<float>(out[0]), mn = as<float>(out[1]);
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[3]) && std::isnan(mn[0]) && std::isnan(mn[3]));
  EXPECT_EQ(mx[1], 1);
  EXPECT_EQ(mx[2], 2);
  EXPECT_EQ(mn[1], 0);
  EXPECT_EQ(mn[2], 1);
}

TEST(StableHloRegionRun, SortTwoOperandsStableDescending) {
  Builder b;
  TensorType t{DType::Float32, {2, 5}};
  Value x = b.parameter(t);
  Value i = b.iota({DType::Int64, t.shape}, 1);
  auto descending = [](Builder& r, const std::vector<Value>& a) -> std::vector<Value> {
    return {r.compare(Compare::GT, a[0], a[1])};
  };
  auto s = b.sort({x, i}, 1, true, descending);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].type, (TensorType{DType::Int64, {2, 5}}));
  auto out = run_all(b, s, t, {3, 1, 3, 2, 3, /**/ 0, -1, 4, 4, 0});
  EXPECT_EQ(as<float>(out[0]), (std::vector<float>{3, 3, 3, 2, 1, 4, 4, 0, 0, -1}));
  EXPECT_EQ(as<int64_t>(out[1]), (std::vector<int64_t>{0, 2, 4, 3, 1, 2, 3, 0, 4, 1}));
}

TEST(StableHloRegionRun, SortAlongLeadingDimension) {
  Builder b;
  TensorType t{DType::Float32, {3, 2}};
  Value x = b.parameter(t);
  auto s = b.sort({x}, 0, false, ascending);
  auto out = run_all(b, s, t, {3, 0, 1, 5, 2, -1});
  EXPECT_EQ(as<float>(out[0]), (std::vector<float>{1, -1, 2, 0, 3, 5}));
}

}  // namespace
}  // namespace torch_tpu
