"""A connection to a fenced cluster: every endpoint, retries on the next one."""

import ipaddress
import logging
import math
import os
import unicodedata
import random
import threading
import time
import uuid
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from . import _clock
from ._proto.fenced.v1 import cluster_pb2, cluster_pb2_grpc, lock_pb2, lock_pb2_grpc
from .errors import (
    AttemptEnded,
    EndpointError,
    FencedError,
    InvalidArgument,
    NotGranted,
    PermissionDenied,
    ResourceExhausted,
    ServerError,
    TlsError,
    Unauthenticated,
    Unavailable,
)
from .outcomes import (
    AcquireOutcome,
    Description,
    Ended,
    EventKind,
    Granted,
    Held,
    HistoryEntry,
    Lost,
    LostReason,
    NotHolder,
    Released,
    ReleaseOutcome,
    Renewed,
    RenewOutcome,
    TokenState,
    TokenValidation,
    owner_uuid,
    wall_time,
)

if TYPE_CHECKING:
    from .lease import Lease, LeaseOptions
    from .watch import Watch

log = logging.getLogger("fenced_client")

#: The default addresses of `fenced dev`.
DEV_ENDPOINTS = ("127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")

#: The longest one attempt may take (beyond a blocking acquire's wait) before
#: the call is retried on the next node: a node that lost touch with the
#: cluster must not hold a caller for the whole call budget.
ATTEMPT_TIMEOUT = 3.0

#: Pauses between attempts: 25 ms after the first failure, doubling up to
#: 100 ms, each with up to a quarter more as jitter (as the Rust client).
RETRY_BACKOFF_FIRST = 0.025
RETRY_BACKOFF_MAX = 0.1

# Codes worth another try, on this or another node.
_RETRIED = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}

# A channel that failed to connect tries again soon: the next node is tried
# meanwhile, and a restarted node should not wait out gRPC's default
# backoff (1 s growing to 120 s).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# Markers of a TLS handshake refused over certificates, in gRPC's messages.
_TLS_MARKERS = (
    "certificate_verify_failed",
    "certificate verify failed",
    "alert_certificate",
    "certificate_required",
    "bad_certificate",
    "unknown_ca",
    "peer did not return a certificate",
)

T = TypeVar("T")


def _millis(seconds: float, name: str) -> int:
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        raise InvalidArgument(f"{name}: must be a number of seconds >= 0, got {seconds!r}")
    return int(round(seconds * 1000))


