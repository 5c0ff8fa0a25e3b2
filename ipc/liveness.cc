#include "ipc/liveness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace symtp::ipc {
namespace {

// Reads /proc/<pid>/stat into buf. Returns bytes read, 0 if the process does
// not exist, -1 on another failure.
ssize_t ReadStat(pid_t pid, char* buf, size_t cap) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return (errno == ENOENT || errno == ESRCH) ? 0 : -1;
  ssize_t n;
  do {
    n = ::read(fd, buf, cap - 1);
  } while (n < 0 && errno == EINTR);
  int read_errno = errno;
  ::close(fd);
  if (n < 0) return read_errno == ESRCH ? 0 : -1;
  buf[n] = '\0';
  return n;
}

// The text after the last ')' (the command name may contain spaces and parens).
const char* AfterComm(const char* buf) {
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return nullptr;
  ++p;
  while (*p == ' ') ++p;
  return p;
}

}  // namespace

ProcState ProbeProcess(pid_t pid) {
  if (pid <= 0) return ProcState::kDead;
  char buf[1024];
  ssize_t n = ReadStat(pid, buf, sizeof(buf));
  if (n == 0) return ProcState::kDead;
  const char* p = n > 0 ? AfterComm(buf) : nullptr;
  if (p == nullptr || *p == '\0') {
    // /proc unusable: fall back to the signal probe (no stopped/zombie detail).
    if (::kill(pid, 0) == 0 || errno == EPERM) return ProcState::kAlive;
    return ProcState::kDead;
  }
  switch (*p) {
    case 'T':
    case 't':
      return ProcState::kStopped;
    case 'Z':
    case 'X':
    case 'x':
      return ProcState::kZombie;
    default:
      return ProcState::kAlive;
  }
}

const char* ProcStateName(ProcState state) {
  switch (state) {
    case ProcState::kAlive:
      return "alive";
    case ProcState::kStopped:
      return "stopped";
    case ProcState::kZombie:
      return "zombie";
    case ProcState::kDead:
      return "dead";
  }
  return "unknown";
}

uint64_t ProcessStartTicks(pid_t pid) {
  if (pid <= 0) return 0;
  char buf[1024];
  if (ReadStat(pid, buf, sizeof(buf)) <= 0) return 0;
  const char* p = AfterComm(buf);
  if (p == nullptr) return 0;
  // p points at field 3 (state); starttime is field 22.
  int field = 3;
  while (*p != '\0' && field < 22) {
    if (*p == ' ') ++field;
    ++p;
  }
  if (field != 22) return 0;
  return std::strtoull(p, nullptr, 10);
}

ProcState ProbeProcess(pid_t pid, uint64_t expected_start_ticks) {
  ProcState s = ProbeProcess(pid);
  if (expected_start_ticks != 0 && IsLive(s)) {
    // 0: it vanished between the two reads; another value: a recycled pid.
    if (ProcessStartTicks(pid) != expected_start_ticks) return ProcState::kDead;
  }
  return s;
}

PidWatch::~PidWatch() { Close(); }

PidWatch::PidWatch(PidWatch&& o) noexcept { *this = std::move(o); }

PidWatch& PidWatch::operator=(PidWatch&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    pid_ = o.pid_;
    start_ticks_ = o.start_ticks_;
    unavailable_ = o.unavailable_;
  }
  return *this;
}

