#include "models/host_comm.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace symtp::model {

absl::Status LocalComm::AllReduceSum(float*, size_t) { return absl::OkStatus(); }

absl::Status LocalComm::AllGather(const float* send, size_t n, float* recv) {
  if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
  return absl::OkStatus();
}

namespace {

struct GroupState {
  GroupState(int n, absl::Duration t)
      : size(n), timeout_ns(absl::ToInt64Nanoseconds(t)), src(n), counts(n) {}

  const int size;
  const int64_t timeout_ns;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::string broken;  // non-empty once the group is unusable
  std::vector<const float*> src;
  std::vector<size_t> counts;
  std::vector<float> result;

  absl::Status BrokenError(int rank) const {
    return absl::FailedPreconditionError(
        absl::StrFormat("ThreadGroupComm rank %d: group is broken (%s)", rank, broken));
  }

  // Every rank must pass the same element count. Caller holds the lock.
  absl::Status CheckCounts(int rank, size_t n) {
    for (int q = 0; q < size; ++q) {
      if (counts[q] != n) {
        if (broken.empty()) {
          broken = absl::StrFormat("rank %d passed %d elements, rank %d passed %d", q, counts[q],
                                   rank, n);
        }
        return absl::InvalidArgumentError(
            absl::StrFormat("ThreadGroupComm rank %d: mismatched collective (%s)", rank, broken));
      }
    }
    return absl::OkStatus();
  }

  // Blocks until all ranks arrive or `deadline` passes. Caller holds `lock`.
  absl::Status Barrier(int rank, const char* what, const Deadline& deadline,
                       std::unique_lock<std::mutex>& lock) {
    if (!broken.empty()) return BrokenError(rank);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return absl::OkStatus();
    }
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::nanoseconds(deadline.RemainingNs());
    const bool done = cv.wait_until(lock, until,
                                    [&] { return generation != gen || !broken.empty(); });
    if (generation != gen) return absl::OkStatus();
    if (!done) {
      broken = absl::StrFormat("rank %d timed out in %s after %d ms with %d of %d ranks arrived",
                               rank, what, timeout_ns / 1'000'000, arrived, size);
      cv.notify_all();
      return absl::DeadlineExceededError(absl::StrCat("ThreadGroupComm: ", broken));
    }
    return BrokenError(rank);
  }
};

class ThreadEndpoint : public HostComm {
 public:
  ThreadEndpoint(std::shared_ptr<GroupState> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  absl::Status AllReduceSum(float* data, size_t n) override {
    GroupState& g = *g_;
    const Deadline deadline = Deadline::AfterNs(g.timeout_ns);
    std::unique_lock<std::mutex> lock(g.mu);
    if (!g.broken.empty()) return g.BrokenError(rank_);
    g.src[rank_] = data;
    g.counts[rank_] = n;
    if (g.result.size() < n) g.result.resize(n);
    SYMTP_RETURN_IF_ERROR(g.Barrier(rank_, "AllReduceSum/publish", deadline, lock));
    SYMTP_RETURN_IF_ERROR(g.CheckCounts(rank_, n));
    float* result = g.result.data();
    lock.unlock();
    // Each rank sums a disjoint chunk, reading every rank's buffer in rank order.
    const size_t begin = n * rank_ / g.size, end = n * (rank_ + 1) / g.size;
    for (size_t i = begin; i < end; ++i) result[i] = g.src[0][i];
    for (int q = 1; q < g.size; ++q) {
      const float* s = g.src[q];
      for (size_t i = begin; i < end; ++i) result[i] += s[i];
    }
    lock.lock();
    SYMTP_RETURN_IF_ERROR(g.Barrier(rank_, "AllReduceSum/sum", deadline, lock));
    lock.unlock();
    if (n > 0) std::memcpy(data, result, n * sizeof(float));
    lock.lock();
    return g.Barrier(rank_, "AllReduceSum/copy-out", deadline, lock);
  }

  absl::Status AllGather(const float* send, size_t n, float* recv) override {
    GroupState& g = *g_;
    const Deadline deadline = Deadline::AfterNs(g.timeout_ns);
    std::unique_lock<std::mutex> lock(g.mu);
    if (!g.broken.empty()) return g.BrokenError(rank_);
    g.src[rank_] = send;
    g.counts[rank_] = n;
    SYMTP_RETURN_IF_ERROR(g.Barrier(rank_, "AllGather/publish", deadline, lock));
    SYMTP_RETURN_IF_ERROR(g.CheckCounts(rank_, n));
    lock.unlock();
    for (int q = 0; q < g.size; ++q) {
      if (n > 0 && g.src[q] != recv + q * n) std::memcpy(recv + q * n, g.src[q], n * sizeof(float));
    }
    lock.lock();
    return g.Barrier(rank_, "AllGather/copy", deadline, lock);
  }

 private:
  std::shared_ptr<GroupState> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<HostComm>> ThreadGroupComm::Create(int n, absl::Duration timeout) {
  std::vector<std::unique_ptr<HostComm>> out;
  if (n < 1) return out;
  auto state = std::make_shared<GroupState>(n, timeout);
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadEndpoint>(state, r));
  return out;
}

}  // namespace symtp::model
