"""Latency and throughput of the Python client: prints figures, asserts
nothing about them.

    python clients/python/bench.py                 # starts three nodes from target/debug
    python clients/python/bench.py --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

Each operation runs on its own resource (py-bench/<thread>/<i>): acquire,
renew, describe, release, timed one by one; then the same loop on --threads
threads sharing one client, for calls per second.
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

from fenced_client import Client, Granted


def timed(samples, f, *args, **kwargs):
    t = time.perf_counter()
    out = f(*args, **kwargs)
    samples.append(time.perf_counter() - t)
    return out


def loop(client: Client, prefix: str, n: int, samples):
    for i in range(n):
        r = f"{prefix}/{i}"
        g = timed(samples["acquire"], client.acquire, r, ttl=30)
        assert isinstance(g, Granted), g
        timed(samples["renew"], client.renew, r, g.owner_id, g.token, ttl=30)
        timed(samples["describe"], client.describe, r)
        timed(samples["release"], client.release, r, g.owner_id, g.token)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints")
    ap.add_argument("--n", type=int, default=300, help="rounds per thread")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()

    cluster = None
    if args.endpoints:
        endpoints = args.endpoints.split(",")
    else:
        sys.path.insert(0, str(Path(__file__).parent / "tests"))
        from conftest import Cluster

        cluster = Cluster(3).start()
        endpoints = cluster.endpoints
    try:
        with Client(endpoints, env=False) as client:
            ops = ("acquire", "renew", "describe", "release")
            samples = {k: [] for k in ops}
            loop(client, "py-bench/warm", 20, {k: [] for k in ops})
            loop(client, "py-bench/serial", args.n, samples)
            print(f"one caller, {args.n} rounds (ms):")
            for k in ops:
                s = samples[k]
                print(f"  {k:9} p50 {pct(s, 0.5):6.2f}  p99 {pct(s, 0.99):6.2f}  mean {statistics.mean(s) * 1000:6.2f}")

            shared = {k: [] for k in ops}
            lock = threading.Lock()

            def worker(t):
                mine = {k: [] for k in ops}
                loop(client, f"py-bench/par/{t}", args.n, mine)
                with lock:
                    for k in ops:
                        shared[k].extend(mine[k])

            threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            calls = sum(len(v) for v in shared.values())
            print(f"{args.threads} threads, one client: {calls / elapsed:.0f} calls/s "
                  f"({calls} calls in {elapsed:.1f} s); acquire p50 {pct(shared['acquire'], 0.5):.2f} ms, "
                  f"p99 {pct(shared['acquire'], 0.99):.2f} ms")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
