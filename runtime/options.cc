#include "runtime/options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace symtp::runtime {

namespace {

// Flag values are parsed strictly, one helper per type: the whole text must
// be the number (no surrounding whitespace), finite, integral where an
// integer is meant, and in range. absl::SimpleAtoi / SimpleAtod alone accept
// surrounding whitespace, and SimpleAtod accepts "nan" and "inf".
absl::Status CheckNumberText(absl::string_view v) {
  if (v.empty()) return absl::InvalidArgumentError("expected a number, got ''");
  if (absl::ascii_isspace(static_cast<unsigned char>(v.front())) ||
      absl::ascii_isspace(static_cast<unsigned char>(v.back()))) {
    return absl::InvalidArgumentError(absl::StrCat("'", v, "' has whitespace around the number"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseInteger(absl::string_view v, int64_t lo, int64_t hi) {
  SYMTP_RETURN_IF_ERROR(CheckNumberText(v));
  int64_t x;
  if (!absl::SimpleAtoi(v, &x) || x < lo || x > hi) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected an integer in [%d, %d], got '%s'", lo, hi, v));
  }
  return x;
}

absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view v) {
  SYMTP_RETURN_IF_ERROR(CheckNumberText(v));
  uint64_t x;
  if (v.front() == '-' || !absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected an integer in [0, %u], got '%s'", UINT64_MAX, v));
  }
  return x;
}

absl::StatusOr<double> ParseReal(absl::string_view v, double lo, double hi) {
  SYMTP_RETURN_IF_ERROR(CheckNumberText(v));
  double x;
  if (!absl::SimpleAtod(v, &x) || !std::isfinite(x) || x < lo || x > hi) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected a finite number in [%g, %g], got '%s'", lo, hi, v));
  }
  return x;
}

}  // namespace

std::string LengthDist::ToString() const {
  if (kind == "fixed") return absl::StrCat(static_cast<int64_t>(a));
  return absl::StrFormat("%s:%.17g:%.17g", kind, a, b);  // exact round trip to the children
}

double LengthDist::Max() const {
  if (kind == "fixed") return a;
  if (kind == "uniform") return b;
  if (kind == "normal") return a;
  return std::exp(a);  // lognormal: the median
}

absl::StatusOr<LengthDist> ParseLengthDist(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  LengthDist d;
  // Lengths are token counts: integers in [1, kMaxLength] (fixed, uniform);
  // the normal's mean and spread and the lognormal's mu and sigma are reals
  // whose median length lies in the same range.
  auto num = [&](const std::string& s, bool integer, double lo, double hi,
                 double* out) -> absl::Status {
    absl::StatusOr<double> x;
    if (integer) {
      absl::StatusOr<int64_t> i =
          ParseInteger(s, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
      if (i.ok()) x = static_cast<double>(*i);
      else x = i.status();
    } else {
      x = ParseReal(s, lo, hi);
    }
    if (!x.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("length '", spec, "': ", x.status().message()));
    }
    *out = *x;
    return absl::OkStatus();
  };
  constexpr double kMax = LengthDist::kMaxLength;
  if (parts.size() == 1) {
    d.kind = "fixed";
    SYMTP_RETURN_IF_ERROR(num(parts[0], true, 1, kMax, &d.a));
    return d;
  }
  if (parts.size() != 3 || (parts[0] != "uniform" && parts[0] != "normal" && parts[0] != "lognormal")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "length '", spec, "': expected N, uniform:MIN:MAX, normal:MEAN:STD or lognormal:MU:SIGMA"));
  }
  d.kind = parts[0];
  if (d.kind == "uniform") {
    SYMTP_RETURN_IF_ERROR(num(parts[1], true, 1, kMax, &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], true, 1, kMax, &d.b));
    if (d.b < d.a) {
      return absl::InvalidArgumentError(absl::StrCat("uniform length needs MIN <= MAX: ", spec));
    }
  } else if (d.kind == "normal") {
    SYMTP_RETURN_IF_ERROR(num(parts[1], false, 1, kMax, &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], false, 0, kMax, &d.b));
  } else {
    SYMTP_RETURN_IF_ERROR(num(parts[1], false, 0, std::log(kMax), &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], false, 0, 4, &d.b));
  }
  return d;
}