void PidWatch::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ProcState PidWatch::Probe(const HeartbeatSlot& slot) {
  const int32_t pid = slot.pid.load(std::memory_order_relaxed);
  const uint64_t start = slot.start_ticks.load(std::memory_order_relaxed);
  if (pid <= 0) return ProcState::kDead;
  if (unavailable_) return ProbeHolder(slot);
  if (fd_ < 0 || pid != pid_ || start != start_ticks_) {
    Close();
    pid_ = pid;
    start_ticks_ = start;
#ifdef SYS_pidfd_open
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
    const int fd = -1;
    errno = ENOSYS;
#endif
    if (fd < 0) {
      if (errno == ESRCH) return ProcState::kDead;
      unavailable_ = true;  // ENOSYS, EPERM (seccomp), ...: the /proc probe every time
      return ProbeHolder(slot);
    }
    fd_ = fd;
    // The pid may have been reused before the pidfd was opened: the start
    // time tells (once; from now on the pidfd pins the process).
    const ProcState s = ProbeHolder(slot);
    if (!IsLive(s)) Close();
    return s;
  }
  pollfd p{fd_, POLLIN, 0};
  const int r = ::poll(&p, 1, 0);
  if (r == 0) return ProcState::kAlive;
  return ProbeHolder(slot);  // exited (readable) or poll failed: ask /proc
}

void HeartbeatSlot::PublishHolder(absl::string_view label_text) {
  pid_t self = ::getpid();
  pid.store(self, std::memory_order_relaxed);
  start_ticks.store(ProcessStartTicks(self), std::memory_order_relaxed);
  size_t n = std::min(label_text.size(), sizeof(label) - 1);
  for (size_t i = 0; i < sizeof(label); ++i) {
    char c = i < n ? label_text[i] : '\0';
    std::atomic_ref<char>(label[i]).store(c, std::memory_order_relaxed);
  }
  beat_ns.store(MonotonicCoarseNs(), std::memory_order_relaxed);
  claims.fetch_add(1, std::memory_order_relaxed);
  state.store(kHeld, std::memory_order_release);
}

// Beat() runs on the ring's hot paths (every Reserve and Peek): the coarse
// clock keeps a clock-source read off them; the age is only a diagnostic.
void HeartbeatSlot::Beat() { beat_ns.store(MonotonicCoarseNs(), std::memory_order_relaxed); }

std::string HeartbeatSlot::Label() const {
  std::string out;
  for (size_t i = 0; i < sizeof(label); ++i) {
    // atomic_ref needs a non-const referent; the load does not modify it.
    char c = std::atomic_ref<char>(const_cast<char&>(label[i])).load(std::memory_order_relaxed);
    if (c == '\0') break;
    out.push_back(c);
  }
  return out;
}

ProcState ProbeHolder(const HeartbeatSlot& slot) {
  pid_t pid = slot.pid.load(std::memory_order_acquire);
  if (pid <= 0) return ProcState::kDead;
  return ProbeProcess(pid, slot.start_ticks.load(std::memory_order_relaxed));
}

std::string HeartbeatAge(int64_t beat_ns) {
  if (beat_ns <= 0) return "never";
  double age_s = static_cast<double>(MonotonicNs() - beat_ns) / 1e9;
  if (age_s < 0) age_s = 0;
  return absl::StrFormat("%.2f s ago", age_s);
}

std::string DescribePeer(absl::string_view role, const HeartbeatSlot& slot) {
  uint32_t state = slot.state.load(std::memory_order_acquire);
  pid_t pid = slot.pid.load(std::memory_order_relaxed);
  std::string label = slot.Label();
  std::string name = label.empty() ? std::string(role) : absl::StrFormat("%s '%s'", role, label);
  std::string beat = HeartbeatAge(slot.beat_ns.load(std::memory_order_relaxed));
  switch (state) {
    case HeartbeatSlot::kHeld:
    case HeartbeatSlot::kClaiming:
      return absl::StrFormat("%s (pid %d, %s, heartbeat %s)", name, pid,
                             ProcStateName(ProbeHolder(slot)), beat);
    case HeartbeatSlot::kDetached:
      return absl::StrFormat("%s (detached, was pid %d)", name, pid);
    case HeartbeatSlot::kFree:
    default:
      if (pid == 0) return absl::StrFormat("%s (never attached)", name);
      return absl::StrFormat("%s (not attached; last held by pid %d, %s, heartbeat %s)", name, pid,
                             ProcStateName(ProbeHolder(slot)), beat);
  }
}

}  // namespace symtp::ipc
