// Everything a job is configured with. The launcher parses the command line
// once, validates it, and hands the same flags to every process of the job, so
// the scheduler and the workers agree by construction.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace symtp::runtime {

// The enumerated options, each choice with its flag spelling (--backend=cuda)
// in --help's order: Names(E) lists them, Name(v) spells one; the flags parse
// and print through them.
template <typename E>
using NameTable = std::span<const std::pair<E, const char*>>;
#define SYMTP_NAMES(E, ...)                                              \
  inline NameTable<E> Names(E) {                                         \
    using enum E;                                                        \
    static constexpr std::pair<E, const char*> kNames[] = {__VA_ARGS__}; \
    return kNames;                                                       \
  }
enum class BackendKind { kAuto, kCpu, kCuda };  // kAuto: cuda when GPUs are visible
SYMTP_NAMES(BackendKind, {kAuto, "auto"}, {kCpu, "cpu"}, {kCuda, "cuda"})
enum class Mode { kV1, kV0 };  // v1: scheduler process, diffs; v0: rank 0 schedules inline
SYMTP_NAMES(Mode, {kV1, "v1"}, {kV0, "v0"})
enum class AllReduce { kAuto, kNccl, kCustom };
SYMTP_NAMES(AllReduce, {kAuto, "auto"}, {kNccl, "nccl"}, {kCustom, "custom"})
// How the exchange's row chunks are all-reduced: auto (copy at TP 2,
// all-reduce above), the copy engines, or the all-reduce kernels (custom or
// NCCL) on a side stream. Resolved to model::ExchangeTransport by the CUDA
// backend (ExchangeTransportFor).
enum class ExchangeTransport { kAuto, kCopy, kAllReduce };
SYMTP_NAMES(ExchangeTransport, {kAuto, "auto"}, {kCopy, "copy"}, {kAllReduce, "allreduce"})
enum class Attention { kTiled, kTensorCore };
SYMTP_NAMES(Attention, {kTiled, "tiled"}, {kTensorCore, "tensor-core"})
enum class LengthKind { kFixed, kUniform, kNormal, kLognormal };
SYMTP_NAMES(LengthKind, {kFixed, "fixed"}, {kUniform, "uniform"}, {kNormal, "normal"}, {kLognormal, "lognormal"})
SYMTP_NAMES(DType, {kBF16, "bf16"}, {kF32, "fp32"})  // the cuda backend's activations
#undef SYMTP_NAMES
template <typename E>
const char* Name(E v) {
  for (const auto& [e, name] : Names(v)) {
    if (e == v) return name;
  }
  return "?";
}

struct LengthDist {
  // "128" (fixed), "uniform:64:256", "normal:mean:std", "lognormal:mu:sigma"
  LengthKind kind = LengthKind::kFixed;
  double a = 128, b = 0;
  // Longest length any form may ask for; the model's max_seq_len bounds it
  // further (PlanJobLayout). Draws of normal and lognormal beyond [1, the
  // model's limit] are clamped to it; their median must lie inside it.
  static constexpr int kMaxLength = 1 << 24;
  // The longest length (fixed, uniform) or the median (normal, lognormal).
  double Max() const;
  // The longest length a draw can have, at most `cap` (normal, lognormal: cap).
  int Longest(int cap) const;
};
// The --prompt-len / --output-len flag's marshalling (the text: "uniform:3:40").
bool AbslParseFlag(absl::string_view text, LengthDist* d, std::string* err);
std::string AbslUnparseFlag(const LengthDist& d);

struct JobOptions {
  int tp = 1;
  BackendKind backend = BackendKind::kAuto;
  Mode mode = Mode::kV1;
  std::string model = "tiny";
  std::string model_overrides;  // "layers=4,seed=7"
  DType dtype = DType::kBF16;   // cuda backend: bf16 | fp32

  // Workload.
  int num_requests = 32;
  LengthDist prompt_len{LengthKind::kFixed, 128, 0};
  LengthDist output_len{LengthKind::kFixed, 32, 0};
  double arrival_rate = 0;  // requests/s (Poisson); 0 = closed loop
  int concurrency = 0;      // closed loop: requests in flight (0 = max_batch)
  int steady_batch = 0;     // >0: hold exactly B running at steady_context
  int steady_context = 1024;
  int steady_steps = 50;
  int warmup_steps = 5;
  uint64_t seed = 0;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  int eos_id = -1;  // -1: no EOS stop

