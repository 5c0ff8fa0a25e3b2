// Single-process tests of the SPMC ring: the producer and consumers run in one
// thread (interleaved) or in threads of this process (so ThreadSanitizer sees
// the publish/consume protocol). Multi-process tests are in
// ring_process_test.cc.
#include "ipc/ring.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "tests/ipc/ipc_test_util.h"

namespace symtp::ipc {
namespace {

using ::symtp::ipc::testing::FillPattern;
using ::symtp::ipc::testing::FirstPatternMismatch;
using ::symtp::testing::IsOk;
using ::symtp::testing::StatusIs;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Page-aligned heap memory for a ring.
class RingMemory {
 public:
  explicit RingMemory(size_t bytes) : bytes_((bytes + 4095) / 4096 * 4096) {
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes_));
    std::memset(mem_, 0, bytes_);
  }
  ~RingMemory() { std::free(mem_); }
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;
  uint8_t* data() const { return mem_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  uint8_t* mem_;
};

// A ring formatted in its own memory.
struct TestRing {
  explicit TestRing(RingConfig cfg) : mem(SpmcRing::RequiredBytes(cfg)) {
    auto r = SpmcRing::Format(mem.data(), mem.size(), cfg);
    EXPECT_OK(r);
    if (r.ok()) ring = *r;
  }
  RingMemory mem;
  SpmcRing ring;
};

// Fast-failing waits for single-threaded tests (a would-block is a deadline).
WaitPolicy NoSpin() {
  WaitPolicy p;
  p.spin_iters = 0;
  p.yield_iters = 0;
  p.sleep_slice_ns = 100'000;
  return p;
}

Deadline Soon() { return Deadline::AfterMs(10'000); }  // for waits that must not block
Deadline Now() { return Deadline::AfterNs(0); }        // poll

absl::Status PublishPattern(RingProducer& p, uint64_t seq, size_t len, Deadline d) {
  std::vector<uint8_t> buf(len);
  FillPattern(seq, absl::MakeSpan(buf));
  return p.Publish(buf, d);
}

// ---------------------------------------------------------------------------
// Format / Attach

TEST(RingFormatTest, RejectsBadConfigAndMemory) {
  RingMemory mem(1 << 16);
  EXPECT_THAT(SpmcRing::Format(mem.data(), mem.size(), {0, 4096}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_consumers")));
  EXPECT_THAT(SpmcRing::Format(mem.data(), mem.size(), {9, 4096}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_consumers")));
  EXPECT_THAT(SpmcRing::Format(mem.data(), mem.size(), {1, 3000}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("power of two")));
  EXPECT_THAT(SpmcRing::Format(mem.data(), mem.size(), {1, 128}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("power of two")));
  EXPECT_THAT(SpmcRing::Format(mem.data() + 8, mem.size() - 8, {1, 4096}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aligned")));
  EXPECT_THAT(SpmcRing::Format(mem.data(), 4096, {1, 4096}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
}

TEST(RingFormatTest, GeometryAndMaxRecord) {
  TestRing t({3, 1 << 12});
  EXPECT_EQ(t.ring.num_consumers(), 3u);
  EXPECT_EQ(t.ring.capacity_bytes(), 4096u);
  EXPECT_EQ(t.ring.max_record_bytes(), 4096u / 2 - kRingRecordHeaderBytes);
  EXPECT_EQ(SpmcRing::RequiredBytes({3, 1 << 12}), 4096u + 4096u);
  ASSERT_OK_AND_ASSIGN(SpmcRing again, SpmcRing::Attach(t.mem.data(), t.mem.size()));
  EXPECT_EQ(again.num_consumers(), 3u);
  EXPECT_EQ(again.capacity_bytes(), 4096u);
}

TEST(RingAttachTest, ZeroMemoryIsNotFormatted) {
  RingMemory mem(1 << 16);
  EXPECT_THAT(SpmcRing::Attach(mem.data(), mem.size()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not formatted")));
}

TEST(RingAttachTest, GarbageIsAnErrorNotACrash) {
  RingMemory mem(1 << 16);
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    for (size_t i = 0; i < mem.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(mem.data() + i, &v, 8);
    }
    EXPECT_THAT(SpmcRing::Attach(mem.data(), mem.size()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("magic")));
  }
}

TEST(RingAttachTest, CorruptHeaderFieldsAreRejected) {
  const RingConfig cfg{2, 1 << 12};
  // Header layout: magic u64 @0, version u32 @8, num_consumers u32 @12,
  // capacity u64 @16, max_record u64 @24, data_offset @32, total @40.
  struct Case {
    size_t offset;
    uint64_t value;
    int width;
    const char* expect;
  };
  const Case cases[] = {
      {8, kRingLayoutVersion + 1, 4, "layout version"},
      {12, 0, 4, "num_consumers"},
      {12, 200, 4, "num_consumers"},
      {16, 5000, 8, "power of two"},
      {16, uint64_t{1} << 20, 8, "corrupt ring header"},  // larger than formatted
      {24, 12345, 8, "corrupt ring header"},
      {32, 64, 8, "corrupt ring header"},
  };
  for (const Case& c : cases) {
    TestRing t(cfg);
    std::memcpy(t.mem.data() + c.offset, &c.value, c.width);
    EXPECT_THAT(SpmcRing::Attach(t.mem.data(), t.mem.size()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(c.expect)))
        << "offset " << c.offset;
  }
  TestRing t(cfg);
  EXPECT_THAT(SpmcRing::Attach(t.mem.data(), t.mem.size() - 4096),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("needs")));
  EXPECT_THAT(SpmcRing::Attach(t.mem.data(), 100),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot hold")));
}

// ---------------------------------------------------------------------------
// Roles

TEST(RingRoleTest, OneProducerAtATimeAndSeqContinues) {
  TestRing t({1, 4096});
  std::vector<uint8_t> out;
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  {
    ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "first"));
    EXPECT_THAT(RingProducer::Create(t.ring, "second"),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("'second'"), HasSubstr("producer 'first' (pid"))));
    ASSERT_OK(p.Publish({}, Soon()));
    ASSERT_OK(p.Publish({}, Soon()));
    EXPECT_EQ(p.next_seq(), 3u);
  }
  // Released without closing: a new producer continues the sequence.
  ASSERT_OK_AND_ASSIGN(RingProducer p2, RingProducer::Create(t.ring, "second"));
  EXPECT_EQ(p2.next_seq(), 3u);
  ASSERT_OK(p2.Publish({}, Soon()));
  for (uint64_t want = 1; want <= 3; ++want) {
    ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&out, Soon()));
    EXPECT_EQ(seq, want);
  }
}

TEST(RingReadyTest, ReadyWhenARecordIsUnreadOrTheRingIsClosed) {
  TestRing t({1, 4096});
  std::vector<uint8_t> out;
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  EXPECT_FALSE(c.Ready());
  const std::vector<uint8_t> rec = {1, 2, 3};
  ASSERT_OK(p.Publish(rec, Soon()));
  EXPECT_TRUE(c.Ready());
  ASSERT_OK_AND_ASSIGN(RecordView v, c.Peek(Soon()));
  EXPECT_EQ(v.seq, 1u);
  EXPECT_TRUE(c.Ready());  // the peeked record is still there
  ASSERT_OK(c.Release());
  EXPECT_FALSE(c.Ready());
  ASSERT_OK(p.Publish(rec, Soon()));
  ASSERT_OK(p.Publish(rec, Soon()));
  ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&out, Soon()));
  EXPECT_EQ(seq, 2u);
  EXPECT_TRUE(c.Ready());
  ASSERT_OK(c.Read(&out, Soon()).status());
  EXPECT_FALSE(c.Ready());
  p.Close();
  EXPECT_TRUE(c.Ready());  // Read() now reports the end at once
  EXPECT_THAT(c.Read(&out, Soon()).status(), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("closed")));
  c.Detach();
  EXPECT_FALSE(c.Ready());
}

TEST(RingRoleTest, ConsumerSlotRules) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingConsumer c0, RingConsumer::Attach(t.ring, 0, "zero"));
  EXPECT_THAT(RingConsumer::Attach(t.ring, 2, "bad"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  EXPECT_THAT(RingConsumer::Attach(t.ring, 0, "again"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("slot 0"), HasSubstr("'zero' (pid"))));
  c0.Detach();
  EXPECT_THAT(RingConsumer::Attach(t.ring, 0, "after"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("detached")));
  std::vector<uint8_t> out;
  EXPECT_THAT(c0.Read(&out, Now()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("detached")));
}

TEST(RingRoleTest, ReattachContinuesWhereThePreviousHolderStopped) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_OK(PublishPattern(p, s, 10, Soon()));
  std::vector<uint8_t> out;
  {
    ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "first"));
    for (uint64_t s = 1; s <= 2; ++s) ASSERT_OK(c.Read(&out, Soon()));
    ASSERT_OK(c.Peek(Soon()));  // seq 3 peeked, not released: delivered again
  }
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "second"));
  EXPECT_EQ(c.last_seq(), 2u);
  for (uint64_t s = 3; s <= 5; ++s) {
    ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&out, Soon()));
    EXPECT_EQ(seq, s);
  }
}

