"""Acquire, renew, release and describe against a real three-node cluster."""

import time
import uuid

import pytest

from fenced_client import (
    Client,
    Ended,
    Granted,
    Held,
    InvalidArgument,
    Lost,
    LostReason,
    NotHolder,
    Released,
    Renewed,
    Unavailable,
)

from conftest import free_port
from helpers import DropReplies


def test_acquire_renew_release_describe(client, resource):
    g = client.acquire(resource, ttl=10)
    assert isinstance(g, Granted), g
    assert g.token >= 1 and g.ttl_ms == 10_000 and g.resource == resource
    assert g.expires_at_ms == g.cluster_time_ms + 10_000

    d = client.describe(resource)
    assert d.held and d.last_token == g.token and 0 < d.remaining_ms <= 10_000

    r = client.renew(resource, g.owner_id, g.token, ttl=20)
    assert isinstance(r, Renewed) and r.ttl_ms == 20_000
    assert client.describe(resource).remaining_ms > 10_000

    assert isinstance(client.release(resource, g.owner_id, g.token), Released)
    d = client.describe(resource)
    assert not d.held and d.last_token == g.token and d.remaining_ms == 0

    # The owner id named that one attempt: it is not granted again.
    again = client.acquire(resource, ttl=10, owner_id=g.owner_id)
    assert isinstance(again, Ended) and again.reason == LostReason.RELEASED
    # A new attempt gets a greater token.
    g2 = client.acquire(resource, ttl=10)
    assert isinstance(g2, Granted) and g2.token > g.token


def test_same_owner_id_gets_the_same_grant(client, resource):
    owner = uuid.uuid4()
    first = client.acquire(resource, ttl=10, owner_id=owner)
    second = client.acquire(resource, ttl=10, owner_id=owner)
    assert isinstance(first, Granted) and isinstance(second, Granted)
    assert second.token == first.token and second.owner_id == owner
    assert client.describe(resource).last_token == first.token


def test_lost_reply_is_retried_with_the_same_owner_id(cluster, resource):
    drop = DropReplies("/fenced.v1.Lock/Acquire")
    with cluster.client(interceptors=[drop]) as c:
        g = c.acquire(resource, ttl=10)
    assert isinstance(g, Granted)
    # The first reply was a grant that never reached the caller; the retry
    # sent the same owner id and got that very grant back.
    assert len(drop.dropped) == 1 and drop.dropped[0].WhichOneof("outcome") == "granted"
    assert len(drop.calls) == 2
    assert drop.calls[0].owner_id == drop.calls[1].owner_id == g.owner_id.bytes
    assert g.token == drop.dropped[0].granted.token
    with cluster.client() as c:
        assert c.describe(resource).last_token == g.token


def test_second_owner_is_held(client, resource):
    g = client.acquire(resource, ttl=10)
    h = client.acquire(resource, ttl=10)
    assert isinstance(h, Held), h
    assert h.current_token == g.token and 0 < h.remaining_ms <= 10_000
    # A blocking acquire that runs out of wait is Held too.
    started = time.monotonic()
    h = client.acquire(resource, ttl=10, wait=1.0)
    assert isinstance(h, Held) and time.monotonic() - started >= 0.9
    # Released: the next owner gets it.
    client.release(resource, g.owner_id, g.token)
    g2 = client.acquire(resource, ttl=10)
    assert isinstance(g2, Granted) and g2.token > g.token


def test_a_waiter_is_granted_on_release(cluster, client, resource):
    import threading

    g = client.acquire(resource, ttl=10)
    got = {}

    def wait_for_it():
        with cluster.client() as c:
            got["outcome"] = c.acquire(resource, ttl=10, wait=10)

    t = threading.Thread(target=wait_for_it)
    t.start()
    deadline = time.monotonic() + 5
    while client.describe(resource).waiters == 0:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.05)
    client.release(resource, g.owner_id, g.token)
    t.join(10)
    assert isinstance(got.get("outcome"), Granted) and got["outcome"].token > g.token


def test_stale_owner_cannot_renew_or_release(client, resource):
    g = client.acquire(resource, ttl=10)
    wrong = client.renew(resource, uuid.uuid4(), g.token, ttl=10)
    assert isinstance(wrong, Lost) and wrong.reason == LostReason.UNKNOWN
    not_holder = client.release(resource, uuid.uuid4(), g.token)
    assert isinstance(not_holder, NotHolder)
    assert client.describe(resource).held
    client.release(resource, g.owner_id, g.token)
    late = client.renew(resource, g.owner_id, g.token, ttl=10)
    assert isinstance(late, Lost) and late.reason == LostReason.RELEASED
    assert not client.describe(resource).held


def test_bad_input_names_the_field_and_the_bound(client, resource):
    with pytest.raises(InvalidArgument) as e:
        client.acquire(resource, ttl=0.5)
    assert e.value.field == "ttl_ms" and "1000" in str(e.value), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.acquire("", ttl=10)
    assert e.value.field == "resource", str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.acquire("x" * 201, ttl=10)
    assert e.value.field == "resource" and "200" in str(e.value), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.acquire(resource, ttl=-1)
    assert e.value.field == "ttl", str(e.value)


def test_a_dead_endpoint_is_skipped(cluster, resource):
    dead = f"127.0.0.1:{free_port()}"
    with cluster.client([dead] + cluster.endpoints) as c:
        g = c.acquire(resource, ttl=10)
        assert isinstance(g, Granted)
        assert c.describe(resource).last_token == g.token


def test_no_node_is_unavailable_within_the_call_timeout(resource):
    with Client([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], env=False, call_timeout=1.0) as c:
        started = time.monotonic()
        with pytest.raises(Unavailable) as e:
            c.acquire(resource, ttl=10)
        assert time.monotonic() - started < 3.0
        assert "127.0.0.1" in str(e.value)


def test_a_job_label_rides_with_the_lease_while_it_lives(cluster, client, resource):
    with cluster.client(job_label="statements 2026-07 #3") as labelled:
        g = labelled.acquire(resource, ttl=10)
        assert isinstance(g, Granted), g
        assert client.describe(resource).label == "statements 2026-07 #3"
        labelled.release(resource, g.owner_id, g.token)
    assert client.describe(resource).label is None


@pytest.mark.parametrize("bad", ["", "x" * 65, "a\x1b[2Jb", 7])
def test_a_bad_job_label_is_refused_naming_the_field(cluster, bad):
    with pytest.raises(InvalidArgument, match="job_label"):
        cluster.client(job_label=bad)
