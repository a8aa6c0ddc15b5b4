#!/usr/bin/env bash
# The consumer-group example (crates/pageviews) against real servers:
# installs and starts Apache Kafka and s3s-fs (S3 protocol) on
# 127.0.0.1 as scripts/test.sh does, builds, then runs
#
#   scripts/pageviews.sh                 the scenarios, then the bench at 1 M keys
#   scripts/pageviews.sh scenario [...]  processes join, leave and are killed while
#                                        input flows; checked against a model; the
#                                        per-move report (`pageviews scenario --help`)
#   scripts/pageviews.sh reshard [...]   the partition count changes (default 6 -> 12
#                                        -> 4, `--layout`) through reshards of the
#                                        state; each generation checked against a model
#   scripts/pageviews.sh standby [...]   warm standbys: a process is SIGKILLed and the
#                                        survivor promotes its standbys of the killed
#                                        one's partitions; checked against a model
#   scripts/pageviews.sh bench [...]     time to ready of a moved partition, handoff
#                                        vs full replay (`--keys N`, default 1 000 000)
#
# The servers are stopped (and their data removed) on exit.
set -euo pipefail
# shellcheck source=scripts/build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-env.sh"
cd "$ROOT"
build_env_install
# shellcheck source=scripts/servers.sh
source "$ROOT/scripts/servers.sh"
servers_install
log "building (release; the first build compiles RocksDB, ~15 min on 2 cores)"
cargo build --release "${FEATURES[@]}" --bins
servers_start
bin="$CARGO_TARGET_DIR/release/pageviews"
what="${1:-all}"
[[ $# -gt 0 ]] && shift
case "$what" in
  scenario) "$bin" scenario "$@" ;;
  reshard) "$bin" reshard "$@" ;;
  standby) "$bin" standby "$@" ;;
  bench) "$bin" bench "$@" ;;
  all)
    "$bin" scenario
    "$bin" reshard
    "$bin" standby
    "$bin" bench
    ;;
  *)
    echo "usage: scripts/pageviews.sh [scenario|reshard|standby|bench] [options]" >&2
    exit 2
    ;;
esac
