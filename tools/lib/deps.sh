# Sourced by tools/test.sh and tools/quickstart.sh: installs the Debian/Ubuntu
# packages symtp needs when they are missing. CUDA is not installed here: the
# toolkit lives under /usr/local/cuda where present, and without it symtp
# builds the CPU backend only.
symtp_install_deps() {
  local pkgs=(cmake ninja-build g++ pkg-config libboost-dev libabsl-dev libgtest-dev libgmock-dev
              libbenchmark-dev python3 python3-matplotlib procps)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "symtp: installing ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

symtp_jobs() { echo "${JOBS:-$(nproc)}"; }
