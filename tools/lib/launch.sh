# Sourced by the sweep scripts (report.sh, decode_sweep.sh, load_sweep.sh,
# overlap.sh): how they start a job, and in which order they run arms.
#
# symtp_launch BIN FLAGS...: `BIN launch FLAGS` when BIN is given (a built
# symtp binary, as the device run scripts pass in $SYMTP_BIN), else
# tools/launch.sh FLAGS, which builds first.
symtp_launch() {
  local bin=$1
  shift
  if [[ -n $bin ]]; then
    "$bin" launch "$@"
  else
    "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/launch.sh" "$@"
  fi
}

# symtp_run FLAGS...: symtp_launch with $SYMTP_BIN.
symtp_run() { symtp_launch "${SYMTP_BIN:-}" "$@"; }

# symtp_arm_order REPEAT ARM...: the arms in the order repeat REPEAT runs them, one
# a line: as given on even repeats, reversed on odd ones, so that drift and
# warm-up fall on every arm alike.
symtp_arm_order() {
  local repeat=$1
  shift
  local arms=("$@") i
  if ((repeat % 2 == 0)); then
    for ((i = 0; i < ${#arms[@]}; ++i)); do echo "${arms[i]}"; done
  else
    for ((i = ${#arms[@]} - 1; i >= 0; --i)); do echo "${arms[i]}"; done
  fi
}
