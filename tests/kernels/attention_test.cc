// Paged GQA attention (decode with and without split-K, prefill / chunked
// prefill, padding rows) against a double-precision CPU reference over a
// random paged cache with scattered block tables.
#include "kernels/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "tests/kernels/gpu_test_util.h"

namespace symtp::kernels {
namespace {

using testing::DevArray;
using testing::RandomFloats;
using testing::RoundTo;

struct Seq {
  int start;  // position of the first query token of this step's chunk
  int n;      // query tokens (1 = decode)
};

// A random cache and batch; Run() launches the kernel with a split choice.
class AttnProblem {
 public:
  // block_size: cache page size in tokens (GpuModel: 16).
  // k_step_at > 0: K rows of positions >= k_step_at scaled by 6, so that
  // the scores jump well after the first keys and a running max moves by
  // more than 2^8 (the tensor-core kernel then rescales mid-loop).
  AttnProblem(DType dt, int D, int nq, int nkv, std::vector<Seq> seqs, uint64_t seed,
              int pad_rows = 0, int block_size = 16, int k_step_at = 0)
      : B(block_size), dt_(dt), D_(D), nq_(nq), nkv_(nkv), seqs_(std::move(seqs)) {
    std::mt19937_64 rng(seed);
    int max_ctx = 0;
    seq_start_.push_back(0);
    for (const Seq& s : seqs_) {
      for (int i = 0; i < s.n; ++i) {
        pos_.push_back(s.start + i);
        seq_of_.push_back(static_cast<int>(seq_start_.size()) - 1);
      }
      seq_start_.push_back(static_cast<int32_t>(pos_.size()));
      max_ctx = std::max(max_ctx, s.start + s.n);
    }
    for (int i = 0; i < pad_rows; ++i) {  // padding rows: their own "sequence", position -1
      pos_.push_back(-1);
      seq_of_.push_back(-1);
    }
    T_ = static_cast<int>(pos_.size());
    stride_ = (max_ctx + B - 1) / B + 2;
    int need = 0;
    for (const Seq& s : seqs_) need += (s.start + s.n + B - 1) / B;
    blocks_ = need + 7;
    std::vector<int> pool(blocks_);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    const int S = static_cast<int>(seqs_.size()) + pad_rows;
    table_.assign(static_cast<size_t>(S) * stride_, -1);
    size_t next = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const int nb = (seqs_[s].start + seqs_[s].n + B - 1) / B;
      for (int b = 0; b < nb; ++b) table_[s * stride_ + b] = pool[next++];
    }
    const size_t cache_n = static_cast<size_t>(blocks_) * B * nkv * D;
    k_ = RandomFloats(cache_n, seed + 1);
    v_ = RandomFloats(cache_n, seed + 2);
    qstride_ = static_cast<int64_t>(nq + 2 * nkv) * D;
    q_ = RandomFloats(static_cast<size_t>(T_) * qstride_, seed + 3, -2.f, 2.f);
    if (k_step_at > 0) {
      for (size_t s = 0; s < seqs_.size(); ++s) {
        for (int j = k_step_at; j < seqs_[s].start + seqs_[s].n; ++j) {
          const int64_t slot = static_cast<int64_t>(table_[s * stride_ + j / B]) * B + j % B;
          const float f = 6.f;
          for (int64_t e = 0; e < static_cast<int64_t>(nkv) * D; ++e) k_[slot * nkv * D + e] *= f;
        }
      }
    }
    RoundTo(&k_, dt);
    RoundTo(&v_, dt);
    RoundTo(&q_, dt);
    d_k_ = DevArray(cache_n, dt);
    d_v_ = DevArray(cache_n, dt);
    d_q_ = DevArray(q_.size(), dt);
    d_k_.Upload(k_);
    d_v_.Upload(v_);
    d_q_.Upload(q_);
    d_pos_ = testing::UploadRaw(pos_);
    d_table_ = testing::UploadRaw(table_);
  }

