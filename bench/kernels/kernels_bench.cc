// kernels_bench: device ceilings and the decode-time cost of the model's
// kernels, measured in one run on one GPU.
//
//   ceilings        bf16 GEMM rate of a large cuBLASLt product (random data),
//                   device-to-device copy bandwidth (bytes read + written)
//   decode_gemm     cuBLASLt at M = 32/128/256/512 tokens for the linear
//                   layers of llama-8b / llama-70b shards at TP = 1 and 2
//                   (weights rotated through a buffer larger than L2)
//   decode_attn     paged decode attention, context 1024, batch 32..512,
//                   GB/s of K+V read, per decode kernel
//   prefill_attn    causal attention of one 512- / 4096-token prompt,
//                   TFLOP/s, tiled vs tensor-core kernel
//   model_decode    GpuModel (TP = 1) decode step of llama-8b-shape with
//                   --layers layers (default 4), context 1024, batch 32..512,
//                   CUDA graphs on and off, time per kernel class (eager)
//   sm90plans       every plan of the sm_90a GEMM on the short decode shapes
//   sm90probe       where that kernel's time goes at M = 256: operand loads
//                   switched off in turn, per-CTA timelines (Sm90GemmProbe)
//   skinny          the weight-streaming GEMM (M <= 32) vs cuBLASLt, per call
//                   in a CUDA graph (not in the default sections)
//   streamk         the stream-K sm_90a GEMM (M = 128, 256) vs cuBLASLt, per
//                   call in a CUDA graph, its grid varied on the short shapes
//                   with per-CTA timelines (not in the default sections)
//   pdl             cuBLASLt GEMMs (M = 256) behind programmatic graph edges:
//                   whether their kernels wait for the upstream grid, and
//                   the time per call (not in the default sections)
//   transposed      the M = 256 decode GEMMs as C^T = W A^T beside C = A W^T
//                   (not in the default sections)
//   modelab         model_decode's step with the heuristic's GEMMs against
//                   autotuned picks, all and one shape at a time, in
//                   interleaved rounds; keeps the picks that make the step
//                   faster (--model-tuning-out FILE: a GEMM tuning table for
//                   --gemm-tuning-file; not in the default sections)
//
// Every kernel's result is spot-checked against a CPU computation before
// it is timed; times are medians of event-timed repetitions after warm-up.
// Usage: kernels_bench [--json FILE] [--layers N] [--skip-model] [--sections LIST]
//        [--model-batches LIST] [--model-kernels LIST] [--model-graphs on|off|both]
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/pdl_probe.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/cuda_raii.h"
#include "common/histogram.h"
#include "common/status_macros.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_skinny.h"
#include "kernels/ops/gemm_sm90.h"
#include "kernels/ops/gemm_streamk.h"
#include "kernels/ops/weight_init.h"
#include "models/batch.h"
#include "models/config.h"
#include "models/cuda/gpu_model.h"

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
  static const bool profiled = std::getenv("CUDA_INJECTION64_PATH") != nullptr ||
                               std::getenv("SYMTP_BENCH_NO_GATE") != nullptr;
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

struct Json {
  std::vector<std::string> gemm, attn, prefill_attn, model, sm90_plans, sm90_probe, skinny, streamk,
      pdl, transposed, model_ab;
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
  js->ceilings = absl::StrFormat(
      "{\"bf16_gemm_tflops\": %.1f, \"bf16_gemm_shape\": [8192, 8192, 8192], "
      "\"d2d_copy_gbps\": %.1f, \"d2d_copy_bytes\": %d}",
      c.gemm_tflops, c.copy_gbps, bytes);
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

// bf16 C[m, n] = A[m, k] W[n, k]^T with the bench's GEMM workspace.
kernels::GemmArgs Bf16GemmArgs(const void* a, const void* w, void* c, int64_t m, int64_t n,
                               int64_t k, void* ws) {
  return kernels::ContiguousGemmArgs(a, w, c, m, n, k, DType::kBF16, ws,
                                     kernels::kGemmWorkspaceBytes);
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
                              const Ceilings& c, Json* js, bool exhaustive,
                              const std::vector<std::string>& match,
                              std::shared_ptr<const kernels::GemmTuningTable> table) {
  const auto shapes = DecodeGemmShapes();
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(512, 3, s));
  const cuda::DeviceBuffer &wbuf = ops.w, &abuf = ops.a, &cbuf = ops.c;
  // The same GEMMs with the algorithm chosen by timing 16 candidates once per
  // shape (CublasLtHandle::set_autotune_candidates; off by default), each per
  // call in a CUDA graph (set_autotune_timing's default).
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle tuned, kernels::CublasLtHandle::Create());
  tuned.set_autotune_candidates(16);
  // --gemm-exhaustive: a third choice, the fastest of every tile / cluster /
  // split-K configuration cuBLASLt accepts (CublasLtHandle::set_autotune_exhaustive).
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle exh, kernels::CublasLtHandle::Create());
  exh.set_autotune_candidates(32);
  exh.set_autotune_exhaustive(true);
  // The hand-written sm_90a kernel (kernels/ops/gemm_sm90.h), where the device has it.
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle sm90, kernels::CublasLtHandle::Create());
  sm90.set_kernel_choice(kernels::GemmKernelChoice::kSm90);
  const bool have_sm90 = kernels::Sm90GemmDeviceSupported();
  // --gemm-table: the algorithms of a GEMM tuning table (the runtime's), per
  // call in a graph; shapes it does not hold run the heuristic (src "-").
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle tab, kernels::CublasLtHandle::Create());
  if (table) SYMTP_RETURN_IF_ERROR(tab.set_tuning_table(table));
  std::printf(
      "\ndecode GEMMs (bf16, fp32 accumulate): C[M,N] = A[M,K] W[N,K]^T; "
      "heuristic = cuBLASLt's first choice, tuned = fastest of 16 (exh: of every configuration) "
      "timed once per shape in CUDA graphs, sm90 = the "
      "hand-written sm_90a kernel (TMA + wgmma, split-K); us = one launch between two events, "
      "graph = per call of 20 captured in a CUDA graph (as decode runs)%s\n",
      table ? "; table = the GEMM tuning table's algorithm per call in a graph (src T: from the "
              "table, -: not in it, the heuristic)"
            : "");
  std::printf("%-16s %2s %-8s %6s %6s %4s %9s %8s %7s %8s %8s %7s %9s %7s %8s %7s%s%s%s\n", "model",
              "tp", "layer", "N", "K", "M", "us", "TFLOP/s", "%peak", "W GB/s", "graph", "%peak",
              "tuned us", "%peak", "graph", "%peak",
              exhaustive ? "   exh us   %peak    graph   %peak" : "",
              have_sm90 ? "  sm90 us   %peak    graph   %peak split" : "",
              table ? "    table   %peak src" : "");
  for (const auto& g : shapes) {
    const size_t wbytes = static_cast<size_t>(g.n * g.k * 2);
    for (int64_t m : {32, 128, 256, 512}) {
      // --gemm-match: only rows whose "model tp=N layer M=m" holds one of the strings.
      const std::string label = absl::StrFormat("%s tp=%d %s M=%d", g.model, g.tp, g.layer, m);
      if (!match.empty() && std::none_of(match.begin(), match.end(), [&](const std::string& x) {
            return label.find(x) != std::string::npos;
          })) {
        continue;
      }
      auto run_on = [&](kernels::CublasLtHandle& hh, int i) {
        const char* w = ops.Weights(g.n, g.k, i);
        return kernels::Gemm(hh, abuf.get(), w, cbuf.get(), m, g.n, g.k, DType::kBF16, ws,
                             kernels::kGemmWorkspaceBytes, s);
      };
      auto run = [&](int i) { return run_on(h, i); };
      auto run_tuned = [&](int i) { return run_on(tuned, i); };
      auto run_exh = [&](int i) { return run_on(exh, i); };
      auto run_sm90 = [&](int i) { return run_on(sm90, i); };
      auto run_tab = [&](int i) { return run_on(tab, i); };
      // Verify two output elements against a CPU dot product first (both choices).
      std::vector<kernels::CublasLtHandle*> checked = {&h, &tuned};
      if (exhaustive) checked.push_back(&exh);
      if (have_sm90) checked.push_back(&sm90);
      const size_t from_table_before = tab.plans_from_table();
      if (table) checked.push_back(&tab);
      for (kernels::CublasLtHandle* hh : checked) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, m * g.n * 2, s));
        SYMTP_RETURN_IF_ERROR(run_on(*hh, 0));
        SYMTP_RETURN_IF_ERROR(Sync(s));
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
            return absl::InternalError(
                absl::StrFormat("GEMM check failed for %s %s M=%d%s: %g vs %g", g.model, g.layer, m,
                                hh == &tuned  ? " (tuned)"
                                : hh == &exh  ? " (exhaustive)"
                                : hh == &sm90 ? " (sm90)"
                                : hh == &tab  ? " (table)"
                                              : "",
                                Bf16ToFloat(cv), ref));
          }
        }
      }
      SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, run));
      SYMTP_ASSIGN_OR_RETURN(double us_graph, GraphUsPerCall(s, 20, 5, run));
      SYMTP_ASSIGN_OR_RETURN(double us_tuned, TimeUs(s, 5, 30, run_tuned));
      SYMTP_ASSIGN_OR_RETURN(double us_tuned_graph, GraphUsPerCall(s, 20, 5, run_tuned));
      double us_exh = 0, us_exh_graph = 0;
      if (exhaustive) {
        SYMTP_ASSIGN_OR_RETURN(us_exh, TimeUs(s, 5, 30, run_exh));
        SYMTP_ASSIGN_OR_RETURN(us_exh_graph, GraphUsPerCall(s, 20, 5, run_exh));
      }
      double us_sm90 = 0, us_sm90_graph = 0;
      if (have_sm90) {
        SYMTP_ASSIGN_OR_RETURN(us_sm90, TimeUs(s, 5, 30, run_sm90));
        SYMTP_ASSIGN_OR_RETURN(us_sm90_graph, GraphUsPerCall(s, 20, 5, run_sm90));
      }
      double us_tab_graph = 0;
      if (table) {
        SYMTP_ASSIGN_OR_RETURN(us_tab_graph, GraphUsPerCall(s, 20, 5, run_tab));
      }
      const bool tab_plan = tab.plans_from_table() > from_table_before;
      const double flop = 2.0 * m * g.n * g.k;
      // Fraction of the measured bf16 rate at `us` per call.
      auto frac = [&](double us_call) { return flop / (us_call * 1e-6) / 1e12 / c.gemm_tflops; };
      const double frac_tab_graph = table ? frac(us_tab_graph) : 0;
      const double frac_graph = frac(us_graph);
      const double frac_sm90_graph = have_sm90 ? frac(us_sm90_graph) : 0.0;
      const double frac_sm90 = have_sm90 ? frac(us_sm90) : 0.0;
      kernels::Sm90GemmPlan plan;
      if (have_sm90) {
        SYMTP_ASSIGN_OR_RETURN(
            plan, kernels::PlanSm90GemmForDevice(m, g.n, g.k, kernels::kGemmWorkspaceBytes));
      }
      const double frac_exh = exhaustive ? frac(us_exh) : 0.0;
      const double frac_exh_graph = exhaustive ? frac(us_exh_graph) : 0.0;
      const double frac_tuned_graph = frac(us_tuned_graph);
      const double tflops_tuned = 2.0 * m * g.n * g.k / (us_tuned * 1e-6) / 1e12;
      const double tflops = 2.0 * m * g.n * g.k / (us * 1e-6) / 1e12;
      const double wgbps = static_cast<double>(wbytes) / (us * 1e-6) / 1e9;
      std::printf(
          "%-16s %2d %-8s %6lld %6lld %4lld %9.1f %8.1f %6.1f%% %8.0f %8.1f %6.1f%% %9.1f "
          "%6.1f%% %8.1f %6.1f%%%s%s%s\n",
          g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k),
          static_cast<long long>(m), us, tflops, 100.0 * tflops / c.gemm_tflops, wgbps, us_graph,
          100.0 * frac_graph, us_tuned, 100.0 * tflops_tuned / c.gemm_tflops, us_tuned_graph,
          100.0 * frac_tuned_graph,
          exhaustive ? absl::StrFormat(" %8.1f %6.1f%% %8.1f %6.1f%%", us_exh, 100.0 * frac_exh,
                                       us_exh_graph, 100.0 * frac_exh_graph)
                           .c_str()
                     : "",
          have_sm90 ? absl::StrFormat(" %8.1f %6.1f%% %8.1f %6.1f%% %dx%d%s", us_sm90,
                                      100.0 * frac_sm90, us_sm90_graph, 100.0 * frac_sm90_graph,
                                      128 * plan.m_sub, plan.splits, plan.global_reduce ? "g" : "")
                          .c_str()
                    : "",
          table ? absl::StrFormat(" %8.1f %6.1f%% %s", us_tab_graph, 100.0 * frac_tab_graph,
                                  tab_plan ? "T" : "-")
                      .c_str()
                : "");
      js->gemm.push_back(absl::StrFormat(
          "{\"model\": \"%s\", \"tp\": %d, \"layer\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
          "\"us\": %.2f, \"tflops\": %.2f, \"frac_of_measured_peak\": %.4f, \"weight_gbps\": "
          "%.1f, \"graph_us\": %.2f, \"graph_frac_of_measured_peak\": %.4f, \"tuned_us\": %.2f, "
          "\"tuned_frac_of_measured_peak\": %.4f, \"tuned_graph_us\": %.2f, "
          "\"tuned_graph_frac_of_measured_peak\": %.4f%s%s%s}",
          g.model, g.tp, g.layer, m, g.n, g.k, us, tflops, tflops / c.gemm_tflops, wgbps, us_graph,
          frac_graph, us_tuned, tflops_tuned / c.gemm_tflops, us_tuned_graph, frac_tuned_graph,
          exhaustive ? absl::StrFormat(", \"exhaustive_us\": %.2f, "
                                       "\"exhaustive_frac_of_measured_peak\": %.4f, "
                                       "\"exhaustive_graph_us\": %.2f, "
                                       "\"exhaustive_graph_frac_of_measured_peak\": %.4f",
                                       us_exh, frac_exh, us_exh_graph, frac_exh_graph)
                     : "",
          have_sm90 ? absl::StrFormat(", \"sm90_us\": %.2f, \"sm90_frac_of_measured_peak\": %.4f, "
                                      "\"sm90_graph_us\": %.2f, "
                                      "\"sm90_graph_frac_of_measured_peak\": %.4f, "
                                      "\"sm90_tile_rows\": %d, \"sm90_splits\": %d, "
                                      "\"sm90_global_reduce\": %s",
                                      us_sm90, frac_sm90, us_sm90_graph, frac_sm90_graph,
                                      128 * plan.m_sub, plan.splits,
                                      plan.global_reduce ? "true" : "false")
                    : "",
          table ? absl::StrFormat(", \"table_graph_us\": %.2f, "
                                  "\"table_graph_frac_of_measured_peak\": %.4f, "
                                  "\"table_plan\": %s",
                                  us_tab_graph, frac_tab_graph, tab_plan ? "true" : "false")
                : ""));
    }
  }
  return absl::OkStatus();
}

