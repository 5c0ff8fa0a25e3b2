// allreduce_bench --tp N [--dtype bf16|fp16|fp32] [--json out.json] [--fused_hidden 4096]
//
// Custom one-shot all-reduce (kernels/allreduce) against NCCL, nccl-tests
// style: size, count, type, redop, time (us), algbw, busbw (= algbw * 2(n-1)/n)
// and #wrong elements, for eager launches and for CUDA-graph replays. Forks
// its own N processes (one GPU each) before any CUDA call.
//
// Method: for each size, results are checked first (inputs are multiples of
// 1/4 in [-2, 2], so every summation order is exact and #wrong counts bitwise
// differences from the exact sum); then `warmup` calls; then `reps` timed
// repetitions of `iters` back-to-back calls (eager) or of one graph holding
// `iters` calls (graph), timed with CUDA events; a rank's time is the median
// over repetitions divided by `iters`; the table shows the slowest rank.
// Then (bf16/fp32) the fused all-reduce + residual + RMSNorm against the
// all-reduce followed by AddRmsNorm at 1..512 rows of --fused_hidden, checked
// bitwise against each other and graph-timed.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/histogram.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "bench/allreduce/spin_kernel.h"
#include "kernels/allreduce/custom_allreduce.h"
#include "kernels/allreduce/dispatcher.h"
#include "tests/testing/allreduce/multi_process.h"
#include "tests/testing/allreduce/nccl_bootstrap.h"
#include "tests/testing/allreduce/reference.h"
#include "kernels/nccl/nccl_comm.h"
#include "kernels/ops/layer_ops.h"

ABSL_FLAG(int, tp, 2, "ranks (processes, one GPU each)");
ABSL_FLAG(std::string, dtype, "bf16", "bf16, fp16 or fp32");
ABSL_FLAG(int64_t, min_bytes, 1024, "smallest message");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest message");
ABSL_FLAG(int, step_factor, 2, "size multiplier between rows (2 or 4)");
ABSL_FLAG(int64_t, custom_max_bytes, 4 << 20, "custom path measured up to this size");
ABSL_FLAG(int64_t, ll_max_bytes, -1, "LL protocol up to this size (-1: library default)");
ABSL_FLAG(int64_t, fused_ll_max_bytes, -1,
          "fused all-reduce + RMSNorm: LL up to this size, capped at --ll_max_bytes (-1: library "
          "default)");
ABSL_FLAG(int64_t, ll128_max_bytes, -1,
          "LL128 protocol above --ll_max_bytes up to this size (-1: library default)");
ABSL_FLAG(int64_t, two_shot_min_bytes, -1,
          "messages above the LL and LL128 limits go two-shot from this size on (0: never, -1: "
          "library default)");
ABSL_FLAG(int, staged_blocks, -1, "staged and two-shot protocol grid (-1: library default)");
ABSL_FLAG(int64_t, two_shot_pipeline_min_bytes, 0,
          "two-shot messages pipelined from this size on (0: library default)");
ABSL_FLAG(int64_t, two_shot_chunk_bytes, 0, "pipelined two-shot chunk size (0: library default)");
ABSL_FLAG(int, two_shot_scatter_blocks, 0, "two-shot scatter blocks (0: library default)");
ABSL_FLAG(int, two_shot_reduce_blocks, 0, "two-shot reduce blocks (0: library default)");
ABSL_FLAG(int, ll_blocks, -1, "LL protocol grid (-1: library default)");
ABSL_FLAG(int, ll128_blocks, -1, "LL128 protocol grid (-1: library default)");
ABSL_FLAG(std::string, skew_us, "",
          "skew section: comma-separated delays (us); call i is preceded on rank i % tp by a "
          "kernel that holds the stream that long, so one rank arrives late at every call "
          "(skew 0 is measured first; '' skips the section)");
ABSL_FLAG(int, warmup, 20, "untimed calls before timing");
ABSL_FLAG(int, iters, 0, "calls per timed repetition (0: 100 up to 1 MiB, 20 above)");
ABSL_FLAG(int, reps, 20, "timed repetitions (median)");
ABSL_FLAG(std::string, json, "allreduce_bench.json", "JSON output file ('' for none)");
ABSL_FLAG(bool, calibrate, true, "also run the dispatcher's start-up calibration and print it");
ABSL_FLAG(bool, tune, false,
          "also sweep grid sizes (16-256 blocks) and protocols of the custom path, 4 KiB to 4 MiB");
