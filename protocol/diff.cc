#include "protocol/diff.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "protocol/wire.h"

namespace symtp::proto {
namespace {

using wire::Reader;
using wire::Writer;
using wire::ZigZag;

constexpr const char* kWhat = "diff";

// ---- per-entry checks shared by the encoder, the decoder and ValidateDiff ----

absl::Status CheckSampling(const SamplingParams& s, size_t i, uint64_t id) {
  if (!std::isfinite(s.temperature) || s.temperature < 0.f) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "new_requests[%d] (id %d): temperature %g must be finite and >= 0", i, id, s.temperature));
  }
  if (s.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): top_k %d < 0", i, id, s.top_k));
  }
  if (!std::isfinite(s.top_p) || !(s.top_p > 0.f) || s.top_p > 1.f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): top_p %g must be in (0, 1]", i, id, s.top_p));
  }
  return absl::OkStatus();
}

absl::Status CheckNewRequest(const NewRequest& r, size_t i) {
  if (r.prompt.empty() || r.prompt.size() > kMaxTokensPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): prompt length %d not in [1, %d]", i, r.id,
                        r.prompt.size(), kMaxTokensPerRequest));
  }
  for (size_t k = 0; k < r.prompt.size(); ++k) {
    if (r.prompt[k] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "new_requests[%d] (id %d): prompt[%d] = %d is negative", i, r.id, k, r.prompt[k]));
    }
  }
  if (r.num_scheduled < 1 || r.num_scheduled > r.prompt.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): num_scheduled %d not in [1, prompt length %d]",
                        i, r.id, r.num_scheduled, r.prompt.size()));
  }
  if (r.max_new_tokens < 1 || r.max_new_tokens > kMaxTokensPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): max_new_tokens %d not in [1, %d]", i, r.id,
                        r.max_new_tokens, kMaxTokensPerRequest));
  }
  if (r.eos_id.has_value() && *r.eos_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("new_requests[%d] (id %d): eos id %d is negative", i, r.id, *r.eos_id));
  }
  SYMTP_RETURN_IF_ERROR(CheckSampling(r.sampling, i, r.id));
  const size_t need = (r.num_scheduled + kBlockSize - 1) / kBlockSize;
  if (r.block_ids.size() < need || r.block_ids.size() > kMaxBlocksPerRequest) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "new_requests[%d] (id %d): %d initial blocks, need %d..%d for %d scheduled tokens", i, r.id,
        r.block_ids.size(), need, kMaxBlocksPerRequest, r.num_scheduled));
  }
  for (size_t k = 0; k < r.block_ids.size(); ++k) {
    if (r.block_ids[k] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "new_requests[%d] (id %d): block_ids[%d] = %d is negative", i, r.id, k, r.block_ids[k]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckContinuing(const StepDiff& d) {
  uint64_t next_offset = 0;
  for (size_t i = 0; i < d.continuing.size(); ++i) {
    const ContinuingRequest& c = d.continuing[i];
    if (c.num_scheduled < 1 || c.num_scheduled > kMaxTokensPerRequest) {
      return absl::InvalidArgumentError(
          absl::StrFormat("continuing[%d] (id %d): num_scheduled %d not in [1, %d]", i, c.id,
                          c.num_scheduled, kMaxTokensPerRequest));
    }
    if (c.num_new_blocks > kMaxBlocksPerRequest) {
      return absl::InvalidArgumentError(
          absl::StrFormat("continuing[%d] (id %d): %d new blocks exceeds limit %d", i, c.id,
                          c.num_new_blocks, kMaxBlocksPerRequest));
    }
    if (c.block_offset != next_offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "continuing[%d] (id %d): block_offset %d, expected %d (ranges must be back to back)", i,
          c.id, c.block_offset, next_offset));
    }
    next_offset += c.num_new_blocks;
    if (next_offset > d.continuing_blocks.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "continuing[%d] (id %d): block range [%d, %d) outside continuing_blocks (size %d)", i,
          c.id, c.block_offset, next_offset, d.continuing_blocks.size()));
    }
    for (uint32_t k = 0; k < c.num_new_blocks; ++k) {
      if (d.continuing_blocks[c.block_offset + k] < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("continuing[%d] (id %d): new block %d = %d is negative", i, c.id, k,
                            d.continuing_blocks[c.block_offset + k]));
      }
    }
  }
  if (next_offset != d.continuing_blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("continuing_blocks has %d entries, the continuing requests use %d",
                        d.continuing_blocks.size(), next_offset));
  }
  return absl::OkStatus();
}

