#include "runtime/options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <type_traits>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
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

// The choice named `text` in Names(E).
template <typename E>
bool ParseName(absl::string_view text, E* v) {
  for (const auto& [e, name] : Names(E{})) {
    if (text == name) return (*v = e, true);
  }
  return false;
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
    SYMTP_RETURN_IF_ERROR(num(parts[0], true, 1, kMax, &d.a));
    return d;
  }
  if (parts.size() != 3 || !ParseName(parts[0], &d.kind) || d.kind == LengthKind::kFixed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "length '", spec, "': expected N, uniform:MIN:MAX, normal:MEAN:STD or lognormal:MU:SIGMA"));
  }
  if (d.kind == LengthKind::kUniform) {
    SYMTP_RETURN_IF_ERROR(num(parts[1], true, 1, kMax, &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], true, 1, kMax, &d.b));
    if (d.b < d.a) {
      return absl::InvalidArgumentError(absl::StrCat("uniform length needs MIN <= MAX: ", spec));
    }
  } else if (d.kind == LengthKind::kNormal) {
    SYMTP_RETURN_IF_ERROR(num(parts[1], false, 1, kMax, &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], false, 0, kMax, &d.b));
  } else {
    SYMTP_RETURN_IF_ERROR(num(parts[1], false, 0, std::log(kMax), &d.a));
    SYMTP_RETURN_IF_ERROR(num(parts[2], false, 0, 4, &d.b));
  }
  return d;
}

// ---------------------------------------------------------------- flags
//
// Every JobOptions field is an ABSL_FLAG whose default is the field's default
// and whose type parses strictly (AbslParseFlag below) and prints exactly
// (AbslUnparseFlag: the children re-parse the launcher's values bit for bit).
// SYMTP_FLAG binds a flag to its field under the topic --help groups it in.

template <typename T, auto Lo, auto Hi>
struct Num {  // an integer or real in [Lo, Hi] (uint64_t: any)
  T v;
};
template <typename T, auto Lo, auto Hi>
bool AbslParseFlag(absl::string_view text, Num<T, Lo, Hi>* n, std::string* err) {
  absl::Status s;
  if constexpr (std::is_floating_point_v<T>) {
    absl::StatusOr<double> x = ParseReal(text, Lo, Hi);
    if (x.ok()) n->v = static_cast<T>(*x);
    s = x.status();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    absl::StatusOr<uint64_t> x = ParseUnsigned(text);
    if (x.ok()) n->v = *x;
    s = x.status();
  } else {
    absl::StatusOr<int64_t> x = ParseInteger(text, Lo, Hi);
    if (x.ok()) n->v = static_cast<T>(*x);
    s = x.status();
  }
  *err = std::string(s.message());
  return s.ok();
}
template <typename T, auto Lo, auto Hi>
std::string AbslUnparseFlag(Num<T, Lo, Hi> n) {
  if constexpr (std::is_floating_point_v<T>) return absl::StrFormat("%.17g", double{n.v});
  else return absl::StrCat(n.v);
}

struct Switch {  // true | on | 1 | false | off | 0; the flag alone means true
  bool v;
};
bool AbslParseFlag(absl::string_view text, Switch* s, std::string* err) {
  if (text == "1" || text == "true" || text == "on" || text.empty()) s->v = true;
  else if (text == "0" || text == "false" || text == "off") s->v = false;
  else *err = absl::StrCat("expected true/false, got '", text, "'");
  return err->empty();
}
std::string AbslUnparseFlag(Switch s) { return s.v ? "true" : "false"; }

template <typename E>
struct Choice {  // one of Names(E)
  E v;
};
template <typename E>
bool AbslParseFlag(absl::string_view text, Choice<E>* c, std::string* err) {
  if (ParseName(text, &c->v)) return true;
  auto name = [](std::string* out, const auto& choice) { out->append(choice.second); };
  *err = absl::StrCat("expected one of {", absl::StrJoin(Names(E{}), ", ", name), "}, got '", text, "'");
  return false;
}
template <typename E>
std::string AbslUnparseFlag(Choice<E> c) { return Name(c.v); }

}  // namespace

double LengthDist::Max() const {
  if (kind == LengthKind::kUniform) return b;
  if (kind == LengthKind::kLognormal) return std::exp(a);  // the median
  return a;  // fixed; normal: the median
}

int LengthDist::Longest(int cap) const {
  if (kind == LengthKind::kFixed) return std::min(cap, static_cast<int>(a));
  if (kind == LengthKind::kUniform) return std::min(cap, static_cast<int>(b));
  return cap;
}

