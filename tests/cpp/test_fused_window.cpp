// Fused eager's window through the runtime: recorded programs run as one at
// a flush, dead values are not outputs, and a failing window names its op.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tpu::runtime {
namespace {

using stablehlo::Builder;
using stablehlo::Value;

const TensorType kVec{DType::Float32, {4}};

ProgramPtr unary_program(const std::string& key, stablehlo::Unary op) {
  return Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.parameter(kVec);
    return ProgramSpec(b.module({b.unary(op, x)}), {kVec});
  });
}

ProgramPtr add_program() {
  return Runtime::get().program("test_fused|add", [&] {
    Builder b;
    Value x = b.parameter(kVec), y = b.parameter(kVec);
    return ProgramSpec(b.module({b.binary(stablehlo::Binary::Add, x, y)}), {kVec});
  });
}

std::vector<float> read(const pjrt::BufferPtr& buffer) {
  std::vector<float> out(4);
  Runtime::get().download(*buffer, out.data(), out.size() * sizeof(float));
  return out;
}

struct FusedMode {
  FusedMode() { Runtime::get().set_mode(EagerMode::Fused); }
  ~FusedMode() { Runtime::get().set_mode(EagerMode::Strict); }
};

TEST(FusedWindow, RecordsAndRunsOneProgramAtTheHostRead) {
  auto& rt = Runtime::get();
  std::vector<float> host{1, -2, 3, -4};
  auto x = rt.upload(host.data(), DType::Float32, {4}, 0);
  auto neg = unary_program("test_fused|neg", stablehlo::Unary::Negate);
  auto add = add_program();
  FusedMode fused;
  rt.reset_metrics();
  auto y = rt.execute(neg, {x}, 0, "neg")[0];     // -x
  auto z = rt.execute(add, {y, x}, 0, "add")[0];  // -x + x
  auto w = rt.execute(add, {z, y}, 0, "add")[0];  // -x
  EXPECT_TRUE(w->is_placeholder());
  y.reset();
  z.reset();  // dead: not outputs of the window
  EXPECT_EQ(read(w), (std::vector<float>{-1, 2, -3, 4}));
  auto m = rt.metrics();
  EXPECT_EQ(m["fused_flushes"], 1);
  EXPECT_EQ(m["fused_ops"], 3);
  EXPECT_EQ(m["fused_flush_host_read"], 1);
  EXPECT_EQ(m["fused_window_compiles"], 1);
  EXPECT_EQ(m["fused_outputs"], 1);
  // The same ops again: the window program is found, not compiled.
  auto y2 = rt.execute(neg, {x}, 0, "neg")[0];
  auto z2 = rt.execute(add, {y2, x}, 0, "add")[0];
  auto w2 = rt.execute(add, {z2, y2}, 0, "add")[0];
  y2.reset();
  z2.reset();
  EXPECT_EQ(read(w2), (std::vector<float>{-1, 2, -3, 4}));
  EXPECT_EQ(rt.metrics()["fused_window_hits"], 1);
  EXPECT_EQ(rt.metrics()["fused_window_compiles"], 1);
}

TEST(FusedWindow, AWindowThatFailsNamesTheOpThatFails) {
  auto& rt = Runtime::get();
  std::vector<float> host{1, 2, 3, 4};
  auto x = rt.upload(host.data(), DType::Float32, {4}, 0);
  FusedMode fused;  // programs are not compiled alone in Fused mode: the bad one fails at the flush
  auto bad = rt.program("test_fused|bad", [] {
    Builder b;
    Value x = b.parameter(kVec);
    std::string mlir = b.module({x});
    mlir.replace(mlir.find("\"func.return\""), 13, "\"func.not_an_op\"");
    return ProgramSpec(mlir, {kVec});
  });
  auto neg = unary_program("test_fused|neg", stablehlo::Unary::Negate);
  auto y = rt.execute(neg, {x}, 0, "aten::neg")[0];
  auto z = rt.execute(bad, {y}, 0, "aten::bad_op")[0];
  try {
    rt.flush("test");
    FAIL() << "the window should have failed";
  } catch (const std::runtime_error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("aten::bad_op failed (op 2 of a fused window of 2 ops"), std::string::npos) << message;
  }
  // The values it was to compute say so; the runtime stays usable.
  EXPECT_THROW(read(z), std::runtime_error);
  auto again = rt.execute(neg, {x}, 0, "aten::neg")[0];
  EXPECT_EQ(read(again), (std::vector<float>{-1, -2, -3, -4}));
}

