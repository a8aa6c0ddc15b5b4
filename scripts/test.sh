#!/usr/bin/env bash
# The whole statesnap test suite, on a fresh machine or a warm one.
#
#   scripts/test.sh            install what is missing, start the real servers
#                              (s3s-fs, an S3-protocol server, and tansu, a
#                              Kafka-protocol broker, both on 127.0.0.1), then
#                              run fmt, clippy, every test, and a demo smoke run
#
# Everything builds in ONE cargo profile (release): RocksDB's C++ takes ~15 min
# per profile on 2 cores, so tests, clippy and benches share it. The target
# directory lives outside the checkout so a fresh clone reuses the last build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statesnap-target}"
export STATESNAP_CACHE="${STATESNAP_CACHE:-$HOME/.cache/statesnap}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR" "$STATESNAP_CACHE"

log() { printf '\n==> %s\n' "$*"; }

# --- system packages -------------------------------------------------------
need_apt=()
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
# bindgen (librocksdb-sys) loads libclang at build time.
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
if ((${#need_apt[@]})); then
  log "installing ${need_apt[*]} (apt)"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- real servers ----------------------------------------------------------
# shellcheck source=scripts/s3.sh
source "$ROOT/scripts/s3.sh"
# shellcheck source=scripts/kafka.sh
source "$ROOT/scripts/kafka.sh"
cleanup() {
  s3_stop || true
  kafka_stop || true
}
trap cleanup EXIT
s3_install
kafka_install
s3_start
kafka_start
# The suites fail (rather than skip) when their server is missing.
export STATESNAP_REQUIRE_S3=1
export STATESNAP_REQUIRE_KAFKA=1

# --- checks ----------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

# One feature set for every command (all features: rocksdb, kafka,
# conformance), so nothing is compiled twice.
FEATURES=(--workspace --all-features)

log "cargo clippy (release profile, shared with tests)"
cargo clippy --release "${FEATURES[@]}" --all-targets -- -D warnings

log "cargo test (release profile)"
cargo test --release "${FEATURES[@]}" --all-targets
cargo test --release "${FEATURES[@]}" --doc
# Tests that need root (they mount a tmpfs); same build, nothing recompiles.
if [[ $(id -u) -eq 0 ]]; then
  cargo test --release "${FEATURES[@]}" --test restore_target -- --ignored mount_point
else
  log "not root: skipping the mount-point restore test (restore_target, ignored)"
fi

log "demo smoke run"
cargo build --release "${FEATURES[@]}" --bins
"$CARGO_TARGET_DIR/release/statesnap" demo --records 200000 --keys 20000

log "all checks passed"
