// GPU cases: NcclComm, CustomAllReduce and AllReduceDispatcher, one forked
// process per rank (tests/testing/allreduce/multi_process.h). Every case
// runs for each TP degree in {2, 4, 8} that the visible GPUs allow and skips
// in SetUp, with the reason, below 2 GPUs. Inputs are random and never zero;
// the custom path must equal the fixed-order fp32 reference bit for bit, NCCL
// must be within summation-order tolerance, and every rank's result must be
// bitwise identical (hashes compared across ranks).
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/status_macros.h"
#include "kernels/allreduce/custom_allreduce.h"
#include "kernels/allreduce/dispatcher.h"
#include "tests/testing/allreduce/multi_process.h"
#include "tests/testing/allreduce/nccl_bootstrap.h"
#include "tests/testing/allreduce/reference.h"
#include "kernels/nccl/nccl_comm.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/layer_ops.h"
#include "models/cpu_model.h"
#include "models/cuda/gpu_model.h"
#include "models/sampling.h"
#include "tests/kernels/model_harness.h"
#include "tests/allreduce/test_kernels.h"
#include "tests/testing/status_matchers.h"

namespace symtp::kernels {
namespace {

namespace kt = ::symtp::kernels::testing;
using Protocol = CustomAllReduce::Protocol;

#define CHECK_OR_RETURN(cond, ...)                                                      \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      return absl::InternalError(absl::StrCat("check failed (", __FILE__, ":", __LINE__, \
                                              "): " #cond ": ", __VA_ARGS__));          \
    }                                                                                   \
  } while (0)

constexpr int64_t kSetupMs = 60'000;

// cudaMemset and pageable cudaMemcpy to the device run on the legacy default
// stream (the memset, and the copy's DMA, may still be in flight when they
// return), which the tests' non-blocking streams do not wait for: finish them
// before a kernel on such a stream reads the memory.
absl::Status FinishHostSideWork() {
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}
constexpr DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

std::vector<int> TpDegrees(int gpus) {
  std::vector<int> out;
  for (int tp : {2, 4, 8}) {
    if (tp <= gpus) out.push_back(tp);
  }
  return out;
}

// The model tests' GpuModel options: `blocks` KV blocks, up to 8 sequences
// and 128 tokens a step, CUDA graphs.
model::GpuModelOptions TinyModelOptions(DType dtype, int blocks) {
  model::GpuModelOptions o;
  o.dtype = dtype;
  o.num_kv_blocks = blocks;
  o.max_batch_tokens = 128;
  o.max_seqs = 8;
  o.cuda_graphs = true;
  return o;
}

uint64_t SeedOf(DType t, size_t count, int salt) {
  return kt::Mix64((static_cast<uint64_t>(t) << 56) ^ (count << 8) ^ static_cast<uint64_t>(salt));
}

// Waits for `stream` without ever blocking past `deadline`.
absl::Status SyncStream(cudaStream_t stream, Deadline deadline) {
  return cuda::SyncStream(stream, deadline, "test stream");
}

// A device array with `front` and 8 elements of canary around `count`
// elements; data() is element-aligned but misaligned by `front` elements.
class GuardedBuffer {
 public:
  static absl::StatusOr<GuardedBuffer> Create(DType t, size_t count, size_t front) {
    GuardedBuffer g;
    g.dtype_ = t;
    g.count_ = count;
    g.front_ = front;
    const size_t es = DTypeSize(t);
    SYMTP_ASSIGN_OR_RETURN(g.buf_, cuda::DeviceBuffer::Create((front + count + kBack) * es));
    CUDA_RETURN_IF_ERROR(cudaMemset(g.buf_.get(), kCanary, g.buf_.bytes()));
    SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
    return g;
  }
  void* data() const { return static_cast<char*>(buf_.get()) + front_ * DTypeSize(dtype_); }
  absl::Status Upload(const kt::HostArray& a, cudaStream_t s) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data(), a.data(), a.bytes(), cudaMemcpyHostToDevice, s));
    return absl::OkStatus();
  }
  absl::StatusOr<kt::HostArray> Download(cudaStream_t s) const {
    kt::HostArray a(dtype_, count_);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.data(), data(), a.bytes(), cudaMemcpyDeviceToHost, s));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return a;
  }
  // Canaries before and after the array are intact.
  absl::Status CheckGuards(cudaStream_t s) const {
    std::vector<uint8_t> all(buf_.bytes());
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all.data(), buf_.get(), all.size(),
                                         cudaMemcpyDeviceToHost, s));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    const size_t es = DTypeSize(dtype_);
    for (size_t i = 0; i < all.size(); ++i) {
      const bool inside = i >= front_ * es && i < (front_ + count_) * es;
      if (!inside && all[i] != kCanary) {
        return absl::InternalError(absl::StrCat("canary byte ", i, " overwritten (array at byte ",
                                                front_ * es, ", ", count_ * es, " bytes)"));
      }
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBack = 8;
  static constexpr int kCanary = 0x5a;
  DType dtype_ = DType::kF32;
  size_t count_ = 0;
  size_t front_ = 0;
  cuda::DeviceBuffer buf_;
};

// Every rank holds the same `value` (e.g. a result hash).
absl::Status SameOnAllRanks(PeerExchange& ex, int size, uint64_t value, const std::string& what) {
  std::vector<uint64_t> all(size);
  SYMTP_RETURN_IF_ERROR(ex.AllGather(&value, sizeof(value), all.data(), Deadline::AfterMs(kSetupMs)));
  for (int r = 1; r < size; ++r) {
    CHECK_OR_RETURN(all[r] == all[0], what, ": rank ", r, "'s result differs from rank 0's");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclComm>> MakeNccl(int rank, int size, PeerExchange& ex) {
  return kt::NcclOverExchange(rank, size, rank, ex, Deadline::AfterMs(kSetupMs));
}

// Runs one all-reduce of RandomInput on `run` and checks it: bitwise against
// the reference when `exact`, else within order tolerance; canaries intact;
// identical on all ranks.
template <typename RunFn>
absl::Status CheckOne(int rank, int size, PeerExchange& ex, cudaStream_t stream, DType t,
                      size_t count, size_t front, bool exact, const std::string& what, RunFn run) {
  const uint64_t seed = SeedOf(t, count, static_cast<int>(front) + 17);
  SYMTP_ASSIGN_OR_RETURN(GuardedBuffer buf, GuardedBuffer::Create(t, count, front));
  SYMTP_RETURN_IF_ERROR(buf.Upload(kt::RandomInput(t, count, seed, rank), stream));
  SYMTP_RETURN_IF_ERROR_CTX(run(buf.data(), count, t, stream), what);
  SYMTP_RETURN_IF_ERROR_CTX(SyncStream(stream, Deadline::AfterMs(30'000)), what);
  SYMTP_ASSIGN_OR_RETURN(kt::HostArray got, buf.Download(stream));
  const kt::HostArray ref = kt::ReferenceSum(t, count, seed, size);
  const size_t wrong = exact ? kt::CountWrong(got, ref, 0.0)
                             : kt::CountWrong(got, ref, kt::OrderTolerance(t, size), 1.0);
  if (wrong != 0) {
    size_t first = 0;
    while (first < count && got.bits(first) == ref.bits(first)) ++first;
    return absl::InternalError(absl::StrCat(what, ": ", wrong, " of ", count,
                                            " elements wrong; first at ", first, ": got ",
                                            got.at(first), " want ", ref.at(first)));
  }
  SYMTP_RETURN_IF_ERROR_CTX(buf.CheckGuards(stream), what);
  return SameOnAllRanks(ex, size, kt::HashOf(got), what);
}

std::string Name(DType t, size_t count, const char* path, size_t front = 0) {
  return absl::StrCat(path, " ", DTypeName(t), " x ", count, front ? " (misaligned)" : "");
}

// Element counts of the spec: 1, 3, 1023, 4097 elements; 64 KiB, 256 KiB and
// 1 MiB - 2 bytes (rounded down to whole elements).
std::vector<size_t> SpecCounts(DType t) {
  const size_t es = DTypeSize(t);
  return {1, 3, 1023, 4097, (64 << 10) / es, (256 << 10) / es, ((1 << 20) - 2) / es};
}

// Inputs of two residual + RMSNorm calls to compare, on the device:
// b = data1 res1 out1 | data2 res2 out2 | weight, both data this rank's
// RandomInput(seed), both residuals the replicated RandomInput(seed + 1), the
// weight RandomInput(seed + 2) (uploaded on `s`).
struct NormPair {
  DType t;
  size_t n;
  kt::HostArray residual, weight;
  std::vector<cuda::DeviceBuffer> b;
};

absl::StatusOr<NormPair> UploadNormPair(DType t, int64_t rows, int hidden, uint64_t seed, int rank,
                                        cudaStream_t s) {
  NormPair p{t, static_cast<size_t>(rows) * hidden, kt::RandomInput(t, rows * hidden, seed + 1, 0),
             kt::RandomInput(t, hidden, seed + 2, 0), {}};
  const kt::HostArray input = kt::RandomInput(t, p.n, seed, rank);
  const size_t bytes = p.n * DTypeSize(t);
  for (size_t bytes_i : {bytes, bytes, bytes, bytes, bytes, bytes, p.weight.bytes()}) {
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d, cuda::DeviceBuffer::Create(bytes_i));
    p.b.push_back(std::move(d));
  }
  for (int k : {0, 3}) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p.b[k].get(), input.data(), bytes, cudaMemcpyHostToDevice, s));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(p.b[k + 1].get(), p.residual.data(), bytes, cudaMemcpyHostToDevice, s));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(p.b[6].get(), p.weight.data(), p.weight.bytes(), cudaMemcpyHostToDevice, s));
  return p;
}

