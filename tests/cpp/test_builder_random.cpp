// rng_bit_generator: the text the builder writes, and what the plugin draws
// from a state: the same state gives the same bits, another key other bits,
// and every bit position is set about half the time.
#include <bit>
#include <cmath>

#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::Shape;
using stablehlo::TensorType;
using stablehlo::Value;
using test::as;
using test::client;

const TensorType kState{DType::Int64, {2}};

// Draws `shape` bits of type `bits` from `state`; returns {next state, bits} as raw bytes.
std::pair<std::vector<int64_t>, std::vector<char>> draw(const std::vector<int64_t>& state, const Shape& shape,
                                                        DType bits,
                                                        Builder::RngAlgorithm alg = Builder::RngAlgorithm::ThreeFry) {
  Builder b;
  Value s = b.parameter({DType::Int64, {static_cast<int64_t>(state.size())}});
  auto [next, out] = b.rng_bit_generator(s, shape, bits, alg);
  auto exe = client().compile(b.module({next, out}), pjrt::single_device_compile_options());
  auto in = client().buffer_from_host(state.data(), PJRT_Buffer_Type_S64, {static_cast<int64_t>(state.size())},
                                      client().devices()[0]);
  auto results = exe->execute({in->raw()}, client().devices()[0]);
  std::vector<int64_t> next_state(state.size());
  results[0]->to_host(next_state.data(), next_state.size() * sizeof(int64_t));
  std::vector<char> bytes(out.type.numel() * stablehlo::byte_size(bits));
  results[1]->to_host(bytes.data(), bytes.size());
  return {next_state, bytes};
}

TEST(BuilderRandom, TextNamesTheAlgorithmAndBitcastsToUnsigned) {
  Builder b;
  Value s = b.parameter(kState);
  auto [next, bits] = b.rng_bit_generator(s, {3, 4}, DType::Int32);
  EXPECT_EQ(next.type, kState);
  EXPECT_EQ(bits.type, (TensorType{DType::Int32, {3, 4}}));
  std::string text = b.module({next, bits});
  EXPECT_NE(text.find("\"stablehlo.rng_bit_generator\"(%v0) {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : "
                      "(tensor<2xui64>) -> (tensor<2xui64>, tensor<3x4xui32>)"),
            std::string::npos)
      << text;
  Builder p;
  p.rng_bit_generator(p.parameter({DType::Int64, {3}}), {5}, DType::Int64, Builder::RngAlgorithm::Philox);
  EXPECT_NE(p.module({}).find("rng_algorithm PHILOX"), std::string::npos);
}

TEST(BuilderRandom, SameStateSameBitsOtherKeyOtherBits) {
  auto [next_a, a] = draw({1234, 0}, {64}, DType::Int32);
  auto [next_b, b] = draw({1234, 0}, {64}, DType::Int32);
  auto [next_c, c] = draw({1235, 0}, {64}, DType::Int32);
  EXPECT_EQ(a, b);
  EXPECT_EQ(next_a, next_b);
  auto ai = as<int32_t>(a), ci = as<int32_t>(c);
  int same = 0;
  for (size_t i = 0; i < ai.size(); ++i) same += ai[i] == ci[i];
  EXPECT_LE(same, 1);
  // The counter moves past what was drawn, the key stays.
  EXPECT_EQ(next_a[0], 1234);
  EXPECT_NE(next_a[1], 0);
}

TEST(BuilderRandom, EveryBitIsSetHalfTheTime) {
  const int64_t n = 1 << 14;
  for (DType bits : {DType::Int32, DType::Int64}) {
    auto [next, bytes] = draw({987654321, 0}, {n}, bits);
    const int width = bits == DType::Int32 ? 32 : 64;
    std::vector<int64_t> ones(width, 0);
    if (bits == DType::Int32) {
      for (int32_t w : as<int32_t>(bytes))
        for (int k = 0; k < 32; ++k) ones[k] += (static_cast<uint32_t>(w) >> k) & 1;
    } else {
      for (int64_t w : as<int64_t>(bytes))
        for (int k = 0; k < 64; ++k) ones[k] += (static_cast<uint64_t>(w) >> k) & 1;
    }
    // Binomial(n, 1/2): sd = sqrt(n)/2 = 64; 6 sd is never reached by chance.
    for (int k = 0; k < width; ++k) EXPECT_NEAR(static_cast<double>(ones[k]), n / 2.0, 6 * 64.0) << "bit " << k;
  }
}

TEST(BuilderRandom, PhiloxRunsAndDiffersFromThreeFry) {
  auto [n1, philox] = draw({42, 0}, {16}, DType::Int64, Builder::RngAlgorithm::Philox);
  auto [n2, three_fry] = draw({42, 0}, {16}, DType::Int64);
  EXPECT_EQ(philox.size(), three_fry.size());
  EXPECT_NE(philox, three_fry);
}

TEST(BuilderRandom, MalformedUsesAreRefused) {
  Builder b;
  Value f = b.parameter({DType::Float32, {2}});
  Value s3 = b.parameter({DType::Int64, {3}});
  Value s2 = b.parameter(kState);
  EXPECT_THROW(b.rng_bit_generator(f, {4}, DType::Int32), std::invalid_argument);
  EXPECT_THROW(b.rng_bit_generator(s3, {4}, DType::Int32), std::invalid_argument);  // ThreeFry takes 2 words
  EXPECT_THROW(b.rng_bit_generator(s2, {4}, DType::Float32), std::invalid_argument);
  EXPECT_THROW(b.rng_bit_generator(s2, {-1}, DType::Int32), std::invalid_argument);
  EXPECT_NO_THROW(b.rng_bit_generator(s3, {4}, DType::Int32, Builder::RngAlgorithm::Philox));
}

}  // namespace
}  // namespace torch_tpu
