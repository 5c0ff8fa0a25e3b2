// The CPU tensor-parallel collectives seam used by CpuModel. Implementations:
// LocalComm (TP=1), ThreadGroupComm (N ranks as threads of one process, for
// tests); the multi-process CPU worker provides a shared-memory one.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace symtp::model {

class HostComm {
 public:
  virtual ~HostComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum of `n` floats over all ranks, summed in rank order 0..N-1 in
  // fp32 ((d0 + d1) + d2) + ..., so the result is bitwise identical on all ranks.
  virtual absl::Status AllReduceSum(float* data, size_t n) = 0;
  // recv[r * n + i] = rank r's send[i]; recv holds size() * n floats.
  virtual absl::Status AllGather(const float* send, size_t n, float* recv) = 0;
};

// TP = 1: AllReduceSum is a no-op, AllGather a copy.
class LocalComm : public HostComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* send, size_t n, float* recv) override;
};

// In-process group for tests: N HostComm endpoints (endpoint r has rank r),
// each to be driven by its own thread. Collectives rendezvous through a
// barrier whose waits end at a deadline `timeout` after the call started;
// a timeout (or mismatched sizes) returns an error on that rank and breaks the
// group, so every later call on any endpoint fails fast instead of hanging.
// n < 1 returns an empty vector.
class ThreadGroupComm {
 public:
  static std::vector<std::unique_ptr<HostComm>> Create(int n, absl::Duration timeout);
};

}  // namespace symtp::model