absl::Status CheckListSizes(const StepDiff& d) {
  struct L {
    const char* name;
    size_t n;
  } lists[] = {{"new_requests", d.new_requests.size()},
               {"continuing", d.continuing.size()},
               {"finished", d.finished.size()},
               {"aborted", d.aborted.size()},
               {"preempted", d.preempted.size()}};
  for (const L& l : lists) {
    if (l.n > kMaxEntriesPerList) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has %d entries, limit %d", l.name, l.n, kMaxEntriesPerList));
    }
  }
  if ((d.flags & ~kDiffKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown diff flag bits 0x%04x", d.flags & ~kDiffKnownFlags));
  }
  return absl::OkStatus();
}

absl::Status CheckFields(const StepDiff& d) {
  SYMTP_RETURN_IF_ERROR(CheckListSizes(d));
  for (size_t i = 0; i < d.new_requests.size(); ++i) {
    SYMTP_RETURN_IF_ERROR(CheckNewRequest(d.new_requests[i], i));
  }
  return CheckContinuing(d);
}

// ---- encoding ----

void WriteIdList(Writer& w, const std::vector<uint64_t>& ids) {
  w.Varint(ids.size());
  uint64_t prev = 0;
  for (uint64_t id : ids) {
    w.Varint(ZigZag(static_cast<int64_t>(id - prev)));
    prev = id;
  }
}

void WriteBlocks(Writer& w, const int32_t* b, size_t n) {
  int64_t prev = 0;
  for (size_t k = 0; k < n; ++k) {
    if (k == 0) {
      w.Varint(static_cast<uint64_t>(b[0]));
    } else {
      w.Varint(ZigZag(static_cast<int64_t>(b[k]) - prev));
    }
    prev = b[k];
  }
}

size_t EncodePayload(const StepDiff& d, uint8_t* p) {
  Writer w{p};
  w.Varint(d.new_requests.size());
  for (const NewRequest& r : d.new_requests) {
    w.Varint(r.id);
    w.Varint(r.num_scheduled);
    w.Varint(r.max_new_tokens);
    w.Varint(r.eos_id.has_value() ? static_cast<uint64_t>(*r.eos_id) + 1 : 0);
    w.Float(r.sampling.temperature);
    w.Varint(static_cast<uint64_t>(r.sampling.top_k));
    w.Float(r.sampling.top_p);
    w.Varint(r.sampling.seed);
    w.Varint(r.prompt.size());
    for (int32_t t : r.prompt) w.Varint(static_cast<uint32_t>(t));
    w.Varint(r.block_ids.size());
    WriteBlocks(w, r.block_ids.data(), r.block_ids.size());
  }
  w.Varint(d.continuing.size());
  uint64_t prev = 0;
  for (const ContinuingRequest& c : d.continuing) {
    w.Varint(ZigZag(static_cast<int64_t>(c.id - prev)));
    prev = c.id;
    const uint32_t low = c.num_new_blocks < 7 ? c.num_new_blocks : 7;
    w.Varint((static_cast<uint64_t>(c.num_scheduled) << 3) | low);
    if (low == 7) w.Varint(c.num_new_blocks - 7);
    WriteBlocks(w, d.continuing_blocks.data() + c.block_offset, c.num_new_blocks);
  }
  WriteIdList(w, d.finished);
  WriteIdList(w, d.aborted);
  WriteIdList(w, d.preempted);
  return static_cast<size_t>(w.p - p);
}

