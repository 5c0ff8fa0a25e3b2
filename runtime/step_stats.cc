#include "runtime/step_stats.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/json.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace symtp::runtime {
namespace {

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

// Steady decode with fewer whole-batch steps than asked for: the KV cache
// could not hold the batch (preemptions), or the workload ended it early.
bool SteadyStepsShort(const JobOptions& o, const RunMetrics& m) {
  return o.steady_batch > 0 && m.measured_steps < o.steady_steps;
}

// Which steps count: after the warm-up; in steady mode, only full decode steps.
std::vector<const StepRecord*> MeasuredSteps(const RunSummaryInput& in) {
  const JobOptions& o = *in.opts;
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
  return measured;
}

// The job's flags as an object: true/false and numbers as such, the rest
// as strings.
std::string FlagsJson(const JobOptions& o) {
  static const std::regex kNumber(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  JsonWriter j;
  j.Open('{');
  for (const std::string& arg : ToArgs(o)) {  // "--name=value"
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) continue;
    const std::string v = arg.substr(eq + 1);
    j.Key(arg.substr(2, eq - 2));
    if (v == "true" || v == "false" || std::regex_match(v, kNumber)) j.Raw(v);
    else j.Value(v);
  }
  return j.Close().Take();
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string UtcNow() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

// The first "key : value" line of a /proc-style file whose key is `key`.
std::string ProcField(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (absl::StripAsciiWhitespace(line.substr(0, colon)) != key) continue;
    return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return "";
}

// One entry per rank: the CPU model (cpu backend) or the GPU model of each
// rank's device, read from the NVIDIA driver's /proc files (the scheduler
// does not create a CUDA context). GPUs are in PCI bus order, as nvidia-smi
// lists them; CUDA_VISIBLE_DEVICES (numeric indices) picks among them.
std::vector<std::string> Devices(const JobOptions& o) {
  std::vector<std::string> out;
  if (o.resolved_backend != BackendKind::kCuda) {
    std::string cpu = ProcField("/proc/cpuinfo", "model name");
    if (cpu.empty()) cpu = "unknown";
    for (int r = 0; r < o.tp; ++r) out.push_back(absl::StrCat("cpu: ", cpu));
    return out;
  }
  std::vector<std::string> gpus;
  std::error_code ec;
  std::vector<std::filesystem::path> dirs;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    std::string m = ProcField((d / "information").string(), "Model");
    gpus.push_back(m.empty() ? "unknown GPU" : m);
  }
  std::vector<std::string> visible;
  if (const std::optional<std::string> v = env::CudaVisibleDevices()) {
    for (absl::string_view idx : absl::StrSplit(*v, ',', absl::SkipEmpty())) {
      int i;
      if (!absl::SimpleAtoi(idx, &i) || i < 0 || i >= static_cast<int>(gpus.size())) {
        visible.clear();  // UUIDs or out of range: fall back to the first ones
        break;
      }
      visible.push_back(gpus[i]);
    }
  }
  if (visible.empty()) visible = gpus;
  for (int r = 0; r < o.tp; ++r) {
    out.push_back(r < static_cast<int>(visible.size()) ? visible[r] : "unknown GPU");
  }
  return out;
}

std::string Ms(const MetricStats& s, double v) {
  return s.count > 0 ? absl::StrFormat("%.2f", v) : "n/a";
}

}  // namespace

MetricStats MetricStats::Of(std::vector<double> v, double scale) {
  MetricStats m;
  if (v.empty()) return m;
  for (double& x : v) x /= scale;
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  m.count = static_cast<int64_t>(v.size());
  double sum = 0;
  for (double x : v) sum += x;
  m.mean = sum / n;
  double var = 0;
  for (double x : v) var += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(var / n);
  m.min = v.front();
  m.max = v.back();
  auto at = [&](double p) {
    const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * n));
    return v[rank == 0 ? 0 : rank - 1];
  };
  m.p50 = at(50);
  m.p90 = at(90);
  m.p95 = at(95);
  m.p99 = at(99);
  return m;
}

