#include "ipc/ring.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "ipc/futex.h"
#include "ipc/liveness.h"

namespace symtp::ipc {
namespace internal {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring cursors must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4);

constexpr uint64_t kRingMagic = 0x31474E5250545953ull;  // "SYTPRNG1" little-endian
constexpr uint32_t kRecordKind = 0x31434552;            // "REC1"
constexpr uint32_t kPadKind = 0x31444150;               // "PAD1"

// Immutable after Format(); magic is stored last with release.
struct alignas(64) HeaderLine {
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t num_consumers;
  uint64_t capacity;
  uint64_t max_record;
  uint64_t data_offset;
  uint64_t total_bytes;
};

// Written by the producer on every publish; read by every consumer.
struct alignas(64) ProducerLine {
  std::atomic<uint64_t> write_cursor;       // bytes published
  std::atomic<uint64_t> next_seq;           // seq of the next record (diagnostics, hand-over)
  std::atomic<uint32_t> closed;             // end of stream
  std::atomic<uint32_t> data_futex;         // bumped when sleeping consumers must wake
  std::atomic<uint32_t> consumer_sleepers;  // consumers inside FUTEX_WAIT (or about to be)
};

// Touched only when the producer sleeps for space.
struct alignas(64) SpaceLine {
  std::atomic<uint32_t> space_futex;        // bumped by a consumer that frees space for a sleeper
  std::atomic<uint32_t> producer_sleeping;  // the producer is inside FUTEX_WAIT (or about to be)
};

// Written by one consumer on every release; read by the producer.
struct alignas(64) CursorLine {
  std::atomic<uint64_t> read_cursor;  // bytes released
  std::atomic<uint64_t> read_seq;     // seq of the last released record
  std::atomic<uint32_t> detached;     // 1: the producer ignores this slot
};

struct ConsumerSlot {
  CursorLine cursor;
  HeartbeatSlot hb;
};

struct RingControl {
  HeaderLine header;
  ProducerLine producer;
  SpaceLine space;
  HeartbeatSlot producer_hb;
  ConsumerSlot consumers[kMaxRingConsumers];
};

static_assert(sizeof(HeaderLine) == 64 && sizeof(ProducerLine) == 64 && sizeof(SpaceLine) == 64);
static_assert(sizeof(CursorLine) == 64 && sizeof(ConsumerSlot) == 192);
static_assert(offsetof(RingControl, producer) % 64 == 0);
static_assert(offsetof(RingControl, consumers) % 64 == 0);
static_assert(std::is_standard_layout_v<RingControl>);

struct RecordHeader {
  uint64_t seq;
  uint32_t length;
  uint32_t kind;
};
static_assert(sizeof(RecordHeader) == kRingRecordHeaderBytes);

}  // namespace internal

using internal::ConsumerSlot;
using internal::RecordHeader;
using internal::RingControl;

namespace {

constexpr size_t kPage = 4096;

constexpr uint64_t Align16(uint64_t v) { return (v + 15) & ~uint64_t{15}; }
constexpr size_t DataOffset() { return (sizeof(RingControl) + kPage - 1) / kPage * kPage; }
bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// CLDEMOTE (NP 0F 1C /0) of the line holding each byte of [p, p + n),
// emitted as bytes so no assembler or -mcldemote is needed; CPUs without it
// execute the reserved-NOP opcode as a NOP.
inline void DemoteLines(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64) {
    asm volatile(".byte 0x0f, 0x1c, 0x00" ::"a"(a) : "memory");  // cldemote (%rax)
  }
#else
  (void)p;
  (void)n;
#endif
}

