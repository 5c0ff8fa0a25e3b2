// Monotonic time and deadlines. All durations inside symtp are int64 nanoseconds
// of CLOCK_MONOTONIC unless a name says otherwise.
#pragma once

#include <time.h>

#include <cstdint>

namespace symtp {

inline int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// CLOCK_MONOTONIC as of the last scheduler tick (1-4 ms resolution, never
// ahead of MonotonicNs()): a vDSO read that does not touch the clock source
// hardware, cheap even on VMs whose clock source makes MonotonicNs() a
// system call. For timestamps that only need to be roughly current
// (heartbeats on hot paths).
inline int64_t MonotonicCoarseNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline int64_t WallClockNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A point in monotonic time after which a wait gives up. Every wait in symtp
// takes one.
class Deadline {
 public:
  static Deadline AfterNs(int64_t ns) { return Deadline(MonotonicNs() + ns); }
  static Deadline AfterMs(int64_t ms) { return AfterNs(ms * 1'000'000); }

  int64_t at_ns() const { return at_ns_; }
  bool Expired() const { return MonotonicNs() >= at_ns_; }
  int64_t RemainingNs() const {
    int64_t r = at_ns_ - MonotonicNs();
    return r > 0 ? r : 0;
  }

 private:
  explicit Deadline(int64_t at) : at_ns_(at) {}
  int64_t at_ns_;
};

}  // namespace symtp
