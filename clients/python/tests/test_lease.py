"""The keeper: renews past the TTL, and stops the work when the lease is lost."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fenced_client import (
    Granted,
    LeaseLoss,
    LeaseLost,
    LeaseOptions,
    LossKind,
    LostReason,
    NotGranted,
    Released,
    clock_now,
)

from helpers import Partition


def test_keeper_keeps_the_lease_past_its_ttl(cluster, client, resource):
    with client.lock(resource, ttl=1.5) as lease:
        token = lease.token
        time.sleep(4.5)  # three TTLs
        lease.check()
        assert lease.held and not lease.lost.is_set()
        d = client.describe(resource)
        assert d.held and d.last_token == token
        # Another owner is still refused.
        with pytest.raises(NotGranted) as e:
            with cluster.client() as other:
                other.lock(resource, ttl=1.5)
        assert e.value.current_token == token
    # Released on exit, not lost.
    assert isinstance(lease.loss_reason, LeaseLoss)
    assert lease.loss_reason.kind == LossKind.RELEASED
    assert not client.describe(resource).held


def test_local_deadline_is_timed_from_the_send(client, resource):
    before = clock_now()
    with client.lock(resource, ttl=10) as lease:
        after = clock_now()
        # Deadline = send time + TTL - margin (a tenth): within the call's span.
        assert 9.0 - (after - before) - 0.05 <= lease.remaining() <= 9.0


def test_loss_by_deadline_stops_the_body_before_the_cluster_expires(cluster, resource):
    cut = Partition("/fenced.v1.Lock/Renew")
    lost_calls = []
    with cluster.client(interceptors=[cut]) as c, cluster.client() as observer:
        started = time.monotonic()
        with pytest.raises(LeaseLost) as e:
            with c.lock(resource, ttl=2.0, on_lost=lost_calls.append) as lease:
                cut.cut.set()  # no renewal reaches the cluster from now on
                while True:
                    lease.check()
                    time.sleep(0.02)
        stopped_after = time.monotonic() - started
        # Detected at the local deadline (TTL minus a tenth), not later.
        assert e.value.reason.kind == LossKind.DEADLINE_PASSED
        assert stopped_after < 2.0 + 0.5, stopped_after
        assert lost_calls == [lease] and lease.lost.is_set()
        assert cut.refused >= 1
        # The exit released it (the cluster still held it: its expiry is
        # later than the local deadline), so the next owner gets it now.
        g = observer.acquire(resource, ttl=5)
        assert isinstance(g, Granted) and g.token > lease.token


def test_loss_by_deadline_without_release_leaves_the_cluster_holding(cluster, resource):
    cut = Partition("/fenced.v1.Lock/")  # renew and release cut off alike
    with cluster.client(interceptors=[cut]) as c, cluster.client() as observer:
        lease = c.lock(resource, ttl=2.0)
        cut.cut.set()
        reason = lease.wait_lost(5)
        assert reason is not None and reason.kind == LossKind.DEADLINE_PASSED
        # The cluster's expiry is later than the local deadline: the lease
        # is still held there when the client gives up.
        d = observer.describe(resource)
        assert d.held and d.last_token == lease.token, d
        with pytest.raises(LeaseLost):
            lease.check()


def test_superseded_lease_is_refused_and_the_callback_runs(cluster, client, resource):
    fired = threading.Event()
    opts = LeaseOptions(renew_every=0.2)
    cut = Partition("/fenced.v1.Lock/Renew")
    with cluster.client(lease_options=opts, interceptors=[cut]) as c:
        with pytest.raises(LeaseLost) as e:
            with c.lock(resource, ttl=5, on_lost=lambda _: fired.set()) as lease:
                # Someone with the capability ends it and a newer owner
                # comes and goes, while the keeper's renewals are held back.
                # (Had the newer owner not finished, the cluster would say
                # RELEASED: this lease's own end is its latest news.)
                cut.cut.set()
                assert isinstance(client.release(resource, lease.owner_id, lease.token), Released)
                newer = client.acquire(resource, ttl=5)
                assert isinstance(newer, Granted)
                assert isinstance(client.release(resource, newer.owner_id, newer.token), Released)
                assert not lease.lost.is_set()
                cut.cut.clear()
                assert lease.lost.wait(3), "the keeper never noticed"
                with pytest.raises(LeaseLost):
                    lease.check()
        reason = e.value.reason
        assert reason.kind == LossKind.REFUSED
        assert reason.refusal.reason == LostReason.SUPERSEDED
        assert reason.refusal.current_token == newer.token
        assert fired.is_set()
        assert "superseded by token" in str(e.value)


def test_interrupt_stops_a_sleeping_body(cluster, resource):
    cut = Partition("/fenced.v1.Lock/Renew")
    with cluster.client(interceptors=[cut]) as c:
        started = time.monotonic()
        with pytest.raises(LeaseLost) as e:
            with c.lock(resource, ttl=1.5, interrupt=True):
                cut.cut.set()
                time.sleep(30)  # interrupted, not slept out
        assert time.monotonic() - started < 1.5 + 0.5
        assert e.value.reason.kind == LossKind.DEADLINE_PASSED
        # Caught `except Exception` in the body cannot swallow it either.
        cut.cut.clear()
        with pytest.raises(LeaseLost):
            with c.lock(resource + "/2", ttl=1.5, interrupt=True):
                cut.cut.set()
                try:
                    time.sleep(30)
                except Exception:  # noqa: BLE001 - the point of the test
                    pass
    # The handler is gone after the block.
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


WORKER = textwrap.dedent(
    """
    import sys, time
    from fenced_client import Client, LeaseLost

    client = Client(sys.argv[1].split(","), env=False)
    try:
        with client.lock(sys.argv[2], ttl=2.0, interrupt=True) as lease:
            print("granted", lease.token, flush=True)
            time.sleep(60)
    except LeaseLost as e:
        print("lost", e.reason.kind.name, flush=True)
        sys.exit(4)
    """
)


def test_a_paused_process_stops_its_work_on_resume(cluster, client, resource):
    """The stale-owner sequence: the holder is frozen past its lease, a new
    owner is granted, and the old one, resumed, stops at once."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, ",".join(cluster.endpoints), resource],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["granted"], (line, proc.stderr.read() if proc.poll() is not None else "")
        old_token = int(line[1])
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while True:
            g = client.acquire(resource, ttl=10)
            if isinstance(g, Granted):
                break
            assert time.monotonic() < deadline, "the frozen owner's lease never expired"
            time.sleep(0.1)
        assert g.token > old_token
        resumed = time.monotonic()
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 4, (out, err)
        assert out.split() == ["lost", "DEADLINE_PASSED"], (out, err)
        assert time.monotonic() - resumed < 3.0
        # The new owner's lease is untouched: the old one did not renew it away.
        d = client.describe(resource)
        assert d.held and d.last_token == g.token
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_a_closed_client_loses_its_leases(cluster, resource):
    c = cluster.client(lease_options=LeaseOptions(renew_every=0.2))
    lease = c.lock(resource, ttl=5)
    c.close()
    reason = lease.wait_lost(3)
    assert reason is not None and reason.kind == LossKind.FAILED, reason
    with pytest.raises(LeaseLost):
        lease.check()


