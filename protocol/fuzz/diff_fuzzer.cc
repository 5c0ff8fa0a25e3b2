// libFuzzer target for the wire decoders. As a fuzzer only with clang (see
// protocol/CMakeLists.txt; tools/test.sh runs it for a bounded time):
//   cmake --preset fuzz && cmake --build --preset fuzz --target diff_fuzzer
//   build-fuzz/protocol/diff_fuzzer -max_len=4096 corpus/
// With any compiler, diff_fuzzer_replay (fuzz/replay_main.cc) runs it over
// files, e.g. the seed corpus tests/protocol/corpus (a CTest test).
//
// Properties checked on every input:
//  - decoding never crashes or reads out of bounds (ASan/UBSan);
//  - a record that decodes re-validates (ValidateDiff may reject only the
//    cross-entry duplicates that the decoder leaves to the worker) and
//    re-encodes to exactly the input bytes (the encoding is canonical);
//  - the same for the result record.
// The first input byte picks the checksum mode: odd inputs get their CRC
// patched to match, so the fuzzer reaches the payload decoder.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "protocol/crc32c.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "protocol/wire.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void PatchChecksum(std::vector<uint8_t>& b) {
  using symtp::proto::kHeaderSize;
  if (b.size() < kHeaderSize) return;
  uint32_t crc = symtp::proto::Crc32c(0, b.data(), 20);
  crc = symtp::proto::Crc32c(crc, b.data() + kHeaderSize, b.size() - kHeaderSize);
  for (int i = 0; i < 4; ++i) b[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
  // Make the payload length consistent too, so the decoder goes past the header.
  const uint32_t len = static_cast<uint32_t>(b.size() - kHeaderSize);
  for (int i = 0; i < 4; ++i) b[16 + i] = static_cast<uint8_t>(len >> (8 * i));
  crc = symtp::proto::Crc32c(0, b.data(), 20);
  crc = symtp::proto::Crc32c(crc, b.data() + kHeaderSize, b.size() - kHeaderSize);
  for (int i = 0; i < 4; ++i) b[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool patch = data[0] & 1;
  const bool as_result = data[0] & 2;
  std::vector<uint8_t> buf(data + 1, data + size);
  if (patch && buf.size() >= symtp::proto::kHeaderSize) {
    const uint32_t magic = as_result ? symtp::proto::kResultMagic : symtp::proto::kDiffMagic;
    for (int i = 0; i < 4; ++i) buf[i] = static_cast<uint8_t>(magic >> (8 * i));
    buf[4] = 1;
    buf[5] = 0;
    PatchChecksum(buf);
  }
  if (!as_result) {
    auto d = symtp::proto::DecodeDiff(buf);
    if (d.ok()) {
      std::vector<uint8_t> again;
      Check(symtp::proto::EncodeDiff(*d, &again).ok());
      Check(again == buf);
      auto d2 = symtp::proto::DecodeDiff(again);
      Check(d2.ok() && *d2 == *d);
      absl::Status v = symtp::proto::ValidateDiff(*d);
      Check(v.ok() || v.code() == absl::StatusCode::kInvalidArgument);
    }
  } else {
    auto r = symtp::proto::DecodeResult(buf);
    if (r.ok()) {
      std::vector<uint8_t> again;
      Check(symtp::proto::EncodeResult(*r, &again).ok());
      Check(again == buf);
    }
  }
  return 0;
}
