// kernels_bench: device ceilings and the decode-time cost of the model's
// kernels, measured in one run on one GPU.
//
//   ceilings        bf16 GEMM rate of a large cuBLASLt product (random data),
//                   device-to-device copy bandwidth (bytes read + written)
//   decode_gemm     cuBLASLt at M = 1/2/4/8/32/128/256/512 tokens for the linear
//                   layers of llama-8b / llama-70b shards at TP = 1 and 2
//                   (weights rotated through a buffer larger than L2), graph
//                   time also with no workspace (no split-K reduction kernel)
//                   and with the project's Gemv where it takes M
//   decode_attn     paged decode attention, context 1024, batch 1..512,
//                   GB/s of K+V read, per decode kernel; one launch repeated,
//                   so where the K/V fit L2 (llama-8b TP=2 up to batch 16) the
//                   times are L2-warm, 16-21% below a launch that reads them
//                   from HBM as a decode step does
//                   (bench/results/h100x2/kv_l2_probe/)
//   prefill_attn    causal attention of one 512- / 4096-token prompt,
//                   TFLOP/s, tiled vs tensor-core kernel
//   model_decode    GpuModel (TP = 1) decode step of llama-8b-shape with
//                   --layers layers (default 4), context 1024 (--model-contexts),
//                   batch 32..512,
//                   CUDA graphs on and off, time per kernel class (eager)
//
// Every kernel's result is spot-checked against a CPU computation before
// it is timed; times are medians of event-timed repetitions after warm-up.
// Flags (--help lists them): --json FILE, --layers N, --skip-model,
// --sections LIST, --gemm-match LIST, --attention-contiguous, --model-batches
// LIST, --model-contexts LIST, --model-kernels LIST, --model-graphs on|off|both,
// --model-overrides K=V,...
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/env.h"
#include "common/histogram.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/weight_init.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/cuda/gpu_model.h"
#include "scheduler/block_manager.h"

ABSL_FLAG(std::string, json, "", "write the results here as JSON ('' for none)");
ABSL_FLAG(int, layers, 4, "model_decode: layers of llama-8b-shape (of 32)");
ABSL_FLAG(bool, skip_model, false, "skip the model_decode section");
ABSL_FLAG(bool, attention_contiguous, false,
          "decode_attn: each sequence's KV blocks in order (default: scattered at random)");
ABSL_FLAG(std::vector<std::string>, sections,
          std::vector<std::string>({"gemm", "attention", "prefill", "model"}),
          "sections to run: gemm, attention, prefill, model");
ABSL_FLAG(std::vector<std::string>, gemm_match, {},
          "decode_gemm: only rows whose 'model tp=N layer M=m' holds one of these "
          "(e.g. 'llama-8b-shape tp=2 wo M=256')");
ABSL_FLAG(std::vector<std::string>, model_batches,
          std::vector<std::string>({"32", "64", "128", "256", "512"}),
          "model_decode: batch sizes, each in [1, 512]");
ABSL_FLAG(std::vector<std::string>, model_contexts, std::vector<std::string>({"1024"}),
          "model_decode: keys each sequence attends over, one for every batch or one per "
          "--model-batches entry, each in [1, 8192]");
ABSL_FLAG(std::vector<std::string>, model_kernels, {},
          "model_decode: decode attention kernels (tiled, tensor-core; empty: both)");
ABSL_FLAG(std::string, model_graphs, "both", "model_decode: CUDA graphs on, off or both");
ABSL_FLAG(int, model_gemm_workspace_min_rows, -1,
          "model_decode: GEMMs with fewer rows run without the split-K workspace (-1: the "
          "model's default, 0: always with it)");
ABSL_FLAG(std::string, model_overrides, "",
          "model_decode: more overrides after layers= (e.g. heads=16,kv_heads=4)");
ABSL_FLAG(bool, model_defer_norm, true,
          "model_decode: GpuModelOptions::defer_norm (false for a TP > 1 rank's shapes, whose "
          "norms run with the all-reduce: the AddRmsNorm kernels stand in for those)");

namespace symtp::bench {
namespace {

using kernels::DType;

// Waits for the stream, bounded (a hung kernel is an error, not a hang).
absl::Status Sync(cudaStream_t s) {
  return cuda::SyncStream(s, Deadline::AfterMs(60'000), "kernels_bench");
}

// A host function that holds its stream until Release() (or a 10 s
// deadline): work enqueued behind it is all queued before the GPU starts it,
// so event pairs time the GPU alone, not the host's launch calls.
class StreamGate {
 public:
  absl::Status Hold(cudaStream_t s) {
    CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(s, &StreamGate::Wait, this));
    held_ = s;
    return absl::OkStatus();
  }
  void Release() { open_.store(true, std::memory_order_release); }
  // The host function must not outlive the gate: open it and drain the stream.
  ~StreamGate() {
    Release();
    if (held_ != nullptr) cudaStreamSynchronize(held_);
  }

 private:
  static void Wait(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    const int64_t deadline = MonotonicNs() + 10'000'000'000;
    while (!g->open_.load(std::memory_order_acquire)) {
      if (MonotonicNs() > deadline) {
        g->timed_out_.store(true);
        return;
      }
      std::this_thread::yield();
    }
  }

 public:
  // True when the gate opened on its deadline: something enqueued behind it
  // waited for the stream (a synchronizing call), and the times are not GPU times.
  bool timed_out() const { return timed_out_.load(); }

 private:
  std::atomic<bool> timed_out_{false};
  std::atomic<bool> open_{false};
  cudaStream_t held_ = nullptr;
};

// Times `fn` (enqueue on `s`) `reps` times after `warm` warm-ups, one event
// pair per repetition; median microseconds. The repetitions are queued
// behind a StreamGate, so each event pair brackets GPU time only (as in a
// CUDA graph replay, how the model runs its decode steps).
absl::StatusOr<double> TimeUs(cudaStream_t s, int warm, int reps,
                              const std::function<absl::Status(int)>& fn) {
  for (int i = 0; i < warm; ++i) SYMTP_RETURN_IF_ERROR(fn(i));
  std::vector<cuda::Event> ev;
  for (int i = 0; i < 2 * reps; ++i) {
    SYMTP_ASSIGN_OR_RETURN(cuda::Event e, cuda::Event::Create(true));
    ev.push_back(std::move(e));
  }
  // Under a profiler a kernel launch may wait for the kernel, which would
  // wait for the gate: no gate there (the times are the profiler's to take
  // anyway). Profilers that inject through CUDA_INJECTION64_PATH are seen;
  // SYMTP_BENCH_NO_GATE=1 says so for the others (tools/device/*.sh set it).
  static const bool profiled = env::BenchUnderProfiler();
  StreamGate gate;
  if (!profiled) SYMTP_RETURN_IF_ERROR(gate.Hold(s));
  for (int i = 0; i < reps; ++i) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2 * i].get(), s));
    SYMTP_RETURN_IF_ERROR(fn(warm + i));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2 * i + 1].get(), s));
  }
  gate.Release();
  SYMTP_RETURN_IF_ERROR(Sync(s));
  if (gate.timed_out()) {
    return absl::InternalError("TimeUs: the timed call synchronized with its own stream");
  }
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev[2 * i].get(), ev[2 * i + 1].get()));
    us.push_back(1000.0 * ms);
  }
  return Median(us);
}