def test_a_grant_after_waiting_is_timed_from_a_fresh_renewal(cluster, client, resource):
    holder = client.acquire(resource, ttl=10)
    got = {}

    def take():
        with cluster.client() as c:
            lease = c.lock(resource, ttl=2.0, wait=10)
            got["remaining"] = lease.remaining()
            got["token"] = lease.token
            lease.release()

    t = threading.Thread(target=take)
    t.start()
    deadline = time.monotonic() + 5
    while client.describe(resource).waiters == 0:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.05)
    time.sleep(1.5)  # most of the waiter's TTL, spent waiting
    client.release(resource, holder.owner_id, holder.token)
    t.join(10)
    assert got["token"] > holder.token
    # Timed from the renewal sent after the grant, not from the acquire sent
    # 1.5 s before: close to the whole TTL minus the margin is left.
    assert got["remaining"] > 1.5, got


def test_the_keeper_follows_a_new_leader():
    from conftest import Cluster

    c = Cluster(3)
    try:
        c.start()
        with c.client() as client:
            with client.lock("py/failover", ttl=3.0) as lease:
                leader = client.status().leader_id
                c.procs[leader].kill()
                c.procs[leader].wait()
                time.sleep(6.0)  # two TTLs without the old leader
                lease.check()
                d = client.describe("py/failover")
                assert d.held and d.last_token == lease.token
            assert not client.describe("py/failover").held
    finally:
        c.stop()
