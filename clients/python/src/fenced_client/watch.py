"""Watch: a server stream of ownership events, resumed across nodes."""

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Iterator, Optional, Union

import grpc

from . import _clock
from ._proto.fenced.v1 import lock_pb2
from .errors import FencedError, ServerError, Unavailable
from .outcomes import Compacted, EventKind, FellBehind, WatchEvent, owner_uuid, wall_time

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("fenced_client")

WatchItem = Union[WatchEvent, FellBehind, Compacted]

# What _advance returns once a stream has started, when asked to stop there.
_STARTED = object()


class Watch:
    """An iterator of ``WatchEvent`` (and, at its end, ``Compacted``, or
    ``FellBehind`` when ``resume`` is off). Made by ``Client.watch``.

    ``revision`` is the last revision received (or the one the stream
    started after): pass it as ``from_revision`` to resume elsewhere.
    ``close()`` ends it from any thread; a blocked ``next()`` then stops.
    """

    def __init__(self, client: "Client", prefix: bytes, from_revision: int, resume: bool):
        self._client = client
        self._prefix = prefix
        self._resume = resume
        self._lock = threading.Lock()
        self._call = None
        self._closed = False
        #: Set once the first stream has started (its first message came).
        self.started = threading.Event()
        self.revision = from_revision
        self._pending: Optional[WatchItem] = None
        self._index = 0

    def __iter__(self) -> Iterator[WatchItem]:
        return self

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _open(self, index: int):
        e = self._client._endpoints[index]
        req = lock_pb2.WatchRequest(prefix=self._prefix, from_revision=self.revision)
        call = e.lock.Watch(req, metadata=self._client._metadata)
        with self._lock:
            if self._closed:
                call.cancel()
                raise StopIteration
            self._call = call
        return call

    def _start(self) -> None:
        """Opens the stream and waits for its first message: events after
        this returns are not missed."""
        item = self._advance(until_started=True)
        if item is not _STARTED:
            self._pending = item

    def __next__(self) -> WatchItem:
        if self._pending is not None:
            item, self._pending = self._pending, None
            return item
        return self._advance(until_started=False)

    def _advance(self, until_started: bool):
        from .client import RETRY_BACKOFF_FIRST, RETRY_BACKOFF_MAX, _raise_unless_retried, _status

        n = len(self._client._endpoints)
        backoff = RETRY_BACKOFF_FIRST
        give_up = None  # set at the first failure since the last message
        last = "no attempt"
        while True:
            with self._lock:
                if self._closed:
                    raise StopIteration
                call = self._call
            if call is None:
                with self._client._next_lock:
                    self._index = self._client._next % n
                call = self._open(self._index)
            index = self._index
            try:
                msg = next(call)
            except StopIteration:
                # The server ended the stream without saying why (shutting
                # down): like a broken stream.
                failure = "the stream ended"
            except grpc.RpcError as err:
                with self._lock:
                    if self._closed:
                        raise StopIteration from None
                code, details = _status(err)
                try:
                    _raise_unless_retried(code, details, self._endpoint_name(index))
                except FencedError:
                    self.close()
                    raise
                failure = f"{code.name}: {details}"
            else:
                item = self._handle(msg)
                if item is None:
                    if until_started and self.started.is_set():
                        return _STARTED
                    continue
                return item
            # The stream broke.
            with self._lock:
                self._call = None
            last = f"{self._endpoint_name(index)}: {failure}"
            if not self._resume:
                self.close()
                raise Unavailable(f"watch: {last}")
            now = _clock.now()
            give_up = give_up if give_up is not None else now + self._client.call_timeout
            if now >= give_up:
                self.close()
                raise Unavailable(f"watch: no node kept a stream open: {last}")
            log.debug("watch broke (%s); resuming from revision %d", last, self.revision)
            with self._client._next_lock:
                self._client._next += 1
            time.sleep(backoff * (1 + random.random() / 4))
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX)

    def _endpoint_name(self, index: int) -> str:
        return self._client._endpoints[index].name

    def _handle(self, msg) -> Optional[WatchItem]:
        """The item for one message, or None when there is none to yield
        (a stream's start, or a FellBehind that is resumed)."""
        body = msg.WhichOneof("body")
        if body == "started":
            self.revision = msg.started.revision
            self.started.set()
            return None
        if body == "event":
            ev = msg.event
            self.revision = ev.revision
            return WatchEvent(
                revision=ev.revision,
                resource=ev.resource.decode("utf-8", errors="replace"),
                kind=EventKind.from_wire(ev.kind),
                token=ev.token,
                owner_id=owner_uuid(ev.owner_id),
                cluster_time_ms=ev.cluster_time_ms,
                time=wall_time(ev.wall_time_unix_ms),
            )
        if body == "fell_behind":
            behind = FellBehind(msg.fell_behind.last_sent_revision)
            self.revision = behind.last_sent_revision
            with self._lock:
                call, self._call = self._call, None
            if call is not None:
                call.cancel()
            if self._resume:
                log.info("watch fell behind; resuming from revision %d", self.revision)
                return None
            self.close()
            return behind
        if body == "compacted":
            self.close()
            return Compacted(msg.compacted.oldest_revision)
        raise ServerError(f"watch: unexpected message {body!r}")
