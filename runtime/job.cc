#include "runtime/job.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace symtp::runtime {

std::string ProcName(int proc_index) {
  return proc_index == 0 ? std::string("scheduler") : absl::StrCat("worker rank ", proc_index - 1);
}

void RequestAbort(ControlBlock* cb, int code, absl::string_view reason) {
  int32_t expected = 0;
  if (cb->abort_code.compare_exchange_strong(expected, code == 0 ? 1 : code,
                                             std::memory_order_acq_rel)) {
    size_t n = std::min(reason.size(), sizeof(cb->abort_reason) - 1);
    std::memcpy(cb->abort_reason, reason.data(), n);
    cb->abort_reason[n] = '\0';
  }
}

absl::Status CheckAbort(const ControlBlock* cb) {
  if (cb->abort_code.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("job aborted: ", std::string(cb->abort_reason, strnlen(cb->abort_reason,
                                                                         sizeof(cb->abort_reason)))));
}

HeartbeatThread::HeartbeatThread(ProcSlot* slot, int64_t period_ns)
    : slot_(slot), period_ns_(period_ns) {
  slot_->beat_ns.store(MonotonicNs(), std::memory_order_release);
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_acquire)) {
      slot_->beat_ns.store(MonotonicNs(), std::memory_order_release);
      timespec ts{0, static_cast<long>(std::min<int64_t>(period_ns_, 999'999'999))};
      nanosleep(&ts, nullptr);
    }
  });
}

HeartbeatThread::~HeartbeatThread() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

}  // namespace symtp::runtime