// {res1, out1, res2, out2} of a NormPair, after its calls completed.
absl::StatusOr<std::vector<kt::HostArray>> DownloadNormPair(const NormPair& p) {
  std::vector<kt::HostArray> got;
  for (int k : {1, 2, 4, 5}) {
    kt::HostArray h(p.t, p.n);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), p.b[k].get(), h.bytes(), cudaMemcpyDeviceToHost));
    got.push_back(std::move(h));
  }
  return got;
}

class AllReduceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpus_ = kt::CountGpusInChild(&why);
    if (gpus_ < 2) {
      GTEST_SKIP() << "needs at least 2 GPUs for a multi-process all-reduce; " << gpus_
                   << " visible" << (why.empty() ? "" : " (" + why + ")");
    }
  }

  void RunOnEveryTp(int64_t timeout_ms, const kt::RankBody& body) {
    for (int tp : TpDegrees(gpus_)) {
      kt::RunOptions opt;
      opt.size = tp;
      opt.timeout_ms = timeout_ms;
      auto res = kt::RunRanks(opt, [&](int rank, int size, PeerExchange& ex) -> absl::Status {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
        return body(rank, size, ex);
      });
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_TRUE(res->ok()) << "TP " << tp << ":\n" << res->Summary();
    }
  }

  int gpus_ = 0;
};

TEST_F(AllReduceGpuTest, NcclCollectivesAreCorrectAndIdenticalAcrossRanks) {
  RunOnEveryTp(180'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(auto nccl, MakeNccl(rank, size, ex));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    for (DType t : kAllTypes) {
      for (size_t count : {size_t{1}, size_t{4097}, size_t{65539}, size_t{1} << 20}) {
        SYMTP_RETURN_IF_ERROR(CheckOne(
            rank, size, ex, stream.get(), t, count, 0, /*exact=*/false, Name(t, count, "nccl"),
            [&](void* p, size_t n, DType d, cudaStream_t s) { return nccl->AllReduceSum(p, n, d, s); }));
      }
    }
    // AllGather: rank r's block holds rank r's input exactly.
    const size_t n = 1001;
    SYMTP_ASSIGN_OR_RETURN(GuardedBuffer send, GuardedBuffer::Create(DType::kBF16, n, 0));
    SYMTP_ASSIGN_OR_RETURN(GuardedBuffer recv, GuardedBuffer::Create(DType::kBF16, n * size, 0));
    SYMTP_RETURN_IF_ERROR(send.Upload(kt::RandomInput(DType::kBF16, n, 5, rank), stream.get()));
    SYMTP_RETURN_IF_ERROR(nccl->AllGather(send.data(), recv.data(), n, DType::kBF16, stream.get()));
    SYMTP_ASSIGN_OR_RETURN(kt::HostArray gathered, recv.Download(stream.get()));
    for (int r = 0; r < size; ++r) {
      const kt::HostArray want = kt::RandomInput(DType::kBF16, n, 5, r);
      for (size_t i = 0; i < n; ++i) {
        CHECK_OR_RETURN(gathered.bits(r * n + i) == want.bits(i), "all-gather block ", r, " elem ", i);
      }
    }
    // Broadcast from the last rank.
    SYMTP_ASSIGN_OR_RETURN(GuardedBuffer bc, GuardedBuffer::Create(DType::kF32, n, 0));
    SYMTP_RETURN_IF_ERROR(bc.Upload(kt::RandomInput(DType::kF32, n, 6, rank), stream.get()));
    SYMTP_RETURN_IF_ERROR(nccl->Broadcast(bc.data(), n, DType::kF32, size - 1, stream.get()));
    SYMTP_ASSIGN_OR_RETURN(kt::HostArray got, bc.Download(stream.get()));
    CHECK_OR_RETURN(kt::CountWrong(got, kt::RandomInput(DType::kF32, n, 6, size - 1), 0.0) == 0,
                    "broadcast result differs from the root's input");
    SYMTP_RETURN_IF_ERROR(nccl->Poll());
    return absl::OkStatus();
  });
}

TEST_F(AllReduceGpuTest, CustomMatchesReferenceBitwiseForEveryDtypeSizeAndProtocol) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.ll128_max_bytes = 1 << 20;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    CHECK_OR_RETURN(ar->scratch_bytes() >= 2u * (1u << 20), "scratch ", ar->scratch_bytes());
    if (rank == 0) {
      fprintf(stderr, "[TP %d] custom all-reduce scratch per rank: %zu bytes (LL <= %zu B)\n",
              size, ar->scratch_bytes(), ar->ll_max_bytes());
    }
    // The two-shot protocol's pipelined schedule at every size too, in 1 KiB
    // chunks: at least one per scatter block at small sizes, many per block
    // above, and at 1 MiB at TP 2 more than the 256 flag rows (capped).
    CustomAllReduce::Options popt = opt;
    popt.two_shot_pipeline_min_bytes = 1;
    popt.two_shot_chunk_bytes = 1024;
    SYMTP_ASSIGN_OR_RETURN(auto piped, CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                               Deadline::AfterMs(kSetupMs), popt));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    for (DType t : kAllTypes) {
      for (size_t count : SpecCounts(t)) {
        const size_t bytes = count * DTypeSize(t);
        const Protocol order[5] = {Protocol::kLL, Protocol::kLL128, Protocol::kStaged,
                                   Protocol::kTwoShot, Protocol::kTwoShot};
        for (int k = 0; k < 5; ++k) {
          const Protocol p = order[k];
          CustomAllReduce* inst = k < 4 ? ar.get() : piped.get();
          if (p == Protocol::kLL && bytes > ar->ll_max_bytes()) continue;
          if (p == Protocol::kLL128 && bytes > ar->ll128_max_bytes()) continue;
          for (size_t front : {size_t{0}, size_t{1}}) {
            if (front && count > 70'000) continue;  // misalignment: small and mid sizes
            const std::string path = absl::StrCat("custom-", CustomAllReduce::ProtocolName(p),
                                                  k < 4 ? "" : "-pipelined");
            SYMTP_RETURN_IF_ERROR(CheckOne(rank, size, ex, stream.get(), t, count, front,
                                           /*exact=*/true, Name(t, count, path.c_str(), front),
                                           [&](void* d, size_t n, DType dt, cudaStream_t s) {
                                             return inst->AllReduceSumWith(p, d, n, dt, s);
                                           }));
          }
        }
        // And the size-based choice.
        SYMTP_RETURN_IF_ERROR(CheckOne(rank, size, ex, stream.get(), t, count, 0, true,
                                       Name(t, count, "custom-auto"),
                                       [&](void* d, size_t n, DType dt, cudaStream_t s) {
                                         return ar->AllReduceSum(d, n, dt, s);
                                       }));
      }
    }
    // Over the limits: refused, not truncated.
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer big, cuda::DeviceBuffer::Create((1 << 20) + 64));
    absl::Status st = ar->AllReduceSum(big.get(), ((1 << 20) + 64) / 4, DType::kF32, stream.get());
    CHECK_OR_RETURN(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = ar->AllReduceSumWith(Protocol::kLL, big.get(), (ar->ll_max_bytes() + 4) / 4, DType::kF32,
                              stream.get());
    CHECK_OR_RETURN(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = ar->AllReduceSumWith(Protocol::kLL128, big.get(), (ar->ll128_max_bytes() + 4) / 4,
                              DType::kF32, stream.get());
    CHECK_OR_RETURN(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    SYMTP_RETURN_IF_ERROR(piped->Poll());
    return ar->Poll();
  });
}

