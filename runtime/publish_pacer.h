// When v1's scheduler plans its next step, at low load.
//
// With two steps in flight (--max-inflight 2), the scheduler plans step t+2
// as soon as step t's results are in, while the GPU starts step t+1. A
// request that arrives during step t+1 then waits for step t+3: one whole
// step more than with one step in flight, where it would join t+2. The pacer
// keeps both: when the only step ahead is a decode step, nothing is waiting
// for admission and more requests are due, the scheduler plans the next step
// only `lead` before that step is expected to end (its start, which is when
// the step before it returned, plus the last decode step's forward time), so
// that an arrival before then joins it, and the workers still have `lead` to
// receive it and enqueue it behind the running step.
#pragma once

#include <cstdint>

namespace symtp::runtime {

class PublishPacer {
 public:
  // enabled = false: PlanAt is always 0 (plan at once).
  PublishPacer(bool enabled, int64_t lead_ns) : enabled_(enabled), lead_ns_(lead_ns) {}

  // A step's results are in: at done_ns, after forward_ns of forward time
  // (the slowest rank's), decode-only or not, over num_seqs sequences.
  void OnCollected(int64_t done_ns, int64_t forward_ns, bool decode_only, int32_t num_seqs);

  // What the next step would be planned behind.
  struct Ahead {
    int steps = 0;             // steps published whose results are not in
    bool decode_only = false;  // the newest of them
    int32_t num_seqs = 0;      // its sequences
  };

  // When to plan the next step (MonotonicNs time); 0: now. `may_admit`: no
  // request is waiting for admission and more are due to arrive.
  int64_t PlanAt(const Ahead& ahead, bool may_admit) const;

 private:
  bool enabled_;
  int64_t lead_ns_;
  int64_t last_done_ns_ = 0;         // the newest collected step's results in
  int64_t decode_forward_ns_ = 0;    // the newest collected decode-only step's forward
  int32_t decode_seqs_ = 0;          // and its sequences
};

}  // namespace symtp::runtime