size_t MaxPayloadSize(const StepDiff& d) {
  constexpr size_t V = wire::kMaxVarint64;
  size_t n = 5 * V;  // five list counts
  for (const NewRequest& r : d.new_requests) {
    n += 8 * V + 8 + r.prompt.size() * wire::kMaxVarint32 + r.block_ids.size() * V;
  }
  n += d.continuing.size() * 3 * V + d.continuing_blocks.size() * V;
  n += (d.finished.size() + d.aborted.size() + d.preempted.size()) * V;
  return n;
}

// ---- decoding ----

absl::Status ReadIdList(Reader& r, std::vector<uint64_t>* ids, const char* count_field,
                        const char* id_field) {
  uint64_t n;
  SYMTP_RETURN_IF_ERROR(r.Count(&n, kMaxEntriesPerList, 1, count_field));
  ids->resize(n);
  uint64_t prev = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t z;
    SYMTP_RETURN_IF_ERROR(r.Varint(&z, id_field));
    prev += static_cast<uint64_t>(wire::UnZigZag(z));
    (*ids)[i] = prev;
  }
  return absl::OkStatus();
}

absl::Status ReadBlocks(Reader& r, int32_t* out, uint64_t n, const char* field) {
  int64_t prev = 0;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t v;
    SYMTP_RETURN_IF_ERROR(r.Varint(&v, field));
    int64_t b;
    if (k == 0) {
      if (v > kMaxInt32) return r.OutOfRange(v, kMaxInt32, field);
      b = static_cast<int64_t>(v);
    } else {
      // |delta| of two int32 block ids fits in 33 bits; anything larger is malformed.
      if (v > (uint64_t{1} << 33)) return r.OutOfRange(v, uint64_t{1} << 33, field);
      b = prev + wire::UnZigZag(v);
      if (b < 0 || b > static_cast<int64_t>(kMaxInt32)) {
        return r.Invalid(field, absl::StrFormat("block id %d out of [0, %d]", b, kMaxInt32));
      }
    }
    out[k] = static_cast<int32_t>(b);
    prev = b;
  }
  return absl::OkStatus();
}