// The runtime's capacities (8 MiB: decode's row-parallel messages up to batch
// 512 of a 4096-wide model in bf16, 1024 of a 2048-wide one; 16 MiB at TP 4:
// prefill's 2048-row messages and exchange chunks): the LL128, staged and
// two-shot protocols, bitwise against the fixed-order reference.
TEST_F(AllReduceGpuTest, CustomMatchesReferenceBitwiseUpToSixteenMiB) {
  RunOnEveryTp(300'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.ll128_max_bytes = 16 << 20;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 16 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    for (DType t : kAllTypes) {
      const size_t es = DTypeSize(t);
      for (size_t count : {(size_t{2} << 20) / es + 3, (size_t{4} << 20) / es,
                           (size_t{8} << 20) / es - 1, (size_t{16} << 20) / es}) {
        for (Protocol p : {Protocol::kLL128, Protocol::kStaged, Protocol::kTwoShot}) {
          SYMTP_RETURN_IF_ERROR(
              CheckOne(rank, size, ex, stream.get(), t, count, 0, /*exact=*/true,
                       Name(t, count,
                            absl::StrCat("custom-", CustomAllReduce::ProtocolName(p)).c_str()),
                       [&](void* d, size_t n, DType dt, cudaStream_t s) {
                         return ar->AllReduceSumWith(p, d, n, dt, s);
                       }));
        }
      }
    }
    return ar->Poll();
  });
}

// The all-reduce fused with the residual add and RMSNorm after it
// (AllReduceResidualNorm), through every protocol, one and several rows per
// block (at TP 2 under LL128 also in row pairs, one pair and several per
// block, an odd row last), one and two 16-byte units per thread: the new
// residual equals the host's T(residual + reference sum) bit for bit; the
// normalized output equals the two-kernel path (AllReduceSum, then
// AddRmsNorm) bit for bit and a double-precision host RMSNorm within a few
// roundings; identical on every rank. Fused and plain calls interleave on one instance. Three times: with
// LL128 for every fused size (rows that start and end inside 120-byte
// lines), with LL up to 1 MiB for both (many rows per LL call) and LL128
// above, and without LL128 (staged above the LL limits).
TEST_F(AllReduceGpuTest, FusedResidualNormMatchesTwoKernelPathAndReference) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    for (const int mode : {0, 1, 2}) {
      const bool wide_ll = mode == 1;
      CustomAllReduce::Options opt;
      if (mode == 0) opt.ll_max_bytes = opt.fused_ll_max_bytes = 0;
      if (wide_ll) opt.ll_max_bytes = opt.fused_ll_max_bytes = size_t{1} << 20;
      opt.ll128_max_bytes = mode == 2 ? 0 : size_t{8} << 20;
      opt.two_shot_min_bytes = 0;  // the fused kernels' STAGED form at every size
      SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 8 << 20, &ex,
                                                              Deadline::AfterMs(kSetupMs), opt));
      SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
      const cudaStream_t s = stream.get();
      constexpr float kEps = 1e-5f;
      struct Shape {
        DType t;
        int64_t rows;
        int hidden;
      };
      const Shape shapes[] = {
          {DType::kBF16, 1, 4096},   {DType::kBF16, 7, 4104},   {DType::kBF16, 12, 4096},
          {DType::kBF16, 32, 4096},  {DType::kBF16, 200, 4096}, {DType::kBF16, 3, 12288},
          {DType::kBF16, 70, 12288}, {DType::kF32, 3, 4096},    {DType::kF32, 100, 4096},
          {DType::kF32, 5, 8192},    {DType::kBF16, 513, 4096}, {DType::kF32, 301, 2048},
      };
      for (const Shape& sh : shapes) {
        const size_t n = static_cast<size_t>(sh.rows) * sh.hidden;
        const size_t bytes = n * DTypeSize(sh.t);
        const std::string what =
            absl::StrCat("fused ", DTypeName(sh.t), " ", sh.rows, "x", sh.hidden, " ",
                         CustomAllReduce::ProtocolName(ar->FusedProtocolFor(bytes)),
                         wide_ll ? " (LL limits 1 MiB)" : "");
        const uint64_t seed = SeedOf(sh.t, n, 99);
        SYMTP_ASSIGN_OR_RETURN(const NormPair pair,
                               UploadNormPair(sh.t, sh.rows, sh.hidden, seed, rank, s));
        const kt::HostArray& residual = pair.residual;
        const kt::HostArray& weight = pair.weight;
        const std::vector<cuda::DeviceBuffer>& b = pair.b;
        // b: data1 res1 out1 (fused) | data2 res2 out2 (two kernels) | weight
        const ResidualNorm fused{b[1].get(), b[6].get(), b[2].get(), sh.rows, sh.hidden, kEps};
        CHECK_OR_RETURN(ar->FusesResidualNorm(fused, sh.t), what, ": not fusable");
        SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceResidualNorm(b[0].get(), fused, sh.t, s), what);
        SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceSum(b[3].get(), n, sh.t, s), what);
        SYMTP_RETURN_IF_ERROR_CTX(AddRmsNorm(b[4].get(), b[3].get(), b[6].get(), b[5].get(),
                                             sh.rows, sh.hidden, kEps, sh.t, s),
                                  what);
        SYMTP_RETURN_IF_ERROR_CTX(SyncStream(s, Deadline::AfterMs(30'000)), what);
        SYMTP_RETURN_IF_ERROR(ar->Poll());
        SYMTP_ASSIGN_OR_RETURN(const std::vector<kt::HostArray> got, DownloadNormPair(pair));
        const kt::HostArray sum = kt::ReferenceSum(sh.t, n, seed, size);
        size_t res_wrong = 0, out_diff = 0, out_far = 0;
        for (int64_t r = 0; r < sh.rows; ++r) {
          double ss = 0;
          std::vector<float> x(sh.hidden);
          for (int i = 0; i < sh.hidden; ++i) {
            const size_t k = r * sh.hidden + i;
            const uint32_t want = kt::FromF32(sh.t, kt::ToF32(sh.t, residual.bits(k)) + sum.at(k));
            res_wrong += got[0].bits(k) != want || got[2].bits(k) != want;
            x[i] = kt::ToF32(sh.t, want);
            ss += static_cast<double>(x[i]) * x[i];
          }
          const double inv = 1.0 / std::sqrt(ss / sh.hidden + kEps);
          for (int i = 0; i < sh.hidden; ++i) {
            const size_t k = r * sh.hidden + i;
            out_diff += got[1].bits(k) != got[3].bits(k);
            const double ref = x[i] * inv * weight.at(i);
            const double tol = (sh.t == DType::kF32 ? 1e-5 : 1.6e-2) * (std::fabs(ref) + 1e-3);
            out_far += std::fabs(got[1].at(k) - ref) > tol;
          }
        }
        CHECK_OR_RETURN(res_wrong == 0, what, ": ", res_wrong, " residual elements wrong");
        CHECK_OR_RETURN(out_diff == 0, what, ": ", out_diff,
                        " outputs differ from the two-kernel path");
        CHECK_OR_RETURN(out_far == 0, what, ": ", out_far, " outputs off the host RMSNorm");
        SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, kt::HashOf(got[1]), what));
      }
      // Shapes it does not take: f16, a row past two units per thread, a
      // message past the capacity.
      const ResidualNorm wide{nullptr, nullptr, nullptr, 1, 16392, kEps};
      CHECK_OR_RETURN(!ar->FusesResidualNorm(wide, DType::kBF16), "16392 wide fused");
      const ResidualNorm half{nullptr, nullptr, nullptr, 1, 4096, kEps};
      CHECK_OR_RETURN(!ar->FusesResidualNorm(half, DType::kF16), "f16 fused");
      const ResidualNorm big{nullptr, nullptr, nullptr, 1025, 4096, kEps};
      CHECK_OR_RETURN(!ar->FusesResidualNorm(big, DType::kBF16), "8 MiB + 8 KiB fused");
      SYMTP_RETURN_IF_ERROR(ar->Poll());
    }
    return absl::OkStatus();
  });
}