// The CPU check of the decode GEMM sections: rows 0 and m - 1 of
// C = A · Wᵀ as a double product of the bf16 operands (computed once), each
// element within 1e-2 of its sum of |terms|.
class EndRowsReference {
 public:
  static absl::StatusOr<EndRowsReference> Compute(const void* a, const void* w, int64_t m,
                                                  int64_t n, int64_t k, cudaStream_t s) {
    std::vector<uint16_t> ah(m * k), wh(n * k);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ah.data(), a, m * k * 2, cudaMemcpyDeviceToHost, s));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(wh.data(), w, n * k * 2, cudaMemcpyDeviceToHost, s));
    SYMTP_RETURN_IF_ERROR(Sync(s));
    EndRowsReference r;
    r.m_ = m;
    r.n_ = n;
    r.ref_.resize(2 * n);
    r.mag_.resize(2 * n);
    for (int row = 0; row < 2; ++row) {
      const int64_t i = row == 0 ? 0 : m - 1;
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double p =
              static_cast<double>(Bf16ToFloat(ah[i * k + kk])) * Bf16ToFloat(wh[j * k + kk]);
          ref += p;
          mag += std::fabs(p);
        }
        r.ref_[row * n + j] = ref;
        r.mag_[row * n + j] = mag;
      }
    }
    return r;
  }

  // Downloads C (bf16 [m, n]) and compares its two rows; `what` names the call.
  absl::Status Check(const void* c, cudaStream_t s, const std::string& what) const {
    std::vector<uint16_t> ch(m_ * n_);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ch.data(), c, ch.size() * 2, cudaMemcpyDeviceToHost, s));
    SYMTP_RETURN_IF_ERROR(Sync(s));
    for (int row = 0; row < 2; ++row) {
      const int64_t i = row == 0 ? 0 : m_ - 1;
      for (int64_t j = 0; j < n_; ++j) {
        const double got = Bf16ToFloat(ch[i * n_ + j]), want = ref_[row * n_ + j];
        if (!(std::fabs(got - want) <= 1e-2 * mag_[row * n_ + j] + 1e-6)) {
          return absl::InternalError(
              absl::StrFormat("%s: C[%d, %d] = %g, want %g", what, i, j, got, want));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  int64_t m_ = 0, n_ = 0;
  std::vector<double> ref_, mag_;  // [2][n]: rows 0 and m - 1
};

// The weight-streaming kernel (gemm_skinny.h) against cuBLASLt at M = 8, 16
// and 32, both per call in a CUDA graph of 20 (as decode runs), weights
// rotated through 4 GiB; the first and last rows of one call checked against
// a CPU product of the same bf16 operands first (both kernels; the GPU tests
// check every element). Not the LM head (the model computes it in fp32).
absl::Status BenchSkinnyGemms(kernels::CublasLtHandle& h, void* ws, cudaStream_t s,
                              const Ceilings& c, Json* js) {
  const auto shapes = DecodeGemmShapes();
  const int64_t max_m = 32;
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(max_m, 5, s));
  const cuda::DeviceBuffer &wbuf = ops.w, &abuf = ops.a, &cbuf = ops.c;
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle sk, kernels::CublasLtHandle::Create());
  sk.set_skinny_max_m(kernels::kSkinnyMaxM);
  std::printf(
      "\nweight-streaming GEMM (bf16, M <= 32) vs cuBLASLt, per call in a CUDA graph of 20; "
      "GB/s of weights read, %% of the measured copy bandwidth (%.0f GB/s)\n",
      c.copy_gbps);
  std::printf("%-16s %2s %-8s %6s %6s %3s %9s %7s %6s %9s %7s %6s %8s\n", "model", "tp", "layer",
              "N", "K", "M", "cublas us", "GB/s", "%copy", "skinny us", "GB/s", "%copy", "speedup");
  for (const auto& g : shapes) {
    if (std::string(g.layer) == "lm_head") continue;
    const size_t wbytes = static_cast<size_t>(g.n * g.k * 2);
    for (int64_t m : {8, 16, 32}) {
      const kernels::GemmArgs probe =
          Bf16GemmArgs(abuf.get(), wbuf.get(), cbuf.get(), m, g.n, g.k, ws);
      if (!kernels::SkinnyGemmSupported(probe)) continue;
      auto run_on = [&](kernels::CublasLtHandle& hh, int i) {
        const char* w = ops.Weights(g.n, g.k, i);
        return kernels::Gemm(hh, abuf.get(), w, cbuf.get(), m, g.n, g.k, DType::kBF16, ws,
                             kernels::kGemmWorkspaceBytes, s);
      };
      // Check: rows 0 and m - 1 of slot 0 against a double product of the bf16 operands.
      SYMTP_ASSIGN_OR_RETURN(const EndRowsReference want,
                             EndRowsReference::Compute(abuf.get(), wbuf.get(), m, g.n, g.k, s));
      for (kernels::CublasLtHandle* hh : {&h, &sk}) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, m * g.n * 2, s));
        SYMTP_RETURN_IF_ERROR(run_on(*hh, 0));
        SYMTP_RETURN_IF_ERROR(
            want.Check(cbuf.get(), s,
                       absl::StrFormat("skinny section: %s %s M=%d (%s)", g.model, g.layer, m,
                                       hh == &sk ? "skinny" : "cuBLASLt")));
      }
      SYMTP_ASSIGN_OR_RETURN(double us_cublas,
                             GraphUsPerCall(s, 20, 5, [&](int i) { return run_on(h, i); }));
      SYMTP_ASSIGN_OR_RETURN(double us_skinny,
                             GraphUsPerCall(s, 20, 5, [&](int i) { return run_on(sk, i); }));
      const double gb_cublas = wbytes / (us_cublas * 1e-6) / 1e9;
      const double gb_skinny = wbytes / (us_skinny * 1e-6) / 1e9;
      std::printf(
          "%-16s %2d %-8s %6lld %6lld %3lld %9.1f %7.0f %5.1f%% %9.1f %7.0f %5.1f%% %7.2fx\n",
          g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k),
          static_cast<long long>(m), us_cublas, gb_cublas, 100.0 * gb_cublas / c.copy_gbps,
          us_skinny, gb_skinny, 100.0 * gb_skinny / c.copy_gbps, us_cublas / us_skinny);
      js->skinny.push_back(absl::StrFormat(
          "{\"model\": \"%s\", \"tp\": %d, \"layer\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
          "\"cublas_graph_us\": %.2f, \"cublas_weight_gbps\": %.1f, \"skinny_graph_us\": %.2f, "
          "\"skinny_weight_gbps\": %.1f, \"copy_gbps\": %.1f}",
          g.model, g.tp, g.layer, m, g.n, g.k, us_cublas, gb_cublas, us_skinny, gb_skinny,
          c.copy_gbps));
    }
  }
  return absl::OkStatus();
}

// The operands of the sm_90a GEMM sections: W rotated through a 2 GiB arena
// (more than L2, so each call reads HBM), A and C for the largest product of
// the section, and the global split-K's tile counters.
struct Sm90Operands {
  static constexpr size_t kArena = size_t{2} << 30;
  static constexpr int64_t kCounters = 1 << 16;
  cuda::DeviceBuffer w, a, c, counters;
  void* ws = nullptr;

  static absl::StatusOr<Sm90Operands> Create(int64_t max_m, int64_t max_k, int64_t max_n, void* ws,
                                             cudaStream_t s) {
    Sm90Operands o;
    o.ws = ws;
    SYMTP_ASSIGN_OR_RETURN(o.w, cuda::DeviceBuffer::Create(kArena));
    SYMTP_RETURN_IF_ERROR(FillRandom(o.w.get(), kArena / 2, 3, 0.02f, s));
    SYMTP_ASSIGN_OR_RETURN(o.a, cuda::DeviceBuffer::Create(max_m * max_k * 2));
    SYMTP_RETURN_IF_ERROR(FillRandom(o.a.get(), max_m * max_k, 4, 1.f, s));
    SYMTP_ASSIGN_OR_RETURN(o.c, cuda::DeviceBuffer::Create(max_m * max_n * 2));
    SYMTP_ASSIGN_OR_RETURN(o.counters, cuda::DeviceBuffer::Create(kCounters * 4));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o.counters.get(), 0, kCounters * 4, s));
    return o;
  }
  // The m x n x k product's arguments (W set per call by Launch).
  kernels::GemmArgs Args(int64_t m, int64_t n, int64_t k) const {
    return Bf16GemmArgs(a.get(), nullptr, c.get(), m, n, k, ws);
  }
  // The i-th of the arena's weight slots of n x k.
  const void* Weights(int i, int64_t n, int64_t k) const {
    const size_t bytes = static_cast<size_t>(n * k * 2);
    return static_cast<const char*>(w.get()) + (i % (kArena / bytes)) * bytes;
  }
  // Call i of the sm_90a kernel on `g` with W slot i.
  absl::Status Launch(kernels::GemmArgs g, const kernels::Sm90GemmPlan& plan, int i,
                      cudaStream_t s, const kernels::Sm90GemmProbe* probe = nullptr) {
    g.w = Weights(i, g.n, g.k);
    return kernels::LaunchSm90Gemm(g, plan, s, counters.as<unsigned int>(), kCounters, probe);
  }
};

