#include "ipc/liveness.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <new>
#include <thread>

#include "common/clock.h"
#include "ipc/futex.h"
#include "tests/ipc/ipc_test_util.h"

namespace symtp::ipc {
namespace {

using ::symtp::ipc::testing::ChildProcess;
using ::symtp::ipc::testing::SleepForever;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Polls ProbeProcess until it reports `want` or 5 s pass (the kernel applies
// SIGSTOP / exit asynchronously).
ProcState WaitForState(pid_t pid, ProcState want) {
  Deadline d = Deadline::AfterMs(5000);
  ProcState s = ProbeProcess(pid);
  while (s != want && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = ProbeProcess(pid);
  }
  return s;
}

TEST(LivenessTest, SelfIsAliveWithStableStartTime) {
  EXPECT_EQ(ProbeProcess(::getpid()), ProcState::kAlive);
  uint64_t t = ProcessStartTicks(::getpid());
  EXPECT_GT(t, 0u);
  EXPECT_EQ(ProcessStartTicks(::getpid()), t);
  EXPECT_EQ(ProbeProcess(::getpid(), t), ProcState::kAlive);
}

TEST(LivenessTest, RecycledPidIsDead) {
  uint64_t t = ProcessStartTicks(::getpid());
  EXPECT_EQ(ProbeProcess(::getpid(), t + 1), ProcState::kDead);
}

TEST(LivenessTest, InvalidAndMissingPidsAreDead) {
  EXPECT_EQ(ProbeProcess(0), ProcState::kDead);
  EXPECT_EQ(ProbeProcess(-1), ProcState::kDead);
  EXPECT_EQ(ProbeProcess(INT_MAX), ProcState::kDead);  // above any pid_max
  EXPECT_EQ(ProcessStartTicks(INT_MAX), 0u);
}

TEST(LivenessTest, ChildThroughStoppedZombieDead) {
  auto child = ChildProcess::Spawn([] {
    SleepForever();
    return 0;
  });
  ASSERT_OK(child);
  pid_t pid = child->pid();
  EXPECT_EQ(ProbeProcess(pid), ProcState::kAlive);

  ASSERT_TRUE(child->Signal(SIGSTOP));
  EXPECT_EQ(WaitForState(pid, ProcState::kStopped), ProcState::kStopped);
  EXPECT_TRUE(IsLive(ProcState::kStopped));

  ASSERT_TRUE(child->Signal(SIGCONT));
  EXPECT_EQ(WaitForState(pid, ProcState::kAlive), ProcState::kAlive);

  ASSERT_TRUE(child->Signal(SIGKILL));
  // Not reaped yet: a zombie, which counts as not live.
  EXPECT_EQ(WaitForState(pid, ProcState::kZombie), ProcState::kZombie);
  EXPECT_FALSE(IsLive(ProcState::kZombie));

  ASSERT_OK(child->Wait(Deadline::AfterMs(5000)));
  EXPECT_EQ(ProbeProcess(pid), ProcState::kDead);
}

// A slot naming `pid` as its holder (as PublishHolder would in that process).
void HoldFor(HeartbeatSlot* slot, pid_t pid) {
  slot->pid.store(pid);
  slot->start_ticks.store(ProcessStartTicks(pid));
  slot->state.store(HeartbeatSlot::kHeld);
}

bool PidfdsWorkHere() {
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (fd < 0) return false;
  ::close(fd);
  return true;
#else
  return false;
#endif
}

// Polls PidWatch::Probe until it reports `want` or 5 s pass.
ProcState WaitForWatch(PidWatch* w, const HeartbeatSlot& slot, ProcState want) {
  Deadline d = Deadline::AfterMs(5000);
  ProcState s = w->Probe(slot);
  while (s != want && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = w->Probe(slot);
  }
  return s;
}

TEST(PidWatchTest, FollowsAChildThroughExitAndTheSlotToANewHolder) {
  alignas(64) unsigned char storage[sizeof(HeartbeatSlot)];
  auto* slot = new (storage) HeartbeatSlot();
  PidWatch w;
  EXPECT_EQ(w.Probe(*slot), ProcState::kDead);  // never held

  auto child = ChildProcess::Spawn([] {
    SleepForever();
    return 0;
  });
  ASSERT_OK(child);
  HoldFor(slot, child->pid());
  EXPECT_EQ(w.Probe(*slot), ProcState::kAlive);  // opens the pidfd
  EXPECT_EQ(w.Probe(*slot), ProcState::kAlive);  // polls it
  EXPECT_EQ(w.uses_pidfd(), PidfdsWorkHere());

  // Stopped reads alive between deadlines (staleness is the deadline's job).
  ASSERT_TRUE(child->Signal(SIGSTOP));
  EXPECT_EQ(WaitForState(child->pid(), ProcState::kStopped), ProcState::kStopped);
  EXPECT_TRUE(IsLive(w.Probe(*slot)));
  ASSERT_TRUE(child->Signal(SIGCONT));

  // Killed and not reaped: a zombie, not live; reaped: dead.
  ASSERT_TRUE(child->Signal(SIGKILL));
  EXPECT_EQ(WaitForWatch(&w, *slot, ProcState::kZombie), ProcState::kZombie);
  ASSERT_OK(child->Wait(Deadline::AfterMs(5000)));
  EXPECT_EQ(w.Probe(*slot), ProcState::kDead);

  // A new holder of the slot re-targets the watch; moving it keeps it.
  auto second = ChildProcess::Spawn([] {
    SleepForever();
    return 0;
  });
  ASSERT_OK(second);
  HoldFor(slot, second->pid());
  EXPECT_EQ(w.Probe(*slot), ProcState::kAlive);
  PidWatch moved = std::move(w);
  EXPECT_EQ(moved.Probe(*slot), ProcState::kAlive);
  ASSERT_TRUE(second->Signal(SIGKILL));
  EXPECT_EQ(WaitForWatch(&moved, *slot, ProcState::kZombie), ProcState::kZombie);
  slot->~HeartbeatSlot();
}

TEST(PidWatchTest, RecycledPidIsDead) {
  alignas(64) unsigned char storage[sizeof(HeartbeatSlot)];
  auto* slot = new (storage) HeartbeatSlot();
  HoldFor(slot, ::getpid());
  slot->start_ticks.store(slot->start_ticks.load() + 1);  // "another process with this pid"
  PidWatch w;
  EXPECT_EQ(w.Probe(*slot), ProcState::kDead);
  EXPECT_FALSE(w.uses_pidfd());
  slot->~HeartbeatSlot();
}

TEST(LivenessTest, StateNames) {
  EXPECT_STREQ(ProcStateName(ProcState::kAlive), "alive");
  EXPECT_STREQ(ProcStateName(ProcState::kStopped), "stopped");
  EXPECT_STREQ(ProcStateName(ProcState::kZombie), "zombie");
  EXPECT_STREQ(ProcStateName(ProcState::kDead), "dead");
}

TEST(LivenessTest, DescribePeerNamesRoleLabelPidStateAndHeartbeat) {
  alignas(64) unsigned char storage[sizeof(HeartbeatSlot)];
  auto* slot = new (storage) HeartbeatSlot();
  EXPECT_EQ(DescribePeer("consumer 2", *slot), "consumer 2 (never attached)");

  slot->PublishHolder("worker rank 2");
  EXPECT_THAT(
      DescribePeer("consumer 2", *slot),
      AllOf(HasSubstr("consumer 2 'worker rank 2' (pid "), HasSubstr(std::to_string(::getpid())),
            HasSubstr(", alive, heartbeat "), HasSubstr(" s ago)")));
  EXPECT_EQ(slot->Label(), "worker rank 2");

  slot->state.store(HeartbeatSlot::kFree);
  EXPECT_THAT(DescribePeer("producer", *slot),
              HasSubstr("not attached; last held by pid " + std::to_string(::getpid())));
  slot->state.store(HeartbeatSlot::kDetached);
  EXPECT_THAT(DescribePeer("consumer 1", *slot), HasSubstr("(detached, was pid"));
  slot->~HeartbeatSlot();
}

TEST(LivenessTest, LongLabelsAreTruncated) {
  alignas(64) unsigned char storage[sizeof(HeartbeatSlot)];
  auto* slot = new (storage) HeartbeatSlot();
  slot->PublishHolder(std::string(100, 'x'));
  EXPECT_EQ(slot->Label(), std::string(47, 'x'));
  slot->~HeartbeatSlot();
}

TEST(LivenessTest, HeartbeatAgeFormatting) {
  EXPECT_EQ(HeartbeatAge(0), "never");
  EXPECT_THAT(HeartbeatAge(MonotonicNs() - 1'520'000'000), HasSubstr("1.5"));
  EXPECT_THAT(HeartbeatAge(MonotonicNs()), HasSubstr(" s ago"));
}

// ---------------------------------------------------------------------------
// Futex: process-shared waits on a word in a MAP_SHARED mapping.

class FutexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem_, MAP_FAILED);
    word_ = new (mem_) std::atomic<uint32_t>(0);
    done_ = new (static_cast<char*>(mem_) + 64) std::atomic<uint32_t>(0);
  }
  void TearDown() override { ::munmap(mem_, 4096); }
  void* mem_ = nullptr;
  std::atomic<uint32_t>* word_ = nullptr;
  std::atomic<uint32_t>* done_ = nullptr;
};

TEST_F(FutexTest, MismatchedValueReturnsAtOnce) {
  word_->store(7);
  EXPECT_OK(FutexWait(word_, 3, 10'000'000'000));  // would sleep 10 s if it waited
}

TEST_F(FutexTest, TimesOutWithoutWake) {
  EXPECT_OK(FutexWait(word_, 0, 2'000'000));
  EXPECT_EQ(word_->load(), 0u);
}

TEST_F(FutexTest, WakeWithNoWaitersWakesNobody) { EXPECT_EQ(FutexWake(word_, 1), 0); }

TEST_F(FutexTest, WakesAWaiterInAnotherProcess) {
  std::atomic<uint32_t>* word = word_;
  std::atomic<uint32_t>* done = done_;
  auto child = ChildProcess::Spawn([word, done] {
    // Sleep until the word changes (each wait bounded so a bug cannot hang).
    Deadline d = Deadline::AfterMs(20'000);
    done->store(1);  // about to wait
    while (word->load() == 0 && !d.Expired()) {
      if (!FutexWait(word, 0, 1'000'000'000).ok()) return 2;
    }
    return word->load() == 1 ? 0 : 1;
  });
  ASSERT_OK(child);
  while (done_->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it reach FUTEX_WAIT
  word_->store(1);
  FutexWakeAll(word_);
  auto st = child->Wait(Deadline::AfterMs(20'000));
  ASSERT_OK(st);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << testing::DescribeWaitStatus(*st);
}

}  // namespace
}  // namespace symtp::ipc