TEST(RingRoleTest, ConsumerAttachedLateStillSeesEverything) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  for (uint64_t s = 1; s <= 20; ++s) ASSERT_OK(PublishPattern(p, s, 50, Soon()));
  ASSERT_OK_AND_ASSIGN(RingConsumer late, RingConsumer::Attach(t.ring, 1, "late"));
  std::vector<uint8_t> out;
  for (uint64_t s = 1; s <= 20; ++s) {
    ASSERT_OK_AND_ASSIGN(uint64_t seq, late.Read(&out, Soon()));
    ASSERT_EQ(seq, s);
    ASSERT_EQ(FirstPatternMismatch(s, out), -1);
  }
}

// ---------------------------------------------------------------------------
// Record sizes

void RoundTripEverySize(uint64_t capacity, size_t step, bool demote = false) {
  TestRing t({1, capacity});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p", NoSpin()));
  p.set_demote_on_commit(demote);
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c", NoSpin()));
  const size_t max = t.ring.max_record_bytes();
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= max; n += step) sizes.push_back(n);
  for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, max - 1, max}) sizes.push_back(n);
  std::vector<uint8_t> out;
  auto drain = [&]() -> ::testing::AssertionResult {
    while (c.last_seq() < p.next_seq() - 1) {
      absl::StatusOr<uint64_t> got = c.Read(&out, Soon());
      if (!got.ok()) return ::testing::AssertionFailure() << got.status();
      size_t want_len = sizes[*got - 1];
      if (out.size() != want_len) {
        return ::testing::AssertionFailure()
               << "seq " << *got << " has " << out.size() << " bytes, want " << want_len;
      }
      if (long bad = FirstPatternMismatch(*got, out); bad != -1) {
        return ::testing::AssertionFailure()
               << "seq " << *got << " (size " << want_len << ") wrong at byte " << bad;
      }
    }
    return ::testing::AssertionSuccess();
  };
  // Up to two records in flight, so pads and wraps land at many positions.
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t seq = i + 1;
    absl::Status s = PublishPattern(p, seq, sizes[i], Now());
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {  // full: drain, then it must fit
      ASSERT_TRUE(drain());
      s = PublishPattern(p, seq, sizes[i], Now());
    }
    ASSERT_OK(s) << "size " << sizes[i];
    if (i % 2 == 1) {
      ASSERT_TRUE(drain());
    }
  }
  ASSERT_TRUE(drain());
  EXPECT_GT(t.ring.write_cursor(), capacity);  // wrapped
}

