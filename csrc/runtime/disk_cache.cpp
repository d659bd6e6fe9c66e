#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

namespace torch_tpu::runtime {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'C', 'A', 'C', '1'};
constexpr size_t kHeader = sizeof(kMagic) + 3 * sizeof(uint64_t);  // magic, key check, size, checksum
constexpr const char* kSuffix = ".pjrt";

// FNV-1a over `s` from `basis`: two bases give two independent 64-bit hashes.
uint64_t fnv(const std::string& s, uint64_t basis) {
  uint64_t h = basis;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}
uint64_t name_hash(const std::string& s) { return fnv(s, 1469598103934665603ull); }
uint64_t check_hash(const std::string& s) { return fnv(s, 0x9ae16a3b2f90404full); }

std::string hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
uint64_t get_u64(const std::string& in, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

DiskCache::DiskCache(std::string dir, int64_t limit_bytes) : dir_(std::move(dir)), limit_(limit_bytes) {}

std::unique_ptr<DiskCache> DiskCache::from_environment() {
  std::string dir = env("TORCH_TPU_CACHE_DIR");
  if (dir == "off" || dir == "0") {
    dir.clear();
  } else if (dir.empty()) {
    if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty())
      dir = (fs::path(xdg) / "torch_tpu").string();
    else if (std::string home = env("HOME"); !home.empty())
      dir = (fs::path(home) / ".cache" / "torch_tpu").string();
  }
  int64_t limit = int64_t{4} << 30;
  if (std::string s = env("TORCH_TPU_CACHE_LIMIT"); !s.empty()) {
    try {
      limit = std::stoll(s);
    } catch (const std::exception&) {
      throw std::runtime_error("torch_tpu: TORCH_TPU_CACHE_LIMIT='" + s + "' is not a number of bytes.");
    }
  }
  return std::make_unique<DiskCache>(dir, limit);
}

std::string DiskCache::path_for(const std::string& key) const {
  return (fs::path(dir_) / (hex(name_hash(key)) + kSuffix)).string();
}

std::optional<std::string> DiskCache::load(const std::string& key, Lookup* result) {
  auto set = [&](Lookup r) {
    if (result) *result = r;
  };
  set(Lookup::Miss);
  if (!enabled()) return std::nullopt;
  const std::string path = path_for(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool valid = bytes.size() >= kHeader && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0 &&
                     get_u64(bytes, 8) == check_hash(key) && get_u64(bytes, 16) == bytes.size() - kHeader &&
                     get_u64(bytes, 24) == name_hash(bytes.substr(kHeader));
  if (!valid) {  // never trusted: the caller compiles and store() replaces it
    set(Lookup::Rejected);
    return std::nullopt;
  }
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);     // most recently used
  if (std::FILE* hits = std::fopen((path + ".hits").c_str(), "ab")) {  // O_APPEND: one byte per hit, any process
    std::fputc('.', hits);
    std::fclose(hits);
  }
  set(Lookup::Hit);
  return bytes.substr(kHeader);
}

bool DiskCache::store(const std::string& key, const std::string& payload, const std::string& what, double compile_ms) {
  if (!enabled()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  std::string entry(kMagic, sizeof kMagic);
  put_u64(entry, check_hash(key));
  put_u64(entry, payload.size());
  put_u64(entry, name_hash(payload));
  entry += payload;
  static std::atomic<uint64_t> counter{0};
  const std::string path = path_for(key);
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(entry.data(), static_cast<std::streamsize>(entry.size()));
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);  // atomic on POSIX: readers see the old entry or the new one
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  if (!what.empty()) {
    std::ofstream info(path + ".info", std::ios::trunc);
    info << what << "\n" << compile_ms << "\n";
  }
  // A running total, not a scan per write (O(entries) each); other processes'
  // writes are seen at the next scan, when this total passes the limit.
  if (known_bytes_ < 0)
    known_bytes_ = info().bytes;
  else
    known_bytes_ += static_cast<int64_t>(entry.size());
  if (known_bytes_ > limit_) known_bytes_ = evict();
  return true;
}

DiskCache::EntryLock& DiskCache::EntryLock::operator=(EntryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

DiskCache::EntryLock::~EntryLock() {
  if (fd_ >= 0) ::close(fd_);
}

DiskCache::EntryLock DiskCache::lock_entry(const std::string& key, double timeout_s, LockWait* wait) {
  if (!enabled()) return {};
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const std::string path = path_for(key) + ".lock";
  const auto start = std::chrono::steady_clock::now();
  auto waited_us = [&] {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  };
  // Polled, not a blocking flock, so that the wait has a limit: a holder
  // stuck in its compiler must not hang every other process.
  auto pause = std::chrono::milliseconds(1);
  bool contended = false;
  while (true) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return {};
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        ::close(fd);
        return {};
      }
      if (waited_us() > static_cast<int64_t>(timeout_s * 1e6)) {
        ::close(fd);
        if (wait) *wait = {waited_us(), true};
        return {};
      }
      contended = true;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    // The file may have been removed (cache clear) while we waited: a lock
    // on a name no longer in the directory excludes nobody, so lock afresh.
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      if (wait) *wait = {contended ? waited_us() : 0, false};
      return EntryLock(fd);
    }
    ::close(fd);
  }
}

int64_t DiskCache::evict() {
  struct Entry {
    fs::path path;
    fs::file_time_type used;
    int64_t bytes;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != kSuffix) continue;
    int64_t bytes = static_cast<int64_t>(e.file_size(ec));
    entries.push_back({e.path(), e.last_write_time(ec), bytes});
    total += bytes;
  }
  if (total <= limit_) return total;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const auto& e : entries) {
    if (total <= limit_) break;
    if (fs::remove(e.path, ec)) total -= e.bytes;
    fs::remove(e.path.string() + ".info", ec);
    fs::remove(e.path.string() + ".hits", ec);
    fs::remove(e.path.string() + ".lock", ec);  // a holder's waiters see the name gone and lock afresh
  }
  return total;
}

std::vector<DiskCache::Entry> DiskCache::entries() const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!enabled()) return out;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != kSuffix) continue;
    Entry entry;
    entry.file = e.path().filename().string();
    entry.bytes = static_cast<int64_t>(e.file_size(ec));
    entry.age_s = std::chrono::duration_cast<std::chrono::seconds>(now - e.last_write_time(ec)).count();
    const std::string base = e.path().string();
    if (std::ifstream info(base + ".info"); info) {
      std::getline(info, entry.what);
      info >> entry.compile_ms;
    }
    entry.hits = static_cast<int64_t>(fs::file_size(base + ".hits", ec));
    if (ec) entry.hits = 0;
    out.push_back(std::move(entry));
  }
  return out;
}

DiskCache::Info DiskCache::info() const {
  Info i{dir_, 0, 0, limit_};
  std::error_code ec;
  if (!enabled()) return i;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != kSuffix) continue;
    ++i.entries;
    i.bytes += static_cast<int64_t>(e.file_size(ec));
  }
  return i;
}

int64_t DiskCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t removed = 0;
  std::error_code ec;
  if (!enabled()) return 0;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().extension() == kSuffix || e.path().string().find(kSuffix + std::string(".")) != std::string::npos)
      paths.push_back(e.path());
  for (const auto& p : paths) removed += fs::remove(p, ec) && p.extension() == kSuffix ? 1 : 0;
  known_bytes_ = -1;  // rescanned at the next store
  return removed;
}

}  // namespace torch_tpu::runtime
