#!/usr/bin/env bash
# Makes the certificates deploy/compose.yaml mounts, with `fenced certs`:
#
#   deploy/make-compose-pki.sh [DIR]      default DIR: deploy/pki
#
# DIR/ca.pem and ca-key.pem (made only if missing), node-1..4 (naming
# fenced://node/<id>, the node's hostname fencedN, 127.0.0.1 and localhost)
# and client-ops (the operator in deploy/compose-policy.toml). The image runs
# as uid 10001: the node keys are given to that uid (as root) or made
# readable by everyone (otherwise, with a warning); the certificates are 0644.
# Uses `fenced` from PATH, or FENCED_BIN.
set -euo pipefail

dir="${1:-$(dirname "$0")/pki}"
fenced="${FENCED_BIN:-fenced}"
image_uid=10001

[[ -e "$dir/ca-key.pem" ]] || "$fenced" certs ca --dir "$dir" >/dev/null
for id in 1 2 3 4; do
    "$fenced" certs node --dir "$dir" --id "$id" \
        --host "fenced$id" --host 127.0.0.1 --host localhost >/dev/null
done
"$fenced" certs client --dir "$dir" --name ops >/dev/null

# Certificates are public. The directory stays 0700: the daemon's bind
# mounts pass through it as root.
keys=("$dir"/node-1-key.pem "$dir"/node-2-key.pem "$dir"/node-3-key.pem "$dir"/node-4-key.pem)
chmod 0644 "$dir/ca.pem" "$dir"/node-1.pem "$dir"/node-2.pem "$dir"/node-3.pem "$dir"/node-4.pem
if [[ $(id -u) -eq 0 ]]; then
    chown "$image_uid:$image_uid" "${keys[@]}"
    chmod 0600 "${keys[@]}"
else
    echo "make-compose-pki: not root, so the node keys are made readable by every local user (0644)" \
        "for uid $image_uid; as root they are chowned to $image_uid instead" >&2
    chmod 0644 "${keys[@]}"
fi
echo "certificates in $dir: ca.pem, node-1..4, client-ops"