// --sections sm90plans: every plan of the sm_90a GEMM (tile height x split
// count) on the decode shapes where cuBLASLt falls short, with the clusters
// the device runs at once: the data the planner's rule rests on.
absl::Status BenchSm90Plans(void* ws, cudaStream_t s, const Ceilings& c, Json* js) {
  if (!kernels::Sm90GemmDeviceSupported()) return absl::OkStatus();
  struct Shape {
    const char* name;
    int64_t n, k;
  } shapes[] = {{"8b tp1 wo", 4096, 4096},  {"8b tp2 qkv", 3072, 4096},
                {"8b tp2 wo", 4096, 2048},  {"8b tp1 qkv", 6144, 4096},
                {"8b tp1 down", 4096, 14336}, {"70b tp2 qkv", 5120, 8192}};
  SYMTP_ASSIGN_OR_RETURN(Sm90Operands ops, Sm90Operands::Create(512, 14336, 6144, ws, s));
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "\nsm90 GEMM plans (us; %%peak; reduce: cluster = through distributed shared memory, "
      "clusters the device runs at once in brackets; global = through the workspace, one "
      "cooperative wave)\n");
  std::printf("%-12s %4s %5s %-7s", "shape", "M", "rows", "reduce");
  for (int sp = 1; sp <= 8; ++sp) std::printf("   split %d      ", sp);
  std::printf("\n");
  for (const Shape& sh : shapes) {
    for (int64_t m : {32, 128, 256, 512}) {
      for (int m_sub : {1, 2}) {
        if (m_sub == 2 && m <= 128) continue;
        for (bool global : {false, true}) {
          std::printf("%-12s %4lld %5d %-7s", sh.name, static_cast<long long>(m), 128 * m_sub,
                      global ? "global" : "cluster");
          for (int sp = 1; sp <= 8; ++sp) {
            const kernels::Sm90GemmPlan plan{m_sub, sp, global};
            const kernels::GemmArgs g = ops.Args(m, sh.n, sh.k);
            if (global && (sp == 1 || kernels::Sm90GemmTiles(m, sh.n, plan) * sp > num_sms ||
                           kernels::Sm90GemmPartialBytes(m, sh.n, plan) > g.workspace_bytes)) {
              std::printf("       -         ");
              continue;
            }
            int clusters = 0;
            if (!global) {
              SYMTP_ASSIGN_OR_RETURN(clusters, kernels::Sm90GemmMaxActiveClusters(plan));
            }
            auto run = [&](int i) { return ops.Launch(g, plan, i, s); };
            SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, run));
            const double frac = 2.0 * m * sh.n * sh.k / (us * 1e-6) / 1e12 / c.gemm_tflops;
            if (global) {
              std::printf(" %6.1f %4.1f%%     ", us, 100 * frac);
            } else {
              std::printf(" %6.1f %4.1f%% [%2d]", us, 100 * frac, clusters);
            }
            js->sm90_plans.push_back(absl::StrFormat(
                "{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"tile_rows\": %d, "
                "\"splits\": %d, \"global_reduce\": %s, \"max_active_clusters\": %d, "
                "\"us\": %.2f, \"frac_of_measured_peak\": %.4f}",
                sh.name, m, sh.n, sh.k, 128 * m_sub, sp, global ? "true" : "false", clusters, us,
                frac));
          }
          std::printf("\n");
        }
      }
    }
  }
  return absl::OkStatus();
}

// --sections streamk: the stream-K sm_90a GEMM (gemm_streamk.h) against
// cuBLASLt's heuristic on every decode shape at M = 128 and 256, both per call
// in a CUDA graph of 20 (as decode runs them) and event-timed; on the three
// shapes cuBLASLt leaves near 60% at M = 256, also other grids and, from one
// stamped launch, the medians of each CTA's phases.
absl::Status BenchStreamKGemms(kernels::CublasLtHandle& h, void* ws, cudaStream_t s,
                               const Ceilings& c, Json* js) {
  if (!kernels::Sm90GemmDeviceSupported()) return absl::OkStatus();
  using Probe = kernels::StreamKGemmProbe;
  const auto shapes = DecodeGemmShapes();
  const int64_t max_m = 256;
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(max_m, 7, s));
  const cuda::DeviceBuffer &abuf = ops.a, &cbuf = ops.c;
  constexpr int64_t kFlags = 1024;
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer flags, cuda::DeviceBuffer::Create(kFlags * 4));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags.get(), 0, kFlags * 4, s));
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer stamps,
                         cuda::DeviceBuffer::Create(kFlags * Probe::kSlots * 8));
  std::printf(
      "\nstream-K sm_90a GEMM vs cuBLASLt (bf16, fp32 accumulate): us per call in a CUDA graph "
      "of 20 (event-timed single launch in brackets), %% of the measured %.0f TFLOP/s; "
      "phases (medians over CTAs of one stamped launch, us): first = start to first unit "
      "landed, loop = its K loops, fix = partial written or later partials added, out = "
      "output stored; span = first CTA start to last CTA end\n",
      c.gemm_tflops);
  std::printf("%-16s %2s %-8s %6s %6s %3s %10s %15s %6s %15s %6s %7s %6s %6s %6s %6s %6s %5s %6s\n",
              "model", "tp", "layer", "N", "K", "M", "ctas/cl/wg", "cublas us", "%peak",
              "streamk us", "%peak", "speedup", "first", "loop", "fix", "out", "span", "GHz",
              "clk/u");
  for (const auto& g : shapes) {
    const bool short_shape =
        g.model == std::string("llama-8b-shape") &&
        ((g.tp == 1 && std::string(g.layer) == "wo") ||
         (g.tp == 2 && (std::string(g.layer) == "qkv" || std::string(g.layer) == "wo")));
    for (int64_t m : {128, 256}) {
      kernels::GemmArgs args = Bf16GemmArgs(abuf.get(), nullptr, cbuf.get(), m, g.n, g.k, ws);
      auto cublas = [&](int i) {
        return kernels::Gemm(h, abuf.get(), ops.Weights(g.n, g.k, i), cbuf.get(), m, g.n, g.k,
                             DType::kBF16, ws, kernels::kGemmWorkspaceBytes, s);
      };
      // Each plan is checked before it is timed: rows 0 and m - 1 of W slot 0
      // against a double product of the bf16 operands.
      args.w = ops.Weights(g.n, g.k, 0);
      SYMTP_ASSIGN_OR_RETURN(const EndRowsReference want,
                             EndRowsReference::Compute(abuf.get(), args.w, m, g.n, g.k, s));
      const double flop = 2.0 * m * g.n * g.k;
      const auto pct = [&](double us) { return 100 * flop / (us * 1e-6) / 1e12 / c.gemm_tflops; };
      SYMTP_ASSIGN_OR_RETURN(const double cu_us, TimeUs(s, 5, 30, cublas));
      SYMTP_ASSIGN_OR_RETURN(const double cu_graph, GraphUsPerCall(s, 20, 5, cublas));
      // Pairs sharing token boxes on the default grid, then single CTAs, each
      // with one and two consumer warpgroups (64- and 128-row W tiles); on the
      // short shapes also smaller grids and clusters of 4.
      std::vector<kernels::StreamKGemmPlan> plans = {{2, 0, 1}, {1, 0, 1}, {2, 0, 2}, {1, 0, 2}};
      if (short_shape && m == 256) {
        for (int64_t g2 : {128, 96, 64}) plans.push_back({2, g2, 1});
        for (int64_t g1 : {96, 64}) plans.push_back({1, g1, 1});
        plans.push_back({4, 0, 1});
        for (int64_t g2 : {96, 64}) plans.push_back({2, g2, 2});
        plans.push_back({4, 0, 2});
      }
      for (kernels::StreamKGemmPlan plan : plans) {
        if (plan.ctas == 0) {
          SYMTP_ASSIGN_OR_RETURN(plan.ctas, kernels::StreamKGemmDefaultCtas(
                                                m, g.n, g.k, plan.cluster, plan.warpgroups));
        }
        const int64_t ctas = plan.ctas;
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, m * g.n * 2, s));
        SYMTP_RETURN_IF_ERROR(
            kernels::LaunchStreamKGemm(args, plan, s, flags.as<unsigned int>(), kFlags));
        SYMTP_RETURN_IF_ERROR(
            want.Check(cbuf.get(), s,
                       absl::StrFormat("stream-K GEMM check for %s tp%d %s M=%d, %s", g.model, g.tp,
                                       g.layer, m, plan.ToString())));
        auto run = [&](int i) {
          kernels::GemmArgs gi = args;
          gi.w = ops.Weights(g.n, g.k, i);
          return kernels::LaunchStreamKGemm(gi, plan, s, flags.as<unsigned int>(), kFlags);
        };
        SYMTP_ASSIGN_OR_RETURN(const double sk_us, TimeUs(s, 5, 30, run));
        SYMTP_ASSIGN_OR_RETURN(const double sk_graph, GraphUsPerCall(s, 20, 5, run));
        // One stamped launch (fresh W slot).
        Probe probe;
        probe.stamps = stamps.as<unsigned long long>();
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stamps.get(), 0, ctas * Probe::kSlots * 8, s));
        {
          kernels::GemmArgs gi = args;
          gi.w = ops.Weights(g.n, g.k, 97);
          SYMTP_RETURN_IF_ERROR(
              kernels::LaunchStreamKGemm(gi, plan, s, flags.as<unsigned int>(), kFlags, &probe));
        }
        std::vector<unsigned long long> st(ctas * Probe::kSlots);
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(st.data(), stamps.get(), st.size() * 8, cudaMemcpyDeviceToHost, s));
        SYMTP_RETURN_IF_ERROR(Sync(s));
        std::vector<double> first, loop, fix, out, clock_ghz, unit_clocks;
        unsigned long long g0 = ~0ull, g1 = 0;
        for (int64_t b = 0; b < ctas; ++b) {
          const unsigned long long* x = &st[b * Probe::kSlots];
          if (x[Probe::kGlobalEnd] == 0) {
            return absl::InternalError(absl::StrFormat("streamk: CTA %d left no stamps", b));
          }
          g0 = std::min(g0, x[Probe::kGlobalStart]);
          g1 = std::max(g1, x[Probe::kGlobalEnd]);
          const double ns = static_cast<double>(x[Probe::kGlobalEnd] - x[Probe::kGlobalStart]);
          const double ghz = ns > 0 ? (x[Probe::kClockEnd] - x[Probe::kClockStart]) / ns : 0;
          const auto us_of = [&](int from, int to) {
            return ghz > 0
                       ? (static_cast<double>(x[to]) - static_cast<double>(x[from])) / ghz / 1000
                       : 0.0;
          };
          first.push_back(us_of(Probe::kClockStart, Probe::kFirstStage));
          loop.push_back(us_of(Probe::kFirstStage, Probe::kLoopEnd));
          fix.push_back(us_of(Probe::kLoopEnd, Probe::kPartialsIn));
          out.push_back(us_of(Probe::kPartialsIn, Probe::kClockEnd));
          clock_ghz.push_back(ghz);
          if (x[Probe::kUnits] > 0) {
            unit_clocks.push_back(static_cast<double>(x[Probe::kLoopEnd] - x[Probe::kFirstStage]) /
                                  static_cast<double>(x[Probe::kUnits]));
          }
        }
        std::printf(
            "%-16s %2d %-8s %6lld %6lld %3lld %6lld/%d/%d %7.1f (%5.1f) %5.1f%% %7.1f (%5.1f) "
            "%5.1f%% "
            "%6.2fx %6.2f %6.2f %6.2f %6.2f %6.1f %5.2f %6.0f\n",
            g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k),
            static_cast<long long>(m), static_cast<long long>(ctas), plan.cluster, plan.warpgroups,
            cu_graph, cu_us, pct(cu_graph), sk_graph, sk_us, pct(sk_graph), cu_graph / sk_graph,
            Median(first), Median(loop), Median(fix), Median(out), (g1 - g0) / 1000.0,
            Median(clock_ghz), Median(unit_clocks));
        js->streamk.push_back(absl::StrFormat(
            "{\"model\": \"%s\", \"tp\": %d, \"layer\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
            "\"ctas\": %d, \"cluster\": %d, \"warpgroups\": %d, \"cublas_graph_us\": %.2f, "
            "\"cublas_us\": %.2f, "
            "\"streamk_graph_us\": %.2f, \"streamk_us\": %.2f, \"frac_cublas_graph\": %.4f, "
            "\"frac_streamk_graph\": %.4f, \"first_us\": %.3f, \"loop_us\": %.3f, "
            "\"fix_us\": %.3f, \"out_us\": %.3f, \"span_us\": %.3f, \"sm_ghz\": %.3f, "
            "\"unit_clocks\": %.1f}",
            g.model, g.tp, g.layer, g.n, g.k, m, ctas, plan.cluster, plan.warpgroups, cu_graph,
            cu_us, sk_graph, sk_us, pct(cu_graph) / 100, pct(sk_graph) / 100, Median(first),
            Median(loop), Median(fix), Median(out), (g1 - g0) / 1000.0, Median(clock_ghz),
            Median(unit_clocks)));
      }
    }
  }
  return absl::OkStatus();
}

