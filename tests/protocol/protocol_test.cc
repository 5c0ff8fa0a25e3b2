#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "protocol/crc32c.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "protocol/wire.h"
#include "tests/protocol/random_diff.h"
#include "tests/testing/status_matchers.h"

namespace symtp::proto {
namespace {

using ::symtp::testing::IsOk;
using ::symtp::testing::StatusIs;
using ::testing::HasSubstr;

// ---------------------------------------------------------------- CRC-32C

TEST(Crc32c, StandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32c(0, s, 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, s, 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32c, HardwareMatchesPortableAtEveryAlignmentAndSplit) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> buf(1000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 500, 991}) {
      ASSERT_EQ(Crc32c(0, buf.data() + off, len), Crc32cPortable(0, buf.data() + off, len))
          << off << " " << len;
      const size_t half = len / 3;
      EXPECT_EQ(Crc32c(Crc32c(0, buf.data() + off, half), buf.data() + off + half, len - half),
                Crc32c(0, buf.data() + off, len));
    }
  }
  SUCCEED() << "hardware crc32c: " << Crc32cIsHardware();
}

// ---------------------------------------------------------------- varints

TEST(Varint, RoundTripAndCanonical) {
  std::vector<uint64_t> values = {
      0,          1,    127, 128, 16383, 16384, (1ull << 32) - 1, 1ull << 32, (1ull << 63) - 1,
      1ull << 63, ~0ull};
  for (uint64_t v : values) {
    uint8_t buf[16];
    wire::Writer w{buf};
    w.Varint(v);
    wire::Reader r(buf, w.p);
    uint64_t got = 0;
    ASSERT_OK(r.Varint(&got, "v"));
    EXPECT_EQ(got, v);
    EXPECT_TRUE(r.at_end());
    // Every strict prefix is a truncation.
    for (uint8_t* end = buf; end < w.p; ++end) {
      wire::Reader t(buf, end);
      EXPECT_THAT(t.Varint(&got, "v"),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field v")));
    }
  }
  const uint8_t overlong[] = {0x81, 0x00};
  uint64_t got;
  wire::Reader r1(overlong, overlong + 2);
  EXPECT_THAT(r1.Varint(&got, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-canonical")));
  const uint8_t too_long[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
  wire::Reader r2(too_long, too_long + 10);
  EXPECT_THAT(r2.Varint(&got, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  const uint8_t eleven[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
  wire::Reader r3(eleven, eleven + 11);
  EXPECT_FALSE(r3.Varint(&got, "x").ok());
}

TEST(Varint, ZigZag) {
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{1} << 40, -(int64_t{1} << 40),
                    INT64_MAX, INT64_MIN}) {
    EXPECT_EQ(wire::UnZigZag(wire::ZigZag(v)), v);
  }
  EXPECT_EQ(wire::ZigZag(-1), 1u);
  EXPECT_EQ(wire::ZigZag(1), 2u);
}

// ---------------------------------------------------------------- diff

StepDiff SampleDiff() {
  StepDiff d;
  d.step = 42;
  NewRequest r;
  r.id = 7;
  r.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 100000};
  r.sampling = {0.7f, 40, 0.9f, 12345};
  r.max_new_tokens = 64;
  r.eos_id = 2;
  r.num_scheduled = 18;
  r.block_ids = {30, 31};
  d.new_requests.push_back(r);
  d.AddContinuing(3, 1);
  d.AddContinuing(4, 1, std::vector<int32_t>{99});
  d.AddContinuing(5, 300, std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  d.AddContinuing(1, 1);
  d.finished = {9, 8};
  d.aborted = {20};
  d.preempted = {21};
  return d;
}

TEST(Diff, RoundTripExample) {
  StepDiff d = SampleDiff();
  ASSERT_OK(ValidateDiff(d));
  std::vector<uint8_t> buf;
  ASSERT_OK(EncodeDiff(d, &buf));
  EXPECT_LE(buf.size(), MaxEncodedDiffSize(d));
  ASSERT_OK_AND_ASSIGN(StepDiff back, DecodeDiff(buf));
  EXPECT_EQ(back, d);
  EXPECT_EQ(back.NewBlocks(back.continuing[2]).size(), 10u);
  EXPECT_EQ(back.NewBlocks(back.continuing[1])[0], 99);
}

TEST(Diff, RandomRoundTripsExactly) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf, buf2;
  StepDiff reused;
  for (int i = 0; i < 2000; ++i) {
    StepDiff d = testing::RandomDiff(rng);
    ASSERT_OK(ValidateDiff(d)) << i;
    ASSERT_OK(EncodeDiff(d, &buf));
    ASSERT_OK_AND_ASSIGN(StepDiff back, DecodeDiff(buf));
    ASSERT_EQ(back, d) << i;
    ASSERT_OK(DecodeDiffInto(buf, &reused));  // reuse across differently shaped diffs
    ASSERT_EQ(reused, d) << i;
    ASSERT_OK(EncodeDiff(back, &buf2));
    ASSERT_EQ(buf, buf2);
  }
}

TEST(Diff, EncodeIntoCallerSpan) {
  StepDiff d = SampleDiff();
  std::vector<uint8_t> ref;
  ASSERT_OK(EncodeDiff(d, &ref));
  std::vector<uint8_t> big(MaxEncodedDiffSize(d) + 10);
  ASSERT_OK_AND_ASSIGN(size_t n, EncodeDiffTo(d, absl::MakeSpan(big)));
  EXPECT_EQ(n, ref.size());
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), big.begin()));
  // Exactly the record size (smaller than the worst-case bound) also works.
  std::vector<uint8_t> exact(ref.size());
  ASSERT_OK_AND_ASSIGN(n, EncodeDiffTo(d, absl::MakeSpan(exact)));
  EXPECT_EQ(exact, ref);
  std::vector<uint8_t> small(ref.size() - 1);
  EXPECT_THAT(EncodeDiffTo(d, absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs")));
}

TEST(Diff, SteadyDecodeOf256IsCompact) {
  StepDiff d;
  d.step = 1000;
  for (uint64_t i = 0; i < 256; ++i) {
    if (i % 16 == 3) {
      const int32_t b = static_cast<int32_t>(5000 + i);
      d.AddContinuing(1000 + i, 1, absl::MakeConstSpan(&b, 1));
    } else {
      d.AddContinuing(1000 + i, 1);
    }
  }
  std::vector<uint8_t> buf;
  ASSERT_OK(EncodeDiff(d, &buf));
  // 2 bytes per request plus ~2 per new block plus the 24-byte header.
  EXPECT_LT(buf.size(), 600u) << buf.size();
  RecordProperty("bytes_256_decode", static_cast<int>(buf.size()));
}

TEST(Diff, EncoderRejectsInvalidFields) {
  std::vector<uint8_t> buf;
  {
    StepDiff d = SampleDiff();
    d.new_requests[0].prompt[3] = -1;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt[3]")));
  }
  {
    StepDiff d = SampleDiff();
    d.new_requests[0].num_scheduled = 19;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_scheduled 19")));
  }
  {
    StepDiff d = SampleDiff();
    d.new_requests[0].sampling.temperature = NAN;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")));
  }
  {
    StepDiff d = SampleDiff();
    d.new_requests[0].block_ids = {30};  // 18 tokens need 2 blocks
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need 2")));
  }
  {
    StepDiff d = SampleDiff();
    d.continuing[1].block_offset = 5;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_offset")));
  }
  {
    StepDiff d = SampleDiff();
    d.continuing[0].num_scheduled = 0;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("continuing[0]")));
  }
  {
    StepDiff d = SampleDiff();
    d.flags = 0x8000;
    EXPECT_THAT(EncodeDiff(d, &buf),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("flag")));
  }
}

