#!/usr/bin/env bash
# The main job: `statesnap demo` on embedded defaults (arguments are passed
# on: scripts/demo.sh --keys 1000000 --store memory ...).
#
# Builds exactly what scripts/test.sh builds (same target directory, profile
# and features), so whichever runs first compiles RocksDB and the other
# reuses it. The demo itself runs in the caller's directory: a relative
# --dir is relative to it, and by default the demo works in a new directory
# under $TMPDIR (removed at the end unless --keep), never in the checkout.
set -euo pipefail
# shellcheck source=scripts/build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-env.sh"
build_env_install
log "building statesnap (release; the first build compiles RocksDB, ~15 min on 2 cores)"
(cd "$ROOT" && cargo build --release "${FEATURES[@]}" --bins)
exec "$CARGO_TARGET_DIR/release/statesnap" demo "$@"
