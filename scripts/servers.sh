# shellcheck shell=bash
# Both real servers on 127.0.0.1 — s3s-fs (S3 protocol, scripts/s3.sh) and
# Apache Kafka (scripts/kafka.sh) — for a script that has sourced
# build-env.sh:
#   source "$ROOT/scripts/servers.sh"
#   servers_install   # what is missing (cached in $STATESNAP_CACHE)
#   servers_start     # starts both, exports the STATESNAP_TEST_* / AWS_*
#                     # environment, and stops them on exit (EXIT trap)

# shellcheck source=scripts/s3.sh
source "$ROOT/scripts/s3.sh"
# shellcheck source=scripts/kafka.sh
source "$ROOT/scripts/kafka.sh"

servers_stop() {
  s3_stop || true
  kafka_stop || true
}

servers_install() {
  s3_install
  kafka_install
}

servers_start() {
  trap servers_stop EXIT
  s3_start
  kafka_start
}
