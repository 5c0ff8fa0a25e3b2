// Multi-process tests of the SPMC ring over a ShmSegment: producer and
// consumers in separate processes (forked children that attach by name), a
// million-record stress run, and peers that are killed or stopped.
//
// Every child is killed and reaped in TearDown (IpcTest), dies with the test
// process (PR_SET_PDEATHSIG), and every segment is removed (TearDown checks).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "ipc/liveness.h"
#include "ipc/ring.h"
#include "ipc/shm_segment.h"
#include "tests/ipc/ipc_test_util.h"

namespace symtp::ipc {
namespace {

using ::symtp::ipc::testing::CheckChecksummed;
using ::symtp::ipc::testing::ChecksummedLength;
using ::symtp::ipc::testing::ChildProcess;
using ::symtp::ipc::testing::DescribeWaitStatus;
using ::symtp::ipc::testing::FillChecksummed;
using ::symtp::ipc::testing::FillPattern;
using ::symtp::ipc::testing::FirstPatternMismatch;
using ::symtp::ipc::testing::IpcTest;
using ::symtp::ipc::testing::ReadyPipe;
using ::symtp::ipc::testing::SleepForever;
using ::symtp::ipc::testing::SplitMix64;
using ::symtp::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// The full million records also under ASan and TSan (about 20 s under a
// Debug TSan build on 2 cores).
constexpr uint64_t kStressRecords = 1'000'000;
constexpr size_t kStressMinLen = 16;
constexpr size_t kStressMaxLen = 1024;

// Written by a child before it exits, read by the parent after reaping it.
struct alignas(64) ChildReport {
  uint64_t count;
  uint64_t digest;
  int64_t error_ns;  // MonotonicNs() when the expected error arrived
  char message[1024];

