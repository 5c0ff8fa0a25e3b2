#include "protocol/wire.h"

#include "common/status_macros.h"
#include "protocol/crc32c.h"

namespace symtp::proto {
namespace {

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
uint16_t LoadLe16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint64_t LoadLe64(const uint8_t* p) {
  return static_cast<uint64_t>(LoadLe32(p)) | static_cast<uint64_t>(LoadLe32(p + 4)) << 32;
}

}  // namespace

absl::StatusOr<FrameHeader> ParseHeader(absl::Span<const uint8_t> buf, uint32_t magic,
                                        uint16_t allowed_flags, const char* what) {
  if (buf.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrFormat(
        "%s record truncated: %d bytes, the header alone is %d", what, buf.size(), kHeaderSize));
  }
  FrameHeader h;
  const uint8_t* p = buf.data();
  h.magic = LoadLe32(p);
  h.version = LoadLe16(p + 4);
  h.flags = LoadLe16(p + 6);
  h.seq = LoadLe64(p + 8);
  h.payload_len = LoadLe32(p + 16);
  h.checksum = LoadLe32(p + 20);
  if (h.magic != magic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s record: bad magic 0x%08x (expected 0x%08x)", what, h.magic, magic));
  }
  if (h.version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s record: unsupported wire version %d (this build speaks %d)", what,
                        h.version, kWireVersion));
  }
  if ((h.flags & ~allowed_flags) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s record seq %d: unknown flag bits 0x%04x",
                                                      what, h.seq, h.flags & ~allowed_flags));
  }
  if (h.payload_len > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s record seq %d: payload length %d exceeds limit %d", what, h.seq,
                        h.payload_len, kMaxPayloadBytes));
  }
  const size_t have = buf.size() - kHeaderSize;
  if (have < h.payload_len) {
    return absl::DataLossError(
        absl::StrFormat("%s record seq %d truncated: payload length %d, only %d bytes present",
                        what, h.seq, h.payload_len, have));
  }
  if (have > h.payload_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s record seq %d: %d bytes after the payload (payload length %d)", what,
                        h.seq, have - h.payload_len, h.payload_len));
  }
  return h;
}

absl::Status VerifyChecksum(absl::Span<const uint8_t> buf, const FrameHeader& h, const char* what) {
  uint32_t crc = Crc32c(0, buf.data(), 20);
  crc = Crc32c(crc, buf.data() + kHeaderSize, h.payload_len);
  if (crc != h.checksum) {
    return absl::DataLossError(absl::StrFormat(
        "%s record seq %d: checksum mismatch (header 0x%08x, computed 0x%08x over %d bytes)", what,
        h.seq, h.checksum, crc, h.payload_len));
  }
  return absl::OkStatus();
}

void WriteHeader(uint8_t* buf, uint32_t magic, uint16_t flags, uint64_t seq, uint32_t payload_len) {
  wire::Writer w{buf};
  w.Fixed32(magic);
  w.Fixed32(static_cast<uint32_t>(kWireVersion) | static_cast<uint32_t>(flags) << 16);
  w.Fixed64(seq);
  w.Fixed32(payload_len);
  uint32_t crc = Crc32c(0, buf, 20);
  crc = Crc32c(crc, buf + kHeaderSize, payload_len);
  w.Fixed32(crc);
}

absl::StatusOr<size_t> EncodeRecordTo(uint32_t magic, uint16_t flags, uint64_t seq,
                                      const char* what, size_t max_payload,
                                      absl::FunctionRef<size_t(uint8_t*)> payload,
                                      absl::Span<uint8_t> out) {
  // Straight into `out` when it holds the bound; else into a scratch buffer,
  // as the exact size may still fit.
  const bool direct = out.size() >= kHeaderSize + max_payload;
  std::vector<uint8_t> tmp(direct ? 0 : kHeaderSize + max_payload);
  uint8_t* buf = direct ? out.data() : tmp.data();
  const size_t n = payload(buf + kHeaderSize);
  if (n > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s step %d: payload %d bytes exceeds limit %d", what, seq, n, kMaxPayloadBytes));
  }
  if (out.size() < kHeaderSize + n) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s step %d needs %d bytes, buffer has %d",
                                                        what, seq, kHeaderSize + n, out.size()));
  }
  WriteHeader(buf, magic, flags, seq, static_cast<uint32_t>(n));
  if (!direct) std::memcpy(out.data(), tmp.data(), kHeaderSize + n);
  return kHeaderSize + n;
}

absl::Status EncodeRecord(uint32_t magic, uint16_t flags, uint64_t seq, const char* what,
                          size_t max_payload, absl::FunctionRef<size_t(uint8_t*)> payload,
                          std::vector<uint8_t>* out) {
  out->resize(kHeaderSize + max_payload);
  SYMTP_ASSIGN_OR_RETURN(const size_t n, EncodeRecordTo(magic, flags, seq, what, max_payload,
                                                        payload, absl::MakeSpan(*out)));
  out->resize(n);
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> DecodeRecord(absl::Span<const uint8_t> record, uint32_t magic,
                                         uint16_t allowed_flags, const char* what,
                                         absl::FunctionRef<absl::Status(wire::Reader&)> payload) {
  SYMTP_ASSIGN_OR_RETURN(const FrameHeader h, ParseHeader(record, magic, allowed_flags, what));
  SYMTP_RETURN_IF_ERROR(VerifyChecksum(record, h, what));
  wire::Reader r(record.data() + kHeaderSize, record.data() + kHeaderSize + h.payload_len);
  const absl::Status s = payload(r);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrFormat("%s record seq %d: %s", what, h.seq, s.message()));
  }
  return h;
}

namespace wire {

absl::Status Reader::VarintSlow(uint64_t* out, const char* field) {
  uint64_t v = 0;
  const uint8_t* q = p_;
  for (int i = 0; i < static_cast<int>(kMaxVarint64); ++i) {
    if (q >= end_) return Truncated(field);
    const uint8_t b = *q++;
    if (i == 9 && b > 1) return Invalid(field, "varint overflows 64 bits");
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if (b < 0x80) {
      if (b == 0 && i > 0) return Invalid(field, "non-canonical (overlong) varint");
      *out = v;
      p_ = q;
      return absl::OkStatus();
    }
  }
  return Invalid(field, "varint longer than 10 bytes");
}

}  // namespace wire
}  // namespace symtp::proto