namespace {

using Setter = std::function<absl::Status(const std::string&, JobOptions*)>;
using Getter = std::function<std::string(const JobOptions&)>;
struct Flag {
  Setter set;
  Getter get;
  const char* help;
};

Setter Int(int JobOptions::*f, int lo, int hi) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(int64_t x, ParseInteger(v, lo, hi));
    o->*f = static_cast<int>(x);
    return absl::OkStatus();
  };
}
Setter I64(int64_t JobOptions::*f, int64_t lo, int64_t hi) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(o->*f, ParseInteger(v, lo, hi));
    return absl::OkStatus();
  };
}
Setter U64(uint64_t JobOptions::*f) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(o->*f, ParseUnsigned(v));
    return absl::OkStatus();
  };
}
template <typename T>
Setter Real(T JobOptions::*f, double lo, double hi) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(double x, ParseReal(v, lo, hi));
    o->*f = static_cast<T>(x);
    return absl::OkStatus();
  };
}
Setter Str(std::string JobOptions::*f, std::vector<std::string> allowed = {}) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected one of {", absl::StrJoin(allowed, ", "), "}, got '", v, "'"));
    }
    o->*f = v;
    return absl::OkStatus();
  };
}
Setter Bool(bool JobOptions::*f) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    if (v == "1" || v == "true" || v == "on" || v.empty()) o->*f = true;
    else if (v == "0" || v == "false" || v == "off") o->*f = false;
    else return absl::InvalidArgumentError(absl::StrCat("expected true/false, got '", v, "'"));
    return absl::OkStatus();
  };
}
Setter Dist(LengthDist JobOptions::*f) {
  return [=](const std::string& v, JobOptions* o) -> absl::Status {
    SYMTP_ASSIGN_OR_RETURN(o->*f, ParseLengthDist(v));
    return absl::OkStatus();
  };
}
template <typename T>
Getter Get(T JobOptions::*f) {
  return [=](const JobOptions& o) {
    if constexpr (std::is_same_v<T, std::string>) return o.*f;
    else if constexpr (std::is_same_v<T, bool>) return std::string(o.*f ? "true" : "false");
    else if constexpr (std::is_same_v<T, LengthDist>) return (o.*f).ToString();
    else if constexpr (std::is_floating_point_v<T>) return absl::StrFormat("%.17g", double{o.*f});
    else return absl::StrCat(o.*f);
  };
}

