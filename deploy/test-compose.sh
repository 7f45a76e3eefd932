#!/usr/bin/env bash
# End-to-end test of the image and deploy/compose.yaml on this machine's
# Docker engine: build the image, make the certificates with the fresh
# `fenced certs` (deploy/make-compose-pki.sh), start the three-node cluster
# with TLS and authorization on, see a plaintext client and a client the
# policy does not know refused, take a lease from the host with fencectl
# over TLS as the operator, stop the leader's container and take another
# lease (a higher token), restart the container and see it rejoin, then
# add a fourth node as a learner (the operator adds it), promote it, take a
# lease, remove it, then `down` and `up` again on the same volumes and see
# tokens keep rising.
# Everything it starts is removed on exit (`down -v`), failed or not.
set -euo pipefail
cd "$(dirname "$0")/.."

export FENCED_IMAGE="${FENCED_IMAGE:-fenced:latest}"
# Its own project name: other checkouts may run this test on the same engine.
project="fenced-deploy-test-$$"
started=$SECONDS

log() { printf '[%3ds] %s\n' "$((SECONDS - started))" "$*"; }
fail() { log "FAIL: $*" >&2; exit 1; }

if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
compose=("${compose[@]}" -p "$project" -f deploy/compose.yaml)

# Free host ports for the three client ports.
read -r p1 p2 p3 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
export FENCED_HOST_PORT_1=$p1 FENCED_HOST_PORT_2=$p2 FENCED_HOST_PORT_3=$p3
port_of() { local v="FENCED_HOST_PORT_$1"; echo "${!v}"; }
endpoints="https://127.0.0.1:$p1,https://127.0.0.1:$p2,https://127.0.0.1:$p3"
pki="$(mktemp -d)/pki"
export FENCED_PKI="$pki"

cleanup() {
    local code=$?
    if [[ $code -ne 0 ]]; then
        log "logs of the failed run:"
        "${compose[@]}" logs --no-color --tail 40 >&2 || true
    fi
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$(dirname "$pki")"
    log "cleaned up (exit $code)"
}
trap cleanup EXIT

log "building the image"
deploy/build-image.sh "$FENCED_IMAGE"
bin="$PWD/target/x86_64-unknown-linux-gnu/release"
fencectl="$bin/fencectl"
log "certificates"
FENCED_BIN="$bin/fenced" deploy/make-compose-pki.sh "$pki"
"$bin/fenced" certs client --dir "$pki" --name stranger >/dev/null
tls=(--cacert "$pki/ca.pem" --cert "$pki/client-ops.pem" --key "$pki/client-ops-key.pem")
ctl() { timeout 30 "$fencectl" --endpoints "$endpoints" "${tls[@]}" --json "$@"; }

