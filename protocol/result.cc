#include "protocol/result.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "protocol/diff.h"
#include "protocol/wire.h"

namespace symtp::proto {
namespace {

using wire::Reader;
using wire::Writer;
using wire::ZigZag;

constexpr const char* kWhat = "result";

absl::Status CheckResult(const StepResult& r) {
  if (r.rank >= kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("result step %d: rank %d exceeds limit %d", r.step, r.rank, kMaxRanks));
  }
  if (r.sampled.size() > kMaxEntriesPerList) {
    return absl::InvalidArgumentError(
        absl::StrFormat("result step %d rank %d: %d sampled tokens exceeds limit %d", r.step,
                        r.rank, r.sampled.size(), kMaxEntriesPerList));
  }
  for (size_t i = 0; i < r.sampled.size(); ++i) {
    if (r.sampled[i].token < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("result step %d rank %d: sampled[%d] (request %d) token %d is negative",
                          r.step, r.rank, i, r.sampled[i].request_id, r.sampled[i].token));
    }
  }
  return absl::OkStatus();
}

size_t EncodePayload(const StepResult& r, uint8_t* p) {
  Writer w{p};
  w.Varint(r.rank);
  w.Fixed64(r.digest);
  w.Varint(r.timings.recv_wait_ns);
  w.Varint(r.timings.apply_ns);
  w.Varint(r.timings.build_ns);
  w.Varint(r.timings.forward_ns);
  w.Varint(r.timings.sample_ns);
  w.Varint(r.timings.total_ns);
  w.Varint(r.timings.gpu_idle_ns);
  w.Varint(r.timings.recv_at_ns);
  w.Varint(r.timings.launch_at_ns);
  w.Varint(r.timings.collect_at_ns);
  w.Varint(r.timings.result_at_ns);
  w.Varint(r.sampled.size());
  uint64_t prev = 0;
  for (const SampledToken& t : r.sampled) {
    w.Varint(ZigZag(static_cast<int64_t>(t.request_id - prev)));
    prev = t.request_id;
    w.Varint(static_cast<uint32_t>(t.token));
  }
  return static_cast<size_t>(w.p - p);
}

absl::Status DecodePayload(Reader& rd, StepResult* r) {
  absl::Status s;
  uint64_t v;
  if (!(s = rd.Bounded(&v, kMaxRanks - 1, "rank")).ok()) return s;
  r->rank = static_cast<uint32_t>(v);
  if (!(s = rd.Fixed64(&r->digest, "digest")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.recv_wait_ns, "timings.recv_wait_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.apply_ns, "timings.apply_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.build_ns, "timings.build_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.forward_ns, "timings.forward_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.sample_ns, "timings.sample_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.total_ns, "timings.total_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.gpu_idle_ns, "timings.gpu_idle_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.recv_at_ns, "timings.recv_at_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.launch_at_ns, "timings.launch_at_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.collect_at_ns, "timings.collect_at_ns")).ok()) return s;
  if (!(s = rd.Varint(&r->timings.result_at_ns, "timings.result_at_ns")).ok()) return s;
  uint64_t n;
  if (!(s = rd.Count(&n, kMaxEntriesPerList, 2, "sampled.count")).ok()) return s;
  r->sampled.resize(n);
  uint64_t prev = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t z;
    if (!(s = rd.Varint(&z, "sampled.request_id")).ok()) return s;
    prev += static_cast<uint64_t>(wire::UnZigZag(z));
    r->sampled[i].request_id = prev;
    if (!(s = rd.Bounded(&v, kMaxInt32, "sampled.token")).ok()) return s;
    r->sampled[i].token = static_cast<int32_t>(v);
  }
  if (!rd.at_end()) {
    return rd.Invalid("payload", absl::StrFormat("%d trailing bytes", rd.remaining()));
  }
  return absl::OkStatus();
}

// Varints before the tokens: rank, the 11 PhaseTimings fields, the count.
constexpr size_t kFixedVarints = 1 + 11 + 1;
static_assert(sizeof(PhaseTimings) == 11 * sizeof(uint64_t),
              "PhaseTimings changed: update EncodePayload, DecodeResult and kFixedVarints");

size_t MaxPayload(const StepResult& r) {
  return kFixedVarints * wire::kMaxVarint64 + 8 +
         r.sampled.size() * (wire::kMaxVarint64 + wire::kMaxVarint32);
}

}  // namespace

size_t MaxEncodedResultSize(const StepResult& r) { return kHeaderSize + MaxPayload(r); }

absl::Status EncodeResult(const StepResult& r, std::vector<uint8_t>* out) {
  SYMTP_RETURN_IF_ERROR(CheckResult(r));
  return EncodeRecord(
      kResultMagic, r.graph ? kResultFlagGraph : 0, r.step, kWhat, MaxPayload(r),
      [&](uint8_t* p) { return EncodePayload(r, p); }, out);
}

absl::StatusOr<size_t> EncodeResultTo(const StepResult& r, absl::Span<uint8_t> out) {
  SYMTP_RETURN_IF_ERROR(CheckResult(r));
  return EncodeRecordTo(
      kResultMagic, r.graph ? kResultFlagGraph : 0, r.step, kWhat, MaxPayload(r),
      [&](uint8_t* p) { return EncodePayload(r, p); }, out);
}

absl::Status DecodeResultInto(absl::Span<const uint8_t> record, StepResult* out) {
  SYMTP_ASSIGN_OR_RETURN(const FrameHeader h,
                         DecodeRecord(record, kResultMagic, kResultKnownFlags, kWhat,
                                      [&](Reader& r) { return DecodePayload(r, out); }));
  out->step = h.seq;
  out->graph = (h.flags & kResultFlagGraph) != 0;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> DecodeResult(absl::Span<const uint8_t> record) {
  StepResult r;
  SYMTP_RETURN_IF_ERROR(DecodeResultInto(record, &r));
  return r;
}

}  // namespace symtp::proto
