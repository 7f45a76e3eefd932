"""A Python client for fenced: leases on named resources, each grant with a
fencing token, and a keeper that renews a lease and says at once when it is
lost.

    from fenced_client import Client

    client = Client(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])
    with client.lock("statement:account-1842:2026-07", ttl=30) as lease:
        for row in rows:
            lease.check()                   # raises LeaseLost once it is gone
            write(row, fencing_token=lease.token)

Expected refusals are values (``Held``, ``Ended``, ``Lost``, ``NotHolder``);
errors are exceptions derived from ``FencedError``.
"""

from ._clock import SUSPEND_AWARE
from ._clock import now as clock_now
from .client import DEV_ENDPOINTS, Client, bearer_token_from_env
from .errors import (
    AttemptEnded,
    EndpointError,
    FencedError,
    InvalidArgument,
    LeaseLost,
    NotGranted,
    PermissionDenied,
    ResourceExhausted,
    ServerError,
    TlsError,
    Unauthenticated,
    Unavailable,
)
from .lease import Lease, LeaseInterrupted, LeaseLoss, LeaseOptions, LossKind, LossReason
from .outcomes import (
    Compacted,
    Description,
    Ended,
    EventKind,
    FellBehind,
    Granted,
    Held,
    HistoryEntry,
    Lost,
    LostReason,
    NotHolder,
    Released,
    Renewed,
    TokenState,
    TokenValidation,
    WatchEvent,
)
from .watch import Watch

__all__ = [
    "AttemptEnded",
    "Client",
    "Compacted",
    "DEV_ENDPOINTS",
    "Description",
    "EndpointError",
    "Ended",
    "EventKind",
    "FellBehind",
    "FencedError",
    "Granted",
    "Held",
    "HistoryEntry",
    "InvalidArgument",
    "Lease",
    "LeaseInterrupted",
    "LeaseLoss",
    "LeaseLost",
    "LeaseOptions",
    "LossKind",
    "LossReason",
    "Lost",
    "LostReason",
    "NotGranted",
    "NotHolder",
    "PermissionDenied",
    "Released",
    "Renewed",
    "ResourceExhausted",
    "SUSPEND_AWARE",
    "ServerError",
    "TlsError",
    "TokenState",
    "TokenValidation",
    "Unauthenticated",
    "Unavailable",
    "Watch",
    "WatchEvent",
    "bearer_token_from_env",
    "clock_now",
]
