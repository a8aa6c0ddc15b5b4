#!/usr/bin/env bash
# The Kafka changelog benchmarks (crates/statesnap/benches/kafka.rs) against
# tansu on 127.0.0.1, once per tansu storage engine:
#
#   scripts/bench-kafka.sh                 sqlite, then memory
#   scripts/bench-kafka.sh sqlite          only one engine
#   STATESNAP_BENCH_KAFKA_RECORDS=1000000 scripts/bench-kafka.sh memory
#
# sqlite is the engine the test suite uses (it survives broker restarts);
# memory shows what the client and the stores do when the broker's storage
# is not the limit. Each engine gets a fresh broker and data dir, so one
# run's records do not slow the next. Same profile and target dir as
# scripts/test.sh, so nothing is built twice.
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

engines=("$@")
((${#engines[@]})) || engines=(sqlite memory)
for engine in "${engines[@]}"; do
  case "$engine" in
    sqlite) export KAFKA_STORAGE_ENGINE="sqlite://tansu.db" ;;
    memory) export KAFKA_STORAGE_ENGINE="memory://tansu/" ;;
    *) echo "unknown engine \`$engine\` (sqlite or memory)" >&2; exit 2 ;;
  esac
  kafka_start
  printf '\n==> [bench] tansu storage engine: %s\n' "$KAFKA_STORAGE_ENGINE"
  cargo bench -p statesnap --all-features --bench kafka -- --noplot
  kafka_stop
done
