// PairedAb: which of two configurations ("arms") of a repeated step is
// faster, measured in place, in the process and configuration that will run.
//
// Effects of one or two percent do not survive a comparison between two
// processes (memory placement, clocks and what else runs differ by about as
// much), so the arms alternate within one run, in windows of consecutive
// steps: a setup window that runs arm B untimed (e.g. B's autotuning), then
// `rounds` rounds of four windows, A B B A, so that a linear drift over a
// round (a steady decode's context, hence its step time, grows every step:
// ~1% per 12-step window at batch 256, context 1024) cancels within the
// round. The first `discard_steps` of a window that follows a switch of arm
// are not timed (switching may re-plan, capture graphs or warm caches), nor
// are the first `discard_rounds` rounds (each arm's first uses). Each timed
// round gives one paired ratio, (median(B1) + median(B2)) /
// (median(A1) + median(A2)) - 1; B wins only when the median of those
// ratios is below -margin. With windows of one step (arms that switch for
// free, e.g. GEMM plan sets whose CUDA graphs are all kept), periodic
// effects (a cost that steps every few steps) hit both arms alike too.
//
// The schedule is a pure function of the step number, so processes that
// run the same steps (the ranks of a TP group) switch together without
// talking.
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace symtp {

struct PairedAbOptions {
  int setup_steps = 12;   // arm B, untimed, before round 0 (0: none)
  int window_steps = 12;  // steps per window
  int discard_steps = 3;  // leading steps of a window after a switch that are not timed
  int discard_rounds = 0;  // leading rounds that are not timed
  int rounds = 4;         // rounds of four windows (A B B A)
  double margin = 0.005;  // B must be faster by more than this fraction
};

enum class AbArm { kA, kB };
const char* AbArmName(AbArm arm);  // "A" / "B"

class PairedAb {
 public:
  // InvalidArgument unless window_steps > discard_steps >= 0,
  // rounds > discard_rounds >= 0, setup_steps >= 0 and 0 <= margin < 1.
  static absl::StatusOr<PairedAb> Create(const PairedAbOptions& options);

  struct Step {
    AbArm arm = AbArm::kA;
    bool setup = false;  // the setup window (arm B)
    int window = -1;     // 0 .. 4 * rounds - 1 after the setup; -1 in the setup
    bool timed = false;  // Record this step's value
  };
  // The plan of step `i` (0-based), 0 <= i < total_steps().
  Step Plan(int64_t i) const;
  int64_t total_steps() const;
  const PairedAbOptions& options() const { return opt_; }
  // Window w's arm (A B B A in every round).
  static AbArm WindowArm(int w);
  // The values recorded per window (in the order recorded).
  const std::vector<std::vector<double>>& values() const { return values_; }

  // A timed step's value (e.g. its time). InvalidArgument for an untimed
  // step, a window out of range or a value that is not finite and > 0.
  absl::Status Record(const Step& step, double value);

  struct Result {
    // Per timed round: the mean of its two windows' medians per arm, and
    // b / a - 1.
    std::vector<double> a_median, b_median;
    std::vector<double> ratio;
    double median_ratio = 0;
    AbArm winner = AbArm::kA;
    int samples_a = 0, samples_b = 0;
  };
  // FailedPrecondition naming the window when a window has no value.
  absl::StatusOr<Result> Decide() const;
  // "B vs A: -1.20% (rounds -1.1% -1.3% ...), B wins (margin 0.5%)".
  static std::string Describe(const Result& r, double margin);

 private:
  explicit PairedAb(const PairedAbOptions& o);
  PairedAbOptions opt_;
  std::vector<std::vector<double>> values_;  // per window
};

}  // namespace symtp