WaitPolicy Sanitize(WaitPolicy p) {
  p.spin_iters = std::max(p.spin_iters, 0);
  p.yield_iters = std::max(p.yield_iters, 0);
  p.sleep_slice_ns = std::clamp<int64_t>(p.sleep_slice_ns, 10'000, 1'000'000'000);
  return p;
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Spin -> sched_yield -> futex sleep until ready() holds.
//
// `ready()` re-checks the condition with seq_cst loads (see "Sleeping" in
// ring.h). `check(at_deadline)` refreshes the caller's heartbeat and checks the
// peer; it runs once per sleep slice in every phase and once at the deadline,
// where it must return the error to report. A non-OK check ends the wait,
// unless the condition turned true meanwhile (a peer that published and then
// died still delivered what it published).
template <typename Ready, typename Check>
absl::Status WaitUntil(const WaitPolicy& policy, Deadline deadline,
                       std::atomic<uint32_t>* futex_word, std::atomic<uint32_t>* sleepers,
                       Ready&& ready, Check&& check) {
  const int64_t slice = policy.sleep_slice_ns;
  int64_t next_check = MonotonicNs() + slice;

  // Returns a final status when the wait must end, nullopt to keep waiting.
  auto periodic = [&](int64_t now) -> std::optional<absl::Status> {
    if (now >= deadline.at_ns()) {
      if (ready()) return absl::OkStatus();
      absl::Status s = check(/*at_deadline=*/true);
      // OK from the wait means "the condition holds": never return it here.
      if (s.ok()) s = absl::DeadlineExceededError("deadline passed while waiting");
      return s;
    }
    if (now >= next_check) {
      next_check = now + slice;
      absl::Status s = check(/*at_deadline=*/false);
      if (!s.ok()) {
        if (ready()) return absl::OkStatus();
        return s;
      }
    }
    return std::nullopt;
  };

  for (int i = 0; i < policy.spin_iters; ++i) {
    if (ready()) return absl::OkStatus();
    CpuRelax();
    if ((i & 63) == 63) {
      if (auto r = periodic(MonotonicNs())) return *r;
    }
  }
  for (int i = 0; i < policy.yield_iters; ++i) {
    if (ready()) return absl::OkStatus();
    ::sched_yield();
    if (auto r = periodic(MonotonicNs())) return *r;
  }
  while (true) {
    if (ready()) return absl::OkStatus();
    int64_t now = MonotonicNs();
    if (auto r = periodic(now)) return *r;
    uint32_t seen = futex_word->load(std::memory_order_acquire);
    sleepers->fetch_add(1, std::memory_order_seq_cst);
    absl::Status wait_status = absl::OkStatus();
    if (!ready()) {
      int64_t timeout = std::min({slice, deadline.at_ns() - now, next_check - now});
      wait_status = FutexWait(futex_word, seen, std::max<int64_t>(timeout, 1000));
    }
    sleepers->fetch_sub(1, std::memory_order_seq_cst);
    SYMTP_RETURN_IF_ERROR(wait_status);
  }
}

void WakeAll(std::atomic<uint32_t>* word) {
  word->fetch_add(1, std::memory_order_release);
  FutexWakeAll(word);
}

absl::Status ValidateConfig(const RingConfig& c) {
  if (c.num_consumers < 1 || c.num_consumers > kMaxRingConsumers) {
    return absl::InvalidArgumentError(absl::StrFormat("ring num_consumers must be 1..%u, got %u",
                                                      kMaxRingConsumers, c.num_consumers));
  }
  if (!IsPowerOfTwo(c.capacity_bytes) || c.capacity_bytes < kMinRingCapacity ||
      c.capacity_bytes > kMaxRingCapacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring capacity_bytes must be a power of two in [%u, 2^32], got %u",
                        kMinRingCapacity, c.capacity_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

WaitPolicy BusyPollPolicy() {
  WaitPolicy p;
  p.spin_iters = 1 << 14;
  p.yield_iters = INT_MAX;  // never sleeps; the deadline still ends the wait
  return p;
}

// ---------------------------------------------------------------------------
// SpmcRing

size_t SpmcRing::RequiredBytes(const RingConfig& config) {
  return DataOffset() + config.capacity_bytes;
}

absl::StatusOr<SpmcRing> SpmcRing::Format(void* mem, size_t bytes, const RingConfig& config) {
  SYMTP_RETURN_IF_ERROR(ValidateConfig(config));
  if (mem == nullptr || reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring memory %p must be non-null and 64-byte aligned", mem));
  }
  const size_t need = RequiredBytes(config);
  if (bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring with %u consumers and capacity %u needs %u bytes, got %u",
                        config.num_consumers, config.capacity_bytes, need, bytes));
  }
  auto* ctl = new (mem) RingControl();  // value-initialized: every atomic is 0
  ctl->header.version = kRingLayoutVersion;
  ctl->header.num_consumers = config.num_consumers;
  ctl->header.capacity = config.capacity_bytes;
  ctl->header.max_record = config.capacity_bytes / 2 - kRingRecordHeaderBytes;
  ctl->header.data_offset = DataOffset();
  ctl->header.total_bytes = need;
  ctl->producer.next_seq.store(1, std::memory_order_relaxed);
  ctl->header.magic.store(internal::kRingMagic, std::memory_order_release);
  SYMTP_LOG(DEBUG, "ipc") << "ring formatted: " << config.num_consumers << " consumers, "
                          << config.capacity_bytes << " bytes";
  return Attach(mem, bytes);
}

absl::StatusOr<SpmcRing> SpmcRing::Attach(void* mem, size_t bytes) {
  if (mem == nullptr || reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring memory %p must be non-null and 64-byte aligned", mem));
  }
  if (bytes < DataOffset()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%u bytes cannot hold a ring (the control block alone is %u)", bytes, DataOffset()));
  }
  auto* ctl = static_cast<RingControl*>(mem);
  const uint64_t magic = ctl->header.magic.load(std::memory_order_acquire);
  if (magic == 0) {
    return absl::FailedPreconditionError("ring memory is not formatted (magic 0)");
  }
  if (magic != internal::kRingMagic) {
    return absl::FailedPreconditionError(
        absl::StrFormat("memory does not hold a symtp ring: magic 0x%016x, expected 0x%016x", magic,
                        internal::kRingMagic));
  }
  const internal::HeaderLine& h = ctl->header;
  if (h.version != kRingLayoutVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("ring layout version %u, this build understands %u (mixed binaries?)",
                        h.version, kRingLayoutVersion));
  }
  RingConfig cfg{h.num_consumers, h.capacity};
  absl::Status s = ValidateConfig(cfg);
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("corrupt ring header: ", s.message()));
  }
  if (h.max_record != h.capacity / 2 - kRingRecordHeaderBytes || h.data_offset != DataOffset() ||
      h.total_bytes != RequiredBytes(cfg)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "corrupt ring header: max_record %u, data_offset %u, total %u for capacity %u",
        h.max_record, h.data_offset, h.total_bytes, h.capacity));
  }
  if (bytes < h.total_bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ring needs %u bytes but the memory given is %u bytes", h.total_bytes, bytes));
  }
  SpmcRing r;
  r.ctl_ = ctl;
  r.data_ = static_cast<uint8_t*>(mem) + h.data_offset;
  r.num_consumers_ = h.num_consumers;
  r.capacity_ = h.capacity;
  r.mask_ = h.capacity - 1;
  r.max_record_ = h.max_record;
  return r;
}

