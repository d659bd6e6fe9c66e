#include <fstream>
#include <string>

#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

const char* kAddModule = R"(module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = "stablehlo.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

TEST(Pjrt, LoadsPluginAndListsDevices) {
  auto& c = test::client();
  EXPECT_EQ(c.plugin()->major_version(), 0);
  EXPECT_GE(c.plugin()->minor_version(), kPjrtMinMinor);
  EXPECT_EQ(c.platform_name(), "cpu");
  ASSERT_GE(c.devices().size(), 1u);
  EXPECT_FALSE(c.device_kind(0).empty());
}

TEST(Pjrt, RoundTripsHostData) {
  auto& c = test::client();
  std::vector<int32_t> in{1, -2, 3, 2147483647, -7, 0};
  auto buf = c.buffer_from_host(in.data(), PJRT_Buffer_Type_S32, {2, 3}, c.devices()[0]);
  std::vector<int32_t> out(6);
  buf->to_host(out.data(), out.size() * 4);
  EXPECT_EQ(in, out);
  EXPECT_GE(buf->on_device_size(), 24u);
}

TEST(Pjrt, CompilesAndExecutes) {
  auto& c = test::client();
  auto exe = c.compile(kAddModule, pjrt::single_device_compile_options());
  EXPECT_EQ(exe->num_outputs(), 1u);
  std::vector<float> a{1, 2, 3, 4}, b{10, 20, 30, 40}, out(4);
  auto ba = c.buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {4}, c.devices()[0]);
  auto bb = c.buffer_from_host(b.data(), PJRT_Buffer_Type_F32, {4}, c.devices()[0]);
  auto r = exe->execute({ba->raw(), bb->raw()}, c.devices()[0]);
  r[0]->to_host(out.data(), 16);
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33, 44}));
}

TEST(Pjrt, SerializedExecutableRunsAfterReload) {
  auto& c = test::client();
  auto exe = c.compile(kAddModule, pjrt::single_device_compile_options());
  std::string error;
  const std::string bytes = exe->serialize(&error);
  ASSERT_TRUE(error.empty()) << error;
  auto again = c.deserialize(bytes);
  std::vector<float> a{1, 1, 1, 1}, out(4);
  auto ba = c.buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {4}, c.devices()[0]);
  again->execute({ba->raw(), ba->raw()}, c.devices()[0])[0]->to_host(out.data(), 16);
  EXPECT_EQ(out, (std::vector<float>{2, 2, 2, 2}));
}

TEST(Pjrt, MalformedModuleRaisesPluginMessage) {
  auto& c = test::client();
  try {
    c.compile("module { this is not mlir }", pjrt::single_device_compile_options());
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("PJRT_Client_Compile"), std::string::npos) << what;
    EXPECT_NE(what.find("error"), std::string::npos) << what;
  }
  // The client stays usable after an error.
  EXPECT_NO_THROW(c.compile(kAddModule, pjrt::single_device_compile_options()));
}

TEST(Pjrt, MissingOrInvalidPluginFileIsRefused) {
  EXPECT_THROW(pjrt::Plugin::load("/nonexistent/plugin.so"), std::runtime_error);
  try {
    pjrt::Plugin::load("libm.so.6");  // a real library without GetPjrtApi
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("GetPjrtApi"), std::string::npos);
  }
}

// 10,000 compile-free executions with their buffers must not grow the RSS:
// every PJRT object is released by its RAII owner.
TEST(Pjrt, TenThousandExecutionsLeakNothing) {
  auto& c = test::client();
  auto exe = c.compile(kAddModule, pjrt::single_device_compile_options());
  std::vector<float> a{1, 2, 3, 4}, out(4);
  auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto ba = c.buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {4}, c.devices()[0]);
      auto r = exe->execute({ba->raw(), ba->raw()}, c.devices()[0]);
      r[0]->to_host(out.data(), 16);
    }
  };
  run(1000);  // warm up allocator pools
  long before = rss_kib();
  run(10000);
  long after = rss_kib();
  std::printf("RSS before %ld KiB, after 10000 executions %ld KiB (delta %ld KiB)\n", before, after, after - before);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6, 8}));
  EXPECT_LT(after - before, 4096) << "RSS grew by " << (after - before) << " KiB";
}

}  // namespace
}  // namespace torch_tpu
