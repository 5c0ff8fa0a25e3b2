// A bounded, lock-free, single-producer / multi-consumer ring of variable-length
// records in shared memory (and, with one consumer, the SPSC result ring).
//
// Every consumer sees every record, in order: this is a broadcast ring (the
// scheduler publishes step diff t once; every worker rank reads it), not a work
// queue. The producer never overwrites a byte that an attached (or
// not-yet-attached) consumer slot has not released: a slow consumer applies
// backpressure. A consumer that leaves for good calls Detach() and stops
// counting.
//
// ---------------------------------------------------------------------------
// Memory layout (inside the caller's memory, e.g. a ShmSegment region; all of
// it position-independent: offsets and cursors, never pointers)
//
//   line 0      header: magic, layout version, num_consumers, capacity, ...
//               (written once by Format(); magic stored last, with release)
//   line 1      producer line: write_cursor, next_seq, closed, data_futex,
//               consumer_sleepers                       (written by the producer)
//   line 2      space line: space_futex, producer_sleeping (written on waits only)
//   lines 3-4   producer HeartbeatSlot (pid, start time, label, heartbeat)
//   per consumer i (kMaxConsumers slots, num_consumers used), 3 lines:
//               cursor line: read_cursor, read_seq, detached (written by consumer i)
//               HeartbeatSlot of consumer i
//   data        capacity_bytes (a power of two), page aligned
//
// Cursors are monotonic 64-bit byte counts (they never wrap in practice: 2^64
// bytes); a cursor's position in the data area is cursor & (capacity - 1).
// Records are 16-byte aligned: a 16-byte header {seq, length, kind} followed by
// `length` payload bytes, padded to 16. When a record does not fit between the
// write position and the end of the data area, the producer writes a PAD record
// that fills the rest and puts the record at offset 0; the pad and the record
// are published together. Sequence numbers start at 1 and increase by one per
// record; consumers check them (a gap is DataLoss, never silent).
//
// max_record_bytes() = capacity / 2 - 16: a record, header included, takes at
// most half the ring, so a record and the pad in front of it always fit in an
// empty ring.
//
// ---------------------------------------------------------------------------
// Memory ordering (C++ memory model; std::atomic objects placed in the shared
// memory, all lock-free: see the static_asserts in ring.cc)
//
//   Publish.  The producer writes the record header and payload with plain
//   stores, then stores write_cursor with (at least) release semantics. A
//   consumer loads write_cursor with acquire; when it observes a value past the
//   record, the header and payload writes happen-before its reads.
//
//   Release.  A consumer reads the payload with plain loads, then stores its
//   read_cursor with (at least) release semantics. The producer loads every
//   attached read_cursor with acquire before reusing bytes below it, so the
//   consumer's reads happen-before the producer's overwrite (no torn reads).
//
//   Detach / attach.  A consumer slot's `detached` flag is stored with
//   release; the producer stops counting the slot's cursor only after loading
//   the flag with acquire. Slot ownership (HeartbeatSlot::state) is claimed with
//   an acq_rel CAS and released with a release store, so a later holder of the
//   producer role or of a consumer slot sees every cursor store of the previous
//   holder.
//
//   Sleeping (futex) without lost wake-ups. A waiter (a) loads the futex word
//   F, (b) increments its sleeper count (seq_cst), (c) re-checks its condition
//   with seq_cst loads, (d) FUTEX_WAITs on F expecting the value from (a). The
//   other side (e) stores its cursor (seq_cst), (f) loads the sleeper count
//   (seq_cst) and, only if it is non-zero, (g) increments F and FUTEX_WAKEs.
//   In the single total order of seq_cst operations either (c) sees (e) (no
//   sleep) or (f) sees (b), and then (a) happens-before (g), so F has changed
//   by the time the waiter sleeps or the wake comes after it is queued. With no
//   sleepers the fast path makes no system call. Sleeps are also bounded by
//   WaitPolicy::sleep_slice_ns, so even a lost wake-up would cost one slice.
//
// ---------------------------------------------------------------------------
// Waiting, deadlines and liveness
//
// Every blocking call takes a Deadline; a call whose condition already holds
// succeeds even if the deadline has passed. A waiter spins (spin_iters, with a
// pause instruction), then sched_yield()s (yield_iters), then sleeps on a futex
// in slices of sleep_slice_ns. Every slice (in every phase) it refreshes its
// own heartbeat and checks the peer it waits on:
//
//   producer blocked on a consumer that died (dead, zombie, or pid recycled)
//       -> Unavailable naming the consumer, within about one slice;
//   consumer waiting on a producer that died -> Unavailable naming it (after
//       draining what the producer did publish);
//   deadline passed -> DeadlineExceeded naming the peer and its state, e.g.
//       "... blocked by consumer 2 'worker rank 2' (pid 1234, stopped,
//        heartbeat 1.52 s ago), 96 records (65536 bytes) behind".
//
// A consumer slot that was never attached blocks the producer like a slow
// consumer (it is expected to attach and read from seq 1); at the deadline it
// is named as "never attached". A producer that never attached makes consumers
// wait until their deadline.
//
// Threading: one RingProducer per ring and one RingConsumer per slot, each used
// by one thread at a time. Different roles may live in different threads of one
// process or in different processes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "ipc/liveness.h"
#include "ipc/liveness.h"

