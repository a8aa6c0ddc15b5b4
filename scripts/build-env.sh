# The build environment every script shares, to be sourced: one target
# directory outside the checkout (RocksDB's C++ is compiled once, whichever
# command runs first), the cache for test servers, and the system packages
# the build needs on a fresh Debian machine:
#   clang, libclang-dev   bindgen (librocksdb-sys) loads libclang at build time
#   gcc, g++, make, pkg-config, perl, zlib1g-dev
#                         the bundled librdkafka (feature `kafka`) and RocksDB
# Runs as root, or with sudo for apt-get.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statesnap-target}"
export STATESNAP_CACHE="${STATESNAP_CACHE:-$HOME/.cache/statesnap}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR" "$STATESNAP_CACHE"

# Every command builds the same thing: release profile, whole workspace,
# every feature. Two commands with other flags would resolve features
# differently and rebuild the crates.
FEATURES=(--workspace --all-features)

# Each phase line carries the wall-clock time and the minutes since the
# first script started (STATESNAP_T0 is inherited by the scripts it runs),
# so a slow run shows where its time went.
export STATESNAP_T0="${STATESNAP_T0:-$(date +%s)}"
log() {
  local now
  now="$(date +%s)"
  printf '\n==> [%s +%dm%02ds] %s\n' "$(date -u +%H:%M:%S)" \
    $(((now - STATESNAP_T0) / 60)) $(((now - STATESNAP_T0) % 60)) "$*"
}

build_env_install() {
  local need=()
  command -v clang >/dev/null 2>&1 || need+=(clang)
  dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
  command -v cc >/dev/null 2>&1 || need+=(gcc)
  command -v c++ >/dev/null 2>&1 || need+=(g++)
  command -v make >/dev/null 2>&1 || need+=(make)
  command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
  command -v perl >/dev/null 2>&1 || need+=(perl)
  dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
  if ((${#need[@]})); then
    log "installing ${need[*]} (apt)"
    local sudo=
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}