// Per-call microseconds of `fn` as a CUDA graph replays it (how the model
// runs decode): `calls` calls (fn(0..calls-1)) captured into one graph,
// replayed `reps` times after 2 warm-ups; median replay time / calls.
// fn(0..calls-1) captured on s.
absl::StatusOr<cuda::Graph> CaptureCalls(cudaStream_t s, int calls,
                                         const std::function<absl::Status(int)>& fn) {
  return cuda::Graph::Capture(s, [&] {
    absl::Status st;
    for (int i = 0; i < calls && st.ok(); ++i) st = fn(i);
    return st;
  });
}

// The median time of one replay of `exec`.
absl::StatusOr<double> ReplayUs(const cuda::GraphExec& exec, cudaStream_t s, int reps) {
  return TimeUs(s, 2, reps, [&](int) { return exec.Launch(s); });
}

absl::StatusOr<double> GraphUsPerCall(cudaStream_t s, int calls, int reps,
                                      const std::function<absl::Status(int)>& fn) {
  SYMTP_ASSIGN_OR_RETURN(const cuda::Graph graph, CaptureCalls(s, calls, fn));
  SYMTP_ASSIGN_OR_RETURN(const cuda::GraphExec exec, cuda::GraphExec::Instantiate(graph));
  SYMTP_ASSIGN_OR_RETURN(const double us, ReplayUs(exec, s, reps));
  return us / calls;
}

float Bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Fills a bf16 buffer with synthetic uniform values in [-scale, scale).
absl::Status FillRandom(void* p, size_t elems, uint64_t seed, float scale, cudaStream_t s) {
  kernels::SyntheticBlock b;
  b.key = seed * 0x9E3779B97F4A7C15ull + 1;
  b.kind = kernels::SyntheticKind::kLinear;
  b.scale = scale;
  b.global_cols = static_cast<int64_t>(elems);
  b.rows = 1;
  b.cols = static_cast<int64_t>(elems);
  return kernels::InitSyntheticWeight(p, DType::kBF16, b, s);
}

// The JSON output's parts, each row one line of JSON (JsonWriter).
struct Json {
  std::vector<std::string> gemm, attn, prefill_attn, model;
  std::string ceilings, device;
};

struct Ceilings {
  double gemm_tflops = 0, copy_gbps = 0;
};

absl::StatusOr<Ceilings> MeasureCeilings(kernels::CublasLtHandle& h, void* ws, cudaStream_t s,
                                         Json* js) {
  Ceilings c;
  const int64_t n = 8192;
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer a, cuda::DeviceBuffer::Create(n * n * 2));
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, cuda::DeviceBuffer::Create(n * n * 2));
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer o, cuda::DeviceBuffer::Create(n * n * 2));
  SYMTP_RETURN_IF_ERROR(FillRandom(a.get(), n * n, 1, 1.f, s));
  SYMTP_RETURN_IF_ERROR(FillRandom(w.get(), n * n, 2, 1.f, s));
  auto gemm = [&](int) {
    return kernels::Gemm(h, a.get(), w.get(), o.get(), n, n, n, DType::kBF16, ws,
                         kernels::kGemmWorkspaceBytes, s);
  };
  SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 3, 10, gemm));
  c.gemm_tflops = 2.0 * n * n * n / (us * 1e-6) / 1e12;
  // Copy: 2 GiB, bytes read + written.
  const size_t bytes = size_t{2} << 30;
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer src, cuda::DeviceBuffer::Create(bytes));
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer dst, cuda::DeviceBuffer::Create(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.get(), 0x3c, bytes, s));
  auto copy = [&](int) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
    return absl::OkStatus();
  };
  SYMTP_ASSIGN_OR_RETURN(double cus, TimeUs(s, 2, 10, copy));
  c.copy_gbps = 2.0 * bytes / (cus * 1e-6) / 1e9;
  // Spot check the copy (a few bytes) so a failed copy cannot pass as fast.
  unsigned char probe[4] = {0, 0, 0, 0};
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(probe, static_cast<char*>(dst.get()) + bytes / 2, 4,
                                       cudaMemcpyDeviceToHost, s));
  SYMTP_RETURN_IF_ERROR(Sync(s));
  if (probe[0] != 0x3c || probe[3] != 0x3c) return absl::InternalError("D2D copy check failed");
  std::printf("ceilings: bf16 GEMM 8192^3 %.0f TFLOP/s (%.1f us), D2D copy %.0f GB/s\n",
              c.gemm_tflops, us, c.copy_gbps);
  js->ceilings = JsonWriter()
                     .Open('{')
                     .Field("bf16_gemm_tflops", c.gemm_tflops, 1)
                     .Key("bf16_gemm_shape")
                     .Array(std::vector<int64_t>{n, n, n})
                     .Field("d2d_copy_gbps", c.copy_gbps, 1)
                     .Field("d2d_copy_bytes", bytes)
                     .Close()
                     .Take();
  return c;
}

struct GemmShape {
  const char* model;
  int tp;
  const char* layer;
  int64_t n, k;
};

std::vector<GemmShape> DecodeGemmShapes() {
  std::vector<GemmShape> v;
  // (hidden, heads, kv heads, ffn, vocab) of the two shapes, per TP.
  struct M {
    const char* name;
    int64_t H, NH, NKV, F, V;
  } models[] = {{"llama-8b-shape", 4096, 32, 8, 14336, 128256},
                {"llama-70b-shape", 8192, 64, 8, 28672, 128256}};
  for (const M& m : models) {
    for (int tp : {1, 2}) {
      const int64_t D = m.H / m.NH, q = m.NH / tp * D, kv = std::max<int64_t>(1, m.NKV / tp) * D;
      v.push_back({m.name, tp, "qkv", q + 2 * kv, m.H});
      v.push_back({m.name, tp, "wo", m.H, q});
      v.push_back({m.name, tp, "gate_up", 2 * m.F / tp, m.H});
      v.push_back({m.name, tp, "down", m.H, m.F / tp});
      v.push_back({m.name, tp, "lm_head", m.V / tp, m.H});
    }
  }
  return v;
}