const std::map<std::string, Flag>& Flags() {
  static const auto* flags = new std::map<std::string, Flag>{
      {"tp", {Int(&JobOptions::tp, 1, 8), Get(&JobOptions::tp), "tensor-parallel degree: 1, 2, 4 or 8"}},
      {"backend", {Str(&JobOptions::backend, {"auto", "cpu", "cuda"}), Get(&JobOptions::backend), "auto | cpu | cuda (auto: cuda when GPUs are visible)"}},
      {"mode", {Str(&JobOptions::mode, {"v1", "v0"}), Get(&JobOptions::mode), "v1 (scheduler process, diffs) | v0 (rank 0 schedules inline, broadcasts)"}},
      {"model", {Str(&JobOptions::model), Get(&JobOptions::model), "preset: tiny | small | llama-8b-shape | llama-70b-shape"}},
      {"model-overrides", {Str(&JobOptions::model_overrides), Get(&JobOptions::model_overrides), "e.g. layers=4,seed=7"}},
      {"dtype", {Str(&JobOptions::dtype, {"bf16", "fp32"}), Get(&JobOptions::dtype), "cuda backend activations: bf16 | fp32"}},
      {"num-requests", {Int(&JobOptions::num_requests, 1, 10'000'000), Get(&JobOptions::num_requests), "requests in the workload"}},
      {"prompt-len", {Dist(&JobOptions::prompt_len), Get(&JobOptions::prompt_len), "N | uniform:A:B | normal:M:S | lognormal:MU:SIGMA"}},
      {"output-len", {Dist(&JobOptions::output_len), Get(&JobOptions::output_len), "same forms as --prompt-len"}},
      {"arrival-rate", {Real(&JobOptions::arrival_rate, 0, 1e9), Get(&JobOptions::arrival_rate), "Poisson arrivals per second (0: closed loop)"}},
      {"concurrency", {Int(&JobOptions::concurrency, 0, 1'000'000), Get(&JobOptions::concurrency), "closed loop: requests in flight (0: max-batch)"}},
      {"steady-batch", {Int(&JobOptions::steady_batch, 0, 65536), Get(&JobOptions::steady_batch), "steady decode: hold exactly B running sequences"}},
      {"steady-context", {Int(&JobOptions::steady_context, 1, 1 << 20), Get(&JobOptions::steady_context), "steady decode: context length"}},
      {"steady-steps", {Int(&JobOptions::steady_steps, 1, 1 << 24), Get(&JobOptions::steady_steps), "steady decode: measured steps"}},
      {"warmup-steps", {Int(&JobOptions::warmup_steps, 0, 1 << 20), Get(&JobOptions::warmup_steps), "steps excluded from statistics"}},
      {"seed", {U64(&JobOptions::seed), Get(&JobOptions::seed), "workload and sampling seed"}},
      {"temperature", {Real(&JobOptions::temperature, 0, 100), Get(&JobOptions::temperature), "0: greedy"}},
      {"top-k", {Int(&JobOptions::top_k, 0, 1 << 24), Get(&JobOptions::top_k), "0: off"}},
      {"top-p", {Real(&JobOptions::top_p, 1e-6, 1), Get(&JobOptions::top_p), "1: off"}},
      {"eos-id", {Int(&JobOptions::eos_id, -1, 1 << 30), Get(&JobOptions::eos_id), "-1: no end-of-sequence stop"}},
      {"max-batch", {Int(&JobOptions::max_batch, 1, 65536), Get(&JobOptions::max_batch), "max running sequences"}},
      {"max-batched-tokens", {Int(&JobOptions::max_batched_tokens, 1, 1 << 24), Get(&JobOptions::max_batched_tokens), "max tokens per step"}},
      {"prefill-chunk", {Int(&JobOptions::prefill_chunk, 1, 1 << 24), Get(&JobOptions::prefill_chunk), "chunked prefill size"}},
      {"num-kv-blocks", {Int(&JobOptions::num_kv_blocks, 0, 1 << 28), Get(&JobOptions::num_kv_blocks), "KV blocks (0: derived from the workload, or from the next two flags)"}},
      {"kv-cache-mib", {Real(&JobOptions::kv_cache_mib, 0, 1 << 24), Get(&JobOptions::kv_cache_mib), "KV cache per rank in MiB; the scheduler uses the smallest block count the workers report"}},
      {"kv-cache-fraction", {Real(&JobOptions::kv_cache_fraction, 0, 0.95), Get(&JobOptions::kv_cache_fraction), "cuda: KV cache = this fraction of the GPU memory free after the weights (per rank, smallest wins)"}},
      {"max-inflight", {Int(&JobOptions::max_inflight, 1, 16), Get(&JobOptions::max_inflight), "v1 async depth: steps published ahead"}},
      {"buckets", {Int(&JobOptions::buckets, 1, 64), Get(&JobOptions::buckets), "all-reduce buckets per row-parallel layer (1: no overlap)"}},
      {"gemm-sm-margin", {Int(&JobOptions::gemm_sm_margin, 0, 128), Get(&JobOptions::gemm_sm_margin), "with --buckets > 1: SMs the GEMMs beside an all-reduce leave free for it (0: none)"}},
      {"comm-priority", {Str(&JobOptions::comm_priority, {"normal", "high"}), Get(&JobOptions::comm_priority), "with --buckets > 1: stream priority of the all-reduce side stream (high: scheduled before GEMM blocks)"}},
      {"cuda-graphs", {Bool(&JobOptions::cuda_graphs), Get(&JobOptions::cuda_graphs), "capture decode steps as CUDA graphs"}},
      {"pipeline", {Bool(&JobOptions::pipeline), Get(&JobOptions::pipeline), "v1 workers launch step t+1 while step t runs (false: one step at a time)"}},
      {"attention", {Str(&JobOptions::attention, {"tiled", "tensor-core"}), Get(&JobOptions::attention), "cuda bf16 attention kernels: tiled | tensor-core (decode and prefill)"}},
      {"allreduce", {Str(&JobOptions::allreduce, {"auto", "nccl", "custom"}), Get(&JobOptions::allreduce), "auto | nccl | custom"}},
      {"custom-allreduce-max-bytes", {I64(&JobOptions::custom_allreduce_max_bytes, 64 << 10, int64_t{256} << 20), Get(&JobOptions::custom_allreduce_max_bytes), "capacity of the custom one-shot all-reduce (scratch ~2x per rank); larger messages, and those above the calibrated crossover, go to NCCL"}},
      {"crossover-bytes", {I64(&JobOptions::crossover_bytes, 0, int64_t{1} << 40), Get(&JobOptions::crossover_bytes), "custom all-reduce below this size"}},
      {"fuse-allreduce-norm", {Bool(&JobOptions::fuse_allreduce_norm), Get(&JobOptions::fuse_allreduce_norm), "run each row-parallel all-reduce with the residual add and RMSNorm after it as one kernel where the custom all-reduce takes the message (false: two kernels)"}},
      {"bench-skip-allreduce", {Bool(&JobOptions::bench_skip_allreduce), Get(&JobOptions::bench_skip_allreduce), "benchmark only: skip the row-parallel all-reduces (wrong tokens at TP>1)"}},
      {"step-timeout-ms", {I64(&JobOptions::step_timeout_ms, 1, int64_t{1} << 40), Get(&JobOptions::step_timeout_ms), "deadline of any wait inside a step"}},
      {"hang-timeout-ms", {I64(&JobOptions::hang_timeout_ms, 50, int64_t{1} << 40), Get(&JobOptions::hang_timeout_ms), "heartbeat staleness that ends the job"}},
      {"out", {Str(&JobOptions::out_dir), Get(&JobOptions::out_dir), "output directory (summary.json, tokens.jsonl)"}},
      {"trace", {Str(&JobOptions::trace_file), Get(&JobOptions::trace_file), "write a Chrome/Perfetto trace here"}},
      {"progress", {Bool(&JobOptions::progress), Get(&JobOptions::progress), "live progress line on a terminal"}},
      {"resolved-backend", {Str(&JobOptions::resolved_backend, {"", "cpu", "cuda"}), Get(&JobOptions::resolved_backend), "(internal)"}},
  };
  return *flags;
}

}  // namespace

