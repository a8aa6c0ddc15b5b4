#!/usr/bin/env bash
# The Kafka changelog benchmarks (crates/statesnap/benches/kafka.rs) against
# Apache Kafka on 127.0.0.1 (scripts/kafka.sh: a single-node KRaft broker
# from Maven Central), on a fresh broker and data dir:
#
#   scripts/bench-kafka.sh
#   STATESNAP_BENCH_KAFKA_RECORDS=1000000 scripts/bench-kafka.sh
#
# Same profile and target dir as scripts/test.sh, so nothing is built twice.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statesnap-target}"
export STATESNAP_CACHE="${STATESNAP_CACHE:-$HOME/.cache/statesnap}"

# shellcheck source=scripts/kafka.sh
source "$ROOT/scripts/kafka.sh"
trap kafka_stop EXIT
kafka_install
cargo bench -p statesnap --all-features --bench kafka --no-run
kafka_start
printf '\n==> [bench] Apache Kafka %s on %s\n' "$KAFKA_VERSION" "$STATESNAP_TEST_KAFKA_BOOTSTRAP"
cargo bench -p statesnap --all-features --bench kafka -- --noplot