uint64_t SpmcRing::write_cursor() const {
  return ctl_ != nullptr ? ctl_->producer.write_cursor.load(std::memory_order_acquire) : 0;
}

bool SpmcRing::closed() const {
  return ctl_ != nullptr && ctl_->producer.closed.load(std::memory_order_acquire) != 0;
}

std::string SpmcRing::DebugString() const {
  if (ctl_ == nullptr) return "ring (invalid view)";
  std::string out = absl::StrFormat(
      "ring: capacity %u, %u consumers, write cursor %u, next seq %u%s; %s", capacity_,
      num_consumers_, ctl_->producer.write_cursor.load(std::memory_order_acquire),
      ctl_->producer.next_seq.load(std::memory_order_relaxed), closed() ? ", closed" : "",
      DescribePeer("producer", ctl_->producer_hb));
  for (uint32_t i = 0; i < num_consumers_; ++i) {
    const ConsumerSlot& c = ctl_->consumers[i];
    absl::StrAppendFormat(
        &out, "; %s at cursor %u (seq %u)%s", DescribePeer(absl::StrCat("consumer ", i), c.hb),
        c.cursor.read_cursor.load(std::memory_order_acquire),
        c.cursor.read_seq.load(std::memory_order_relaxed),
        c.cursor.detached.load(std::memory_order_acquire) != 0 ? " [detached]" : "");
  }
  return out;
}

// ---------------------------------------------------------------------------
// RingProducer

RingProducer::RingProducer(SpmcRing ring, std::string label, WaitPolicy policy)
    : ring_(ring), label_(std::move(label)), policy_(Sanitize(policy)) {}

// Default members, then the move: ReleaseRole() has nothing to release.
RingProducer::RingProducer(RingProducer&& o) noexcept { *this = std::move(o); }