// A module function besides @main (a JAX kernel's, Builder::add_function): two
// programs that call the same one share it in the window's module.
const char* kTwice =
    "\"func.func\"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = \"twice\", "
    "sym_visibility = \"private\"}> ({\n  ^bb0(%a: tensor<4xf32>):\n"
    "    %r = \"stablehlo.add\"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
    "    \"func.return\"(%r) : (tensor<4xf32>) -> ()\n  }) : () -> ()";

// A function that calls another one (JAX modules have such helpers).
const char* kFourTimes =
    "\"func.func\"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = \"four_times\", "
    "sym_visibility = \"private\"}> ({\n  ^bb0(%a: tensor<4xf32>):\n"
    "    %t = \"func.call\"(%a) <{callee = @twice}> : (tensor<4xf32>) -> tensor<4xf32>\n"
    "    %r = \"func.call\"(%t) <{callee = @twice}> : (tensor<4xf32>) -> tensor<4xf32>\n"
    "    \"func.return\"(%r) : (tensor<4xf32>) -> ()\n  }) : () -> ()";

ProgramPtr calls_twice(const std::string& key, stablehlo::Unary then) {
  return Runtime::get().program(key, [&] {
    Builder b;
    Value x = b.parameter(kVec);
    b.add_function("twice", kTwice);
    b.add_function("twice", kTwice);  // the same name twice: added once
    return ProgramSpec(b.module({b.unary(then, b.call("twice", {x}, {kVec})[0])}), {kVec});
  });
}

TEST(FusedWindow, ProgramsShareTheFunctionsTheyCall) {
  auto& rt = Runtime::get();
  std::vector<float> host{1, -2, 3, -4};
  auto x = rt.upload(host.data(), DType::Float32, {4}, 0);
  auto abs_twice = calls_twice("test_fused|abs_twice", stablehlo::Unary::Abs);
  auto neg_twice = calls_twice("test_fused|neg_twice", stablehlo::Unary::Negate);
  EXPECT_EQ(read(rt.execute(abs_twice, {x}, 0, "abs_twice")[0]), (std::vector<float>{2, 4, 6, 8}));  // Strict
  FusedMode fused;
  auto y = rt.execute(abs_twice, {x}, 0, "abs_twice")[0];
  auto z = rt.execute(neg_twice, {y}, 0, "neg_twice")[0];
  EXPECT_EQ(read(z), (std::vector<float>{-4, -8, -12, -16}));
  EXPECT_THROW(Builder().call("missing", {}, {kVec}), std::invalid_argument);
}

TEST(FusedWindow, AFunctionsHelpersComeWithIt) {
  auto& rt = Runtime::get();
  std::vector<float> host{1, -2, 3, -4};
  auto x = rt.upload(host.data(), DType::Float32, {4}, 0);
  auto program = rt.program("test_fused|four_times", [&] {
    Builder b;
    Value v = b.parameter(kVec);
    b.add_function("twice", kTwice);
    b.add_function("four_times", kFourTimes);
    return ProgramSpec(b.module({b.call("four_times", {v}, {kVec})[0]}), {kVec});
  });
  FusedMode fused;
  rt.reset_metrics();
  auto y = rt.execute(program, {x}, 0, "four_times")[0];
  auto z = rt.execute(program, {y}, 0, "four_times")[0];
  EXPECT_EQ(read(z), (std::vector<float>{16, -32, 48, -64}));
  auto m = rt.metrics();
  EXPECT_EQ(m["fused_flushes"], 1);
  EXPECT_EQ(m["fused_replays"], 0);  // one program, not replayed op by op
}

}  // namespace
}  // namespace torch_tpu::runtime
