// The shared plugin and client of the C++ tests, and a helper that compiles
// a builder's module and runs it on float32/int inputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pjrt/client.h"
#include "stablehlo/builder.h"

namespace torch_tpu::test {

inline std::string plugin_path() {
  const char* p = std::getenv("TORCH_TPU_PJRT_PLUGIN");
  if (!p) throw std::runtime_error("set TORCH_TPU_PJRT_PLUGIN to the CPU PJRT plugin (make test does)");
  return p;
}

inline pjrt::Client& client() {
  static auto c = std::make_unique<pjrt::Client>(pjrt::Plugin::load(plugin_path()));
  return *c;
}

inline PJRT_Buffer_Type pjrt_type_of(stablehlo::DType t) {
  switch (t) {
    case stablehlo::DType::Float32: return PJRT_Buffer_Type_F32;
    case stablehlo::DType::Int32: return PJRT_Buffer_Type_S32;
    case stablehlo::DType::Int64: return PJRT_Buffer_Type_S64;
    case stablehlo::DType::Bool: return PJRT_Buffer_Type_PRED;
    default: throw std::runtime_error("test helper: unsupported dtype");
  }
}

// Compiles b's module returning `result`, runs it on `inputs` (one host vector
// per parameter, in order, all of type T), and returns the output as U.
template <class U, class T>
std::vector<U> run(stablehlo::Builder& b, const stablehlo::Value& result,
                   const std::vector<stablehlo::TensorType>& params, const std::vector<std::vector<T>>& inputs) {
  auto exe = client().compile(b.module({result}), pjrt::single_device_compile_options());
  std::vector<pjrt::BufferPtr> buffers;
  std::vector<PJRT_Buffer*> raw;
  for (size_t i = 0; i < inputs.size(); ++i) {
    buffers.push_back(client().buffer_from_host(inputs[i].data(), pjrt_type_of(params[i].dtype), params[i].shape,
                                                client().devices()[0]));
    raw.push_back(buffers.back()->raw());
  }
  auto out = exe->execute(raw, client().devices()[0]);
  std::vector<U> host(result.type.numel());
  out[0]->to_host(host.data(), host.size() * sizeof(U));
  return host;
}

// Runs b's module returning `results` on one input of type `param`; returns
// every output's raw bytes, so a test reads each with its own element type.
inline std::vector<std::vector<char>> run_all(stablehlo::Builder& b, const std::vector<stablehlo::Value>& results,
                                              const stablehlo::TensorType& param, const std::vector<float>& input) {
  auto exe = client().compile(b.module(results), pjrt::single_device_compile_options());
  auto buffer = client().buffer_from_host(input.data(), pjrt_type_of(param.dtype), param.shape, client().devices()[0]);
  auto out = exe->execute({buffer->raw()}, client().devices()[0]);
  std::vector<std::vector<char>> host;
  for (size_t k = 0; k < results.size(); ++k) {
    host.emplace_back(results[k].type.numel() * stablehlo::byte_size(results[k].dtype()));
    out[k]->to_host(host.back().data(), host.back().size());
  }
  return host;
}

// Raw output bytes as elements of T.
template <class T>
std::vector<T> as(const std::vector<char>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace torch_tpu::test