ABSL_FLAG(int64_t, timeout_s, 600, "kill the ranks after this long");
ABSL_FLAG(int, fused_hidden, 4096,
          "row width of the fused all-reduce + residual + RMSNorm rows (bf16/fp32; 0: none)");

namespace symtp::kernels {
namespace {

namespace kt = ::symtp::kernels::testing;
using Protocol = CustomAllReduce::Protocol;

struct Config {
  int tp;
  DType dtype;
  std::vector<size_t> sizes;
  size_t custom_max;
  CustomAllReduce::Options custom;
  int warmup, iters, reps;
  bool calibrate, tune;
  int fused_hidden;
  std::vector<int> skew_us;
  std::string json;
};

struct Timing {
  double eager_us = 0, graph_us = 0;
  uint64_t wrong = 0;
};

struct Row {
  size_t bytes, count;
  std::string impl, proto;
  Timing t;
  double nccl_graph_us = 0;
};

// Exact-sum inputs: multiples of 1/4 in [-2, 2] \ {0}.
float InputValue(int rank, size_t i) {
  const uint64_t h = kt::Mix64((static_cast<uint64_t>(rank) << 48) ^ i);
  int k = static_cast<int>(h % 16) - 8;
  if (k == 0) k = 8;
  return static_cast<float>(k) / 4.0f;
}

absl::Status Sync(cudaStream_t s, Deadline d) { return cuda::SyncStream(s, d, "allreduce_bench"); }

// Graph-replay time per call of `run` on this rank: a graph of `iters`
// calls, median of cfg.reps replays.
template <typename Run>
absl::StatusOr<double> GraphUs(const Config& cfg, PeerExchange& ex, cudaStream_t stream,
                               int iters, Run run) {
  const Deadline deadline = Deadline::AfterMs(120'000);
  absl::StatusOr<cuda::GraphExec> exec = cuda::GraphExec::Capture(stream, [&] {
    absl::Status cap;
    for (int i = 0; i < iters && cap.ok(); ++i) cap = run(stream);
    return cap;
  });
  SYMTP_RETURN_IF_ERROR_CTX(exec.status(), "capturing");
  SYMTP_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create(true));
  SYMTP_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create(true));
  for (int i = 0; i < 3; ++i) SYMTP_RETURN_IF_ERROR(exec->Launch(stream));
  SYMTP_RETURN_IF_ERROR(Sync(stream, deadline));
  SYMTP_RETURN_IF_ERROR(ex.Barrier(deadline));
  std::vector<double> samples;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    SYMTP_RETURN_IF_ERROR(exec->Launch(stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    SYMTP_RETURN_IF_ERROR(Sync(stream, deadline));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    samples.push_back(ms * 1000.0 / iters);
  }
  return Median(samples);
}

// The largest of every rank's `v`.
absl::StatusOr<double> SlowestRank(const Config& cfg, PeerExchange& ex, double v) {
  std::vector<double> all(cfg.tp);
  SYMTP_RETURN_IF_ERROR(ex.AllGather(&v, sizeof(v), all.data(), Deadline::AfterMs(120'000)));
  return *std::max_element(all.begin(), all.end());
}

template <typename Run>
absl::StatusOr<Timing> Measure(const Config& cfg, PeerExchange& ex, cudaStream_t stream,
                               void* buf, size_t count, int iters, const kt::HostArray& input,
                               const kt::HostArray& expect, Run run) {
  Timing t;
  const Deadline deadline = Deadline::AfterMs(120'000);
  // 1. Check.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buf, input.data(), input.bytes(), cudaMemcpyHostToDevice, stream));
  SYMTP_RETURN_IF_ERROR(run(buf, count, stream));
  kt::HostArray got(cfg.dtype, count);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(got.data(), buf, got.bytes(), cudaMemcpyDeviceToHost, stream));
  SYMTP_RETURN_IF_ERROR(Sync(stream, deadline));
  t.wrong = kt::CountWrong(got, expect, 0.0);
  SYMTP_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create(true));
  SYMTP_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create(true));
  // 2. Eager.
  for (int i = 0; i < cfg.warmup; ++i) SYMTP_RETURN_IF_ERROR(run(buf, count, stream));
  SYMTP_RETURN_IF_ERROR(Sync(stream, deadline));
  SYMTP_RETURN_IF_ERROR(ex.Barrier(deadline));
  std::vector<double> samples;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    for (int i = 0; i < iters; ++i) SYMTP_RETURN_IF_ERROR(run(buf, count, stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    SYMTP_RETURN_IF_ERROR(Sync(stream, deadline));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    samples.push_back(ms * 1000.0 / iters);
  }
  t.eager_us = Median(samples);
  // 3. Graph of `iters` calls.
  SYMTP_ASSIGN_OR_RETURN(t.graph_us, GraphUs(cfg, ex, stream, iters, [&](cudaStream_t st) {
                           return run(buf, count, st);
                         }));
  // Slowest rank's times, everyone's wrong elements.
  double mine[3] = {t.eager_us, t.graph_us, static_cast<double>(t.wrong)};
  std::vector<double> all(3 * cfg.tp);
  SYMTP_RETURN_IF_ERROR(ex.AllGather(mine, sizeof(mine), all.data(), deadline));
  Timing out;
  for (int r = 0; r < cfg.tp; ++r) {
    out.eager_us = std::max(out.eager_us, all[3 * r]);
    out.graph_us = std::max(out.graph_us, all[3 * r + 1]);
    out.wrong += static_cast<uint64_t>(all[3 * r + 2]);
  }
  return out;
}

// The fused all-reduce + residual + RMSNorm against the all-reduce followed
// by AddRmsNorm, at decode's message sizes (rows x cfg.fused_hidden): checked
// bitwise against each other once (#wrong), then graph-timed.
absl::Status BenchFused(const Config& cfg, int rank, PeerExchange& ex, CustomAllReduce& custom,
                        cudaStream_t stream, std::vector<std::string>* lines) {
  const int H = cfg.fused_hidden;
  const size_t es = DTypeSize(cfg.dtype);
  if (H <= 0) return absl::OkStatus();
  const int max_rows = static_cast<int>(std::min<size_t>(512, custom.max_bytes() / (H * es)));
  if (max_rows < 1) return absl::OkStatus();
  const size_t max_n = static_cast<size_t>(max_rows) * H;
  std::vector<cuda::DeviceBuffer> b;  // data, residual, out (fused) | data, residual, out | weight
  for (int i = 0; i < 7; ++i) {
    SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d,
                           cuda::DeviceBuffer::Create((i == 6 ? H : max_n) * es));
    b.push_back(std::move(d));
  }
  const kt::HostArray weight = kt::RandomInput(cfg.dtype, H, 7, 0);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b[6].get(), weight.data(), weight.bytes(),
                                       cudaMemcpyHostToDevice, stream));
  if (rank == 0) {
    printf("# fused all-reduce + residual + RMSNorm (hidden %d) vs all-reduce then AddRmsNorm, "
           "graph us per call (slowest rank), #wrong = fused output bits != two-kernel bits\n", H);
  }
  for (int rows = 1; rows <= max_rows; rows *= 2) {
    const size_t n = static_cast<size_t>(rows) * H, bytes = n * es;
    const kt::HostArray in = kt::RandomInput(cfg.dtype, n, 11 + rows, rank);
    const kt::HostArray res = kt::RandomInput(cfg.dtype, n, 13 + rows, 0);
    for (int k : {0, 3}) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b[k].get(), in.data(), bytes, cudaMemcpyHostToDevice, stream));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b[k + 1].get(), res.data(), bytes, cudaMemcpyHostToDevice, stream));
    }
    const ResidualNorm fused{b[1].get(), b[6].get(), b[2].get(), rows, H, 1e-5f};
    if (!custom.FusesResidualNorm(fused, cfg.dtype)) return absl::OkStatus();
    auto run_fused = [&](cudaStream_t s) { return custom.AllReduceResidualNorm(b[0].get(), fused, cfg.dtype, s); };
    auto run_two = [&](cudaStream_t s) -> absl::Status {
      SYMTP_RETURN_IF_ERROR(custom.AllReduceSum(b[3].get(), n, cfg.dtype, s));
      return AddRmsNorm(b[4].get(), b[3].get(), b[6].get(), b[5].get(), rows, H, 1e-5f, cfg.dtype, s);
    };
    SYMTP_RETURN_IF_ERROR(run_fused(stream));
    SYMTP_RETURN_IF_ERROR(run_two(stream));
    kt::HostArray got_f(cfg.dtype, n), got_t(cfg.dtype, n);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(got_f.data(), b[2].get(), bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(got_t.data(), b[5].get(), bytes, cudaMemcpyDeviceToHost, stream));
    SYMTP_RETURN_IF_ERROR(Sync(stream, Deadline::AfterMs(60'000)));
    const size_t wrong = kt::CountWrong(got_f, got_t, 0.0);
    SYMTP_ASSIGN_OR_RETURN(double fused_local, GraphUs(cfg, ex, stream, 100, run_fused));
    SYMTP_ASSIGN_OR_RETURN(double two_local, GraphUs(cfg, ex, stream, 100, run_two));
    SYMTP_ASSIGN_OR_RETURN(double fused_us, SlowestRank(cfg, ex, fused_local));
    SYMTP_ASSIGN_OR_RETURN(double two_us, SlowestRank(cfg, ex, two_local));
    lines->push_back(absl::StrFormat(
        "fused rows %4d %8zu B (%s): fused %7.2f us, all-reduce + AddRmsNorm %7.2f us (%.2fx), "
        "wrong %zu",
        rows, bytes, CustomAllReduce::ProtocolName(custom.FusedProtocolFor(bytes)), fused_us,
        two_us, fused_us / two_us, wrong));
    if (rank == 0) {
      printf("# %s\n", lines->back().c_str());
      fflush(stdout);
    }
    if (wrong != 0) return absl::DataLossError(lines->back());
  }
  return custom.Poll();
}

// Calls with one rank late: call i is preceded on rank i % tp by a spin of
// `skew` us, so every call waits for one late rank. A call that costs only the
// wait takes skew + its own time; "excess" is what it takes beyond that, the
// cost of arriving early (waits that slow themselves down, e.g. by polling
// host memory).
absl::Status BenchSkew(const Config& cfg, int rank, PeerExchange& ex, CustomAllReduce& custom,
                       NcclComm& nccl, cudaStream_t stream, void* buf,
                       std::vector<std::string>* lines) {
  if (cfg.skew_us.empty()) return absl::OkStatus();
  const size_t es = DTypeSize(cfg.dtype);
  if (rank == 0) {
    printf("# skew: call i preceded on rank i %% %d by a spin; graph us per call (slowest "
           "rank); excess = per call - skew - per call at skew 0\n", cfg.tp);
  }
  for (size_t bytes : {size_t{256} << 10, size_t{2} << 20}) {
    if (bytes > cfg.sizes.back()) continue;  // the measurement buffer
    const size_t n = bytes / es;
    for (const char* impl : {"custom", "nccl"}) {
      const bool is_custom = std::string(impl) == "custom";
      if (is_custom && bytes > custom.max_bytes()) continue;
      double base = 0;
      for (int skew : cfg.skew_us) {
        int call = 0;
        auto run = [&](cudaStream_t s) -> absl::Status {
          if (skew > 0 && call++ % cfg.tp == rank) {
            CUDA_RETURN_IF_ERROR(LaunchSpin(static_cast<uint64_t>(skew) * 1000, s));
          }
          return is_custom ? custom.AllReduceSum(buf, n, cfg.dtype, s)
                           : nccl.AllReduceSum(buf, n, cfg.dtype, s);
        };
        SYMTP_ASSIGN_OR_RETURN(double local, GraphUs(cfg, ex, stream, 20, run));
        SYMTP_ASSIGN_OR_RETURN(double us, SlowestRank(cfg, ex, local));
        if (skew == 0) base = us;
        lines->push_back(absl::StrFormat(
            "skew %-6s %8zu B (%s) skew %5d us: %9.2f us per call, excess %8.2f us", impl, bytes,
            is_custom ? CustomAllReduce::ProtocolName(custom.ProtocolFor(bytes)) : "-",
            skew, us, us - skew - base));
        if (rank == 0) {
          printf("# %s\n", lines->back().c_str());
          fflush(stdout);
        }
      }
    }
  }
  SYMTP_RETURN_IF_ERROR(custom.Poll());
  return nccl.Poll();
}

double BusFactor(int n) { return 2.0 * (n - 1) / n; }

std::string FormatRow(const Row& r, int tp, DType t) {
  auto bw = [&](double us) { return us > 0 ? r.bytes / us / 1e3 : 0.0; };  // GB/s
  std::string ratio =
      r.impl == "custom" && r.nccl_graph_us > 0 ? absl::StrFormat("%6.2fx", r.t.graph_us / r.nccl_graph_us) : "     -";
  return absl::StrFormat("%12zu %11zu %9s %6s %7s %7s | %9.2f %8.2f %8.2f | %9.2f %8.2f %8.2f | %6llu | %s",
                         r.bytes, r.count, DTypeName(t), "sum", r.impl, r.proto, r.t.eager_us,
                         bw(r.t.eager_us), bw(r.t.eager_us) * BusFactor(tp), r.t.graph_us,
                         bw(r.t.graph_us), bw(r.t.graph_us) * BusFactor(tp),
                         static_cast<unsigned long long>(r.t.wrong), ratio);
}

absl::Status BenchRank(const Config& cfg, int rank, int size, PeerExchange& ex) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  const Deadline setup = Deadline::AfterMs(120'000);
  SYMTP_ASSIGN_OR_RETURN(auto nccl, kt::NcclOverExchange(rank, size, rank, ex, setup));
  SYMTP_ASSIGN_OR_RETURN(auto custom, CustomAllReduce::Create(rank, size, rank, cfg.custom_max,
                                                              &ex, setup, cfg.custom));
  SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  const size_t max_bytes = cfg.sizes.back();
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Create(max_bytes));
  const size_t es = DTypeSize(cfg.dtype);

  if (rank == 0) {
    cudaDeviceProp prop{};
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    printf("# symtp allreduce_bench: TP %d, %s, redop sum, %s x%d (%d SMs), NCCL %d\n", size,
           DTypeName(cfg.dtype), prop.name, size, prop.multiProcessorCount, nccl_version);
    printf(
        "# custom: LL <= %zu B, LL128 <= %zu B, staged or two-shot (%s) <= %zu B, grids "
        "%d (staged) / %d (LL) / %d (LL128), scratch %.2f MiB per rank\n",
        custom->ll_max_bytes(), custom->ll128_max_bytes(), custom->TwoShotLimitName().c_str(), custom->max_bytes(),
        custom->staged_blocks(), custom->ll_blocks(), custom->ll128_blocks(),
        custom->scratch_bytes() / 1048576.0);
    printf("# time: median of %d reps x iters calls (iters %s), slowest rank; eager = back-to-back "
           "launches, graph = one CUDA graph of iters calls; busbw = algbw * 2(n-1)/n\n",
           cfg.reps, cfg.iters ? std::to_string(cfg.iters).c_str() : "100 <= 1 MiB, 20 above");
    printf("#\n# %10s %11s %9s %6s %7s %7s | %9s %8s %8s | %9s %8s %8s | %6s | %s\n", "size", "count",
           "type", "redop", "impl", "proto", "eager us", "algbw", "busbw", "graph us", "algbw",
           "busbw", "#wrong", "graph vs nccl");
    fflush(stdout);
  }
  std::vector<Row> rows;
  for (size_t bytes : cfg.sizes) {
    const size_t count = bytes / es;
    const int iters = cfg.iters > 0 ? cfg.iters : (bytes <= (1u << 20) ? 100 : 20);
    kt::HostArray input(cfg.dtype, count), expect(cfg.dtype, count);
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < size; ++r) sum += InputValue(r, i);
      input.set_bits(i, kt::FromF32(cfg.dtype, InputValue(rank, i)));
      expect.set_bits(i, kt::FromF32(cfg.dtype, sum));
    }
    Row nrow{bytes, count, "nccl", "-", {}, 0};
    SYMTP_ASSIGN_OR_RETURN(nrow.t, Measure(cfg, ex, stream.get(), buf.get(), count, iters, input,
                                           expect, [&](void* p, size_t n, cudaStream_t s) {
                                             return nccl->AllReduceSum(p, n, cfg.dtype, s);
                                           }));
    if (bytes <= custom->max_bytes()) {
      Row crow{bytes, count, "custom", CustomAllReduce::ProtocolName(custom->ProtocolFor(bytes)),
               {},    0};
      SYMTP_ASSIGN_OR_RETURN(crow.t, Measure(cfg, ex, stream.get(), buf.get(), count, iters, input,
                                             expect, [&](void* p, size_t n, cudaStream_t s) {
                                               return custom->AllReduceSum(p, n, cfg.dtype, s);
                                             }));
      crow.nccl_graph_us = nrow.t.graph_us;
      rows.push_back(crow);
      if (rank == 0) printf("  %s\n", FormatRow(crow, size, cfg.dtype).c_str());
    }
    rows.push_back(nrow);
    if (rank == 0) {
      printf("  %s\n", FormatRow(nrow, size, cfg.dtype).c_str());
      fflush(stdout);
    }
  }
  SYMTP_RETURN_IF_ERROR(custom->Poll());
  SYMTP_RETURN_IF_ERROR(nccl->Poll());

  std::vector<std::string> fused_lines;
  if (cfg.dtype != DType::kF16) {
    SYMTP_RETURN_IF_ERROR(BenchFused(cfg, rank, ex, *custom, stream.get(), &fused_lines));
  }
  std::vector<std::string> skew_lines;
  SYMTP_RETURN_IF_ERROR(
      BenchSkew(cfg, rank, ex, *custom, *nccl, stream.get(), buf.get(), &skew_lines));

  // Grid / protocol sweep of the custom path (graph timing only matters, both shown).
  std::vector<std::string> tune_lines;
  if (cfg.tune) {
    for (int blocks : {16, 32, 64, 128, 256}) {
      CustomAllReduce::Options o = cfg.custom;
      o.staged_blocks = blocks;
      o.ll_blocks = blocks;
      o.ll128_blocks = blocks;
      o.ll_max_bytes = 1 << 20;
      o.ll128_max_bytes = 4 << 20;
      SYMTP_ASSIGN_OR_RETURN(auto ar, CustomAllReduce::Create(rank, size, rank, 4 << 20, &ex,
                                                              setup, o));
      for (size_t bytes : {size_t{4} << 10, size_t{16} << 10, size_t{64} << 10, size_t{128} << 10,
                           size_t{256} << 10, size_t{512} << 10, size_t{1} << 20, size_t{2} << 20,
                           size_t{4} << 20}) {
        if (bytes > max_bytes) continue;  // the measurement buffer
        const size_t count = bytes / es;
        kt::HostArray input(cfg.dtype, count), expect(cfg.dtype, count);
        for (size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (int r = 0; r < size; ++r) sum += InputValue(r, i);
          input.set_bits(i, kt::FromF32(cfg.dtype, InputValue(rank, i)));
          expect.set_bits(i, kt::FromF32(cfg.dtype, sum));
        }
        for (Protocol p :
             {Protocol::kLL, Protocol::kLL128, Protocol::kStaged, Protocol::kTwoShot}) {
          if (p == Protocol::kLL && bytes > o.ll_max_bytes) continue;
          SYMTP_ASSIGN_OR_RETURN(Timing t, Measure(cfg, ex, stream.get(), buf.get(), count, 100,
                                                   input, expect,
                                                   [&](void* d, size_t n, cudaStream_t s) {
                                                     return ar->AllReduceSumWith(p, d, n, cfg.dtype, s);
                                                   }));
          tune_lines.push_back(absl::StrFormat(
              "tune %-6s blocks %3d %8zu B: eager %7.2f us, graph %7.2f us, wrong %llu",
              CustomAllReduce::ProtocolName(p), blocks, bytes, t.eager_us, t.graph_us,
              static_cast<unsigned long long>(t.wrong)));
          if (rank == 0) {
            printf("# %s\n", tune_lines.back().c_str());
            fflush(stdout);
          }
        }
      }
      SYMTP_RETURN_IF_ERROR(ar->Poll());
    }
  }

  std::string describe;
  if (cfg.calibrate) {
    SYMTP_ASSIGN_OR_RETURN(auto nccl2, kt::NcclOverExchange(rank, size, rank, ex, setup));
    AllReduceDispatcher::Options o;
    o.custom = cfg.custom;
    SYMTP_ASSIGN_OR_RETURN(auto disp, AllReduceDispatcher::Create(rank, size, rank,
                                                                  std::move(nccl2), &ex, setup, o));
    describe = disp->Describe();
    if (rank == 0) printf("# %s\n", describe.c_str());
  }

  if (rank == 0 && !cfg.json.empty()) {
    JsonWriter j(2);  // one row a line
    j.Open('{').Field("tp", size).Field("dtype", DTypeName(cfg.dtype)).Field("redop", "sum");
    j.Field("ll_max_bytes", custom->ll_max_bytes())
        .Field("ll128_max_bytes", custom->ll128_max_bytes())
        .Field("two_shot_min_bytes", custom->two_shot_min_bytes());
    j.Field("custom_max_bytes", custom->max_bytes());
    j.Field("scratch_bytes_per_rank", custom->scratch_bytes()).Field("dispatcher", describe);
    j.Key("rows").Open('[');
    for (const Row& r : rows) {
      auto bw = [&](double us) { return us > 0 ? r.bytes / us / 1e3 : 0.0; };
      j.Raw(JsonWriter()
                .Open('{')
                .Field("size", r.bytes)
                .Field("count", r.count)
                .Field("impl", r.impl)
                .Field("protocol", r.proto)
                .Field("eager_us", r.t.eager_us, 3)
                .Field("eager_algbw", bw(r.t.eager_us), 3)
                .Field("eager_busbw", bw(r.t.eager_us) * BusFactor(size), 3)
                .Field("graph_us", r.t.graph_us, 3)
                .Field("graph_algbw", bw(r.t.graph_us), 3)
                .Field("graph_busbw", bw(r.t.graph_us) * BusFactor(size), 3)
                .Field("wrong", r.t.wrong)
                .Close()
                .Take());
    }
    j.Close().Key("tune").Open('[');
    for (const std::string& line : tune_lines) j.Value(line);
    j.Close().Key("fused").Open('[');
    for (const std::string& line : fused_lines) j.Value(line);
    j.Close().Key("skew").Open('[');
    for (const std::string& line : skew_lines) j.Value(line);
    std::ofstream(cfg.json) << j.Close().Close().Take() << "\n";
    printf("# JSON written to %s\n", cfg.json.c_str());
  }
  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.t.wrong;
  if (wrong != 0) return absl::DataLossError(absl::StrCat(wrong, " wrong elements in total"));
  return absl::OkStatus();
}

}  // namespace
}  // namespace symtp::kernels

