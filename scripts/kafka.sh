#!/usr/bin/env bash
# Apache Kafka on 127.0.0.1 for the Kafka tests, scenarios and benchmarks: a
# single-node KRaft broker+controller, run from the jars Maven resolves for
# java/kafka-broker/pom.xml (Maven Central only, into the local Maven
# repository; no jar is committed or downloaded from anywhere else).
#
# Sourced by scripts/test.sh:
#   source scripts/kafka.sh
#   kafka_install   # system packages for building librdkafka, and the
#                   # broker's classpath (mvn dependency:build-classpath)
#   kafka_start     # starts the shared broker, exports STATESNAP_TEST_KAFKA_*
#   kafka_stop      # stops it (idempotent; put it in the EXIT trap)
#
# Run directly:
#   scripts/kafka.sh                     install, start a broker, print its
#                                        address and how to use it, stop it on
#                                        Ctrl-C or SIGTERM
#   scripts/kafka.sh broker PORT [DIR]   run one broker in the foreground on
#                                        PORT with its data in DIR (default:
#                                        the working directory), formatting
#                                        DIR on first use; run again on the
#                                        same DIR it restarts that broker with
#                                        its data (the restart tests do this)
#
# Exports after kafka_start:
#   STATESNAP_TEST_KAFKA_BOOTSTRAP  127.0.0.1:<port> of the shared broker
#   STATESNAP_TEST_KAFKA_CMD        the command line of a broker of one's own,
#                                   with a {port} placeholder, to be run with
#                                   its data dir as working directory, so a
#                                   test can run (and kill, and restart) one
#
# Needs STATESNAP_CACHE (default $HOME/.cache/statesnap), Java 17+ and Maven.
# Runs as root (or with sudo for apt-get).

KAFKA_VERSION="4.4.0"
_KAFKA_SH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kafka.sh"
_KAFKA_POM="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/java/kafka-broker/pom.xml"

_kafka_log() { printf '\n==> [kafka] %s\n' "$*"; }

_kafka_cache() {
  : "${STATESNAP_CACHE:=$HOME/.cache/statesnap}"
  export STATESNAP_CACHE
  mkdir -p "$STATESNAP_CACHE/kafka"
}

# The broker's classpath, written by kafka_install: one file per pom
# content, so editing the pom re-resolves and nothing else does.
kafka_classpath_file() {
  _kafka_cache
  printf '%s/kafka/classpath-%s.txt\n' "$STATESNAP_CACHE" \
    "$(sha256sum "$_KAFKA_POM" | cut -c1-16)"
}

