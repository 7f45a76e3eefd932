#!/usr/bin/env bash
# Builds the fenced container image with no base image to pull: compiles
# static binaries of `fenced` and `fencectl` (glibc, +crt-static) and copies
# them into a FROM-scratch image.
#
#   deploy/build-image.sh [IMAGE]      default IMAGE: fenced:latest
#
# The binaries land in target/x86_64-unknown-linux-gnu/release/ (kept between
# runs, so a rebuild only compiles what changed).
set -euo pipefail
cd "$(dirname "$0")/.."

image="${1:-${FENCED_IMAGE:-fenced:latest}}"
target=x86_64-unknown-linux-gnu
context=target/image-context

echo "== static binaries ($target, release)"
RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --locked --target "$target" -p fenced-server -p fencectl --bins

rm -rf "$context"
mkdir -p "$context/data"
for bin in fenced fencectl; do
    path="target/$target/release/$bin"
    # A dynamically linked binary would fail at start in an image with no libc.
    if ! file "$path" | grep -q 'static'; then
        echo "$path is not statically linked: $(file "$path")" >&2
        exit 1
    fi
    cp "$path" "$context/$bin"
    strip "$context/$bin"
done
cp deploy/Dockerfile "$context/Dockerfile"

echo "== docker build $image"
docker build --quiet -t "$image" "$context" >/dev/null
echo "built $image ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