TEST(RingSizeTest, EverySizeOnASmallRing) { RoundTripEverySize(4096, 1); }

TEST(RingSizeTest, SteppedSizesOnALargeRing) { RoundTripEverySize(1 << 20, 4093); }

// CLDEMOTE on commit is a cache hint: every record still arrives intact,
// wrapped and padded ones included (and it must not fault where it is a NOP).
TEST(RingSizeTest, EverySizeWithDemoteOnCommit) { RoundTripEverySize(4096, 1, /*demote=*/true); }

TEST(RingSizeTest, OversizeIsRejectedWithBothSizes) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  const size_t max = t.ring.max_record_bytes();
  std::vector<uint8_t> big(max + 1);
  EXPECT_THAT(p.Publish(big, Soon()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'sched'"), HasSubstr(std::to_string(max + 1)),
                             HasSubstr("max_record_bytes " + std::to_string(max)))));
  EXPECT_THAT(p.Reserve(1 << 20, Soon()), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_EQ(p.next_seq(), 1u);  // nothing consumed a sequence number
}

// ---------------------------------------------------------------------------
// Wraparound, full ring, deadlines

TEST(RingWrapTest, WrapsManyTimesFillingAndDraining) {
  TestRing t({1, 1024});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p", NoSpin()));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c", NoSpin()));
  std::mt19937_64 rng(7);
  const size_t max = t.ring.max_record_bytes();
  std::vector<size_t> lens = {0};  // lens[seq]
  std::vector<uint8_t> out;
  int fills = 0;
  while (t.ring.write_cursor() < 200 * t.ring.capacity_bytes()) {
    // Fill until the ring is full (a zero deadline reports it at once).
    while (true) {
      size_t len = rng() % (max + 1);
      absl::Status s = PublishPattern(p, p.next_seq(), len, Now());
      if (s.code() == absl::StatusCode::kDeadlineExceeded) break;
      ASSERT_OK(s);
      lens.push_back(len);
    }
    ++fills;
    // Drain everything.
    while (true) {
      absl::StatusOr<uint64_t> seq = c.Read(&out, Now());
      if (seq.status().code() == absl::StatusCode::kDeadlineExceeded) break;
      ASSERT_OK(seq);
      ASSERT_EQ(out.size(), lens[*seq]);
      ASSERT_EQ(FirstPatternMismatch(*seq, out), -1) << "seq " << *seq;
    }
    ASSERT_EQ(c.last_seq(), p.next_seq() - 1);
  }
  EXPECT_GE(fills, 100);
}

