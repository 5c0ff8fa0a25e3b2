// Low-level pieces of the symtp wire format shared by the diff and result
// codecs: the 24-byte frame header, LEB128 varints and a bounds-checked reader.
// See protocol/README.md for the format.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace symtp::proto {

// ---------------------------------------------------------------------------
// Frame header (little-endian, 24 bytes):
//   0  u32 magic      kDiffMagic or kResultMagic
//   4  u16 version    kWireVersion
//   6  u16 flags      per record type; unknown bits are rejected
//   8  u64 seq        the step number
//  16  u32 payload_len
//  20  u32 checksum   CRC-32C over bytes [0, 20) then the payload
// ---------------------------------------------------------------------------
inline constexpr size_t kHeaderSize = 24;
inline constexpr uint16_t kWireVersion = 1;
inline constexpr uint32_t kDiffMagic = 0x44545953u;    // bytes "SYTD"
inline constexpr uint32_t kResultMagic = 0x52545953u;  // bytes "SYTR"
// Sanity limit on one record's payload; a length above it is rejected before
// anything else is read.
inline constexpr uint32_t kMaxPayloadBytes = 64u << 20;

struct FrameHeader {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t flags = 0;
  uint64_t seq = 0;
  uint32_t payload_len = 0;
  uint32_t checksum = 0;
};

// Parses and checks the header only (magic, version, flags against
// `allowed_flags`, payload length against the buffer); does not verify the
// checksum. `what` names the record type in errors ("diff", "result").
absl::StatusOr<FrameHeader> ParseHeader(absl::Span<const uint8_t> buf, uint32_t magic,
                                        uint16_t allowed_flags, const char* what);

// Checks the checksum of a record whose header parsed as `h`.
absl::Status VerifyChecksum(absl::Span<const uint8_t> buf, const FrameHeader& h, const char* what);

// Writes the header for a payload already placed at buf[kHeaderSize ...].
void WriteHeader(uint8_t* buf, uint32_t magic, uint16_t flags, uint64_t seq, uint32_t payload_len);

namespace wire {

inline uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t UnZigZag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

inline constexpr size_t kMaxVarint64 = 10;
inline constexpr size_t kMaxVarint32 = 5;

// Unchecked writer: the caller reserves the worst case first (MaxEncodedSize).
struct Writer {
  uint8_t* p;
  inline void Varint(uint64_t v) {
    while (v >= 0x80) {
      *p++ = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<uint8_t>(v);
  }
  inline void Fixed32(uint32_t v) {
    for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(v >> (8 * i));
  }
  inline void Fixed64(uint64_t v) {
    for (int i = 0; i < 8; ++i) *p++ = static_cast<uint8_t>(v >> (8 * i));
  }
  inline void Float(float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    Fixed32(v);
  }
};

// Bounds-checked reader. Every failure names the field and the byte offset in
// the payload. Varints must be canonical (no redundant trailing 0x80 groups),
// so every record has exactly one encoding.
class Reader {
 public:
  Reader(const uint8_t* begin, const uint8_t* end) : begin_(begin), p_(begin), end_(end) {}

  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  bool at_end() const { return p_ == end_; }

  inline absl::Status Varint(uint64_t* out, const char* field) {
    // Fast path: one byte.
    if (p_ < end_ && *p_ < 0x80) {
      *out = *p_++;
      return absl::OkStatus();
    }
    return VarintSlow(out, field);
  }

  // Reads a varint that must be <= max.
  inline absl::Status Bounded(uint64_t* out, uint64_t max, const char* field) {
    absl::Status s = Varint(out, field);
    if (!s.ok()) return s;
    if (*out > max) return OutOfRange(*out, max, field);
    return absl::OkStatus();
  }

  // Reads an element count that must be <= max and leave at least
  // `min_bytes_each` bytes per element in the payload.
  inline absl::Status Count(uint64_t* out, uint64_t max, size_t min_bytes_each, const char* field) {
    absl::Status s = Bounded(out, max, field);
    if (!s.ok()) return s;
    if (min_bytes_each > 0 && *out > remaining() / min_bytes_each) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "field %s at payload offset %d: count %d needs at least %d bytes, %d remain", field,
          offset(), *out, *out * min_bytes_each, remaining()));
    }
    return absl::OkStatus();
  }

  absl::Status Fixed32(uint32_t* out, const char* field) {
    if (remaining() < 4) return Truncated(field);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[i]) << (8 * i);
    p_ += 4;
    *out = v;
    return absl::OkStatus();
  }
  absl::Status Fixed64(uint64_t* out, const char* field) {
    if (remaining() < 8) return Truncated(field);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += 8;
    *out = v;
    return absl::OkStatus();
  }
  absl::Status Float(float* out, const char* field) {
    uint32_t v = 0;
    absl::Status s = Fixed32(&v, field);
    if (!s.ok()) return s;
    std::memcpy(out, &v, 4);
    return absl::OkStatus();
  }

  absl::Status Truncated(const char* field) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "field %s at payload offset %d: payload ends (truncated field)", field, offset()));
  }
  absl::Status OutOfRange(uint64_t v, uint64_t max, const char* field) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "field %s at payload offset %d: value %d exceeds limit %d", field, offset(), v, max));
  }
  absl::Status Invalid(const char* field, const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("field %s at payload offset %d: %s", field, offset(), why));
  }

 private:
  absl::Status VarintSlow(uint64_t* out, const char* field);

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace wire

// The record around a payload, shared by the diff and result codecs. `what`
// names the record type in errors; `payload` writes the payload at its
// argument, with room for `max_payload` bytes, and returns its length.
// EncodeRecordTo returns the record size: InvalidArgument when the payload
// exceeds kMaxPayloadBytes, ResourceExhausted when `out` cannot hold it.
absl::StatusOr<size_t> EncodeRecordTo(uint32_t magic, uint16_t flags, uint64_t seq,
                                      const char* what, size_t max_payload,
                                      absl::FunctionRef<size_t(uint8_t*)> payload,
                                      absl::Span<uint8_t> out);
// Same, into `out` resized to the record.
absl::Status EncodeRecord(uint32_t magic, uint16_t flags, uint64_t seq, const char* what,
                          size_t max_payload, absl::FunctionRef<size_t(uint8_t*)> payload,
                          std::vector<uint8_t>* out);
// ParseHeader and VerifyChecksum, then `payload` on a reader of the payload;
// its errors get "<what> record seq <seq>: " in front. Returns the header.
absl::StatusOr<FrameHeader> DecodeRecord(absl::Span<const uint8_t> record, uint32_t magic,
                                         uint16_t allowed_flags, const char* what,
                                         absl::FunctionRef<absl::Status(wire::Reader&)> payload);

}  // namespace symtp::proto