  // max_per_item: tokens per item (<= MaxAttentionItemTokens).
  std::vector<float> Run(int num_splits, int chunk, int max_per_item, cudaStream_t stream,
                         DecodeKernel dk = DecodeKernel::kTiled,
                         PrefillKernel pk = PrefillKernel::kTiled, bool chunk_on_device = false) {
    std::vector<AttentionItem> items;
    BuildAttentionItems(seq_start_, max_per_item, &items);
    for (int t = seq_start_.back(); t < T_; ++t) {
      items.push_back(
          AttentionItem{static_cast<int32_t>(seqs_.size()) + (t - seq_start_.back()), t, 1, 0});
    }
    cuda::DeviceBuffer d_items = testing::UploadRaw(items);
    DevArray out(static_cast<size_t>(T_) * nq_ * D_, dt_);
    const size_t ws_bytes = PagedAttentionWorkspaceBytes(T_, nq_, D_, num_splits);
    auto ws = cuda::DeviceBuffer::Create(std::max<size_t>(ws_bytes, 16));
    EXPECT_TRUE(ws.ok());
    if (ws_bytes) {
      EXPECT_EQ(cudaMemset(ws->get(), 0xff, ws_bytes), cudaSuccess);  // poison
      testing::FinishHostCopies();
    }
    PagedAttentionArgs a;
    a.q = d_q_.get();
    a.q_row_stride = qstride_;
    a.k_cache = d_k_.get();
    a.v_cache = d_v_.get();
    a.out = out.get();
    a.positions = d_pos_.as<int32_t>();
    a.block_tables = d_table_.as<int32_t>();
    a.block_table_stride = stride_;
    a.block_size = B;
    a.items = d_items.as<AttentionItem>();
    a.num_items = static_cast<int>(items.size());
    a.max_item_tokens = max_per_item;
    a.num_tokens = T_;
    a.num_q_heads = nq_;
    a.num_kv_heads = nkv_;
    a.head_dim = D_;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D_)));
    a.num_splits = num_splits;
    a.split_chunk = chunk;
    cuda::DeviceBuffer d_chunk;
    if (chunk_on_device) {  // the host value must then be ignored
      d_chunk = testing::UploadRaw(std::vector<int32_t>{chunk});
      a.split_chunk = -7;
      a.split_chunk_dev = d_chunk.as<int32_t>();
    }
    a.workspace = ws->get();
    a.workspace_bytes = ws_bytes;
    a.decode_kernel = dk;
    a.prefill_kernel = pk;
    a.split_grid = split_grid_;
    if (cache_slots_known_) a.cache_slots = static_cast<int64_t>(blocks_) * B;
    const absl::Status st = PagedAttention(a, dt_, stream);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    workspace_written_ = 0;
    if (ws_bytes) {
      std::vector<uint8_t> w(ws_bytes);
      EXPECT_EQ(cudaMemcpy(w.data(), ws->get(), ws_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      workspace_written_ = std::count_if(w.begin(), w.end(), [](uint8_t b) { return b != 0xff; });
    }
    return out.Download();
  }

  std::vector<double> Reference() const {
    std::vector<double> out(static_cast<size_t>(T_) * nq_ * D_, 0.0);
    const int G = nq_ / nkv_;
    for (int t = 0; t < T_; ++t) {
      const int p = pos_[t];
      if (p < 0) continue;
      const int s = seq_of_[t];
      for (int h = 0; h < nq_; ++h) {
        const int kvh = h / G;
        std::vector<double> sc(p + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= p; ++j) {
          const int64_t slot = static_cast<int64_t>(table_[s * stride_ + j / B]) * B + j % B;
          double dot = 0;
          for (int d = 0; d < D_; ++d) {
            dot += static_cast<double>(q_[t * qstride_ + h * D_ + d]) *
                   k_[(slot * nkv_ + kvh) * D_ + d];
          }
          sc[j] = dot / std::sqrt(static_cast<double>(D_));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int j = 0; j <= p; ++j) {
          const int64_t slot = static_cast<int64_t>(table_[s * stride_ + j / B]) * B + j % B;
          for (int d = 0; d < D_; ++d) {
            out[(static_cast<size_t>(t) * nq_ + h) * D_ + d] +=
                sc[j] / sum * v_[(slot * nkv_ + kvh) * D_ + d];
          }
        }
      }
    }
    return out;
  }

  // PagedAttentionArgs::split_grid (0: one block per split).
  void set_split_grid(int g) { split_grid_ = g; }

  // Whether Run() sets PagedAttentionArgs::cache_slots (the tensor-core
  // decode kernel then copies head-dim-128 tiles with TMA).
  void set_cache_slots_known(bool on) { cache_slots_known_ = on; }

  // NaN in every slot of each sequence's last page past its context, as a
  // page's unwritten or stale rows may hold: no kernel may let them reach an
  // output (the reference never reads them).
  void PoisonPageTails() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const int ctx = seqs_[s].start + seqs_[s].n;
      for (int j = ctx; j < (ctx + B - 1) / B * B; ++j) {
        const int64_t slot = static_cast<int64_t>(table_[s * stride_ + j / B]) * B + j % B;
        for (int64_t e = 0; e < static_cast<int64_t>(nkv_) * D_; ++e) {
          k_[slot * nkv_ * D_ + e] = nan;
          v_[slot * nkv_ * D_ + e] = nan;
        }
      }
    }
    d_k_.Upload(k_);
    d_v_.Upload(v_);
  }

  // Bytes of the split-K workspace the last Run() changed (it poisons it).
  int64_t workspace_written() const { return workspace_written_; }

  int max_ctx() const {
    int m = 1;
    for (const Seq& s : seqs_) m = std::max(m, s.start + s.n);
    return m;
  }

 private:
  const int B;
  int split_grid_ = 0;
  bool cache_slots_known_ = false;
  int64_t workspace_written_ = 0;
  DType dt_;
  int D_, nq_, nkv_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> pos_, seq_of_, seq_start_, table_;
  int T_ = 0, stride_ = 0, blocks_ = 0;
  int64_t qstride_ = 0;
  std::vector<float> k_, v_, q_;
  DevArray d_k_, d_v_, d_q_;
  cuda::DeviceBuffer d_pos_, d_table_;
};

