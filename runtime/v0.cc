#include "runtime/v0.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "protocol/result.h"
#include "runtime/job_sizing.h"
#include "runtime/scheduler_process.h"
#include "runtime/step_stats.h"
#include "scheduler/scheduler.h"
#include "worker/state/worker_state.h"

namespace symtp::runtime {

V0Layout::V0Layout(int b, int s, int mb) : max_seq(s), max_blocks(mb) {
  const size_t B = b, S = s, MB = mb;
  meta = 0;
  tokens = meta + B * 3;
  positions = tokens + B * S;
  blocks = positions + B * S;
  seq_lens = blocks + B * MB;
  slots = seq_lens + B;
  words = slots + B * S;
}

void WriteV0Row(int32_t* body, const V0Layout& L, int b, int block_size, const V0Row& row) {
  const size_t S = L.max_seq, MB = L.max_blocks, len = row.tokens.size(), bs = block_size;
  // A prompt's later chunks have no blocks yet: their slots stay -1.
  const size_t mapped = std::min(len, row.block_table.size() * bs);
  int32_t* const tok = body + L.tokens + b * S;
  int32_t* const pos = body + L.positions + b * S;
  int32_t* const slot = body + L.slots + b * S;
  std::copy(row.tokens.begin(), row.tokens.end(), tok);
  std::iota(pos, pos + len, 0);
  for (size_t k = 0, p = 0; p < mapped; ++k) {  // block by block: no division per token
    const int32_t base = row.block_table[k] * block_size;
    for (int32_t j = 0; j < block_size && p < mapped; ++j, ++p) slot[p] = base + j;
  }
  std::fill(tok + len, tok + S, 0);
  std::fill(pos + len, pos + S, 0);
  std::fill(slot + mapped, slot + S, -1);
  int32_t* const blk = body + L.blocks + b * MB;
  std::copy(row.block_table.begin(), row.block_table.end(), blk);
  std::fill(blk + row.block_table.size(), blk + MB, -1);
  const int end = row.start_pos + row.num_scheduled;
  body[L.meta + 3 * b] = row.start_pos;
  body[L.meta + 3 * b + 1] = row.num_scheduled;
  body[L.meta + 3 * b + 2] = end == static_cast<int>(len) ? 1 : 0;
  body[L.seq_lens + b] = end;
}

namespace {

// Header broadcast first (fixed size), then the body of `words` int32s.
struct V0Header {
  int32_t batch;     // -1: end of job
  int32_t max_seq;   // S
  int32_t max_blocks;
  int32_t reserved;
};

// Every rank: the step's flat model input from the padded tensors.
absl::Status ExtractInput(const V0Header& h, const int32_t* body, model::BatchInput* in) {
  V0Layout L(h.batch, h.max_seq, h.max_blocks);
  in->tokens.clear();
  in->positions.clear();
  in->slot_mapping.clear();
  in->seq_start.assign(1, 0);
  in->context_len.clear();
  in->sample_index.clear();
  in->max_blocks_per_seq = h.max_blocks;
  in->block_tables.assign(body + L.blocks, body + L.blocks + static_cast<size_t>(h.batch) * h.max_blocks);
  for (int b = 0; b < h.batch; ++b) {
    const int32_t start = body[L.meta + 3 * b], n = body[L.meta + 3 * b + 1];
    const bool samples = body[L.meta + 3 * b + 2] != 0;
    if (start < 0 || n < 1 || start + n > h.max_seq || start + n > body[L.seq_lens + b]) {
      return absl::DataLossError(absl::StrCat("v0 batch row ", b, ": bad start/len"));
    }
    const size_t row = static_cast<size_t>(b) * h.max_seq;
    for (int p = start; p < start + n; ++p) {
      in->tokens.push_back(body[L.tokens + row + p]);
      in->positions.push_back(body[L.positions + row + p]);
      in->slot_mapping.push_back(body[L.slots + row + p]);
    }
    in->seq_start.push_back(static_cast<int32_t>(in->tokens.size()));
    in->context_len.push_back(start + n);
    if (samples) in->sample_index.push_back(static_cast<int32_t>(in->tokens.size()) - 1);
  }
  return absl::OkStatus();
}

absl::Status V0Follower(Backend* backend, BatchBroadcast* bcast, JobHandle* job) {
  std::vector<int32_t> none;
  model::BatchInput in;
  for (;;) {
    SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
    V0Header h{};
    SYMTP_RETURN_IF_ERROR_CTX(bcast->Broadcast(&h, sizeof(h), 0), "v0 header broadcast");
    if (h.batch < 0) return absl::OkStatus();
    V0Layout L(h.batch, h.max_seq, h.max_blocks);
    SYMTP_ASSIGN_OR_RETURN(void* buf, bcast->HostBuffer(L.words * 4));
    auto* body = static_cast<int32_t*>(buf);
    SYMTP_RETURN_IF_ERROR_CTX(bcast->Broadcast(body, L.words * 4, 0), "v0 batch broadcast");
    SYMTP_RETURN_IF_ERROR(ExtractInput(h, body, &in));
    BackendTimings bt;
    SYMTP_RETURN_IF_ERROR(backend->Step(in, {}, {}, &none, &bt));  // forward only
  }
}

absl::Status V0Driver(const JobOptions& opts, const model::ModelConfig& cfg, Backend* backend,
                      BatchBroadcast* bcast, JobHandle* job, int64_t process_start_ns) {
  sched::SchedulerConfig sc = JobSchedulerConfig(opts, cfg);  // depth 1 for v0
  SYMTP_ASSIGN_OR_RETURN(sc.num_kv_blocks,
                         AgreedKvBlocks(opts, cfg, job,
                                        Deadline::AfterNs(opts.step_timeout_ms * 1'000'000)));
  SYMTP_ASSIGN_OR_RETURN(sched::Scheduler sched, sched::Scheduler::Create(sc));
  worker::WorkerStateConfig wc;
  wc.num_kv_blocks = sc.num_kv_blocks;
  wc.max_seq_len = JobMaxSeqLen(opts, cfg);
  wc.block_size = cfg.block_size;
  SYMTP_ASSIGN_OR_RETURN(worker::WorkerState state, worker::WorkerState::Create(wc));

  RunSummaryInput summary;
  WorkloadFeed feed(opts, cfg, &summary);
  feed.StartClock(process_start_ns);  // AgreedKvBlocks waited for every rank
  Progress progress(opts.progress, feed.size());
  const int S = cfg.max_seq_len, MB = (cfg.max_seq_len + cfg.block_size - 1) / cfg.block_size;
  std::vector<int32_t> tokens;
  model::BatchInput in, scratch;
  proto::StepResult result;
  job->SetPhase(ProcPhase::kRunning);

  while (!feed.all_admitted() || !sched.Done()) {
    SYMTP_RETURN_IF_ERROR(CheckAbort(job->control));
    SYMTP_RETURN_IF_ERROR(feed.Admit(MonotonicNs(), &sched));
    // Phase 1: schedule (every other GPU waits meanwhile).
    const int64_t t0 = MonotonicNs();
    SYMTP_ASSIGN_OR_RETURN(sched::StepPlan plan, sched.PlanNextStep());
    if (plan.idle) {
      if (feed.all_admitted()) return absl::InternalError("v0: nothing to schedule but requests unfinished");
      feed.WaitForArrival();
      continue;
    }
    SYMTP_RETURN_IF_ERROR(state.ApplyDiff(plan.diff));
    const int64_t t1 = MonotonicNs();
    // Phase 2: the full padded batch tensors, rebuilt from scratch each step
    // (in the backend's host buffer: pinned memory on the GPUs), one row per
    // scheduled sequence, each word written once.
    const int B = state.num_rows();
    int scheduled_rows = 0;
    for (int r = 0; r < B; ++r) scheduled_rows += state.row(r).sched_step == plan.diff.step;
    const V0Layout used(scheduled_rows, S, MB);
    SYMTP_ASSIGN_OR_RETURN(void* buf, bcast->HostBuffer(used.words * 4));
    auto* body = static_cast<int32_t*>(buf);
    for (int r = 0, b = 0; r < B; ++r) {
      const worker::CachedRequest& q = state.row(r);
      if (q.sched_step != plan.diff.step) continue;
      WriteV0Row(body, used, b++, cfg.block_size,
                 {q.tokens, q.block_table, q.num_computed - q.num_scheduled, q.num_scheduled});
    }
    V0Header h{scheduled_rows, S, MB, 0};
    const int64_t t2 = MonotonicNs();
    // Phase 3: broadcast.
    SYMTP_RETURN_IF_ERROR_CTX(bcast->Broadcast(&h, sizeof(h), 0), "v0 header broadcast");
    SYMTP_RETURN_IF_ERROR_CTX(bcast->Broadcast(body, used.words * 4, 0), "v0 batch broadcast");
    const int64_t t3 = MonotonicNs();
    // Phase 4: forward (all ranks), from the broadcast tensors; rank 0 samples.
    SYMTP_RETURN_IF_ERROR(ExtractInput(h, body, &in));
    const int64_t t4 = MonotonicNs();
    BackendTimings bt;
    // Rank 0's own bookkeeping of which rows sample (the same row order as
    // the padded batch); its forward input is the broadcast-derived `in`.
    SYMTP_RETURN_IF_ERROR(state.BuildInput(&scratch));
    SYMTP_RETURN_IF_ERROR(
        backend->Step(in, state.sample_params(), state.sample_positions(), &tokens, &bt));
    SYMTP_RETURN_IF_ERROR(state.ApplySampled(tokens));
    result.step = plan.diff.step;
    result.rank = 0;
    result.digest = state.Digest();
    result.sampled.assign(state.last_sampled().begin(), state.last_sampled().end());
    const int64_t done = MonotonicNs();
    SYMTP_RETURN_IF_ERROR(sched.OnStepResult(result, done));

    StepRecord rec;
    rec.step = plan.diff.step;
    rec.num_seqs = scheduled_rows;
    rec.num_tokens = plan.num_tokens;
    rec.num_samples = plan.num_samples;
    rec.context_tokens = sched::ContextTokens(plan);
    rec.decode_only = plan.num_tokens == scheduled_rows;
    rec.plan_start_ns = t0;
    rec.schedule_ns = t1 - t0;
    rec.encode_ns = t2 - t1;
    rec.publish_ns = t3 - t2;
    rec.published_at_ns = t3;
    rec.build_ns = t4 - t3;
    rec.forward_ns = bt.device_forward_ns > 0 ? bt.device_forward_ns : bt.forward_ns;
    rec.sample_ns = bt.sample_ns;
    rec.gpu_idle_ns = bt.device_idle_ns;  // rank 0: from its last forward to this one (incl. broadcast)
    rec.graph = bt.graph;
    rec.worker_total_ns = done - t3;
    rec.done_at_ns = done;
    rec.wire_bytes = sizeof(h) + used.words * 4;
    summary.steps.push_back(rec);
    SYMTP_RETURN_IF_ERROR(feed.RecordFinished(result.sampled, &sched));
    progress.Update(rec.step, feed.finished(), feed.tokens_out());
  }
  V0Header end{-1, 0, 0, 0};
  SYMTP_RETURN_IF_ERROR(bcast->Broadcast(&end, sizeof(end), 0));
  summary.end_ns = MonotonicNs();
  progress.Finish();
  feed.RecordRest(sched);
  summary.extra = {"v0", JsonWriter().Open('{').Field("max_seq_len", S).Field("max_blocks", MB).Close().Take()};
  return WriteRunOutputs(summary);
}

}  // namespace

absl::Status RunV0Worker(const JobOptions& opts, const model::ModelConfig& cfg, int rank,
                         JobHandle* job, Backend* backend, BatchBroadcast* broadcast,
                         int64_t process_start_ns) {
  job->SetPhase(ProcPhase::kRunning);
  const absl::Status st = rank == 0
                              ? V0Driver(opts, cfg, backend, broadcast, job, process_start_ns)
                              : V0Follower(backend, broadcast, job);
  const std::string stats = backend->RunStats();
  if (st.ok() && !stats.empty()) SYMTP_LOG(INFO, "v0") << "rank " << rank << ": " << stats;
  return st;
}

}  // namespace symtp::runtime