TEST(RingFullTest, BlocksThenDeadlineExceededNamingTheSlowConsumer) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  ASSERT_OK_AND_ASSIGN(RingConsumer fast, RingConsumer::Attach(t.ring, 0, "fast"));
  ASSERT_OK_AND_ASSIGN(RingConsumer slow, RingConsumer::Attach(t.ring, 1, "slow worker"));
  std::vector<uint8_t> out;
  absl::Status s;
  int published = 0;
  while ((s = PublishPattern(p, p.next_seq(), 500, Deadline::AfterMs(100))).ok()) {
    ++published;
    ASSERT_OK(fast.Read(&out, Soon()));
    ASSERT_LT(published, 100) << "the ring never filled";
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          AllOf(HasSubstr("producer 'sched': ring full"),
                                HasSubstr("blocked by consumer 1 'slow worker' (pid " +
                                          std::to_string(::getpid()) + ", alive, heartbeat"),
                                HasSubstr(std::to_string(published) + " records"))));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("'fast'")));
  // The slow consumer catches up and the producer continues.
  while (slow.last_seq() < static_cast<uint64_t>(published)) ASSERT_OK(slow.Read(&out, Soon()));
  EXPECT_OK(PublishPattern(p, p.next_seq(), 500, Soon()));
}

TEST(RingFullTest, NeverAttachedConsumerBlocksAndIsNamed) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c0, RingConsumer::Attach(t.ring, 0, "rank0"));
  std::vector<uint8_t> out;
  absl::Status s;
  while ((s = PublishPattern(p, p.next_seq(), 300, Deadline::AfterMs(50))).ok()) {
    ASSERT_OK(c0.Read(&out, Soon()));
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          HasSubstr("blocked by consumer 1 (never attached)")));
}

