#!/usr/bin/env bash
# A real Kafka-protocol broker on 127.0.0.1 for the kafka tests and benches:
# tansu (crates.io), with its SQLite storage engine in a throwaway data dir.
#
# Sourced by scripts/test.sh:
#   source scripts/kafka.sh
#   kafka_install   # system packages for building librdkafka, and tansu
#   kafka_start     # starts the shared broker, exports STATESNAP_TEST_KAFKA_*
#   kafka_stop      # stops it (idempotent; put it in the EXIT trap)
#
# Run directly (scripts/kafka.sh), it installs and starts a broker, prints
# its address and how to use it, and stops it on Ctrl-C.
#
# Exports after kafka_start:
#   STATESNAP_TEST_KAFKA_BOOTSTRAP  127.0.0.1:<port> of the shared broker
#   STATESNAP_TEST_KAFKA_CMD        the broker command line with a {port}
#                                   placeholder, to be run with its data dir as
#                                   working directory, so a test can run (and
#                                   kill, and restart) a broker of its own
#   STATESNAP_TEST_KAFKA_BIN        the tansu binary
#
# Needs STATESNAP_CACHE (default $HOME/.cache/statesnap). Runs as root (or
# with sudo for apt-get).
#
# KAFKA_STORAGE_ENGINE picks tansu's storage: `sqlite://tansu.db` (default:
# persistent across broker restarts, which the restart tests need) or
# `memory://tansu/` (benchmarks: it shows what the client does when the
# broker's storage is not the limit; lost when the broker stops).

KAFKA_TANSU_VERSION="0.6.0"

_kafka_log() { printf '\n==> [kafka] %s\n' "$*"; }

_kafka_cache() {
  : "${STATESNAP_CACHE:=$HOME/.cache/statesnap}"
  export STATESNAP_CACHE
  mkdir -p "$STATESNAP_CACHE"
}

kafka_bin() {
  _kafka_cache
  printf '%s\n' "$STATESNAP_CACHE/tansu/bin/tansu"
}

