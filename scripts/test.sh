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

# shellcheck source=scripts/build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-env.sh"
cd "$ROOT"

# --- system packages -------------------------------------------------------
build_env_install

# --- real servers ----------------------------------------------------------
# shellcheck source=scripts/servers.sh
source "$ROOT/scripts/servers.sh"
servers_install
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

log "cargo test (release profile)"
cargo test --release "${FEATURES[@]}" --all-targets
cargo test --release "${FEATURES[@]}" --doc
# Tests that need root (they mount a tmpfs); same build, nothing recompiles.
if [[ $(id -u) -eq 0 ]]; then
  cargo test --release "${FEATURES[@]}" --test restore_target -- --ignored mount_point
else
  log "not root: skipping the mount-point restore test (restore_target, ignored)"
fi

log "demo smoke run (what scripts/demo.sh runs, at a small size)"
# The binary `cargo test` built for the CLI tests. A `cargo build --bins`
# here would resolve features without the dev-dependencies and rebuild the
# two workspace crates (about 20 s), then the next test run would rebuild
# them back.
demo_dir="$(mktemp -d)"
"$CARGO_TARGET_DIR/release/statesnap" demo --keys 20000 --updates-per-key 10 \
  --dir "$demo_dir/demo" | tee "$demo_dir/out"
grep -q "speed-up: snapshot + tail was" "$demo_dir/out"
grep -q "digests equal" "$demo_dir/out"
rm -rf "$demo_dir"

log "all checks passed"