std::string MetricStats::ToJson() const {
  if (count == 0) return "null";
  JsonWriter j;
  j.Open('{').Field("count", count);
  const std::pair<const char*, double> fields[] = {{"mean", mean}, {"std", std}, {"min", min},
                                                  {"p50", p50},   {"p90", p90}, {"p95", p95},
                                                  {"p99", p99},   {"max", max}};
  for (const auto& [k, v] : fields) j.Field(k, v, 4);
  return j.Close().Take();
}

RunMetrics ComputeRunMetrics(const RunSummaryInput& in) {
  const JobOptions& o = *in.opts;
  RunMetrics m;
  const std::vector<const StepRecord*> measured = MeasuredSteps(in);
  m.total_steps = static_cast<int>(in.steps.size());
  m.measured_steps = static_cast<int>(measured.size());
  std::vector<double> sched, enc, pub, recv, apply, build, fwd, dfwd, samp, wtotal, ret, bytes,
      idle, pf_fwd, dec_fwd, period, ctx;
  for (const StepRecord* sp : measured) {
    const StepRecord& s = *sp;
    sched.push_back(s.schedule_ns);
    enc.push_back(s.encode_ns);
    pub.push_back(s.publish_ns);
    recv.push_back(s.recv_wait_ns);
    apply.push_back(s.apply_ns);
    build.push_back(s.build_ns);
    fwd.push_back(s.forward_ns);
    if (s.device_forward_ns > 0) dfwd.push_back(s.device_forward_ns);
    const double step_fwd = s.device_forward_ns > 0 ? s.device_forward_ns : s.forward_ns;
    (s.decode_only ? dec_fwd : pf_fwd).push_back(step_fwd);
    m.decode_graph_steps += s.decode_only && s.graph ? 1 : 0;
    samp.push_back(s.sample_ns);
    wtotal.push_back(s.worker_total_ns);
    ret.push_back(s.result_return_ns);
    bytes.push_back(static_cast<double>(s.wire_bytes));
    if (s.num_seqs > 0) ctx.push_back(static_cast<double>(s.context_tokens) / s.num_seqs);
    // GPU idle before the step, by CUDA events (0: not measured).
    if (o.resolved_backend == BackendKind::kCuda && s.gpu_idle_ns > 0) idle.push_back(s.gpu_idle_ns);
  }
  m.decode_steps = static_cast<int>(dec_fwd.size());
  {
    std::vector<double> sum;
    for (const StepRecord* sp : measured) {
      if (sp->rank_forward_ns.size() > sum.size()) sum.resize(sp->rank_forward_ns.size(), 0.0);
      for (size_t r = 0; r < sp->rank_forward_ns.size(); ++r) sum[r] += sp->rank_forward_ns[r];
    }
    for (double s : sum) {
      m.busiest_rank_forward_us = std::max(m.busiest_rank_forward_us, s / measured.size() / 1e3);
    }
  }
  // Step period: completions over windows of consecutive measured steps.
  if (measured.size() >= 2) {
    // An even number of steps where there is a choice: completions that come
    // in pairs then span whole pairs.
    const StepRecord& first = *measured.front();
    const bool odd = (measured.back()->step - first.step) % 2 == 1 && measured.size() >= 3;
    const StepRecord& last = *measured[measured.size() - (odd ? 2 : 1)];
    const double steps = static_cast<double>(last.step - first.step);
    if (steps > 0) m.step_period_ms = (last.done_at_ns - first.done_at_ns) / steps / 1e6;
    const size_t w = std::min<size_t>(RunMetrics::kPeriodWindow, measured.size() - 1);
    for (size_t i = 0; i + w < measured.size(); ++i) {
      const StepRecord& a = *measured[i];
      const StepRecord& b = *measured[i + w];
      if (b.step - a.step != w) continue;  // not consecutive
      period.push_back(static_cast<double>(b.done_at_ns - a.done_at_ns) / static_cast<double>(w));
    }
  }
  m.iteration_ms = MetricStats::Of(period, 1e6);
  m.gpu_idle_us = MetricStats::Of(idle, 1e3);
  m.schedule_us = MetricStats::Of(sched, 1e3);
  m.encode_us = MetricStats::Of(enc, 1e3);
  m.publish_us = MetricStats::Of(pub, 1e3);
  m.recv_wait_us = MetricStats::Of(recv, 1e3);
  m.apply_us = MetricStats::Of(apply, 1e3);
  m.build_us = MetricStats::Of(build, 1e3);
  m.forward_us = MetricStats::Of(fwd, 1e3);
  m.device_forward_us = MetricStats::Of(dfwd, 1e3);
  m.prefill_forward_us = MetricStats::Of(pf_fwd, 1e3);
  m.decode_forward_us = MetricStats::Of(dec_fwd, 1e3);
  m.sample_us = MetricStats::Of(samp, 1e3);
  m.worker_total_us = MetricStats::Of(wtotal, 1e3);
  m.result_return_us = MetricStats::Of(ret, 1e3);
  m.wire_bytes = MetricStats::Of(bytes, 1);
  m.context = MetricStats::Of(ctx, 1);

  std::vector<double> ttft, tpot, itl, e2e;
  m.requests = static_cast<int>(in.requests.size());
  for (const RequestRecord& r : in.requests) {
    m.input_tokens += r.prompt_len;
    m.output_tokens += static_cast<int64_t>(r.tokens.size());
    if (r.finish_ns >= 0) {
      ++m.finished;
      e2e.push_back(static_cast<double>(r.finish_ns - r.arrival_ns));
    }
    if (r.first_token_ns >= 0) ttft.push_back(static_cast<double>(r.first_token_ns - r.arrival_ns));
    if (r.tokens.size() > 1 && r.finish_ns >= 0 && r.token_times_ns.size() > 1) {
      tpot.push_back(static_cast<double>(r.token_times_ns.back() - r.token_times_ns.front()) /
                     static_cast<double>(r.token_times_ns.size() - 1));
    }
    for (size_t i = 1; i < r.token_times_ns.size(); ++i) {
      itl.push_back(static_cast<double>(r.token_times_ns[i] - r.token_times_ns[i - 1]));
    }
  }
  m.ttft_ms = MetricStats::Of(ttft, 1e6);
  m.tpot_ms = MetricStats::Of(tpot, 1e6);
  m.itl_ms = MetricStats::Of(itl, 1e6);
  m.e2e_ms = MetricStats::Of(e2e, 1e6);
  m.startup_s = in.startup_ns / 1e9;
  m.duration_s = (in.end_ns - in.start_ns) / 1e9;
  const double d = std::max(m.duration_s, 1e-9);
  m.request_throughput = m.finished / d;
  m.input_tokens_per_s = m.input_tokens / d;
  m.output_tokens_per_s = m.output_tokens / d;
  m.total_tokens_per_s = (m.input_tokens + m.output_tokens) / d;
  return m;
}

