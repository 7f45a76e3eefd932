"""The watch stream's protocol cases that a real cluster rarely shows
(falling behind, compaction, a stream cut mid-way), against scripted gRPC
servers on loopback: what the client asks for when it resumes."""

import queue
import threading
from concurrent import futures

import grpc
import pytest

from fenced_client import (
    Client,
    Compacted,
    EventKind,
    FellBehind,
    PermissionDenied,
    Unavailable,
    WatchEvent,
)
from fenced_client._proto.fenced.v1 import lock_pb2, lock_pb2_grpc


def event(revision: int, token: int = 1) -> lock_pb2.WatchResponse:
    return lock_pb2.WatchResponse(
        event=lock_pb2.WatchEvent(
            revision=revision,
            resource=b"r/x",
            kind=1,
            token=token,
            owner_id=bytes(range(16)),
            cluster_time_ms=1000 + revision,
        )
    )


def started(revision: int) -> lock_pb2.WatchResponse:
    return lock_pb2.WatchResponse(started=lock_pb2.Started(revision=revision))


class Scripted(lock_pb2_grpc.LockServicer):
    """Answers each Watch with the next script: a list of messages, then an
    optional status to end with (an abort) or None (the stream stays open
    until the client goes)."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.requests = queue.Queue()

    def Watch(self, request, context):
        self.requests.put((request.prefix, request.from_revision))
        if not self.scripts:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no more scripts")
        messages, end = self.scripts.pop(0)
        for m in messages:
            yield m
        if end is not None:
            context.abort(*end)
        while context.is_active():
            threading.Event().wait(0.05)


@pytest.fixture
def servers():
    started_servers = []

    def start(*servicers):
        addrs = []
        for s in servicers:
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            lock_pb2_grpc.add_LockServicer_to_server(s, server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            started_servers.append(server)
            addrs.append(f"127.0.0.1:{port}")
        return addrs

    yield start
    for s in started_servers:
        s.stop(0)


def test_fell_behind_resumes_from_the_last_sent_revision(servers):
    s = Scripted(
        [
            ([started(4), event(5), lock_pb2.WatchResponse(fell_behind=lock_pb2.FellBehind(last_sent_revision=5))], None),
            ([started(5), event(6)], None),
        ]
    )
    with Client(servers(s), env=False) as c, c.watch("r/", from_revision=4) as w:
        first, second = next(w), next(w)
    assert isinstance(first, WatchEvent) and first.revision == 5
    assert first.kind == EventKind.GRANTED and first.resource == "r/x"
    assert str(first.owner_id) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert second.revision == 6
    assert [s.requests.get_nowait() for _ in range(2)] == [(b"r/", 4), (b"r/", 5)]


def test_fell_behind_without_resume_is_the_last_item(servers):
    s = Scripted([([started(0), event(1), lock_pb2.WatchResponse(fell_behind=lock_pb2.FellBehind(last_sent_revision=1))], None)])
    with Client(servers(s), env=False) as c:
        items = list(c.watch("", resume=False))
    assert [type(i) for i in items] == [WatchEvent, FellBehind]
    assert items[1].last_sent_revision == 1


def test_compacted_is_the_last_item(servers):
    s = Scripted([([lock_pb2.WatchResponse(compacted=lock_pb2.Compacted(oldest_revision=40))], None)])
    with Client(servers(s), env=False) as c:
        items = list(c.watch("", from_revision=3))
    assert items == [Compacted(oldest_revision=40)]


def test_a_broken_stream_resumes_on_the_next_node_from_the_last_revision(servers):
    a = Scripted([([started(9), event(10), event(11)], (grpc.StatusCode.UNAVAILABLE, "node stopping"))])
    b = Scripted([([started(11), event(12)], None)])
    with Client(servers(a, b), env=False) as c, c.watch("r/", from_revision=9) as w:
        revisions = [next(w).revision for _ in range(3)]
    assert revisions == [10, 11, 12]
    assert a.requests.get_nowait() == (b"r/", 9)
    assert b.requests.get_nowait() == (b"r/", 11)


def test_a_refusal_is_raised_not_retried(servers):
    s = Scripted([([], (grpc.StatusCode.PERMISSION_DENIED, "watch on r/: not granted"))])
    with Client(servers(s), env=False) as c:
        with pytest.raises(PermissionDenied):
            next(iter(c.watch("r/")))
    assert s.requests.qsize() == 1


def test_no_node_gives_up_after_the_call_timeout(servers):
    s = Scripted([])  # every stream is refused UNAVAILABLE
    with Client(servers(s), env=False, call_timeout=0.5) as c:
        with pytest.raises(Unavailable):
            next(iter(c.watch("")))
    assert s.requests.qsize() >= 2


def test_close_ends_a_blocked_iteration(servers):
    s = Scripted([([started(0)], None)])
    out = []
    with Client(servers(s), env=False) as c:
        w = c.watch("")
        t = threading.Thread(target=lambda: out.extend(w))
        t.start()
        assert w.started.wait(5)
        w.close()
        t.join(5)
        assert not t.is_alive() and out == []
