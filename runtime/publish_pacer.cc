#include "runtime/publish_pacer.h"

namespace symtp::runtime {

void PublishPacer::OnCollected(int64_t done_ns, int64_t forward_ns, bool decode_only,
                               int32_t num_seqs) {
  last_done_ns_ = done_ns;
  if (decode_only && forward_ns > 0) {
    decode_forward_ns_ = forward_ns;
    decode_seqs_ = num_seqs;
  }
}

int64_t PublishPacer::PlanAt(const Ahead& ahead, bool may_admit) const {
  // Only one step ahead, a decode step, and a decode step timed: otherwise
  // the GPU is idle or has more queued than the estimate covers, or the
  // step ahead's time is unknown (a prefill's grows with its tokens).
  if (!enabled_ || !may_admit || ahead.steps != 1 || !ahead.decode_only ||
      decode_forward_ns_ <= 0 || last_done_ns_ <= 0) {
    return 0;
  }
  // A decode step's time falls with its batch; fewer sequences than the
  // timed step may end sooner than the estimate, so plan at once then.
  if (ahead.num_seqs < decode_seqs_) return 0;
  const int64_t at = last_done_ns_ + decode_forward_ns_ - lead_ns_;
  return at > last_done_ns_ ? at : 0;
}

}  // namespace symtp::runtime
