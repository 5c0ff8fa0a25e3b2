// Process liveness for the shared-memory control plane.
//
// A process that waits on a peer through shared memory (the ring producer on a
// slow consumer, a consumer on an empty ring) must be able to tell "the peer is
// slow" from "the peer is gone". Two sources of truth are combined:
//
//   * the kernel's view of the peer's pid (/proc/<pid>/stat: running, stopped,
//     zombie, gone), plus the process start time from the same file so that a
//     recycled pid is not mistaken for the original process;
//   * a heartbeat that the peer refreshes in shared memory (HeartbeatSlot),
//     which says when the peer was last seen doing ring work.
//
// Error messages name the peer with both, e.g.
//   consumer 2 'worker rank 2' (pid 1234, stopped, heartbeat 1.52 s ago)
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace symtp::ipc {

// What the kernel says about a pid.
enum class ProcState {
  kAlive,    // running, sleeping, in disk wait, idle ...
  kStopped,  // SIGSTOP / job control ('T') or a ptrace stop ('t'): alive but not progressing
  kZombie,   // exited, not yet reaped by its parent ('Z', 'X')
  kDead,     // no such process (ESRCH / no /proc entry), or pid <= 0
};

// Reads /proc/<pid>/stat. A pid that does not exist is kDead; any other read
// failure (e.g. /proc not mounted) falls back to kill(pid, 0).
ProcState ProbeProcess(pid_t pid);

// "alive", "stopped", "zombie", "dead".
const char* ProcStateName(ProcState state);

// True for kAlive and kStopped (the process exists and may still make progress).
inline bool IsLive(ProcState s) { return s == ProcState::kAlive || s == ProcState::kStopped; }

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), or 0 if
// the process does not exist. Together with the pid it identifies a process
// across pid reuse.
uint64_t ProcessStartTicks(pid_t pid);

// Like ProbeProcess, but a live pid whose start time differs from
// `expected_start_ticks` (a recycled pid) is kDead. expected_start_ticks == 0
// skips that check.
ProcState ProbeProcess(pid_t pid, uint64_t expected_start_ticks);

// A heartbeat slot in shared memory: who holds a role (pid, start time, label),
// whether the role is held, and when the holder last showed signs of life.
// Standard layout, only lock-free atomics, no pointers: valid in any process
// that maps it. Written by its holder, read by anyone.
//
// Ordering: the holder writes pid, start_ticks and label, then publishes
// `state = kHeld` with release; readers load `state` with acquire before they
// read the rest. beat_ns is relaxed (it is a diagnostic timestamp).
struct alignas(64) HeartbeatSlot {
  enum State : uint32_t {
    kFree = 0,      // never held, or released by its last holder
    kClaiming = 1,  // being claimed (transient)
    kHeld = 2,      // held by `pid`
    kDetached = 3,  // given up for good (a consumer that left the ring)
  };

  std::atomic<uint32_t> state;
  std::atomic<int32_t> pid;           // current or last holder; 0 = never held
  std::atomic<int64_t> beat_ns;       // MonotonicCoarseNs() of the last beat; 0 = never
  std::atomic<uint64_t> start_ticks;  // ProcessStartTicks(pid) at claim time
  std::atomic<uint32_t> claims;       // how many times the slot was claimed
  uint32_t reserved0;
  char label[48];  // NUL-terminated; accessed bytewise through atomic_ref

  // Holder side. PublishHolder() stores this process's pid, start time, the
  // label and a first beat, then publishes `state = kHeld` (release). The caller
  // has already won the kFree -> kClaiming CAS on `state`.
  void PublishHolder(absl::string_view label_text);
  void Beat();  // beat_ns = MonotonicCoarseNs()

  // Reader side: a consistent-enough snapshot for messages.
  std::string Label() const;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(HeartbeatSlot) == 128);

// The kernel state of the slot's holder, with pid-reuse detection. A slot that
// was never held is kDead.
ProcState ProbeHolder(const HeartbeatSlot& slot);

// Watches the holder of a heartbeat slot for its exit through a pidfd
// (Linux >= 5.3): Probe() is then one poll(2), ~0.2 us, where ProbeHolder
// reads /proc twice (~13 us on the development VM, BM_PeerCheck). Waiters that check their
// peer every few ms while a record may arrive any microsecond use it, so the
// check does not add its own latency to the record's. The pidfd pins the
// process (no pid-reuse race once opened; the start time is checked when it
// is opened) and turns readable when the process exits, zombie or reaped.
// Where pidfds are unavailable (old kernels, seccomp) Probe() is ProbeHolder.
// Follows the slot: a new holder (pid or start time) re-targets it.
// Move-only; owns its pidfd.
class PidWatch {
 public:
  PidWatch() = default;
  ~PidWatch();
  PidWatch(PidWatch&& o) noexcept;
  PidWatch& operator=(PidWatch&& o) noexcept;
  PidWatch(const PidWatch&) = delete;
  PidWatch& operator=(const PidWatch&) = delete;

  // The holder's state: kAlive while the pidfd is not readable (a stopped
  // holder also reads kAlive: staleness is for the deadline's full probe);
  // ProbeHolder's answer once it is (zombie or dead), when the pidfd is being
  // opened, or without pidfds. A slot never held is kDead.
  ProcState Probe(const HeartbeatSlot& slot);

  // True when Probe() works through a pidfd (else it falls back).
  bool uses_pidfd() const { return fd_ >= 0; }

 private:
  void Close();
  int fd_ = -1;
  int32_t pid_ = 0;
  uint64_t start_ticks_ = 0;
  bool unavailable_ = false;  // pidfd_open is not supported here
};

// "consumer 2 'worker rank 2' (pid 1234, stopped, heartbeat 1.52 s ago)".
// `role` is e.g. "consumer 2" or "producer". For slots that are not held the
// parenthesis says so: "never attached", "not attached, last held by pid 77",
// "detached".
std::string DescribePeer(absl::string_view role, const HeartbeatSlot& slot);

// "1.52 s ago", "never".
std::string HeartbeatAge(int64_t beat_ns);

}  // namespace symtp::ipc
