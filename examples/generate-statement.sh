#!/usr/bin/env bash
# Generates one account statement and writes it through a fenced write
# boundary: the statement service (fenced-http) or the gateway
# (fenced-gateway), whichever STATEMENT_URL names. Any language does the
# same: three headers on the write.
#
#   fencectl run statement:account-1842:2026-07 --ttl 30s -- examples/generate-statement.sh
#
# fencectl run sets FENCED_RESOURCE, FENCED_FENCING_TOKEN and FENCED_OWNER_ID.
#   STATEMENT_URL     where the write goes (default http://127.0.0.1:7500/statements/1842)
#   STATEMENT_TEXT    the statement (default: one naming the token)
#   OPERATION_ID      the write's operation id (default: none; the gateway needs one)
#   GENERATE_SECONDS  how long generating takes (default 0)
# Exit: 0 written, 3 refused as stale (a newer owner took over: stop), 1 other.
set -euo pipefail

: "${FENCED_RESOURCE:?run me under fencectl run, or set FENCED_RESOURCE}"
: "${FENCED_FENCING_TOKEN:?run me under fencectl run, or set FENCED_FENCING_TOKEN}"
: "${FENCED_OWNER_ID:?run me under fencectl run, or set FENCED_OWNER_ID}"
url=${STATEMENT_URL:-http://127.0.0.1:7500/statements/1842}
text=${STATEMENT_TEXT:-"statement generated under token $FENCED_FENCING_TOKEN"}

sleep "${GENERATE_SECONDS:-0}"

headers=(-H "x-fencing-resource: $FENCED_RESOURCE"
         -H "x-fencing-token: $FENCED_FENCING_TOKEN"
         -H "x-fencing-owner: $FENCED_OWNER_ID")
if [[ -n "${OPERATION_ID:-}" ]]; then
    headers+=(-H "x-fencing-operation-id: $OPERATION_ID")
fi
answer=$(curl -sS --max-time 30 -w '\n%{http_code}' -X POST "${headers[@]}" --data-binary "$text" "$url")
code=${answer##*$'\n'}
body=${answer%$'\n'*}
case "$code" in
    2??) echo "$body"; exit 0 ;;
    409) echo "refused: $body" >&2; exit 3 ;;
    *)   echo "failed ($code): $body" >&2; exit 1 ;;
esac