TEST(RingFullTest, ReleasedSlotKeepsBlockingAndIsNamed) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  { ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "gone")); }
  absl::Status s;
  while ((s = PublishPattern(p, p.next_seq(), 300, Deadline::AfterMs(50))).ok()) {
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          HasSubstr("consumer 0 'gone' (not attached; last held by pid")));
}

TEST(RingEmptyTest, DeadlineNamesTheProducer) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "rank0"));
  std::vector<uint8_t> out;
  EXPECT_THAT(c.Read(&out, Deadline::AfterMs(30)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("consumer 0 'rank0': no record after seq 0"),
                             HasSubstr("producer (never attached)"))));
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  ASSERT_OK(p.Publish({}, Soon()));
  ASSERT_OK(c.Read(&out, Soon()));
  EXPECT_THAT(c.Read(&out, Deadline::AfterMs(30)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("no record after seq 1"),
                             HasSubstr("producer 'sched' (pid " + std::to_string(::getpid()) +
                                       ", alive, heartbeat"),
                             HasSubstr("published up to seq 1"))));
}

TEST(RingEmptyTest, ExpiredDeadlineStillReturnsAvailableData) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  ASSERT_OK(PublishPattern(p, 1, 10, Deadline::AfterNs(-1)));
  std::vector<uint8_t> out;
  EXPECT_THAT(c.Read(&out, Deadline::AfterNs(-1)), IsOk());
}

// ---------------------------------------------------------------------------
// Close, detach, peek/reserve

TEST(RingCloseTest, ConsumersDrainThenGetOutOfRange) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c0, RingConsumer::Attach(t.ring, 0, "c0"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c1, RingConsumer::Attach(t.ring, 1, "c1"));
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_OK(PublishPattern(p, s, 100, Soon()));
  p.Close();
  p.Close();  // idempotent
  EXPECT_TRUE(t.ring.closed());
  EXPECT_THAT(p.Publish({}, Soon()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("closed")));
  std::vector<uint8_t> out;
  for (RingConsumer* c : {&c0, &c1}) {
    for (uint64_t s = 1; s <= 5; ++s) {
      ASSERT_OK_AND_ASSIGN(uint64_t seq, c->Read(&out, Soon()));
      EXPECT_EQ(seq, s);
    }
    EXPECT_THAT(c->Read(&out, Soon()),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("all 5 records read")));
    EXPECT_THAT(c->Read(&out, Soon()), StatusIs(absl::StatusCode::kOutOfRange, _));
  }
}