// For absl's flag marshalling (found by argument-dependent lookup).
std::string AbslUnparseFlag(const LengthDist& d) {
  if (d.kind == LengthKind::kFixed) return absl::StrCat(static_cast<int64_t>(d.a));
  return absl::StrFormat("%s:%.17g:%.17g", Name(d.kind), d.a, d.b);  // exact round trip to the children
}
bool AbslParseFlag(absl::string_view text, LengthDist* d, std::string* err) {
  absl::StatusOr<LengthDist> x = ParseLengthDist(std::string(text));
  if (x.ok()) *d = *x;
  else *err = std::string(x.status().message());
  return x.ok();
}

namespace {

// One flag's binding to its JobOptions field.
struct Binding {
  std::string topic, name, help;  // name as typed: --model-overrides
  bool is_switch;
  std::function<bool(absl::string_view, std::string*)> parse;  // into the flag
  std::function<void(JobOptions*)> read;                       // the flag into the field
  std::function<std::string(const JobOptions&)> text;          // the field as flag text
};
std::vector<Binding>& Bindings() {
  static auto* b = new std::vector<Binding>;
  return *b;
}
std::string& Topic() {
  static auto* t = new std::string;
  return *t;
}
int SetTopic(const char* t) { return (Topic() = t, 0); }

template <typename F, typename T>
int Bind(absl::Flag<F>& flag, T JobOptions::*field, const char* name) {
  auto value = [](const F& f) -> T {
    if constexpr (requires { f.v; }) return f.v;
    else return f;
  };
  Bindings().push_back(Binding{
      Topic(), absl::StrReplaceAll(name, {{"_", "-"}}), absl::GetFlagReflectionHandle(flag).Help(),
      std::is_same_v<F, Switch>,
      [&flag](absl::string_view v, std::string* err) {
        F x{};
        if (!absl::ParseFlag(v, &x, err)) return false;
        absl::SetFlag(&flag, x);
        return true;
      },
      [&flag, field, value](JobOptions* o) { o->*field = value(absl::GetFlag(flag)); },
      [field](const JobOptions& o) { return absl::UnparseFlag(F{o.*field}); }});
  return 0;
}

#define SYMTP_TOPIC(name, title) const int symtp_topic_##name = SetTopic(title)
#define SYMTP_FLAG(name, field, help, ...)                                            \
  using symtp_##name##_type = __VA_ARGS__;                                             \
  ABSL_FLAG(symtp_##name##_type, name, symtp_##name##_type{JobOptions{}.field}, help); \
  const int symtp_bound_##name = Bind(FLAGS_##name, &JobOptions::field, #name)

template <int L, int H> using Int = Num<int, L, H>;
template <int64_t L, int64_t H> using I64 = Num<int64_t, L, H>;
template <double L, double H> using Real = Num<double, L, H>;

}  // namespace
}  // namespace symtp::runtime