// Operands of the decode GEMM sections: weights rotated through an arena of
// at least 4 GiB (L2 is ~50 MB, so each timed GEMM reads HBM), activations
// for up to max_m rows, an output for the widest layer.
struct DecodeGemmOperands {
  cuda::DeviceBuffer w, a, c;
  size_t arena = 0;
  // The weights of call i for a [n, k] layer (slot i of the arena).
  const char* Weights(int64_t n, int64_t k, int i) const {
    const size_t bytes = static_cast<size_t>(n * k * 2);
    return static_cast<const char*>(w.get()) + (i % (arena / bytes)) * bytes;
  }
};

absl::StatusOr<DecodeGemmOperands> MakeDecodeGemmOperands(int64_t max_m, uint64_t seed,
                                                          cudaStream_t s) {
  size_t max_w = 0;
  for (const auto& g : DecodeGemmShapes()) max_w = std::max<size_t>(max_w, g.n * g.k * 2);
  const int64_t max_k = 28672, max_n = 128256;
  DecodeGemmOperands o;
  o.arena = std::max<size_t>(size_t{4} << 30, 3 * max_w);
  SYMTP_ASSIGN_OR_RETURN(o.w, cuda::DeviceBuffer::Create(o.arena));
  SYMTP_RETURN_IF_ERROR(FillRandom(o.w.get(), o.arena / 2, seed, 0.02f, s));
  SYMTP_ASSIGN_OR_RETURN(o.a, cuda::DeviceBuffer::Create(max_m * max_k * 2));
  SYMTP_RETURN_IF_ERROR(FillRandom(o.a.get(), max_m * max_k, seed + 1, 1.f, s));
  SYMTP_ASSIGN_OR_RETURN(o.c, cuda::DeviceBuffer::Create(max_m * max_n * 2));
  return o;
}

absl::Status BenchDecodeGemms(kernels::CublasLtHandle& h, void* ws, cudaStream_t s,
                              const Ceilings& c, Json* js, const std::vector<std::string>& match) {
  const auto shapes = DecodeGemmShapes();
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(512, 3, s));
  const cuda::DeviceBuffer &wbuf = ops.w, &abuf = ops.a, &cbuf = ops.c;
  std::printf(
      "\ndecode GEMMs (bf16, fp32 accumulate): C[M,N] = A[M,K] W[N,K]^T, cuBLASLt's heuristic; "
      "us = one launch between two events, graph = per call of 20 captured in a CUDA graph (as "
      "decode runs)\n");
  std::printf("%-16s %2s %-8s %6s %6s %4s %9s %8s %7s %8s %8s %7s %7s %8s %7s %8s %7s\n", "model",
              "tp", "layer", "N", "K", "M", "us", "TFLOP/s", "%peak", "W GB/s", "graph", "%peak",
              "W%copy", "ws0", "W%copy", "gemv", "W%copy");
  for (const auto& g : shapes) {
    const size_t wbytes = static_cast<size_t>(g.n * g.k * 2);
    for (int64_t m : {1, 2, 4, 8, 32, 128, 256, 512}) {
      // --gemm-match: only rows whose "model tp=N layer M=m" holds one of the strings.
      const std::string label = absl::StrFormat("%s tp=%d %s M=%d", g.model, g.tp, g.layer, m);
      if (!match.empty() && std::none_of(match.begin(), match.end(), [&](const std::string& x) {
            return label.find(x) != std::string::npos;
          })) {
        continue;
      }
      auto run = [&](int i) {
        const char* w = ops.Weights(g.n, g.k, i);
        return kernels::Gemm(h, abuf.get(), w, cbuf.get(), m, g.n, g.k, DType::kBF16, ws,
                             kernels::kGemmWorkspaceBytes, s);
      };
      // Verify two output elements against a CPU dot product first.
      auto check = [&](const char* what) -> absl::Status {
        for (int64_t probe : {int64_t{0}, (m - 1) * g.n + g.n - 1}) {
          const int64_t row = probe / g.n, col = probe % g.n;
          std::vector<uint16_t> ar(g.k), wr(g.k);
          uint16_t cv = 0;
          CUDA_RETURN_IF_ERROR(cudaMemcpy(ar.data(), static_cast<char*>(abuf.get()) + row * g.k * 2,
                                          g.k * 2, cudaMemcpyDeviceToHost));
          CUDA_RETURN_IF_ERROR(cudaMemcpy(wr.data(), static_cast<char*>(wbuf.get()) + col * g.k * 2,
                                          g.k * 2, cudaMemcpyDeviceToHost));
          CUDA_RETURN_IF_ERROR(cudaMemcpy(&cv, static_cast<char*>(cbuf.get()) + probe * 2, 2,
                                          cudaMemcpyDeviceToHost));
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < g.k; ++k) {
            ref += static_cast<double>(Bf16ToFloat(ar[k])) * Bf16ToFloat(wr[k]);
            mag += std::fabs(static_cast<double>(Bf16ToFloat(ar[k])) * Bf16ToFloat(wr[k]));
          }
          if (std::fabs(Bf16ToFloat(cv) - ref) > 1e-2 * mag + 1e-6) {
            return absl::InternalError(absl::StrFormat("%s check failed for %s %s M=%d: %g vs %g",
                                                       what, g.model, g.layer, m, Bf16ToFloat(cv),
                                                       ref));
          }
        }
        return absl::OkStatus();
      };
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, m * g.n * 2, s));
      SYMTP_RETURN_IF_ERROR(run(0));
      SYMTP_RETURN_IF_ERROR(Sync(s));
      SYMTP_RETURN_IF_ERROR(check("GEMM"));
      // The project's GEMV where it takes the shape (decode's fewest rows).
      auto gemv_args = [&](const void* w) {
        return kernels::ContiguousGemmArgs(abuf.get(), w, cbuf.get(), m, g.n, g.k, DType::kBF16,
                                           nullptr, 0);
      };
      auto gemv = [&](int i) { return kernels::Gemv(gemv_args(ops.Weights(g.n, g.k, i)), s); };
      const bool has_gemv = kernels::GemvSupports(gemv_args(wbuf.get()));
      double us_gemv = 0;
      if (has_gemv) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, m * g.n * 2, s));
        SYMTP_RETURN_IF_ERROR(gemv(0));
        SYMTP_RETURN_IF_ERROR(Sync(s));
        SYMTP_RETURN_IF_ERROR(check("GEMV"));
        SYMTP_ASSIGN_OR_RETURN(us_gemv, GraphUsPerCall(s, 20, 5, gemv));
      }
      SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, run));
      SYMTP_ASSIGN_OR_RETURN(double us_graph, GraphUsPerCall(s, 20, 5, run));
      // The same product with no workspace: cuBLASLt's heuristic may then not
      // pick a split-K algorithm that reduces in a second kernel.
      SYMTP_ASSIGN_OR_RETURN(double us_ws0, GraphUsPerCall(s, 20, 5, [&](int i) {
                               return kernels::Gemm(h, abuf.get(), ops.Weights(g.n, g.k, i),
                                                    cbuf.get(), m, g.n, g.k, DType::kBF16,
                                                    nullptr, 0, s);
                             }));
      // Weight bytes per graph call against the measured copy bandwidth.
      auto wcopy = [&](double us_call) { return wbytes / (us_call * 1e-6) / 1e9 / c.copy_gbps; };
      const double flop = 2.0 * m * g.n * g.k;
      // Fraction of the measured bf16 rate at `us` per call.
      auto frac = [&](double us_call) { return flop / (us_call * 1e-6) / 1e12 / c.gemm_tflops; };
      const double frac_graph = frac(us_graph);
      const double tflops = flop / (us * 1e-6) / 1e12;
      const double wgbps = static_cast<double>(wbytes) / (us * 1e-6) / 1e9;
      std::printf(
          "%-16s %2d %-8s %6lld %6lld %4lld %9.1f %8.1f %6.1f%% %8.0f %8.1f %6.1f%% %6.1f%% %8.1f "
          "%6.1f%% %8s %7s\n",
          g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k),
          static_cast<long long>(m), us, tflops, 100.0 * tflops / c.gemm_tflops, wgbps, us_graph,
          100.0 * frac_graph, 100.0 * wcopy(us_graph), us_ws0, 100.0 * wcopy(us_ws0),
          has_gemv ? absl::StrFormat("%.1f", us_gemv).c_str() : "-",
          has_gemv ? absl::StrFormat("%.1f%%", 100.0 * wcopy(us_gemv)).c_str() : "-");
      js->gemm.push_back(JsonWriter()
                             .Open('{')
                             .Field("model", g.model)
                             .Field("tp", g.tp)
                             .Field("layer", g.layer)
                             .Field("m", m)
                             .Field("n", g.n)
                             .Field("k", g.k)
                             .Field("us", us, 2)
                             .Field("tflops", tflops, 2)
                             .Field("frac_of_measured_peak", tflops / c.gemm_tflops, 4)
                             .Field("weight_gbps", wgbps, 1)
                             .Field("graph_us", us_graph, 2)
                             .Field("graph_frac_of_measured_peak", frac_graph, 4)
                             .Field("graph_weight_frac_of_copy", wcopy(us_graph), 4)
                             .Field("graph_us_no_workspace", us_ws0, 2)
                             .Field("graph_us_gemv", us_gemv, 2)  // 0: Gemv does not take M
                             .Close()
                             .Take());
    }
  }
  return absl::OkStatus();
}