absl::Status DecodePayload(Reader& r, StepDiff* d) {
  absl::Status s;
  uint64_t n_new;
  // The smallest new request is 1+1+1+1+4+1+4+1+1+1+1+1 = 18 bytes.
  SYMTP_RETURN_IF_ERROR(r.Count(&n_new, kMaxEntriesPerList, 18, "new_requests.count"));
  d->new_requests.resize(n_new);
  for (uint64_t i = 0; i < n_new; ++i) {
    NewRequest& q = d->new_requests[i];
    uint64_t v;
    if (!(s = r.Varint(&q.id, "new_requests.id")).ok()) return s;
    if (!(s = r.Bounded(&v, kMaxTokensPerRequest, "new_requests.num_scheduled")).ok()) return s;
    q.num_scheduled = static_cast<uint32_t>(v);
    if (!(s = r.Bounded(&v, kMaxTokensPerRequest, "new_requests.max_new_tokens")).ok()) return s;
    q.max_new_tokens = static_cast<uint32_t>(v);
    if (!(s = r.Bounded(&v, kMaxInt32 + 1, "new_requests.eos_id")).ok()) return s;
    if (v == 0) {
      q.eos_id.reset();
    } else {
      q.eos_id = static_cast<int32_t>(v - 1);
    }
    if (!(s = r.Float(&q.sampling.temperature, "new_requests.temperature")).ok()) return s;
    if (!(s = r.Bounded(&v, kMaxInt32, "new_requests.top_k")).ok()) return s;
    q.sampling.top_k = static_cast<int32_t>(v);
    if (!(s = r.Float(&q.sampling.top_p, "new_requests.top_p")).ok()) return s;
    if (!(s = r.Varint(&q.sampling.seed, "new_requests.seed")).ok()) return s;
    uint64_t plen;
    if (!(s = r.Count(&plen, kMaxTokensPerRequest, 1, "new_requests.prompt_len")).ok()) return s;
    q.prompt.resize(plen);
    for (uint64_t k = 0; k < plen; ++k) {
      if (!(s = r.Bounded(&v, kMaxInt32, "new_requests.prompt_token")).ok()) return s;
      q.prompt[k] = static_cast<int32_t>(v);
    }
    uint64_t nb;
    if (!(s = r.Count(&nb, kMaxBlocksPerRequest, 1, "new_requests.num_blocks")).ok()) return s;
    q.block_ids.resize(nb);
    if (!(s = ReadBlocks(r, q.block_ids.data(), nb, "new_requests.block_id")).ok()) return s;
    SYMTP_RETURN_IF_ERROR(CheckNewRequest(q, i));
  }

  uint64_t n_cont;
  SYMTP_RETURN_IF_ERROR(r.Count(&n_cont, kMaxEntriesPerList, 2, "continuing.count"));
  d->continuing.resize(n_cont);
  d->continuing_blocks.clear();
  uint64_t prev = 0;
  for (uint64_t i = 0; i < n_cont; ++i) {
    ContinuingRequest& c = d->continuing[i];
    uint64_t z, tag;
    if (!(s = r.Varint(&z, "continuing.id")).ok()) return s;
    prev += static_cast<uint64_t>(wire::UnZigZag(z));
    c.id = prev;
    if (!(s = r.Bounded(&tag, (kMaxTokensPerRequest << 3) | 7, "continuing.tag")).ok()) return s;
    c.num_scheduled = static_cast<uint32_t>(tag >> 3);
    if (c.num_scheduled == 0) return r.Invalid("continuing.tag", "num_scheduled is 0");
    uint64_t nb = tag & 7;
    if (nb == 7) {
      uint64_t extra;
      if (!(s = r.Count(&extra, kMaxBlocksPerRequest - 7, 1, "continuing.num_new_blocks")).ok()) {
        return s;
      }
      nb += extra;
    }
    if (nb > r.remaining()) {
      return r.Invalid("continuing.num_new_blocks",
                       absl::StrFormat("%d blocks but %d bytes remain", nb, r.remaining()));
    }
    c.block_offset = static_cast<uint32_t>(d->continuing_blocks.size());
    c.num_new_blocks = static_cast<uint32_t>(nb);
    if (nb > 0) {
      if (d->continuing_blocks.size() + nb > kMaxEntriesPerList * 4) {
        return r.Invalid("continuing.num_new_blocks", "too many new blocks in one diff");
      }
      d->continuing_blocks.resize(d->continuing_blocks.size() + nb);
      SYMTP_RETURN_IF_ERROR(
          ReadBlocks(r, d->continuing_blocks.data() + c.block_offset, nb, "continuing.block_id"));
    }
  }
  if (!(s = ReadIdList(r, &d->finished, "finished.count", "finished.id")).ok()) return s;
  if (!(s = ReadIdList(r, &d->aborted, "aborted.count", "aborted.id")).ok()) return s;
  if (!(s = ReadIdList(r, &d->preempted, "preempted.count", "preempted.id")).ok()) return s;
  if (!r.at_end()) {
    return r.Invalid("payload", absl::StrFormat("%d trailing bytes", r.remaining()));
  }
  return absl::OkStatus();
}

absl::Status Annotated(const absl::Status& s, uint64_t step) {
  return absl::Status(s.code(), absl::StrFormat("diff record seq %d: %s", step, s.message()));
}

}  // namespace

void StepDiff::AddContinuing(uint64_t id, uint32_t num_scheduled,
                             absl::Span<const int32_t> new_blocks) {
  ContinuingRequest c;
  c.id = id;
  c.num_scheduled = num_scheduled;
  c.block_offset = static_cast<uint32_t>(continuing_blocks.size());
  c.num_new_blocks = static_cast<uint32_t>(new_blocks.size());
  continuing.push_back(c);
  continuing_blocks.insert(continuing_blocks.end(), new_blocks.begin(), new_blocks.end());
}