// Kernel-to-kernel edges of a captured graph, by type.
struct EdgeCount {
  int plain = 0, programmatic = 0;
};

absl::StatusOr<EdgeCount> CountKernelEdges(cudaGraph_t g) {
  size_t n = 0;
  CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
  EdgeCount c;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType tf, tt;
    CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(from[i], &tf));
    CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(to[i], &tt));
    if (tf != cudaGraphNodeTypeKernel || tt != cudaGraphNodeTypeKernel) continue;
    (data[i].type == cudaGraphDependencyTypeProgrammatic ? c.programmatic : c.plain)++;
  }
  return c;
}

// Turns every plain kernel-to-kernel edge of `g` into a programmatic one
// from `port` (cudaGraphKernelNodePortProgrammatic: the upstream kernel's
// blocks have all triggered or exited; ...LaunchCompletion: they have all
// started). Returns how many it changed.
absl::StatusOr<int> MakeKernelEdgesProgrammatic(cudaGraph_t g, unsigned char port) {
  size_t n = 0;
  CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
  int changed = 0;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType tf, tt;
    CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(from[i], &tf));
    CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(to[i], &tt));
    if (tf != cudaGraphNodeTypeKernel || tt != cudaGraphNodeTypeKernel ||
        data[i].type == cudaGraphDependencyTypeProgrammatic) {
      continue;
    }
    CUDA_RETURN_IF_ERROR(cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1));
    cudaGraphEdgeData e{};
    e.from_port = port;
    e.type = cudaGraphDependencyTypeProgrammatic;
    CUDA_RETURN_IF_ERROR(cudaGraphAddDependencies(g, &from[i], &to[i], &e, 1));
    ++changed;
  }
  return changed;
}

// --sections pdl: whether cuBLASLt's GEMM kernels can be launched early
// (programmatic dependent launch) inside a CUDA graph, and what that gains.
// Per M = 256 decode shape: (1) the kernel edges of a capture of 20 GEMMs
// (does cuBLASLt ask for PDL itself?); (2) the safety probe: a one-block
// kernel that waits 50 us and then rewrites A, followed by the GEMM through a
// programmatic edge (all upstream blocks started); if the GEMM kernel does not
// wait for its upstream grid (griddepcontrol.wait) it reads the old A and
// its output differs from the same pair run in order (the stream-K kernel,
// which never waits, is the control that the probe can fail); (3) per call
// time of the 20 GEMMs with plain edges and with programmatic ones from
// either port, the last output compared bit for bit with the plain graph's.
absl::Status BenchPdlGemms(kernels::CublasLtHandle& h, void* ws, cudaStream_t s, const Ceilings& c,
                           Json* js) {
  const int64_t m = 256;
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(m, 11, s));
  const cuda::DeviceBuffer &abuf = ops.a, &cbuf = ops.c;
  constexpr int64_t kFlags = 1024;
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer flags, cuda::DeviceBuffer::Create(kFlags * 4));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags.get(), 0, kFlags * 4, s));
  std::printf(
      "\nprogrammatic dependent launch of cuBLASLt GEMMs in a CUDA graph (M = 256): edges of a "
      "capture of 20 calls (kernel->kernel, plain/programmatic); probe = output elements that "
      "differ when a slow kernel rewrites A just before the GEMM through a programmatic edge "
      "(0: the GEMM waits for its upstream grid; -1: nothing probed, no kernel-to-kernel edge "
      "to make programmatic or no sm_90a device for the control; control: the stream-K kernel, "
      "which does not wait); "
      "us per call in a graph of 20 with plain edges, programmatic from the upstream's exit "
      "(prog) and from its launch (launch); same = last output bitwise equal to the plain "
      "graph's\n");
  std::printf("%-16s %2s %-8s %6s %6s %11s %7s %8s %8s %6s %8s %6s %8s %6s %5s\n", "model", "tp",
              "layer", "N", "K", "edges p/pr", "probe", "control", "plain us", "%peak", "prog us",
              "%peak", "launch us", "%peak", "same");
  for (const auto& g : DecodeGemmShapes()) {
    if (std::string(g.layer) == "lm_head") continue;
    const double flop = 2.0 * m * g.n * g.k;
    const auto pct = [&](double us) { return 100 * flop / (us * 1e-6) / 1e12 / c.gemm_tflops; };
    const size_t out_bytes = static_cast<size_t>(m * g.n * 2);
    auto gemm = [&](int i) {
      return kernels::Gemm(h, abuf.get(), ops.Weights(g.n, g.k, i), cbuf.get(), m, g.n, g.k,
                           DType::kBF16, ws, kernels::kGemmWorkspaceBytes, s);
    };
    auto download = [&]() -> absl::StatusOr<std::vector<uint16_t>> {
      std::vector<uint16_t> v(out_bytes / 2);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(v.data(), cbuf.get(), out_bytes, cudaMemcpyDeviceToHost, s));
      SYMTP_RETURN_IF_ERROR(Sync(s));
      return v;
    };
    auto differing = [](const std::vector<uint16_t>& x, const std::vector<uint16_t>& y) {
      int64_t d = 0;
      for (size_t i = 0; i < x.size(); ++i) d += x[i] != y[i];
      return d;
    };
    // (2) The safety probe, with cuBLASLt and with the stream-K control.
    auto probe = [&](const std::function<absl::Status()>& consumer) -> absl::StatusOr<int64_t> {
      SYMTP_RETURN_IF_ERROR(LaunchSlowPatternFill(abuf.get(), m * g.k, 1, 0, s));
      SYMTP_RETURN_IF_ERROR(consumer());
      SYMTP_ASSIGN_OR_RETURN(const std::vector<uint16_t> want, download());
      SYMTP_RETURN_IF_ERROR(LaunchSlowPatternFill(abuf.get(), m * g.k, 0, 0, s));
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, out_bytes, s));
      SYMTP_ASSIGN_OR_RETURN(
          const cuda::Graph graph, CaptureCalls(s, 2, [&](int i) {
            return i == 0 ? LaunchSlowPatternFill(abuf.get(), m * g.k, 1, 50000, s) : consumer();
          }));
      SYMTP_ASSIGN_OR_RETURN(
          const int changed,
          MakeKernelEdgesProgrammatic(graph.get(), cudaGraphKernelNodePortLaunchCompletion));
      // No kernel-to-kernel edge (e.g. a memset node between the writer and
      // the GEMM): nothing to probe.
      if (changed == 0) return int64_t{-1};
      SYMTP_ASSIGN_OR_RETURN(const cuda::GraphExec exec, cuda::GraphExec::Instantiate(graph));
      SYMTP_RETURN_IF_ERROR(exec.Launch(s));
      SYMTP_RETURN_IF_ERROR(Sync(s));
      SYMTP_ASSIGN_OR_RETURN(const std::vector<uint16_t> got, download());
      return differing(got, want);
    };
    SYMTP_ASSIGN_OR_RETURN(const int64_t probe_cublas, probe([&] { return gemm(0); }));
    int64_t probe_control = -1;
    if (kernels::Sm90GemmDeviceSupported()) {
      const kernels::GemmArgs args =
          Bf16GemmArgs(abuf.get(), ops.Weights(g.n, g.k, 0), cbuf.get(), m, g.n, g.k, ws);
      const absl::StatusOr<int64_t> control = probe([&] {
        return kernels::LaunchStreamKGemm(args, {}, s, flags.as<unsigned int>(), kFlags);
      });
      if (control.ok()) {
        probe_control = *control;
      } else {
        // Reported, not fatal: the control only shows that the probe can fail.
        std::printf("(stream-K control: %s)\n", control.status().ToString().c_str());
        SYMTP_RETURN_IF_ERROR(Sync(s));
      }
    }
    // Random activations again for the timed graphs.
    SYMTP_RETURN_IF_ERROR(FillRandom(abuf.get(), m * g.k, 12, 1.f, s));
    // (1) and (3).
    SYMTP_ASSIGN_OR_RETURN(const cuda::Graph plain, CaptureCalls(s, 20, gemm));
    SYMTP_ASSIGN_OR_RETURN(const EdgeCount edges, CountKernelEdges(plain.get()));
    double us[3] = {0, 0, 0};
    bool same = true;
    std::vector<uint16_t> first_out;
    for (int v = 0; v < 3; ++v) {
      SYMTP_ASSIGN_OR_RETURN(const cuda::Graph graph, plain.Clone());
      if (v > 0) {
        SYMTP_RETURN_IF_ERROR(MakeKernelEdgesProgrammatic(
                                  graph.get(), v == 1 ? cudaGraphKernelNodePortProgrammatic
                                                      : cudaGraphKernelNodePortLaunchCompletion)
                                  .status());
      }
      SYMTP_ASSIGN_OR_RETURN(const cuda::GraphExec exec, cuda::GraphExec::Instantiate(graph));
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cbuf.get(), 0xff, out_bytes, s));
      SYMTP_ASSIGN_OR_RETURN(const double t, ReplayUs(exec, s, 5));
      us[v] = t / 20;
      SYMTP_ASSIGN_OR_RETURN(std::vector<uint16_t> out, download());
      if (v == 0) {
        first_out = std::move(out);
      } else {
        same = same && differing(out, first_out) == 0;
      }
    }
    std::printf(
        "%-16s %2d %-8s %6lld %6lld %5d/%-5d %7lld %8lld %8.1f %5.1f%% %8.1f %5.1f%% %8.1f %5.1f%% "
        "%5s\n",
        g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k),
        edges.plain, edges.programmatic, static_cast<long long>(probe_cublas),
        static_cast<long long>(probe_control), us[0], pct(us[0]), us[1], pct(us[1]), us[2],
        pct(us[2]), same ? "yes" : "NO");
    js->pdl.push_back(absl::StrFormat(
        "{\"model\": \"%s\", \"tp\": %d, \"layer\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
        "\"edges_plain\": %d, \"edges_programmatic\": %d, \"probe_differing\": %d, "
        "\"control_differing\": %d, \"plain_us\": %.2f, \"prog_us\": %.2f, \"launch_us\": %.2f, "
        "\"frac_plain\": %.4f, \"frac_prog\": %.4f, \"frac_launch\": %.4f, \"same\": %s}",
        g.model, g.tp, g.layer, g.n, g.k, m, edges.plain, edges.programmatic, probe_cublas,
        probe_control, us[0], us[1], us[2], pct(us[0]) / 100, pct(us[1]) / 100, pct(us[2]) / 100,
        same ? "true" : "false"));
  }
  return absl::OkStatus();
}

