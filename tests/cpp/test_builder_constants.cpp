// Constants of given elements: the literal text (exact, nested by the shape)
// and the values the plugin reads back.
#include <cmath>

#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;
using test::as;
using test::run_all;

TEST(BuilderConstants, ArrayTextIsNestedAndExact) {
  Builder b;
  b.constant_array({1.0, 0.1, -2.5, 0, 3, 4}, {DType::Float32, {2, 3}});
  b.constant_array_int({7, -1}, {DType::Int64, {2}});
  b.constant_array({5}, {DType::Int32, {}});
  std::string text = b.module({});
  EXPECT_NE(text.find("dense<[[0x3F800000, 0x3DCCCCCD, 0xC0200000], [0x00000000, 0x40400000, 0x40800000]]> : "
                      "tensor<2x3xf32>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dense<[7, -1]> : tensor<2xi64>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<5> : tensor<i32>"), std::string::npos) << text;
}

TEST(BuilderConstants, ArrayRunsThroughThePlugin) {
  Builder b;
  const TensorType f32x2x3{DType::Float32, {2, 3}};
  Value x = b.parameter(f32x2x3);
  Value c = b.constant_array({0.1, 1e-30, -2.5, 3, 1e30, -0.0}, f32x2x3);
  Value i = b.constant_array_int({-3, 0, 1LL << 40}, {DType::Int64, {3, 1}});
  Value f = b.constant_array({1, 2, 3, 4}, {DType::Float64, {2, 1, 2}});
  auto out = run_all(b, {b.binary(stablehlo::Binary::Add, x, c), i, f}, f32x2x3, {0, 0, 0, 0, 0, 0});
  EXPECT_EQ(as<float>(out[0]), (std::vector<float>{0.1f, 1e-30f, -2.5f, 3, 1e30f, -0.0f}));
  EXPECT_EQ(as<int64_t>(out[1]), (std::vector<int64_t>{-3, 0, 1LL << 40}));
  EXPECT_EQ(as<double>(out[2]), (std::vector<double>{1, 2, 3, 4}));
}

// Complex values: (re, im) literals, converts through the parts (XLA has no
// complex -> real convert), and the parts back as float32.
TEST(BuilderConstants, ComplexRunsThroughThePlugin) {
  Builder b;
  const TensorType f32x3{DType::Float32, {3}};
  Value x = b.parameter(f32x3);
  Value z = b.binary(stablehlo::Binary::Multiply, b.convert(x, DType::Complex64),
                     b.complex(b.constant(2, f32x3), b.constant(-1, f32x3)));  // x * (2 - i)
  Value one = b.constant_int(1, {DType::Complex64, {3}});
  Value w = b.binary(stablehlo::Binary::Add, z, one);
  auto out = run_all(b, {b.real(w), b.imag(w), b.convert(w, DType::Float32), b.unary(stablehlo::Unary::Abs, z)}, f32x3,
                     {1, -2, 0.5});
  EXPECT_EQ(as<float>(out[0]), (std::vector<float>{3, -3, 2}));
  EXPECT_EQ(as<float>(out[1]), (std::vector<float>{-1, 2, -0.5}));
  EXPECT_EQ(as<float>(out[2]), (std::vector<float>{3, -3, 2}));
  EXPECT_NEAR(as<float>(out[3])[0], std::sqrt(5.0f), 1e-6);
  EXPECT_THROW(b.compare(stablehlo::Compare::LT, z, z), std::invalid_argument);
  EXPECT_THROW(b.binary(stablehlo::Binary::Maximum, z, z), std::invalid_argument);
}

TEST(BuilderConstants, ArrayOfTheWrongLengthIsRefused) {
  Builder b;
  EXPECT_THROW(b.constant_array({1, 2}, {DType::Float32, {3}}), std::invalid_argument);
  EXPECT_THROW(b.constant_array_int({1, 2, 3}, {DType::Int64, {2, 2}}), std::invalid_argument);
}

}  // namespace
}  // namespace torch_tpu