  // Scheduler limits.
  int max_batch = 64;             // max running sequences
  int max_batched_tokens = 2048;  // per step
  int prefill_chunk = 512;
  int num_kv_blocks = 0;         // 0: derived from the workload, or sized by the workers:
  double kv_cache_mib = 0;       //   KV cache bytes per rank (MiB), or
  double kv_cache_fraction = 0;  //   fraction of the GPU memory free after the weights (cuda)
  int max_inflight = 2;          // async depth (v1)
  bool late_publish = true;      // v1: runtime/publish_pacer.h
  int publish_lead_us = 500;     // v1 late publishing: how long before the step ahead ends

  // CUDA backend.
  int exchange_min_rows = -1;  // fewest rows of a step that uses the exchange (0: off, -1: by TP)
  ExchangeTransport exchange_transport = ExchangeTransport::kAuto;
  bool cuda_graphs = true;
  bool gpu_warmup = true;          // model::GpuModel::WarmUp before the worker is ready
  bool pipeline = true;            // v1 worker launches step t+1 before collecting step t
  AllReduce allreduce = AllReduce::kAuto;
  Attention attention = Attention::kTensorCore;  // kernels/ops/attention.h
  int64_t crossover_bytes = 1 << 20;
  // Capacity of the custom all-reduce (its scratch is about 2 x (TP - 1)
  // times this per rank: a staging slot per peer and parity); messages above
  // it go to NCCL.
  int64_t custom_allreduce_max_bytes = -1;  // -1: by TP (CustomAllReduceMaxBytes)
  int64_t custom_allreduce_ll_max_bytes = 0;  // 0: CustomAllReduce's default for the TP degree
  int64_t custom_allreduce_ll128_max_bytes = -1;  // -1: CustomAllReduce's default; 0: off
  int64_t custom_allreduce_two_shot_min_bytes = -1;  // -1: CustomAllReduce's default; 0: never
  bool fuse_allreduce_norm = true;
  int gemv_max_rows = 4;         // model::GpuModelOptions::gemv_max_rows
  bool gemv_allreduce_push = true;  // model::GpuModelOptions::gemv_allreduce_push
  bool gemv_swiglu = true;          // model::GpuModelOptions::gemv_swiglu
  bool defer_norm = true;           // model::GpuModelOptions::defer_norm
  bool sharded_sampling = true;  // model::GpuModelOptions::sharded_sampling
  bool bench_skip_allreduce = false;  // benchmark only: wrong results for TP > 1

  // Robustness.
  int64_t step_timeout_ms = 60000;  // any single wait in a step
  int64_t hang_timeout_ms = 2000;   // heartbeat staleness that tears the job down

  std::string out_dir;     // summary.json, tokens.jsonl
  std::string trace_file;  // Chrome trace JSON
  bool progress = true;    // live progress line on a TTY

  // Resolved by the launcher.
  BackendKind resolved_backend = BackendKind::kAuto;  // cpu | cuda
};

// Checks ranges and combinations; InvalidArgument naming the flag otherwise.
absl::Status ValidateJobOptions(const JobOptions& o);

// Flags in the --name=value form that reproduce `o` (for the children).
std::vector<std::string> ToArgs(const JobOptions& o);

}  // namespace symtp::runtime

namespace symtp::runtime {

// Role-specific flags that are not part of JobOptions.
struct ProcArgs {
  std::string job;  // --job: shared-memory segment name
  int rank = -1;    // --rank (workers)
  int device = -1;  // --device (cuda workers)
};

// Parses --name=value / --name value flags into `opts` and `proc`. Unknown
// flags and bad values are InvalidArgument with the flag named. `--help`
// returns NotFound with the usage text as its message.
absl::Status ParseArgs(const std::vector<std::string>& args, JobOptions* opts, ProcArgs* proc);
std::string Usage();

}  // namespace symtp::runtime