// In the global namespace, as ABSL_FLAG asks; in the order --help lists them.
using namespace symtp::runtime;  // NOLINT(build/namespaces): the flag table only
SYMTP_TOPIC(job, "Job and model");
SYMTP_FLAG(tp, tp, "tensor-parallel degree: 1, 2, 4 or 8", Int<1, 8>);
SYMTP_FLAG(backend, backend, "auto | cpu | cuda (auto: cuda when GPUs are visible)", Choice<BackendKind>);
SYMTP_FLAG(mode, mode, "v1 (scheduler process, diffs) | v0 (rank 0 schedules inline, broadcasts)", Choice<Mode>);
SYMTP_FLAG(model, model, "preset: tiny | small | llama-8b-shape | llama-70b-shape", std::string);
SYMTP_FLAG(model_overrides, model_overrides, "e.g. layers=4,seed=7", std::string);
SYMTP_FLAG(dtype, dtype, "cuda backend activations: bf16 | fp32", Choice<symtp::DType>);
SYMTP_TOPIC(workload, "Workload");
SYMTP_FLAG(num_requests, num_requests, "requests in the workload", Int<1, 10'000'000>);
SYMTP_FLAG(prompt_len, prompt_len, "N | uniform:A:B | normal:M:S | lognormal:MU:SIGMA", LengthDist);
SYMTP_FLAG(output_len, output_len, "same forms as --prompt-len", LengthDist);
SYMTP_FLAG(arrival_rate, arrival_rate, "Poisson arrivals per second (0: closed loop)", Real<0., 1e9>);
SYMTP_FLAG(concurrency, concurrency, "closed loop: requests in flight (0: max-batch)", Int<0, 1'000'000>);
SYMTP_FLAG(steady_batch, steady_batch, "steady decode: hold exactly B running sequences", Int<0, 65536>);
SYMTP_FLAG(steady_context, steady_context, "steady decode: context length", Int<1, (1 << 20)>);
SYMTP_FLAG(steady_steps, steady_steps, "steady decode: measured steps", Int<1, (1 << 24)>);
SYMTP_FLAG(warmup_steps, warmup_steps, "steps excluded from statistics", Int<0, (1 << 20)>);
SYMTP_TOPIC(sampling, "Sampling");
SYMTP_FLAG(seed, seed, "workload and sampling seed", Num<uint64_t, 0, 0>);
SYMTP_FLAG(temperature, temperature, "0: greedy", Num<float, 0., 100.>);
SYMTP_FLAG(top_k, top_k, "0: off", Int<0, (1 << 24)>);
SYMTP_FLAG(top_p, top_p, "1: off", Num<float, 1e-6, 1.>);
SYMTP_FLAG(eos_id, eos_id, "-1: no end-of-sequence stop", Int<-1, (1 << 30)>);
SYMTP_TOPIC(scheduling, "Scheduling and KV cache");
SYMTP_FLAG(max_batch, max_batch, "max running sequences (not given: at least --steady-batch)", Int<1, 65536>);
SYMTP_FLAG(max_batched_tokens, max_batched_tokens, "max tokens per step (not given: at least --steady-batch)", Int<1, (1 << 24)>);
SYMTP_FLAG(prefill_chunk, prefill_chunk, "chunked prefill size (not given: at most --max-batched-tokens)", Int<1, (1 << 24)>);
SYMTP_FLAG(num_kv_blocks, num_kv_blocks, "KV blocks (0: derived from the workload, or from the next two flags)", Int<0, (1 << 28)>);
SYMTP_FLAG(kv_cache_mib, kv_cache_mib, "KV cache per rank in MiB; the scheduler uses the smallest block count the workers report", Real<0., double{1 << 24}>);
SYMTP_FLAG(kv_cache_fraction, kv_cache_fraction, "cuda: KV cache = this fraction of the GPU memory free after the weights (per rank, smallest wins)", Real<0., 0.95>);
SYMTP_FLAG(max_inflight, max_inflight, "v1 async depth: steps published ahead", Int<1, 16>);
SYMTP_FLAG(late_publish, late_publish, "v1, arrivals by rate: when a decode step is the only one ahead and nothing waits for admission, plan the next step only --publish-lead-us before that step should end (the last decode step's forward time after it started), so requests that arrive meanwhile join it (false: plan as soon as there is room)", Switch);
SYMTP_FLAG(publish_lead_us, publish_lead_us, "v1 late publishing: how long before the step ahead should end the next step is planned", Int<0, 1000000>);
SYMTP_FLAG(pipeline, pipeline, "v1 workers launch step t+1 while step t runs (false: one step at a time)", Switch);
SYMTP_TOPIC(gpu, "GPU execution");
SYMTP_FLAG(cuda_graphs, cuda_graphs, "capture decode steps as CUDA graphs, one per batch size of 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512 and --max-batch (below 512); a step pads to the next of them, larger ones run eagerly; the worker's last log line counts replayed and eager steps", Switch);
SYMTP_FLAG(gpu_warmup, gpu_warmup, "cuda: before a worker is ready, run a full prefill, a decode step at each graph batch size and the layer GEMMs over a ladder of row counts once, so cuBLASLt's first-call costs (its first heuristic queries, a kernel's first launch) fall in start-up, not in the first requests", Switch);
SYMTP_FLAG(attention, attention, "cuda bf16 attention kernels: tiled | tensor-core (decode and prefill)", Choice<Attention>);
SYMTP_FLAG(gemv_max_rows, gemv_max_rows, "cuda bf16: GEMMs of at most this many rows run the project's weight-streaming GEMV instead of cuBLASLt (0: cuBLASLt always)", Int<0, 4>);
SYMTP_FLAG(defer_norm, defer_norm, "cuda bf16, TP 1: fold each RMSNorm's weight into the GEMM after it, and in steps of at most 128 rows leave the norm to that GEMM where it is the GEMV, else to the kernel after it (RoPE, SiLU), the residual adds to the O and down GEMMs' epilogues: two kernels fewer per layer (false: AddRmsNorm kernels)", Switch);
SYMTP_TOPIC(allreduce, "All-reduce");
SYMTP_FLAG(allreduce, allreduce, "auto | nccl | custom", Choice<AllReduce>);
SYMTP_FLAG(custom_allreduce_max_bytes, custom_allreduce_max_bytes, "capacity of the custom all-reduce (scratch ~2 x (TP-1) x this per rank, and ~4.3 x this more for LL128 at TP 2); larger messages, and those above the calibrated crossover, go to NCCL; -1: 16 MiB at TP 4 (prefill's 16 MiB messages and exchange chunks are faster on the custom two-shot there), 8 MiB otherwise", I64<-1, (int64_t{256} << 20)>);
SYMTP_FLAG(custom_allreduce_ll_max_bytes, custom_allreduce_ll_max_bytes, "custom all-reduce: largest message sent with the LL protocol, plain and fused with RMSNorm (larger ones go to LL128, or are staged or two-shot; LL lines take ~4 x TP x this of scratch per rank); 0: the default (with LL128, at TP 2: 64 KiB, fused 16 KiB; without: 256 KiB at TP 2, 256 KiB / TP above, fused at most 128 KiB)", I64<0, (int64_t{64} << 20)>);
SYMTP_FLAG(custom_allreduce_ll128_max_bytes, custom_allreduce_ll128_max_bytes, "custom all-reduce: largest message sent with the LL128 protocol (above the LL limit, plain and fused with RMSNorm; larger ones are staged or two-shot; its lines take ~2.1 x TP x this of scratch per rank); 0: never; -1: the default (the custom path's capacity at TP 2, off at TP 4 and 8)", I64<-1, (int64_t{64} << 20)>);
SYMTP_FLAG(custom_allreduce_two_shot_min_bytes, custom_allreduce_two_shot_min_bytes, "custom all-reduce: messages above the LL and LL128 limits go two-shot (reduce-scatter + all-gather) instead of staged from this size on, plain and fused with RMSNorm (then run as the all-reduce and the norm); 0: never; -1: the default (1 MiB at TP 4 and 8, never at TP 2)", I64<-1, (int64_t{256} << 20)>);
SYMTP_FLAG(sharded_sampling, sharded_sampling, "TP > 1, v1: steps whose rows are greedy or top-k (k <= 2048) gather each rank's top candidates instead of its logits (false: gather the logits; v0, where rank 0 samples alone, always does)", Switch);
SYMTP_FLAG(gemv_allreduce_push, gemv_allreduce_push, "cuda bf16, TP > 1: a row-parallel GEMV before a fused custom all-reduce + RMSNorm sends its output to every rank itself, so the fused kernel only receives (false: the fused kernel sends)", Switch);
SYMTP_FLAG(gemv_swiglu, gemv_swiglu, "cuda bf16: where the MLP's gate/up GEMM runs the GEMV, it applies SwiGLU's activation as it writes (no SiLU kernel; false: the GEMV then the SiLU kernel)", Switch);
SYMTP_FLAG(fuse_allreduce_norm, fuse_allreduce_norm, "run each row-parallel all-reduce with the residual add and RMSNorm after it as one kernel where the custom all-reduce takes the message (false: two kernels)", Switch);
SYMTP_FLAG(crossover_bytes, crossover_bytes, "custom all-reduce below this size", I64<0, (int64_t{1} << 40)>);
SYMTP_FLAG(exchange_min_rows, exchange_min_rows, "cuda, TP > 1: steps of at least this many rows (prefill) run each row-parallel output in two row chunks, the first chunk's all-reduce beside the second chunk's GEMM (0: off; -1: 2048 at TP 2, 4096 at TP 4, off at TP 8, where it was not measured)", Int<-1, (1 << 20)>);
SYMTP_FLAG(exchange_transport, exchange_transport, "how the exchange's chunks are all-reduced: copy (the copy engines send each chunk to every peer, summed by the residual + RMSNorm kernel; needs the custom all-reduce) | allreduce (the all-reduce kernels, custom or NCCL as for any message, on a high-priority side stream) | auto (copy at TP 2, allreduce above, where the copies' bytes grow with TP - 1)", Choice<ExchangeTransport>);
SYMTP_FLAG(bench_skip_allreduce, bench_skip_allreduce, "benchmark only: skip the row-parallel all-reduces (wrong tokens at TP>1)", Switch);
SYMTP_TOPIC(timeouts, "Timeouts");
SYMTP_FLAG(step_timeout_ms, step_timeout_ms, "deadline of any wait inside a step", I64<1, (int64_t{1} << 40)>);
SYMTP_FLAG(hang_timeout_ms, hang_timeout_ms, "heartbeat staleness that ends the job", I64<50, (int64_t{1} << 40)>);
SYMTP_TOPIC(outputs, "Outputs");
SYMTP_FLAG(out, out_dir, "output directory (summary.json, tokens.jsonl)", std::string);
SYMTP_FLAG(trace, trace_file, "write a Chrome/Perfetto trace here", std::string);
SYMTP_FLAG(progress, progress, "live progress line on a terminal", Switch);
SYMTP_TOPIC(internal, "");  // set by the launcher for its children; not in --help
SYMTP_FLAG(resolved_backend, resolved_backend, "(internal)", Choice<BackendKind>);

