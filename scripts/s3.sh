#!/usr/bin/env bash
# S3-protocol test server (s3s-fs) on 127.0.0.1, to be sourced:
#
#   source scripts/s3.sh
#   trap s3_stop EXIT           # the caller owns the EXIT trap
#   s3_install && s3_start      # exports STATESNAP_TEST_S3_URL, STATESNAP_TEST_S3_BIN, AWS_*
#   cargo test ...
#   s3_stop                     # idempotent
#
# Run directly (scripts/s3.sh), it installs and starts a server, prints its
# URL and the -o options to use, and stops it on Ctrl-C.
#
# s3_start sets no trap of its own: it used to, and that replaced the
# caller's EXIT trap, so scripts/test.sh never stopped its Kafka broker.

STATESNAP_CACHE="${STATESNAP_CACHE:-$HOME/.cache/statesnap}"
S3S_FS_VERSION="0.14.1"
S3S_FS_BIN="$STATESNAP_CACHE/s3s-fs/bin/s3s-fs"

# Installs s3s-fs into $STATESNAP_CACHE/s3s-fs unless already there.
s3_install() {
    if [[ -x "$S3S_FS_BIN" ]]; then
        return 0
    fi
    echo "s3.sh: installing s3s-fs $S3S_FS_VERSION into $STATESNAP_CACHE/s3s-fs (about 2-4 minutes)" >&2
    mkdir -p "$STATESNAP_CACHE"
    # A separate target dir so it does not contend for the workspace's lock.
    CARGO_TARGET_DIR="$STATESNAP_CACHE/s3s-build" \
        cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --locked \
        --root "$STATESNAP_CACHE/s3s-fs" >&2 || return 1
    [[ -x "$S3S_FS_BIN" ]]
}

_s3_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' 2>/dev/null \
        || echo $(( 20000 + RANDOM % 20000 ))
}

_s3_port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Starts the server on a free port with a fresh data dir and bucket, waits
# (bounded) until it accepts connections, and exports the test environment.
s3_start() {
    [[ -x "$S3S_FS_BIN" ]] || s3_install || return 1
    S3_DATA_DIR="$(mktemp -d "${TMPDIR:-/tmp}/statesnap-s3.XXXXXX")"
    local bucket="statesnap-test"
    mkdir -p "$S3_DATA_DIR/$bucket"
    S3_PORT="$(_s3_free_port)"
    local access_key="statesnap" secret_key="statesnap-secret-key"
    "$S3S_FS_BIN" --host 127.0.0.1 --port "$S3_PORT" \
        --access-key "$access_key" --secret-key "$secret_key" "$S3_DATA_DIR" \
        >"$S3_DATA_DIR.log" 2>&1 &
    S3_PID=$!
    local i
    for i in $(seq 1 100); do
        if _s3_port_open "$S3_PORT"; then
            break
        fi
        if ! kill -0 "$S3_PID" 2>/dev/null; then
            echo "s3.sh: s3s-fs exited during startup; log:" >&2
            cat "$S3_DATA_DIR.log" >&2
            return 1
        fi
        sleep 0.1
    done
    if ! _s3_port_open "$S3_PORT"; then
        echo "s3.sh: s3s-fs did not accept connections on 127.0.0.1:$S3_PORT within 10 s" >&2
        s3_stop
        return 1
    fi
    # Keep keys short: s3s-fs stores per-object metadata in a file named after
    # the base64 of the whole key, so keys over ~180 bytes hit NAME_MAX (255).
    export STATESNAP_TEST_S3_URL="s3://$bucket/r$$"
    # For tests that run (and stop, and restart) a server of their own.
    export STATESNAP_TEST_S3_BIN="$S3S_FS_BIN"
    export AWS_ENDPOINT_URL="http://127.0.0.1:$S3_PORT"
    export AWS_ACCESS_KEY_ID="$access_key"
    export AWS_SECRET_ACCESS_KEY="$secret_key"
    export AWS_REGION="us-east-1"
    export AWS_ALLOW_HTTP="true"
    echo "s3.sh: s3s-fs pid=$S3_PID on $AWS_ENDPOINT_URL, STATESNAP_TEST_S3_URL=$STATESNAP_TEST_S3_URL" >&2
}

# Stops the server started by s3_start and removes its data.
s3_stop() {
    if [[ -n "${S3_PID:-}" ]]; then
        kill "$S3_PID" 2>/dev/null || true
        wait "$S3_PID" 2>/dev/null || true
        S3_PID=""
    fi
    if [[ -n "${S3_DATA_DIR:-}" ]]; then
        rm -rf "$S3_DATA_DIR" "$S3_DATA_DIR.log"
        S3_DATA_DIR=""
    fi
}

# Run directly (not sourced): start a server for manual use, say how to
# point statesnap at it, and keep it until Ctrl-C.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    trap s3_stop EXIT
    trap 'exit 130' INT TERM
    s3_install
    s3_start
    cat <<USAGE
s3s-fs is running on $AWS_ENDPOINT_URL (pid $S3_PID, data in $S3_DATA_DIR); bucket statesnap-test.
Use a repository under the bucket with these options, e.g.:

  statesnap init --repo s3://statesnap-test/my-repo -o endpoint=$AWS_ENDPOINT_URL -o allow_http=true -o access_key_id=$AWS_ACCESS_KEY_ID -o secret_access_key=$AWS_SECRET_ACCESS_KEY -o region=$AWS_REGION
  statesnap demo --repo s3://statesnap-test/demo -o endpoint=$AWS_ENDPOINT_URL -o allow_http=true -o access_key_id=$AWS_ACCESS_KEY_ID -o secret_access_key=$AWS_SECRET_ACCESS_KEY -o region=$AWS_REGION

or export the same settings instead of the -o options:

  export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY AWS_REGION=$AWS_REGION

Stop it with Ctrl-C (or kill $$): the server stops and its data is removed.
(In a script, source this file instead: see its header.)
USAGE
    wait "$S3_PID"
fi