RingProducer& RingProducer::operator=(RingProducer&& o) noexcept {
  if (this != &o) {
    ReleaseRole();
    ring_ = o.ring_;
    label_ = std::move(o.label_);
    policy_ = o.policy_;
    active_ = std::exchange(o.active_, false);
    closed_ = o.closed_;
    write_ = o.write_;
    next_seq_ = o.next_seq_;
    cached_min_read_ = o.cached_min_read_;
    reserved_ = std::exchange(o.reserved_, false);
    reserved_cursor_ = o.reserved_cursor_;
    reserved_bytes_ = o.reserved_bytes_;
    demote_on_commit_ = o.demote_on_commit_;
  }
  return *this;
}

RingProducer::~RingProducer() { ReleaseRole(); }

void RingProducer::ReleaseRole() {
  if (!active_) return;
  reserved_ = false;
  active_ = false;
  ring_.ctl_->producer_hb.state.store(HeartbeatSlot::kFree, std::memory_order_release);
}

absl::StatusOr<RingProducer> RingProducer::Create(SpmcRing ring, std::string label,
                                                  WaitPolicy policy) {
  if (!ring.valid()) return absl::InvalidArgumentError("RingProducer::Create on an invalid ring");
  HeartbeatSlot& hb = ring.ctl_->producer_hb;
  uint32_t expected = HeartbeatSlot::kFree;
  if (!hb.state.compare_exchange_strong(expected, HeartbeatSlot::kClaiming,
                                        std::memory_order_acq_rel)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot become producer '", label,
                                                      "': the ring already has ",
                                                      DescribePeer("producer", hb)));
  }
  RingProducer p(ring, std::move(label), policy);
  p.write_ = ring.ctl_->producer.write_cursor.load(std::memory_order_acquire);
  p.next_seq_ = ring.ctl_->producer.next_seq.load(std::memory_order_relaxed);
  p.closed_ = ring.ctl_->producer.closed.load(std::memory_order_acquire) != 0;
  p.cached_min_read_ = p.MinActiveReadCursor();
  hb.PublishHolder(p.label_);
  p.active_ = true;
  SYMTP_LOG(DEBUG, "ipc") << "producer '" << p.label_ << "' attached at seq " << p.next_seq_;
  return p;
}

void RingProducer::Beat() {
  if (active_) ring_.ctl_->producer_hb.Beat();
}

uint64_t RingProducer::MinActiveReadCursor() const {
  uint64_t m = write_;  // with every consumer detached nothing is protected
  for (uint32_t i = 0; i < ring_.num_consumers_; ++i) {
    const ConsumerSlot& c = ring_.ctl_->consumers[i];
    if (c.cursor.detached.load(std::memory_order_seq_cst) != 0) continue;
    uint64_t r = c.cursor.read_cursor.load(std::memory_order_seq_cst);
    m = std::min(m, std::min(r, write_));  // a cursor past ours would be corruption
  }
  return m;
}

