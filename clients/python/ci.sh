#!/usr/bin/env bash
# Builds the Python client from the repository's proto/, installs it into a
# venv under target/, and runs its tests against real `fenced` nodes from
# target/debug (build them first: .ci/run does). Installs python3-venv with
# apt if the machine lacks it (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=target/python-venv
python=${PYTHON:-python3}
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3 python3-venv >/dev/null
  python=python3
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -r clients/python/requirements-ci.txt
# The build runs grpc_tools.protoc on proto/fenced/v1 (clients/python/setup.py);
# the pinned build requirements are already in the venv.
"${pip[@]}" install --no-build-isolation --force-reinstall --no-deps ./clients/python
cd clients/python
# About a minute; the bound only stops a hung test from holding CI.
FENCED_BIN="$PWD/../../target/debug/fenced" \
  timeout 600 ../../"$venv"/bin/python -m pytest -p no:cacheprovider -q tests
