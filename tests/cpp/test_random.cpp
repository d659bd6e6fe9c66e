// The random helpers of csrc/lowering/random.h: bits to floats exactly,
// and the distributions the rules build on, run through the plugin.
#include <cmath>

#include "lowering/random.h"
#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;
using test::run;

const TensorType kKey{DType::Int64, {}};

TEST(RandomHelpers, UniformFromBitsTakesTheTopBitsExactly) {
  Builder b;
  const TensorType words{DType::Int32, {4}};
  Value bits = b.parameter(words);
  Value u = lowering::uniform_from_bits(b, bits, 24);
  std::vector<int32_t> in{0, -1, INT32_MIN, 0x100};
  auto out = run<float, int32_t>(b, u, {words}, {in});
  EXPECT_EQ(out, (std::vector<float>{0.0f, 1.0f - std::ldexp(1.0f, -24), 0.5f, std::ldexp(1.0f, -24)}));

  Builder o;
  Value obits = o.parameter(words);
  auto open = run<float, int32_t>(o, lowering::open_uniform_from_bits(o, obits, 24), {words}, {in});
  EXPECT_EQ(open[0], std::ldexp(1.0f, -24));         // never 0
  EXPECT_EQ(open[1], 1.0f - std::ldexp(1.0f, -24));  // never 1
  EXPECT_EQ(open[2], 0.5f + std::ldexp(1.0f, -24));
}

TEST(RandomHelpers, UniformOfANarrowDtypeLiesOnItsGrid) {
  Builder b;
  Value key = b.parameter(kKey);
  Value u = lowering::random_uniform(b, key, {DType::BFloat16, {4096}});
  EXPECT_EQ(u.type, (TensorType{DType::Float32, {4096}}));
  auto out = run<float, int64_t>(b, u, {kKey}, {{12345}});
  double sum = 0;
  for (float v : out) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    ASSERT_EQ(v * 256, std::floor(v * 256)) << v;  // a multiple of 2^-8
    sum += v;
  }
  EXPECT_NEAR(sum / out.size(), 0.5, 5 * std::sqrt(1.0 / 12 / out.size()));
}

TEST(RandomHelpers, SameKeySameNumbersOtherKeyOtherNumbers) {
  auto draw = [](int64_t key) {
    Builder b;
    Value k = b.parameter(kKey);
    return run<float, int64_t>(b, lowering::random_uniform(b, k, {DType::Float32, {256}}), {kKey}, {{key}});
  };
  EXPECT_EQ(draw(7), draw(7));
  auto a = draw(7), c = draw(8);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i];
  EXPECT_LE(same, 2);
}

TEST(RandomHelpers, NormalHasMeanZeroVarianceOne) {
  for (DType t : {DType::Float32, DType::Float64}) {
    Builder b;
    Value key = b.parameter(kKey);
    const int64_t n = 1 << 16;
    Value z = lowering::random_normal(b, key, {t, {n}});
    std::vector<double> out;
    if (t == DType::Float32) {
      auto f = run<float, int64_t>(b, z, {kKey}, {{99}});
      out.assign(f.begin(), f.end());
    } else {
      out = run<double, int64_t>(b, z, {kKey}, {{99}});
    }
    double mean = 0, sq = 0;
    for (double v : out) {
      ASSERT_TRUE(std::isfinite(v));
      mean += v;
      sq += v * v;
    }
    mean /= n;
    const double var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 0, 5 / std::sqrt(double(n)));
    EXPECT_NEAR(var, 1, 5 * std::sqrt(2.0 / n));
  }
}

TEST(RandomHelpers, KeysMustBeZeroDimInt64) {
  Builder b;
  Value wrong = b.parameter({DType::Int32, {}});
  EXPECT_THROW(lowering::random_bits(b, wrong, {4}, DType::Int32), std::invalid_argument);
  EXPECT_THROW(lowering::significand_digits(DType::Int32), std::invalid_argument);
}

}  // namespace
}  // namespace torch_tpu
