#include "runtime/shm_host_comm.h"

#include <cstring>
#include "common/status_macros.h"
#include <new>

#include "absl/strings/str_format.h"

namespace symtp::runtime {

struct ShmHostComm::Header {
  uint64_t magic;
  int32_t tp;
  uint64_t max_floats;
  BarrierWord barrier;
};
namespace {
constexpr uint64_t kHostCommMagic = 0x53594D5448434F4Dull;  // "SYMTHCOM"
constexpr size_t HeaderBytes() { return 256; }
}  // namespace

size_t ShmHostComm::RequiredBytes(int tp, size_t max_floats) {
  return HeaderBytes() + static_cast<size_t>(tp) * max_floats * sizeof(float);
}

absl::Status ShmHostComm::Format(void* mem, size_t bytes, int tp, size_t max_floats) {
  static_assert(sizeof(Header) <= 256);
  if (bytes < RequiredBytes(tp, max_floats)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "hostcomm region too small: %d bytes < %d", bytes, RequiredBytes(tp, max_floats)));
  }
  auto* h = new (mem) Header();
  h->tp = tp;
  h->max_floats = max_floats;
  h->magic = kHostCommMagic;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmHostComm>> ShmHostComm::Attach(void* mem, size_t bytes,
                                                                 int rank, ControlBlock* cb,
                                                                 int64_t timeout_ns) {
  auto* h = static_cast<Header*>(mem);
  if (bytes < HeaderBytes() || h->magic != kHostCommMagic) {
    return absl::FailedPreconditionError("hostcomm region is not formatted");
  }
  if (rank < 0 || rank >= h->tp) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d outside tp %d", rank, h->tp));
  }
  if (bytes < RequiredBytes(h->tp, h->max_floats)) {
    return absl::FailedPreconditionError("hostcomm region smaller than its header says");
  }
  auto* slots = reinterpret_cast<float*>(static_cast<char*>(mem) + HeaderBytes());
  return std::unique_ptr<ShmHostComm>(
      new ShmHostComm(h, slots, rank, h->tp, h->max_floats, cb, timeout_ns));
}

absl::Status ShmHostComm::Barrier(const char* what) {
  return BarrierWait(&h_->barrier, tp_, cb_, tp_, Deadline::AfterNs(timeout_ns_), what);
}

absl::Status ShmHostComm::AllReduceSum(float* data, size_t n) {
  if (tp_ == 1) return absl::OkStatus();
  if (n > max_floats_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("all-reduce of %d floats exceeds the %d-float scratch", n, max_floats_));
  }
  std::memcpy(slot(rank_), data, n * sizeof(float));
  SYMTP_RETURN_IF_ERROR(Barrier("host all-reduce (enter)"));
  for (size_t i = 0; i < n; ++i) {
    float acc = slot(0)[i];
    for (int r = 1; r < tp_; ++r) acc += slot(r)[i];
    data[i] = acc;
  }
  return Barrier("host all-reduce (exit)");
}

absl::Status ShmHostComm::AllGather(const float* send, size_t n, float* recv) {
  if (n > max_floats_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("all-gather of %d floats exceeds the %d-float scratch", n, max_floats_));
  }
  if (tp_ == 1) {
    std::memcpy(recv, send, n * sizeof(float));
    return absl::OkStatus();
  }
  std::memcpy(slot(rank_), send, n * sizeof(float));
  SYMTP_RETURN_IF_ERROR(Barrier("host all-gather (enter)"));
  for (int r = 0; r < tp_; ++r) std::memcpy(recv + static_cast<size_t>(r) * n, slot(r), n * sizeof(float));
  return Barrier("host all-gather (exit)");
}

absl::Status ShmHostComm::Broadcast(void* data, size_t bytes, int root) {
  if (tp_ == 1) return absl::OkStatus();
  if (bytes > capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast of %d bytes exceeds the %d-byte scratch", bytes, capacity_bytes()));
  }
  if (rank_ == root) std::memcpy(slot(root), data, bytes);
  SYMTP_RETURN_IF_ERROR(Barrier("host broadcast (enter)"));
  if (rank_ != root) std::memcpy(data, slot(root), bytes);
  return Barrier("host broadcast (exit)");
}

}  // namespace symtp::runtime
