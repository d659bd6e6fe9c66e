// The persistent compilation cache's file format and policy, without a plugin.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/disk_cache.h"

namespace torch_tpu::runtime {
namespace {
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("torch_tpu_disk_cache_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

int count_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

TEST(DiskCache, StoresAndLoads) {
  DiskCache cache(fresh_dir("roundtrip").string(), 1 << 20);
  DiskCache::Lookup lookup;
  EXPECT_FALSE(cache.load("key", &lookup));
  EXPECT_EQ(lookup, DiskCache::Lookup::Miss);
  ASSERT_TRUE(cache.store("key", std::string("payload\0bytes", 13)));
  auto got = cache.load("key", &lookup);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, std::string("payload\0bytes", 13));
  EXPECT_EQ(lookup, DiskCache::Lookup::Hit);
  EXPECT_FALSE(cache.load("other key"));
  EXPECT_EQ(count_files(cache.dir()), 2);  // the entry and its hits sidecar; no temporary file left
  ASSERT_TRUE(cache.store("described", "bytes", "aten::mm", 12.5));
  ASSERT_TRUE(cache.load("described"));
  ASSERT_TRUE(cache.load("described"));
  for (const auto& e : cache.entries()) {
    if (e.what != "aten::mm") continue;
    EXPECT_EQ(e.hits, 2);
    EXPECT_DOUBLE_EQ(e.compile_ms, 12.5);
  }
  EXPECT_EQ(cache.entries().size(), 2u);
  EXPECT_EQ(cache.clear(), 2);
  EXPECT_EQ(count_files(cache.dir()), 0);  // sidecars go with their entries
}

TEST(DiskCache, RejectsDamagedEntries) {
  DiskCache cache(fresh_dir("damaged").string(), 1 << 20);
  ASSERT_TRUE(cache.store("key", "a serialized executable"));
  fs::path file = *fs::directory_iterator(cache.dir());
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const std::string& damaged : {bytes.substr(0, bytes.size() - 1), bytes.substr(0, 10), std::string("junk"),
                                     bytes.substr(0, bytes.size() - 1) + "X"}) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << damaged;
    DiskCache::Lookup lookup;
    EXPECT_FALSE(cache.load("key", &lookup));
    EXPECT_EQ(lookup, DiskCache::Lookup::Rejected);
  }
  ASSERT_TRUE(cache.store("key", "a serialized executable"));  // replaced
  EXPECT_EQ(*cache.load("key"), "a serialized executable");
}

TEST(DiskCache, EvictsLeastRecentlyUsed) {
  const std::string payload(1000, 'x');
  DiskCache cache(fresh_dir("lru").string(), 2500);  // room for two entries with headers
  ASSERT_TRUE(cache.store("a", payload));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(cache.store("b", payload));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(cache.load("a"));  // a is now the most recently used
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(cache.store("c", payload));
  EXPECT_TRUE(cache.load("a"));
  EXPECT_FALSE(cache.load("b"));
  EXPECT_TRUE(cache.load("c"));
  EXPECT_LE(cache.info().bytes, 2500);
  EXPECT_EQ(cache.info().entries, 2);
  EXPECT_EQ(cache.clear(), 2);
  EXPECT_EQ(cache.info().entries, 0);
}

TEST(DiskCache, DisabledDoesNothing) {
  DiskCache cache("", 1 << 20);
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.store("key", "x"));
  EXPECT_FALSE(cache.load("key"));
  EXPECT_EQ(cache.clear(), 0);
}

}  // namespace
}  // namespace torch_tpu::runtime
