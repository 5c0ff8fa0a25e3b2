# Sourced by the sweep scripts (report.sh, decode_sweep.sh, load_sweep.sh,
# overlap.sh): how they start a job.
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
