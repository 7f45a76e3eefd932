#!/usr/bin/env bash
# Builds what a user installs, in target/release-artifacts/:
#   - fenced-VERSION-x86_64-linux.tar.gz: static `fenced`, `fencectl` and
#     `fenced-resource` (glibc, +crt-static: they run on any x86-64 Linux),
#     the systemd unit and its example settings, README and docs;
#   - fenced_VERSION-1_amd64.deb (cargo-deb): the same binaries in /usr/bin,
#     the unit in /lib/systemd/system (not enabled: a node needs its
#     /etc/fenced/fenced.env and certificates first, docs/DEPLOYING.md);
#   - SHA256SUMS of both, for `sha256sum -c`.
#
#   deploy/release.sh
#
# Installs cargo-deb (pinned) with cargo if it is missing. Reuses the static
# build of deploy/build-image.sh (same target directory and flags).
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
out=target/release-artifacts
bins=(fenced fencectl fenced-resource)
cargo_deb_version=3.8.0

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[[ -n "$version" ]] || { echo "release: no version in Cargo.toml" >&2; exit 1; }

echo "== static binaries ($target, release)"
RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --locked --target "$target" \
    -p fenced-server -p fencectl -p fenced-resource --bins
release_dir="target/$target/release"
for bin in "${bins[@]}"; do
    # A dynamically linked binary would not run where its libc differs.
    if ! file "$release_dir/$bin" | grep -q 'static'; then
        echo "release: $release_dir/$bin is not statically linked" >&2
        exit 1
    fi
done
# What the package takes (crates/fenced-server/Cargo.toml): the binaries
# stripped, and the unit as it installs it, with the binaries in /usr/bin.
mkdir -p "$release_dir/deb"
for bin in "${bins[@]}"; do
    install -m 0755 "$release_dir/$bin" "$release_dir/deb/$bin"
    strip "$release_dir/deb/$bin"
done
sed 's#/usr/local/bin/fenced#/usr/bin/fenced#' deploy/systemd/fenced.service \
    > "$release_dir/deb/fenced.service"

rm -rf "$out"
name="fenced-$version-x86_64-linux"
stage="$out/$name"
mkdir -p "$stage/bin" "$stage/systemd"
for bin in "${bins[@]}"; do
    install -m 0755 "$release_dir/$bin" "$stage/bin/$bin"
    strip "$stage/bin/$bin"
done
install -m 0644 deploy/systemd/fenced.service deploy/systemd/host1.env \
    deploy/systemd/policy.toml "$stage/systemd/"
cp -r README.md docs "$stage/"
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
rm -rf "$stage"

echo "== Debian package"
if ! cargo deb --version 2>/dev/null | grep -q "$cargo_deb_version"; then
    cargo install --locked cargo-deb --version "$cargo_deb_version"
fi
cargo deb -p fenced-server --no-build --target "$target" --output "$out"

(cd "$out" && sha256sum -- *.tar.gz *.deb > SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
ls -l "$out"
