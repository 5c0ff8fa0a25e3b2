#include "ipc/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "common/status_macros.h"

namespace symtp::ipc {
namespace {

long SysFutex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  // The atomic is the same object representation as the uint32_t the kernel
  // reads (static_asserts in futex.h).
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

}  // namespace

absl::Status FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return absl::OkStatus();
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
  // Relative timeout, CLOCK_MONOTONIC. Not FUTEX_WAIT_PRIVATE: the word is shared
  // between processes.
  long rc = SysFutex(word, FUTEX_WAIT, expected, &ts);
  if (rc == 0) return absl::OkStatus();
  int err = errno;
  if (err == EAGAIN || err == ETIMEDOUT || err == EINTR) return absl::OkStatus();
  return ErrnoToStatus(err, "syscall(SYS_futex, FUTEX_WAIT)", __FILE__, __LINE__);
}

int FutexWake(std::atomic<uint32_t>* word, int count) {
  long rc = SysFutex(word, FUTEX_WAKE, static_cast<uint32_t>(count), nullptr);
  return rc < 0 ? -errno : static_cast<int>(rc);
}

int FutexWakeAll(std::atomic<uint32_t>* word) { return FutexWake(word, INT_MAX); }

}  // namespace symtp::ipc
