#!/usr/bin/env bash
# Runs a whole symtp job on this node: the scheduler and one worker per rank.
#   tools/launch.sh --tp 2 --backend cpu --model tiny --num-requests 64 --out out/run1
# Uses the build made by tools/test.sh (build/) or tools/quickstart.sh
# (build-release/), building first if there is none. `--help` lists the flags.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=""
for b in "${SYMTP_BUILD_DIR:-}" "$ROOT/build-release" "$ROOT/build" "$ROOT/build-gpu"; do
  [[ -n $b && -x $b/tools/symtp ]] && { BIN=$b/tools/symtp; break; }
done
if [[ -z $BIN ]]; then
  echo "symtp: no build found; building the release preset (first run only)" >&2
  source "$ROOT/tools/lib/deps.sh"
  symtp_install_deps
  (cd "$ROOT" && cmake --preset release >/dev/null && cmake --build --preset release -j "$(symtp_jobs)" --target symtp >&2)
  BIN=$ROOT/build-release/tools/symtp
fi
exec "$BIN" launch "$@"