// --sections transposed: the M = 256 decode GEMMs computed transposed,
// C^T[N, M] = W[N, K] A[M, K]^T (the same Gemm() with W as the first operand),
// which hands cuBLASLt the other orientation; per call in a CUDA graph of 20
// beside the normal form, cuBLASLt's heuristic and the fastest of its
// configurations; every element of the transposed output checked against the
// normal one first.
absl::Status BenchTransposedGemms(kernels::CublasLtHandle& h, void* ws, cudaStream_t s,
                                  const Ceilings& c, Json* js) {
  const int64_t m = 256;
  SYMTP_ASSIGN_OR_RETURN(DecodeGemmOperands ops, MakeDecodeGemmOperands(m, 13, s));
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer out_t, cuda::DeviceBuffer::Create(ops.c.bytes()));
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle exh, kernels::CublasLtHandle::Create());
  exh.set_autotune_candidates(32);
  exh.set_autotune_exhaustive(true);
  std::printf(
      "\ndecode GEMMs at M = 256, normal C = A W^T vs transposed C^T = W A^T (us per call in a "
      "CUDA graph of 20; %% of the measured %.0f TFLOP/s; exh = the fastest cuBLASLt "
      "configuration; max diff = largest |C - (C^T)^T| over the output, in bf16 ulps of the "
      "larger value or of 1%% of the output's RMS if that is larger)\n",
      c.gemm_tflops);
  std::printf("%-16s %2s %-8s %6s %6s %9s %6s %9s %6s %9s %6s %9s %6s %8s\n", "model", "tp",
              "layer", "N", "K", "normal", "%peak", "exh", "%peak", "transp", "%peak", "t exh",
              "%peak", "max diff");
  for (const auto& g : DecodeGemmShapes()) {
    if (std::string(g.layer) == "lm_head") continue;
    const double flop = 2.0 * m * g.n * g.k;
    const auto pct = [&](double us) { return 100 * flop / (us * 1e-6) / 1e12 / c.gemm_tflops; };
    auto normal = [&](kernels::CublasLtHandle& hh, int i) {
      return kernels::Gemm(hh, ops.a.get(), ops.Weights(g.n, g.k, i), ops.c.get(), m, g.n, g.k,
                           DType::kBF16, ws, kernels::kGemmWorkspaceBytes, s);
    };
    auto transposed = [&](kernels::CublasLtHandle& hh, int i) {
      return kernels::Gemm(hh, ops.Weights(g.n, g.k, i), ops.a.get(), out_t.get(), g.n, m, g.k,
                           DType::kBF16, ws, kernels::kGemmWorkspaceBytes, s);
    };
    // Check: every element of (C^T)^T against C, both from W slot 0, for
    // both handles (the first exhaustive calls also pick their algorithm,
    // eagerly, before anything is captured).
    double worst = 0;
    for (kernels::CublasLtHandle* hh : {&h, &exh}) {
      SYMTP_RETURN_IF_ERROR(normal(*hh, 0));
      SYMTP_RETURN_IF_ERROR(transposed(*hh, 0));
      std::vector<uint16_t> cn(m * g.n), ct(m * g.n);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(cn.data(), ops.c.get(), cn.size() * 2, cudaMemcpyDeviceToHost, s));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(ct.data(), out_t.get(), ct.size() * 2, cudaMemcpyDeviceToHost, s));
      SYMTP_RETURN_IF_ERROR(Sync(s));
      // Values below 1% of the output's RMS count at that floor (their
      // fp32 sums cancel, so a different summation order moves them more).
      double sq = 0;
      for (uint16_t v : cn) sq += static_cast<double>(Bf16ToFloat(v)) * Bf16ToFloat(v);
      const double floor = 1e-2 * std::sqrt(sq / static_cast<double>(cn.size()));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < g.n; ++j) {
          const float x = Bf16ToFloat(cn[i * g.n + j]), y = Bf16ToFloat(ct[j * m + i]);
          if (x == y) continue;
          const double big = std::max(
              {static_cast<double>(std::fabs(x)), static_cast<double>(std::fabs(y)), floor});
          const double ulp = std::ldexp(1.0, std::ilogb(big) - 7);
          const double d = std::fabs(static_cast<double>(x) - y) / ulp;
          worst = std::max(worst, std::isfinite(d) ? d : 1e9);
        }
      }
    }
    if (worst > 2) {
      return absl::InternalError(
          absl::StrFormat("transposed GEMM check failed for %s tp%d %s: outputs differ by %g ulps",
                          g.model, g.tp, g.layer, worst));
    }
    SYMTP_ASSIGN_OR_RETURN(const double n_us,
                           GraphUsPerCall(s, 20, 5, [&](int i) { return normal(h, i); }));
    SYMTP_ASSIGN_OR_RETURN(const double ne_us,
                           GraphUsPerCall(s, 20, 5, [&](int i) { return normal(exh, i); }));
    SYMTP_ASSIGN_OR_RETURN(const double t_us,
                           GraphUsPerCall(s, 20, 5, [&](int i) { return transposed(h, i); }));
    SYMTP_ASSIGN_OR_RETURN(const double te_us,
                           GraphUsPerCall(s, 20, 5, [&](int i) { return transposed(exh, i); }));
    std::printf(
        "%-16s %2d %-8s %6lld %6lld %9.1f %5.1f%% %9.1f %5.1f%% %9.1f %5.1f%% %9.1f %5.1f%% "
        "%8.1f\n",
        g.model, g.tp, g.layer, static_cast<long long>(g.n), static_cast<long long>(g.k), n_us,
        pct(n_us), ne_us, pct(ne_us), t_us, pct(t_us), te_us, pct(te_us), worst);
    js->transposed.push_back(absl::StrFormat(
        "{\"model\": \"%s\", \"tp\": %d, \"layer\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
        "\"normal_us\": %.2f, \"normal_exh_us\": %.2f, \"transposed_us\": %.2f, "
        "\"transposed_exh_us\": %.2f, \"frac_normal\": %.4f, \"frac_normal_exh\": %.4f, "
        "\"frac_transposed\": %.4f, \"frac_transposed_exh\": %.4f, \"max_diff_ulps\": %.1f}",
        g.model, g.tp, g.layer, g.n, g.k, m, n_us, ne_us, t_us, te_us, pct(n_us) / 100,
        pct(ne_us) / 100, pct(t_us) / 100, pct(te_us) / 100, worst));
  }
  return absl::OkStatus();
}