// (dtype, head_dim, q heads, kv heads)
using AttnParam = std::tuple<DType, int, int, int>;

class AttentionTest : public testing::GpuTest, public ::testing::WithParamInterface<AttnParam> {
 protected:
  double Tol() const { return std::get<0>(GetParam()) == DType::kF32 ? 1e-5 : 1e-2; }
};

const char* Name(DecodeKernel dk) { return DecodeKernelName(dk); }
constexpr DecodeKernel kDecodeKernels[] = {DecodeKernel::kTiled, DecodeKernel::kTensorCore};

TEST_P(AttentionTest, DecodeNoSplitMatchesReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  AttnProblem p(dt, D, nq, nkv,
                {{0, 1},
                 {14, 1},
                 {15, 1},
                 {16, 1},
                 {299, 1},
                 {700, 1},
                 {31, 1},
                 {32, 1},
                 {33, 1},
                 {127, 1},
                 {128, 1},
                 {129, 1}},
                11, /*pad_rows=*/2);
  for (DecodeKernel dk : kDecodeKernels) {
    const std::vector<float> got = p.Run(1, 256, 1, stream(), dk);
    testing::CheckClose(got, p.Reference(), Tol(), std::string("decode ") + Name(dk));
  }
}

TEST_P(AttentionTest, DecodeSplitKMatchesReferenceAndIsGridIndependent) {
  const auto [dt, D, nq, nkv] = GetParam();
  AttnProblem p(dt, D, nq, nkv, {{5, 1}, {63, 1}, {64, 1}, {200, 1}, {1023, 1}, {130, 1}}, 12,
                /*pad_rows=*/1);
  const int chunk = 64;
  const int splits = (p.max_ctx() + chunk - 1) / chunk;
  for (DecodeKernel dk : kDecodeKernels) {
    SCOPED_TRACE(Name(dk));
    const std::vector<float> got = p.Run(splits, chunk, 1, stream(), dk);
    testing::CheckClose(got, p.Reference(), Tol(), std::string("decode split-K ") + Name(dk));
    // A CUDA graph uses a larger grid (capacity-sized): same partition, same bits.
    const std::vector<float> got_big = p.Run(splits + 37, chunk, 1, stream(), dk);
    ASSERT_EQ(got.size(), got_big.size());
    EXPECT_EQ(0, std::memcmp(got.data(), got_big.data(), got.size() * sizeof(float)));
    // The chunk read from device memory (how GpuModel's graphs get each
    // step's planned chunk) gives the same bits.
    const std::vector<float> got_dev =
        p.Run(splits + 37, chunk, 1, stream(), dk, PrefillKernel::kTiled, /*chunk_on_device=*/true);
    EXPECT_EQ(0, std::memcmp(got.data(), got_dev.data(), got.size() * sizeof(float)));
    const std::vector<float> got_dev96 =
        p.Run(splits, 96, 1, stream(), dk, PrefillKernel::kTiled, /*chunk_on_device=*/true);
    testing::CheckClose(got_dev96, p.Reference(), Tol(),
                        std::string("decode split-K, chunk 96 on device ") + Name(dk));
    EXPECT_GT(p.workspace_written(), 0);
    // Contexts within one chunk (eager: no split; a graph: a split-sized
    // grid): the attention stores every row itself, the merge skips them
    // and no partial is written. Same bits either way.
    AttnProblem shortp(dt, D, nq, nkv, {{5, 1}, {40, 1}, {63, 1}}, 14);
    const std::vector<float> one = shortp.Run(1, chunk, 1, stream(), dk);
    const std::vector<float> merged = shortp.Run(16, chunk, 1, stream(), dk);
    EXPECT_EQ(0, std::memcmp(one.data(), merged.data(), one.size() * sizeof(float)));
    EXPECT_EQ(shortp.workspace_written(), 0);
    testing::CheckClose(merged, shortp.Reference(), Tol(), std::string("one chunk ") + Name(dk));
  }
  // Fewer blocks than splits (GpuModel's graphs): the tensor-core kernel's
  // blocks walk the remaining splits; the same bits as one block per split
  // (the other kernels ignore split_grid).
  const std::vector<float> full = p.Run(splits + 37, chunk, 1, stream(), DecodeKernel::kTensorCore);
  for (const int g : {1, 3, splits - 1}) {
    p.set_split_grid(g);
    const std::vector<float> walked =
        p.Run(splits + 37, chunk, 1, stream(), DecodeKernel::kTensorCore);
    EXPECT_EQ(0, std::memcmp(full.data(), walked.data(), full.size() * sizeof(float)))
        << "split_grid " << g;
  }
  p.set_split_grid(0);
}

