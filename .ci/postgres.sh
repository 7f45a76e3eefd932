#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server on a loopback port for the tests and
# exports FENCED_TEST_POSTGRES_URL. Meant to be sourced by .ci/run:
#   source .ci/postgres.sh
# Installs PostgreSQL with apt-get when no initdb is found. The server runs as
# an unprivileged user (PostgreSQL refuses to run as root) from a temporary
# directory, and is stopped when the sourcing shell exits.

fenced_pg_bin() {
    local dir
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

if ! FENCED_PG_BIN=$(fenced_pg_bin); then
    echo "== installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    FENCED_PG_BIN=$(fenced_pg_bin) || { echo "postgresql install did not provide initdb" >&2; exit 1; }
fi

FENCED_PG_DIR=$(mktemp -d /tmp/fenced-pg.XXXXXX)
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$FENCED_PG_DIR" --shell /bin/sh postgres
    chown postgres "$FENCED_PG_DIR"
    fenced_pg_as() { runuser -u postgres -- "$@"; }
else
    fenced_pg_as() { "$@"; }
fi

# A free loopback port, found by the kernel.
FENCED_PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)

fenced_pg_as "$FENCED_PG_BIN/initdb" -D "$FENCED_PG_DIR/data" -U postgres -A trust --no-sync >"$FENCED_PG_DIR/initdb.log" 2>&1 \
    || { cat "$FENCED_PG_DIR/initdb.log" >&2; exit 1; }
fenced_pg_as "$FENCED_PG_BIN/pg_ctl" -D "$FENCED_PG_DIR/data" -l "$FENCED_PG_DIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $FENCED_PG_PORT -k $FENCED_PG_DIR -c fsync=on" start >/dev/null \
    || { cat "$FENCED_PG_DIR/server.log" >&2; exit 1; }

fenced_pg_stop() {
    fenced_pg_as "$FENCED_PG_BIN/pg_ctl" -D "$FENCED_PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$FENCED_PG_DIR"
}
trap fenced_pg_stop EXIT

export FENCED_TEST_POSTGRES_URL="host=127.0.0.1 port=$FENCED_PG_PORT user=postgres dbname=postgres"
echo "== postgresql on 127.0.0.1:$FENCED_PG_PORT ($FENCED_PG_BIN)"
