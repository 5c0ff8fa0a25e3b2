// Diff protocol benchmarks.
//
//  BM_DiffStep/N        steady decode with N live requests (1 in 16 gets a new
//                       KV block each step): EncodeDiff + DecodeDiffInto +
//                       WorkerState::ApplyDiff, timed per step (manual time =
//                       those three only). Counters: bytes per step and the
//                       per-phase means, plus BuildInput and ApplySampled,
//                       which run every step but are not in the main time,
//                       and the size of the step's result record.
//  BM_V0Broadcast/B     the v0 design's full padded per-step broadcast for
//                       batch B at max_seq_len 4096 (token ids + positions
//                       [B, 4096], block tables [B, 4096/16], seq lens [B],
//                       slot mapping [B*4096], int32), built from a batch
//                       state; time = building those tensors on the CPU.
//                       Counters: v0_bytes, v1_bytes (the encoded steady
//                       decode diff of the same batch) and their ratio.
//
// Run: protocol_bench --benchmark_format=json (counters land in the JSON).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "common/clock.h"
#include "models/batch.h"
#include "protocol/diff.h"
#include "protocol/result.h"
#include "worker/state/worker_state.h"

namespace symtp {
namespace {

constexpr int32_t kBlock = 16;
constexpr int kStepsPerCycle = 512;

// N requests in steady decode on one WorkerState; produces each step's diff.
class DecodeFixture {
 public:
  explicit DecodeFixture(int n) : n_(n) { Reset(); }

  void Reset() {
    worker::WorkerStateConfig wc;
    wc.max_seq_len = 4096;
    wc.num_kv_blocks = n_ * (4096 / kBlock);
    state_ = std::make_unique<worker::WorkerState>(*worker::WorkerState::Create(wc));
    next_block_ = 0;
    seq_len_.assign(n_, 0);
    proto::StepDiff d;
    d.step = 0;
    for (int i = 0; i < n_; ++i) {
      proto::NewRequest r;
      r.id = 100000 + static_cast<uint64_t>(i);
      // Lengths staggered mod 16: exactly 1 in 16 requests crosses a block
      // boundary each step.
      const int len = 64 + i % kBlock;
      r.prompt.resize(len);
      for (int k = 0; k < len; ++k) r.prompt[k] = (i * 31 + k) % 32000;
      r.num_scheduled = static_cast<uint32_t>(len);
      r.max_new_tokens = 4096 - len;
      r.eos_id = 2;
      r.sampling.seed = r.id;
      for (int b = 0; b < (len + kBlock - 1) / kBlock; ++b) r.block_ids.push_back(next_block_++);
      d.new_requests.push_back(std::move(r));
      seq_len_[i] = len;
    }
    Check(state_->ApplyDiff(d));
    Check(state_->BuildInput(&batch_));
    Sample();
    step_ = 1;
    steps_in_cycle_ = 0;
  }

  // The next steady decode diff: every request decodes its last token.
  void NextDiff(proto::StepDiff* d) {
    d->Clear();
    d->step = step_++;
    for (int i = 0; i < n_; ++i) {
      const int pos = seq_len_[i];  // position of the token being computed
      if (pos % kBlock == 0) {
        const int32_t b = next_block_++;
        d->AddContinuing(100000 + static_cast<uint64_t>(i), 1, absl::MakeConstSpan(&b, 1));
      } else {
        d->AddContinuing(100000 + static_cast<uint64_t>(i), 1);
      }
      ++seq_len_[i];
    }
    ++steps_in_cycle_;
  }

  void Sample() {
    sampled_.resize(state_->sample_request_ids().size());
    for (size_t i = 0; i < sampled_.size(); ++i) {
      sampled_[i] = static_cast<int32_t>((state_->sample_positions()[i] * 7 + i) % 32000);
    }
    Check(state_->ApplySampled(sampled_));
  }

  static void Check(const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "benchmark setup failed: %s\n", std::string(s.message()).c_str());
      std::abort();
    }
  }

  bool CycleDone() const { return steps_in_cycle_ >= kStepsPerCycle; }
  worker::WorkerState& state() { return *state_; }
  model::BatchInput& batch() { return batch_; }

 private:
  int n_;
  std::unique_ptr<worker::WorkerState> state_;
  std::vector<int> seq_len_;
  int32_t next_block_ = 0;
  uint64_t step_ = 0;
  int steps_in_cycle_ = 0;
  model::BatchInput batch_;
  std::vector<int32_t> sampled_;
};