// The tensor-core decode kernel's TMA copies (head dim 128, pages of a
// multiple of 16 slots, cache size known) give the cp.async form's bits, with
// and without splits, partial last tiles over NaN page tails included; other
// shapes and page sizes keep the cp.async form.
TEST_P(AttentionTest, DecodeTmaCopiesGiveTheSameBits) {
  const auto [dt, D, nq, nkv] = GetParam();
  for (const int bs : {16, 32, 8}) {
    AttnProblem p(dt, D, nq, nkv,
                  {{0, 1}, {15, 1}, {16, 1}, {17, 1}, {255, 1}, {700, 1}, {1023, 1}, {130, 1}}, 21,
                  /*pad_rows=*/1, bs);
    p.PoisonPageTails();
    for (const int chunk : {64, 256, 1 << 20}) {
      SCOPED_TRACE(absl::StrCat("page ", bs, ", chunk ", chunk));
      const int splits = (p.max_ctx() + chunk - 1) / chunk;
      p.set_cache_slots_known(false);
      const std::vector<float> copied =
          p.Run(splits, chunk, 1, stream(), DecodeKernel::kTensorCore);
      p.set_cache_slots_known(true);
      const std::vector<float> tma = p.Run(splits, chunk, 1, stream(), DecodeKernel::kTensorCore);
      ASSERT_EQ(copied.size(), tma.size());
      EXPECT_EQ(0, std::memcmp(copied.data(), tma.data(), tma.size() * sizeof(float)));
      testing::CheckClose(tma, p.Reference(), Tol(), "decode, cache size known");
      // Blocks walking several splits (GpuModel's graphs) set their stage
      // barriers up again for each split: same bits.
      p.set_split_grid(3);
      const std::vector<float> walked =
          p.Run(splits, chunk, 1, stream(), DecodeKernel::kTensorCore);
      p.set_split_grid(0);
      EXPECT_EQ(0, std::memcmp(copied.data(), walked.data(), tma.size() * sizeof(float)));
    }
  }
}