// --sections sm90probe: where the sm_90a GEMM's time goes on the three
// M = 256 shapes cuBLASLt leaves below 60%. Per plan: the median time as is,
// with A or W (or both) loaded only into the ring's first fill (wrong output,
// diagnostics only: how much each operand's loads cost), and, from one
// stamped launch, each CTA's timeline (Sm90GemmProbe): start skew across
// CTAs, SM clock, time to the first stage, K step time (median and slowest
// CTA), epilogue stores, the wait for the tile's other splits, the reduction.
absl::Status BenchSm90Probe(kernels::CublasLtHandle& h, void* ws, cudaStream_t s, const Ceilings& c,
                            Json* js) {
  if (!kernels::Sm90GemmDeviceSupported()) return absl::OkStatus();
  using Probe = kernels::Sm90GemmProbe;
  struct Shape {
    const char* name;
    int64_t n, k;
  } shapes[] = {{"8b tp1 wo", 4096, 4096}, {"8b tp2 qkv", 3072, 4096}, {"8b tp2 wo", 4096, 2048}};
  const kernels::Sm90GemmPlan plans[] = {{2, 1, false}, {2, 2, false}, {2, 2, true},
                                         {2, 3, true},  {2, 4, true},  {2, 5, true},
                                         {1, 1, false}, {1, 2, false}, {1, 2, true}};
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t m = 256;
  SYMTP_ASSIGN_OR_RETURN(Sm90Operands ops, Sm90Operands::Create(m, 4096, 4096, ws, s));
  constexpr int64_t kMaxCtas = 1024;
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer stamps,
                         cuda::DeviceBuffer::Create(kMaxCtas * Probe::kSlots * 8));
  std::printf(
      "\nsm90 GEMM probe, M = 256 (us = median time; noA / noW / noAW = A / W / both loaded "
      "only into the ring's first fill; timeline of one stamped launch, medians over CTAs: "
      "skew = last CTA start - first, MHz = SM clock, first = start to first stage landed, "
      "step = K step (ns; max = slowest CTA), send = chunks out to the other splits, wait = "
      "until the other splits' chunks are in (unsplit: the staging), sum = summed and staged, "
      "out = output stores issued, span = first CTA start to last CTA end)\n");
  {
    // What the timing itself costs: a 16-byte memset (one tiny kernel).
    auto noop = [&](int) -> absl::Status {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ops.c.get(), 0, 16, s));
      return absl::OkStatus();
    };
    SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, noop));
    SYMTP_ASSIGN_OR_RETURN(double gus, GraphUsPerCall(s, 20, 5, noop));
    std::printf("a 16-byte memset: %.2f us event-timed, %.2f us per call in a graph of 20\n", us,
                gus);
    js->sm90_probe.push_back(absl::StrFormat(
        "{\"plan\": \"memset16\", \"us\": %.2f, \"graph_us_per_call\": %.2f}", us, gus));
  }
  std::printf("%-11s %-22s %4s %7s %7s %7s %7s %7s %6s %5s %6s %6s %6s %6s %6s %6s %6s %6s\n",
              "shape", "plan", "ctas", "us", "graph", "noA", "noW", "noAW", "skew", "MHz", "first",
              "step", "max", "send", "wait", "sum", "out", "span");
  for (const Shape& sh : shapes) {
    const kernels::GemmArgs g = ops.Args(m, sh.n, sh.k);
    {
      auto run = [&](int i) {
        kernels::GemmArgs gi = g;
        gi.w = ops.Weights(i, sh.n, sh.k);
        return kernels::Gemm(h, gi, s);
      };
      SYMTP_ASSIGN_OR_RETURN(double us, TimeUs(s, 5, 30, run));
      SYMTP_ASSIGN_OR_RETURN(double gus, GraphUsPerCall(s, 20, 5, run));
      const double flop = 2.0 * m * sh.n * sh.k;
      std::printf("%-11s %-22s %4s %7.1f %7.1f  (%.1f%% / %.1f%% of %.0f TFLOP/s)\n", sh.name,
                  "cuBLASLt heuristic", "", us, gus,
                  100 * flop / (us * 1e-6) / 1e12 / c.gemm_tflops,
                  100 * flop / (gus * 1e-6) / 1e12 / c.gemm_tflops, c.gemm_tflops);
      js->sm90_probe.push_back(absl::StrFormat(
          "{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"plan\": \"cublaslt\", "
          "\"us\": %.2f, \"graph_us_per_call\": %.2f}",
          sh.name, m, sh.n, sh.k, us, gus));
    }
    for (const kernels::Sm90GemmPlan& plan : plans) {
      const int64_t ctas = kernels::Sm90GemmTiles(m, sh.n, plan) * plan.splits;
      if (ctas > kMaxCtas || (plan.global_reduce && ctas > num_sms)) continue;
      double us[4] = {0, 0, 0, 0};
      for (int flags = 0; flags < 4; ++flags) {
        Probe probe;
        probe.flags = flags;
        auto run = [&](int i) { return ops.Launch(g, plan, i, s, &probe); };
        SYMTP_ASSIGN_OR_RETURN(us[flags], TimeUs(s, 5, 30, run));
      }
      auto run = [&](int i) { return ops.Launch(g, plan, i, s); };
      SYMTP_ASSIGN_OR_RETURN(const double gus, GraphUsPerCall(s, 20, 5, run));
      // One stamped launch of the real kernel (fresh W slot).
      Probe probe;
      probe.stamps = stamps.as<unsigned long long>();
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stamps.get(), 0, ctas * Probe::kSlots * 8, s));
      SYMTP_RETURN_IF_ERROR(ops.Launch(g, plan, 97, s, &probe));
      std::vector<unsigned long long> st(ctas * Probe::kSlots);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(st.data(), stamps.get(), st.size() * 8, cudaMemcpyDeviceToHost, s));
      SYMTP_RETURN_IF_ERROR(Sync(s));
      unsigned long long g0 = ~0ull, g_last_start = 0, g1 = 0;
      std::vector<double> mhz, first, step, send, wait, sum, out;
      std::string raw;
      for (int64_t b = 0; b < ctas; ++b) {
        const unsigned long long* x = &st[b * Probe::kSlots];
        if (x[Probe::kGlobalEnd] == 0) {
          return absl::InternalError(
              absl::StrFormat("sm90probe: CTA %d of %s left no stamps", b, plan.ToString()));
        }
        g0 = std::min(g0, x[Probe::kGlobalStart]);
        g_last_start = std::max(g_last_start, x[Probe::kGlobalStart]);
        g1 = std::max(g1, x[Probe::kGlobalEnd]);
        const double ns = static_cast<double>(x[Probe::kGlobalEnd] - x[Probe::kGlobalStart]);
        const double f = ns > 0 ? (x[Probe::kClockEnd] - x[Probe::kClockStart]) / ns : 0;  // GHz
        mhz.push_back(1000 * f);
        const auto us_of = [&](int from, int to) {
          return f > 0 ? (static_cast<double>(x[to]) - static_cast<double>(x[from])) / f / 1000
                       : 0.0;
        };
        first.push_back(us_of(Probe::kClockStart, Probe::kFirstStage));
        const int iters = static_cast<int>(x[Probe::kIters]);
        step.push_back(iters > 1 ? 1000 * us_of(Probe::kFirstStage, Probe::kKLoopEnd) / (iters - 1)
                                 : 0.0);
        send.push_back(us_of(Probe::kKLoopEnd, Probe::kStored));
        wait.push_back(us_of(Probe::kStored, Probe::kSplitsIn));
        sum.push_back(us_of(Probe::kSplitsIn, Probe::kReduced));
        out.push_back(us_of(Probe::kReduced, Probe::kClockEnd));
        absl::StrAppend(&raw, b ? ", " : "", "[");
        for (int slot = 0; slot < Probe::kSlots; ++slot) {
          absl::StrAppend(&raw, slot ? ", " : "", x[slot]);
        }
        absl::StrAppend(&raw, "]");
      }
      const double step_max = *std::max_element(step.begin(), step.end());
      const auto med = [](const std::vector<double>& v) { return v.empty() ? 0.0 : Median(v); };
      std::printf(
          "%-11s %-22s %4lld %7.1f %7.1f %7.1f %7.1f %7.1f %6.2f %5.0f %6.2f %6.0f %6.0f %6.2f "
          "%6.2f %6.2f %6.2f %6.1f\n",
          sh.name,
          absl::StrFormat("%dx128 %dx%s", 128 * plan.m_sub, plan.splits,
                          plan.splits == 1     ? ""
                          : plan.global_reduce ? " global"
                                               : " cluster")
              .c_str(),
          static_cast<long long>(ctas), us[0], gus, us[1], us[2], us[3],
          (g_last_start - g0) / 1000.0, med(mhz), med(first), med(step), step_max, med(send),
          med(wait), med(sum), med(out), (g1 - g0) / 1000.0);
      js->sm90_probe.push_back(absl::StrFormat(
          "{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"plan\": \"%s\", \"ctas\": %d, "
          "\"us\": %.2f, \"graph_us_per_call\": %.2f, \"us_skip_a\": %.2f, \"us_skip_w\": %.2f, "
          "\"us_skip_aw\": %.2f, "
          "\"start_skew_us\": %.3f, \"sm_mhz\": %.0f, \"first_stage_us\": %.3f, "
          "\"k_step_ns\": %.1f, \"k_step_ns_max\": %.1f, \"send_us\": %.3f, "
          "\"wait_us\": %.3f, \"sum_us\": %.3f, \"out_us\": %.3f, \"span_us\": %.3f, "
          "\"cta_stamps_slots\": \"global_start, global_end, clock_start, first_stage, "
          "k_loop_end, sent, splits_in, reduced, clock_end, sm, iters\", \"cta_stamps\": [%s]}",
          sh.name, m, sh.n, sh.k, plan.ToString(), ctas, us[0], gus, us[1], us[2], us[3],
          (g_last_start - g0) / 1000.0, med(mhz), med(first), med(step), step_max, med(send),
          med(wait), med(sum), med(out), (g1 - g0) / 1000.0, raw));
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
                                     {"llama-70b-shape tp2", 32, 4, 128}};

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
  };
  const Variant variants[] = {
      {kernels::DecodeKernel::kTiled, 256},       {kernels::DecodeKernel::kWarpStreamed, 256},
      {kernels::DecodeKernel::kTensorCore, 256},  {kernels::DecodeKernel::kTensorCore, 512},
      {kernels::DecodeKernel::kTensorCore, 1024}, {kernels::DecodeKernel::kTiled, 0},
      {kernels::DecodeKernel::kTensorCore, 0}};
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("\ndecode attention (bf16 cache, context %d)\n", ctx);
  std::printf("%-20s %-13s %5s %5s %9s %9s %7s\n", "shape", "kernel", "chunk", "batch", "us",
              "GB/s", "%copy");
  for (const AttnShape& cf : kAttnShapes) {
    for (const Variant& var : variants) {
      const kernels::DecodeKernel dk = var.kernel;
      const char* kname = kernels::DecodeKernelName(dk);
      for (int batch : {32, 64, 128, 256, 512}) {
        const int chunk = var.chunk > 0
                              ? var.chunk
                              : kernels::PlanDecodeSplitChunk(std::vector<int32_t>(batch, ctx),
                                                              cf.nkv, num_sms, /*min_chunk=*/256);
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
        // Scattered block tables: a random permutation of the blocks.
        std::vector<int32_t> perm(blocks);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(batch));
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
        std::printf("%-20s %-13s %5s %5d %9.1f %9.0f %6.1f%%\n", cf.name, kname,
                    absl::StrCat(var.chunk > 0 ? "" : "=", chunk).c_str(), batch, us, gbps,
                    100.0 * gbps / c.copy_gbps);
        js->attn.push_back(absl::StrFormat(
            "{\"shape\": \"%s\", \"kernel\": \"%s\", \"q_heads\": %d, \"kv_heads\": %d, "
            "\"head_dim\": %d, \"batch\": %d, \"context\": %d, \"split_chunk\": %d, "
            "\"chunk_planned\": %s, \"us\": %.2f, "
            "\"kv_gbps\": %.1f, \"frac_of_copy_bw\": %.4f}",
            cf.name, kname, cf.nq, cf.nkv, cf.d, batch, ctx, chunk,
            var.chunk > 0 ? "false" : "true", us, gbps, gbps / c.copy_gbps));
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
      const int per = kernels::MaxAttentionItemTokens(cf.nq, cf.nkv);
      std::vector<kernels::AttentionItem> items;
      kernels::BuildAttentionItems(std::vector<int32_t>{0, n}, per, &items);
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tab, Upload(table));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_pos, Upload(pos));
      SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_items, Upload(items));
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
        js->prefill_attn.push_back(absl::StrFormat(
            "{\"shape\": \"%s\", \"kernel\": \"%s\", \"q_heads\": %d, \"kv_heads\": %d, "
            "\"head_dim\": %d, \"tokens\": %d, \"us\": %.2f, \"tflops\": %.2f, "
            "\"frac_of_gemm_peak\": %.4f}",
            cf.name, kname, cf.nq, cf.nkv, cf.d, n, us, tflops, tflops / c.gemm_tflops));
      }
    }
  }
  return absl::OkStatus();
}

// Which model_decode cases run (--model-batches, --model-kernels,
// --model-graphs): all by default; fewer keep a profiler's run short.
struct ModelSelection {
  std::vector<int> batches = {32, 64, 128, 256, 512};
  std::vector<std::string> kernels;  // decode kernel names; empty: all three
  std::string graphs = "both";       // on, off or both
  std::vector<int> gemm_autotune = {1};  // GpuModelOptions::gemm_autotune_candidates, each
  // modelab (BenchModelGemmAb):
  int ab_candidates = 16;     // --model-ab-candidates
  double ab_pick_margin = 0;  // --model-ab-pick-margin: the autotuner's own margin
  double ab_margin = 0.005;   // --model-ab-margin: a step gain needed to keep a pick
  int ab_rounds = 7;          // --model-ab-rounds
  std::string tuning_out;     // --model-tuning-out
  int tp = 1;                 // --model-tp: a TP = tp shard (rank 0) alone
};

// GpuModelOptions of the model_decode / modelab cases: bf16, up to 512
// sequences per step, KV blocks for `kv_seqs` sequences of `ctx` tokens,
// device tokens only.
model::GpuModelOptions DecodeBenchOptions(const model::ModelConfig& cfg, int ctx, bool graphs,
                                          kernels::DecodeKernel dk, int kv_seqs) {
  model::GpuModelOptions o;
  o.attention_decode_kernel = dk;
  o.dtype = DType::kBF16;
  o.max_seqs = 512;
  o.max_batch_tokens = 512;
  o.num_kv_blocks = kv_seqs * (ctx / cfg.block_size) + 16;
  o.cuda_graphs = graphs;
  o.host_logits = false;
  return o;
}

// A decode step of `batch` sequences, each at position ctx - 1 with its own
// ctx / block_size KV blocks.
model::BatchInput DecodeBenchInput(const model::ModelConfig& cfg, int batch, int ctx) {
  const int B = cfg.block_size, bps = ctx / B;
  model::BatchInput in;
  in.max_blocks_per_seq = bps;
  in.seq_start.push_back(0);
  for (int i = 0; i < batch; ++i) {
    in.tokens.push_back((i * 7919) % cfg.vocab);
    in.positions.push_back(ctx - 1);
    in.slot_mapping.push_back((i * bps + bps - 1) * B + (ctx - 1) % B);
    in.seq_start.push_back(i + 1);
    in.context_len.push_back(ctx);
    for (int b = 0; b < bps; ++b) in.block_tables.push_back(i * bps + b);
    in.sample_index.push_back(i);
  }
  return in;
}

absl::Status BenchModelDecode(int layers, const ModelSelection& sel, cudaStream_t s, Json* js) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg,
                         model::MakeConfig("llama-8b-shape", absl::StrCat("layers=", layers)));
  const int ctx = 1024;
  const std::vector<int>& batches = sel.batches;
  std::printf(
      "\nGpuModel decode step: %s with %d layers (of 32), bf16, TP=1, context %d; KV "
      "cache zero-filled (timing does not depend on its values); tune = GEMM autotune "
      "candidates (1: cuBLASLt's heuristic); gemm / attn / rowpar / other: ms per class from an "
      "eager profiled step\n",
      cfg.name.c_str(), layers, ctx);
  std::printf("%6s %-13s %4s %6s %10s %10s %8s %8s %8s %8s\n", "graphs", "attention", "tune",
              "batch", "gpu us", "wall us", "gemm", "attn", "rowpar", "other");
  struct Mode {
    bool graphs;
    kernels::DecodeKernel dk;
  };
  using kernels::DecodeKernel;
  for (const int tune : sel.gemm_autotune) {
    for (const Mode& mode :
         {Mode{true, DecodeKernel::kTiled}, Mode{false, DecodeKernel::kTiled},
          Mode{true, DecodeKernel::kWarpStreamed}, Mode{false, DecodeKernel::kWarpStreamed},
          Mode{true, DecodeKernel::kTensorCore}, Mode{false, DecodeKernel::kTensorCore}}) {
      const bool graphs = mode.graphs;
      const char* kname = kernels::DecodeKernelName(mode.dk);
      if (sel.graphs != "both" && (sel.graphs == "on") != graphs) continue;
      if (!sel.kernels.empty() &&
          std::find(sel.kernels.begin(), sel.kernels.end(), kname) == sel.kernels.end()) {
        continue;
      }
      model::GpuModelOptions o = DecodeBenchOptions(cfg, ctx, graphs, mode.dk, 512);
      o.gemm_autotune_candidates = tune;
      SYMTP_ASSIGN_OR_RETURN(model::GpuModel m, model::GpuModel::Create(cfg, 0, 1, 0, o, nullptr));
      for (int batch : batches) {
        const model::BatchInput in = DecodeBenchInput(cfg, batch, ctx);
        model::StepOptions so;
        so.sampling.assign(batch, model::SamplingParams{});
        so.copy_logits = false;
        SYMTP_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create(true));
        SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create(true));
        std::vector<double> gpu_us, wall_us;
        // Warm-up: at least 4 steps (graph capture happens on the 2nd) and
        // 200 ms of them: the first batch after GpuModel::Create measured up to
        // 1.5x slower than the next larger one in every run before session 6,
        // against the launcher's decode sweep (the GPU coming back up to speed
        // after the model's set-up, presumably).
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
        std::printf("%6s %-13s %4d %6d %10.1f %10.1f %8.3f %8.3f %8.3f %8.3f\n",
                    graphs ? "on" : "off", kname, tune, batch, g, w, prof.gemm_ms,
                    prof.attention_ms, prof.row_parallel_ms, prof.other_ms);
        const auto st = m.graph_stats();
        js->model.push_back(absl::StrFormat(
            "{\"model\": \"%s\", \"layers\": %d, \"dtype\": \"bfloat16\", \"tp\": 1, \"batch\": "
            "%d, "
            "\"context\": %d, \"cuda_graphs\": %s, \"attention_decode_kernel\": \"%s\", "
            "\"gemm_autotune\": %d, "
            "\"step_us_gpu\": %.1f, \"step_us_wall\": %.1f, "
            "\"graph_replays\": %d, \"profile_ms\": {\"gemm\": %.4f, \"attention\": %.4f, "
            "\"row_parallel_gemm\": %.4f, \"other\": %.4f, \"total\": %.4f}}",
            cfg.name, layers, batch, ctx, graphs ? "true" : "false", kname, tune, g, w, st.replays,
            prof.gemm_ms, prof.attention_ms, prof.row_parallel_ms, prof.other_ms, prof.total_ms));
      }
    }
  }
  return absl::OkStatus();
}

