// model::HostComm over the job's shared memory: the CPU backend's
// tensor-parallel all-reduce and all-gather between worker processes.
// All-reduce: each rank copies its partial into its own slot, a barrier, then
// every rank sums the slots in rank order 0..N-1 (so every rank's result is
// bitwise identical), and a second barrier before slots are reused.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "models/host_comm.h"
#include "runtime/job.h"
#include "runtime/shm_barrier.h"

namespace symtp::runtime {

class ShmHostComm : public model::HostComm {
 public:
  static size_t RequiredBytes(int tp, size_t max_floats);
  // The creator (launcher) formats the region once; workers attach.
  static absl::Status Format(void* mem, size_t bytes, int tp, size_t max_floats);
  static absl::StatusOr<std::unique_ptr<ShmHostComm>> Attach(void* mem, size_t bytes, int rank,
                                                             ControlBlock* cb, int64_t timeout_ns);

  int rank() const override { return rank_; }
  int size() const override { return tp_; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllGather(const float* send, size_t n, float* recv) override;
  // Copies `bytes` at root's `data` to every other rank's `data`.
  absl::Status Broadcast(void* data, size_t bytes, int root);
  size_t capacity_bytes() const { return max_floats_ * sizeof(float); }

 private:
  struct Header;
  ShmHostComm(Header* h, float* slots, int rank, int tp, size_t max_floats, ControlBlock* cb,
              int64_t timeout_ns)
      : h_(h), slots_(slots), rank_(rank), tp_(tp), max_floats_(max_floats), cb_(cb),
        timeout_ns_(timeout_ns) {}
  float* slot(int r) const { return slots_ + static_cast<size_t>(r) * max_floats_; }
  absl::Status Barrier(const char* what);  // every rank, within timeout_ns_

  Header* h_;
  float* slots_;
  int rank_, tp_;
  size_t max_floats_;
  ControlBlock* cb_;
  int64_t timeout_ns_;
};

}  // namespace symtp::runtime