std::string FormatResultsBlock(const RunSummaryInput& in, const RunMetrics& m) {
  const JobOptions& o = *in.opts;
  std::string b;
  auto line = [&](const std::string& label, const std::string& value) {
    absl::StrAppendFormat(&b, "%-40s %s\n", label, value);
  };
  auto rule = [&](const std::string& title, char fill) {
    const int width = 50, pad = std::max<int>(0, width - static_cast<int>(title.size()));
    absl::StrAppend(&b, std::string(pad / 2, fill), title, std::string(pad - pad / 2, fill), "\n");
  };
  auto dist = [&](const char* name, const MetricStats& s, const char* unit) {
    line(absl::StrCat("Mean ", name, " (", unit, "):"), Ms(s, s.mean));
    line(absl::StrCat("Median ", name, " (", unit, "):"), Ms(s, s.p50));
    line(absl::StrCat("P99 ", name, " (", unit, "):"), Ms(s, s.p99));
  };
  rule(" symtp results ", '=');
  line("Backend / mode / TP:", absl::StrCat(Name(o.resolved_backend), " / ", Name(o.mode), " / ", o.tp));
  line("Model:", absl::StrCat(o.model, o.model_overrides.empty() ? "" : " (" + o.model_overrides + ")"));
  line("Successful requests:", absl::StrCat(m.finished, " of ", m.requests));
  line("Start-up, not measured (s):", absl::StrFormat("%.2f", m.startup_s));
  line("Benchmark duration (s):", absl::StrFormat("%.3f", m.duration_s));
  line("Total input tokens:", absl::StrCat(m.input_tokens));
  line("Total generated tokens:", absl::StrCat(m.output_tokens));
  line("Request throughput (req/s):", absl::StrFormat("%.2f", m.request_throughput));
  line("Output token throughput (tok/s):", absl::StrFormat("%.2f", m.output_tokens_per_s));
  line("Total token throughput (tok/s):", absl::StrFormat("%.2f", m.total_tokens_per_s));
  rule("Time to First Token", '-');
  dist("TTFT", m.ttft_ms, "ms");
  rule("Time per Output Token (excl. 1st token)", '-');
  dist("TPOT", m.tpot_ms, "ms");
  rule("Inter-token Latency", '-');
  dist("ITL", m.itl_ms, "ms");
  rule("End-to-end Latency", '-');
  dist("E2E", m.e2e_ms, "ms");
  rule("Steps", '-');
  line("Steps (measured / total):", absl::StrCat(m.measured_steps, " / ", m.total_steps));
  if (SteadyStepsShort(o, m)) {
    line("Steady steps asked for (not reached):", absl::StrCat(o.steady_steps));
  }
  line("Step period (ms):", m.step_period_ms > 0 ? absl::StrFormat("%.3f", m.step_period_ms) : "n/a");
  if (o.resolved_backend == BackendKind::kCuda && o.cuda_graphs) {
    line("Decode steps from CUDA graphs:", absl::StrCat(m.decode_graph_steps, " / ", m.decode_steps));
  }
  const MetricStats& fwd = m.device_forward_us.count > 0 ? m.device_forward_us : m.forward_us;
  line(m.device_forward_us.count > 0 ? "Median forward, GPU time (ms):" : "Median forward (ms):",
       fwd.count > 0 ? absl::StrFormat("%.3f", fwd.p50 / 1e3) : "n/a");
  line("Median GPU idle between steps (us):",
       m.gpu_idle_us.count > 0 ? absl::StrFormat("%.1f", m.gpu_idle_us.p50)
                               : absl::StrCat("n/a (", Name(o.resolved_backend), " backend)"));
  line("Median context (keys per sequence):",
       m.context.count > 0 ? absl::StrFormat("%.1f", m.context.p50) : "n/a");
  rule("", '=');
  return b;
}