// The copy exchange (CopySend on a side stream, CopyReceiveResidualNorm on
// the main stream, event edges both ways) over row chunks of one message
// gives bitwise the fused all-reduce + residual + RMSNorm of the whole
// message: new residual and normalized output, bf16 and f32, two steps in a
// row (each advancing the epoch, the flags reused) with other data each
// step, identical on every rank; a flag or range outside the exchange is
// refused.
TEST_F(AllReduceGpuTest, CopyExchangeMatchesFusedResidualNorm) {
  RunOnEveryTp(120'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.copy_bytes = size_t{4} << 20;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 8 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream main_stream, cuda::Stream::Create());
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream side_stream, cuda::Stream::Create());
    const cudaStream_t s = main_stream.get(), side = side_stream.get();
    constexpr float kEps = 1e-5f;
    struct Shape {
      DType t;
      int64_t rows;
      int hidden;
      int chunks;
    };
    // Under 1 MiB: at TP 4 and 8 larger messages go two-shot, which the
    // fused reference does not take.
    const Shape shapes[] = {{DType::kBF16, 120, 4096, 4}, {DType::kBF16, 100, 4104, 3},
                            {DType::kF32, 60, 4096, 2}};
    for (const Shape& sh : shapes) {
      for (int step = 0; step < 2; ++step) {
        const size_t n = static_cast<size_t>(sh.rows) * sh.hidden;
        const size_t row_bytes = static_cast<size_t>(sh.hidden) * DTypeSize(sh.t);
        const std::string what = absl::StrCat("copy exchange ", DTypeName(sh.t), " ", sh.rows,
                                              "x", sh.hidden, " in ", sh.chunks, " chunks, step ",
                                              step);
        const uint64_t seed = SeedOf(sh.t, n, 123 + step);
        SYMTP_ASSIGN_OR_RETURN(const NormPair pair,
                               UploadNormPair(sh.t, sh.rows, sh.hidden, seed, rank, s));
        const kt::HostArray& residual = pair.residual;
        const std::vector<cuda::DeviceBuffer>& b = pair.b;
        // b: data1 res1 out1 (copy exchange) | data2 res2 out2 (fused) | weight
        SYMTP_RETURN_IF_ERROR_CTX(ar->CopyBeginStep(s), what);
        const int64_t per = (sh.rows + sh.chunks - 1) / sh.chunks;
        std::vector<cuda::Event> ready, sent;
        for (int c = 0; c < sh.chunks; ++c) {
          SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create());
          SYMTP_ASSIGN_OR_RETURN(cuda::Event e2, cuda::Event::Create());
          ready.push_back(std::move(e1));
          sent.push_back(std::move(e2));
        }
        auto off = [&](int c) { return static_cast<size_t>(c) * per * row_bytes; };
        auto rows_of = [&](int c) { return std::min<int64_t>(per, sh.rows - c * per); };
        const int op = step;  // both ops' slots
        for (int c = 0; c < sh.chunks; ++c) {
          CUDA_RETURN_IF_ERROR(cudaEventRecord(ready[c].get(), s));
          CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, ready[c].get(), 0));
          SYMTP_RETURN_IF_ERROR_CTX(
              ar->CopySend(static_cast<char*>(b[0].get()) + off(c), off(c), rows_of(c) * row_bytes,
                           op, 5 + c, side),
              what);
          CUDA_RETURN_IF_ERROR(cudaEventRecord(sent[c].get(), side));
        }
        for (int c = sh.chunks - 1; c >= 0; --c) {  // any order of receives
          CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, sent[c].get(), 0));
          const ResidualNorm norm{static_cast<char*>(b[1].get()) + off(c), b[6].get(),
                                  static_cast<char*>(b[2].get()) + off(c), rows_of(c), sh.hidden,
                                  kEps};
          SYMTP_RETURN_IF_ERROR_CTX(
              ar->CopyReceiveResidualNorm(static_cast<char*>(b[0].get()) + off(c), c * per, op,
                                          5 + c, norm, sh.t, s),
              what);
        }
        const ResidualNorm fused{b[4].get(), b[6].get(), b[5].get(), sh.rows, sh.hidden, kEps};
        SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceResidualNorm(b[3].get(), fused, sh.t, s), what);
        SYMTP_RETURN_IF_ERROR_CTX(SyncStream(s, Deadline::AfterMs(30'000)), what);
        SYMTP_RETURN_IF_ERROR(ar->Poll());
        SYMTP_ASSIGN_OR_RETURN(const std::vector<kt::HostArray> got, DownloadNormPair(pair));
        const kt::HostArray sum = kt::ReferenceSum(sh.t, n, seed, size);
        size_t res_wrong = 0, diff = 0;
        for (size_t k = 0; k < n; ++k) {
          const uint32_t want = kt::FromF32(sh.t, kt::ToF32(sh.t, residual.bits(k)) + sum.at(k));
          res_wrong += got[0].bits(k) != want;
          diff += got[0].bits(k) != got[2].bits(k) || got[1].bits(k) != got[3].bits(k);
        }
        CHECK_OR_RETURN(res_wrong == 0, what, ": ", res_wrong, " residual elements wrong");
        CHECK_OR_RETURN(diff == 0, what, ": ", diff, " elements differ from the fused kernel's");
        SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, kt::HashOf(got[1]), what));
      }
    }
    // Outside the exchange: a flag past kCopyFlags, a range past copy_bytes, op 2.
    char* p = nullptr;
    CHECK_OR_RETURN(!ar->CopySend(p, 0, 16, 0, kCopyExchangeFlags, s).ok(), "flag past the end");
    CHECK_OR_RETURN(!ar->CopySend(p, ar->copy_bytes() - 16, 32, 0, 0, s).ok(), "range past the end");
    CHECK_OR_RETURN(!ar->CopySend(p, 0, 16, 2, 0, s).ok(), "op 2");
    return ar->Poll();
  });
}

