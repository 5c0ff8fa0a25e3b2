#include "runtime/job_sizing.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/sharding.h"
#include "runtime/workload.h"

namespace symtp::runtime {
absl::StatusOr<model::ModelConfig> ResolveModel(const JobOptions& opts) {
  SYMTP_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::PresetConfig(opts.model));
  SYMTP_RETURN_IF_ERROR(model::ApplyOverrides(opts.model_overrides, &cfg));
  SYMTP_RETURN_IF_ERROR(model::ValidateForTp(cfg, opts.tp));
  return cfg;
}

int JobMaxSeqLen(const JobOptions& opts, const model::ModelConfig& cfg) {
  int cap = cfg.max_seq_len;
  int per_seq;
  if (opts.steady_batch > 0) {
    const int64_t prefill_steps =
        SteadyPrefillSteps(opts.steady_batch, std::min(opts.steady_context, cap - 1),
                           opts.max_batched_tokens);
    per_seq = static_cast<int>(std::min<int64_t>(
        int64_t{opts.steady_context} + opts.warmup_steps + opts.steady_steps + prefill_steps + 8,
        cap));
  } else {
    per_seq = opts.prompt_len.Longest(cap) + opts.output_len.Longest(cap);
  }
  return std::min(per_seq, cap);
}

sched::SchedulerConfig JobSchedulerConfig(const JobOptions& opts, const model::ModelConfig& cfg) {
  sched::SchedulerConfig sc;
  sc.max_running_seqs = opts.steady_batch > 0 ? opts.steady_batch : opts.max_batch;
  sc.max_batched_tokens = opts.max_batched_tokens;
  sc.num_kv_blocks = NumKvBlocks(opts, cfg);
  sc.block_size = cfg.block_size;
  sc.max_seq_len = JobMaxSeqLen(opts, cfg);
  sc.prefill_chunk = opts.prefill_chunk;
  sc.max_inflight_steps = opts.mode == Mode::kV0 ? 1 : opts.max_inflight;  // v0 is synchronous by design
  return sc;
}

int NumKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg) {
  if (opts.num_kv_blocks > 0) return opts.num_kv_blocks;
  const int per_seq = JobMaxSeqLen(opts, cfg);
  int batch = opts.steady_batch > 0 ? opts.steady_batch : opts.max_batch;
  return batch * ((per_seq + 15) / 16 + 1) + 16;
}

bool KvBlocksFromWorkers(const JobOptions& opts) {
  return opts.num_kv_blocks <= 0 && (opts.kv_cache_mib > 0 || opts.kv_cache_fraction > 0);
}

int KvBlocksForBytes(const model::ModelConfig& cfg, int rank, int tp, size_t elem_bytes,
                     double bytes) {
  absl::StatusOr<model::ShardLayout> layout = model::MakeShardLayout(cfg, rank, tp);
  if (!layout.ok()) return 0;
  const double per_block = static_cast<double>(model::KvCacheBytesPerBlock(cfg, *layout, elem_bytes));
  return static_cast<int>(std::min(bytes / per_block, static_cast<double>(1 << 28)));
}

absl::StatusOr<int> AgreedKvBlocks(const JobOptions& opts, const model::ModelConfig& cfg,
                                   JobHandle* job, Deadline deadline) {
  // Every worker reports its KV cache once its backend is built: that is
  // also the job's "every worker ready" (the measurement clock starts after).
  while (true) {
    SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
    int agreed = INT32_MAX, missing = -1;
    for (int r = 0; r < opts.tp; ++r) {
      const ProcSlot& slot = job->control->procs[ProcIndex(ProcRole::kWorker, r)];
      const int n = slot.kv_blocks.load(std::memory_order_acquire);
      if (n > 0) {
        agreed = std::min(agreed, n);
      } else if (missing < 0) {
        missing = r;
      }
    }
    if (missing < 0) return KvBlocksFromWorkers(opts) ? agreed : NumKvBlocks(opts, cfg);
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "worker rank %d did not report ready (its KV cache size) in time (--step-timeout-ms %d)",
          missing, opts.step_timeout_ms));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

}  // namespace symtp::runtime