# System packages: rdkafka's default features build the bundled librdkafka
# with its ./configure (mklove) and make, a C and C++ compiler, and zlib
# (libz-sys links the system zlib found through pkg-config). No cmake, no
# OpenSSL, no curl: the default build has neither TLS nor SASL compiled in.
# The broker needs a JDK (17 or newer) and Maven, which resolves its jars.
kafka_install() {
  _kafka_cache
  local need=()
  command -v cc >/dev/null 2>&1 || need+=(gcc)
  command -v c++ >/dev/null 2>&1 || need+=(g++)
  command -v make >/dev/null 2>&1 || need+=(make)
  command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
  command -v perl >/dev/null 2>&1 || need+=(perl)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || need+=(maven)
  dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
  if ((${#need[@]})); then
    _kafka_log "installing ${need[*]} (apt)"
    local sudo=
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi

  local cp_file
  cp_file="$(kafka_classpath_file)"
  if [[ -s $cp_file ]] && _kafka_classpath_present "$cp_file"; then
    return 0
  fi
  _kafka_log "resolving Apache Kafka $KAFKA_VERSION from Maven Central (java/kafka-broker/pom.xml)"
  mvn -B -q -f "$_KAFKA_POM" dependency:build-classpath \
    -Dmdep.outputFile="$cp_file.tmp" -Dmdep.includeScope=runtime
  mv "$cp_file.tmp" "$cp_file"
  _kafka_classpath_present "$cp_file" || {
    echo "Maven resolved a classpath with missing jars: $cp_file" >&2
    return 1
  }
}

# Every jar of the classpath file is in the local Maven repository (it may
# have been cleaned since the file was written).
_kafka_classpath_present() {
  local jar
  while IFS= read -r -d: jar || [[ -n $jar ]]; do
    [[ -f ${jar%$'\n'} ]] || return 1
  done <"$1"
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

# Asks 127.0.0.1:$1 for the cluster's metadata (a Metadata v4 request, the
# oldest version Kafka 4 still serves) and succeeds when the answer names at
# least one broker: the broker is up, has caught up with its controller and
# serves clients. A TCP connect alone is not enough: the listener accepts
# connections before the broker answers them.
kafka_answers_metadata() {
  python3 - "$1" <<'PY' 2>/dev/null
import socket, struct, sys
client = b"statesnap-probe"
# api_key 3 (Metadata), version 4, correlation id 7, client id; all topics
# (null array); no auto-creation.
body = struct.pack(">hhih", 3, 4, 7, len(client)) + client + struct.pack(">i?", -1, False)
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3) as s:
    s.sendall(struct.pack(">i", len(body)) + body)
    def exact(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data
    size = struct.unpack(">i", exact(4))[0]
    correlation, _throttle, brokers = struct.unpack(">iii", exact(size)[:12])
sys.exit(0 if correlation == 7 and brokers > 0 else 1)
PY
}

# Runs one broker in the foreground (exec: the caller's child is the JVM) on
# 127.0.0.1:$1 with its data in $2, formatting $2 on first use. The
# controller's port is chosen on first use and kept in $2, so a restart
# finds the same quorum.
#
# The settings are the broker's defaults except where a one-node test
# cluster on a 2-core machine needs otherwise (replication factors of 1,
# fewer internal partitions and threads, no initial rebalance delay) and
# where the tests need the log cleaner to run within seconds of being asked
# (each test topic sets its own segment.ms and dirty ratio).
kafka_broker_run() {
  local port="$1" dir="${2:-$PWD}"
  _kafka_cache
  local cp_file
  cp_file="$(kafka_classpath_file)"
  [[ -s $cp_file ]] || { echo "Kafka is not installed: run kafka_install (scripts/kafka.sh)" >&2; return 1; }
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  local controller
  if [[ -s $dir/controller.port ]]; then
    controller="$(cat "$dir/controller.port")"
  else
    controller="$(_kafka_free_port)"
    printf '%s\n' "$controller" >"$dir/controller.port"
  fi
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.network.threads=2
num.io.threads=4
background.threads=4
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=500
PROPS
  # Log4j 2: INFO to stdout, the broker.log of whoever started it.
  cat >"$dir/log4j2.properties" <<'LOG'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = warn
LOG
  local java=(java -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$dir/log4j2.properties"
    "-Dkafka.logs.dir=$dir/logs" -cp "$(cat "$cp_file")")
  if [[ ! -f $dir/data/meta.properties ]]; then
    local id
    id="$("${java[@]}" kafka.tools.StorageTool random-uuid)"
    "${java[@]}" kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 || {
      echo "formatting the Kafka data dir $dir failed:" >&2
      cat "$dir/format.log" >&2
      return 1
    }
  fi
  exec "${java[@]}" kafka.Kafka "$dir/server.properties"
}

kafka_start() {
  _kafka_cache
  local port
  port="$(_kafka_free_port)"
  KAFKA_DATA_DIR="$(mktemp -d "$STATESNAP_CACHE/kafka/run.XXXXXX")"
  KAFKA_LOG="$KAFKA_DATA_DIR/broker.log"
  _kafka_log "starting Apache Kafka $KAFKA_VERSION on 127.0.0.1:$port (data $KAFKA_DATA_DIR)"
  bash "$_KAFKA_SH" broker "$port" "$KAFKA_DATA_DIR" >"$KAFKA_LOG" 2>&1 &
  KAFKA_PID=$!
  local i
  for i in $(seq 1 600); do
    if kafka_answers_metadata "$port"; then
      break
    fi
    if ! kill -0 "$KAFKA_PID" 2>/dev/null; then
      echo "Kafka exited during startup; its log:" >&2
      tail -50 "$KAFKA_LOG" >&2
      return 1
    fi
    sleep 0.2
  done
  if ((i == 600)); then
    echo "Kafka did not answer a metadata request on 127.0.0.1:$port within 120 s; its log:" >&2
    tail -50 "$KAFKA_LOG" >&2
    kafka_stop
    return 1
  fi
  export KAFKA_PID KAFKA_DATA_DIR KAFKA_LOG
  export STATESNAP_TEST_KAFKA_BOOTSTRAP="127.0.0.1:$port"
  export STATESNAP_TEST_KAFKA_CMD="bash $_KAFKA_SH broker {port}"
}

kafka_stop() {
  if [[ -n ${KAFKA_PID:-} ]]; then
    # SIGTERM: a controlled shutdown, which takes a few seconds.
    kill "$KAFKA_PID" 2>/dev/null || true
    local i
    for i in $(seq 1 150); do
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

# Run directly (not sourced).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  if [[ ${1:-} == broker ]]; then
    [[ -n ${2:-} ]] || { echo "usage: scripts/kafka.sh broker PORT [DIR]" >&2; exit 2; }
    kafka_broker_run "$2" "${3:-$PWD}"
  fi
  [[ $# -eq 0 ]] || { echo "usage: scripts/kafka.sh [broker PORT [DIR]]" >&2; exit 2; }
  # Start a broker for manual use, say how to point statesnap at it, and
  # keep it until Ctrl-C or SIGTERM.
  trap kafka_stop EXIT
  trap 'exit 130' INT TERM
  kafka_install
  kafka_start
  cat <<USAGE
Apache Kafka $KAFKA_VERSION is running on $STATESNAP_TEST_KAFKA_BOOTSTRAP (pid $KAFKA_PID, data in $KAFKA_DATA_DIR, log $KAFKA_LOG).
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