// A row-parallel GEMV that sends its output to the peers as LL lines
// (GemvPush) followed by the fused all-reduce + RMSNorm that only receives
// (norm.pushed) gives bitwise what Gemv followed by the fused call gives, at
// 1-4 rows and the llama-8b TP row-parallel shapes, twice in a row and
// interleaved with plain calls on the same instance (LL, and LL128 at TP 2:
// the epoch the GEMV reads is the one the receive expects), identical on
// every rank.
TEST_F(AllReduceGpuTest, GemvPushThenFusedReceiveMatchesGemvThenFused) {
  RunOnEveryTp(120'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 8 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), {}));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    const cudaStream_t s = stream.get();
    constexpr float kEps = 1e-5f;
    constexpr int kHidden = 4096;
    for (const int k : {2048, 4096, 7168}) {
      for (int rows = 1; rows <= 4; ++rows) {
        const std::string what = absl::StrCat("GemvPush ", rows, "x", kHidden, " k ", k);
        const size_t n = static_cast<size_t>(rows) * kHidden;
        const uint64_t seed = SeedOf(DType::kBF16, n + k, 7);
        const kt::HostArray a = kt::RandomInput(DType::kBF16, static_cast<size_t>(rows) * k, seed,
                                                rank);
        const kt::HostArray w =
            kt::RandomInput(DType::kBF16, static_cast<size_t>(kHidden) * k, seed + 1, rank);
        const kt::HostArray residual = kt::RandomInput(DType::kBF16, n, seed + 2, 0);
        const kt::HostArray weight = kt::RandomInput(DType::kBF16, kHidden, seed + 3, 0);
        // b: a w | c1 res1 out1 (Gemv, fused) | c2 res2 out2 (GemvPush, pushed) | weight | plain
        std::vector<cuda::DeviceBuffer> b;
        for (size_t bytes : {a.bytes(), w.bytes(), 2 * n, 2 * n, 2 * n, 2 * n, 2 * n, 2 * n,
                             weight.bytes(), size_t{256} << 10}) {
          SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d, cuda::DeviceBuffer::Create(bytes));
          b.push_back(std::move(d));
        }
        CUDA_RETURN_IF_ERROR(cudaMemcpy(b[0].get(), a.data(), a.bytes(), cudaMemcpyHostToDevice));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(b[1].get(), w.data(), w.bytes(), cudaMemcpyHostToDevice));
        CUDA_RETURN_IF_ERROR(
            cudaMemcpy(b[8].get(), weight.data(), weight.bytes(), cudaMemcpyHostToDevice));
        CUDA_RETURN_IF_ERROR(cudaMemset(b[9].get(), 0, size_t{256} << 10));
        for (int k2 : {3, 6}) {
          CUDA_RETURN_IF_ERROR(
              cudaMemcpy(b[k2].get(), residual.data(), 2 * n, cudaMemcpyHostToDevice));
        }
        const GemmArgs g1 =
            ContiguousGemmArgs(b[0].get(), b[1].get(), b[2].get(), rows, kHidden, k,
                               DType::kBF16, nullptr, 0);
        GemmArgs g2 = g1;
        g2.c = b[5].get();
        const ResidualNorm norm1{b[3].get(), b[8].get(), b[4].get(), rows, kHidden, kEps};
        ResidualNorm norm2{b[6].get(), b[8].get(), b[7].get(), rows, kHidden, kEps};
        LLPush push;
        CHECK_OR_RETURN(ar->ProducerPush(norm2, DType::kBF16, &push), what, ": no push");
        norm2.pushed = true;
        for (int rep = 0; rep < 2; ++rep) {
          SYMTP_RETURN_IF_ERROR_CTX(Gemv(g1, s), what);
          SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceResidualNorm(b[2].get(), norm1, DType::kBF16, s),
                                    what);
          SYMTP_RETURN_IF_ERROR_CTX(GemvPush(g2, push, s), what);
          SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceResidualNorm(b[5].get(), norm2, DType::kBF16, s),
                                    what);
          // Plain calls between: LL (the pushed lines' counters) and the
          // protocol the instance picks for 128 KiB (LL128 at TP 2).
          SYMTP_RETURN_IF_ERROR_CTX(
              ar->AllReduceSumWith(Protocol::kLL, b[9].get(), 2048, DType::kBF16, s), what);
          SYMTP_RETURN_IF_ERROR_CTX(ar->AllReduceSum(b[9].get(), 65536, DType::kBF16, s), what);
        }
        SYMTP_RETURN_IF_ERROR_CTX(SyncStream(s, Deadline::AfterMs(30'000)), what);
        SYMTP_RETURN_IF_ERROR(ar->Poll());
        std::vector<kt::HostArray> got;
        for (int k2 : {2, 3, 4, 5, 6, 7}) {
          kt::HostArray h(DType::kBF16, n);
          CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), b[k2].get(), 2 * n, cudaMemcpyDeviceToHost));
          got.push_back(std::move(h));
        }
        size_t diff = 0, changed = 0;
        for (size_t i = 0; i < n; ++i) {
          for (int j = 0; j < 3; ++j) diff += got[j].bits(i) != got[j + 3].bits(i);
          changed += got[1].bits(i) != residual.bits(i);
        }
        CHECK_OR_RETURN(diff == 0, what, ": ", diff, " elements differ from Gemv + fused");
        CHECK_OR_RETURN(changed > n / 2, what, ": the residual barely changed (", changed, ")");
        SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, kt::HashOf(got[5]), what));
      }
    }
    // A shape the push does not take: fp32.
    const ResidualNorm f32{nullptr, nullptr, nullptr, 1, kHidden, kEps};
    LLPush unused;
    CHECK_OR_RETURN(!ar->ProducerPush(f32, DType::kF32, &unused), "fp32 push");
    return ar->Poll();
  });
}

// The model at TP = 2, bf16, CUDA graphs, prefill then decode steps of 3
// rows (the row-parallel GEMMs on Gemv, the all-reduces fused with the
// RMSNorm on LL): with gemv_allreduce_push the GEMVs send their outputs and
// the fused kernels only receive, and every step's logits are bitwise those
// of the model without it, on both ranks.
TEST_F(AllReduceGpuTest, ModelWithGemvPushMatchesWithoutBf16) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    if (size != 2) return absl::OkStatus();  // the tiny model has 2 KV heads
    constexpr int kSteps = 10, kBlocks = 128;
    const model::ModelConfig cfg = *model::PresetConfig("tiny");
    std::vector<uint64_t> hashes[2];
    for (const bool push : {false, true}) {
      SYMTP_ASSIGN_OR_RETURN(auto nccl, MakeNccl(rank, size, ex));
      AllReduceDispatcher::Options dopt;
      dopt.calibrate = false;
      SYMTP_ASSIGN_OR_RETURN(auto comm, AllReduceDispatcher::Create(rank, size, rank, std::move(nccl),
                                                                    &ex, Deadline::AfterMs(kSetupMs), dopt));
      // The shapes the decode steps give the push: 3 rows of the hidden size.
      const ResidualNorm probe{nullptr, nullptr, nullptr, 3, cfg.hidden, cfg.rms_eps};
      LLPush unused;
      CHECK_OR_RETURN(comm->ProducerPush(probe, DType::kBF16, &unused), "no push for 3 rows");
      SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
      model::GpuModelOptions o = TinyModelOptions(DType::kBF16, kBlocks);
      o.gemv_allreduce_push = push;
      SYMTP_ASSIGN_OR_RETURN(model::GpuModel m,
                             model::GpuModel::Create(cfg, rank, size, rank, o, comm.get()));
      testing::SimBatch sim(cfg, kBlocks, 23);
      for (int p : {9, 33, 17}) sim.AddSequence(p, cfg.vocab);
      for (int step = 0; step < kSteps; ++step) {
        std::vector<int> rows;
        SYMTP_ASSIGN_OR_RETURN(model::BatchInput batch, sim.NextStep(64, &rows));
        model::StepOptions so;
        so.sampling.assign(batch.sample_index.size(), model::SamplingParams{});
        SYMTP_RETURN_IF_ERROR(m.Forward(batch, stream.get(), so));
        SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
        const absl::Span<const float> got = m.host_logits();
        uint64_t hash = 0;
        for (size_t i = 0; i < got.size(); ++i) hash += kt::ElementHash(i, kt::F32ToBits(got[i]));
        hashes[push].push_back(hash);
        SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, hash, absl::StrCat("step ", step, " logits")));
        const absl::Span<const int32_t> toks = m.host_tokens();
        sim.Commit(rows, std::vector<int32_t>(toks.begin(), toks.end()));
      }
      SYMTP_RETURN_IF_ERROR(comm->Poll());
    }
    for (int step = 0; step < kSteps; ++step) {
      CHECK_OR_RETURN(hashes[0][step] == hashes[1][step], "step ", step,
                      ": logits with the GEMV's push differ from those without");
    }
    return absl::OkStatus();
  });
}

