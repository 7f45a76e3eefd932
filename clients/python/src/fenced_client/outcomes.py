"""Typed results. Expected refusals are values, not exceptions: "held by
another owner" and "lease lost" are normal concurrency."""

import datetime
import enum
import uuid
from dataclasses import dataclass, field
from typing import Optional, Union


def owner_uuid(raw: bytes) -> Optional[uuid.UUID]:
    """An owner id from the wire (16 bytes), None when absent."""
    return uuid.UUID(bytes=raw) if len(raw) == 16 else None


def wall_time(unix_ms: int) -> Optional[datetime.datetime]:
    """The leader's wall clock from the wire (ms since the Unix epoch) as an
    aware UTC datetime, None when unknown (0). For logs and audits only:
    never time a lease with it."""
    if unix_ms <= 0:
        return None
    return datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.timezone.utc)


class LostReason(enum.Enum):
    """Why a lease is gone (renew), why a release changed nothing, or how an
    attempt's lease ended (acquire)."""

    EXPIRED = "expired"
    RELEASED = "released"
    #: A later owner was granted the resource; ``current_token`` is the newest.
    SUPERSEDED = "superseded"
    #: No such lease: wrong owner id or token, or no longer remembered.
    UNKNOWN = "unknown"

    @classmethod
    def from_wire(cls, value: int) -> "LostReason":
        return {1: cls.EXPIRED, 2: cls.RELEASED, 3: cls.SUPERSEDED}.get(value, cls.UNKNOWN)


@dataclass(frozen=True)
class Granted:
    """The lease is yours: carry ``token`` with every write it protects.

    ``expires_at_ms`` is cluster time: never compare it with a local clock.
    ``sent_at`` is when the answered request was sent, on the lease clock
    (``fenced_client.clock_now()``): the local deadline is timed from it."""

    resource: str
    owner_id: uuid.UUID
    token: int
    expires_at_ms: int
    ttl_ms: int
    cluster_time_ms: int
    sent_at: float = field(repr=False, compare=False)
    #: The leader's wall clock at the grant (UTC), for logs and audits.
    granted_at: Optional[datetime.datetime] = None


@dataclass(frozen=True)
class Held:
    """Another owner holds the resource (or the wait ran out)."""

    current_token: int
    remaining_ms: int
    cluster_time_ms: int


@dataclass(frozen=True)
class Ended:
    """This owner id's lease on the resource already ended: owner ids are
    single-use per attempt, so nothing was granted. Start a new attempt."""

    reason: LostReason
    current_token: int
    cluster_time_ms: int


AcquireOutcome = Union[Granted, Held, Ended]


@dataclass(frozen=True)
class Renewed:
    """The lease runs on, same token."""

    expires_at_ms: int
    ttl_ms: int
    cluster_time_ms: int
    sent_at: float = field(repr=False, compare=False)
    #: The leader's wall clock at the renewal (UTC), for logs and audits.
    renewed_at: Optional[datetime.datetime] = None


@dataclass(frozen=True)
class Lost:
    """The lease is gone and was not revived: stop the work."""

    reason: LostReason
    current_token: int
    cluster_time_ms: int


RenewOutcome = Union[Renewed, Lost]


@dataclass(frozen=True)
class Released:
    """The lease is released (also the answer to a retried release)."""

    cluster_time_ms: int
    #: The leader's wall clock at the release (UTC), for logs and audits.
    released_at: Optional[datetime.datetime] = None


@dataclass(frozen=True)
class NotHolder:
    """The caller was not the holder; nothing changed."""

    reason: LostReason
    current_token: int
    cluster_time_ms: int


ReleaseOutcome = Union[Released, NotHolder]


@dataclass(frozen=True)
class Description:
    """The state of a resource."""

    resource: str
    #: The newest token issued for the resource; 0 if none is remembered.
    last_token: int
    #: Whether an unexpired lease is held now.
    held: bool
    remaining_ms: int
    waiters: int
    cluster_time_ms: int
    #: The job label the live lease's acquire gave, or None.
    label: Optional[str] = None


class TokenState(enum.Enum):
    """What the cluster says of a (resource, token) pair."""

    #: The token is the holder's and its lease has not ended.
    CURRENT = "current"
    #: A higher token was issued for the resource since.
    SUPERSEDED = "superseded"
    #: The token is the newest, but its lease ran out.
    EXPIRED = "expired"
    #: The token is the newest, but its lease was released.
    RELEASED = "released"
    #: Never issued for the resource, or the resource is not remembered.
    UNKNOWN = "unknown"

    @classmethod
    def from_wire(cls, value: int) -> "TokenState":
        return {
            1: cls.CURRENT,
            2: cls.SUPERSEDED,
            3: cls.EXPIRED,
            4: cls.RELEASED,
        }.get(value, cls.UNKNOWN)


@dataclass(frozen=True)
class TokenValidation:
    """The answer to a validate call, for one (resource, token) pair."""

    resource: str
    token: int
    state: TokenState
    #: The newest token issued for the resource; 0 if none is remembered.
    current_token: int
    #: Milliseconds left on the lease when CURRENT, else 0.
    remaining_ms: int
    cluster_time_ms: int

    @property
    def current(self) -> bool:
        return self.state == TokenState.CURRENT


class EventKind(enum.Enum):
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"

    @classmethod
    def from_wire(cls, value: int) -> "Optional[EventKind]":
        return {
            1: cls.GRANTED,
            2: cls.RELEASED,
            3: cls.EXPIRED,
            4: cls.SUPERSEDED,
        }.get(value)


@dataclass(frozen=True)
class WatchEvent:
    """An ownership event. ``revision`` grows by one per event across all
    resources and is the same on every node."""

    revision: int
    resource: str
    kind: Optional[EventKind]
    token: int
    owner_id: Optional[uuid.UUID]
    cluster_time_ms: int
    #: The leader's wall clock at the event (UTC), the same on every node.
    time: Optional[datetime.datetime] = None


@dataclass(frozen=True)
class FellBehind:
    """The watcher did not keep up and the server ended the stream; resuming
    from ``last_sent_revision`` misses nothing."""

    last_sent_revision: int


@dataclass(frozen=True)
class Compacted:
    """The events after the requested revision are no longer kept: there is
    a gap. Read the current state (describe) and watch again."""

    oldest_revision: int


@dataclass(frozen=True)
class HistoryEntry:
    """One grant of a resource and how it ended."""

    token: int
    owner_id: Optional[uuid.UUID]
    granted_at_ms: int
    #: 0 while the lease is live.
    ended_at_ms: int
    #: None while the lease is live.
    ended: Optional[EventKind]
    #: The leader's wall clock (UTC) at the grant and at the end (None while
    #: live), the same on every node: for audits.
    granted_at: Optional[datetime.datetime] = None
    ended_at: Optional[datetime.datetime] = None