// The attention shapes both attention tables time (one rank's heads).
struct AttnShape {
  const char* name;
  int nq, nkv, d;
};
constexpr AttnShape kAttnShapes[] = {{"llama-8b-shape tp1", 32, 8, 128},
                                     {"llama-8b-shape tp2", 16, 4, 128},
                                     {"llama-70b-shape tp2", 32, 4, 128}};

// A JSON row of an attention case, opened with its shape and kernel.
JsonWriter AttnJsonRow(const AttnShape& cf, const char* kernel) {
  JsonWriter w;
  w.Open('{')
      .Field("shape", cf.name)
      .Field("kernel", kernel)
      .Field("q_heads", cf.nq)
      .Field("kv_heads", cf.nkv)
      .Field("head_dim", cf.d);
  return w;
}

template <typename T>
absl::StatusOr<cuda::DeviceBuffer> Upload(const std::vector<T>& v) {
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer b,
                         cuda::DeviceBuffer::Create(std::max<size_t>(v.size() * sizeof(T), 16)));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

// One bf16 attention launch over fused qkv rows (stride (nq + 2 nkv) d) and a
// paged cache of 16-position blocks; split-K and kernel choice left to the caller.
kernels::PagedAttentionArgs AttnArgs(const AttnShape& cf, const cuda::DeviceBuffer& q,
                                     const cuda::DeviceBuffer& kc, const cuda::DeviceBuffer& vc,
                                     const cuda::DeviceBuffer& out, const cuda::DeviceBuffer& pos,
                                     const cuda::DeviceBuffer& table, int table_stride,
                                     const cuda::DeviceBuffer& items, int num_items,
                                     int max_item_tokens, int num_tokens) {
  kernels::PagedAttentionArgs a;
  a.q = q.get();
  a.q_row_stride = static_cast<int64_t>(cf.nq + 2 * cf.nkv) * cf.d;
  a.k_cache = kc.get();
  a.v_cache = vc.get();
  a.out = out.get();
  a.positions = pos.as<int32_t>();
  a.block_tables = table.as<int32_t>();
  a.block_table_stride = table_stride;
  a.block_size = 16;
  a.items = items.as<kernels::AttentionItem>();
  a.num_items = num_items;
  a.max_item_tokens = max_item_tokens;
  a.num_tokens = num_tokens;
  a.num_q_heads = cf.nq;
  a.num_kv_heads = cf.nkv;
  a.head_dim = cf.d;
  a.scale = 1.f / std::sqrt(static_cast<float>(cf.d));
  return a;
}

// Checks one attention output row (bf16) against a double-precision CPU
// softmax(q . k_j / sqrt(d)) v_j over keys 0..last_key; kv_row(j, k, v)
// fetches key j's K and V rows. Error `what` when max |out - ref| exceeds
// 2e-2 max |ref| + 1e-3.
absl::Status CheckAttentionRow(
    const std::vector<uint16_t>& q, const std::vector<uint16_t>& out, int last_key,
    const std::function<absl::Status(int, std::vector<uint16_t>*, std::vector<uint16_t>*)>& kv_row,
    const std::string& what) {
  const size_t d = q.size();
  std::vector<double> sc(last_key + 1), acc(d, 0.0);
  std::vector<std::vector<uint16_t>> vs(last_key + 1);
  std::vector<uint16_t> k(d);
  double mx = -1e300;
  for (int j = 0; j <= last_key; ++j) {
    vs[j].resize(d);
    SYMTP_RETURN_IF_ERROR(kv_row(j, &k, &vs[j]));
    double dot = 0;
    for (size_t i = 0; i < d; ++i)
      dot += static_cast<double>(Bf16ToFloat(q[i])) * Bf16ToFloat(k[i]);
    sc[j] = dot / std::sqrt(static_cast<double>(d));
    mx = std::max(mx, sc[j]);
  }
  double sum = 0;
  for (double& x : sc) sum += (x = std::exp(x - mx));
  for (int j = 0; j <= last_key; ++j) {
    for (size_t i = 0; i < d; ++i) acc[i] += sc[j] / sum * Bf16ToFloat(vs[j][i]);
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < d; ++i) {
    err = std::max(err, std::fabs(Bf16ToFloat(out[i]) - acc[i]));
    ref = std::max(ref, std::fabs(acc[i]));
  }
  if (!(err <= 2e-2 * ref + 1e-3)) {
    return absl::InternalError(
        absl::StrFormat("attention check failed (%s): max error %g, max |ref| %g", what, err, ref));
  }
  return absl::OkStatus();
}

