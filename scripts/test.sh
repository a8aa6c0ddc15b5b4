#!/usr/bin/env bash
# The whole statesnap test suite, on a fresh machine or a warm one.
#
#   scripts/test.sh            install what is missing, start the real servers
#                              (s3s-fs, an S3-protocol server, and Apache
#                              Kafka, both on 127.0.0.1), then
#                              run fmt, clippy, every test, and a demo smoke run
#
# Everything builds in ONE cargo profile (release): RocksDB's C++ takes ~15 min
# per profile on 2 cores, so tests, clippy and benches share it. The target
# directory lives outside the checkout so a fresh clone reuses the last build.
set -euo pipefail

# shellcheck source=scripts/build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-env.sh"
cd "$ROOT"

# --- system packages -------------------------------------------------------
log "system packages"
build_env_install

# --- real servers ----------------------------------------------------------
# shellcheck source=scripts/servers.sh
source "$ROOT/scripts/servers.sh"
log "test servers: install what is missing (cached in $STATESNAP_CACHE)"
servers_install
log "test servers: start"
servers_start
# The suites fail (rather than skip) when their server is missing.
export STATESNAP_REQUIRE_S3=1
export STATESNAP_REQUIRE_KAFKA=1

# --- checks ----------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

# One feature set for every command (FEATURES, from build-env.sh: all
# features), so nothing is compiled twice.
log "cargo clippy (release profile, shared with tests)"
cargo clippy --release "${FEATURES[@]}" --all-targets -- -D warnings

# --no-fail-fast: one failing test binary must not hide the others' results.
log "cargo test (release profile)"
cargo test --release "${FEATURES[@]}" --all-targets --no-fail-fast
log "cargo test --doc"
cargo test --release "${FEATURES[@]}" --doc --no-fail-fast
# Tests that need root (they mount a tmpfs); same build, nothing recompiles.
if [[ $(id -u) -eq 0 ]]; then
  log "cargo test: the mount-point restore test (root)"
  cargo test --release "${FEATURES[@]}" --test integration -- --ignored restore_target::a_mount_point_target
else
  log "not root: skipping the mount-point restore test (restore_target, ignored)"
fi

log "demo smoke run (what scripts/demo.sh runs, at a small size)"
# The binary `cargo test` built for the CLI tests. A `cargo build --bins`
# here would resolve features without the dev-dependencies and rebuild the
# two workspace crates (about 20 s), then the next test run would rebuild
# them back. Run from the checkout with the default directory, which must
# not be inside it: the checkout's status is unchanged afterwards.
demo_out="$(mktemp)"
status_before="$(git status --porcelain --untracked-files=all)"
"$CARGO_TARGET_DIR/release/statesnap" demo --keys 20000 --updates-per-key 10 | tee "$demo_out"
grep -q "speed-up: snapshot + tail was" "$demo_out"
grep -q "digests equal" "$demo_out"
rm -f "$demo_out"
if [[ "$(git status --porcelain --untracked-files=all)" != "$status_before" ]]; then
  echo "the demo left files in the checkout:" >&2
  git status --short >&2
  exit 1
fi

log "scripts/s3.sh and scripts/kafka.sh run directly start a server and say how to use it"
# Run directly, each starts its server and prints how to point statesnap at
# it (they used to print nothing and exit 0); SIGTERM stops it.
check_direct_run() {
  local script="$1" want="$2" out pid
  out="$(mktemp)"
  "$ROOT/$script" >"$out" 2>&1 &
  pid=$!
  # 120 s: Kafka's JVM starts in ~6 s on an idle machine, 16 s with the
  # other core busy.
  for _ in $(seq 1 1200); do
    grep -q -- "$want" "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if ! grep -q -- "$want" "$out"; then
    cat "$out" >&2
    echo "$script run directly did not print \`$want\`" >&2
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
}
check_direct_run scripts/s3.sh "-o endpoint=http://127.0.0.1:"
check_direct_run scripts/kafka.sh "--changelog kafka://127.0.0.1:"

log "all checks passed"