std::string Usage() {
  std::string s = "flags (--name=value):\n";
  const JobOptions defaults;
  for (const auto& [name, f] : Flags()) {
    if (name == "resolved-backend") continue;
    const std::string d = f.get(defaults);
    absl::StrAppend(&s, absl::StrFormat("  --%-20s %s (default: %s)\n", name, f.help, d.empty() ? "\"\"" : d));
  }
  return s;
}

absl::Status ParseArgs(const std::vector<std::string>& args, JobOptions* opts, ProcArgs* proc) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return absl::NotFoundError(Usage());
    if (a.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto take_value = [&]() -> absl::Status {
      if (has_value) return absl::OkStatus();
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
      return absl::OkStatus();
    };
    if (name == "job" || name == "rank" || name == "device") {
      SYMTP_RETURN_IF_ERROR(take_value());
      if (name == "job") {
        proc->job = value;
      } else {
        absl::StatusOr<int64_t> x = ParseInteger(value, 0, 63);
        if (!x.ok()) return Annotate(x.status(), absl::StrCat("--", name));
        (name == "rank" ? proc->rank : proc->device) = static_cast<int>(*x);
      }
      continue;
    }
    auto it = Flags().find(name);
    if (it == Flags().end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    bool is_bool = name == "cuda-graphs" || name == "pipeline" || name == "progress" || name == "fuse-allreduce-norm" || name == "bench-skip-allreduce";
    if (!has_value && !(is_bool && (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0))) {
      SYMTP_RETURN_IF_ERROR(take_value());
    }
    SYMTP_RETURN_IF_ERROR_CTX(it->second.set(value, opts), absl::StrCat("--", name));
  }
  return ValidateJobOptions(*opts);
}

std::vector<std::string> ToArgs(const JobOptions& o) {
  std::vector<std::string> out;
  for (const auto& [name, f] : Flags()) out.push_back(absl::StrCat("--", name, "=", f.get(o)));
  return out;
}

absl::Status ValidateJobOptions(const JobOptions& o) {
  if (o.tp != 1 && o.tp != 2 && o.tp != 4 && o.tp != 8) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be 1, 2, 4 or 8, got ", o.tp));
  }
  if (o.steady_batch > 0 && o.steady_batch > o.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("--steady-batch ", o.steady_batch,
                                                   " exceeds --max-batch ", o.max_batch));
  }
  if (o.prefill_chunk > o.max_batched_tokens) {
    return absl::InvalidArgumentError("--prefill-chunk exceeds --max-batched-tokens");
  }
  if ((o.num_kv_blocks > 0) + (o.kv_cache_mib > 0) + (o.kv_cache_fraction > 0) > 1) {
    return absl::InvalidArgumentError(
        "--num-kv-blocks, --kv-cache-mib and --kv-cache-fraction size the same KV cache: give "
        "at most one");
  }
  if (o.kv_cache_fraction > 0 && o.resolved_backend == "cpu") {
    return absl::InvalidArgumentError(
        "--kv-cache-fraction sizes a GPU's KV cache; with the cpu backend use --kv-cache-mib");
  }
  return absl::OkStatus();
}

}  // namespace symtp::runtime