# Waits until the given services (default: all three) report healthy.
wait_healthy() {
    local deadline=$((SECONDS + 90)) services=("$@")
    ((${#services[@]})) || services=(fenced1 fenced2 fenced3)
    for s in "${services[@]}"; do
        while :; do
            local id status
            id="$("${compose[@]}" ps -q "$s")"
            status="$(docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null || echo missing)"
            [[ "$status" == healthy ]] && break
            ((SECONDS < deadline)) || fail "$s is $status, not healthy"
            sleep 1
        done
    done
    log "healthy: ${services[*]}"
}

# Acquires `resource` (retrying while the cluster elects a leader); prints its token.
acquire() {
    local deadline=$((SECONDS + 60)) out
    while :; do
        if out="$(ctl acquire "$1" --ttl 10m)" && [[ "$(jq -r .status <<<"$out")" == granted ]]; then
            jq -r .token <<<"$out"
            return
        fi
        ((SECONDS < deadline)) || fail "acquire $1: $out"
        sleep 1
    done
}

# Asserts that `resource` is held with `token`.
expect_held() {
    local out
    out="$(ctl describe "$1")" || fail "describe $1: $out"
    [[ "$(jq -r '"\(.held) \(.last_token)"' <<<"$out")" == "true $2" ]] ||
        fail "$1 should be held with token $2: $out"
}

log "cluster up"
"${compose[@]}" up -d
wait_healthy

# Refusals: plaintext against a TLS node, and a certificate of the right CA
# whose name the policy does not know.
if out="$(timeout 30 "$fencectl" --endpoints "127.0.0.1:$p1" --timeout 5s status 2>&1)"; then
    fail "plaintext status against a TLS node answered: $out"
fi
log "plaintext refused: $out"
code=0
out="$(timeout 30 "$fencectl" --endpoints "$endpoints" --cacert "$pki/ca.pem" \
    --cert "$pki/client-stranger.pem" --key "$pki/client-stranger-key.pem" \
    acquire deploy:stranger --ttl 1m 2>&1)" || code=$?
[[ $code -eq 5 && "$out" == *"permission denied"*"\"stranger\""* ]] ||
    fail "a client outside the policy should be denied (exit 5), got exit $code: $out"
log "client outside the policy refused: $out"

t1="$(acquire deploy:first)"
log "granted deploy:first, token $t1"

leader="$(ctl status | jq -r .leader_id)"
[[ "$leader" =~ ^[123]$ ]] || fail "no leader in status: $(ctl status)"
log "stopping the leader, fenced$leader"
"${compose[@]}" stop -t 10 "fenced$leader"

t2="$(acquire deploy:second)"
((t2 > t1)) || fail "token $t2 after the failover is not above $t1"
log "granted deploy:second after the failover, token $t2"
expect_held deploy:first "$t1"
new_leader="$(ctl status | jq -r .leader_id)"
[[ "$new_leader" != "$leader" ]] || fail "fenced$leader is stopped but still the leader"

log "restarting fenced$leader"
"${compose[@]}" start "fenced$leader"
wait_healthy "fenced$leader"
# Rejoined: the node knows the leader and has applied the grant made while
# it was down.
deadline=$((SECONDS + 30))
while :; do
    node="$(timeout 30 "$fencectl" --endpoints "https://127.0.0.1:$(port_of "$leader")" "${tls[@]}" --json status || true)"
    if [[ "$(jq -r '.nodes[0] | "\(.leader_id) \(.last_token)"' <<<"$node" 2>/dev/null)" == "$new_leader $t2" ]]; then
        break
    fi
    ((SECONDS < deadline)) || fail "fenced$leader did not catch up: $node"
    sleep 1
done
log "fenced$leader rejoined: follows node $new_leader, last token $t2"

log "membership: fenced4 joins as a learner, is promoted, then removed"
"${compose[@]}" --profile grow up -d fenced4
# A node certificate adds no node, its own included: the operator adds it.
ctl member add 4 --peer fenced4:7201 --client fenced4:7101 >/dev/null \
    || fail "member add 4: $(ctl member list)"
# Role of node $1 in `member list`, or "none".
role_of() { ctl member list | jq -r --argjson id "$1" '[.members[] | select(.id == $id) | .role][0] // "none"'; }
deadline=$((SECONDS + 60))
until [[ "$(role_of 4)" == learner ]]; do
    ((SECONDS < deadline)) || fail "fenced4 did not join as a learner: $(ctl member list)"
    sleep 1
done
log "fenced4 added by the operator, receiving the log as a learner"
ctl member promote 4 --wait 25s >/dev/null || fail "promote 4: $(ctl member list)"
[[ "$(role_of 4)" == voter ]] || fail "fenced4 is not a voter: $(ctl member list)"
t4="$(acquire deploy:four)"
((t4 > t2)) || fail "token $t4 with four voters is not above $t2"
ctl member remove 4 >/dev/null || fail "remove 4: $(ctl member list)"
[[ "$(role_of 4)" == none ]] || fail "fenced4 still a member: $(ctl member list)"
"${compose[@]}" --profile grow rm -sfv fenced4 >/dev/null
log "fenced4 promoted (token $t4 granted with four voters), removed and deleted"

log "whole cluster down and up again on the same volumes"
"${compose[@]}" down
"${compose[@]}" up -d
wait_healthy
t3="$(acquire deploy:third)"
((t3 > t4)) || fail "token $t3 after the restart is not above $t4"
expect_held deploy:first "$t1"
expect_held deploy:second "$t2"
log "granted deploy:third after the restart, token $t3; earlier leases still held"

log "PASS in $((SECONDS - started)) s"