namespace symtp::runtime {
namespace {

const Binding* FindFlag(absl::string_view name) {
  for (const Binding& b : Bindings()) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

}  // namespace

std::string Usage() {
  std::string s = "flags (--name=value):\n", topic;
  const JobOptions defaults;
  for (const Binding& b : Bindings()) {
    if (b.topic.empty()) continue;
    if (b.topic != topic) absl::StrAppend(&s, (topic = b.topic), ":\n");
    const std::string d = b.text(defaults);
    absl::StrAppend(&s, absl::StrFormat("  --%-20s %s (default: %s)\n", b.name, b.help, d.empty() ? "\"\"" : d));
  }
  return s;
}

absl::Status ParseArgs(const std::vector<std::string>& args, JobOptions* opts, ProcArgs* proc) {
  const JobOptions defaults;
  std::set<std::string> given;  // flags named on the command line
  for (const Binding& b : Bindings()) {  // each call starts from the defaults
    std::string err;
    b.parse(b.text(defaults), &err);
  }
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
    const Binding* b = FindFlag(name);
    if (b == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    if (!has_value && !(b->is_switch && (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0))) {
      SYMTP_RETURN_IF_ERROR(take_value());
    }
    std::string err;
    if (!b->parse(value, &err)) return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", err));
    given.insert(b->name);
  }
  for (const Binding& b : Bindings()) b.read(opts);
  // Defaults that follow another flag when not given themselves: the
  // running-sequence limit and a step's token budget hold a steady batch (one
  // decode token per sequence), a prompt chunk fits a step.
  if (!given.contains("max-batch")) opts->max_batch = std::max(opts->max_batch, opts->steady_batch);
  if (!given.contains("max-batched-tokens")) {
    opts->max_batched_tokens = std::max(opts->max_batched_tokens, opts->steady_batch);
  }
  if (!given.contains("prefill-chunk")) {
    opts->prefill_chunk = std::min(opts->prefill_chunk, opts->max_batched_tokens);
  }
  return ValidateJobOptions(*opts);
}

std::vector<std::string> ToArgs(const JobOptions& o) {
  std::vector<std::string> out;
  for (const Binding& b : Bindings()) out.push_back(absl::StrCat("--", b.name, "=", b.text(o)));
  std::sort(out.begin(), out.end());
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
  if (o.steady_batch > o.max_batched_tokens) {
    // The decodes alone would fill every step: the batch would never be whole.
    return absl::InvalidArgumentError(absl::StrCat("--steady-batch ", o.steady_batch,
                                                   " exceeds --max-batched-tokens ",
                                                   o.max_batched_tokens,
                                                   " (a step holds one token per sequence)"));
  }
  if (o.prefill_chunk > o.max_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--prefill-chunk ", o.prefill_chunk,
                                                   " exceeds --max-batched-tokens ",
                                                   o.max_batched_tokens));
  }
  if ((o.num_kv_blocks > 0) + (o.kv_cache_mib > 0) + (o.kv_cache_fraction > 0) > 1) {
    return absl::InvalidArgumentError(
        "--num-kv-blocks, --kv-cache-mib and --kv-cache-fraction size the same KV cache: give "
        "at most one");
  }
  if (o.custom_allreduce_max_bytes != -1 && o.custom_allreduce_max_bytes < (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--custom-allreduce-max-bytes must be at least 65536 (or -1: by TP), got ",
        o.custom_allreduce_max_bytes));
  }
  if (o.exchange_transport == ExchangeTransport::kCopy && o.allreduce == AllReduce::kNccl) {
    return absl::InvalidArgumentError(
        "--exchange-transport=copy sends into the custom all-reduce's buffers: not with "
        "--allreduce=nccl");
  }
  if (o.kv_cache_fraction > 0 && o.resolved_backend == BackendKind::kCpu) {
    return absl::InvalidArgumentError(
        "--kv-cache-fraction sizes a GPU's KV cache; with the cpu backend use --kv-cache-mib");
  }
  return absl::OkStatus();
}

}  // namespace symtp::runtime
