#!/usr/bin/env bash
# Static checks of the deployment files, offline:
#   - systemd: `systemd-analyze verify` of fenced.service with each host's
#     environment file; any message fails (verify itself exits 0 on unknown
#     keys and bad values).
#   - Kubernetes: the manifests against the Kubernetes OpenAPI schemas
#     (kubernetes-validate ships them), strictly: unknown fields fail.
#   - compose: `docker compose config`.
# Needs target/debug/fenced (`cargo build -p fenced-server`).
set -euo pipefail
cd "$(dirname "$0")/.."

fenced="$PWD/target/debug/fenced"
[[ -x "$fenced" ]] || { echo "validate: $fenced is missing; build it first" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== systemd units"
command -v systemd-analyze >/dev/null || {
    apt-get install -y -qq systemd >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq systemd >/dev/null; }
}
for env in deploy/systemd/host*.env; do
    # The unit as shipped, but for where the binary and this host's settings
    # are on this machine.
    sed -e "s#^ExecStart=/usr/local/bin/fenced #ExecStart=$fenced #" \
        -e "s#^EnvironmentFile=/etc/fenced/fenced.env#EnvironmentFile=$PWD/$env#" \
        deploy/systemd/fenced.service >"$work/fenced.service"
    out="$(systemd-analyze verify "$work/fenced.service" 2>&1)" || { echo "$out" >&2; exit 1; }
    if [[ -n "$out" ]]; then
        echo "systemd-analyze verify fenced.service with $env:" >&2
        echo "$out" >&2
        exit 1
    fi
    echo "fenced.service with $env: ok"
done

echo "== Kubernetes manifests"
command -v kubernetes-validate >/dev/null || python3 -m pip install -q kubernetes-validate
for version in 1.31.0 1.37.0; do
    kubernetes-validate --strict --quiet -k "$version" deploy/kubernetes/*.yaml
    echo "deploy/kubernetes against Kubernetes $version: ok"
done

echo "== compose file"
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
"${compose[@]}" -f deploy/compose.yaml config -q
echo "deploy/compose.yaml: ok"