TEST(Diff, ValidateRejectsDuplicates) {
  {
    StepDiff d = SampleDiff();
    d.finished.push_back(3);  // 3 is also continuing
    EXPECT_THAT(ValidateDiff(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("request id 3 (finished[2])")));
  }
  {
    StepDiff d = SampleDiff();
    d.AddContinuing(77, 1, std::vector<int32_t>{30});  // block 30 belongs to request 7
    EXPECT_THAT(ValidateDiff(d),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 30 (request 77)")));
  }
}

void SetPayloadLen(std::vector<uint8_t>& b, uint32_t len) {
  for (int i = 0; i < 4; ++i) b[16 + i] = static_cast<uint8_t>(len >> (8 * i));
}

TEST(Diff, HeaderErrorsNameTheProblem) {
  std::vector<uint8_t> good;
  ASSERT_OK(EncodeDiff(SampleDiff(), &good));
  {
    auto b = good;
    b[0] ^= 1;
    EXPECT_THAT(DecodeDiff(b), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  }
  {
    auto b = good;
    b[4] = 2;
    EXPECT_THAT(DecodeDiff(b), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("unsupported wire version 2")));
  }
  {
    auto b = good;
    b[7] = 0x80;
    EXPECT_THAT(DecodeDiff(b),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag bits")));
  }
  {
    auto b = good;
    b[30] ^= 0x10;
    EXPECT_THAT(DecodeDiff(b), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  }
  {
    auto b = good;
    b.resize(10);
    EXPECT_THAT(DecodeDiff(b), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header")));
  }
  {
    auto b = good;
    b.pop_back();
    EXPECT_THAT(DecodeDiff(b), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  }
  {
    auto b = good;
    b.push_back(0);
    EXPECT_THAT(DecodeDiff(b),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after the payload")));
  }
  {
    auto b = good;
    SetPayloadLen(b, 0xffffffffu);
    EXPECT_THAT(DecodeDiff(b),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds limit")));
  }
}

TEST(Diff, PayloadErrorsNameTheField) {
  // A tiny diff: one continuing request, hand-encoded payload variants.
  auto record = [](std::vector<uint8_t> payload) {
    std::vector<uint8_t> b(kHeaderSize + payload.size());
    std::copy(payload.begin(), payload.end(), b.begin() + kHeaderSize);
    WriteHeader(b.data(), kDiffMagic, 0, 5, static_cast<uint32_t>(payload.size()));
    return b;
  };
  // new=0, cont=1 {id zigzag(9)=18, tag=(1<<3)|0}, finished=0, aborted=0, preempted=0
  ASSERT_OK_AND_ASSIGN(StepDiff d, DecodeDiff(record({0, 1, 18, 8, 0, 0, 0})));
  ASSERT_EQ(d.continuing.size(), 1u);
  EXPECT_EQ(d.continuing[0].id, 9u);
  EXPECT_EQ(d.step, 5u);
  EXPECT_THAT(DecodeDiff(record({0, 1, 18, 8, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("preempted.count")));
  EXPECT_THAT(DecodeDiff(record({0, 1, 18, 8, 0, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trailing")));
  EXPECT_THAT(DecodeDiff(record({0, 1, 18, 0, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_scheduled is 0")));
  EXPECT_THAT(DecodeDiff(record({0, 100, 18, 8, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("continuing.count")));
  // tag says 7+ blocks, extra count 200 with no bytes left.
  EXPECT_THAT(DecodeDiff(record({0, 1, 18, 15, 0x80 | 72, 1, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_new_blocks")));
  // One new block with id 2^31 (out of int32 range).
  EXPECT_THAT(DecodeDiff(record({0, 1, 18, 9, 0x80, 0x80, 0x80, 0x80, 0x08, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("continuing.block_id")));
  // A new-request count that cannot fit in the bytes that remain.
  EXPECT_THAT(DecodeDiff(record({5, 0, 0, 0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("new_requests.count")));
}

// ---------------------------------------------------------------- result

TEST(Result, RoundTrip) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> buf;
  StepResult reused;
  for (int i = 0; i < 500; ++i) {
    StepResult r = testing::RandomResult(rng);
    ASSERT_OK(EncodeResult(r, &buf));
    ASSERT_OK_AND_ASSIGN(StepResult back, DecodeResult(buf));
    ASSERT_EQ(back, r);
    ASSERT_OK(DecodeResultInto(buf, &reused));
    ASSERT_EQ(reused, r);
    std::vector<uint8_t> span_buf(buf.size());
    ASSERT_OK_AND_ASSIGN(size_t n, EncodeResultTo(r, absl::MakeSpan(span_buf)));
    ASSERT_EQ(n, buf.size());
    ASSERT_EQ(span_buf, buf);
  }
}

TEST(Result, LargestFieldsFitTheBound) {
  StepResult r;
  r.step = ~uint64_t{0} >> 1;
  r.rank = 7;
  r.digest = ~uint64_t{0};
  uint64_t* f = &r.timings.recv_wait_ns;
  for (size_t i = 0; i < sizeof(PhaseTimings) / sizeof(uint64_t); ++i) f[i] = ~uint64_t{0};
  for (int i = 0; i < 5; ++i) r.sampled.push_back({~uint64_t{0} - 10 + i, 128255});
  std::vector<uint8_t> buf;
  ASSERT_OK(EncodeResult(r, &buf));
  EXPECT_LE(buf.size(), MaxEncodedResultSize(r));
  ASSERT_OK_AND_ASSIGN(StepResult back, DecodeResult(buf));
  EXPECT_EQ(back, r);
}

TEST(Result, Errors) {
  StepResult r;
  r.step = 9;
  r.rank = 1;
  r.sampled = {{1, 5}, {2, -3}};
  std::vector<uint8_t> buf;
  EXPECT_THAT(EncodeResult(r, &buf),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sampled[1] (request 2)")));
  r.sampled[1].token = 3;
  ASSERT_OK(EncodeResult(r, &buf));
  auto b = buf;
  b[0] = 'X';
  EXPECT_THAT(DecodeResult(b), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  // A diff is not a result.
  std::vector<uint8_t> diff;
  ASSERT_OK(EncodeDiff(SampleDiff(), &diff));
  EXPECT_THAT(DecodeResult(diff),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("result record: bad magic")));
  b = buf;
  b.resize(b.size() - 1);
  EXPECT_THAT(DecodeResult(b), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

}  // namespace
}  // namespace symtp::proto