// The model at TP = 2 on the dispatcher (custom all-reduce with the fused
// residual + RMSNorm, NCCL behind it; then with the two-shot all-reduce and
// AddRmsNorm; then the 66-row prefill in two row chunks over the exchange,
// by the copy engines and by the all-reduce on a side stream), fp32, CUDA
// graphs, prefill then greedy decode: both ranks' logits are bitwise equal,
// the tokens equal the CPU model's at TP = 1 and the logits are within 1e-4
// of them.
TEST_F(AllReduceGpuTest, ModelWithFusedNormMatchesCpuTp1) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    if (size != 2) return absl::OkStatus();  // the tiny model has 2 KV heads
    constexpr int kSteps = 8, kBlocks = 128;
    const model::ModelConfig cfg = *model::PresetConfig("tiny");
    for (int variant = 0; variant < 4; ++variant) {
      const bool two_shot = variant == 1, exchange = variant >= 2;
      SYMTP_ASSIGN_OR_RETURN(auto nccl, MakeNccl(rank, size, ex));
      AllReduceDispatcher::Options dopt;
      dopt.calibrate = false;
      dopt.max_custom_bytes = dopt.crossover_bytes = 8 << 20;
      if (variant == 2) dopt.custom.copy_bytes = 128 * static_cast<size_t>(cfg.hidden) * 4;
      if (two_shot) {  // every message of a row or more two-shot, then AddRmsNorm
        dopt.custom.ll_max_bytes = 512;
        dopt.custom.ll128_max_bytes = 0;
        dopt.custom.two_shot_min_bytes = 1;
      }
      SYMTP_ASSIGN_OR_RETURN(auto comm, AllReduceDispatcher::Create(rank, size, rank, std::move(nccl),
                                                                    &ex, Deadline::AfterMs(kSetupMs), dopt));
      const ResidualNorm probe{nullptr, nullptr, nullptr, 64, cfg.hidden, cfg.rms_eps};
      CHECK_OR_RETURN(comm->FusesResidualNorm(probe, DType::kF32) == !two_shot,
                      "the dispatcher fuses where the all-reduce is two-shot, or not elsewhere");
      // Above max_fused_bytes (still on the custom path) it runs two kernels.
      const int64_t past = static_cast<int64_t>(dopt.max_fused_bytes / (cfg.hidden * 4)) + 1;
      const ResidualNorm large{nullptr, nullptr, nullptr, past, cfg.hidden, cfg.rms_eps};
      CHECK_OR_RETURN(comm->PathFor(past * cfg.hidden, DType::kF32) == AllReduceDispatcher::Path::kCustom,
                      "the large message left the custom path");
      CHECK_OR_RETURN(!comm->FusesResidualNorm(large, DType::kF32), "fused above max_fused_bytes");
      if (variant == 0) {
        // Past max_fused_staged_bytes it fuses where the fused kernel runs
        // LL128 (TP 2's default), not where it would run STAGED.
        const int64_t rows2 =
            static_cast<int64_t>(2 * dopt.max_fused_staged_bytes / (cfg.hidden * 4));
        const ResidualNorm mid{nullptr, nullptr, nullptr, rows2, cfg.hidden, cfg.rms_eps};
        CHECK_OR_RETURN(comm->FusesResidualNorm(mid, DType::kF32), "not fused on LL128 at ",
                        rows2, " rows");
        AllReduceDispatcher::Options sopt = dopt;
        sopt.custom.ll128_max_bytes = 0;
        SYMTP_ASSIGN_OR_RETURN(auto nccl2, MakeNccl(rank, size, ex));
        SYMTP_ASSIGN_OR_RETURN(
            auto staged, AllReduceDispatcher::Create(rank, size, rank, std::move(nccl2), &ex,
                                                     Deadline::AfterMs(kSetupMs), sopt));
        CHECK_OR_RETURN(staged->FusesResidualNorm(probe, DType::kF32),
                        "not fused on STAGED at 64 rows");
        CHECK_OR_RETURN(!staged->FusesResidualNorm(mid, DType::kF32), "fused on STAGED at ",
                        rows2, " rows");
      }
      SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
      model::GpuModelOptions o = TinyModelOptions(DType::kF32, kBlocks);
      o.exchange_min_rows = exchange ? 32 : 0;
      o.exchange_transport =
          variant == 3 ? model::ExchangeTransport::kAllReduce : model::ExchangeTransport::kCopy;
      const int budget = exchange ? 128 : 64;  // the exchange's prefill: all 66 prompt tokens
      SYMTP_ASSIGN_OR_RETURN(model::GpuModel m,
                             model::GpuModel::Create(cfg, rank, size, rank, o, comm.get()));
      SYMTP_ASSIGN_OR_RETURN(model::CpuModel cpu, model::CpuModel::Create(cfg, 0, 1, kBlocks, nullptr));
      testing::SimBatch sim(cfg, kBlocks, 21), sim_cpu(cfg, kBlocks, 21);
      for (int p : {7, 40, 19}) {
        sim.AddSequence(p, cfg.vocab);
        sim_cpu.AddSequence(p, cfg.vocab);
      }
      for (int step = 0; step < kSteps; ++step) {
        std::vector<int> rows, rows_cpu;
        SYMTP_ASSIGN_OR_RETURN(model::BatchInput batch, sim.NextStep(budget, &rows));
        SYMTP_ASSIGN_OR_RETURN(model::BatchInput batch_cpu, sim_cpu.NextStep(budget, &rows_cpu));
        CHECK_OR_RETURN(!exchange || step > 0 || batch.tokens.size() == 66,
                        "the exchange's prefill has ", batch.tokens.size(), " rows, want 66");
        model::StepOptions so;
        so.sampling.assign(batch.sample_index.size(), model::SamplingParams{});
        SYMTP_RETURN_IF_ERROR(m.Forward(batch, stream.get(), so));
        SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
        std::vector<float> want;
        SYMTP_RETURN_IF_ERROR(cpu.Forward(batch_cpu, &want));
        const absl::Span<const float> got = m.host_logits();
        CHECK_OR_RETURN(got.size() == want.size(), "step ", step, ": ", got.size(), " logits, want ",
                        want.size());
        uint64_t hash = 0;
        size_t far = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          hash += kt::ElementHash(i, kt::F32ToBits(got[i]));
          far += std::fabs(got[i] - want[i]) > 1e-4 * (std::fabs(want[i]) + 1.0);
        }
        CHECK_OR_RETURN(far == 0, "step ", step, ": ", far, " logits off the CPU's");
        SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, hash, absl::StrCat("step ", step, " logits")));
        std::vector<int32_t> next(batch_cpu.sample_index.size());
        for (size_t i = 0; i < next.size(); ++i) {
          next[i] = model::ArgMax(absl::MakeConstSpan(want.data() + i * cfg.vocab, cfg.vocab));
        }
        const absl::Span<const int32_t> toks = m.host_tokens();
        CHECK_OR_RETURN(std::vector<int32_t>(toks.begin(), toks.end()) == next, "step ", step,
                        ": tokens differ from the CPU's");
        sim.Commit(rows, next);
        sim_cpu.Commit(rows_cpu, next);
      }
      SYMTP_RETURN_IF_ERROR(comm->Poll());
      CHECK_OR_RETURN((m.graph_stats().exchange_steps > 0) == exchange, "variant ", variant, ": ",
                      m.graph_stats().exchange_steps, " steps over the exchange");
    }
    return absl::OkStatus();
  });
}

