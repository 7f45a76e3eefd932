#!/usr/bin/env bash
# Makes the certificates of deploy/kubernetes/fenced.yaml with `fenced certs`
# and prints the Secret fenced-tls that holds them, for `kubectl apply -f -`:
#
#   deploy/kubernetes/make-secret.sh DIR [NAMESPACE] [NODES] | kubectl apply -f -
#
# DIR keeps the CA (ca.pem, ca-key.pem: made only if missing, keep the key
# safe) and the node certificates; NAMESPACE defaults to "default", NODES to
# 3. Node N's certificate names fenced://node/N, its peer name
# fenced-N.fenced-peer (short and full), the client Service fenced (short and
# full: clients may reach any node through it) and 127.0.0.1 (the probes).
# The Secret holds ca.pem and node-N.pem, node-N-key.pem for N = 1..NODES,
# never the CA key. Uses `fenced` from PATH, or FENCED_BIN, and kubectl
# (client side only: --dry-run=client).
set -euo pipefail

dir="${1:?usage: make-secret.sh DIR [NAMESPACE] [NODES]}"
ns="${2:-default}"
nodes="${3:-3}"
fenced="${FENCED_BIN:-fenced}"

[[ -e "$dir/ca-key.pem" ]] || "$fenced" certs ca --dir "$dir" >/dev/null
files=(--from-file="ca.pem=$dir/ca.pem")
for ((id = 1; id <= nodes; id++)); do
    "$fenced" certs node --dir "$dir" --id "$id" \
        --host "fenced-$id.fenced-peer" --host "fenced-$id.fenced-peer.$ns.svc" \
        --host "fenced-$id.fenced-peer.$ns.svc.cluster.local" \
        --host fenced --host "fenced.$ns.svc" --host "fenced.$ns.svc.cluster.local" \
        --host 127.0.0.1 --host localhost >/dev/null
    files+=(--from-file="node-$id.pem=$dir/node-$id.pem" --from-file="node-$id-key.pem=$dir/node-$id-key.pem")
done
kubectl create secret generic fenced-tls --namespace "$ns" "${files[@]}" \
    --dry-run=client --output yaml
