#!/usr/bin/env bash
# Property-based tests of the HTTP/JSON API from its OpenAPI document
# (docs/openapi.json): schemathesis generates requests, valid and not, and
# checks that no answer is a server error and that every answer matches the
# document (status, content type, headers, schema). Runs against a fresh
# `fenced dev` cluster from target/debug (build it first: .ci/run does),
# for a bounded time: ./tests/schemathesis/run.sh [SECONDS] (default 60).
#
# Left out: Watch (a stream that never ends by itself; tests/tests/json_api.rs
# reads it) and the membership changes (random node ids would take the dev
# cluster apart; tests/tests/json_api.rs and membership.rs cover them).
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${1:-60}
venv=target/schemathesis-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip --disable-pip-version-check -q install -r tests/schemathesis/requirements.txt

data=$(mktemp -d)
log="$data/dev.log"
target/debug/fenced dev --fresh --data-dir "$data/cluster" --base-port 7400 >"$log" 2>&1 &
dev=$!
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 60); do
    grep -q "^ready" "$log" && break
    kill -0 "$dev" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
done
grep -q "^ready" "$log" || { echo "fenced dev did not become ready in 30 s" >&2; cat "$log" >&2; exit 1; }

"$venv/bin/schemathesis" run docs/openapi.json \
    --url http://127.0.0.1:7401 \
    --exclude-path-regex '^/v1/(lock/watch|cluster/(add_learner|change_membership|remove_node|promote_learner))$' \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --max-time "$seconds" --request-timeout 10 --workers 2 \
    --warnings off
