// The persistent compilation cache: serialized executables on disk, shared by
// every execution path and every process. Torch-free.
//
// An entry is one file, named by a hash of what was compiled (StableHLO text,
// compile options, plugin and its version), holding a header (magic, a second
// independent hash of the same key, payload size and checksum) and the
// plugin's serialized executable. Writes go to a temporary file renamed into
// place, so a crash never leaves half an entry; an entry whose header does not
// check out (corrupt, truncated, foreign, a hash collision) is ignored and
// replaced. The directory is kept under a size limit by evicting the least
// recently used entries (a hit refreshes an entry's modification time); the
// directory is scanned when this object's running total passes the limit.
// Processes on one host compile an entry once: the compiler holds the entry's
// lock (lock_entry) and the others wait for it, then load what it stored.
// The runtime keeps one per process (Runtime::disk_cache()).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_tpu::runtime {

class DiskCache {
 public:
  // `dir` empty: disabled.
  DiskCache(std::string dir, int64_t limit_bytes);

  // The directory from TORCH_TPU_CACHE_DIR ("off" disables it), else
  // $XDG_CACHE_HOME/torch_tpu or ~/.cache/torch_tpu; the limit from
  // TORCH_TPU_CACHE_LIMIT (bytes, default 4 GiB).
  static std::unique_ptr<DiskCache> from_environment();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  int64_t limit() const { return limit_; }

  enum class Lookup { Hit, Miss, Rejected };
  // The payload stored for `key`, if a valid entry exists.
  std::optional<std::string> load(const std::string& key, Lookup* result = nullptr);
  // Stores `payload` for `key` atomically, then evicts down to the limit.
  // Returns false (and stores nothing) when the directory cannot be written.
  // `what` and `compile_ms` describe the entry for `entries()` (a sidecar file).
  bool store(const std::string& key, const std::string& payload, const std::string& what = "", double compile_ms = 0);

  // Per entry, for `python -m torch_tpu cache info --entries`: what it holds,
  // its compile time, and its hits (one byte appended per hit to a sidecar,
  // so concurrent processes count without a lock).
  struct Entry {
    std::string file, what;
    int64_t bytes = 0, hits = 0;
    double compile_ms = 0;
    int64_t age_s = 0;  // since last use
  };
  std::vector<Entry> entries() const;

  // An entry's lock, exclusive across the processes (and threads) of a host:
  // flock(2) on `<entry>.lock`, so the kernel releases it when its holder
  // exits, crashed or not: no lock outlives its process. Released on
  // destruction. Not held when the directory cannot be written or the wait
  // passed its limit (the caller then compiles anyway).
  class EntryLock {
   public:
    EntryLock() = default;
    explicit EntryLock(int fd) : fd_(fd) {}
    EntryLock(EntryLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    EntryLock& operator=(EntryLock&& other) noexcept;
    EntryLock(const EntryLock&) = delete;
    EntryLock& operator=(const EntryLock&) = delete;
    ~EntryLock();
    bool held() const { return fd_ >= 0; }

   private:
    int fd_ = -1;
  };
  struct LockWait {
    int64_t waited_us = 0;   // time another holder kept this one waiting
    bool timed_out = false;  // waited `timeout_s` and gave up
  };
  // Takes `key`'s lock, waiting at most `timeout_s` for another holder.
  EntryLock lock_entry(const std::string& key, double timeout_s, LockWait* wait);

  struct Info {
    std::string dir;
    int64_t entries = 0, bytes = 0, limit = 0;
  };
  Info info() const;
  // Removes every entry; returns how many.
  int64_t clear();

 private:
  std::string path_for(const std::string& key) const;
  int64_t evict();  // down to the limit; returns the bytes left
  std::string dir_;
  int64_t limit_;
  std::mutex mutex_;          // one writer at a time (eviction scans)
  int64_t known_bytes_ = -1;  // the directory's size as last scanned plus what store() wrote since; -1: not scanned
};

}  // namespace torch_tpu::runtime