TEST_F(AllReduceGpuTest, TenThousandGraphReplaysWithChangingInputs) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    constexpr int kReplays = 10'000;
    struct Item {
      DType t;
      size_t count;
      uint64_t seed_base;
    };
    // Through LL (8 KiB), the staged protocol (160 KB), LL128 (100 KB) and
    // the two-shot protocol (600 KB; odd count).
    constexpr size_t kItems = 4;
    const Item items[kItems] = {{DType::kBF16, 4097, 1'000'000},
                                {DType::kF32, 40'000, 2'000'000},
                                {DType::kBF16, 50'000, 3'000'000},
                                {DType::kBF16, 300'001, 4'000'000}};
    CustomAllReduce::Options opt;
    opt.ll_max_bytes = 64 << 10;
    opt.ll128_max_bytes = 128 << 10;
    opt.two_shot_min_bytes = 512 << 10;
    opt.two_shot_pipeline_min_bytes = 512 << 10;  // its pipelined schedule, 8 KiB chunks
    opt.two_shot_chunk_bytes = 8 << 10;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    const Protocol want[kItems] = {Protocol::kLL, Protocol::kStaged, Protocol::kLL128,
                                   Protocol::kTwoShot};
    for (size_t k = 0; k < kItems; ++k) {
      CHECK_OR_RETURN(ar->ProtocolFor(items[k].count * DTypeSize(items[k].t)) == want[k], "item ",
                      k, " does not take the protocol it is meant to test");
    }
    // Where the plain all-reduce is two-shot the fused kernel is not offered
    // (the caller runs the all-reduce, then AddRmsNorm); below, it is.
    const ResidualNorm two_shot_rows{nullptr, nullptr, nullptr, 80, 4096, 1e-5f};
    CHECK_OR_RETURN(!ar->FusesResidualNorm(two_shot_rows, DType::kBF16), "640 KiB fused");
    ResidualNorm staged_rows = two_shot_rows;
    staged_rows.rows = 20;
    CHECK_OR_RETURN(ar->FusesResidualNorm(staged_rows, DType::kBF16), "160 KiB not fused");
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer counter, cuda::DeviceBuffer::Create(8));
    CUDA_RETURN_IF_ERROR(cudaMemset(counter.get(), 0, 8));
    std::vector<cuda::DeviceBuffer> data, hashes;
    for (const Item& it : items) {
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d, cuda::DeviceBuffer::Create(it.count * DTypeSize(it.t)));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer h, cuda::DeviceBuffer::Create(kReplays * 8));
      CUDA_RETURN_IF_ERROR(cudaMemset(h.get(), 0, h.bytes()));
      data.push_back(std::move(d));
      hashes.push_back(std::move(h));
    }
    SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
    auto* ctr = counter.as<unsigned long long>();
    absl::StatusOr<cuda::GraphExec> exec =
        cuda::GraphExec::Capture(stream.get(), [&]() -> absl::Status {
          for (size_t k = 0; k < kItems; ++k) {
            const Item& it = items[k];
            CUDA_RETURN_IF_ERROR(kt::LaunchGenerate(data[k].get(), it.count, it.t, it.seed_base,
                                                    rank, ctr, stream.get()));
            SYMTP_RETURN_IF_ERROR(ar->AllReduceSum(data[k].get(), it.count, it.t, stream.get()));
            CUDA_RETURN_IF_ERROR(kt::LaunchHash(data[k].get(), it.count, it.t, ctr,
                                                hashes[k].as<unsigned long long>(), stream.get()));
          }
          CUDA_RETURN_IF_ERROR(kt::LaunchAdvance(ctr, stream.get()));
          return absl::OkStatus();
        });
    SYMTP_RETURN_IF_ERROR(exec.status());
    for (int k = 0; k < kReplays; ++k) {
      SYMTP_RETURN_IF_ERROR(exec->Launch(stream.get()));
      if (k % 1000 == 999) {
        SYMTP_RETURN_IF_ERROR(SyncStream(stream.get(), Deadline::AfterMs(60'000)));
        SYMTP_RETURN_IF_ERROR(ar->Poll());
      }
    }
    SYMTP_RETURN_IF_ERROR(SyncStream(stream.get(), Deadline::AfterMs(60'000)));
    SYMTP_RETURN_IF_ERROR(ar->Poll());
    for (size_t k = 0; k < kItems; ++k) {
      std::vector<uint64_t> got(kReplays);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), hashes[k].get(), kReplays * 8, cudaMemcpyDeviceToHost));
      size_t bad = 0, first_bad = 0;
      uint64_t all = 0;
      for (int r = 0; r < kReplays; ++r) {
        const uint64_t want =
            kt::HashOf(kt::ReferenceSum(items[k].t, items[k].count, items[k].seed_base + r, size));
        if (got[r] != want && bad++ == 0) first_bad = r;
        all = kt::Mix64(all ^ got[r]);
      }
      CHECK_OR_RETURN(bad == 0, bad, " of ", kReplays, " replays of item ", k,
                      " differ from the reference; first: replay ", first_bad);
      SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, all, absl::StrCat("replay hashes of item ", k)));
    }
    return absl::OkStatus();
  });
}

TEST_F(AllReduceGpuTest, EpochCountersWrapAround) {
  RunOnEveryTp(120'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.initial_epoch = 0xffffffffu - 40;  // every protocol crosses 2^32 below
    opt.ll128_max_bytes = 1 << 20;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    for (int call = 0; call < 200; ++call) {
      const Protocol p = call % 4 == 0   ? Protocol::kLL
                         : call % 4 == 1 ? Protocol::kStaged
                         : call % 4 == 2 ? Protocol::kLL128
                                         : Protocol::kTwoShot;
      const DType t = kAllTypes[call % 3];
      const size_t count = 1 + static_cast<size_t>(call) * 97 % 15'000;  // within LL's 64 KiB
      SYMTP_RETURN_IF_ERROR(CheckOne(rank, size, ex, stream.get(), t, count, 0, true,
                                     absl::StrCat("call ", call, " ", Name(t, count, "custom")),
                                     [&](void* d, size_t n, DType dt, cudaStream_t s) {
                                       return ar->AllReduceSumWith(p, d, n, dt, s);
                                     }));
    }
    return ar->Poll();
  });
}

// Back-to-back calls with no host synchronisation: one instance on one stream
// (the reuse argument: double-buffering by epoch parity) and, supported, two
// instances in flight at once on two streams.
TEST_F(AllReduceGpuTest, BackToBackCallsAndInstancesOnConcurrentStreams) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    struct Shape {
      DType t;
      size_t count;
    };
    const Shape shapes[] = {{DType::kBF16, 1023}, {DType::kF32, 40'000}, {DType::kF16, 4097},
                            {DType::kBF16, 200'000}, {DType::kF32, 3}};
    constexpr int kInstances = 2;
    constexpr int kCallsPerInstance = 150;
    std::unique_ptr<CustomAllReduce> ars[kInstances];
    cuda::Stream streams[kInstances];
    // LL up to 64 KiB, LL128 up to 256 KiB, staged above: every protocol.
    CustomAllReduce::Options opt;
    opt.ll_max_bytes = 64 << 10;
    opt.ll128_max_bytes = 256 << 10;
    for (int i = 0; i < kInstances; ++i) {
      SYMTP_ASSIGN_OR_RETURN(ars[i], CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                             Deadline::AfterMs(kSetupMs), opt));
      SYMTP_ASSIGN_OR_RETURN(streams[i], cuda::Stream::Create());
    }
    struct Call {
      int instance;
      Shape shape;
      uint64_t seed;
      cuda::DeviceBuffer buf;
    };
    std::vector<Call> calls;
    for (int c = 0; c < kCallsPerInstance; ++c) {
      for (int i = 0; i < kInstances; ++i) {
        Call call{i, shapes[(c + 2 * i) % 5], kt::Mix64(c * 31 + i), {}};
        const kt::HostArray in = kt::RandomInput(call.shape.t, call.shape.count, call.seed, rank);
        SYMTP_ASSIGN_OR_RETURN(call.buf, cuda::DeviceBuffer::Create(in.bytes()));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(call.buf.get(), in.data(), in.bytes(), cudaMemcpyHostToDevice));
        calls.push_back(std::move(call));
      }
    }
    SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
    SYMTP_RETURN_IF_ERROR(ex.Barrier(Deadline::AfterMs(kSetupMs)));
    for (Call& c : calls) {  // issue order A0 B0 A1 B1 ...; no host sync in between
      SYMTP_RETURN_IF_ERROR(ars[c.instance]->AllReduceSum(c.buf.get(), c.shape.count, c.shape.t,
                                                          streams[c.instance].get()));
    }
    for (int i = 0; i < kInstances; ++i) {
      SYMTP_RETURN_IF_ERROR(SyncStream(streams[i].get(), Deadline::AfterMs(60'000)));
      SYMTP_RETURN_IF_ERROR(ars[i]->Poll());
    }
    uint64_t digest = 0;
    for (size_t k = 0; k < calls.size(); ++k) {
      const Call& c = calls[k];
      kt::HostArray got(c.shape.t, c.shape.count);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), c.buf.get(), got.bytes(), cudaMemcpyDeviceToHost));
      const kt::HostArray ref = kt::ReferenceSum(c.shape.t, c.shape.count, c.seed, size);
      const size_t wrong = kt::CountWrong(got, ref, 0.0);
      CHECK_OR_RETURN(wrong == 0, "call ", k, " (instance ", c.instance, ", ",
                      Name(c.shape.t, c.shape.count, "custom"), "): ", wrong, " wrong");
      digest = kt::Mix64(digest ^ kt::HashOf(got));
    }
    return SameOnAllRanks(ex, size, digest, "back-to-back results");
  });
}