absl::Status RingProducer::CheckBlockingConsumers(uint64_t required, bool at_deadline,
                                                  int64_t waited_ns, uint64_t bytes) const {
  const RingControl& ctl = *ring_.ctl_;
  const uint64_t published = next_seq_ - 1;
  int slowest = -1;
  uint64_t slowest_cursor = UINT64_MAX;
  std::vector<int> blocking;
  for (uint32_t i = 0; i < ring_.num_consumers_; ++i) {
    const ConsumerSlot& c = ctl.consumers[i];
    if (c.cursor.detached.load(std::memory_order_acquire) != 0) continue;
    uint64_t r = c.cursor.read_cursor.load(std::memory_order_acquire);
    if (r >= required) continue;
    blocking.push_back(static_cast<int>(i));
    if (r < slowest_cursor) {
      slowest_cursor = r;
      slowest = static_cast<int>(i);
    }
    uint32_t state = c.hb.state.load(std::memory_order_acquire);
    bool ever_held = c.hb.pid.load(std::memory_order_relaxed) != 0;
    if (state == HeartbeatSlot::kHeld || (state == HeartbeatSlot::kFree && ever_held)) {
      ProcState ps = ProbeHolder(c.hb);
      if (!IsLive(ps)) {
        uint64_t read_seq = c.cursor.read_seq.load(std::memory_order_relaxed);
        return absl::UnavailableError(absl::StrFormat(
            "producer '%s': %s died with %u unread records (%u bytes); cannot publish seq %u",
            label_, DescribePeer(absl::StrCat("consumer ", i), c.hb), published - read_seq,
            write_ - r, next_seq_));
      }
    }
  }
  if (!at_deadline) return absl::OkStatus();
  if (slowest < 0) {
    // Space appeared between the last check and now; the caller re-checks.
    return absl::DeadlineExceededError(
        absl::StrFormat("producer '%s': ring full for %.1f ms publishing seq %u (%u bytes)", label_,
                        Ms(waited_ns), next_seq_, bytes));
  }
  auto describe = [&](int i) {
    const ConsumerSlot& c = ctl.consumers[i];
    uint64_t r = c.cursor.read_cursor.load(std::memory_order_acquire);
    uint64_t read_seq = c.cursor.read_seq.load(std::memory_order_relaxed);
    return absl::StrFormat("%s, %u records (%u bytes) behind",
                           DescribePeer(absl::StrCat("consumer ", i), c.hb), published - read_seq,
                           write_ - std::min(r, write_));
  };
  std::string msg = absl::StrFormat(
      "producer '%s': ring full for %.1f ms publishing seq %u (%u bytes); blocked by %s", label_,
      Ms(waited_ns), next_seq_, bytes, describe(slowest));
  for (int i : blocking) {
    if (i != slowest) absl::StrAppend(&msg, "; also by ", describe(i));
  }
  return absl::DeadlineExceededError(msg);
}

absl::Status RingProducer::WaitForSpace(uint64_t end, uint64_t bytes, Deadline deadline) {
  const uint64_t required = end - ring_.capacity_;  // every active cursor must reach this
  auto ready = [&] {
    cached_min_read_ = MinActiveReadCursor();
    return cached_min_read_ >= required;
  };
  if (ready()) return absl::OkStatus();
  const int64_t start = MonotonicNs();
  SYMTP_LOG(TRACE, "ipc") << "producer '" << label_ << "' waits for space for seq " << next_seq_;
  auto check = [&](bool at_deadline) {
    Beat();
    return CheckBlockingConsumers(required, at_deadline, MonotonicNs() - start, bytes);
  };
  return WaitUntil(policy_, deadline, &ring_.ctl_->space.space_futex,
                   &ring_.ctl_->space.producer_sleeping, ready, check);
}

absl::StatusOr<absl::Span<uint8_t>> RingProducer::Reserve(size_t bytes, Deadline deadline) {
  if (!active_) {
    return absl::FailedPreconditionError(
        "RingProducer: not holding the producer role (moved-from or released)");
  }
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("producer '%s': ring is closed; cannot publish seq %u", label_, next_seq_));
  }
  if (reserved_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "producer '%s': Reserve() while seq %u is reserved and not committed", label_, next_seq_));
  }
  if (bytes > ring_.max_record_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "producer '%s': record of %u bytes exceeds max_record_bytes %u (ring capacity %u)", label_,
        bytes, ring_.max_record_, ring_.capacity_));
  }
  RingControl& ctl = *ring_.ctl_;
  ctl.producer_hb.Beat();
  const uint64_t cap = ring_.capacity_;
  const uint64_t total = Align16(kRingRecordHeaderBytes + bytes);
  const uint64_t pos = write_ & ring_.mask_;
  const uint64_t pad = (cap - pos < total) ? cap - pos : 0;
  const uint64_t end = write_ + pad + total;
  if (end > cached_min_read_ + cap) {
    SYMTP_RETURN_IF_ERROR(WaitForSpace(end, bytes, deadline));
  }
  if (pad != 0) {
    RecordHeader ph{0, static_cast<uint32_t>(pad - kRingRecordHeaderBytes), internal::kPadKind};
    std::memcpy(ring_.data_ + pos, &ph, sizeof(ph));
  }
  reserved_ = true;
  reserved_cursor_ = write_ + pad;
  reserved_bytes_ = bytes;
  uint8_t* payload = ring_.data_ + (reserved_cursor_ & ring_.mask_) + kRingRecordHeaderBytes;
  return absl::Span<uint8_t>(payload, bytes);
}

