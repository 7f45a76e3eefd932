#!/usr/bin/env bash
# Runs the write-boundary examples of docs/GUIDE.md ("Protecting a
# resource") against a local cluster, each with the article's sequence:
# worker A takes the lease and pauses past it, worker B takes over and
# writes, A wakes up and writes. Every boundary must keep B's write and
# refuse A's. Fails on any other outcome.
#
#   cargo build --workspace --bins && examples/run.sh
#
# FENCED_TEST_POSTGRES_URL (set by .ci/postgres.sh) adds the SQL example;
# under CI it is required.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${FENCED_BIN_DIR:-$PWD/target/debug}
BASE=${FENCED_EXAMPLES_BASE_PORT:-17100}
WORK=$(mktemp -d /tmp/fenced-examples.XXXXXX)
export FENCED_ENDPOINTS="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"
export PATH="$BIN:$PATH"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "examples: FAILED: $*" >&2; for f in "$WORK"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done; exit 1; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
wait_port() {
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    fail "nothing listens on port $1"
}

fenced dev --data-dir "$WORK/cluster" --base-port "$BASE" >"$WORK/dev.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    fencectl status >/dev/null 2>&1 && break
    sleep 0.2
done
fencectl status >/dev/null || fail "the dev cluster did not start"

# A takes the lease for 2 s and "pauses": it writes only at the end.
take_paused() {
    local json
    json=$(fencectl --json acquire "$1" --ttl 2s) || fail "acquire $1"
    A_TOKEN=$(field token <<<"$json")
    A_OWNER=$(field owner_id <<<"$json")
}
# A wakes up and writes with its old token: exit 3 (refused) expected.
write_as_a() {
    local rc=0
    FENCED_RESOURCE=$1 FENCED_FENCING_TOKEN=$A_TOKEN FENCED_OWNER_ID=$A_OWNER \
        STATEMENT_URL=$2 OPERATION_ID=${3:-} STATEMENT_TEXT="A's late statement" \
        examples/generate-statement.sh >/dev/null 2>"$WORK/a.err" || rc=$?
    [[ $rc == 3 ]] || fail "A's stale write was not refused (exit $rc): $(cat "$WORK/a.err")"
    echo "  A (token $A_TOKEN) refused: $(cut -c1-160 "$WORK/a.err")"
}

echo "== your own HTTP service (fenced-http, examples/src/bin/statement-service.rs)"
statement-service --listen "127.0.0.1:$((BASE + 400))" --data-dir "$WORK/service" \
    --cluster "$FENCED_ENDPOINTS" >"$WORK/service.log" 2>&1 &
pids+=($!)
wait_port $((BASE + 400))
url="http://127.0.0.1:$((BASE + 400))/statements/1842"
r=statement:account-1842:2026-07
take_paused $r
# B waits for A's lease to end, then writes under fencectl run.
STATEMENT_URL=$url STATEMENT_TEXT="B's statement" \
    fencectl run $r --ttl 30s --wait 10s -- examples/generate-statement.sh \
    || fail "B's write under fencectl run"
write_as_a $r "$url"
[[ $(curl -sS "$url") == "B's statement" ]] || fail "the statement is not B's: $(curl -sS "$url")"

echo "== a destination that cannot check (fenced-gateway in front of examples/src/bin/plain-upstream.rs)"
plain-upstream --listen "127.0.0.1:$((BASE + 500))" --log "$WORK/upstream.writes" \
    >"$WORK/upstream.log" 2>&1 &
pids+=($!)
fenced-gateway --listen "127.0.0.1:$((BASE + 600))" --upstream "http://127.0.0.1:$((BASE + 500))" \
    --data-dir "$WORK/gateway" --cluster "$FENCED_ENDPOINTS" >"$WORK/gateway.log" 2>&1 &
pids+=($!)
wait_port $((BASE + 500))
wait_port $((BASE + 600))
url="http://127.0.0.1:$((BASE + 600))/payouts"
r=payout:merchant-12:2026-07
take_paused $r
STATEMENT_URL=$url OPERATION_ID=payout-b STATEMENT_TEXT="B's payout" \
    fencectl run $r --ttl 30s --wait 10s -- examples/generate-statement.sh \
    || fail "B's request through the gateway"
write_as_a $r "$url" payout-a
[[ $(wc -l <"$WORK/upstream.writes") == 1 ]] && grep -q "B's payout" "$WORK/upstream.writes" \
    || fail "the upstream applied: $(cat "$WORK/upstream.writes")"

echo "== a fenced outbox with one dispatcher (fenced-outbox, examples/src/bin/outbox-record.rs)"
db="sqlite:$WORK/outbox.db"
fenced-outbox migrate --database "$db" >/dev/null 2>&1 || fail "fenced-outbox migrate"
fenced-outbox dispatch --database "$db" --cluster "$FENCED_ENDPOINTS" --name examples \
    --lease-ttl 2s --metrics-listen "127.0.0.1:$((BASE + 800))" >"$WORK/dispatcher.log" 2>&1 &
pids+=($!)
wait_port $((BASE + 800))
r=invoice:1842
charges="http://127.0.0.1:$((BASE + 500))/charges"
take_paused $r
fencectl run $r --ttl 30s --wait 10s -- outbox-record --database "$WORK/outbox.db" \
    --destination "$charges" --key charge-b --payload "B's charge" >/dev/null \
    || fail "B's record"