void StepDiff::Clear() {
  step = 0;
  flags = 0;
  new_requests.clear();
  continuing.clear();
  continuing_blocks.clear();
  finished.clear();
  aborted.clear();
  preempted.clear();
}

absl::Status ValidateDiff(const StepDiff& d) {
  absl::Status s = CheckFields(d);
  if (!s.ok()) return Annotated(s, d.step);
  absl::flat_hash_set<uint64_t> ids;
  ids.reserve(d.num_scheduled_requests() + d.finished.size() + d.aborted.size() +
              d.preempted.size());
  auto add_id = [&](uint64_t id, const char* list, size_t i) -> absl::Status {
    if (!ids.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("diff step %d: request id %d (%s[%d]) appears more than once in the diff",
                          d.step, id, list, i));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < d.new_requests.size(); ++i) {
    if (!(s = add_id(d.new_requests[i].id, "new_requests", i)).ok()) return s;
  }
  for (size_t i = 0; i < d.continuing.size(); ++i) {
    if (!(s = add_id(d.continuing[i].id, "continuing", i)).ok()) return s;
  }
  for (size_t i = 0; i < d.finished.size(); ++i) {
    if (!(s = add_id(d.finished[i], "finished", i)).ok()) return s;
  }
  for (size_t i = 0; i < d.aborted.size(); ++i) {
    if (!(s = add_id(d.aborted[i], "aborted", i)).ok()) return s;
  }
  for (size_t i = 0; i < d.preempted.size(); ++i) {
    if (!(s = add_id(d.preempted[i], "preempted", i)).ok()) return s;
  }
  absl::flat_hash_set<int32_t> blocks;
  auto add_block = [&](int32_t b, uint64_t id) -> absl::Status {
    if (!blocks.insert(b).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "diff step %d: block %d (request %d) is assigned more than once in the diff", d.step, b,
          id));
    }
    return absl::OkStatus();
  };
  for (const NewRequest& r : d.new_requests) {
    for (int32_t b : r.block_ids) {
      if (!(s = add_block(b, r.id)).ok()) return s;
    }
  }
  for (const ContinuingRequest& c : d.continuing) {
    for (int32_t b : d.NewBlocks(c)) {
      if (!(s = add_block(b, c.id)).ok()) return s;
    }
  }
  return absl::OkStatus();
}

size_t MaxEncodedDiffSize(const StepDiff& d) { return kHeaderSize + MaxPayloadSize(d); }

absl::StatusOr<size_t> EncodeDiffTo(const StepDiff& d, absl::Span<uint8_t> out) {
  absl::Status s = CheckFields(d);
  if (!s.ok()) return Annotated(s, d.step);
  return EncodeRecordTo(
      kDiffMagic, d.flags, d.step, kWhat, MaxPayloadSize(d),
      [&](uint8_t* p) { return EncodePayload(d, p); }, out);
}

absl::Status EncodeDiff(const StepDiff& d, std::vector<uint8_t>* out) {
  absl::Status s = CheckFields(d);
  if (!s.ok()) return Annotated(s, d.step);
  return EncodeRecord(
      kDiffMagic, d.flags, d.step, kWhat, MaxPayloadSize(d),
      [&](uint8_t* p) { return EncodePayload(d, p); }, out);
}

absl::Status DecodeDiffInto(absl::Span<const uint8_t> record, StepDiff* out) {
  SYMTP_ASSIGN_OR_RETURN(const FrameHeader h,
                         DecodeRecord(record, kDiffMagic, kDiffKnownFlags, kWhat,
                                      [&](Reader& r) { return DecodePayload(r, out); }));
  out->step = h.seq;
  out->flags = h.flags;
  return absl::OkStatus();
}

absl::StatusOr<StepDiff> DecodeDiff(absl::Span<const uint8_t> record) {
  StepDiff d;
  SYMTP_RETURN_IF_ERROR(DecodeDiffInto(record, &d));
  return d;
}

}  // namespace symtp::proto