absl::Status BenchDecodeAttention(cudaStream_t s, const Ceilings& c, Json* js) {
  const int ctx = 1024, B = 16;
  // Every kernel at the smallest split-K chunk (256 positions: 4 splits at
  // context 1024), the tensor-core kernel with fewer, longer splits, and the
  // chunk GpuModel plans per step (PlanDecodeSplitChunk; chunk 0 here,
  // printed with a leading '=').
  struct Variant {
    kernels::DecodeKernel kernel;
    int chunk;
    bool tma = false;  // tensor-core, head dim 128: K/V tiles by TMA (cache_slots set)
  };
  const Variant variants[] = {
      {kernels::DecodeKernel::kTiled, 256},      {kernels::DecodeKernel::kTensorCore, 256},
      {kernels::DecodeKernel::kTensorCore, 512}, {kernels::DecodeKernel::kTensorCore, 1024},
      {kernels::DecodeKernel::kTiled, 0},        {kernels::DecodeKernel::kTensorCore, 0},
      {kernels::DecodeKernel::kTensorCore, 0, true}};
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const bool contiguous = absl::GetFlag(FLAGS_attention_contiguous);
  std::printf("\ndecode attention (bf16 cache, context %d, %s block tables)\n", ctx,
              contiguous ? "contiguous" : "scattered");
  std::printf("%-20s %-17s %5s %5s %9s %9s %7s\n", "shape", "kernel", "chunk", "batch", "us",
              "GB/s", "%copy");
  for (const AttnShape& cf : kAttnShapes) {
    for (const Variant& var : variants) {
      const kernels::DecodeKernel dk = var.kernel;
      const std::string kname = absl::StrCat(kernels::DecodeKernelName(dk), var.tma ? "+tma" : "");
      for (int batch : {1, 8, 32, 64, 128, 256, 512}) {
        const int chunk =
            var.chunk > 0 ? var.chunk
                          : kernels::PlanDecodeSplitChunk(
                                std::vector<int32_t>(batch, ctx), cf.nkv,
                                std::max(1, var.tma ? kernels::DecodePlanBlocksPerSm(cf.d, B)
                                                    : kernels::TensorCoreDecodeBlocksPerSm(cf.d)) *
                                    num_sms,
                                /*min_chunk=*/256);
        const int blocks_per_seq = ctx / B;
        const int64_t blocks = static_cast<int64_t>(batch) * blocks_per_seq;
        const int64_t cache_elems = blocks * B * cf.nkv * cf.d;
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer kc, cuda::DeviceBuffer::Create(cache_elems * 2));
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer vc, cuda::DeviceBuffer::Create(cache_elems * 2));
        SYMTP_RETURN_IF_ERROR(FillRandom(kc.get(), cache_elems, 5, 1.f, s));
        SYMTP_RETURN_IF_ERROR(FillRandom(vc.get(), cache_elems, 6, 1.f, s));
        const int64_t qstride = static_cast<int64_t>(cf.nq + 2 * cf.nkv) * cf.d;
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer q,
                               cuda::DeviceBuffer::Create(batch * qstride * 2));
        SYMTP_RETURN_IF_ERROR(FillRandom(q.get(), batch * qstride, 7, 1.f, s));
        SYMTP_ASSIGN_OR_RETURN(
            cuda::DeviceBuffer out,
            cuda::DeviceBuffer::Create(static_cast<size_t>(batch) * cf.nq * cf.d * 2));
        // Block tables: a random permutation of the blocks, or (with
        // --attention-contiguous) each sequence's blocks in order.
        std::vector<int32_t> perm(blocks);
        std::iota(perm.begin(), perm.end(), 0);
        if (!contiguous) std::shuffle(perm.begin(), perm.end(), std::mt19937(batch));
        std::vector<int32_t> pos(batch, ctx - 1);
        std::vector<kernels::AttentionItem> items(batch);
        for (int i = 0; i < batch; ++i) items[i] = {i, i, 1, 0};
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tab, Upload(perm));
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_pos, Upload(pos));
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_items, Upload(items));
        const int splits = (ctx + chunk - 1) / chunk;
        const size_t ws_bytes = kernels::PagedAttentionWorkspaceBytes(batch, cf.nq, cf.d, splits);
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer wsb, cuda::DeviceBuffer::Create(ws_bytes));
        kernels::PagedAttentionArgs a = AttnArgs(cf, q, kc, vc, out, d_pos, d_tab, blocks_per_seq,
                                                 d_items, batch, /*max_item_tokens=*/1, batch);
        a.num_splits = splits;
        a.split_chunk = chunk;
        a.workspace = wsb.get();
        a.workspace_bytes = ws_bytes;
        a.decode_kernel = dk;
        if (var.tma) a.cache_slots = blocks * B;
        auto run = [&](int) { return kernels::PagedAttention(a, DType::kBF16, s); };
        SYMTP_RETURN_IF_ERROR(run(0));
        SYMTP_RETURN_IF_ERROR(Sync(s));
        {  // Verify sequence `batch-1`, q head 1, against a CPU softmax.
          const int seq = batch - 1, h = 1, kvh = h / (cf.nq / cf.nkv);
          std::vector<uint16_t> qh(cf.d), o(cf.d);
          CUDA_RETURN_IF_ERROR(
              cudaMemcpy(qh.data(), static_cast<char*>(q.get()) + (seq * qstride + h * cf.d) * 2,
                         cf.d * 2, cudaMemcpyDeviceToHost));
          CUDA_RETURN_IF_ERROR(cudaMemcpy(
              o.data(), static_cast<char*>(out.get()) + ((int64_t)seq * cf.nq + h) * cf.d * 2,
              cf.d * 2, cudaMemcpyDeviceToHost));
          auto kv_row = [&](int j, std::vector<uint16_t>* kr, std::vector<uint16_t>* vr) {
            const int64_t slot =
                static_cast<int64_t>(perm[seq * blocks_per_seq + j / B]) * B + j % B;
            const size_t off = ((slot * cf.nkv + kvh) * cf.d) * 2;
            CUDA_RETURN_IF_ERROR(cudaMemcpy(kr->data(), static_cast<char*>(kc.get()) + off,
                                            cf.d * 2, cudaMemcpyDeviceToHost));
            CUDA_RETURN_IF_ERROR(cudaMemcpy(vr->data(), static_cast<char*>(vc.get()) + off,
                                            cf.d * 2, cudaMemcpyDeviceToHost));
            return absl::OkStatus();
          };
          SYMTP_RETURN_IF_ERROR(CheckAttentionRow(
              qh, o, ctx - 1, kv_row,
              absl::StrFormat("%s, %s, chunk %d, batch %d", cf.name, kname, chunk, batch)));
        }
        SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, run));
        const double bytes = 2.0 * batch * ctx * cf.nkv * cf.d * 2;  // K + V, bf16
        const double gbps = bytes / (us * 1e-6) / 1e9;
        std::printf("%-20s %-17s %5s %5d %9.1f %9.0f %6.1f%%\n", cf.name, kname.c_str(),
                    absl::StrCat(var.chunk > 0 ? "" : "=", chunk).c_str(), batch, us, gbps,
                    100.0 * gbps / c.copy_gbps);
        js->attn.push_back(AttnJsonRow(cf, kname.c_str())
                               .Field("batch", batch)
                               .Field("context", ctx)
                               .Field("split_chunk", chunk)
                               .Field("chunk_planned", var.chunk <= 0)
                               .Field("contiguous_tables", contiguous)
                               .Field("us", us, 2)
                               .Field("kv_gbps", gbps, 1)
                               .Field("frac_of_copy_bw", gbps / c.copy_gbps, 4)
                               .Close()
                               .Take());
      }
    }
  }
  return absl::OkStatus();
}