TEST(RingCloseTest, CloseWakesASleepingConsumer) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  WaitPolicy sleepy;
  sleepy.spin_iters = 0;
  sleepy.yield_iters = 0;
  sleepy.sleep_slice_ns = 60'000'000'000;  // clamped to 1 s; only a wake gets it out early
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c", sleepy));
  absl::Status result;
  std::thread reader([&] {
    std::vector<uint8_t> out;
    result = c.Read(&out, Deadline::AfterMs(30'000)).status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.Close();
  reader.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kOutOfRange, _));
}

TEST(RingDetachTest, DetachedConsumerNoLongerBlocksTheProducer) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c0, RingConsumer::Attach(t.ring, 0, "c0"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c1, RingConsumer::Attach(t.ring, 1, "c1"));
  std::vector<uint8_t> out;
  // Fill the ring (c1 does not read), then unblock the producer by detaching
  // c1 from another thread while the producer waits.
  absl::Status s;
  while ((s = PublishPattern(p, p.next_seq(), 200, Deadline::AfterMs(20))).ok()) {
    ASSERT_OK(c0.Read(&out, Soon()));
  }
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  std::thread detacher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    c1.Detach();
  });
  EXPECT_OK(PublishPattern(p, p.next_seq(), 200, Deadline::AfterMs(30'000)));
  detacher.join();
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(c0.Read(&out, Soon()));
    ASSERT_OK(PublishPattern(p, p.next_seq(), 200, Soon()));
  }
}

TEST(RingPeekTest, ZeroCopyPeekAndRelease) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  EXPECT_THAT(c.Release(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Peek")));
  ASSERT_OK(PublishPattern(p, 1, 33, Soon()));
  ASSERT_OK(PublishPattern(p, 2, 44, Soon()));
  ASSERT_OK_AND_ASSIGN(RecordView v, c.Peek(Soon()));
  EXPECT_EQ(v.seq, 1u);
  EXPECT_EQ(v.payload.size(), 33u);
  EXPECT_EQ(FirstPatternMismatch(1, v.payload), -1);
  ASSERT_OK_AND_ASSIGN(RecordView again, c.Peek(Soon()));
  EXPECT_EQ(again.seq, 1u);
  EXPECT_EQ(again.payload.data(), v.payload.data());
  std::vector<uint8_t> out;
  EXPECT_THAT(c.Read(&out, Soon()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not released")));
  ASSERT_OK(c.Release());
  ASSERT_OK_AND_ASSIGN(RecordView v2, c.Peek(Soon()));
  EXPECT_EQ(v2.seq, 2u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v2.payload.data()) % 16, 0u);
  ASSERT_OK(c.Release());
}

TEST(RingReserveTest, ReserveCommitAndShrink) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  EXPECT_THAT(p.Commit(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Reserve")));
  ASSERT_OK_AND_ASSIGN(absl::Span<uint8_t> buf, p.Reserve(100, Soon()));
  EXPECT_EQ(buf.size(), 100u);
  EXPECT_THAT(p.Reserve(10, Soon()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("reserved")));
  FillPattern(1, buf.subspan(0, 60));
  std::vector<uint8_t> out;
  // Nothing is visible before Commit.
  EXPECT_THAT(c.Read(&out, Now()), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  EXPECT_THAT(p.Commit(101), StatusIs(absl::StatusCode::kInvalidArgument, _));
  ASSERT_OK(p.Commit(60));
  ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&out, Soon()));
  EXPECT_EQ(seq, 1u);
  EXPECT_EQ(out.size(), 60u);
  EXPECT_EQ(FirstPatternMismatch(1, out), -1);
}

TEST(RingCorruptionTest, GarbageRecordIsDataLossNotACrash) {
  TestRing t({1, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "p"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "c"));
  ASSERT_OK(PublishPattern(p, 1, 64, Soon()));
  uint8_t* data = t.mem.data() + t.mem.size() - 4096;  // data area: the last `capacity` bytes
  std::vector<uint8_t> out;
  struct Corruption {
    size_t offset;
    uint32_t value;
    const char* expect;
  };
  for (const Corruption& k :
       {Corruption{8, 100000, "bad record length"}, Corruption{12, 0xdeadbeef, "bad record kind"},
        Corruption{0, 7, "expected seq 1, found 7"}}) {
    uint8_t saved[16];
    std::memcpy(saved, data, 16);
    std::memcpy(data + k.offset, &k.value, 4);
    EXPECT_THAT(c.Read(&out, Soon()), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(k.expect)));
    std::memcpy(data, saved, 16);
  }
  ASSERT_OK_AND_ASSIGN(uint64_t seq, c.Read(&out, Soon()));
  EXPECT_EQ(seq, 1u);
}

TEST(RingDebugTest, DebugStringNamesEveryRole) {
  TestRing t({2, 4096});
  ASSERT_OK_AND_ASSIGN(RingProducer p, RingProducer::Create(t.ring, "sched"));
  ASSERT_OK_AND_ASSIGN(RingConsumer c, RingConsumer::Attach(t.ring, 0, "rank0"));
  std::string d = t.ring.DebugString();
  EXPECT_THAT(d, AllOf(HasSubstr("producer 'sched'"), HasSubstr("consumer 0 'rank0'"),
                       HasSubstr("consumer 1 (never attached)")));
}

// ---------------------------------------------------------------------------
// Threads: the protocol under concurrency (and under TSan).

struct StreamResult {
  uint64_t count = 0;
  std::string error;
};

void RunThreadedStream(uint32_t consumers, uint64_t capacity, uint64_t records, size_t max_len,
                       WaitPolicy policy) {
  TestRing t({consumers, capacity});
  std::vector<StreamResult> results(consumers);
  std::vector<RingConsumer> cs;
  for (uint32_t i = 0; i < consumers; ++i) {
    auto c = RingConsumer::Attach(t.ring, i, "c" + std::to_string(i), policy);
    ASSERT_OK(c);
    cs.push_back(std::move(*c));
  }
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < consumers; ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> out;
      uint64_t expect = 1;
      // On a failure, leave the ring so that the producer does not wait for us.
      struct DetachOnExit {
        RingConsumer* c;
        ~DetachOnExit() { c->Detach(); }
      } detach_on_exit{&cs[i]};
      while (true) {
        absl::StatusOr<uint64_t> seq = cs[i].Read(&out, Deadline::AfterMs(30'000));
        if (seq.status().code() == absl::StatusCode::kOutOfRange) break;
        if (!seq.ok()) {
          results[i].error = seq.status().ToString();
          return;
        }
        if (*seq != expect) {
          results[i].error = "got seq " + std::to_string(*seq) + ", want " + std::to_string(expect);
          return;
        }
        size_t want_len = testing::SplitMix64(*seq) % (max_len + 1);
        long bad = out.size() == want_len ? FirstPatternMismatch(*seq, out) : 0;
        if (bad != -1) {
          results[i].error = "seq " + std::to_string(*seq) + " corrupt at byte " +
                             std::to_string(bad) + " (len " + std::to_string(out.size()) + ")";
          return;
        }
        ++expect;
        ++results[i].count;
      }
    });
  }
  std::string producer_error;
  std::thread producer([&] {
    auto p = RingProducer::Create(t.ring, "producer", policy);
    if (!p.ok()) {
      producer_error = p.status().ToString();
      return;
    }
    for (uint64_t s = 1; s <= records; ++s) {
      size_t len = testing::SplitMix64(s) % (max_len + 1);
      auto buf = p->Reserve(len, Deadline::AfterMs(30'000));
      if (!buf.ok()) {
        producer_error = buf.status().ToString();
        break;
      }
      FillPattern(s, *buf);
      absl::Status st = p->Commit();
      if (!st.ok()) {
        producer_error = st.ToString();
        break;
      }
    }
    p->Close();
  });
  producer.join();
  for (auto& th : threads) th.join();
  EXPECT_EQ(producer_error, "");
  for (uint32_t i = 0; i < consumers; ++i) {
    EXPECT_EQ(results[i].error, "") << "consumer " << i;
    EXPECT_EQ(results[i].count, records) << "consumer " << i;
  }
}

TEST(SpmcThreadTest, EightConsumersSeeEveryRecordInOrder) {
  RunThreadedStream(8, 1 << 14, 20'000, 700, WaitPolicy{});
}

TEST(SpmcThreadTest, FutexOnlyHandoffLosesNoWakeups) {
  // No spinning, no yielding: every wait goes to FUTEX_WAIT. A lost wake-up
  // would stall a waiter for a whole 1 s slice each time (clamped from 60 s)
  // and push the test past its CTest timeout.
  WaitPolicy p;
  p.spin_iters = 0;
  p.yield_iters = 0;
  p.sleep_slice_ns = 60'000'000'000;
  RunThreadedStream(3, 1024, 5'000, 300, p);
}

TEST(SpscThreadTest, ResultRingRoundTrip) {
  RunThreadedStream(1, 1 << 12, 20'000, 1000, WaitPolicy{});
}

TEST(SpscThreadTest, SpscAliasIsTheSameRing) {
  RingMemory mem(SpscRing::RequiredBytes(SpscConfig(4096)));
  ASSERT_OK_AND_ASSIGN(SpscRing r, SpscRing::Format(mem.data(), mem.size(), SpscConfig(4096)));
  EXPECT_EQ(r.num_consumers(), 1u);
}

}  // namespace
}  // namespace symtp::ipc
