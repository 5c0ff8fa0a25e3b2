// Process-shared futex wait/wake on 32-bit words in shared memory.
//
// These are the raw SYS_futex FUTEX_WAIT / FUTEX_WAKE operations *without*
// FUTEX_PRIVATE_FLAG, so a waiter in one process is woken by a waker in another
// as long as both map the same shared page (the kernel keys the wait queue on
// the page's inode and offset, not on the virtual address).
//
// A futex carries no data: the protocol around it (a sequence word that the
// waker bumps before waking, waiter counts so that the fast path makes no
// syscall) lives in ring.cc. FutexWait may return spuriously; callers re-check
// their condition in a loop.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace symtp::ipc {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Sleeps while *word == expected, at most timeout_ns (> 0). Returns OK when
// woken, when *word != expected on entry (EAGAIN), on a timeout (ETIMEDOUT) or
// a signal (EINTR): all of these mean "re-check". Other errors (EFAULT,
// EINVAL, ENOSYS) are returned as a Status.
absl::Status FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// Wakes up to `count` waiters on `word`; returns how many were woken, or a
// negative errno.
int FutexWake(std::atomic<uint32_t>* word, int count);

// Wakes every waiter.
int FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace symtp::ipc