TEST_P(AttentionTest, PrefillAndChunkedPrefillMatchReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  // Fresh prompts, chunks starting mid-sequence, and decode tokens mixed in.
  AttnProblem p(dt, D, nq, nkv, {{0, 37}, {48, 20}, {0, 1}, {100, 70}, {511, 1}, {3, 5}}, 13);
  const int per = MaxAttentionItemTokens(nq, nkv);
  const int splits = (p.max_ctx() + 63) / 64;  // must cover the longest context
  for (PrefillKernel pk : {PrefillKernel::kTiled, PrefillKernel::kTensorCore}) {
    const std::string k = PrefillKernelName(pk);
    const auto run = [&](int num_splits, int chunk, int max_per_item) {
      return p.Run(num_splits, chunk, max_per_item, stream(), DecodeKernel::kTiled, pk);
    };
    testing::CheckClose(run(1, 256, per), p.Reference(), Tol(), "prefill " + k);
    // Smaller items (fewer rows per block), and split-K over a mixed batch.
    testing::CheckClose(run(1, 256, std::max(1, per / 4)), p.Reference(), Tol(),
                        "prefill small items " + k);
    testing::CheckClose(run(1, 256, std::max(1, per / 2)), p.Reference(), Tol(),
                        "prefill half items " + k);
    testing::CheckClose(run(splits, 64, per), p.Reference(), Tol(), "prefill split-K " + k);
  }
}