absl::Status RingProducer::Commit() { return Commit(reserved_bytes_); }

absl::Status RingProducer::Commit(size_t bytes_used) {
  if (!reserved_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("producer '%s': Commit() without a Reserve()", label_));
  }
  if (bytes_used > reserved_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("producer '%s': Commit(%u) exceeds the %u bytes reserved for seq %u",
                        label_, bytes_used, reserved_bytes_, next_seq_));
  }
  RecordHeader h{next_seq_, static_cast<uint32_t>(bytes_used), internal::kRecordKind};
  uint8_t* record = ring_.data_ + (reserved_cursor_ & ring_.mask_);
  std::memcpy(record, &h, sizeof(h));
  if (demote_on_commit_) DemoteLines(record, kRingRecordHeaderBytes + bytes_used);
  reserved_ = false;
  ++next_seq_;
  PublishCursor(reserved_cursor_ + Align16(kRingRecordHeaderBytes + bytes_used));
  return absl::OkStatus();
}

void RingProducer::PublishCursor(uint64_t end) {
  internal::ProducerLine& pl = ring_.ctl_->producer;
  write_ = end;
  pl.next_seq.store(next_seq_, std::memory_order_relaxed);
  // seq_cst (not just release): pairs with the sleeper count below, see ring.h.
  pl.write_cursor.store(end, std::memory_order_seq_cst);
  if (pl.consumer_sleepers.load(std::memory_order_seq_cst) != 0) WakeAll(&pl.data_futex);
}

absl::Status RingProducer::Publish(absl::Span<const uint8_t> payload, Deadline deadline) {
  SYMTP_ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, Reserve(payload.size(), deadline));
  if (!payload.empty()) std::memcpy(dst.data(), payload.data(), payload.size());
  return Commit();
}

void RingProducer::Close() {
  if (!active_ || closed_) return;
  reserved_ = false;
  closed_ = true;
  internal::ProducerLine& pl = ring_.ctl_->producer;
  pl.closed.store(1, std::memory_order_seq_cst);
  WakeAll(&pl.data_futex);
  SYMTP_LOG(DEBUG, "ipc") << "producer '" << label_ << "' closed the ring after seq "
                          << next_seq_ - 1;
}

// ---------------------------------------------------------------------------
// RingConsumer

RingConsumer::RingConsumer(SpmcRing ring, uint32_t index, std::string label, WaitPolicy policy)
    : ring_(ring), index_(index), label_(std::move(label)), policy_(Sanitize(policy)) {}

RingConsumer::RingConsumer(RingConsumer&& o) noexcept { *this = std::move(o); }

RingConsumer& RingConsumer::operator=(RingConsumer&& o) noexcept {
  if (this != &o) {
    ReleaseRole();
    ring_ = o.ring_;
    index_ = o.index_;
    label_ = std::move(o.label_);
    policy_ = o.policy_;
    active_ = std::exchange(o.active_, false);
    detached_ = o.detached_;
    read_ = o.read_;
    cached_write_ = o.cached_write_;
    last_seq_ = o.last_seq_;
    peeked_ = std::exchange(o.peeked_, false);
    peek_end_ = o.peek_end_;
    peek_seq_ = o.peek_seq_;
    peek_data_ = o.peek_data_;
    peek_len_ = o.peek_len_;
    producer_watch_ = std::move(o.producer_watch_);
  }
  return *this;
}

RingConsumer::~RingConsumer() { ReleaseRole(); }

void RingConsumer::ReleaseRole() {
  if (!active_) return;
  active_ = false;
  peeked_ = false;
  ring_.ctl_->consumers[index_].hb.state.store(HeartbeatSlot::kFree, std::memory_order_release);
}

