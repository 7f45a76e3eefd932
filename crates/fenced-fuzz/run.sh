#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 30) from its
# seeds, or only TARGET; exits non-zero on the first crash or failed
# assertion, its input saved under crates/fenced-fuzz/artifacts/. .ci/run
# calls it. One target for an hour: crates/fenced-fuzz/run.sh 3600 peer_frame
# Usage: run.sh [SECONDS] [TARGET]
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-30}"
only="${2:-}"
# Pinned, like every tool the checks install.
version=0.13.2
if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $version" ]]; then
    echo "-- installing cargo-fuzz $version"
    cargo install cargo-fuzz --version "$version" --locked --quiet
fi

# The only toolchain is stable: RUSTC_BOOTSTRAP lets it take the -Z flags
# cargo-fuzz passes (the address sanitizer among them).
export RUSTC_BOOTSTRAP=1
dir=(--fuzz-dir crates/fenced-fuzz)
# The same flags to build and to run, or the run builds again. 16 codegen
# units: one unit makes fenced-server alone take minutes to build.
build=(--sanitizer address --codegen-units 16)
# FENCED_FUZZ_DEV=1 (.ci/run): unoptimised, built in less than half the
# time, each second fuzzing about a tenth as many inputs.
if [[ -n "${FENCED_FUZZ_DEV:-}" ]]; then
    build+=(--dev)
fi
# The lock file is committed; cargo-fuzz has no --locked to check it.
cargo metadata --locked --format-version 1 --manifest-path crates/fenced-fuzz/Cargo.toml >/dev/null
cargo fuzz build "${dir[@]}" "${build[@]}"
for target in ${only:-$(cargo fuzz list "${dir[@]}")}; do
    echo "-- fuzz $target: ${seconds} s"
    mkdir -p "crates/fenced-fuzz/corpus/$target"
    log="crates/fenced-fuzz/target/fuzz-$target.log"
    # New inputs go to corpus/ (not committed); seeds/ is only read.
    if ! cargo fuzz run "${dir[@]}" "${build[@]}" "$target" \
        "crates/fenced-fuzz/corpus/$target" "crates/fenced-fuzz/seeds/$target" \
        -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 80 "$log"
        echo "fuzz target $target failed; the input is in crates/fenced-fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | tr '\n' ' ' || true
    echo
done