// Prefill attention: one sequence of N tokens from position 0 (causal), the
// launch GpuModel makes for it (items of MaxAttentionItemTokens tokens, no
// split), tiled vs tensor-core kernel. Rows checked against a CPU softmax.
absl::Status BenchPrefillAttention(cudaStream_t s, const Ceilings& c, Json* js) {
  const int B = 16;
  std::printf("\nprefill attention (bf16, one sequence from position 0, causal)\n");
  std::printf("%-20s %-12s %6s %9s %9s %7s\n", "shape", "kernel", "tokens", "us", "TFLOP/s",
              "%gemm");
  for (const AttnShape& cf : kAttnShapes) {
    for (int n : {512, 4096}) {
      const int nblk = n / B;
      const int64_t cache_elems = static_cast<int64_t>(n) * cf.nkv * cf.d;
      const int64_t qstride = static_cast<int64_t>(cf.nq + 2 * cf.nkv) * cf.d;
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer kc, cuda::DeviceBuffer::Create(cache_elems * 2));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer vc, cuda::DeviceBuffer::Create(cache_elems * 2));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer q, cuda::DeviceBuffer::Create(n * qstride * 2));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer out,
                             cuda::DeviceBuffer::Create(static_cast<size_t>(n) * cf.nq * cf.d * 2));
      SYMTP_RETURN_IF_ERROR(FillRandom(kc.get(), cache_elems, 15, 1.f, s));
      SYMTP_RETURN_IF_ERROR(FillRandom(vc.get(), cache_elems, 16, 1.f, s));
      SYMTP_RETURN_IF_ERROR(FillRandom(q.get(), n * qstride, 17, 1.f, s));
      std::vector<int32_t> table(nblk), pos(n);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(n));
      std::iota(pos.begin(), pos.end(), 0);
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tab, Upload(table));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_pos, Upload(pos));
      std::vector<uint16_t> hk(cache_elems), hv(cache_elems), hq(n * qstride);
      SYMTP_RETURN_IF_ERROR(Sync(s));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(hk.data(), kc.get(), cache_elems * 2, cudaMemcpyDeviceToHost));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(hv.data(), vc.get(), cache_elems * 2, cudaMemcpyDeviceToHost));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(hq.data(), q.get(), n * qstride * 2, cudaMemcpyDeviceToHost));
      for (kernels::PrefillKernel pk :
           {kernels::PrefillKernel::kTiled, kernels::PrefillKernel::kTensorCore}) {
        const char* kname = kernels::PrefillKernelName(pk);
        // Items as GpuModel cuts them for this kernel.
        const int per = kernels::MaxAttentionItemTokens(cf.nq, cf.nkv, DType::kBF16, cf.d, pk);
        std::vector<kernels::AttentionItem> items;
        kernels::BuildAttentionItems(std::vector<int32_t>{0, n}, per, &items);
        SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_items, Upload(items));
        CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(out.get(), 0xff, static_cast<size_t>(n) * cf.nq * cf.d * 2, s));
        kernels::PagedAttentionArgs a = AttnArgs(cf, q, kc, vc, out, d_pos, d_tab, nblk, d_items,
                                                 static_cast<int>(items.size()), per, n);
        a.prefill_kernel = pk;
        auto run = [&](int) { return kernels::PagedAttention(a, DType::kBF16, s); };
        SYMTP_RETURN_IF_ERROR(run(0));
        SYMTP_RETURN_IF_ERROR(Sync(s));
        // Check (token, q head) rows at the start, middle and end.
        for (const auto& [t, h] :
             {std::pair{0, 0}, std::pair{n / 2 + 3, cf.nq - 1}, std::pair{n - 1, 1}}) {
          const int kvh = h / (cf.nq / cf.nkv);
          std::vector<uint16_t> o(cf.d);
          CUDA_RETURN_IF_ERROR(cudaMemcpy(
              o.data(), static_cast<char*>(out.get()) + ((int64_t)t * cf.nq + h) * cf.d * 2,
              cf.d * 2, cudaMemcpyDeviceToHost));
          const std::vector<uint16_t> qh(hq.begin() + t * qstride + h * cf.d,
                                         hq.begin() + t * qstride + (h + 1) * cf.d);
          auto kv_row = [&](int j, std::vector<uint16_t>* kr, std::vector<uint16_t>* vr) {
            const int64_t slot = static_cast<int64_t>(table[j / B]) * B + j % B;
            const int64_t off = (slot * cf.nkv + kvh) * cf.d;
            std::copy_n(hk.begin() + off, cf.d, kr->begin());
            std::copy_n(hv.begin() + off, cf.d, vr->begin());
            return absl::OkStatus();
          };
          SYMTP_RETURN_IF_ERROR(CheckAttentionRow(
              qh, o, t, kv_row,
              absl::StrFormat("%s, %s, %d tokens, token %d head %d", cf.name, kname, n, t, h)));
        }
        SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 2, n > 1024 ? 5 : 20, run));
        const double flops = 4.0 * cf.d * cf.nq * (static_cast<double>(n) * (n + 1) / 2);
        const double tflops = flops / (us * 1e-6) / 1e12;
        std::printf("%-20s %-12s %6d %9.1f %9.1f %6.1f%%\n", cf.name, kname, n, us, tflops,
                    100.0 * tflops / c.gemm_tflops);
        js->prefill_attn.push_back(AttnJsonRow(cf, kname)
                                       .Field("tokens", n)
                                       .Field("us", us, 2)
                                       .Field("tflops", tflops, 2)
                                       .Field("frac_of_gemm_peak", tflops / c.gemm_tflops, 4)
                                       .Close()
                                       .Take());
      }
    }
  }
  return absl::OkStatus();
}

