"""ValidateToken(s), History and Watch against real nodes."""

import datetime
import queue
import signal
import threading
import time

import pytest

from fenced_client import (
    EventKind,
    InvalidArgument,
    TokenState,
    WatchEvent,
)

from conftest import Cluster


def test_validate_token_follows_the_lease(client, resource):
    g = client.acquire(resource, ttl=10)
    v = client.validate_token(resource, g.token)
    assert v.current and v.state == TokenState.CURRENT
    assert v.current_token == g.token and 0 < v.remaining_ms <= 10_000
    assert client.validate_token(resource, g.token + 1000).state == TokenState.UNKNOWN

    client.release(resource, g.owner_id, g.token)
    v = client.validate_token(resource, g.token)
    assert v.state == TokenState.RELEASED and v.remaining_ms == 0

    g2 = client.acquire(resource, ttl=1)
    v = client.validate_token(resource, g.token)
    assert v.state == TokenState.SUPERSEDED and v.current_token == g2.token
    deadline = time.monotonic() + 5
    while client.validate_token(resource, g2.token).state == TokenState.CURRENT:
        assert time.monotonic() < deadline, "a 1 s lease stayed current"
        time.sleep(0.1)
    assert client.validate_token(resource, g2.token).state == TokenState.EXPIRED
    assert client.validate_token(resource + "/never", 1).state == TokenState.UNKNOWN


def test_validate_tokens_answers_in_order(client, resource):
    a = client.acquire(resource + "/a", ttl=10)
    b = client.acquire(resource + "/b", ttl=10)
    client.release(resource + "/b", b.owner_id, b.token)
    checks = [(resource + "/b", b.token), (resource + "/a", a.token), (resource + "/c", 1)]
    results = client.validate_tokens(checks)
    assert [(r.resource, r.token) for r in results] == checks
    assert [r.state for r in results] == [TokenState.RELEASED, TokenState.CURRENT, TokenState.UNKNOWN]
    assert len({r.cluster_time_ms for r in results}) == 1


def test_validate_tokens_is_bounded(client, resource):
    with pytest.raises(InvalidArgument) as e:
        client.validate_tokens([(resource, 1)] * 257)
    assert e.value.field == "checks" and "256" in str(e.value), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.validate_tokens([])
    assert e.value.field == "checks", str(e.value)


def test_history_is_newest_first(client, resource):
    g1 = client.acquire(resource, ttl=10)
    client.release(resource, g1.owner_id, g1.token)
    g2 = client.acquire(resource, ttl=10)
    h = client.history(resource)
    assert [e.token for e in h] == [g2.token, g1.token]
    assert h[0].ended is None and h[0].ended_at_ms == 0 and h[0].owner_id == g2.owner_id
    assert h[1].ended == EventKind.RELEASED and h[1].ended_at_ms >= h[1].granted_at_ms
    assert [e.token for e in client.history(resource, limit=1)] == [g2.token]


def test_grants_and_ends_carry_dates_for_audits(cluster, client, resource):
    """The leader's wall clock, as aware UTC datetimes: the grant's answer,
    its history entry and its watch event say the same date."""
    now = datetime.datetime.now(datetime.timezone.utc)
    g = client.acquire(resource, ttl=10)
    assert g.granted_at is not None and g.granted_at.tzinfo == datetime.timezone.utc
    assert abs((g.granted_at - now).total_seconds()) < 5, (g.granted_at, now)
    r = client.renew(resource, g.owner_id, g.token, ttl=10)
    assert r.renewed_at is not None and r.renewed_at >= g.granted_at, (r, g)
    released = client.release(resource, g.owner_id, g.token)
    assert released.released_at is not None and released.released_at >= r.renewed_at
    h = client.history(resource)[0]
    assert h.granted_at == g.granted_at
    assert h.ended_at == released.released_at
    assert h.ended_at is not None and h.ended_at >= h.granted_at
    q: "queue.Queue" = queue.Queue()
    with cluster.client() as wc, wc.watch(resource, from_revision=1) as w:
        threading.Thread(target=_collect, args=(w, q), daemon=True).start()
        while True:
            e = _next(q, "the grant's event")
            if e.resource == resource and e.token == g.token:
                break
    assert e.time == g.granted_at, (e, g)