# System packages: rdkafka's default features build the bundled librdkafka
# with its ./configure (mklove) and make, a C and C++ compiler, and zlib
# (libz-sys links the system zlib found through pkg-config). No cmake, no
# OpenSSL, no curl: the default build has neither TLS nor SASL compiled in.
# tansu itself builds with the same C toolchain (its SQLite and libsql are
# bundled C sources compiled by the cc crate).
kafka_install() {
  _kafka_cache
  local need=()
  command -v cc >/dev/null 2>&1 || need+=(gcc)
  command -v c++ >/dev/null 2>&1 || need+=(g++)
  command -v make >/dev/null 2>&1 || need+=(make)
  command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
  command -v perl >/dev/null 2>&1 || need+=(perl)
  dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
  if ((${#need[@]})); then
    _kafka_log "installing ${need[*]} (apt)"
    local sudo=
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi

  local bin
  bin="$(kafka_bin)"
  if [[ -x $bin ]] && "$bin" --version 2>/dev/null | grep -q "$KAFKA_TANSU_VERSION"; then
    return 0
  fi
  _kafka_log "building tansu $KAFKA_TANSU_VERSION (cargo install; ~15 min cold on 2 cores)"
  CARGO_TARGET_DIR="$STATESNAP_CACHE/tansu-build" \
    cargo install tansu --version "$KAFKA_TANSU_VERSION" --locked \
    --features dynostore,libsql --root "$STATESNAP_CACHE/tansu"
  [[ -x $bin ]] || { echo "tansu did not install at $bin" >&2; return 1; }
}

# A TCP port on 127.0.0.1 that nothing listens on.
_kafka_free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      printf '%s\n' "$port"
      return 0
    fi
  done
  echo "no free port found" >&2
  return 1
}

# The broker command line for a port ({port} when left as a placeholder, for
# tests). tansu resolves a sqlite:// URL against its working directory (even
# sqlite:///abs/path becomes <cwd>/abs/path), so the broker runs with its data
# dir as working directory and the database is ./tansu.db.
_kafka_cmd() {
  local port="$1"
  printf '%s broker --listener-url tcp://127.0.0.1:%s --advertised-listener-url tcp://127.0.0.1:%s --storage-engine %s --silent\n' \
    "$(kafka_bin)" "$port" "$port" "${KAFKA_STORAGE_ENGINE:-sqlite://tansu.db}"
}

kafka_start() {
  _kafka_cache
  local bin port
  bin="$(kafka_bin)"
  [[ -x $bin ]] || { echo "tansu is not installed: run kafka_install" >&2; return 1; }
  port="$(_kafka_free_port)"
  KAFKA_DATA_DIR="$(mktemp -d "${TMPDIR:-/tmp}/statesnap-kafka.XXXXXX")"
  KAFKA_LOG="$KAFKA_DATA_DIR/tansu.log"
  local cmd
  cmd="$(_kafka_cmd "$port")"
  _kafka_log "starting tansu on 127.0.0.1:$port (data $KAFKA_DATA_DIR)"
  # shellcheck disable=SC2086 # the command line is split on purpose
  (cd "$KAFKA_DATA_DIR" && exec $cmd) >"$KAFKA_LOG" 2>&1 &
  KAFKA_PID=$!
  local i
  for i in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      break
    fi
    if ! kill -0 "$KAFKA_PID" 2>/dev/null; then
      echo "tansu exited during startup; its log:" >&2
      cat "$KAFKA_LOG" >&2
      return 1
    fi
    sleep 0.1
  done
  if ((i == 300)); then
    echo "tansu did not accept connections on 127.0.0.1:$port within 30 s; its log:" >&2
    cat "$KAFKA_LOG" >&2
    kafka_stop
    return 1
  fi
  export KAFKA_PID KAFKA_DATA_DIR KAFKA_LOG
  export STATESNAP_TEST_KAFKA_BOOTSTRAP="127.0.0.1:$port"
  export STATESNAP_TEST_KAFKA_BIN="$bin"
  STATESNAP_TEST_KAFKA_CMD="$(_kafka_cmd '{port}')"
  export STATESNAP_TEST_KAFKA_CMD
}

kafka_stop() {
  if [[ -n ${KAFKA_PID:-} ]]; then
    kill "$KAFKA_PID" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do
      kill -0 "$KAFKA_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$KAFKA_PID" 2>/dev/null || true
    wait "$KAFKA_PID" 2>/dev/null || true
    unset KAFKA_PID
  fi
  if [[ -n ${KAFKA_DATA_DIR:-} && -d $KAFKA_DATA_DIR ]]; then
    rm -rf "$KAFKA_DATA_DIR"
  fi
  unset KAFKA_DATA_DIR STATESNAP_TEST_KAFKA_BOOTSTRAP STATESNAP_TEST_KAFKA_CMD
}

# Run directly (not sourced): start a broker for manual use, say how to
# point statesnap at it, and keep it until Ctrl-C.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  trap kafka_stop EXIT
  trap 'exit 130' INT TERM
  kafka_install
  kafka_start
  cat <<USAGE
tansu is running on $STATESNAP_TEST_KAFKA_BOOTSTRAP (pid $KAFKA_PID, data in $KAFKA_DATA_DIR, log $KAFKA_LOG).
A store's changelog on it is kafka://$STATESNAP_TEST_KAFKA_BOOTSTRAP/TOPIC/PARTITION, e.g.

  statesnap list --repo URL shop/carts/0 --changelog kafka://$STATESNAP_TEST_KAFKA_BOOTSTRAP/shop-carts-changelog/0

(the topic must exist: an application's KafkaChangelog creates it). The kafka tests and benches
find it through:

  export STATESNAP_TEST_KAFKA_BOOTSTRAP=$STATESNAP_TEST_KAFKA_BOOTSTRAP

Stop it with Ctrl-C (or kill $$): the broker stops and its data is removed.
(In a script, source this file instead: see its header.)
USAGE
  wait "$KAFKA_PID"
fi