int main(int argc, char** argv) {
  using namespace symtp::kernels;
  absl::ParseCommandLine(argc, argv);
  Config cfg;
  cfg.tp = absl::GetFlag(FLAGS_tp);
  const std::string dt = absl::GetFlag(FLAGS_dtype);
  if (dt == "bf16" || dt == "bfloat16") {
    cfg.dtype = DType::kBF16;
  } else if (dt == "fp16" || dt == "half") {
    cfg.dtype = DType::kF16;
  } else if (dt == "fp32" || dt == "float") {
    cfg.dtype = DType::kF32;
  } else {
    fprintf(stderr, "--dtype must be bf16, fp16 or fp32\n");
    return 2;
  }
  const int factor = absl::GetFlag(FLAGS_step_factor);
  const size_t es = DTypeSize(cfg.dtype);
  for (size_t b = std::max<int64_t>(absl::GetFlag(FLAGS_min_bytes), es);
       b <= static_cast<size_t>(absl::GetFlag(FLAGS_max_bytes)); b *= std::max(factor, 2)) {
    cfg.sizes.push_back(b / es * es);
  }
  if (cfg.sizes.empty() || cfg.tp < 2 || cfg.tp > symtp::kernels::testing::kMaxRanks) {
    fprintf(stderr, "need --tp in [2, 16] and min_bytes <= max_bytes\n");
    return 2;
  }
  cfg.custom_max = absl::GetFlag(FLAGS_custom_max_bytes);
  if (absl::GetFlag(FLAGS_ll_max_bytes) >= 0) cfg.custom.ll_max_bytes = absl::GetFlag(FLAGS_ll_max_bytes);
  if (absl::GetFlag(FLAGS_fused_ll_max_bytes) >= 0) {
    cfg.custom.fused_ll_max_bytes = absl::GetFlag(FLAGS_fused_ll_max_bytes);
  }
  if (absl::GetFlag(FLAGS_staged_blocks) > 0) cfg.custom.staged_blocks = absl::GetFlag(FLAGS_staged_blocks);
  cfg.custom.two_shot_pipeline_min_bytes =
      static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_two_shot_pipeline_min_bytes)));
  cfg.custom.two_shot_chunk_bytes =
      static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_two_shot_chunk_bytes)));
  cfg.custom.two_shot_scatter_blocks = absl::GetFlag(FLAGS_two_shot_scatter_blocks);
  cfg.custom.two_shot_reduce_blocks = absl::GetFlag(FLAGS_two_shot_reduce_blocks);
  if (absl::GetFlag(FLAGS_ll_blocks) > 0) cfg.custom.ll_blocks = absl::GetFlag(FLAGS_ll_blocks);
  if (absl::GetFlag(FLAGS_ll128_blocks) > 0) {
    cfg.custom.ll128_blocks = absl::GetFlag(FLAGS_ll128_blocks);
  }
  if (absl::GetFlag(FLAGS_ll128_max_bytes) >= 0) {
    cfg.custom.ll128_max_bytes = absl::GetFlag(FLAGS_ll128_max_bytes);
  }
  if (const int64_t m = absl::GetFlag(FLAGS_two_shot_min_bytes); m >= 0) {
    cfg.custom.two_shot_min_bytes = static_cast<size_t>(m);  // 0: never
  }
  cfg.warmup = absl::GetFlag(FLAGS_warmup);
  cfg.iters = absl::GetFlag(FLAGS_iters);
  cfg.reps = std::max(1, absl::GetFlag(FLAGS_reps));
  cfg.calibrate = absl::GetFlag(FLAGS_calibrate);
  cfg.tune = absl::GetFlag(FLAGS_tune);
  cfg.fused_hidden = absl::GetFlag(FLAGS_fused_hidden);
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_skew_us), ',', absl::SkipEmpty())) {
    int us = 0;
    if (!absl::SimpleAtoi(v, &us) || us < 0 || us > 100'000) {
      fprintf(stderr, "allreduce_bench: --skew_us: '%s' is not a delay of 0-100000 us\n",
              std::string(v).c_str());
      return 2;
    }
    cfg.skew_us.push_back(us);
  }
  if (!cfg.skew_us.empty() && cfg.skew_us.front() != 0) cfg.skew_us.insert(cfg.skew_us.begin(), 0);
  cfg.json = absl::GetFlag(FLAGS_json);

  std::string why;
  const int gpus = symtp::kernels::testing::CountGpusInChild(&why);
  if (gpus < cfg.tp) {
    fprintf(stderr, "allreduce_bench: --tp %d needs %d GPUs, %d visible%s%s\n", cfg.tp, cfg.tp,
            gpus, why.empty() ? "" : ": ", why.c_str());
    return 1;
  }
  symtp::kernels::testing::RunOptions opt;
  opt.size = cfg.tp;
  opt.timeout_ms = absl::GetFlag(FLAGS_timeout_s) * 1000;
  auto res = symtp::kernels::testing::RunRanks(
      opt, [&](int rank, int size, PeerExchange& ex) { return BenchRank(cfg, rank, size, ex); });
  if (!res.ok()) {
    fprintf(stderr, "allreduce_bench: %s\n", res.status().ToString().c_str());
    return 1;
  }
  if (!res->ok()) {
    fprintf(stderr, "allreduce_bench failed:\n%s", res->Summary().c_str());
    return 1;
  }
  return 0;
}