namespace symtp::ipc {

namespace internal {
struct RingControl;
}  // namespace internal

inline constexpr uint32_t kMaxRingConsumers = 8;
inline constexpr uint64_t kMinRingCapacity = 256;
inline constexpr uint64_t kMaxRingCapacity = uint64_t{1} << 32;  // record lengths are 32-bit
inline constexpr uint64_t kRingRecordHeaderBytes = 16;
inline constexpr uint32_t kRingLayoutVersion = 1;

struct RingConfig {
  uint32_t num_consumers = 1;         // 1..kMaxRingConsumers
  uint64_t capacity_bytes = 1 << 20;  // power of two in [kMinRingCapacity, kMaxRingCapacity]
};

// How a waiter waits. Negative counts are 0; sleep_slice_ns is clamped to
// [10 us, 1 s].
struct WaitPolicy {
  int spin_iters = 4000;               // busy polls (with a CPU pause) before yielding
  int yield_iters = 200;               // sched_yield() polls before futex sleeps
  int64_t sleep_slice_ns = 2'000'000;  // each futex sleep; liveness is re-checked every slice
};

// A busy-polling policy (spins, then yields, never sleeps) for latency-critical
// waiters that own a core.
WaitPolicy BusyPollPolicy();

struct RecordView {
  uint64_t seq;
  absl::Span<const uint8_t> payload;
};

// A cheap copyable, non-owning view of a ring formatted in some memory. The
// memory must outlive every view and every producer/consumer built on it.
class SpmcRing {
 public:
  SpmcRing() = default;  // not usable until assigned from Format()/Attach()

  // Bytes Format() needs for `config` (control block, page-rounded, + capacity).
  static size_t RequiredBytes(const RingConfig& config);

  // Formats `mem` (64-byte aligned, at least RequiredBytes) as an empty ring.
  // Call once, before any producer or consumer attaches. InvalidArgument for
  // a bad config, unaligned or too small memory.
  static absl::StatusOr<SpmcRing> Format(void* mem, size_t bytes, const RingConfig& config);

  // Views a ring formatted by another process (or thread). FailedPrecondition
  // when the memory does not hold a ring of this layout version, or the header
  // is inconsistent with `bytes`: never a crash on garbage.
  static absl::StatusOr<SpmcRing> Attach(void* mem, size_t bytes);

  bool valid() const { return ctl_ != nullptr; }
  uint32_t num_consumers() const { return num_consumers_; }
  uint64_t capacity_bytes() const { return capacity_; }
  // capacity_bytes() / 2 - kRingRecordHeaderBytes.
  uint64_t max_record_bytes() const { return max_record_; }

  // Diagnostics (racy snapshots).
  uint64_t write_cursor() const;
  bool closed() const;
  // One line per role: cursors, sequence numbers, holders and their states.
  std::string DebugString() const;

 private:
  friend class RingProducer;
  friend class RingConsumer;

  internal::RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t num_consumers_ = 0;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
  uint64_t max_record_ = 0;
};

// The single writer of a ring. Move-only; destroying it releases the producer
// role without closing the stream (consumers keep waiting; a producer process
// that then dies is reported to them as dead).
class RingProducer {
 public:
  // Claims the producer role: records this pid, its start time and `label`
  // (truncated to 47 bytes) in the producer slot. FailedPrecondition if the
  // role is held (by a live or dead process).
  static absl::StatusOr<RingProducer> Create(SpmcRing ring, std::string label,
                                             WaitPolicy policy = {});

  RingProducer(RingProducer&& other) noexcept;
  RingProducer& operator=(RingProducer&& other) noexcept;
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;
  ~RingProducer();

  // Appends one record with sequence number next_seq(), copying `payload`
  // (0..max_record_bytes() bytes). Waits while the ring is full (see the file
  // comment). Errors: InvalidArgument if the payload is too large (the message
  // has both sizes); Unavailable if a blocking consumer died; DeadlineExceeded
  // naming the slowest blocking consumer; FailedPrecondition after Close() or
  // during a Reserve().
  absl::Status Publish(absl::Span<const uint8_t> payload, Deadline deadline);

  // Zero-copy publish: waits for room for `bytes` and returns the record's
  // payload area in the ring; write it, then Commit(). Nothing is visible to
  // consumers before Commit(). Same errors as Publish().
  absl::StatusOr<absl::Span<uint8_t>> Reserve(size_t bytes, Deadline deadline);
  // Publishes the reserved record with its full reserved size.
  absl::Status Commit();
  // Publishes the reserved record with the first `bytes_used` bytes
  // (<= the reserved size), for writers that reserve an upper bound.
  absl::Status Commit(size_t bytes_used);

  // End of stream: consumers read what was published, then get OutOfRange.
  // Discards an uncommitted reservation. Idempotent.
  void Close();

  // Refreshes this producer's heartbeat (also done by every Publish/Reserve
  // and every wait slice).
  void Beat();

