"""Typed results. Expected refusals are values, not exceptions: "held by
another owner" and "lease lost" are normal concurrency."""

import enum
import uuid
from dataclasses import dataclass, field
from typing import Union


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
