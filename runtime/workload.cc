#include "runtime/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

namespace symtp::runtime {
namespace {

int Draw(const LengthDist& d, std::mt19937_64& rng, int cap) {
  double v = d.a;
  if (d.kind == LengthKind::kUniform) {
    v = std::uniform_int_distribution<int64_t>(static_cast<int64_t>(d.a), static_cast<int64_t>(d.b))(rng);
  } else if (d.kind == LengthKind::kNormal) {
    v = std::normal_distribution<double>(d.a, d.b)(rng);
  } else if (d.kind == LengthKind::kLognormal) {
    v = std::exp(std::normal_distribution<double>(d.a, d.b)(rng));
  }
  return static_cast<int>(std::clamp<double>(std::llround(v), 1, cap));
}

}  // namespace

int64_t SteadyPrefillSteps(int n, int plen, int max_batched_tokens) {
  // The scheduler fills a step's token budget with decodes first (one token
  // each) and gives the rest to prompt chunks, so every prompt that has been
  // prefilled takes one token from each later step's prefill share: at batch
  // 512 of 1024-token prompts and a 2048-token budget the last prompt is done
  // after 295 steps, not 256.
  const int64_t total = static_cast<int64_t>(n) * plen;
  int64_t steps = 0, done = 0;
  while (done < total) {
    const int64_t share = max_batched_tokens - done / plen;
    // Decodes alone fill the budget (batch >= budget): the rest of the batch
    // is prefilled only as sequences end, so the batch is never whole.
    if (share <= 0) break;
    done += std::min(share, total - done);
    ++steps;
  }
  return steps + (total - done + max_batched_tokens - 1) / max_batched_tokens;
}

WorkloadStream::WorkloadStream(const JobOptions& opts, const model::ModelConfig& cfg)
    : opts_(opts),
      cfg_(cfg),
      rng_(opts.seed * 0x9E3779B97F4A7C15ull + 17),
      gap_(opts.arrival_rate > 0 ? opts.arrival_rate : 1.0),
      n_(opts.steady_batch > 0 ? opts.steady_batch : opts.num_requests) {
  if (opts.steady_batch > 0) {
    // Enough decode steps that, after the chunked prefill of the whole
    // batch, warmup + steady_steps steps run with all B sequences decoding.
    steady_plen_ = std::min(opts.steady_context, cfg.max_seq_len - 1);
    const int64_t olen = opts.warmup_steps + opts.steady_steps +
                         SteadyPrefillSteps(n_, steady_plen_, opts.max_batched_tokens) + 2;
    steady_olen_ = static_cast<int>(std::min<int64_t>(olen, INT32_MAX));
  }
}

const WorkloadRequest& WorkloadStream::Peek() {
  if (!pending_) Generate();
  return *pending_;
}

WorkloadRequest WorkloadStream::Take() {
  if (!pending_) Generate();
  WorkloadRequest r = std::move(*pending_);
  pending_.reset();
  ++next_;
  return r;
}

void WorkloadStream::Generate() {
  const JobOptions& opts = opts_;
  const model::ModelConfig& cfg = cfg_;
  const bool steady = opts.steady_batch > 0;
  WorkloadRequest& r = pending_.emplace();
  r.id = static_cast<uint64_t>(next_);
  int plen, olen;
  if (steady) {
    plen = steady_plen_;
    olen = steady_olen_;
  } else {
    plen = Draw(opts.prompt_len, rng_, cfg.max_seq_len - 1);
    olen = Draw(opts.output_len, rng_, cfg.max_seq_len);
  }
  olen = std::max(1, std::min(olen, cfg.max_seq_len - plen));
  r.max_new_tokens = olen;
  r.prompt.resize(plen);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
  for (int32_t& x : r.prompt) {
    x = tok(rng_);
    if (x == opts.eos_id) x = (x + 1) % cfg.vocab;
  }
  r.sampling.temperature = opts.temperature;
  r.sampling.top_k = opts.top_k;
  r.sampling.top_p = opts.top_p;
  r.sampling.seed = opts.seed * 1000003ull + r.id;
  if (!steady && opts.arrival_rate > 0) {
    t_ += gap_(rng_);
    r.arrival_offset_ns = static_cast<int64_t>(t_ * 1e9);
  }
}

std::vector<WorkloadRequest> GenerateWorkload(const JobOptions& opts, const model::ModelConfig& cfg) {
  WorkloadStream stream(opts, cfg);
  std::vector<WorkloadRequest> out;
  out.reserve(stream.size());
  while (!stream.done()) out.push_back(stream.Take());
  return out;
}

}  // namespace symtp::runtime
