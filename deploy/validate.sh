#!/usr/bin/env bash
# Static checks of the deployment files, offline:
#   - TLS everywhere: no FENCED_INSECURE in any flavour (nor
#     FENCED_INSECURE_NO_AUTH), and the systemd host files leave the TLS
#     paths to the unit.
#   - Authentication everywhere: every flavour loads a policy, and each
#     shipped policy loads (`fenced auth check-policy`).
#   - systemd: `systemd-analyze verify` of fenced.service with each host's
#     environment file; any message fails (verify itself exits 0 on unknown
#     keys and bad values).
#   - Kubernetes: the manifests against the Kubernetes OpenAPI schemas
#     (kubernetes-validate ships them), strictly: unknown fields fail; and
#     the Secret deploy/kubernetes/make-secret.sh prints: valid, holding the
#     files the StatefulSet mounts for each of its ordinals, no CA key.
#   - Prometheus: `promtool check` of the alert rules and config, and
#     `promtool test rules` of alerts.test.yml; the Grafana dashboard parses.
#   - compose: `docker compose config`.
# Needs target/debug/fenced (`cargo build -p fenced-server`), or another
# build of it in FENCED_BIN, and kubectl (client side only, no cluster).
set -euo pipefail
cd "$(dirname "$0")/.."

fenced="${FENCED_BIN:-$PWD/target/debug/fenced}"
[[ -x "$fenced" ]] || { echo "validate: $fenced is missing; build it first" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== TLS in every flavour"
if grep -n "FENCED_INSECURE" deploy/compose.yaml deploy/systemd/* deploy/kubernetes/*.yaml; then
    echo "validate: a deployment file runs plaintext" >&2
    exit 1
fi
# A path in the host file would override the unit's credentials directory.
if grep -n "^FENCED_TLS_" deploy/systemd/host*.env; then
    echo "validate: the host files must leave the TLS paths to fenced.service" >&2
    exit 1
fi
echo "no FENCED_INSECURE; TLS paths only in fenced.service: ok"

echo "== authentication in every flavour"
# Each flavour names a policy the node loads, and the policy parses (an
# unknown role or field fails `fenced run` at start, so check it here).
auth_missing=()
grep -q "FENCED_AUTH_POLICY" deploy/compose.yaml || auth_missing+=(compose)
grep -q "^Environment=FENCED_AUTH_POLICY=" deploy/systemd/fenced.service || auth_missing+=(systemd)
grep -q "name: FENCED_AUTH_POLICY" deploy/kubernetes/fenced.yaml || auth_missing+=(kubernetes)
if ((${#auth_missing[@]})); then
    echo "validate: no authentication policy in: ${auth_missing[*]}" >&2
    exit 1
fi
python3 - deploy/kubernetes/fenced.yaml "$work/k8s-policy.toml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
(cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fenced-policy"]
open(sys.argv[2], "w").write(cm["data"]["policy.toml"])
PY
for policy in deploy/compose-policy.toml deploy/systemd/policy.toml "$work/k8s-policy.toml"; do
    "$fenced" auth check-policy "$policy" >/dev/null || { echo "validate: $policy does not load" >&2; exit 1; }
done
echo "compose, systemd and Kubernetes run with a policy that loads: ok"

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
FENCED_BIN="$fenced" deploy/kubernetes/make-secret.sh "$work/pki" fenced-ns >"$work/secret.yaml"
kubernetes-validate --strict --quiet -k 1.31.0 "$work/secret.yaml"
python3 - "$work/secret.yaml" deploy/kubernetes/fenced.yaml <<'PY'
import base64, subprocess, sys, yaml
secret = yaml.safe_load(open(sys.argv[1]))
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
sts = next(d for d in docs if d["kind"] == "StatefulSet")
pod = sts["spec"]["template"]["spec"]
(container,) = pod["containers"]
env = {e["name"]: e.get("value") for e in container["env"]}
(mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
assert mount.get("readOnly"), "the certificates are mounted read-only"
(volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
assert volume["secret"]["secretName"] == secret["metadata"]["name"] == "fenced-tls"
assert volume["secret"]["defaultMode"] & 0o037 == 0, "the Secret's files: no write, nothing for others"
assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
assert secret["metadata"]["namespace"] == "fenced-ns"
data = secret["data"]
assert "ca-key.pem" not in data, "the CA key must stay out of the Secret"
start = sts["spec"].get("ordinals", {}).get("start", 0)
for ordinal in range(start, start + sts["spec"]["replicas"]):
    for var in ("FENCED_TLS_CA", "FENCED_TLS_CERT", "FENCED_TLS_KEY"):
        path = env[var].replace("$(FENCED_ID)", str(ordinal))
        assert path.startswith(mount["mountPath"] + "/"), f"{var} is outside the mount: {path}"
        key = path[len(mount["mountPath"]) + 1:]
        assert key in data, f"pod {ordinal}: {var}={path}, but the Secret has no {key}"
    # The names the peers, the client Service and the probes reach it by.
    pem = base64.b64decode(data[f"node-{ordinal}.pem"])
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"],
                          input=pem, capture_output=True, check=True).stdout.decode()
    names = {n.strip() for line in text.splitlines()[1:] for n in line.split(",")}
    for name in (f"URI:fenced://node/{ordinal}", f"DNS:fenced-{ordinal}.fenced-peer",
                 f"DNS:fenced-{ordinal}.fenced-peer.fenced-ns.svc", "DNS:fenced", "IP Address:127.0.0.1"):
        assert name in names, f"node-{ordinal}.pem does not name {name}: {sorted(names)}"
print("the Secret of make-secret.sh matches the StatefulSet: ok")
PY

echo "== Prometheus alert rules and Grafana dashboard"
command -v promtool >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
}
promtool check rules deploy/prometheus/alerts.yml
promtool check config deploy/prometheus/prometheus.yml
# Each alert fires on the series it is written for, and not on a healthy cluster.
(cd deploy/prometheus && promtool test rules alerts.test.yml)
python3 - deploy/grafana/fenced.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
targets = [t for p in d["panels"] for t in p.get("targets", [])]
assert targets and all(t["expr"].strip() for t in targets), "every panel queries something"
assert all(p["datasource"]["uid"] == "${datasource}" for p in d["panels"] if p["type"] != "row")
print(f"deploy/grafana/fenced.json: {len(targets)} queries: ok")
PY
# That every metric these files name is one a node exports is checked
# against a running cluster in tests/tests/health_metrics.rs.

echo "== compose file"
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
"${compose[@]}" -f deploy/compose.yaml config -q
echo "deploy/compose.yaml: ok"