// The tensor-core kernels' row shapes: rows = tokens x group of 1..64 (up to
// 8 in the decode kernel, several tokens per item included; above that one to
// four row groups of the prefill kernel) and, at bf16 head dim 128, 65..128
// (the wgmma prefill kernel's two warpgroups of 64 rows, items of up to
// 128 / group tokens, some of them part-filled, some leaving the second
// warpgroup no rows), decode tokens of a prefill launch.
TEST_P(AttentionTest, TensorCorePrefillEveryItemSizeMatchesReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  const int per = MaxAttentionItemTokens(nq, nkv, dt, D, PrefillKernel::kTensorCore);
  EXPECT_EQ(per, (dt == DType::kBF16 && D == 128 ? 128 : 64) / (nq / nkv));
  AttnProblem p(dt, D, nq, nkv, {{0, 64}, {30, 33}, {200, 17}, {7, 1}, {64, 9}, {0, 150}, {5, 97}},
                15, /*pad_rows=*/3);
  for (int items = 1; items <= per; items = items < 4 ? items + 1 : items * 2) {
    testing::CheckClose(
        p.Run(1, 256, items, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
        p.Reference(), Tol(), "tensor-core prefill, tokens per item " + std::to_string(items));
  }
  if (per > MaxAttentionItemTokens(nq, nkv)) {
    // Items of a size between the loop's powers of two (part-filled ones).
    testing::CheckClose(
        p.Run(1, 256, per - 1, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
        p.Reference(), Tol(), "tensor-core prefill, tokens per item " + std::to_string(per - 1));
    // The tiled kernel cannot take them: a clear error, not a wrong answer.
    PagedAttentionArgs a;
    a.num_q_heads = nq;
    a.num_kv_heads = nkv;
    a.head_dim = D;
    a.max_item_tokens = per;
    a.prefill_kernel = PrefillKernel::kTiled;
    a.block_table_stride = 1;
    a.q_row_stride = static_cast<int64_t>(nq) * D;
    EXPECT_EQ(PagedAttention(a, dt, stream()).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Pages that are not a multiple of the tensor-core kernel's 16-key tile, and
// split chunks that start tiles off a 16-key boundary: every kernel takes its
// per-row page lookup there instead of one lookup per tile.
TEST_P(AttentionTest, OddPageSizesAndChunksMatchReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  const int per = MaxAttentionItemTokens(nq, nkv);
  for (const int bs : {8, 24, 32}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    AttnProblem p(dt, D, nq, nkv, {{0, 1}, {23, 1}, {47, 1}, {300, 1}, {0, 29}, {61, 9}}, 16 + bs,
                  /*pad_rows=*/1, bs);
    for (DecodeKernel dk : kDecodeKernels) {
      const std::string k = Name(dk);
      testing::CheckClose(p.Run(1, 256, 1, stream(), dk, PrefillKernel::kTensorCore), p.Reference(),
                          Tol(), "unsplit " + k);
      for (const int chunk : {40, 64}) {
        const int splits = (p.max_ctx() + chunk - 1) / chunk;
        testing::CheckClose(p.Run(splits, chunk, per, stream(), dk, PrefillKernel::kTensorCore),
                            p.Reference(), Tol(), "chunk " + std::to_string(chunk) + " " + k);
      }
    }
  }
}

// Contexts long enough that a warp of the tensor-core kernel walks more than
// 64 key tiles without a split (its lane-held slots are refilled every 32
// tiles), in decode and in prefill.
TEST_P(AttentionTest, LongContextsWithoutSplitMatchReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  const int per = MaxAttentionItemTokens(nq, nkv);
  for (const int bs : {16, 32}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    AttnProblem p(dt, D, nq, nkv, {{9000, 1}, {4500, 1}, {0, 1}, {4100, 6}, {4000, 70}}, 40 + bs,
                  /*pad_rows=*/0, bs);
    for (DecodeKernel dk : kDecodeKernels) {
      testing::CheckClose(p.Run(1, 1 << 20, 1, stream(), dk, PrefillKernel::kTensorCore),
                          p.Reference(), Tol(), std::string("decode items ") + Name(dk));
    }
    testing::CheckClose(
        p.Run(1, 1 << 20, per, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
        p.Reference(), Tol(), "prefill items");
    const int wide = MaxAttentionItemTokens(nq, nkv, dt, D, PrefillKernel::kTensorCore);
    if (wide > per) {
      testing::CheckClose(
          p.Run(1, 1 << 20, wide, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
          p.Reference(), Tol(), "prefill items of " + std::to_string(wide) + " tokens");
    }
  }
}

// Scores that jump along the context: the running maxima move long after the
// first keys, so the tensor-core kernel's lazy rescaling (O and l rescaled
// only when a score exceeds the reference max by 2^8) takes its rescale path
// mid-loop, in decode, split-K and prefill.
TEST_P(AttentionTest, GrowingScoresMatchReference) {
  const auto [dt, D, nq, nkv] = GetParam();
  const int per = MaxAttentionItemTokens(nq, nkv);
  AttnProblem p(dt, D, nq, nkv, {{700, 1}, {300, 1}, {90, 1}, {0, 40}, {200, 9}}, 77,
                /*pad_rows=*/0, /*block_size=*/16, /*k_step_at=*/150);
  for (DecodeKernel dk : kDecodeKernels) {
    const std::string k = Name(dk);
    testing::CheckClose(p.Run(1, 256, 1, stream(), dk, PrefillKernel::kTensorCore), p.Reference(),
                        Tol(), "decode items " + k);
    const int splits = (p.max_ctx() + 63) / 64;
    testing::CheckClose(p.Run(splits, 64, 1, stream(), dk, PrefillKernel::kTensorCore),
                        p.Reference(), Tol(), "decode items, split-K " + k);
  }
  testing::CheckClose(
      p.Run(1, 256, per, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
      p.Reference(), Tol(), "prefill items");
  const int wide = MaxAttentionItemTokens(nq, nkv, dt, D, PrefillKernel::kTensorCore);
  if (wide > per) {
    testing::CheckClose(
        p.Run(1, 256, wide, stream(), DecodeKernel::kTensorCore, PrefillKernel::kTensorCore),
        p.Reference(), Tol(), "prefill items of " + std::to_string(wide) + " tokens");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(32, 64, 128), ::testing::Values(8),
                                            ::testing::Values(1, 2, 8)),
                         [](const ::testing::TestParamInfo<AttnParam>& i) {
                           return std::string(std::get<0>(i.param) == DType::kF32 ? "F32"
                                                                                  : "BF16") +
                                  "_D" + std::to_string(std::get<1>(i.param)) + "_Q" +
                                  std::to_string(std::get<2>(i.param)) + "_KV" +
                                  std::to_string(std::get<3>(i.param));
                         });

// The decode split planner (host only: runs without a GPU). 264 slots: 2
// resident blocks on each of 132 SMs.
TEST(PlanDecodeSplitChunkTest, SplitsUntilTheResidentSlotsAreFull) {
  const std::vector<int32_t> b256(256, 1024), b64(64, 1024), b32(32, 1024), b16(16, 1024),
      b8(8, 1024), b1(1, 1024);
  // 256 x 8 and 32 x 8 blocks fill the slots: no split.
  EXPECT_GE(PlanDecodeSplitChunk(b256, 8, 264, 256), 1024);
  EXPECT_GE(PlanDecodeSplitChunk(b32, 8, 264, 256), 1024);
  EXPECT_GE(PlanDecodeSplitChunk(b64, 4, 264, 256), 1024);
  // 32 x 4 = 128 blocks: two splits (256 blocks), never three (384).
  EXPECT_EQ(PlanDecodeSplitChunk(b32, 4, 264, 256), 512);
  EXPECT_EQ(PlanDecodeSplitChunk(b16, 4, 264, 256), 256);
  EXPECT_EQ(PlanDecodeSplitChunk(b8, 4, 264, 128), 128);
  // One sequence: as many splits as the smallest chunk allows.
  EXPECT_EQ(PlanDecodeSplitChunk(b1, 8, 264, 256), 256);
  EXPECT_EQ(PlanDecodeSplitChunk(b1, 8, 264, 64), 64);
  // One long sequence among 16 short ones: it takes the slots they leave
  // (17 even splits: 16 + 17 = 33 blocks x 8 heads = 264).
  std::vector<int32_t> mixed(16, 100);
  mixed.push_back(32768);
  EXPECT_EQ(PlanDecodeSplitChunk(mixed, 8, 264, 256), 1936);
  EXPECT_GE(PlanDecodeSplitChunk({}, 8, 264, 256), 1);
}

TEST(PlanDecodeSplitChunkTest, NeverPastTheSlotsAndCoversEveryContext) {
  std::mt19937 rng(11);
  auto blocks_of = [](const std::vector<int32_t>& ctx, int chunk) {
    int64_t n = 0;
    for (int32_t c : ctx) n += (c + chunk - 1) / chunk;
    return n;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> ctx(1 + rng() % 300);
    for (int32_t& c : ctx) c = 1 + static_cast<int32_t>(rng() % (rng() % 2 ? 40000 : 2000));
    const int nkv = 1 + static_cast<int>(rng() % 16);
    const int slots = 1 + static_cast<int>(rng() % 600);
    const int min_chunk = 16 + static_cast<int>(rng() % 512);
    const int chunk = PlanDecodeSplitChunk(ctx, nkv, slots, min_chunk);
    const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
    ASSERT_GE(chunk, min_chunk);
    // GpuModel sizes its split grid as ceil(max_seq_len / min_chunk).
    ASSERT_LE((max_ctx + chunk - 1) / chunk, (max_ctx + min_chunk - 1) / min_chunk);
    int64_t total = 0;
    for (int32_t c : ctx) total += c;
    const int64_t want = std::max<int64_t>(min_chunk, (total * nkv + slots - 1) / slots);
    if ((max_ctx + chunk - 1) / chunk > 1) {
      // A split fits the slots.
      ASSERT_LE(blocks_of(ctx, chunk) * nkv, slots) << "chunk " << chunk;
    } else if (want < max_ctx) {
      // No split although the work asked for one: two even splits pass the slots.
      const int two = std::max(min_chunk, ((max_ctx + 1) / 2 + 15) / 16 * 16);
      ASSERT_GT(blocks_of(ctx, two) * nkv, slots) << "max_ctx " << max_ctx;
    }
  }
}

class AttentionArgsTest : public testing::GpuTest {};

// The planner's slots: the decode kernel's occupancy, at least one block
// per SM for every supported head dim, none for an unsupported one; one per
// SM where the TMA form runs (head dim 128 over pages of a multiple of 16).
TEST_F(AttentionArgsTest, DecodeKernelResidencyIsKnownForEveryHeadDim) {
  for (int d : {32, 64, 128}) EXPECT_GE(TensorCoreDecodeBlocksPerSm(d), 1) << d;
  EXPECT_GE(TensorCoreDecodeBlocksPerSm(32), TensorCoreDecodeBlocksPerSm(128));
  EXPECT_EQ(TensorCoreDecodeBlocksPerSm(96), 0);
  EXPECT_EQ(DecodePlanBlocksPerSm(128, 16), 1);
  EXPECT_EQ(DecodePlanBlocksPerSm(128, 32), 1);
  EXPECT_EQ(DecodePlanBlocksPerSm(128, 8), TensorCoreDecodeBlocksPerSm(128));
  EXPECT_EQ(DecodePlanBlocksPerSm(64, 16), TensorCoreDecodeBlocksPerSm(64));
}

TEST_F(AttentionArgsTest, RejectsUnsupportedShapes) {
  using symtp::testing::StatusIs;
  PagedAttentionArgs a;
  a.num_q_heads = 8;
  a.num_kv_heads = 3;
  EXPECT_THAT(PagedAttention(a, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("multiple")));
  a.num_kv_heads = 2;
  a.head_dim = 96;
  a.q_row_stride = 8 * 96;
  a.block_table_stride = 4;
  a.num_items = 1;
  a.num_tokens = 1;
  EXPECT_THAT(PagedAttention(a, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_dim")));
  a.head_dim = 64;
  a.q_row_stride = 8 * 64;
  a.num_splits = 4;  // no workspace
  EXPECT_THAT(PagedAttention(a, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("workspace")));
  a.num_splits = 1;
  a.max_item_tokens = 17;  // group 4: at most 16 tokens
  EXPECT_THAT(PagedAttention(a, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("max_item")));
  a.max_item_tokens = 1;
  a.cache_slots = -16;
  EXPECT_THAT(PagedAttention(a, DType::kF32, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("cache_slots")));
  // A cache too large for a TMA tensor map (at most 2^32 rows): an error
  // before anything is launched, not a wrong map.
  a.head_dim = 128;
  a.q_row_stride = 8 * 128;
  a.decode_kernel = DecodeKernel::kTensorCore;
  a.cache_slots = (int64_t{1} << 32) + 16;
  EXPECT_THAT(PagedAttention(a, DType::kBF16, stream()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("tensor map")));
}

}  // namespace
}  // namespace symtp::kernels
