#include "runtime/step_stats.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/status_macros.h"

namespace symtp::runtime {
namespace {

std::string Hist(const LatencyHistogram& h, double scale) { return h.ToJson(scale); }

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o.push_back(c);
  }
  return o;
}

// Atomic: the data goes to a temporary file beside `p`, renamed over `p`
// once complete, so a reader never sees a half-written file.
absl::Status WriteFile(const std::filesystem::path& p, const std::string& data) {
  const std::string tmp = absl::StrCat(p.string(), ".tmp.", ::getpid());
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(absl::StrCat("cannot open ", tmp, " for writing"));
  f << data;
  f.close();
  std::error_code ec;
  if (!f) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("writing ", tmp, " failed"));
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return absl::UnavailableError(
        absl::StrCat("renaming ", tmp, " to ", p.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteRunOutputs(const RunSummaryInput& in) {
  const JobOptions& o = *in.opts;
  if (o.out_dir.empty() && o.trace_file.empty()) return absl::OkStatus();

  // Which steps count: after the warm-up; in steady mode, only full decode steps.
  std::vector<const StepRecord*> measured;
  int skipped = 0;
  for (const StepRecord& s : in.steps) {
    if (o.steady_batch > 0 && !(s.decode_only && s.num_seqs == o.steady_batch)) continue;
    if (skipped < o.warmup_steps) {
      ++skipped;
      continue;
    }
    measured.push_back(&s);
  }
  LatencyHistogram iter, sched, enc, pub, recv, apply, build, fwd, dfwd, samp, wtotal, ret, bytes,
      idle, pf_fwd, dec_fwd;
  for (size_t i = 0; i < measured.size(); ++i) {
    const StepRecord& s = *measured[i];
    sched.Record(s.schedule_ns);
    enc.Record(s.encode_ns);
    pub.Record(s.publish_ns);
    recv.Record(s.recv_wait_ns);
    apply.Record(s.apply_ns);
    build.Record(s.build_ns);
    fwd.Record(s.forward_ns);
    if (s.device_forward_ns > 0) dfwd.Record(s.device_forward_ns);
    const double step_fwd = s.device_forward_ns > 0 ? s.device_forward_ns : s.forward_ns;
    (s.decode_only ? dec_fwd : pf_fwd).Record(step_fwd);
    samp.Record(s.sample_ns);
    wtotal.Record(s.worker_total_ns);
    ret.Record(s.result_return_ns);
    bytes.Record(static_cast<double>(s.wire_bytes));
    // Iteration time: between consecutive completions of measured steps.
    // v1: a worker's loop period (waiting for the diff + the step), max over
    // ranks. v0: the driver is synchronous, so completion to completion.
    if (s.worker_iter_ns > 0 || (i > 0 && measured[i - 1]->step + 1 == s.step)) {
      double it = s.worker_iter_ns > 0
                      ? static_cast<double>(s.worker_iter_ns)
                      : static_cast<double>(s.done_at_ns - measured[i - 1]->done_at_ns);
      iter.Record(it);
      // GPU: measured by events between steps; CPU: the loop period minus
      // the forward pass.
      double busy = s.device_forward_ns > 0 ? s.device_forward_ns : s.forward_ns;
      idle.Record(s.gpu_idle_ns > 0 ? static_cast<double>(s.gpu_idle_ns) : std::max(0.0, it - busy));
    }
  }

  LatencyHistogram ttft, tpot, itl;
  uint64_t out_tokens = 0;
  int finished = 0;
  for (const RequestRecord& r : in.requests) {
    out_tokens += r.tokens.size();
    if (r.finish_ns >= 0) ++finished;
    if (r.first_token_ns >= 0) ttft.Record(r.first_token_ns - r.arrival_ns);
    if (r.tokens.size() > 1 && r.finish_ns >= 0) {
      tpot.Record(static_cast<double>(r.token_times_ns.back() - r.token_times_ns.front()) /
                  static_cast<double>(r.tokens.size() - 1));
    }
    for (size_t i = 1; i < r.token_times_ns.size(); ++i) {
      itl.Record(r.token_times_ns[i] - r.token_times_ns[i - 1]);
    }
  }
  const double wall_s = (in.end_ns - in.start_ns) / 1e9;
  std::string summary = absl::StrFormat(
      "{\n  \"status\": \"ok\",\n  \"mode\": \"%s\",\n  \"backend\": \"%s\",\n  \"tp\": %d,\n"
      "  \"model\": %s,\n  \"flags\": \"%s\",\n  \"wall_s\": %.6f,\n  \"requests\": %d,\n"
      "  \"finished_requests\": %d,\n  \"output_tokens\": %d,\n  \"request_throughput\": %.4f,\n"
      "  \"output_tokens_per_s\": %.4f,\n  \"ttft_ms\": %s,\n  \"tpot_ms\": %s,\n  \"itl_ms\": %s,\n"
      "  \"steps\": {\n    \"total\": %d,\n    \"measured\": %d,\n    \"iteration_ms\": %s,\n"
      "    \"gpu_idle_us\": %s,\n    \"schedule_us\": %s,\n    \"encode_us\": %s,\n"
      "    \"publish_us\": %s,\n    \"recv_wait_us\": %s,\n    \"apply_us\": %s,\n"
      "    \"build_us\": %s,\n    \"forward_us\": %s,\n    \"device_forward_us\": %s,\n"
      "    \"prefill_forward_us\": %s,\n    \"decode_forward_us\": %s,\n    \"sample_us\": %s,\n    \"worker_total_us\": %s,\n    \"result_return_us\": %s,\n"
      "    \"wire_bytes\": %s\n  }%s%s\n}\n",
      o.mode, o.resolved_backend, o.tp, in.model_json,
      JsonEscape(absl::StrJoin(ToArgs(o), " ")), wall_s, static_cast<int>(in.requests.size()),
      finished, out_tokens, finished / std::max(wall_s, 1e-9), out_tokens / std::max(wall_s, 1e-9),
      Hist(ttft, 1e6), Hist(tpot, 1e6), Hist(itl, 1e6), static_cast<int>(in.steps.size()),
      static_cast<int>(measured.size()), Hist(iter, 1e6), Hist(idle, 1e3), Hist(sched, 1e3),
      Hist(enc, 1e3), Hist(pub, 1e3), Hist(recv, 1e3), Hist(apply, 1e3), Hist(build, 1e3),
      Hist(fwd, 1e3), Hist(dfwd, 1e3), Hist(pf_fwd, 1e3), Hist(dec_fwd, 1e3), Hist(samp, 1e3), Hist(wtotal, 1e3), Hist(ret, 1e3),
      Hist(bytes, 1), in.extra_json.empty() ? "" : ",\n  ", in.extra_json);

  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("creating ", o.out_dir, ": ", ec.message()));
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "summary.json", summary));
    std::string lines;
    for (const RequestRecord& r : in.requests) {
      absl::StrAppend(&lines, "{\"id\":", r.id, ",\"prompt_len\":", r.prompt_len, ",\"tokens\":[",
                      absl::StrJoin(r.tokens, ","), "]}\n");
    }
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "tokens.jsonl", lines));
    lines.clear();
    for (const RequestRecord& r : in.requests) {
      absl::StrAppend(&lines, "{\"id\":", r.id, ",\"tokens\":[", absl::StrJoin(r.prompt, ","), "]}\n");
    }
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "prompts.jsonl", lines));
  }
  if (!o.trace_file.empty()) {
    // Chrome trace (chrome://tracing, ui.perfetto.dev). The scheduler's
    // phases are exact. v1: each rank's phases come from its own absolute
    // CLOCK_MONOTONIC stamps (one clock for every process of the host); the
    // GPU row shows the step's GPU time by events, ending when the worker
    // collected it (its true end is at most that). v0 (no per-rank stamps):
    // the worker phases are the per-step maxima laid end to end.
    std::string ev = "{\"traceEvents\":[\n";
    bool first = true;
    auto add = [&](const char* name, int tid, int64_t ts, int64_t dur, uint64_t step) {
      if (ts < in.start_ns) {  // e.g. waiting for the first diff since start-up
        dur -= in.start_ns - ts;
        ts = in.start_ns;
      }
      if (dur <= 0) return;
      absl::StrAppendFormat(&ev, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%d}}",
                            first ? "" : ",\n", name, tid, (ts - in.start_ns) / 1e3, dur / 1e3, step);
      first = false;
    };
    auto thread_name = [&](int tid, const std::string& name) {
      absl::StrAppendFormat(&ev, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                            first ? "" : ",\n", tid, name);
      first = false;
    };
    thread_name(0, o.mode == "v0" ? "rank 0 (scheduler inline)" : "scheduler");
    bool per_rank = false;
    for (const StepRecord& s : in.steps) per_rank = per_rank || !s.ranks.empty();
    if (per_rank) {
      for (int r = 0; r < o.tp; ++r) {
        thread_name(1 + 2 * r, absl::StrCat("worker rank ", r));
        thread_name(2 + 2 * r, absl::StrCat("rank ", r, " device"));
      }
    } else {
      thread_name(1, "workers (max over ranks)");
    }
    for (const StepRecord& s : in.steps) {
      int64_t t = s.plan_start_ns;
      add("schedule", 0, t, s.schedule_ns, s.step);
      add(o.mode == "v0" ? "build batch" : "encode", 0, t + s.schedule_ns, s.encode_ns, s.step);
      add(o.mode == "v0" ? "broadcast" : "publish", 0, t + s.schedule_ns + s.encode_ns, s.publish_ns, s.step);
      if (!s.ranks.empty()) {
        int64_t last_result = 0;
        for (size_t r = 0; r < s.ranks.size(); ++r) {
          const proto::PhaseTimings& p = s.ranks[r];
          const int tid = 1 + 2 * static_cast<int>(r);
          const auto at = [](uint64_t v) { return static_cast<int64_t>(v); };
          add("wait for diff", tid, at(p.recv_at_ns - p.recv_wait_ns), at(p.recv_wait_ns), s.step);
          add("apply", tid, at(p.recv_at_ns), at(p.apply_ns), s.step);
          add("build inputs", tid, at(p.recv_at_ns + p.apply_ns), at(p.build_ns), s.step);
          if (p.launch_at_ns > 0) add("launch", tid, at(p.launch_at_ns), 1000, s.step);  // a 1 us mark
          add("collect + result", tid, at(p.collect_at_ns),
              at(p.result_at_ns) - at(p.collect_at_ns) + 1000, s.step);
          // forward_ns is the GPU time by events on the cuda backend.
          add("forward (GPU time)", tid + 1, at(p.collect_at_ns) - at(p.forward_ns),
              at(p.forward_ns), s.step);
          last_result = std::max(last_result, at(p.result_at_ns));
        }
        add("results in", 0, last_result, s.done_at_ns - last_result, s.step);
        continue;
      }
      int64_t end = s.done_at_ns - s.result_return_ns;
      int64_t w = end - s.sample_ns - s.forward_ns - s.build_ns - s.apply_ns;
      add("apply", 1, w, s.apply_ns, s.step);
      add("build inputs", 1, w + s.apply_ns, s.build_ns, s.step);
      add("forward", 1, w + s.apply_ns + s.build_ns, s.forward_ns, s.step);
      add("sample", 1, end - s.sample_ns, s.sample_ns, s.step);
      add("return", 0, end, s.result_return_ns, s.step);
    }
    absl::StrAppend(&ev, "\n],\"displayTimeUnit\":\"ms\"}\n");
    SYMTP_RETURN_IF_ERROR(WriteFile(o.trace_file, ev));
  }
  return absl::OkStatus();
}

Progress::Progress(bool enabled, int total)
    : enabled_(enabled && isatty(STDERR_FILENO)), total_(total), start_ns_(MonotonicNs()) {}

void Progress::Update(uint64_t step, int finished, uint64_t tokens) {
  if (!enabled_) return;
  int64_t now = MonotonicNs();
  if (now - last_ns_ < 200'000'000) return;
  last_ns_ = now;
  double s = (now - start_ns_) / 1e9;
  int width = 30, fill = total_ > 0 ? finished * width / total_ : 0;
  std::fprintf(stderr, "\r[%s%s] %d/%d requests  step %llu  %.0f tok/s  %.1fs ",
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), finished,
               total_, static_cast<unsigned long long>(step), tokens / std::max(s, 1e-9), s);
}

void Progress::Finish() {
  if (enabled_) std::fprintf(stderr, "\n");
}

}  // namespace symtp::runtime
