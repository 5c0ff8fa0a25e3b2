#include "common/paired_ab.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/histogram.h"

namespace symtp {

const char* AbArmName(AbArm arm) { return arm == AbArm::kA ? "A" : "B"; }

PairedAb::PairedAb(const PairedAbOptions& o)
    : opt_(o), values_(4 * static_cast<size_t>(o.rounds)) {}

AbArm PairedAb::WindowArm(int w) { return (w % 4 == 0 || w % 4 == 3) ? AbArm::kA : AbArm::kB; }

absl::StatusOr<PairedAb> PairedAb::Create(const PairedAbOptions& o) {
  if (o.discard_steps < 0 || o.window_steps <= o.discard_steps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "A/B windows of %d steps time none after discarding %d", o.window_steps, o.discard_steps));
  }
  if (o.discard_rounds < 0 || o.rounds <= o.discard_rounds || o.setup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "A/B needs rounds > discarded rounds >= 0 and setup steps >= 0, got %d, %d and %d",
        o.rounds, o.discard_rounds, o.setup_steps));
  }
  if (!(o.margin >= 0 && o.margin < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("A/B margin must be in [0, 1), got ", o.margin));
  }
  return PairedAb(o);
}

int64_t PairedAb::total_steps() const {
  return opt_.setup_steps + 4 * static_cast<int64_t>(opt_.rounds) * opt_.window_steps;
}

PairedAb::Step PairedAb::Plan(int64_t i) const {
  Step s;
  if (i < opt_.setup_steps) {
    s.arm = AbArm::kB;
    s.setup = true;
    return s;
  }
  const int64_t j = i - opt_.setup_steps;
  s.window = static_cast<int>(j / opt_.window_steps);
  s.arm = WindowArm(s.window);
  // The window before window 0 is the setup (arm B).
  const AbArm before = s.window == 0 ? AbArm::kB : WindowArm(s.window - 1);
  s.timed = s.window < 4 * opt_.rounds && s.window >= 4 * opt_.discard_rounds &&
            (before == s.arm || j % opt_.window_steps >= opt_.discard_steps);
  return s;
}

absl::Status PairedAb::Record(const Step& step, double value) {
  if (!step.timed || step.window < 0 || step.window >= static_cast<int>(values_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("A/B: step of window ", step.window, " is not a timed step"));
  }
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("A/B: value ", value, " is not positive"));
  }
  values_[step.window].push_back(value);
  return absl::OkStatus();
}

absl::StatusOr<PairedAb::Result> PairedAb::Decide() const {
  Result r;
  for (int round = opt_.discard_rounds; round < opt_.rounds; ++round) {
    double med[2] = {0, 0};
    for (int pos = 0; pos < 4; ++pos) {
      const int w = 4 * round + pos;
      const AbArm arm = WindowArm(w);
      if (values_[w].empty()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "A/B: window %d (round %d, arm %s) has no timed step", w, round, AbArmName(arm)));
      }
      med[arm == AbArm::kA ? 0 : 1] += 0.5 * Median(values_[w]);
      (arm == AbArm::kA ? r.samples_a : r.samples_b) += static_cast<int>(values_[w].size());
    }
    r.a_median.push_back(med[0]);
    r.b_median.push_back(med[1]);
    r.ratio.push_back(med[1] / med[0] - 1);
  }
  r.median_ratio = Median(r.ratio);
  r.winner = r.median_ratio < -opt_.margin ? AbArm::kB : AbArm::kA;
  return r;
}

std::string PairedAb::Describe(const Result& r, double margin) {
  std::string rounds;
  for (double x : r.ratio) absl::StrAppendFormat(&rounds, " %+.2f%%", 100 * x);
  return absl::StrFormat(
      "B vs A: %+.2f%% (median of rounds:%s; %d / %d steps), %s wins (margin %.2f%%)",
      100 * r.median_ratio, rounds, r.samples_a, r.samples_b, AbArmName(r.winner), 100 * margin);
}

}  // namespace symtp
