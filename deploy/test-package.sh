#!/usr/bin/env bash
# The release a user installs, end to end (as root): deploy/release.sh, the
# tarball's checksums, then the Debian package installed with dpkg, a node
# started from /usr/bin/fenced (one node, loopback) and a lease taken with
# /usr/bin/fencectl; the unit in /lib/systemd/system runs /usr/bin/fenced.
# The package is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/release.sh
out=target/release-artifacts
(cd "$out" && sha256sum -c SHA256SUMS)
deb="$(ls "$out"/fenced_*_amd64.deb)"
tar -tzf "$out"/fenced-*-x86_64-linux.tar.gz > "$out/contents"
grep -q '/bin/fenced-resource$' "$out/contents"

work="$(mktemp -d)"
node=""
cleanup() {
    [[ -n "$node" ]] && kill "$node" 2>/dev/null && wait "$node" 2>/dev/null
    dpkg -r fenced >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

dpkg -i "$deb" >/dev/null
for bin in fenced fencectl fenced-resource; do
    [[ -x "/usr/bin/$bin" ]] || { echo "test-package: /usr/bin/$bin missing" >&2; exit 1; }
done
grep -q '^ExecStart=/usr/bin/fenced run$' /lib/systemd/system/fenced.service

port=$((17000 + RANDOM % 2000))
FENCED_ID=1 FENCED_LISTEN=127.0.0.1:$port FENCED_PEER_LISTEN=127.0.0.1:$((port + 1)) \
    FENCED_INITIAL_CLUSTER="1=127.0.0.1:$((port + 1))/127.0.0.1:$port" \
    FENCED_DATA_DIR="$work/data" /usr/bin/fenced run > "$work/node.log" 2>&1 &
node=$!
for _ in $(seq 1 100); do
    /usr/bin/fencectl --endpoints "127.0.0.1:$port" --timeout 1s status >/dev/null 2>&1 && break
    sleep 0.2
done
/usr/bin/fencectl --endpoints "127.0.0.1:$port" acquire installed --ttl 5s \
    || { cat "$work/node.log" >&2; exit 1; }
/usr/bin/fenced-resource --help >/dev/null
echo "test-package: installed, started and served a lease"
