// Random numbers in a program. Every random op's program reads one 0-d int64
// key (fresh per call: the generator's seed and offset mixed on the host) and
// draws all its bits from it with stablehlo.rng_bit_generator (ThreeFry,
// state [key, 0]). These helpers turn the bits into distributions; they are
// shared by the rules of random.cpp and tested on their own.
#pragma once

#include <string_view>

#include "stablehlo/builder.h"

namespace torch_tpu::lowering {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::Shape;
using stablehlo::TensorType;
using stablehlo::Value;

// `shape` random words, Int32 or Int64, from the 0-d int64 `key`.
Value random_bits(Builder& b, const Value& key, const Shape& shape, DType bits);

// The significand bits of a float dtype, the implicit one included (float32: 24).
int significand_digits(DType t);
// The type random floats of dtype `t` are computed in: float64 for float64, float32 otherwise.
DType random_compute_type(DType t);

// Uniform on [0, 1) from random words (Int32 -> float32, Int64 -> float64):
// the top `digits` bits times 2^-digits, so every value is exact in a float
// of `digits` significand bits and the grid is even.
Value uniform_from_bits(Builder& b, const Value& bits, int digits);
// Uniform on the open (0, 1): (the top digits-1 bits + 1/2) * 2^-(digits-1).
// What logarithms and tangents take: never 0, never 1.
Value open_uniform_from_bits(Builder& b, const Value& bits, int digits);

// Uniform on [0, 1) of `type.shape` in random_compute_type(type.dtype), on the
// grid of type.dtype's own significand (bfloat16: multiples of 2^-8), as PyTorch draws.
Value random_uniform(Builder& b, const Value& key, const TensorType& type);
// Standard normal of `type.shape` in random_compute_type(type.dtype): Box-Muller
// on two open uniforms of the compute type's full precision.
Value random_normal(Builder& b, const Value& key, const TensorType& type);

// Whether the rule of `op` overwrites its first argument without reading it
// (uniform_, normal_, bernoulli_, ...): the general kernel then passes that
// argument like an out= one, so a fresh tensor is never uploaded to be
// overwritten.
bool overwrites_first_argument(std::string_view op);

}  // namespace torch_tpu::lowering