def _collect(watch, into: "queue.Queue"):
    for item in watch:
        into.put(item)


def _next(q: "queue.Queue", what: str, timeout: float = 10.0):
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no {what} within {timeout} s") from None


def test_watch_sees_grants_and_releases_under_its_prefix(cluster, client, resource):
    q: "queue.Queue" = queue.Queue()
    with cluster.client() as wc, wc.watch(resource + "/") as w:
        t = threading.Thread(target=_collect, args=(w, q), daemon=True)
        t.start()
        assert w.started.wait(10), "the watch never started"
        client.acquire(resource + "-other", ttl=10)  # not under the prefix
        g = client.acquire(resource + "/x", ttl=10)
        client.release(resource + "/x", g.owner_id, g.token)
        granted = _next(q, "grant")
        released = _next(q, "release")
        assert isinstance(granted, WatchEvent) and granted.kind == EventKind.GRANTED
        assert granted.resource == resource + "/x" and granted.token == g.token
        assert granted.owner_id == g.owner_id
        assert released.kind == EventKind.RELEASED and released.token == g.token
        assert released.revision > granted.revision
        first = granted.revision
    t.join(5)
    assert not t.is_alive(), "close() did not end the iteration"
    assert q.empty(), list(q.queue)

    # From a revision: the events after it again, then new ones.
    q2: "queue.Queue" = queue.Queue()
    with cluster.client() as wc, wc.watch(resource + "/", from_revision=first - 1) as w:
        threading.Thread(target=_collect, args=(w, q2), daemon=True).start()
        again = [_next(q2, "replayed grant"), _next(q2, "replayed release")]
        assert [(e.revision, e.kind) for e in again] == [
            (granted.revision, EventKind.GRANTED),
            (released.revision, EventKind.RELEASED),
        ]


def test_an_event_right_after_watch_returns_is_seen(cluster, client, resource):
    with cluster.client() as wc, wc.watch(resource) as w:
        g = client.acquire(resource, ttl=10)
        e = next(w)
        assert e.kind == EventKind.GRANTED and e.token == g.token and e.revision > 0


def test_watch_resumes_on_another_node_without_a_gap():
    c = Cluster(3)
    try:
        c.start()
        q: "queue.Queue" = queue.Queue()
        with c.client() as writer, c.client() as wc:
            w = wc.watch("r/")
            threading.Thread(target=_collect, args=(w, q), daemon=True).start()
            assert w.started.wait(10)
            g1 = writer.acquire("r/1", ttl=10)
            e1 = _next(q, "first grant")
            assert e1.token == g1.token
            # The stream's node (the first endpoint) dies; events go on.
            c.procs[1].send_signal(signal.SIGKILL)
            c.procs[1].wait()
            g2 = writer.acquire("r/2", ttl=10)
            e2 = _next(q, "grant after the node died", 20)
            assert isinstance(e2, WatchEvent) and e2.token == g2.token, e2
            assert e2.revision > e1.revision
            w.close()
    finally:
        c.stop()


def test_watchers_per_node_are_bounded():
    from fenced_client import ResourceExhausted

    c = Cluster(3, env={"FENCED_MAX_WATCHERS": "1"})
    try:
        c.start()
        with c.client(c.endpoints[:1]) as wc:
            with wc.watch("") as first:
                assert first.started.is_set()  # watch() returns once it has
                with pytest.raises(ResourceExhausted) as e:
                    wc.watch("")
                assert "max_watchers (1)" in str(e.value), str(e.value)
    finally:
        c.stop()