std::string SummaryJson(const RunSummaryInput& in, const RunMetrics& m) {
  const JobOptions& o = *in.opts;
  JsonWriter j(2);
  j.Open('{').Field("status", "ok").Field("version", BuildVersion()).Field("commit", BuildCommit());
  j.Field("build_type", BuildType()).Field("date", UtcNow()).Field("host", HostName());
  j.Key("devices").Open('[');
  for (const std::string& d : Devices(o)) j.Value(d);
  j.Close().Field("mode", Name(o.mode)).Field("backend", Name(o.resolved_backend)).Field("tp", o.tp);
  j.Key("model").Raw(in.model_json).Key("flags").Raw(FlagsJson(o));
  j.Field("startup_s", m.startup_s).Field("wall_s", m.duration_s).Field("requests", m.requests);
  j.Field("finished_requests", m.finished).Field("input_tokens", m.input_tokens);
  j.Field("output_tokens", m.output_tokens).Field("request_throughput", m.request_throughput, 4);
  j.Field("input_tokens_per_s", m.input_tokens_per_s, 4);
  j.Field("output_tokens_per_s", m.output_tokens_per_s, 4);
  j.Field("total_tokens_per_s", m.total_tokens_per_s, 4);
  auto stats = [&](const char* k, const MetricStats& s) { j.Key(k).Raw(s.ToJson()); };
  stats("ttft_ms", m.ttft_ms);
  stats("tpot_ms", m.tpot_ms);
  stats("itl_ms", m.itl_ms);
  stats("e2e_ms", m.e2e_ms);
  j.Key("steps").Open('{').Field("total", m.total_steps).Field("measured", m.measured_steps);
  if (o.resolved_backend == BackendKind::kCuda) {
    j.Field("decode", m.decode_steps).Field("decode_from_graphs", m.decode_graph_steps);
  }
  if (m.step_period_ms > 0) j.Field("period_ms", m.step_period_ms);
  else j.Key("period_ms").Null();
  stats("iteration_ms", m.iteration_ms);
  if (m.busiest_rank_forward_us > 0) j.Field("busiest_rank_forward_us", m.busiest_rank_forward_us, 4);
  else j.Key("busiest_rank_forward_us").Null();
  const std::pair<const char*, const MetricStats*> steps[] = {
      {"gpu_idle_us", &m.gpu_idle_us}, {"schedule_us", &m.schedule_us},
      {"encode_us", &m.encode_us}, {"publish_us", &m.publish_us},
      {"recv_wait_us", &m.recv_wait_us}, {"apply_us", &m.apply_us}, {"build_us", &m.build_us},
      {"forward_us", &m.forward_us}, {"device_forward_us", &m.device_forward_us},
      {"prefill_forward_us", &m.prefill_forward_us}, {"decode_forward_us", &m.decode_forward_us},
      {"sample_us", &m.sample_us}, {"worker_total_us", &m.worker_total_us},
      {"result_return_us", &m.result_return_us}, {"wire_bytes", &m.wire_bytes},
      {"context", &m.context}};
  for (const auto& [k, s] : steps) stats(k, *s);
  j.Close();
  if (!in.extra.first.empty()) j.Key(in.extra.first).Raw(in.extra.second);
  return j.Close().Take() + "\n";
}