// Names a decode GEMM of a TP = tp shard of `cfg` by its N x K.
std::string GemmLayerName(const model::ModelConfig& cfg, int tp, const kernels::GemmTuningKey& k) {
  const int64_t q = int64_t{cfg.heads} * cfg.head_dim / tp,
                kv = int64_t{cfg.kv_heads} * cfg.head_dim / tp, f = cfg.ffn / tp;
  std::string name = "other";
  if (k.n == q + 2 * kv && k.k == cfg.hidden) name = "qkv";
  if (k.n == cfg.hidden && k.k == q) name = "wo";
  if (k.n == 2 * f && k.k == cfg.hidden) name = "gate_up";
  if (k.n == cfg.hidden && k.k == f) name = "down";
  if (k.n == cfg.vocab / tp && k.k == cfg.hidden) name = "lm_head";
  return absl::StrFormat("%s M=%d", name, k.m);
}

// --sections modelab: a decode step (GpuModel, graphs on, tensor-core
// attention) with cuBLASLt's heuristic GEMMs against the same step with
// autotuned picks, all of them and one GEMM shape at a time (the others
// the heuristic's, through tuning tables), timed in interleaved rounds so
// that drift hits every variant alike; a second heuristic model is the
// noise floor. A pick is kept when its step alone beats the heuristic's by
// more than --model-ab-margin. Then, on fresh models, the heuristic, the
// kept picks and all autotuned picks are timed once more (the picks do not
// add up: in runs ai-aj all of them together gained more than the sum of
// their single gains), and the fastest of the three, if it beats the
// heuristic by the margin (else the heuristic), is what --model-tuning-out
// gets: an algorithm for every GEMM shape of the step.
absl::Status BenchModelGemmAb(int layers, const ModelSelection& sel, const Ceilings& c,
                              cudaStream_t s, Json* js) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg,
                         model::MakeConfig("llama-8b-shape", absl::StrCat("layers=", layers)));
  const int ctx = 1024, steps = 20;
  SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningIdentity id,
                         kernels::CurrentGemmTuningIdentity());
  kernels::GemmTuningTable keep(id);
  std::printf(
      "\nGEMM picks in a decode step: %s with %d layers, bf16, TP=%d%s, context %d, graphs on, "
      "tensor-core attention; step us = median over %d interleaved rounds of the median of %d "
      "steps (GPU time); autotune %d candidates, margin %.1f%%\n",
      cfg.name.c_str(), layers, sel.tp,
      sel.tp > 1 ? " (rank 0's shard alone: no all-reduce, no LM-head all-gather)" : "", ctx,
      sel.ab_rounds, steps, sel.ab_candidates, 100 * sel.ab_margin);
  for (const int batch : sel.batches) {
    const model::BatchInput in = DecodeBenchInput(cfg, batch, ctx);
    model::StepOptions so;
    so.sampling.assign(batch, model::SamplingParams{});
    so.copy_logits = false;
    struct Variant {
      std::string name;
      std::unique_ptr<model::GpuModel> m;
      std::vector<double> us;                     // per round
      std::optional<kernels::GemmTuningKey> key;  // the one tuned shape
      std::shared_ptr<const kernels::GemmTuningTable> table;  // its algorithms (check phase)
    };
    SYMTP_ASSIGN_OR_RETURN(cuda::Event e0, cuda::Event::Create(true));
    SYMTP_ASSIGN_OR_RETURN(cuda::Event e1, cuda::Event::Create(true));
    auto step_us = [&](model::GpuModel& m) -> absl::StatusOr<double> {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e0.get(), s));
      SYMTP_RETURN_IF_ERROR(m.Forward(in, s, so));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(e1.get(), s));
      SYMTP_RETURN_IF_ERROR(m.WaitForStep(Deadline::AfterMs(60'000)));
      SYMTP_RETURN_IF_ERROR(cuda::WaitEvent(e1.get(), Deadline::AfterMs(60'000), "modelab step"));
      float ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
      return 1000.0 * ms;
    };
    // A model planned and captured for this batch: 4 steps (planning, and
    // with it any autotuning, on the first; capture on the second).
    auto make =
        [&](std::string name, int tune,
            std::shared_ptr<const kernels::GemmTuningTable> table) -> absl::StatusOr<Variant> {
      model::GpuModelOptions o =
          DecodeBenchOptions(cfg, ctx, /*graphs=*/true, kernels::DecodeKernel::kTensorCore, batch);
      o.gemm_autotune_candidates = tune;
      o.gemm_autotune_margin = sel.ab_pick_margin;
      o.gemm_tuning = std::move(table);
      o.bench_skip_allreduce = sel.tp > 1;  // rank 0's shard alone
      SYMTP_ASSIGN_OR_RETURN(model::GpuModel m,
                             model::GpuModel::Create(cfg, 0, sel.tp, 0, o, nullptr));
      Variant v;
      v.name = std::move(name);
      v.m = std::make_unique<model::GpuModel>(std::move(m));
      for (int i = 0; i < 4; ++i) SYMTP_RETURN_IF_ERROR(step_us(*v.m).status());
      for (int32_t t : v.m->host_tokens()) {
        if (t < 0 || t >= cfg.vocab) return absl::InternalError("sampled token out of range");
      }
      if (v.m->graph_stats().captures < 1) {
        return absl::InternalError(v.name + ": the step was not captured");
      }
      return v;
    };
    auto rounds = [&](std::vector<Variant>& vs) -> absl::Status {
      for (int r = 0; r < sel.ab_rounds; ++r) {
        for (Variant& v : vs) {
          std::vector<double> t;
          for (int i = 0; i < steps; ++i) {
            SYMTP_ASSIGN_OR_RETURN(double us, step_us(*v.m));
            t.push_back(us);
          }
          v.us.push_back(Median(t));
        }
      }
      return absl::OkStatus();
    };
    auto report = [&](const char* phase, const std::vector<Variant>& vs) {
      const double base = Median(vs[0].us);
      std::printf("%-8s %6s %-34s %10s %9s %9s %8s\n", "phase", "batch", "variant", "step us",
                  "min", "max", "vs heur");
      for (const Variant& v : vs) {
        const double med = Median(v.us);
        const double lo = *std::min_element(v.us.begin(), v.us.end());
        const double hi = *std::max_element(v.us.begin(), v.us.end());
        std::printf("%-8s %6d %-34s %10.1f %9.1f %9.1f %+7.2f%%\n", phase, batch, v.name.c_str(),
                    med, lo, hi, 100 * (med / base - 1));
        js->model_ab.push_back(absl::StrFormat(
            "{\"phase\": \"%s\", \"tp\": %d, \"batch\": %d, \"layers\": %d, "
            "\"variant\": \"%s\", "
            "\"step_us_median\": %.1f, \"step_us_min\": %.1f, \"step_us_max\": %.1f, "
            "\"rounds\": %d, \"vs_heuristic\": %.4f}",
            phase, sel.tp, batch, layers, v.name, med, lo, hi, static_cast<int>(v.us.size()),
            med / base - 1));
      }
    };

    std::vector<Variant> vs;
    SYMTP_ASSIGN_OR_RETURN(Variant heur, make("heuristic", 1, nullptr));
    SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningTable h_table, heur.m->GemmPlans());
    vs.push_back(std::move(heur));
    SYMTP_ASSIGN_OR_RETURN(Variant heur2, make("heuristic (second model)", 1, nullptr));
    vs.push_back(std::move(heur2));
    SYMTP_ASSIGN_OR_RETURN(Variant tuned, make(absl::StrCat("autotune ", sel.ab_candidates),
                                               sel.ab_candidates, nullptr));
    SYMTP_ASSIGN_OR_RETURN(const kernels::GemmTuningTable t_table, tuned.m->GemmPlans());
    vs.push_back(std::move(tuned));
    for (const auto& [key, e] : t_table.entries()) {
      const kernels::GemmTuningEntry* he = h_table.Find(key);
      if (he != nullptr && he->algo == e.algo) continue;
      std::printf("  %-16s heuristic %s (%.2f us) -> pick %s (%.2f us)\n",
                  GemmLayerName(cfg, sel.tp, key).c_str(), he ? he->description.c_str() : "-",
                  e.heuristic_us, e.description.c_str(), e.pick_us);
      auto one = std::make_shared<kernels::GemmTuningTable>(h_table);
      one->Put(key, e);
      SYMTP_ASSIGN_OR_RETURN(
          Variant v,
          make(absl::StrCat("tuned ", GemmLayerName(cfg, sel.tp, key)), 1, std::move(one)));
      if (v.m->gemm_plans_from_table() != h_table.size()) {
        return absl::InternalError(absl::StrFormat("%s: %d of %d GEMM plans from the table", v.name,
                                                   v.m->gemm_plans_from_table(), h_table.size()));
      }
      v.key = key;
      vs.push_back(std::move(v));
    }
    SYMTP_RETURN_IF_ERROR(rounds(vs));
    report("single", vs);
    const double base = Median(vs[0].us);
    auto accepted = std::make_shared<kernels::GemmTuningTable>(h_table);
    std::string kept;
    for (const Variant& v : vs) {
      if (v.key && Median(v.us) < base * (1 - sel.ab_margin)) {
        accepted->Put(*v.key, *t_table.Find(*v.key));
        absl::StrAppend(&kept, kept.empty() ? "" : ", ", GemmLayerName(cfg, sel.tp, *v.key));
      }
    }
    std::printf("  kept: %s\n", kept.empty() ? "none" : kept.c_str());
    vs.clear();  // frees the models
    // The kept picks on fresh models, against the heuristic once more.
    std::vector<Variant> check;
    SYMTP_ASSIGN_OR_RETURN(Variant h2, make("heuristic", 1, nullptr));
    check.push_back(std::move(h2));
    SYMTP_ASSIGN_OR_RETURN(Variant k2,
                           make(absl::StrCat("kept: ", kept.empty() ? "none" : kept), 1, accepted));
    check.push_back(std::move(k2));
    SYMTP_ASSIGN_OR_RETURN(Variant all,
                           make("all autotuned picks (table)", 1,
                                std::make_shared<const kernels::GemmTuningTable>(t_table)));
    check.push_back(std::move(all));
    check[0].table = std::make_shared<const kernels::GemmTuningTable>(h_table);
    check[1].table = accepted;
    check[2].table = std::make_shared<const kernels::GemmTuningTable>(t_table);
    SYMTP_RETURN_IF_ERROR(rounds(check));
    report("check", check);
    const Variant* best = &check[0];
    for (const Variant& v : check) {
      if (Median(v.us) < Median(best->us)) best = &v;
    }
    if (Median(best->us) >= Median(check[0].us) * (1 - sel.ab_margin)) best = &check[0];
    std::printf("  written for batch %d: %s\n", batch, best->name.c_str());
    for (const auto& [key, e] : best->table->entries()) keep.Put(key, e);
    // Each GEMM per call in a graph (autotuning's timing: W rotated through
    // more than L2), % of the 8192^3 rate measured in this run.
    std::printf("  %-16s %9s %7s %9s %7s  %s\n", "gemm", "heur us", "% peak", "pick us", "% peak",
                "written");
    for (const auto& [key, e] : t_table.entries()) {
      const double gflop = 2.0 * key.m * key.n * key.k / 1e9;
      auto pct = [&](double us) { return us > 0 ? 100 * (gflop * 1e3 / us) / c.gemm_tflops : 0; };
      const kernels::GemmTuningEntry* w = best->table->Find(key);
      const char* written = w == nullptr                         ? "-"
                            : w->algo == e.algo                  ? "pick"
                            : w->algo == h_table.Find(key)->algo ? "heuristic"
                                                                 : "other";
      std::printf("  %-16s %9.2f %6.1f%% %9.2f %6.1f%%  %s\n",
                  GemmLayerName(cfg, sel.tp, key).c_str(), e.heuristic_us, pct(e.heuristic_us),
                  e.pick_us, pct(e.pick_us), written);
      js->model_ab.push_back(absl::StrFormat(
          "{\"phase\": \"gemm\", \"tp\": %d, \"batch\": %d, \"gemm\": \"%s\", \"m\": %d, "
          "\"n\": %d, \"k\": %d, \"heuristic_us\": %.3f, \"pick_us\": %.3f, "
          "\"heuristic_frac_of_gemm_peak\": %.4f, \"pick_frac_of_gemm_peak\": %.4f, "
          "\"written\": \"%s\"}",
          sel.tp, batch, GemmLayerName(cfg, sel.tp, key), key.m, key.n, key.k, e.heuristic_us,
          e.pick_us, pct(e.heuristic_us) / 100, pct(e.pick_us) / 100, written));
    }
  }
  if (!sel.tuning_out.empty()) {
    SYMTP_RETURN_IF_ERROR(keep.Save(sel.tuning_out));
    std::printf("wrote %s (%d GEMM shapes)\n", sel.tuning_out.c_str(),
                static_cast<int>(keep.size()));
  }
  return absl::OkStatus();
}

std::string JoinArr(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ",\n    " : "\n    ") + v[i];
  return s + "\n  ]";
}

// One integer in [lo, hi] for a flag, else InvalidArgument "FLAG: lo..hi".
absl::Status ParseIntFlag(const std::string& flag, const char* text, int lo, int hi, int* out) {
  if (!absl::SimpleAtoi(text, out) || *out < lo || *out > hi) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d..%d", flag, lo, hi));
  }
  return absl::OkStatus();
}