TEST_F(AllReduceGpuTest, DispatcherUsesCustomBelowAndFallbackAboveTheCrossover) {
  RunOnEveryTp(240'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    // Pinned crossover.
    AllReduceDispatcher::Options opt;
    opt.calibrate = false;
    opt.crossover_bytes = 256 << 10;
    SYMTP_ASSIGN_OR_RETURN(auto nccl, MakeNccl(rank, size, ex));
    SYMTP_ASSIGN_OR_RETURN(auto comm, AllReduceDispatcher::Create(rank, size, rank, std::move(nccl),
                                                                  &ex, Deadline::AfterMs(kSetupMs),
                                                                  opt));
    CHECK_OR_RETURN(comm->custom_enabled(), comm->custom_disabled_reason());
    CHECK_OR_RETURN(comm->crossover_bytes() == (256u << 10), comm->crossover_bytes());
    using Path = AllReduceDispatcher::Path;
    CHECK_OR_RETURN(comm->PathFor(1, DType::kBF16) == Path::kCustom, "1 element");
    CHECK_OR_RETURN(comm->PathFor(128 << 10, DType::kBF16) == Path::kCustom, "256 KiB");
    CHECK_OR_RETURN(comm->PathFor((128 << 10) + 1, DType::kBF16) == Path::kFallback, "256 KiB + 2");
    CHECK_OR_RETURN(comm->PathFor(1 << 20, DType::kF32) == Path::kFallback, "4 MiB");
    SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
    for (DType t : kAllTypes) {
      for (size_t bytes : {size_t{8194}, size_t{256} << 10, (size_t{256} << 10) + 4,
                           size_t{3} << 20}) {
        const size_t count = bytes / DTypeSize(t);
        const bool custom = comm->PathFor(count, t) == Path::kCustom;
        SYMTP_RETURN_IF_ERROR(CheckOne(rank, size, ex, stream.get(), t, count, 0, /*exact=*/custom,
                                       Name(t, count, custom ? "dispatch->custom" : "dispatch->nccl"),
                                       [&](void* d, size_t n, DType dt, cudaStream_t s) {
                                         return comm->AllReduceSum(d, n, dt, s);
                                       }));
      }
    }
    // AllGather and Broadcast go to the fallback.
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, cuda::DeviceBuffer::Create(1024 * (size + 1) * 4));
    CUDA_RETURN_IF_ERROR(cudaMemset(x.get(), 1, x.bytes()));
    SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
    SYMTP_RETURN_IF_ERROR(comm->AllGather(x.get(), x.as<float>() + 1024, 1024, DType::kF32, stream.get()));
    SYMTP_RETURN_IF_ERROR(comm->Broadcast(x.get(), 1024, DType::kF32, 0, stream.get()));
    SYMTP_RETURN_IF_ERROR(SyncStream(stream.get(), Deadline::AfterMs(30'000)));
    SYMTP_RETURN_IF_ERROR(comm->Poll());

    // Calibrated crossover: within bounds, and the same on every rank.
    SYMTP_ASSIGN_OR_RETURN(auto nccl2, MakeNccl(rank, size, ex));
    AllReduceDispatcher::Options cal;
    SYMTP_ASSIGN_OR_RETURN(auto calibrated,
                           AllReduceDispatcher::Create(rank, size, rank, std::move(nccl2), &ex,
                                                       Deadline::AfterMs(kSetupMs), cal));
    CHECK_OR_RETURN(calibrated->crossover_calibrated(), "not calibrated");
    CHECK_OR_RETURN(calibrated->crossover_bytes() <= calibrated->custom()->max_bytes(),
                    calibrated->crossover_bytes());
    if (rank == 0) fprintf(stderr, "[TP %d] %s\n", size, calibrated->Describe().c_str());
    SYMTP_RETURN_IF_ERROR(SameOnAllRanks(ex, size, calibrated->crossover_bytes(), "crossover"));
    const size_t count = 300'000;  // 600 KB of bf16: either path, must be right
    const bool custom = calibrated->PathFor(count, DType::kBF16) == Path::kCustom;
    return CheckOne(rank, size, ex, stream.get(), DType::kBF16, count, 0, custom, "calibrated",
                    [&](void* d, size_t n, DType dt, cudaStream_t s) {
                      return calibrated->AllReduceSum(d, n, dt, s);
                    });
  });
}

// One rank never enters the all-reduce: the others' kernels give up after the
// (short) deadline and Poll() names the missing peer. No hang.
TEST_F(AllReduceGpuTest, DeadPeerTimesOutWithAnErrorNamingIt) {
  RunOnEveryTp(120'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.timeout_ms = 200;
    opt.ll128_max_bytes = 1 << 20;
    std::unique_ptr<CustomAllReduce> ars[5];
    for (int k = 0; k < 5; ++k) {
      CustomAllReduce::Options o = opt;
      if (k == 4) o.two_shot_pipeline_min_bytes = 1;  // the pipelined schedule
      SYMTP_ASSIGN_OR_RETURN(ars[k], CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                             Deadline::AfterMs(kSetupMs), o));
    }
    const int absent = size - 1;  // never calls
    if (rank != absent) {
      SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
      const Protocol protocols[] = {Protocol::kLL, Protocol::kStaged, Protocol::kLL128,
                                    Protocol::kTwoShot, Protocol::kTwoShot};
      const char* names[] = {"LL", "staged", "LL128", "two-shot", "two-shot"};
      for (int k = 0; k < 5; ++k) {
        const size_t count = k == 0 ? 4097 : 100'000;
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Create(count * 2));
        const kt::HostArray in = kt::RandomInput(DType::kBF16, count, 9, rank);
        CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.get(), in.data(), in.bytes(), cudaMemcpyHostToDevice));
        SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
        const int64_t t0 = MonotonicNs();
        SYMTP_RETURN_IF_ERROR(
            ars[k]->AllReduceSumWith(protocols[k], buf.get(), count, DType::kBF16, stream.get()));
        SYMTP_RETURN_IF_ERROR_CTX(SyncStream(stream.get(), Deadline::AfterMs(20'000)),
                                  "the kernel did not give up");
        const double ms = (MonotonicNs() - t0) / 1e6;
        absl::Status st = ars[k]->Poll();
        if (rank == 0) {
          fprintf(stderr, "[TP %d] %s protocol gave up after %.0f ms: %s\n", size, names[k], ms,
                  st.ToString().c_str());
        }
        CHECK_OR_RETURN(st.code() == absl::StatusCode::kDeadlineExceeded, st.ToString());
        CHECK_OR_RETURN(std::string(st.message()).find(absl::StrCat("rank ", absent,
                                                                    " never arrived")) !=
                            std::string::npos,
                        st.ToString());
        CHECK_OR_RETURN(
            std::string(st.message()).find(absl::StrCat("the ", names[k], " protocol")) !=
                std::string::npos,
            "the error does not name the ", names[k], " protocol: ", st.ToString());
        // Sticky: the instance refuses further work.
        absl::Status again = ars[k]->AllReduceSum(buf.get(), count, DType::kBF16, stream.get());
        CHECK_OR_RETURN(again.code() == absl::StatusCode::kDeadlineExceeded, again.ToString());
      }
    }
    // The absent rank waits here, alive, until the others are done.
    return ex.Barrier(Deadline::AfterMs(60'000));
  });
}

TEST_F(AllReduceGpuTest, AbortReleasesASpinningKernel) {
  RunOnEveryTp(120'000, [](int rank, int size, PeerExchange& ex) -> absl::Status {
    CustomAllReduce::Options opt;
    opt.timeout_ms = 30'000;
    SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 1 << 20, &ex,
                                                            Deadline::AfterMs(kSetupMs), opt));
    if (rank == 0) {
      SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Create(4096 * 4));
      CUDA_RETURN_IF_ERROR(cudaMemset(buf.get(), 0x3c, buf.bytes()));
      SYMTP_RETURN_IF_ERROR(FinishHostSideWork());
      SYMTP_RETURN_IF_ERROR(ar->AllReduceSum(buf.get(), 4096, DType::kF32, stream.get()));
      std::thread aborter([&] {
        usleep(100'000);
        ar->Abort();
      });
      absl::Status drained = SyncStream(stream.get(), Deadline::AfterMs(20'000));
      aborter.join();
      SYMTP_RETURN_IF_ERROR_CTX(drained, "Abort() did not release the kernel");
      absl::Status st = ar->Poll();
      CHECK_OR_RETURN(st.code() == absl::StatusCode::kAborted, st.ToString());
    }
    return ex.Barrier(Deadline::AfterMs(60'000));
  });
}

}  // namespace
}  // namespace symtp::kernels
