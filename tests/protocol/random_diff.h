// Random valid StepDiff / StepResult generators for the protocol tests.
#pragma once

#include <cstdint>
#include <random>

#include "protocol/diff.h"
#include "protocol/result.h"

namespace symtp::proto::testing {

inline StepDiff RandomDiff(std::mt19937_64& rng) {
  auto U = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  StepDiff d;
  d.step = U(0, 3) == 0 ? U(0, ~uint64_t{0}) : U(0, 100000);
  d.flags = U(0, 4) == 0 ? kDiffFlagEndOfJob : 0;
  uint64_t next_id = U(0, 3) == 0 ? U(0, ~uint64_t{0} >> 1) : U(0, 1000);
  auto new_id = [&]() { return next_id += U(1, U(0, 5) == 0 ? 1u << 30 : 3); };
  int32_t next_block = static_cast<int32_t>(U(0, 1 << 20));
  auto block = [&]() { return (next_block += static_cast<int32_t>(U(1, 50))) & 0x7fffffff; };
  const int n_new = static_cast<int>(U(0, 4));
  for (int i = 0; i < n_new; ++i) {
    NewRequest r;
    r.id = new_id();
    r.prompt.resize(U(1, 300));
    for (auto& t : r.prompt) t = static_cast<int32_t>(U(0, U(0, 1) ? 1000 : 0x7fffffff));
    r.num_scheduled = static_cast<uint32_t>(U(1, r.prompt.size()));
    r.max_new_tokens = static_cast<uint32_t>(U(1, 5000));
    if (U(0, 1)) r.eos_id = static_cast<int32_t>(U(0, 100000));
    r.sampling.temperature = U(0, 1) ? 0.f : static_cast<float>(U(1, 2000)) / 1000.f;
    r.sampling.top_k = static_cast<int32_t>(U(0, 100));
    r.sampling.top_p = static_cast<float>(U(1, 1000)) / 1000.f;
    r.sampling.seed = U(0, ~uint64_t{0});
    const uint64_t nb = (r.num_scheduled + 15) / 16 + U(0, 2);
    for (uint64_t k = 0; k < nb; ++k) r.block_ids.push_back(block());
    d.new_requests.push_back(std::move(r));
  }
  const int n_cont = static_cast<int>(U(0, 3) == 0 ? U(0, 600) : U(0, 40));
  std::vector<int32_t> blocks;
  for (int i = 0; i < n_cont; ++i) {
    blocks.clear();
    const uint64_t nb = U(0, 15) == 0 ? U(1, 12) : 0;
    for (uint64_t k = 0; k < nb; ++k) blocks.push_back(block());
    d.AddContinuing(new_id(), static_cast<uint32_t>(U(0, 3) ? 1 : U(1, 2048)), blocks);
  }
  for (auto* list : {&d.finished, &d.aborted, &d.preempted}) {
    const int n = static_cast<int>(U(0, 2) == 0 ? U(0, 20) : 0);
    for (int i = 0; i < n; ++i) list->push_back(new_id());
  }
  // Shuffle the id order inside lists: deltas go negative too.
  std::shuffle(d.continuing.begin(), d.continuing.end(), rng);
  // Re-pack the continuing block ranges in the shuffled order.
  std::vector<int32_t> pool;
  for (auto& c : d.continuing) {
    const uint32_t off = static_cast<uint32_t>(pool.size());
    for (uint32_t k = 0; k < c.num_new_blocks; ++k) {
      pool.push_back(d.continuing_blocks[c.block_offset + k]);
    }
    c.block_offset = off;
  }
  d.continuing_blocks = std::move(pool);
  std::shuffle(d.finished.begin(), d.finished.end(), rng);
  return d;
}

inline StepResult RandomResult(std::mt19937_64& rng) {
  auto U = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  StepResult r;
  r.step = U(0, 1000000);
  r.rank = static_cast<uint32_t>(U(0, 7));
  r.digest = U(0, ~uint64_t{0});
  r.timings = {U(0, 1000000),   U(0, 10000),  U(0, 100000),
               U(0, 100000000), U(0, 100000), U(0, 200000000), U(0, 100000)};
  // Absolute times: large values, sometimes the largest (10-byte varints).
  const uint64_t big = U(0, 3) == 0 ? ~uint64_t{0} : U(uint64_t{1} << 40, uint64_t{1} << 52);
  r.timings.recv_at_ns = big;
  r.timings.launch_at_ns = big - U(0, 1000);
  r.timings.collect_at_ns = U(0, ~uint64_t{0});
  r.timings.result_at_ns = big;
  r.graph = U(0, 1) == 1;
  const int n = static_cast<int>(U(0, 300));
  uint64_t id = U(0, 1000);
  for (int i = 0; i < n; ++i) {
    id += U(0, 1) ? U(1, 3) : -U(1, 3);
    r.sampled.push_back({id, static_cast<int32_t>(U(0, 128255))});
  }
  return r;
}

}  // namespace symtp::proto::testing
