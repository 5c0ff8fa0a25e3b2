// Randomized corruption of encoded records: every truncation and thousands of
// random flips / inserts / deletes must decode to an error, or (when the
// corruption keeps the checksum valid, which we force in half the cases to
// reach the payload decoder) to a record that re-encodes to exactly the
// corrupted bytes and passes the per-field checks again. Never a crash or an
// out-of-bounds read (this test also runs under ASan+UBSan).
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "protocol/crc32c.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "protocol/wire.h"
#include "tests/protocol/random_diff.h"
#include "tests/testing/status_matchers.h"

namespace symtp::proto {
namespace {

void PatchLengthAndChecksum(std::vector<uint8_t>& b) {
  if (b.size() < kHeaderSize) return;
  const uint32_t len = static_cast<uint32_t>(b.size() - kHeaderSize);
  for (int i = 0; i < 4; ++i) b[16 + i] = static_cast<uint8_t>(len >> (8 * i));
  uint32_t crc = Crc32c(0, b.data(), 20);
  crc = Crc32c(crc, b.data() + kHeaderSize, len);
  for (int i = 0; i < 4; ++i) b[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

void Mutate(std::vector<uint8_t>& b, std::mt19937_64& rng) {
  auto U = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  const int edits = static_cast<int>(U(1, 3));
  for (int e = 0; e < edits; ++e) {
    switch (U(0, 5)) {
      case 0:
      case 1:
      case 2:  // flip bits in one byte
        if (!b.empty()) b[U(0, b.size() - 1)] ^= static_cast<uint8_t>(U(1, 255));
        break;
      case 3:  // insert a byte
        b.insert(b.begin() + static_cast<long>(U(0, b.size())), static_cast<uint8_t>(U(0, 255)));
        break;
      case 4:  // delete a byte
        if (!b.empty()) b.erase(b.begin() + static_cast<long>(U(0, b.size() - 1)));
        break;
      case 5:  // set a byte to a varint-ish extreme
        if (!b.empty()) b[U(0, b.size() - 1)] = U(0, 1) ? 0xff : 0x80;
        break;
    }
  }
}

// Checks the "error or re-validates" property for one corrupted diff record.
// Returns true when it decoded.
bool CheckDiffRecord(const std::vector<uint8_t>& b) {
  StepDiff d;
  absl::Status s = DecodeDiffInto(b, &d);
  if (!s.ok()) {
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kDataLoss)
        << s;
    EXPECT_FALSE(s.message().empty());
    return false;
  }
  std::vector<uint8_t> again;
  EXPECT_OK(EncodeDiff(d, &again));
  EXPECT_EQ(again, b) << "decoded record does not re-encode to the same bytes";
  absl::Status v = ValidateDiff(d);
  // The decoder checks every field; only cross-entry duplicates (which the
  // worker rejects on apply) may remain.
  EXPECT_TRUE(v.ok() || absl::StrContains(v.message(), "more than once")) << v;
  return true;
}

bool CheckResultRecord(const std::vector<uint8_t>& b) {
  StepResult r;
  absl::Status s = DecodeResultInto(b, &r);
  if (!s.ok()) {
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kDataLoss)
        << s;
    return false;
  }
  std::vector<uint8_t> again;
  EXPECT_OK(EncodeResult(r, &again));
  EXPECT_EQ(again, b);
  return true;
}

TEST(Corruption, EveryTruncationOfADiffIsAnError) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> buf;
  for (int i = 0; i < 40; ++i) {
    StepDiff d = testing::RandomDiff(rng);
    ASSERT_OK(EncodeDiff(d, &buf));
    for (size_t len = 0; len < buf.size(); ++len) {
      std::vector<uint8_t> t(buf.begin(), buf.begin() + static_cast<long>(len));
      absl::StatusOr<StepDiff> got = DecodeDiff(t);
      ASSERT_FALSE(got.ok()) << "truncated to " << len << " of " << buf.size();
      ASSERT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      // With the length and checksum patched, the payload decoder sees the
      // truncation itself.
      PatchLengthAndChecksum(t);
      CheckDiffRecord(t);
    }
  }
}

TEST(Corruption, RandomEditsOfDiffs) {
  std::mt19937_64 rng(12);
  std::vector<uint8_t> buf;
  int decoded_unpatched = 0, decoded_patched = 0, total = 0;
  for (int i = 0; i < 300; ++i) {
    StepDiff d = testing::RandomDiff(rng);
    ASSERT_OK(EncodeDiff(d, &buf));
    for (int k = 0; k < 20; ++k) {
      std::vector<uint8_t> b = buf;
      Mutate(b, rng);
      if (b == buf) continue;
      ++total;
      decoded_unpatched += CheckDiffRecord(b);
      PatchLengthAndChecksum(b);
      decoded_patched += CheckDiffRecord(b);
    }
  }
  // CRC-32C detects every 1-3 byte edit of records this size; the length
  // field catches inserts and deletes.
  EXPECT_EQ(decoded_unpatched, 0);
  RecordProperty("edits", total);
  RecordProperty("decoded_with_patched_checksum", decoded_patched);
}

TEST(Corruption, RandomBytesAsDiffsAndResults) {
  std::mt19937_64 rng(13);
  for (int i = 0; i < 5000; ++i) {
    std::vector<uint8_t> b(std::uniform_int_distribution<size_t>(0, 200)(rng));
    for (auto& x : b) x = static_cast<uint8_t>(rng() % (rng() % 2 ? 256 : 4));
    if (b.size() >= kHeaderSize) {
      const uint32_t magic = i % 2 ? kDiffMagic : kResultMagic;
      for (int k = 0; k < 4; ++k) b[k] = static_cast<uint8_t>(magic >> (8 * k));
      b[4] = 1;
      b[5] = 0;
      b[6] = 0;
      b[7] = 0;
      PatchLengthAndChecksum(b);
    }
    CheckDiffRecord(b);
    CheckResultRecord(b);
  }
}

TEST(Corruption, TruncationsAndEditsOfResults) {
  std::mt19937_64 rng(14);
  std::vector<uint8_t> buf;
  for (int i = 0; i < 100; ++i) {
    StepResult r = testing::RandomResult(rng);
    ASSERT_OK(EncodeResult(r, &buf));
    for (size_t len = 0; len < buf.size(); len += 1 + len / 64) {
      std::vector<uint8_t> t(buf.begin(), buf.begin() + static_cast<long>(len));
      ASSERT_FALSE(DecodeResult(t).ok());
      PatchLengthAndChecksum(t);
      CheckResultRecord(t);
    }
    for (int k = 0; k < 30; ++k) {
      std::vector<uint8_t> b = buf;
      Mutate(b, rng);
      if (b == buf) continue;
      EXPECT_FALSE(CheckResultRecord(b));
      PatchLengthAndChecksum(b);
      CheckResultRecord(b);
    }
  }
}

}  // namespace
}  // namespace symtp::proto
