#!/usr/bin/env bash
# Runs fenced, etcd (three members) and PostgreSQL (the article's lease
# table and stored procedure, on one node and on a primary with one
# synchronous standby) side by side on this machine and prints one table. Clients list every endpoint as configured and look for no
# leader (pass --find-leader or --follower-first to change that).
#
#   bash crates/fenced-bench/run-all.sh [extra fenced-bench flags]
#
# Installs etcd and PostgreSQL from Debian's packages if missing, builds the
# release binaries, and stops everything it started on exit. Exits non-zero
# on a token-order violation or an exceeded budget.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v etcd >/dev/null; then
  apt-get update -qq && apt-get install -y -qq etcd-server etcd-client
fi
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v postgres >/dev/null; then
  apt-get update -qq && apt-get install -y -qq postgresql
fi
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres

cargo build --release -p fenced-server --bin fenced
cargo build --release -p fenced-bench

work=$(mktemp -d /tmp/fenced-bench.XXXXXX)
chmod 755 "$work"
bench_pid=
cleanup() {
  if [ -n "$bench_pid" ]; then kill "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; fi
  # Whatever the benchmark started lives under $work; stop it by data dir.
  for pid in $(pgrep -f -- "$work" || true); do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
./target/release/fenced-bench --systems fenced,etcd,postgres,postgres-sync --work-dir "$work" "$@" &
bench_pid=$!
status=0
wait "$bench_pid" || status=$?
bench_pid=
exit $status
