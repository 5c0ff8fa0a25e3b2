// Shared helpers for the ipc tests: a fixture that gives every test its own
// shared-memory name prefix and child processes, and checks in TearDown that
// no segment under the prefix survives the test; deterministic payloads.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <string>

#include "absl/types/span.h"
#include "ipc/shm_segment.h"
#include "tests/ipc/child_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/unique_name.h"

namespace symtp::ipc::testing {

class IpcTest : public ::testing::Test {
 protected:
  void SetUp() override { prefix_ = ::symtp::testing::UniqueName("symtp_test"); }

  void TearDown() override {
    children_.clear();  // SIGCONT + SIGKILL + reap whatever is still running
    auto left = ListSegments(prefix_);
    ASSERT_TRUE(left.ok()) << left.status();
    for (const SegmentInfo& s : *left) {
      ADD_FAILURE() << "segment left behind: " << s.name;
      (void)RemoveSegmentByName(s.name);
    }
  }

  std::string SegName(const std::string& tag) const { return prefix_ + "_" + tag; }

  // Forks a child running `body` (see child_process.h); owned by the fixture.
  ChildProcess* Spawn(std::function<int()> body) {
    absl::StatusOr<ChildProcess> c = ChildProcess::Spawn(std::move(body));
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      return nullptr;
    }
    children_.push_back(std::move(*c));
    return &children_.back();
  }

  std::string prefix_;
  std::deque<ChildProcess> children_;
};

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A 64-bit hash over bytes, 8 at a time (fast enough for a gigabyte).
inline uint64_t Hash64(const uint8_t* p, size_t n) {
  uint64_t h = 0x243F6A8885A308D3ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return SplitMix64(h);
}

// Byte i of a simple payload for `seq` (for byte-by-byte checks of any size).
inline uint8_t PatternByte(uint64_t seq, size_t i) {
  return static_cast<uint8_t>((seq * 131) ^ (i * 7) ^ (i >> 8));
}

inline void FillPattern(uint64_t seq, absl::Span<uint8_t> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = PatternByte(seq, i);
}

// Index of the first wrong byte, or -1.
inline long FirstPatternMismatch(uint64_t seq, absl::Span<const uint8_t> p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != PatternByte(seq, i)) return static_cast<long>(i);
  }
  return -1;
}

// Checksummed payloads for the stress tests: [seq:8][random bytes][hash:8],
// length a function of seq in [min_len, max_len] (min_len >= 16).
inline size_t ChecksummedLength(uint64_t seq, size_t min_len, size_t max_len) {
  return min_len + SplitMix64(seq ^ 0xA5A5A5A5ull) % (max_len - min_len + 1);
}

inline uint64_t FillChecksummed(uint64_t seq, absl::Span<uint8_t> out) {
  const size_t n = out.size();
  std::memcpy(out.data(), &seq, 8);
  uint64_t s = SplitMix64(seq);
  size_t i = 8;
  for (; i + 8 <= n - 8; i += 8) {
    s = SplitMix64(s);
    std::memcpy(out.data() + i, &s, 8);
  }
  for (; i < n - 8; ++i) out[i] = static_cast<uint8_t>(SplitMix64(s + i));
  uint64_t h = Hash64(out.data(), n - 8);
  std::memcpy(out.data() + n - 8, &h, 8);
  return h;
}

// True if the payload is the one FillChecksummed() wrote for `seq`; *hash is
// its checksum. Otherwise false with *why set.
inline bool CheckChecksummed(uint64_t seq, absl::Span<const uint8_t> p, size_t min_len,
                             size_t max_len, uint64_t* hash, std::string* why) {
  if (p.size() != ChecksummedLength(seq, min_len, max_len)) {
    *why = "seq " + std::to_string(seq) + ": length " + std::to_string(p.size()) + ", expected " +
           std::to_string(ChecksummedLength(seq, min_len, max_len));
    return false;
  }
  uint64_t embedded_seq;
  std::memcpy(&embedded_seq, p.data(), 8);
  if (embedded_seq != seq) {
    *why = "record seq " + std::to_string(seq) + " carries payload of seq " +
           std::to_string(embedded_seq);
    return false;
  }
  uint64_t h;
  std::memcpy(&h, p.data() + p.size() - 8, 8);
  if (Hash64(p.data(), p.size() - 8) != h) {
    *why = "seq " + std::to_string(seq) + ": payload checksum mismatch";
    return false;
  }
  *hash = h;
  return true;
}

}  // namespace symtp::ipc::testing