std::string RequestsJsonl(const RunSummaryInput& in) {
  std::string lines;
  for (const RequestRecord& r : in.requests) {
    JsonWriter j;
    j.Open('{').Field("id", r.id);
    const std::pair<const char*, int64_t> times[] = {
        {"arrival_s", r.arrival_ns}, {"first_token_s", r.first_token_ns}, {"finish_s", r.finish_ns}};
    for (const auto& [k, t] : times) {
      if (t >= 0) j.Field(k, (t - in.start_ns) / 1e9);
      else j.Key(k).Null();
    }
    j.Field("input_tokens", r.prompt_len).Field("output_tokens", r.tokens.size());
    lines += j.Close().Take() + "\n";
  }
  return lines;
}

absl::Status WriteRunOutputs(const RunSummaryInput& in) {
  const JobOptions& o = *in.opts;
  const RunMetrics metrics = ComputeRunMetrics(in);
  if (SteadyStepsShort(o, metrics)) {
    SYMTP_LOG(WARN, "launch") << "steady decode: " << metrics.measured_steps << " of the "
                              << o.steady_steps << " steps asked for ran with all "
                              << o.steady_batch << " sequences decoding";
  }
  const std::string block = FormatResultsBlock(in, metrics);
  std::fwrite(block.data(), 1, block.size(), stdout);
  std::fflush(stdout);
  if (o.out_dir.empty() && o.trace_file.empty()) return absl::OkStatus();
  const std::string summary = SummaryJson(in, metrics);

  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("creating ", o.out_dir, ": ", ec.message()));
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "summary.json", summary));
    SYMTP_RETURN_IF_ERROR(
        WriteFile(std::filesystem::path(o.out_dir) / "requests.jsonl", RequestsJsonl(in)));
    std::string tokens, prompts;
    for (const RequestRecord& r : in.requests) {
      JsonWriter t, p;
      t.Open('{').Field("id", r.id).Field("prompt_len", r.prompt_len).Key("tokens").Array(r.tokens);
      p.Open('{').Field("id", r.id).Key("tokens").Array(r.prompt);
      tokens += t.Close().Take() + "\n";
      prompts += p.Close().Take() + "\n";
    }
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "tokens.jsonl", tokens));
    SYMTP_RETURN_IF_ERROR(WriteFile(std::filesystem::path(o.out_dir) / "prompts.jsonl", prompts));
  }
  if (!o.trace_file.empty()) {
    // Chrome trace (chrome://tracing, ui.perfetto.dev). The scheduler's
    // phases are exact. v1: each rank's phases come from its own absolute
    // CLOCK_MONOTONIC stamps (one clock for every process of the host); the
    // GPU row shows the step's GPU time by events, ending when the worker
    // collected it (its true end is at most that). v0 (no per-rank stamps):
    // the worker phases are the per-step maxima laid end to end.
    JsonWriter ev(1);
    ev.Open('{').Key("traceEvents").Open('[');
    auto add = [&](const char* name, int tid, int64_t ts, int64_t dur, const StepRecord& rec) {
      if (ts < in.start_ns) {  // e.g. waiting for the first diff since start-up
        dur -= in.start_ns - ts;
        ts = in.start_ns;
      }
      if (dur <= 0) return;
      ev.Raw(JsonWriter().Open('{').Field("name", name).Field("ph", "X").Field("pid", 1)
                 .Field("tid", tid).Field("ts", (ts - in.start_ns) / 1e3, 3).Field("dur", dur / 1e3, 3)
                 .Key("args").Open('{').Field("step", rec.step).Field("seqs", rec.num_seqs)
                 .Field("tokens", rec.num_tokens).Close().Close().Take());
    };
    auto thread_name = [&](int tid, const std::string& name) {
      ev.Raw(JsonWriter().Open('{').Field("name", "thread_name").Field("ph", "M").Field("pid", 1)
                 .Field("tid", tid).Key("args").Open('{').Field("name", name).Close().Close().Take());
    };
    thread_name(0, o.mode == Mode::kV0 ? "rank 0 (scheduler inline)" : "scheduler");
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
      add("schedule", 0, t, s.schedule_ns, s);
      add(o.mode == Mode::kV0 ? "build batch" : "encode", 0, t + s.schedule_ns, s.encode_ns, s);
      add(o.mode == Mode::kV0 ? "broadcast" : "publish", 0, t + s.schedule_ns + s.encode_ns, s.publish_ns, s);
      if (!s.ranks.empty()) {
        int64_t last_result = 0;
        for (size_t r = 0; r < s.ranks.size(); ++r) {
          const proto::PhaseTimings& p = s.ranks[r];
          const int tid = 1 + 2 * static_cast<int>(r);
          const auto at = [](uint64_t v) { return static_cast<int64_t>(v); };
          add("wait for diff", tid, at(p.recv_at_ns - p.recv_wait_ns), at(p.recv_wait_ns), s);
          add("apply", tid, at(p.recv_at_ns), at(p.apply_ns), s);
          add("build inputs", tid, at(p.recv_at_ns + p.apply_ns), at(p.build_ns), s);
          if (p.launch_at_ns > 0) add("launch", tid, at(p.launch_at_ns), 1000, s);  // a 1 us mark
          add("collect + result", tid, at(p.collect_at_ns),
              at(p.result_at_ns) - at(p.collect_at_ns) + 1000, s);
          // forward_ns is the GPU time by events on the cuda backend.
          add("forward (GPU time)", tid + 1, at(p.collect_at_ns) - at(p.forward_ns),
              at(p.forward_ns), s);
          last_result = std::max(last_result, at(p.result_at_ns));
        }
        add("results in", 0, last_result, s.done_at_ns - last_result, s);
        continue;
      }
      int64_t end = s.done_at_ns - s.result_return_ns;
      int64_t w = end - s.sample_ns - s.forward_ns - s.build_ns - s.apply_ns;
      add("apply", 1, w, s.apply_ns, s);
      add("build inputs", 1, w + s.apply_ns, s.build_ns, s);
      add("forward", 1, w + s.apply_ns + s.build_ns, s.forward_ns, s);
      add("sample", 1, end - s.sample_ns, s.sample_ns, s);
      add("return", 0, end, s.result_return_ns, s);
    }
    ev.Close().Field("displayTimeUnit", "ms");
    SYMTP_RETURN_IF_ERROR(WriteFile(o.trace_file, ev.Close().Take() + "\n"));
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