// A fraction in [0, 0.5) for a flag, else InvalidArgument.
absl::Status ParseFractionFlag(const std::string& flag, const char* text, double* out) {
  if (!absl::SimpleAtod(text, out) || !(*out >= 0 && *out < 0.5)) {
    return absl::InvalidArgumentError(flag + ": a fraction in [0, 0.5)");
  }
  return absl::OkStatus();
}

// "1,16,1" for a flag: each value in [lo, hi], else InvalidArgument
// "FLAG: 'x' is not WHAT in [lo, hi]".
absl::StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const char* text, int lo,
                                              int hi, const char* what) {
  std::vector<int> out;
  for (absl::string_view b : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' is not %s in [%d, %d]", flag, b, what, lo, hi));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status Run(int argc, char** argv) {
  std::string json_path;
  int layers = 4;
  bool skip_model = false;
  bool gemm_exhaustive = false;
  std::vector<std::string> gemm_match;
  std::string gemm_table;  // --gemm-table FILE|auto
  std::string sections = "gemm,attention,prefill,model";
  ModelSelection model_sel;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--layers" && i + 1 < argc) {
      layers = std::atoi(argv[++i]);
    } else if (a == "--skip-model") {
      skip_model = true;
    } else if (a == "--gemm-exhaustive") {
      gemm_exhaustive = true;
    } else if (a == "--gemm-match" && i + 1 < argc) {
      gemm_match = absl::StrSplit(argv[++i], ',');
    } else if (a == "--gemm-table" && i + 1 < argc) {
      gemm_table = argv[++i];
    } else if (a == "--sections" && i + 1 < argc) {
      sections = argv[++i];
    } else if (a == "--model-batches" && i + 1 < argc) {
      SYMTP_ASSIGN_OR_RETURN(model_sel.batches, ParseIntList(a, argv[++i], 1, 512, "a batch"));
    } else if (a == "--model-gemm-autotune" && i + 1 < argc) {
      SYMTP_ASSIGN_OR_RETURN(model_sel.gemm_autotune,
                             ParseIntList(a, argv[++i], 1, 32, "a candidate count"));
    } else if (a == "--model-ab-candidates" && i + 1 < argc) {
      SYMTP_RETURN_IF_ERROR(ParseIntFlag(a, argv[++i], 2, 32, &model_sel.ab_candidates));
    } else if (a == "--model-ab-pick-margin" && i + 1 < argc) {
      SYMTP_RETURN_IF_ERROR(ParseFractionFlag(a, argv[++i], &model_sel.ab_pick_margin));
    } else if (a == "--model-ab-margin" && i + 1 < argc) {
      SYMTP_RETURN_IF_ERROR(ParseFractionFlag(a, argv[++i], &model_sel.ab_margin));
    } else if (a == "--model-ab-rounds" && i + 1 < argc) {
      SYMTP_RETURN_IF_ERROR(ParseIntFlag(a, argv[++i], 1, 100, &model_sel.ab_rounds));
    } else if (a == "--model-tp" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &model_sel.tp) ||
          (model_sel.tp != 1 && model_sel.tp != 2 && model_sel.tp != 4 && model_sel.tp != 8)) {
        return absl::InvalidArgumentError("--model-tp: 1, 2, 4 or 8");
      }
    } else if (a == "--model-tuning-out" && i + 1 < argc) {
      model_sel.tuning_out = argv[++i];
    } else if (a == "--model-kernels" && i + 1 < argc) {
      model_sel.kernels = absl::StrSplit(argv[++i], ',');
    } else if (a == "--model-graphs" && i + 1 < argc) {
      model_sel.graphs = argv[++i];
      if (model_sel.graphs != "on" && model_sel.graphs != "off" && model_sel.graphs != "both") {
        return absl::InvalidArgumentError("--model-graphs: on, off or both");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", a,
          "'; usage: kernels_bench [--json FILE] [--layers N] [--skip-model] "
          "[--gemm-exhaustive] [--gemm-match 'llama-8b-shape tp=2 wo M=256,...'] "
          "[--gemm-table FILE|auto] [--sections "
          "gemm,attention,prefill,model,sm90plans,sm90probe,skinny,streamk] "
          "[--model-batches 32,256] [--model-kernels tensor-core] [--model-graphs on|off|both] "
          "[--model-gemm-autotune 1,16] [--model-ab-candidates 16] [--model-ab-pick-margin 0] "
          "[--model-ab-margin 0.005] [--model-ab-rounds 7] [--model-tp 1|2|4|8] "
          "[--model-tuning-out FILE]"));
    }
  }
  std::string why;
  if (cuda::VisibleDeviceCount(&why) == 0) return absl::UnavailableError("no GPU: " + why);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  Json js;
  js.device = absl::StrFormat("{\"name\": \"%s\", \"sms\": %d, \"l2_bytes\": %d}", prop.name,
                              prop.multiProcessorCount, prop.l2CacheSize);
  SYMTP_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  SYMTP_ASSIGN_OR_RETURN(kernels::CublasLtHandle h, kernels::CublasLtHandle::Create());
  SYMTP_ASSIGN_OR_RETURN(cuda::DeviceBuffer ws,
                         cuda::DeviceBuffer::Create(kernels::kGemmWorkspaceBytes));
  SYMTP_ASSIGN_OR_RETURN(Ceilings c, MeasureCeilings(h, ws.get(), stream.get(), &js));
  // --gemm-table: a file, or auto (the runtime's default: the shipped table
  // made on this device and cuBLASLt, if any).
  std::shared_ptr<const kernels::GemmTuningTable> table;
  if (!gemm_table.empty()) {
    SYMTP_ASSIGN_OR_RETURN(std::optional<kernels::FoundGemmTuningTable> found,
                           kernels::ResolveGemmTuningFile(gemm_table));
    if (!found) return absl::NotFoundError("--gemm-table " + gemm_table + ": no table");
    std::printf("GEMM tuning table: %s (%zu shapes)\n", found->path.c_str(), found->table.size());
    table = std::make_shared<const kernels::GemmTuningTable>(std::move(found->table));
  }
  // The sections are independent: one failing does not hide the others.
  absl::Status first_error;
  auto section = [&](const char* name, absl::Status st) {
    if (st.ok()) return;
    std::printf("SECTION %s FAILED: %s\n", name, st.ToString().c_str());
    if (first_error.ok()) first_error = Annotate(st, name);
  };
  const std::vector<std::string> want = absl::StrSplit(sections, ',');
  auto on = [&](const char* s) { return std::find(want.begin(), want.end(), s) != want.end(); };
  if (on("gemm"))
    section("decode_gemm", BenchDecodeGemms(h, ws.get(), stream.get(), c, &js, gemm_exhaustive,
                                            gemm_match, table));
  if (on("sm90plans")) section("sm90_plans", BenchSm90Plans(ws.get(), stream.get(), c, &js));
  if (on("sm90probe")) {
    section("sm90_probe", BenchSm90Probe(h, ws.get(), stream.get(), c, &js));
  }
  if (on("skinny")) section("skinny_gemm", BenchSkinnyGemms(h, ws.get(), stream.get(), c, &js));
  if (on("streamk")) {
    section("streamk_gemm", BenchStreamKGemms(h, ws.get(), stream.get(), c, &js));
  }
  if (on("pdl")) section("pdl_gemm", BenchPdlGemms(h, ws.get(), stream.get(), c, &js));
  if (on("transposed")) {
    section("transposed_gemm", BenchTransposedGemms(h, ws.get(), stream.get(), c, &js));
  }
  if (on("attention")) section("decode_attention", BenchDecodeAttention(stream.get(), c, &js));
  if (on("prefill")) section("prefill_attention", BenchPrefillAttention(stream.get(), c, &js));
  if (on("model") && !skip_model) {
    section("model_decode", BenchModelDecode(layers, model_sel, stream.get(), &js));
  }
  if (on("modelab")) {
    section("model_gemm_ab", BenchModelGemmAb(layers, model_sel, c, stream.get(), &js));
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) return absl::UnavailableError("cannot write " + json_path);
    std::fprintf(
        f,
        "{\n  \"device\": %s,\n  \"ceilings\": %s,\n  \"decode_gemm\": %s,\n"
        "  \"decode_attention\": %s,\n  \"prefill_attention\": %s,\n"
        "  \"model_decode\": %s,\n  \"sm90_plans\": %s,\n  \"sm90_probe\": %s,\n"
        "  \"skinny_gemm\": %s,\n  \"streamk_gemm\": %s,\n  \"pdl_gemm\": %s,\n"
        "  \"transposed_gemm\": %s,\n  \"model_gemm_ab\": %s\n}\n",
        js.device.c_str(), js.ceilings.c_str(), JoinArr(js.gemm).c_str(), JoinArr(js.attn).c_str(),
        JoinArr(js.prefill_attn).c_str(), JoinArr(js.model).c_str(), JoinArr(js.sm90_plans).c_str(),
        JoinArr(js.sm90_probe).c_str(), JoinArr(js.skinny).c_str(), JoinArr(js.streamk).c_str(),
        JoinArr(js.pdl).c_str(), JoinArr(js.transposed).c_str(), JoinArr(js.model_ab).c_str());
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return first_error;
}

}  // namespace
}  // namespace symtp::bench

int main(int argc, char** argv) {
  const absl::Status st = symtp::bench::Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "kernels_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