absl::StatusOr<RingConsumer> RingConsumer::Attach(SpmcRing ring, uint32_t index, std::string label,
                                                  WaitPolicy policy) {
  if (!ring.valid()) return absl::InvalidArgumentError("RingConsumer::Attach on an invalid ring");
  if (index >= ring.num_consumers_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("consumer '%s': index %u out of range, the ring has %u consumer slots",
                        label, index, ring.num_consumers_));
  }
  ConsumerSlot& slot = ring.ctl_->consumers[index];
  uint32_t expected = HeartbeatSlot::kFree;
  if (slot.cursor.detached.load(std::memory_order_acquire) != 0 ||
      !slot.hb.state.compare_exchange_strong(expected, HeartbeatSlot::kClaiming,
                                             std::memory_order_acq_rel)) {
    return absl::FailedPreconditionError(
        absl::StrCat("consumer '", label, "' cannot attach to slot ", index, ": ",
                     DescribePeer(absl::StrCat("consumer ", index), slot.hb)));
  }
  RingConsumer c(ring, index, std::move(label), policy);
  c.read_ = slot.cursor.read_cursor.load(std::memory_order_acquire);
  c.last_seq_ = slot.cursor.read_seq.load(std::memory_order_relaxed);
  c.cached_write_ = c.read_;
  slot.hb.PublishHolder(c.label_);
  c.active_ = true;
  SYMTP_LOG(DEBUG, "ipc") << "consumer " << index << " '" << c.label_ << "' attached after seq "
                          << c.last_seq_;
  return c;
}

void RingConsumer::Beat() {
  if (active_) ring_.ctl_->consumers[index_].hb.Beat();
}

absl::Status RingConsumer::CheckProducer(bool at_deadline, int64_t waited_ns) {
  const RingControl& ctl = *ring_.ctl_;
  const HeartbeatSlot& p = ctl.producer_hb;
  uint32_t state = p.state.load(std::memory_order_acquire);
  bool ever_held = p.pid.load(std::memory_order_relaxed) != 0;
  if (state == HeartbeatSlot::kHeld || (state == HeartbeatSlot::kFree && ever_held)) {
    // Between deadlines a pidfd poll (PidWatch, ~0.2 us): the /proc probe
    // (~13 us) here was long enough to delay a record that arrived meanwhile.
    ProcState ps = at_deadline ? ProbeHolder(p) : producer_watch_.Probe(p);
    if (!IsLive(ps)) {
      return absl::UnavailableError(absl::StrFormat(
          "consumer %u '%s': %s is gone; read up to seq %u, the ring was not closed", index_,
          label_, DescribePeer("producer", p), last_seq_));
    }
  }
  if (!at_deadline) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrFormat(
      "consumer %u '%s': no record after seq %u within %.1f ms; %s has published up to seq %u",
      index_, label_, last_seq_, Ms(waited_ns), DescribePeer("producer", p),
      ctl.producer.next_seq.load(std::memory_order_relaxed) - 1));
}

absl::Status RingConsumer::WaitForData(Deadline deadline) {
  internal::ProducerLine& pl = ring_.ctl_->producer;
  auto ready = [&] {
    uint64_t w = pl.write_cursor.load(std::memory_order_seq_cst);
    if (w != read_) {
      cached_write_ = w;
      return true;
    }
    return pl.closed.load(std::memory_order_seq_cst) != 0;
  };
  const int64_t start = MonotonicNs();
  auto check = [&](bool at_deadline) {
    Beat();
    return CheckProducer(at_deadline, MonotonicNs() - start);
  };
  return WaitUntil(policy_, deadline, &pl.data_futex, &pl.consumer_sleepers, ready, check);
}

bool RingConsumer::Ready() {
  if (!active_) return false;
  if (peeked_ || read_ != cached_write_) return true;
  const RingControl& ctl = *ring_.ctl_;
  cached_write_ = ctl.producer.write_cursor.load(std::memory_order_acquire);
  return read_ != cached_write_ || ctl.producer.closed.load(std::memory_order_acquire) != 0;
}