  // Sequence number of the next record (the first record is 1).
  uint64_t next_seq() const { return next_seq_; }
  const SpmcRing& ring() const { return ring_; }

  // With true, Commit() issues CLDEMOTE for every cache line of the record
  // before publishing it: a hint (x86 CPUs with CLDEMOTE) to move the lines
  // from this core's private caches to the shared L3, where the consumers'
  // reads find them without a snoop of this core. A NOP on CPUs without it
  // (the opcode is in the reserved-NOP space) and on other architectures.
  void set_demote_on_commit(bool on) { demote_on_commit_ = on; }

 private:
  RingProducer(SpmcRing ring, std::string label, WaitPolicy policy);
  absl::Status WaitForSpace(uint64_t end, uint64_t bytes, Deadline deadline);
  uint64_t MinActiveReadCursor() const;
  absl::Status CheckBlockingConsumers(uint64_t required, bool at_deadline, int64_t waited_ns,
                                      uint64_t bytes) const;
  void PublishCursor(uint64_t end);
  void ReleaseRole();

  SpmcRing ring_;
  std::string label_;
  WaitPolicy policy_;
  bool active_ = false;  // holds the producer role
  bool closed_ = false;
  uint64_t write_ = 0;  // local copy of write_cursor (we are its only writer)
  uint64_t next_seq_ = 1;
  uint64_t cached_min_read_ = 0;
  bool reserved_ = false;
  uint64_t reserved_cursor_ = 0;  // cursor of the reserved record's header
  uint64_t reserved_bytes_ = 0;
  bool demote_on_commit_ = false;
};

// One consumer slot of a ring. Move-only; destroying it without Detach()
// releases the slot but keeps its cursor, so the producer keeps protecting the
// unread records and a later Attach() to the same index continues where this
// one stopped.
class RingConsumer {
 public:
  // Claims consumer slot `index` (< num_consumers) and records this pid and
  // `label`. Reading starts at the slot's cursor: seq 1 for a slot that was
  // never attached (records published before attaching are not lost).
  // InvalidArgument for a bad index; FailedPrecondition if the slot is held or
  // was detached.
  static absl::StatusOr<RingConsumer> Attach(SpmcRing ring, uint32_t index, std::string label,
                                             WaitPolicy policy = {});

  RingConsumer(RingConsumer&& other) noexcept;
  RingConsumer& operator=(RingConsumer&& other) noexcept;
  RingConsumer(const RingConsumer&) = delete;
  RingConsumer& operator=(const RingConsumer&) = delete;
  ~RingConsumer();

  // Copies the next record into *out (resized to the payload) and releases
  // it; returns its seq. Errors: OutOfRange when the producer closed the ring
  // and every record was read; Unavailable when the producer died (after the
  // published records were read); DeadlineExceeded naming the producer and its
  // state; DataLoss if the ring memory is corrupt; FailedPrecondition after
  // Detach() or while a Peek() is outstanding.
  absl::StatusOr<uint64_t> Read(std::vector<uint8_t>* out, Deadline deadline);

  // Zero-copy read: the next record, valid until Release(). Calling Peek()
  // again before Release() returns the same record. Same errors as Read().
  absl::StatusOr<RecordView> Peek(Deadline deadline);
  // Releases the record returned by Peek() (the producer may reuse its bytes).
  absl::Status Release();

  // True when a Read()/Peek() would return at once: a record is published and
  // unread, or the ring is closed (then Read() reports OutOfRange). Never
  // blocks; false when detached.
  bool Ready();

  // Leaves the ring for good: the producer stops waiting for this slot. An
  // unreleased Peek() is dropped. Further reads are FailedPrecondition.
  void Detach();

  // Refreshes this consumer's heartbeat (also done by every read and wait slice).
  void Beat();

  uint32_t index() const { return index_; }
  // Seq of the last released record (0 before the first).
  uint64_t last_seq() const { return last_seq_; }
  const SpmcRing& ring() const { return ring_; }

 private:
  RingConsumer(SpmcRing ring, uint32_t index, std::string label, WaitPolicy policy);
  absl::Status WaitForData(Deadline deadline);
  absl::Status CheckProducer(bool at_deadline, int64_t waited_ns);
  void ReleaseRole();

  SpmcRing ring_;
  uint32_t index_ = 0;
  std::string label_;
  WaitPolicy policy_;
  bool active_ = false;  // holds the slot
  bool detached_ = false;
  uint64_t read_ = 0;  // local copy of read_cursor (we are its only writer)
  uint64_t cached_write_ = 0;
  uint64_t last_seq_ = 0;
  bool peeked_ = false;
  uint64_t peek_end_ = 0;  // cursor just past the peeked record
  uint64_t peek_seq_ = 0;
  const uint8_t* peek_data_ = nullptr;
  uint64_t peek_len_ = 0;
  PidWatch producer_watch_;  // the periodic producer check between deadlines
};

// The worker -> scheduler result path: the same ring with one consumer.
using SpscRing = SpmcRing;
inline RingConfig SpscConfig(uint64_t capacity_bytes) {
  return RingConfig{/*num_consumers=*/1, capacity_bytes};
}

}  // namespace symtp::ipc
