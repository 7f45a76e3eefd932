#!/usr/bin/env bash
# Safety testing of fenced under faults: real nodes in network namespaces,
# partitions, pauses, crashes and clock faults, checked histories.
#
#   jepsen/run.sh                 the short campaign (CI): partition, pause,
#                                 kill and clock profiles, 45 s each, and
#                                 membership, 60 s
#   jepsen/run.sh full [SEEDS]    the full campaign: every profile plus
#                                 "snapshots", "membership" and "all", 180 s each, for each
#                                 seed (default 1,2,3)
#   jepsen/run.sh canary NAME...  builds fenced with the canaries feature,
#                                 plants bug NAME in every node
#                                 (FENCED_CANARY) and expects the harness to
#                                 FAIL each run; NAME is one of
#                                 skip-lease-check anyone-release
#                                 local-describe wall-clock-expiry reuse-token
#                                 clock-from-last-stamp kv-skip-holder-check
#                                 floor-by-time skip-checksum
#                                 survive-storage-failure
#
# Needs root (ip netns, nft). Results: target/jepsen/<profile>-<seed>/
# (summary.txt always; history, nemesis log, node logs and the first
# counterexample when a run does not pass).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
JEPSEN=target/debug/fenced-jepsen

need() { command -v "$1" >/dev/null 2>&1; }
if ! need nft || ! need ip || [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 libfaketime >/dev/null
fi

cleanup() {
    [ -x "$JEPSEN" ] && "$JEPSEN" cleanup || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The same set as .ci/run's build (examples too: their dev-dependencies
# change the features of shared crates), so that nothing compiles there.
cargo build --locked --workspace --bins --examples

mode=${1:-quick}
case "$mode" in
quick)
    "$JEPSEN" run --profiles partition,pause,kill,clock --duration-s 45 --seeds 1
    "$JEPSEN" run --profiles membership --duration-s 60 --seeds 1
    "$JEPSEN" run --profiles disk --duration-s 40 --seeds 1
    ;;
full)
    "$JEPSEN" run --profiles partition,pause,kill,clock,snapshots,disk,membership,all --duration-s 180 --seeds "${2:-1,2,3}"
    ;;
canary)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 canary NAME..." >&2; exit 2; }
    mkdir -p target/jepsen/bin
    restore() {
        # Fresh: the real binaries are only copied back into place.
        cargo build --locked --workspace --bins --examples >/dev/null 2>&1 || true
        cleanup
    }
    trap restore EXIT
    # One build serves every canary: the bug is planted at start. The same
    # set as .ci/run's simulation canaries, so that CI builds it once.
    cargo build --locked -p fenced-server -p fenced-sim --bins \
        --features fenced-server/canaries,fenced-sim/canaries
    cp target/debug/fenced target/jepsen/bin/fenced-canaries
    for name in "$@"; do
        case "$name" in
        wall-clock-expiry) profile=clock ;;
        # A new leader's clock starts at the last entry's stamp: caught
        # after an idle period and a leader kill.
        reuse-token | clock-from-last-stamp) profile=kill ;;
        # Floors by time alone: a woken leader's late time moves the next
        # leader's clock ahead, caught by stale-leader-wakes.
        floor-by-time) profile=pause ;;
        # Late kv puts (after the lease ran out, or superseded) applied.
        skip-lease-check | anyone-release | local-describe | kv-skip-holder-check) profile=partition ;;
        # A damaged snapshot loaded as if whole: the disk profile's
        # damage is then not refused, and its coverage gate fails.
        skip-checksum) profile=damage ;;
        # A node that stays up after its disk filled: the disk profile's
        # full disk is then not stopped for, and its checker fails.
        survive-storage-failure) profile=full-disk ;;
        *) echo "unknown canary $name" >&2; exit 2 ;;
        esac
        echo "== canary $name: the harness must FAIL the nodes it is planted in"
        "$JEPSEN" run --profiles "$profile" --duration-s 30 --seeds 1 --expect-fail \
            --fenced-bin target/jepsen/bin/fenced-canaries --canary "$name" \
            --out "target/jepsen/canary-$name"
    done
    ;;
*)
    echo "usage: $0 [quick | full [SEEDS] | canary NAME...]" >&2
    echo "  canary NAME: skip-lease-check anyone-release local-describe wall-clock-expiry reuse-token clock-from-last-stamp kv-skip-holder-check floor-by-time skip-checksum survive-storage-failure" >&2
    exit 2
    ;;
esac