void BM_DiffStep(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  DecodeFixture fx(n);
  proto::StepDiff diff, decoded;
  std::vector<uint8_t> wire;
  double enc = 0, dec = 0, apply = 0, build = 0, sample = 0, bytes = 0;
  int64_t steps = 0;
  for (auto _ : st) {
    if (fx.CycleDone()) fx.Reset();
    fx.NextDiff(&diff);
    const int64_t t0 = MonotonicNs();
    DecodeFixture::Check(proto::EncodeDiff(diff, &wire));
    const int64_t t1 = MonotonicNs();
    DecodeFixture::Check(proto::DecodeDiffInto(wire, &decoded));
    const int64_t t2 = MonotonicNs();
    DecodeFixture::Check(fx.state().ApplyDiff(decoded));
    const int64_t t3 = MonotonicNs();
    DecodeFixture::Check(fx.state().BuildInput(&fx.batch()));
    const int64_t t4 = MonotonicNs();
    fx.Sample();
    const int64_t t5 = MonotonicNs();
    st.SetIterationTime(static_cast<double>(t3 - t0) * 1e-9);
    enc += static_cast<double>(t1 - t0);
    dec += static_cast<double>(t2 - t1);
    apply += static_cast<double>(t3 - t2);
    build += static_cast<double>(t4 - t3);
    sample += static_cast<double>(t5 - t4);
    bytes += static_cast<double>(wire.size());
    ++steps;
  }
  const double k = steps > 0 ? 1.0 / static_cast<double>(steps) : 0;
  // Size of the matching worker -> scheduler result record (not timed).
  proto::StepResult result;
  result.step = 1;
  result.digest = fx.state().Digest();
  result.sampled.assign(fx.state().last_sampled().begin(), fx.state().last_sampled().end());
  result.timings = {1000, 3000, 3000, 30000000, 20000, 31000000};
  std::vector<uint8_t> rwire;
  DecodeFixture::Check(proto::EncodeResult(result, &rwire));
  st.counters["requests"] = n;
  st.counters["bytes_per_step"] = bytes * k;
  st.counters["result_bytes"] = static_cast<double>(rwire.size());
  st.counters["encode_ns"] = enc * k;
  st.counters["decode_ns"] = dec * k;
  st.counters["apply_ns"] = apply * k;
  st.counters["enc_dec_apply_ns"] = (enc + dec + apply) * k;
  st.counters["build_input_ns"] = build * k;
  st.counters["apply_sampled_ns"] = sample * k;
  st.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DiffStep)->Arg(1)->Arg(64)->Arg(256)->Arg(1024)->UseManualTime();

// v0: rank 0 rebuilds the full padded batch tensors every step.
struct V0Batch {
  std::vector<int32_t> token_ids, position_ids, block_tables, seq_lens, slot_mapping;
  size_t bytes() const {
    return 4 * (token_ids.size() + position_ids.size() + block_tables.size() + seq_lens.size() +
                slot_mapping.size());
  }
};

void BM_V0Broadcast(benchmark::State& st) {
  const int batch = static_cast<int>(st.range(0));
  constexpr int kMaxSeqLen = 4096;
  constexpr int kMaxBlocks = kMaxSeqLen / kBlock;
  // The same steady decode state as BM_DiffStep (requests ~64-600 tokens long).
  DecodeFixture fx(batch);
  proto::StepDiff diff;
  for (int i = 0; i < 200; ++i) {
    fx.NextDiff(&diff);
    DecodeFixture::Check(fx.state().ApplyDiff(diff));
    DecodeFixture::Check(fx.state().BuildInput(&fx.batch()));
    fx.Sample();
  }
  fx.NextDiff(&diff);
  std::vector<uint8_t> wire;
  DecodeFixture::Check(proto::EncodeDiff(diff, &wire));
  worker::WorkerState& ws = fx.state();

  V0Batch v0;
  v0.token_ids.resize(static_cast<size_t>(batch) * kMaxSeqLen);
  v0.position_ids.resize(static_cast<size_t>(batch) * kMaxSeqLen);
  v0.block_tables.resize(static_cast<size_t>(batch) * kMaxBlocks);
  v0.seq_lens.resize(batch);
  v0.slot_mapping.resize(static_cast<size_t>(batch) * kMaxSeqLen);
  for (auto _ : st) {
    // Padded [batch, max_seq_len] token / position / slot tensors and the
    // [batch, max_blocks] block table, filled from the cached state.
    for (int r = 0; r < ws.num_rows(); ++r) {
      const worker::CachedRequest& q = ws.row(r);
      const int len = static_cast<int>(q.tokens.size());
      int32_t* tok = v0.token_ids.data() + static_cast<size_t>(r) * kMaxSeqLen;
      int32_t* pos = v0.position_ids.data() + static_cast<size_t>(r) * kMaxSeqLen;
      int32_t* slot = v0.slot_mapping.data() + static_cast<size_t>(r) * kMaxSeqLen;
      std::memcpy(tok, q.tokens.data(), sizeof(int32_t) * len);
      std::memset(tok + len, 0, sizeof(int32_t) * (kMaxSeqLen - len));
      for (int p = 0; p < len; ++p) {
        pos[p] = p;
        slot[p] = q.block_table[p / kBlock] * kBlock + p % kBlock;
      }
      std::memset(pos + len, 0, sizeof(int32_t) * (kMaxSeqLen - len));
      std::fill(slot + len, slot + kMaxSeqLen, -1);
      int32_t* bt = v0.block_tables.data() + static_cast<size_t>(r) * kMaxBlocks;
      const int nb = static_cast<int>(q.block_table.size());
      std::memcpy(bt, q.block_table.data(), sizeof(int32_t) * nb);
      std::fill(bt + nb, bt + kMaxBlocks, -1);
      v0.seq_lens[r] = len;
    }
    benchmark::DoNotOptimize(v0.token_ids.data());
    benchmark::ClobberMemory();
  }
  st.counters["batch"] = batch;
  st.counters["v0_bytes"] = static_cast<double>(v0.bytes());
  st.counters["v1_bytes"] = static_cast<double>(wire.size());
  st.counters["reduction_x"] = static_cast<double>(v0.bytes()) / static_cast<double>(wire.size());
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(v0.bytes()));
}
BENCHMARK(BM_V0Broadcast)->Arg(32)->Arg(128)->Arg(256)->Arg(512)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace symtp

BENCHMARK_MAIN();