rc=0
FENCED_RESOURCE=$r FENCED_FENCING_TOKEN=$A_TOKEN FENCED_OWNER_ID=$A_OWNER outbox-record \
    --database "$WORK/outbox.db" --destination "$charges" --key charge-a \
    --payload "A's charge" 2>"$WORK/a.err" || rc=$?
[[ $rc == 3 ]] || fail "A's stale record was not refused (exit $rc): $(cat "$WORK/a.err")"
echo "  A (token $A_TOKEN) refused: $(cat "$WORK/a.err")"
for _ in $(seq 1 100); do
    grep -q "B's charge" "$WORK/upstream.writes" && break
    sleep 0.1
done
grep -q "B's charge" "$WORK/upstream.writes" || fail "the dispatcher did not deliver B's charge"
grep -q "A's charge" "$WORK/upstream.writes" && fail "A's charge was delivered"
[[ $(grep -c "B's charge" "$WORK/upstream.writes") == 1 ]] || fail "B's charge was applied more than once"
backlog=$(curl -sS "http://127.0.0.1:$((BASE + 800))/metrics" | awk '$1 == "fenced_outbox_pending" {print $2}')
[[ $backlog == 0 ]] || fail "the backlog is $backlog after delivery"
echo "  B's charge delivered once, backlog 0"

echo "== fenced's own store (fenced-resource serve, fencectl resource put)"
fenced-resource serve --listen "127.0.0.1:$((BASE + 700))" --data-dir "$WORK/resource" \
    --cluster "$FENCED_ENDPOINTS" >"$WORK/resource.log" 2>&1 &
pids+=($!)
wait_port $((BASE + 700))
export FENCED_RESOURCE_ENDPOINT="127.0.0.1:$((BASE + 700))"
r=report:q3
take_paused $r
json=$(fencectl --json acquire $r --ttl 30s --wait 10s) || fail "B's acquire of $r"
fencectl resource put $r --token "$(field token <<<"$json")" \
    --owner-id "$(field owner_id <<<"$json")" --value "B's report" >/dev/null || fail "B's put"
rc=0
fencectl resource put $r --token "$A_TOKEN" --owner-id "$A_OWNER" --value "A's report" \
    >/dev/null 2>&1 || rc=$?
[[ $rc == 3 ]] || fail "A's put was not rejected (exit $rc)"
echo "  A (token $A_TOKEN) rejected by the store"

echo "== versioned objects with a fenced pointer (examples/src/bin/publish-report.rs)"
r=report:2026-q3
store="$WORK/reports"
take_paused $r
fencectl run $r --ttl 30s --wait 10s -- publish-report --store "$store" --object $r \
    --content "B's report" >/dev/null || fail "B's publish"
rc=0
FENCED_RESOURCE=$r FENCED_FENCING_TOKEN=$A_TOKEN FENCED_OWNER_ID=$A_OWNER publish-report \
    --store "$store" --object $r --content "A's report" >/dev/null 2>"$WORK/a.err" || rc=$?
[[ $rc == 3 ]] || fail "A's publish was not refused (exit $rc): $(cat "$WORK/a.err")"
[[ $(publish-report --store "$store" --object $r --show) == "B's report" ]] \
    || fail "the pointer moved to A's version"
echo "  A (token $A_TOKEN) refused: $(cut -c1-120 "$WORK/a.err")"

echo "== your own SQL table (fenced-sql, examples/sql/account-statements.sql)"
if [[ -n "${FENCED_TEST_POSTGRES_URL:-}" ]]; then
    psql -q "$FENCED_TEST_POSTGRES_URL" -v ON_ERROR_STOP=1 \
        -f crates/fenced-sql/sql/postgres/001_fences.sql >/dev/null || fail "the fenced-sql migration"
    r="statement:account-7:$$"
    take_paused "$r"
    json=$(fencectl --json acquire "$r" --ttl 30s --wait 10s) || fail "B's acquire of $r"
    sql() {
        psql -q "$FENCED_TEST_POSTGRES_URL" -v ON_ERROR_STOP=1 -v account=$$ -v resource="$r" \
            -v token="$1" -v owner="$2" -v content="$3" -f examples/sql/account-statements.sql
    }
    out=$(sql "$(field token <<<"$json")" "$(field owner_id <<<"$json")" "B's statement") \
        || fail "B's guarded write"
    [[ $out == *"written: accepted"* ]] || fail "B's write: $out"
    out=$(sql "$A_TOKEN" "$A_OWNER" "A's statement") || fail "A's guarded write"
    [[ $out == *"refused: stale"* ]] || fail "A's write was not refused: $out"
    echo "  A (token $A_TOKEN) refused by fenced_guard"
    stored=$(psql -qtA "$FENCED_TEST_POSTGRES_URL" -c "SELECT content FROM fenced_examples.account_statements WHERE account_id = $$")
    [[ $stored == "B's statement" ]] || fail "the row holds: $stored"
elif [[ -n "${CI:-}" ]]; then
    fail "FENCED_TEST_POSTGRES_URL is not set (source .ci/postgres.sh)"
else
    echo "  skipped: FENCED_TEST_POSTGRES_URL is not set"
fi

echo "examples: every boundary kept B's write and refused A's"