// Which model_decode cases run (--model-batches, --model-kernels,
// --model-graphs): all by default; fewer keep a profiler's run short.
struct ModelSelection {
  std::vector<int> batches;
  std::vector<int> contexts;  // per batch (same length as batches)
  std::vector<std::string> kernels;  // decode kernel names; empty: both
  std::string graphs;                // on, off or both
  // More model overrides after layers= (e.g. one TP rank's shapes:
  // heads=16,kv_heads=4,head_dim=128,ffn=7168,vocab=64128 for TP = 2).
  std::string overrides;
};

// GpuModelOptions of the model_decode cases: bf16, up to 512
// sequences per step, KV blocks for `kv_seqs` sequences of `ctx` tokens,
// device tokens only.
model::GpuModelOptions DecodeBenchOptions(const model::ModelConfig& cfg, int ctx, bool graphs,
                                          kernels::DecodeKernel dk, int kv_seqs) {
  model::GpuModelOptions o;
  o.attention_decode_kernel = dk;
  o.dtype = DType::kBF16;
  o.max_seqs = 512;
  o.max_batch_tokens = 512;
  o.num_kv_blocks = kv_seqs * sched::BlocksForTokens(ctx, cfg.block_size) + 16;
  o.cuda_graphs = graphs;
  o.host_logits = false;
  return o;
}

// A decode step of `batch` sequences, each at position ctx - 1 (attending
// over ctx keys) with its own KV blocks.
model::BatchInput DecodeBenchInput(const model::ModelConfig& cfg, int batch, int ctx) {
  const int B = cfg.block_size, bps = sched::BlocksForTokens(ctx, B);
  model::BatchInput in;
  in.max_blocks_per_seq = bps;
  in.seq_start.push_back(0);
  for (int i = 0; i < batch; ++i) {
    in.tokens.push_back((i * 7919) % cfg.vocab);
    in.positions.push_back(ctx - 1);
    in.slot_mapping.push_back((i * bps + (ctx - 1) / B) * B + (ctx - 1) % B);
    in.seq_start.push_back(i + 1);
    in.context_len.push_back(ctx);
    for (int b = 0; b < bps; ++b) in.block_tables.push_back(i * bps + b);
    in.sample_index.push_back(i);
  }
  return in;
}

absl::Status BenchModelDecode(int layers, const ModelSelection& sel, cudaStream_t s, Json* js) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg,
                         model::MakeConfig("llama-8b-shape",
                                           absl::StrCat("layers=", layers,
                                                        sel.overrides.empty() ? "" : ",",
                                                        sel.overrides)));
  const std::vector<int>& batches = sel.batches;
  const int max_ctx = *std::max_element(sel.contexts.begin(), sel.contexts.end());
  if (max_ctx > cfg.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--model-contexts: %d keys past the model's max_seq_len %d", max_ctx, cfg.max_seq_len));
  }
  std::printf(
      "\nGpuModel decode step: %s with %d layers (of 32), bf16, TP=1; every sequence attends "
      "over `keys` keys; KV cache zero-filled (timing does not depend on its values); gemm / attn "
      "/ rowpar / other: ms per class from an eager profiled step\n",
      cfg.name.c_str(), layers);
  std::printf("%6s %-13s %6s %6s %10s %10s %8s %8s %8s %8s\n", "graphs", "attention", "batch",
              "keys", "gpu us", "wall us", "gemm", "attn", "rowpar", "other");
  struct Mode {
    bool graphs;
    kernels::DecodeKernel dk;
  };
  using kernels::DecodeKernel;
  for (const Mode& mode :
       {Mode{true, DecodeKernel::kTiled}, Mode{false, DecodeKernel::kTiled},
        Mode{true, DecodeKernel::kTensorCore}, Mode{false, DecodeKernel::kTensorCore}}) {
    const bool graphs = mode.graphs;
    const char* kname = kernels::DecodeKernelName(mode.dk);
    if (sel.graphs != "both" && (sel.graphs == "on") != graphs) continue;
    if (!sel.kernels.empty() &&
        std::find(sel.kernels.begin(), sel.kernels.end(), kname) == sel.kernels.end()) {
      continue;
    }
    // KV blocks for the largest batch measured (512 sequences of a
    // 32-layer model would not fit beside its weights at TP = 1).
    const int kv_seqs = *std::max_element(batches.begin(), batches.end());
    model::GpuModelOptions o = DecodeBenchOptions(cfg, max_ctx, graphs, mode.dk, kv_seqs);
    if (const int r = absl::GetFlag(FLAGS_model_gemm_workspace_min_rows); r >= 0) {
      o.gemm_workspace_min_rows = r;
    }
    o.defer_norm = absl::GetFlag(FLAGS_model_defer_norm);
    SYMTP_ASSIGN_OR_RETURN(model::GpuModel m, model::GpuModel::Create(cfg, 0, 1, 0, o, nullptr));
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const int batch = batches[bi], ctx = sel.contexts[bi];
      const model::BatchInput in = DecodeBenchInput(cfg, batch, ctx);
      model::StepOptions so;
      so.sampling.assign(batch, model::SamplingParams{});
      so.copy_logits = false;
      SYMTP_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create(true));
      SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create(true));
      std::vector<double> gpu_us, wall_us;
      // Warm-up: at least 4 steps (graph capture happens on the 2nd) and
      // 200 ms of them: without it the first batch after GpuModel::Create
      // measured up to 1.5x slower than the next larger one, against the
      // launcher's decode sweep (the GPU coming back up to speed after the
      // model's set-up, presumably).
      const int64_t warm_until = MonotonicNs() + 200'000'000;
      int warm = 0;
      for (int it = 0; it < warm + 10; ++it) {
        const int64_t t0 = MonotonicNs();
        CUDA_RETURN_IF_ERROR(cudaEventRecord(e0.get(), s));
        SYMTP_RETURN_IF_ERROR(m.Forward(in, s, so));
        CUDA_RETURN_IF_ERROR(cudaEventRecord(e1.get(), s));
        SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
        const int64_t t1 = MonotonicNs();
        SYMTP_RETURN_IF_ERROR(
            cuda::WaitEvent(e1.get(), Deadline::AfterMs(60'000), "model_decode step"));
        if (it == 0) {  // check the outputs once
          for (int32_t t : m.host_tokens()) {
            if (t < 0 || t >= cfg.vocab) return absl::InternalError("sampled token out of range");
          }
        }
        if (it == warm && (it < 4 || (t1 < warm_until && warm < 400))) {
          ++warm;
          continue;
        }
        float ms = 0;
        CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
        gpu_us.push_back(1000.0 * ms);
        wall_us.push_back((t1 - t0) / 1e3);
      }
      // One more step between cudaProfilerStart / Stop (no-ops without a
      // profiler): tools/device/kernel_durations.sh with
      // PROFILE_FROM_START=off records only these steps, one per row of the
      // table, in the table's order.
      CUDA_RETURN_IF_ERROR(cudaProfilerStart());
      SYMTP_RETURN_IF_ERROR(m.Forward(in, s, so));
      SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
      CUDA_RETURN_IF_ERROR(cudaProfilerStop());
      model::StepProfile prof;
      if (!graphs) {
        m.set_profiling(true);
        SYMTP_RETURN_IF_ERROR(m.Forward(in, s, so));
        SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
        SYMTP_ASSIGN_OR_RETURN(prof, m.LastStepProfile());
        m.set_profiling(false);
      }
      const double g = Median(gpu_us), w = Median(wall_us);
      std::printf("%6s %-13s %6d %6d %10.1f %10.1f %8.3f %8.3f %8.3f %8.3f\n",
                  graphs ? "on" : "off", kname, batch, ctx, g, w, prof.gemm_ms, prof.attention_ms,
                  prof.row_parallel_ms, prof.other_ms);
      const auto st = m.graph_stats();
      js->model.push_back(JsonWriter()
                              .Open('{')
                              .Field("model", cfg.name)
                              .Field("layers", layers)
                              .Field("dtype", "bfloat16")
                              .Field("tp", 1)
                              .Field("batch", batch)
                              .Field("context", ctx)
                              .Field("cuda_graphs", graphs)
                              .Field("attention_decode_kernel", kname)
                              .Field("step_us_gpu", g, 1)
                              .Field("step_us_wall", w, 1)
                              .Field("graph_replays", st.replays)
                              .Key("profile_ms")
                              .Open('{')
                              .Field("gemm", prof.gemm_ms, 4)
                              .Field("attention", prof.attention_ms, 4)
                              .Field("row_parallel_gemm", prof.row_parallel_ms, 4)
                              .Field("other", prof.other_ms, 4)
                              .Field("total", prof.total_ms, 4)
                              .Close()
                              .Close()
                              .Take());
    }
  }
  return absl::OkStatus();
}