absl::StatusOr<RecordView> RingConsumer::Peek(Deadline deadline) {
  if (!active_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("consumer %u '%s': %s", index_, label_,
                        detached_ ? "detached from the ring" : "not attached (moved-from)"));
  }
  RingControl& ctl = *ring_.ctl_;
  const uint64_t cap = ring_.capacity_;
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrFormat(
        "consumer %u '%s': corrupt ring at cursor %u (after seq %u, producer at cursor %u): %s",
        index_, label_, read_, last_seq_, cached_write_, what));
  };
  if (peeked_) return RecordView{peek_seq_, absl::Span<const uint8_t>(peek_data_, peek_len_)};
  ctl.consumers[index_].hb.Beat();
  while (true) {
    if (read_ == cached_write_) {
      cached_write_ = ctl.producer.write_cursor.load(std::memory_order_acquire);
      if (read_ == cached_write_) {
        if (ctl.producer.closed.load(std::memory_order_acquire) != 0) {
          cached_write_ = ctl.producer.write_cursor.load(std::memory_order_acquire);
          if (read_ == cached_write_) {
            return absl::OutOfRangeError(absl::StrFormat(
                "consumer %u '%s': ring closed by the producer; all %u records read", index_,
                label_, last_seq_));
          }
          continue;
        }
        SYMTP_RETURN_IF_ERROR(WaitForData(deadline));
        continue;
      }
    }
    if (cached_write_ < read_ || cached_write_ - read_ < kRingRecordHeaderBytes) {
      return corrupt("published bytes end inside a record header");
    }
    const uint64_t pos = read_ & ring_.mask_;
    RecordHeader h;
    std::memcpy(&h, ring_.data_ + pos, sizeof(h));
    if (h.kind == internal::kPadKind) {
      const uint64_t pad = cap - pos;
      if (h.length != pad - kRingRecordHeaderBytes || cached_write_ - read_ < pad) {
        return corrupt(
            absl::StrFormat("bad pad record (length %u, %u bytes to the end)", h.length, pad));
      }
      read_ += pad;  // published with the next Release()
      continue;
    }
    if (h.kind != internal::kRecordKind) {
      return corrupt(absl::StrFormat("bad record kind 0x%08x", h.kind));
    }
    if (h.length > ring_.max_record_ || pos + kRingRecordHeaderBytes + h.length > cap) {
      return corrupt(absl::StrFormat("bad record length %u (max %u)", h.length, ring_.max_record_));
    }
    const uint64_t total = Align16(kRingRecordHeaderBytes + h.length);
    if (cached_write_ - read_ < total) {
      return corrupt(
          absl::StrFormat("record of %u bytes extends past the published data", h.length));
    }
    if (h.seq != last_seq_ + 1) {
      return corrupt(absl::StrFormat("expected seq %u, found %u", last_seq_ + 1, h.seq));
    }
    peeked_ = true;
    peek_end_ = read_ + total;
    peek_seq_ = h.seq;
    peek_data_ = ring_.data_ + pos + kRingRecordHeaderBytes;
    peek_len_ = h.length;
    return RecordView{peek_seq_, absl::Span<const uint8_t>(peek_data_, peek_len_)};
  }
}

absl::Status RingConsumer::Release() {
  if (!active_ || !peeked_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("consumer %u '%s': Release() without a Peek()", index_, label_));
  }
  peeked_ = false;
  read_ = peek_end_;
  last_seq_ = peek_seq_;
  internal::CursorLine& cl = ring_.ctl_->consumers[index_].cursor;
  cl.read_seq.store(last_seq_, std::memory_order_relaxed);
  // seq_cst (not just release): pairs with producer_sleeping below, see ring.h.
  cl.read_cursor.store(read_, std::memory_order_seq_cst);
  internal::SpaceLine& sl = ring_.ctl_->space;
  if (sl.producer_sleeping.load(std::memory_order_seq_cst) != 0) WakeAll(&sl.space_futex);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RingConsumer::Read(std::vector<uint8_t>* out, Deadline deadline) {
  if (out == nullptr) return absl::InvalidArgumentError("RingConsumer::Read: out is null");
  if (peeked_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("consumer %u '%s': Read() while a Peek() of seq %u is not released", index_,
                        label_, peek_seq_));
  }
  SYMTP_ASSIGN_OR_RETURN(RecordView v, Peek(deadline));
  out->assign(v.payload.begin(), v.payload.end());
  SYMTP_RETURN_IF_ERROR(Release());
  return v.seq;
}

void RingConsumer::Detach() {
  if (!active_ || detached_) return;
  peeked_ = false;
  detached_ = true;
  active_ = false;
  ConsumerSlot& slot = ring_.ctl_->consumers[index_];
  slot.cursor.detached.store(1, std::memory_order_seq_cst);
  slot.hb.state.store(HeartbeatSlot::kDetached, std::memory_order_release);
  WakeAll(&ring_.ctl_->space.space_futex);  // a producer blocked on this slot re-checks
  SYMTP_LOG(DEBUG, "ipc") << "consumer " << index_ << " '" << label_ << "' detached after seq "
                          << last_seq_;
}

}  // namespace symtp::ipc