def _read(path_or_bytes: Union[str, bytes, os.PathLike, None], what: str) -> Optional[bytes]:
    if path_or_bytes is None or isinstance(path_or_bytes, bytes):
        return path_or_bytes
    try:
        with open(path_or_bytes, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsError(f"{what} {path_or_bytes}: {e.strerror}") from e


def is_loopback(target: str) -> bool:
    """Whether ``target`` (``host:port``, ``[v6]:port``) names a loopback
    host: 127.0.0.0/8, ::1 or ``localhost``. Names are not looked up: one
    that merely resolves to loopback counts as remote."""
    if target.startswith("["):
        host = target[1:].split("]", 1)[0]
    else:
        host = target.rsplit(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token_from_env() -> Optional[str]:
    """The bearer token from FENCED_TOKEN, else the first line of the file
    named by FENCED_TOKEN_FILE (as fencectl reads them)."""
    token = os.environ.get("FENCED_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("FENCED_TOKEN_FILE", "").strip()
    if path:
        return _token_from_file(path)
    return None


def _token_from_file(path: Union[str, os.PathLike]) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().strip()
    except OSError as e:
        raise InvalidArgument(f"token file {path}: {e.strerror}") from e
    if not first:
        raise InvalidArgument(f"token file {path}: empty")
    return first


class _Endpoint:
    def __init__(self, name: str, channel: grpc.Channel):
        self.name = name
        self.channel = channel
        self.lock = lock_pb2_grpc.LockStub(channel)
        self.cluster = cluster_pb2_grpc.ClusterStub(channel)


class Client:
    """A connection to a fenced cluster. Thread-safe: share one per process.

    ``endpoints``: ``host:port`` (or ``http://``/``https://`` URLs) of any
    nodes, a list or one comma-separated string; default ``FENCED_ENDPOINTS``,
    else the three of ``fenced dev``. Each call goes to one endpoint and moves
    to the next on UNAVAILABLE (and on a timeout), with backoff, until
    ``call_timeout`` seconds have passed.

    TLS: ``ca`` (the CA that signed the nodes' certificates) turns it on;
    ``cert`` and ``key`` show a client certificate. Each is a path or PEM
    bytes. Authentication: ``token`` is sent as ``authorization: Bearer``;
    without it, ``token_file`` (its first line), else ``FENCED_TOKEN`` or
    ``FENCED_TOKEN_FILE`` unless ``env=False``.
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str], None] = None,
        *,
        ca: Union[str, bytes, os.PathLike, None] = None,
        cert: Union[str, bytes, os.PathLike, None] = None,
        key: Union[str, bytes, os.PathLike, None] = None,
        token: Optional[str] = None,
        token_file: Union[str, os.PathLike, None] = None,
        env: bool = True,
        call_timeout: float = 10.0,
        lease_options: "Optional[LeaseOptions]" = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (),
        job_label: Optional[str] = None,
    ):
        from .lease import LeaseOptions

        if job_label is None and env:
            job_label = os.environ.get("FENCED_JOB_LABEL") or None
        #: Sent with every acquire: what the job is, for people (the status
        #: page and describe show it beside the lease; it decides nothing).
        self.job_label = _check_job_label(job_label)

        if endpoints is None:
            endpoints = os.environ.get("FENCED_ENDPOINTS", "") if env else ""
            endpoints = endpoints or ",".join(DEV_ENDPOINTS)
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        if (cert is None) != (key is None):
            raise TlsError("a client certificate needs its key, and a key its certificate (cert and key)")
        if cert is not None and ca is None:
            raise TlsError("a client certificate is shown over TLS only: give the CA (ca) too")
        tls = ca is not None
        creds = None
        if tls:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(ca, "CA"),
                private_key=_read(key, "key"),
                certificate_chain=_read(cert, "certificate"),
            )
        if token is None and token_file is not None:
            token = _token_from_file(token_file)
        if token is None and env:
            token = bearer_token_from_env()
        self._metadata: Tuple[Tuple[str, str], ...] = ()
        if token is not None:
            token = token.strip()
            if not token or not token.isascii() or not token.isprintable():
                raise InvalidArgument("token: must be printable ASCII, not empty")
            self._metadata = (("authorization", f"Bearer {token}"),)

        scheme = "https" if tls else "http"
        self._endpoints: List[_Endpoint] = []
        for raw in endpoints:
            e = raw.strip()
            if not e:
                continue
            target = e
            if "://" in e:
                given, target = e.split("://", 1)
                if given != scheme:
                    hint = (
                        "only https:// endpoints with TLS (ca)"
                        if tls
                        else "only http:// endpoints (host:port) without TLS; https:// needs the CA (ca)"
                    )
                    raise EndpointError(f"endpoint {e}: {hint}")
            target = target.rstrip("/")
            if not target or ":" not in target:
                raise EndpointError(f"endpoint {e}: expected host:port")
            if self._metadata and not tls and not is_loopback(target):
                # Anyone on the path could read the token and act as its identity.
                raise EndpointError(
                    f"endpoint {e}: refusing to send a bearer token in plaintext to an "
                    "address that is not loopback: use https:// endpoints with TLS (ca), "
                    "or a loopback address (127.0.0.1, ::1, localhost)"
                )
            if creds is not None:
                channel = grpc.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
            else:
                channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
            if interceptors:
                channel = grpc.intercept_channel(channel, *interceptors)
            self._endpoints.append(_Endpoint(e, channel))
        if not self._endpoints:
            raise EndpointError("endpoints: no endpoint given")
        self._next = 0
        self._next_lock = threading.Lock()
        self.call_timeout = float(call_timeout)
        self.lease_options = lease_options or LeaseOptions()

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Closes every channel; calls in flight fail."""
        for e in self._endpoints:
            e.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def endpoints(self) -> List[str]:
        return [e.name for e in self._endpoints]

    # -- the retry loop ----------------------------------------------------

    def _with_retries(
        self,
        budget: float,
        attempt: Callable[[_Endpoint, float], T],
    ) -> Tuple[T, float]:
        """Calls ``attempt(endpoint, seconds_left)`` on endpoints in turn
        until one answers or ``budget`` runs out. Returns the answer and the
        moment (lease clock) the answered attempt was sent."""
        deadline = _clock.now() + budget
        backoff = RETRY_BACKOFF_FIRST
        last = "no attempt"
        n = len(self._endpoints)
        while True:
            with self._next_lock:
                i = self._next % n
            endpoint = self._endpoints[i]
            left = deadline - _clock.now()
            if left <= 0:
                raise Unavailable(last)
            sent = _clock.now()
            try:
                return attempt(endpoint, left), sent
            except grpc.RpcError as err:
                code, details = _status(err)
                _raise_unless_retried(code, details, endpoint.name)
                last = f"{endpoint.name}: {code.name}: {details}"
                log.debug("retrying on the next endpoint: %s", last)
                with self._next_lock:
                    if self._next % n == i:
                        self._next = i + 1
            pause = min(backoff * (1 + random.random() / 4), max(0.0, deadline - _clock.now()))
            time.sleep(pause)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX)

    def _unary(self, method: Callable, request, timeout: float):
        return method(request, timeout=max(timeout, 0.001), metadata=self._metadata)

    # -- calls -------------------------------------------------------------

    def acquire(
        self,
        resource: str,
        ttl: float,
        *,
        wait: float = 0.0,
        owner_id: Optional[uuid.UUID] = None,
    ) -> AcquireOutcome:
        """One acquire, without a keeper: a grant is yours to renew. ``ttl``
        and ``wait`` are seconds; with ``wait`` the server parks the request
        up to that long while the resource is held (first come, first
        served). ``owner_id`` names this attempt: a new UUID unless given.
        Every retry after an ambiguous failure (a lost reply, a node gone)
        sends the SAME owner id, so it gets the same grant and token, never a
        second one. Most code wants ``lock``, whose lease renews itself."""
        owner = owner_id if owner_id is not None else uuid.uuid4()
        if not isinstance(owner, uuid.UUID):
            raise InvalidArgument(f"owner_id: must be a uuid.UUID, got {type(owner).__name__}")
        ttl_ms = _millis(ttl, "ttl")
        wait_s = _millis(wait, "wait") / 1000
        name = resource.encode("utf-8")
        started = _clock.now()

        def attempt(e: _Endpoint, left: float):
            # A retry waits only for what is left of the caller's wait.
            wait_left = max(0.0, wait_s - (_clock.now() - started))
            req = lock_pb2.AcquireRequest(
                resource=name,
                owner_id=owner.bytes,
                ttl_ms=ttl_ms,
                wait_ms=int(wait_left * 1000),
                label=self.job_label or "",
            )
            return self._unary(e.lock.Acquire, req, min(left, wait_left + ATTEMPT_TIMEOUT))

        resp, sent = self._with_retries(self.call_timeout + wait_s, attempt)
        which = resp.WhichOneof("outcome")
        if which == "granted":
            g = resp.granted
            return Granted(
                resource=resource,
                owner_id=owner,
                token=g.token,
                expires_at_ms=g.expires_at_ms,
                ttl_ms=g.ttl_ms,
                cluster_time_ms=resp.cluster_time_ms,
                sent_at=sent,
                granted_at=wall_time(resp.wall_time_unix_ms),
            )
        if which == "held":
            return Held(resp.held.current_token, resp.held.remaining_ms, resp.cluster_time_ms)
        if which == "ended":
            return Ended(
                LostReason.from_wire(resp.ended.reason),
                resp.ended.current_token,
                resp.cluster_time_ms,
            )
        raise ServerError("acquire: empty response")

    def renew(
        self,
        resource: str,
        owner_id: uuid.UUID,
        token: int,
        ttl: float,
        *,
        budget: Optional[float] = None,
    ) -> RenewOutcome:
        """Extends the lease held with (``owner_id``, ``token``) to ``ttl``
        seconds from now; the token stays. ``budget``: seconds for the call,
        retries included (default the client's call timeout)."""
        req = lock_pb2.RenewRequest(
            resource=resource.encode("utf-8"),
            owner_id=owner_id.bytes,
            token=token,
            ttl_ms=_millis(ttl, "ttl"),
        )
        resp, sent = self._with_retries(
            self.call_timeout if budget is None else budget,
            lambda e, left: self._unary(e.lock.Renew, req, min(left, ATTEMPT_TIMEOUT)),
        )
        which = resp.WhichOneof("outcome")
        if which == "renewed":
            return Renewed(
                resp.renewed.expires_at_ms,
                resp.renewed.ttl_ms,
                resp.cluster_time_ms,
                sent,
                renewed_at=wall_time(resp.wall_time_unix_ms),
            )
        if which == "lost":
            return Lost(
                LostReason.from_wire(resp.lost.reason), resp.lost.current_token, resp.cluster_time_ms
            )
        raise ServerError("renew: empty response")

    def release(
        self,
        resource: str,
        owner_id: uuid.UUID,
        token: int,
        *,
        budget: Optional[float] = None,
    ) -> ReleaseOutcome:
        """Ends the lease held with (``owner_id``, ``token``). ``budget``:
        seconds for the call, retries included (default the call timeout)."""
        req = lock_pb2.ReleaseRequest(
            resource=resource.encode("utf-8"), owner_id=owner_id.bytes, token=token
        )
        resp, _ = self._with_retries(
            self.call_timeout if budget is None else budget,
            lambda e, left: self._unary(e.lock.Release, req, min(left, ATTEMPT_TIMEOUT)),
        )
        which = resp.WhichOneof("outcome")
        if which == "released":
            return Released(resp.cluster_time_ms, released_at=wall_time(resp.wall_time_unix_ms))
        if which == "not_holder":
            return NotHolder(
                LostReason.from_wire(resp.not_holder.reason),
                resp.not_holder.current_token,
                resp.cluster_time_ms,
            )
        raise ServerError("release: empty response")

    def describe(self, resource: str, *, allow_stale: bool = False) -> Description:
        """The state of ``resource``: linearizable unless ``allow_stale``."""
        req = lock_pb2.DescribeRequest(resource=resource.encode("utf-8"), allow_stale=allow_stale)
        resp, _ = self._with_retries(
            self.call_timeout,
            lambda e, left: self._unary(e.lock.Describe, req, min(left, ATTEMPT_TIMEOUT)),
        )
        return Description(
            resource=resource,
            last_token=resp.last_token,
            held=resp.held,
            remaining_ms=resp.remaining_ms,
            waiters=resp.waiters,
            cluster_time_ms=resp.cluster_time_ms,
            label=resp.label or None,
        )

    def status(self) -> cluster_pb2.StatusResponse:
        """The status of the first node that answers (leader, term, members)."""
        req = cluster_pb2.StatusRequest()
        resp, _ = self._with_retries(
            self.call_timeout,
            lambda e, left: self._unary(e.cluster.Status, req, min(left, ATTEMPT_TIMEOUT)),
        )
        return resp

    # -- observing tokens ----------------------------------------------------

    def validate_token(self, resource: str, token: int) -> TokenValidation:
        """Whether ``token`` is still the current lease of ``resource``
        (a linearizable read; needs the ``read`` role)."""
        req = lock_pb2.ValidateTokenRequest(resource=resource.encode("utf-8"), token=token)
        resp, _ = self._with_retries(
            self.call_timeout,
            lambda e, left: self._unary(e.lock.ValidateToken, req, min(left, ATTEMPT_TIMEOUT)),
        )
        return _validation(resource, token, resp)

    def validate_tokens(self, checks: Iterable[Tuple[str, int]]) -> List[TokenValidation]:
        """``validate_token`` for many (resource, token) pairs in one call,
        all answered at the same linearizable point, in the order given.
        The server bounds the count (default 256)."""
        pairs = list(checks)
        req = lock_pb2.ValidateTokensRequest(
            checks=[
                lock_pb2.ValidateTokenRequest(resource=r.encode("utf-8"), token=t)
                for r, t in pairs
            ]
        )
        resp, _ = self._with_retries(
            self.call_timeout,
            lambda e, left: self._unary(e.lock.ValidateTokens, req, min(left, ATTEMPT_TIMEOUT)),
        )
        if len(resp.results) != len(pairs):
            raise ServerError(
                f"validate_tokens: {len(resp.results)} results for {len(pairs)} checks"
            )
        return [_validation(r, t, v) for (r, t), v in zip(pairs, resp.results)]

    def history(self, resource: str, *, limit: int = 0) -> List[HistoryEntry]:
        """The last grants of ``resource``, newest first, and how each ended
        (``limit`` 0: all the server keeps)."""
        req = lock_pb2.HistoryRequest(resource=resource.encode("utf-8"), limit=limit)
        resp, _ = self._with_retries(
            self.call_timeout,
            lambda e, left: self._unary(e.lock.History, req, min(left, ATTEMPT_TIMEOUT)),
        )
        return [
            HistoryEntry(
                token=h.token,
                owner_id=owner_uuid(h.owner_id),
                granted_at_ms=h.granted_at_ms,
                ended_at_ms=h.ended_at_ms,
                ended=EventKind.from_wire(h.ended),
                granted_at=wall_time(h.granted_at_unix_ms),
                ended_at=wall_time(h.ended_at_unix_ms),
            )
            for h in resp.entries
        ]

    def watch(self, prefix: str = "", *, from_revision: int = 0, resume: bool = True) -> "Watch":
        """A stream of ownership events on resources whose name starts with
        ``prefix`` (empty: all), with revisions above ``from_revision`` (0:
        from now on). Returns once the stream has started, so no event after
        the return is missed; refusals (permission, bounds) are raised here.
        Iterate it; close it (or leave its ``with`` block) to stop. With ``resume`` (the default) a broken stream (the node went
        away, UNAVAILABLE) or a ``FellBehind`` is resumed on the next node
        from the last revision received, so no event is missed or repeated;
        a ``Compacted`` (events no longer kept: a gap) is yielded and ends
        the iteration."""
        from .watch import Watch

        w = Watch(self, prefix.encode("utf-8"), from_revision, resume)
        w._start()
        return w

    # -- leases with a keeper ----------------------------------------------

    def lock(
        self,
        resource: str,
        ttl: float,
        *,
        wait: float = 0.0,
        on_lost: "Optional[Callable[[Lease], None]]" = None,
        interrupt: bool = False,
        interrupt_signal: Optional[int] = None,
    ) -> "Lease":
        """Takes the lease, waiting on the server up to ``wait`` seconds
        while it is held, and returns it with a keeper renewing it in the
        background. Use it as ``with client.lock("r", ttl=30) as lease:``:
        the block's work stops when the lease is lost (see ``Lease``) and the
        lease is released on exit. Raises ``NotGranted`` when the wait ends
        first (nothing is left behind), ``AttemptEnded`` when the attempt's
        grant ended before its reply arrived.

        ``on_lost(lease)`` is called once, from the keeper's thread, when the
        lease is lost. ``interrupt=True`` also interrupts the main thread
        inside the ``with`` block (see ``Lease``)."""
        from .lease import Lease

        if interrupt and threading.current_thread() is not threading.main_thread():
            # Checked before acquiring, so that nothing is left held.
            raise ValueError("interrupt=True: only the main thread can be interrupted (signals)")
        outcome = self.acquire(resource, ttl, wait=wait)
        if isinstance(outcome, Held):
            raise NotGranted(resource, outcome.current_token, outcome.remaining_ms)
        if isinstance(outcome, Ended):
            # The owner id is fresh, so only a retry of this very attempt can
            # find it spent: it was granted and lost before the reply came.
            raise AttemptEnded(resource, outcome.reason.value)
        granted = outcome
        # A grant that came after waiting is timed from a request sent long
        # ago; one renewal now times it from a fresh request.
        margin = self.lease_options.safety_margin(ttl)
        if _clock.now() >= granted.sent_at + margin / 4:
            renewed = self.renew(resource, granted.owner_id, granted.token, ttl, budget=ttl)
            if isinstance(renewed, Lost):
                from .errors import LeaseLost
                from .lease import LeaseLoss

                raise LeaseLost(resource, granted.token, LeaseLoss.refused(renewed))
            granted = _with_sent(granted, renewed.sent_at)
        return Lease(
            self,
            granted,
            ttl,
            on_lost=on_lost,
            interrupt=interrupt,
            interrupt_signal=interrupt_signal,
        )

    def keep(self, granted: Granted, ttl: float, *, on_lost=None) -> "Lease":
        """Starts a keeper on a grant from ``acquire`` (timed from when that
        acquire was sent)."""
        from .lease import Lease

        return Lease(self, granted, ttl, on_lost=on_lost)


def _with_sent(g: Granted, sent: float) -> Granted:
    return Granted(
        resource=g.resource,
        owner_id=g.owner_id,
        token=g.token,
        expires_at_ms=g.expires_at_ms,
        ttl_ms=g.ttl_ms,
        cluster_time_ms=g.cluster_time_ms,
        sent_at=sent,
    )


def _validation(resource: str, token: int, v) -> TokenValidation:
    return TokenValidation(
        resource=resource,
        token=token,
        state=TokenState.from_wire(v.state),
        current_token=v.current_token,
        remaining_ms=v.remaining_ms,
        cluster_time_ms=v.cluster_time_ms,
    )


def _status(err: grpc.RpcError) -> Tuple[grpc.StatusCode, str]:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return code or grpc.StatusCode.UNKNOWN, details or ""


def _raise_unless_retried(code: grpc.StatusCode, details: str, endpoint: str) -> None:
    """Raises the error a status means, or returns when it is worth another
    try on the next endpoint."""
    if code == grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        if any(m in lowered for m in _TLS_MARKERS):
            raise TlsError(
                f"TLS handshake with {endpoint} failed: {details}; check the CA (ca), "
                "that the node's certificate names the host you connect to, and the "
                "client certificate (cert, key) if the cluster requires one"
            )
    if code in _RETRIED:
        return
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        raise InvalidArgument(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        raise Unauthenticated(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        raise PermissionDenied(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        raise ResourceExhausted(details)
    raise ServerError(f"{code.name}: {details}")


__all__ = ["Client", "DEV_ENDPOINTS", "bearer_token_from_env", "FencedError"]


#: The longest job label, in bytes of UTF-8 (the server's bound).
JOB_LABEL_MAX_BYTES = 64


def _check_job_label(label: Optional[str]) -> Optional[str]:
    """A job label as the server takes it: 1 to 64 bytes of UTF-8, no
    control characters; None for none."""
    if label is None:
        return None
    if not isinstance(label, str):
        raise InvalidArgument(f"job_label: must be a str, got {type(label).__name__}")
    size = len(label.encode("utf-8"))
    if not 1 <= size <= JOB_LABEL_MAX_BYTES:
        raise InvalidArgument(f"job_label: must be 1 to {JOB_LABEL_MAX_BYTES} bytes of UTF-8, got {size}")
    if any(unicodedata.category(c) == "Cc" for c in label):
        raise InvalidArgument("job_label: must not contain control characters")
    return label