// The values of a list flag ("1,16,1"), each in [lo, hi], else
// InvalidArgument "FLAG: 'x' is not WHAT in [lo, hi]".
absl::StatusOr<std::vector<int>> ParseIntList(const char* flag, const std::vector<std::string>& text,
                                              int lo, int hi, const char* what) {
  std::vector<int> out;
  for (const std::string& b : text) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' is not %s in [%d, %d]", flag, b, what, lo, hi));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status Run() {
  const std::string json_path = absl::GetFlag(FLAGS_json);
  const int layers = absl::GetFlag(FLAGS_layers);
  const std::vector<std::string> gemm_match = absl::GetFlag(FLAGS_gemm_match);
  ModelSelection model_sel;
  model_sel.overrides = absl::GetFlag(FLAGS_model_overrides);
  model_sel.kernels = absl::GetFlag(FLAGS_model_kernels);
  model_sel.graphs = absl::GetFlag(FLAGS_model_graphs);
  if (model_sel.graphs != "on" && model_sel.graphs != "off" && model_sel.graphs != "both") {
    return absl::InvalidArgumentError("--model-graphs: on, off or both");
  }
  SYMTP_ASSIGN_OR_RETURN(model_sel.batches,
                         ParseIntList("--model-batches", absl::GetFlag(FLAGS_model_batches), 1,
                                      512, "a batch"));
  SYMTP_ASSIGN_OR_RETURN(model_sel.contexts,
                         ParseIntList("--model-contexts", absl::GetFlag(FLAGS_model_contexts), 1,
                                      8192, "a key count"));
  if (model_sel.contexts.size() == 1) {
    model_sel.contexts.assign(model_sel.batches.size(), model_sel.contexts[0]);
  } else if (model_sel.contexts.size() != model_sel.batches.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--model-contexts: %d values for %d batches (give one, or one per batch)",
        model_sel.contexts.size(), model_sel.batches.size()));
  }
  std::string why;
  if (cuda::VisibleDeviceCount(&why) == 0) return absl::UnavailableError("no GPU: " + why);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  Json js;
  js.device = JsonWriter()
                  .Open('{')
                  .Field("name", prop.name)
                  .Field("sms", prop.multiProcessorCount)
                  .Field("l2_bytes", prop.l2CacheSize)
                  .Close()
                  .Take();
  SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle h, kernels::CublasLtHandle::Create());
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer ws,
                         cuda::DeviceBuffer::Create(kernels::kGemmWorkspaceBytes));
  SYMTP_ASSIGN_OR_RETURN(Ceilings c, MeasureCeilings(h, ws.get(), stream.get(), &js));
  // The sections are independent: one failing does not hide the others.
  absl::Status first_error;
  auto section = [&](const char* name, absl::Status st) {
    if (st.ok()) return;
    std::printf("SECTION %s FAILED: %s\n", name, st.ToString().c_str());
    if (first_error.ok()) first_error = Annotate(st, name);
  };
  const std::vector<std::string> want = absl::GetFlag(FLAGS_sections);
  auto on = [&](const char* s) { return std::find(want.begin(), want.end(), s) != want.end(); };
  if (on("gemm")) {
    section("decode_gemm", BenchDecodeGemms(h, ws.get(), stream.get(), c, &js, gemm_match));
  }
  if (on("attention")) section("decode_attention", BenchDecodeAttention(stream.get(), c, &js));
  if (on("prefill")) section("prefill_attention", BenchPrefillAttention(stream.get(), c, &js));
  if (on("model") && !absl::GetFlag(FLAGS_skip_model)) {
    section("model_decode", BenchModelDecode(layers, model_sel, stream.get(), &js));
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) return absl::UnavailableError("cannot write " + json_path);
    JsonWriter j(2);  // one row a line
    j.Open('{').Key("device").Raw(js.device).Key("ceilings").Raw(js.ceilings);
    const std::pair<const char*, const std::vector<std::string>*> parts[] = {
        {"decode_gemm", &js.gemm},
        {"decode_attention", &js.attn},
        {"prefill_attention", &js.prefill_attn},
        {"model_decode", &js.model}};
    for (const auto& [key, rows] : parts) {
      j.Key(key).Open('[');
      for (const std::string& row : *rows) j.Raw(row);
      j.Close();
    }
    std::fprintf(f, "%s\n", j.Close().Take().c_str());
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return first_error;
}

}  // namespace
}  // namespace symtp::bench

int main(int argc, char** argv) {
  // The flags are spelled with dashes (--skip-model), as symtp's are; absl's
  // names have underscores.
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0) continue;
    for (char* c = argv[i] + 2; *c != '\0' && *c != '='; ++c) *c = *c == '-' ? '_' : *c;
  }
  absl::SetProgramUsageMessage(
      "device ceilings and the decode-time cost of the model's kernels; flags are spelled with "
      "dashes or underscores (--skip-model)");
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = symtp::bench::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "kernels_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