  void Set(const std::string& m) {
    size_t n = std::min(m.size(), sizeof(message) - 1);
    std::memcpy(message, m.data(), n);
    message[n] = '\0';
  }
};
constexpr int kMaxReports = 8;

uint64_t Mix(uint64_t digest, uint64_t h) { return SplitMix64(digest ^ h); }

bool ExitedOk(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

// A job segment with a ring and child report slots, created by the test
// process (the "launcher"). Children attach by name.
struct Job {
  ShmSegment seg;
  SpmcRing ring;
  ChildReport* reports;
};

absl::StatusOr<Job> CreateJob(const std::string& name, RingConfig cfg) {
  size_t ring_bytes = SpmcRing::RequiredBytes(cfg);
  size_t bytes = ShmSegment::RegionFootprint(ring_bytes) +
                 ShmSegment::RegionFootprint(sizeof(ChildReport) * kMaxReports);
  SYMTP_ASSIGN_OR_RETURN(ShmSegment seg, ShmSegment::Create(name, bytes));
  SYMTP_ASSIGN_OR_RETURN(void* ring_mem, seg.Allocate("ring", ring_bytes));
  SYMTP_ASSIGN_OR_RETURN(void* rep, seg.Allocate("reports", sizeof(ChildReport) * kMaxReports));
  SYMTP_ASSIGN_OR_RETURN(SpmcRing ring, SpmcRing::Format(ring_mem, ring_bytes, cfg));
  return Job{std::move(seg), ring, static_cast<ChildReport*>(rep)};
}

// What a child does first: attach to the job by name.
struct ChildJob {
  ShmSegment seg;
  SpmcRing ring;
  ChildReport* reports;
};

absl::StatusOr<ChildJob> AttachJob(const std::string& name) {
  SYMTP_ASSIGN_OR_RETURN(ShmSegment seg, ShmSegment::Attach(name, Deadline::AfterMs(10'000)));
  SYMTP_ASSIGN_OR_RETURN(auto ring_region, seg.Find("ring"));
  SYMTP_ASSIGN_OR_RETURN(auto rep_region, seg.Find("reports"));
  SYMTP_ASSIGN_OR_RETURN(SpmcRing ring, SpmcRing::Attach(ring_region.first, ring_region.second));
  return ChildJob{std::move(seg), ring, static_cast<ChildReport*>(rep_region.first)};
}

// Child body helper: reports a failure and returns the exit code.
int Fail(ChildReport* report, const std::string& what) {
  if (report != nullptr) report->Set(what);
  std::fprintf(stderr, "child %d: %s\n", ::getpid(), what.c_str());
  return 1;
}

// Supervises children until all exit 0 or one fails or the deadline passes.
// Returns "" on success, else a description (the caller fails the test;
// TearDown kills the rest).
std::string Supervise(std::vector<ChildProcess*> children, const std::vector<std::string>& names,
                      ChildReport* reports, Deadline deadline) {
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  while (remaining > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (done[i]) continue;
      absl::StatusOr<bool> exited = children[i]->TryReap();
      if (!exited.ok()) return exited.status().ToString();
      if (!*exited) continue;
      done[i] = true;
      --remaining;
      if (!ExitedOk(children[i]->status())) {
        return names[i] + " " + DescribeWaitStatus(children[i]->status()) + ": " +
               reports[i].message;
      }
    }
    if (remaining == 0) break;
    if (deadline.Expired()) return "children still running at the deadline";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return "";
}

using SpmcProcessTest = IpcTest;

TEST_F(SpmcProcessTest, MillionRecordsToFourConsumerProcesses) {
  constexpr uint32_t kConsumers = 4;
  const std::string name = SegName("stress");
  ASSERT_OK_AND_ASSIGN(Job job, CreateJob(name, {kConsumers, 1 << 20}));
  ChildReport* reports = job.reports;  // [0..3] consumers, [4] producer

  std::vector<ChildProcess*> children;
  std::vector<std::string> names;
  for (uint32_t i = 0; i < kConsumers; ++i) {
    children.push_back(Spawn([name, i] {
      auto j = AttachJob(name);
      if (!j.ok()) return Fail(nullptr, j.status().ToString());
      ChildReport* rep = &j->reports[i];
      auto c = RingConsumer::Attach(j->ring, i, "consumer " + std::to_string(i));
      if (!c.ok()) return Fail(rep, c.status().ToString());
      std::vector<uint8_t> buf;
      uint64_t expect = 1, digest = 0;
      const bool zero_copy = i % 2 == 1;  // half the consumers read in place
      while (true) {
        absl::Span<const uint8_t> payload;
        uint64_t seq;
        if (zero_copy) {
          absl::StatusOr<RecordView> v = c->Peek(Deadline::AfterMs(30'000));
          if (v.status().code() == absl::StatusCode::kOutOfRange) break;
          if (!v.ok()) return Fail(rep, v.status().ToString());
          seq = v->seq;
          payload = v->payload;
        } else {
          absl::StatusOr<uint64_t> s = c->Read(&buf, Deadline::AfterMs(30'000));
          if (s.status().code() == absl::StatusCode::kOutOfRange) break;
          if (!s.ok()) return Fail(rep, s.status().ToString());
          seq = *s;
          payload = buf;
        }
        if (seq != expect) {
          return Fail(rep,
                      "got seq " + std::to_string(seq) + ", expected " + std::to_string(expect));
        }
        uint64_t h;
        std::string why;
        if (!CheckChecksummed(seq, payload, kStressMinLen, kStressMaxLen, &h, &why)) {
          return Fail(rep, why);
        }
        if (zero_copy) {
          absl::Status r = c->Release();
          if (!r.ok()) return Fail(rep, r.ToString());
        }
        digest = Mix(digest, h);
        ++expect;
      }
      rep->count = expect - 1;
      rep->digest = digest;
      return 0;
    }));
    names.push_back("consumer " + std::to_string(i));
  }
  children.push_back(Spawn([name, kConsumers] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    ChildReport* rep = &j->reports[kConsumers];
    auto p = RingProducer::Create(j->ring, "producer");
    if (!p.ok()) return Fail(rep, p.status().ToString());
    uint64_t digest = 0;
    for (uint64_t seq = 1; seq <= kStressRecords; ++seq) {
      size_t len = ChecksummedLength(seq, kStressMinLen, kStressMaxLen);
      absl::StatusOr<absl::Span<uint8_t>> buf = p->Reserve(len, Deadline::AfterMs(30'000));
      if (!buf.ok()) return Fail(rep, buf.status().ToString());
      digest = Mix(digest, FillChecksummed(seq, *buf));
      absl::Status s = p->Commit();
      if (!s.ok()) return Fail(rep, s.ToString());
    }
    p->Close();
    rep->count = kStressRecords;
    rep->digest = digest;
    return 0;
  }));
  names.push_back("producer");
  for (ChildProcess* c : children) ASSERT_NE(c, nullptr);

  const int64_t start = MonotonicNs();
  std::string failure = Supervise(children, names, reports, Deadline::AfterMs(200'000));
  const double secs = (MonotonicNs() - start) / 1e9;
  ASSERT_EQ(failure, "") << job.ring.DebugString();
  EXPECT_EQ(reports[kConsumers].count, kStressRecords);
  for (uint32_t i = 0; i < kConsumers; ++i) {
    EXPECT_EQ(reports[i].count, kStressRecords) << "consumer " << i;
    EXPECT_EQ(reports[i].digest, reports[kConsumers].digest) << "consumer " << i;
  }
  std::printf("%llu records to %u consumer processes in %.2f s\n",
              static_cast<unsigned long long>(kStressRecords), kConsumers, secs);
}

TEST_F(SpmcProcessTest, KilledConsumerIsReportedToTheProducerWithinOneSecond) {
  const std::string name = SegName("killc");
  ASSERT_OK_AND_ASSIGN(Job job, CreateJob(name, {2, 1 << 16}));
  ReadyPipe ready;
  ChildProcess* healthy = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    auto c = RingConsumer::Attach(j->ring, 0, "healthy");
    if (!c.ok()) return Fail(&j->reports[0], c.status().ToString());
    ready.Notify();
    std::vector<uint8_t> buf;
    while (true) {
      absl::StatusOr<uint64_t> s = c->Read(&buf, Deadline::AfterMs(30'000));
      if (s.status().code() == absl::StatusCode::kOutOfRange) return 0;
      if (!s.ok()) return Fail(&j->reports[0], s.status().ToString());
    }
  });
  ChildProcess* victim = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    auto c = RingConsumer::Attach(j->ring, 1, "victim");
    if (!c.ok()) return Fail(&j->reports[1], c.status().ToString());
    ready.Notify();
    SleepForever();  // attached, never reads
  });
  ASSERT_NE(healthy, nullptr);
  ASSERT_NE(victim, nullptr);
  ASSERT_OK(ready.Wait(Deadline::AfterMs(20'000)));
  ASSERT_OK(ready.Wait(Deadline::AfterMs(20'000)));
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(job.ring, "sched"));

  std::atomic<int64_t> kill_ns{0};
  const pid_t victim_pid = victim->pid();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the ring is full by then
    kill_ns.store(MonotonicNs());
    ::kill(victim_pid, SIGKILL);
  });
  std::vector<uint8_t> record(1024);
  absl::Status s;
  while ((s = p.Publish(record, Deadline::AfterMs(30'000))).ok()) {
  }
  const int64_t error_ns = MonotonicNs();
  killer.join();

  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("consumer 1 'victim' (pid " + std::to_string(victim_pid) + ", "),
                     AnyOf(HasSubstr("zombie"), HasSubstr("dead")), HasSubstr("unread records"))));
  EXPECT_GE(error_ns, kill_ns.load()) << "the producer failed before the consumer was killed";
  EXPECT_LT(error_ns - kill_ns.load(), 1'000'000'000) << "detected after more than 1 s";

  p.Close();
  ASSERT_OK_AND_ASSIGN(int st, healthy->Wait(Deadline::AfterMs(30'000)));
  EXPECT_TRUE(ExitedOk(st)) << DescribeWaitStatus(st) << ": " << job.reports[0].message;
}

TEST_F(SpmcProcessTest, StoppedConsumerIsReportedAsStoppedAtTheDeadline) {
  const std::string name = SegName("stopc");
  ASSERT_OK_AND_ASSIGN(Job job, CreateJob(name, {1, 1 << 16}));
  ReadyPipe ready;
  ChildProcess* sleepy = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    auto c = RingConsumer::Attach(j->ring, 0, "sleepy");
    if (!c.ok()) return Fail(&j->reports[0], c.status().ToString());
    ready.Notify();
    std::vector<uint8_t> buf;
    uint64_t n = 0;
    while (true) {
      absl::StatusOr<uint64_t> s = c->Read(&buf, Deadline::AfterMs(60'000));
      if (s.status().code() == absl::StatusCode::kOutOfRange) break;
      if (!s.ok()) return Fail(&j->reports[0], s.status().ToString());
      if (*s != ++n) return Fail(&j->reports[0], "sequence gap");
    }
    j->reports[0].count = n;
    return 0;
  });
  ASSERT_NE(sleepy, nullptr);
  ASSERT_OK(ready.Wait(Deadline::AfterMs(20'000)));
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(job.ring, "sched"));
  std::vector<uint8_t> record(1024);
  for (int i = 0; i < 10; ++i) ASSERT_OK(p.Publish(record, Deadline::AfterMs(30'000)));

  ASSERT_TRUE(sleepy->Signal(SIGSTOP));
  Deadline d = Deadline::AfterMs(10'000);
  while (ProbeProcess(sleepy->pid()) != ProcState::kStopped && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(ProbeProcess(sleepy->pid()), ProcState::kStopped);

  absl::Status s;
  int published = 10;
  while ((s = p.Publish(record, Deadline::AfterMs(300))).ok()) ++published;
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          AllOf(HasSubstr("ring full"),
                                HasSubstr("blocked by consumer 0 'sleepy' (pid " +
                                          std::to_string(sleepy->pid()) + ", stopped, heartbeat"),
                                HasSubstr("behind"))));

  // Resumed, the consumer catches up and the stream completes.
  ASSERT_TRUE(sleepy->Signal(SIGCONT));
  ASSERT_OK(p.Publish(record, Deadline::AfterMs(30'000)));
  ++published;
  p.Close();
  ASSERT_OK_AND_ASSIGN(int st, sleepy->Wait(Deadline::AfterMs(30'000)));
  EXPECT_TRUE(ExitedOk(st)) << DescribeWaitStatus(st) << ": " << job.reports[0].message;
  EXPECT_EQ(job.reports[0].count, static_cast<uint64_t>(published));
}

TEST_F(SpmcProcessTest, KilledProducerIsReportedToConsumersWithinOneSecond) {
  const std::string name = SegName("killp");
  ASSERT_OK_AND_ASSIGN(Job job, CreateJob(name, {2, 1 << 16}));
  constexpr int kPublished = 10;
  ReadyPipe ready;
  ChildProcess* producer = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    auto p = RingProducer::Create(j->ring, "sched");
    if (!p.ok()) return Fail(&j->reports[2], p.status().ToString());
    std::vector<uint8_t> record(100);
    for (int i = 1; i <= kPublished; ++i) {
      FillPattern(i, absl::MakeSpan(record));
      absl::Status s = p->Publish(record, Deadline::AfterMs(30'000));
      if (!s.ok()) return Fail(&j->reports[2], s.ToString());
    }
    ready.Notify();
    SleepForever();  // never closes
  });
  ASSERT_NE(producer, nullptr);
  const pid_t producer_pid = producer->pid();
  // A consumer in another process: expects the records, then Unavailable.
  ChildProcess* worker1 = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    ChildReport* rep = &j->reports[1];
    auto c = RingConsumer::Attach(j->ring, 1, "worker 1");
    if (!c.ok()) return Fail(rep, c.status().ToString());
    std::vector<uint8_t> buf;
    while (true) {
      absl::StatusOr<uint64_t> s = c->Read(&buf, Deadline::AfterMs(30'000));
      if (s.ok()) {
        if (FirstPatternMismatch(*s, buf) != -1) return Fail(rep, "corrupt record");
        ++rep->count;
        continue;
      }
      rep->error_ns = MonotonicNs();
      rep->Set(s.status().ToString());
      return s.status().code() == absl::StatusCode::kUnavailable ? 0 : 1;
    }
  });
  ASSERT_NE(worker1, nullptr);
  ASSERT_OK(ready.Wait(Deadline::AfterMs(20'000)));

  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(job.ring, 0, "worker 0"));
  std::vector<uint8_t> buf;
  for (int i = 1; i <= kPublished; ++i) {
    ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&buf, Deadline::AfterMs(30'000)));
    ASSERT_EQ(seq, static_cast<uint64_t>(i));
  }
  std::atomic<int64_t> kill_ns{0};
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill_ns.store(MonotonicNs());
    ::kill(producer_pid, SIGKILL);
  });
  absl::StatusOr<uint64_t> r = c.Read(&buf, Deadline::AfterMs(30'000));
  const int64_t error_ns = MonotonicNs();
  killer.join();
  EXPECT_THAT(
      r, StatusIs(
             absl::StatusCode::kUnavailable,
             AllOf(HasSubstr("consumer 0 'worker 0'"),
                   HasSubstr("producer 'sched' (pid " + std::to_string(producer_pid) + ", "),
                   AnyOf(HasSubstr("zombie"), HasSubstr("dead")), HasSubstr("read up to seq 10"))));
  EXPECT_GE(error_ns, kill_ns.load());
  EXPECT_LT(error_ns - kill_ns.load(), 1'000'000'000) << "detected after more than 1 s";

  ASSERT_OK_AND_ASSIGN(int st, worker1->Wait(Deadline::AfterMs(30'000)));
  const ChildReport& rep = job.reports[1];
  EXPECT_TRUE(ExitedOk(st)) << DescribeWaitStatus(st) << ": " << rep.message;
  EXPECT_EQ(rep.count, static_cast<uint64_t>(kPublished));
  EXPECT_THAT(std::string(rep.message),
              AllOf(HasSubstr("UNAVAILABLE"), HasSubstr("consumer 1 'worker 1'"),
                    HasSubstr("producer 'sched' (pid " + std::to_string(producer_pid))));
  EXPECT_GE(rep.error_ns, kill_ns.load());
  EXPECT_LT(rep.error_ns - kill_ns.load(), 1'000'000'000) << "detected after more than 1 s";
}

using SpscProcessTest = IpcTest;

TEST_F(SpscProcessTest, WorkerResultsReachTheScheduler) {
  const std::string name = SegName("spsc");
  ASSERT_OK_AND_ASSIGN(Job job, CreateJob(name, SpscConfig(1 << 14)));
  constexpr uint64_t kResults = 50'000;
  ChildProcess* worker = Spawn([&] {
    auto j = AttachJob(name);
    if (!j.ok()) return Fail(nullptr, j.status().ToString());
    auto p = RingProducer::Create(j->ring, "worker rank 0");
    if (!p.ok()) return Fail(&j->reports[0], p.status().ToString());
    std::vector<uint8_t> rec;
    for (uint64_t s = 1; s <= kResults; ++s) {
      rec.resize(SplitMix64(s) % 200);
      FillPattern(s, absl::MakeSpan(rec));
      absl::Status st = p->Publish(rec, Deadline::AfterMs(30'000));
      if (!st.ok()) return Fail(&j->reports[0], st.ToString());
    }
    p->Close();
    return 0;
  });
  ASSERT_NE(worker, nullptr);
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(job.ring, 0, "scheduler"));
  std::vector<uint8_t> buf;
  for (uint64_t s = 1; s <= kResults; ++s) {
    ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&buf, Deadline::AfterMs(30'000)));
    ASSERT_EQ(seq, s);
    ASSERT_EQ(buf.size(), SplitMix64(s) % 200);
    ASSERT_EQ(FirstPatternMismatch(s, buf), -1);
  }
  EXPECT_THAT(c.Read(&buf, Deadline::AfterMs(30'000)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("all 50000 records")));
  ASSERT_OK_AND_ASSIGN(int st, worker->Wait(Deadline::AfterMs(30'000)));
  EXPECT_TRUE(ExitedOk(st)) << DescribeWaitStatus(st) << ": " << job.reports[0].message;
}

}  // namespace
}  // namespace symtp::ipc
