"""What can go wrong with a call. Expected refusals ("held by another owner",
"lease lost", "not the holder") are not errors: they come back as outcome
values (see outcomes.py)."""

import re
from typing import Optional


class FencedError(Exception):
    """Base of every error this client raises."""

    #: Whether trying again later may succeed (the cluster was unreachable or
    #: busy), as opposed to a request that is wrong as it stands.
    transient = False


class InvalidArgument(FencedError):
    """The request was refused as malformed (gRPC INVALID_ARGUMENT). The
    server's message names the field and the bound, e.g. ``ttl_ms: 500 is
    below the minimum 1000``; ``field`` is that field (``None`` when the
    message does not start with one). Fix the request; do not retry it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
        m = re.match(r"([A-Za-z_][A-Za-z0-9_.\[\]]*): ", message)
        self.field: Optional[str] = m.group(1) if m else None


class Unauthenticated(FencedError):
    """The server did not accept the credentials: no token, or an unknown or
    revoked one."""


class PermissionDenied(FencedError):
    """The caller is known but not allowed this call; the message names the
    resource and the prefixes granted."""


class ResourceExhausted(FencedError):
    """A bound was reached (waiters per resource, pending proposals, live
    leases, per-identity limits); the message names the setting."""

    transient = True


class Unavailable(FencedError):
    """No node gave an answer before the call's deadline. For an acquire the
    outcome is unknown: retry with the SAME owner id."""

    transient = True


class TlsError(FencedError):
    """The TLS handshake failed (a certificate refused either way, a wrong
    CA). Not retried: the message says what to check."""


class EndpointError(FencedError):
    """An endpoint is not usable as given (empty list, a scheme that does not
    match the TLS settings)."""


class ServerError(FencedError):
    """Any other failure the server reported; the message has its status
    code."""


class LeaseLost(FencedError):
    """The lease was lost while its work ran (raised by ``Lease.check()``,
    and out of a ``with client.lock(...)`` block whose lease was lost)."""

    def __init__(self, resource: str, token: int, reason: "object"):
        super().__init__(f"lease on {resource} (token {token}) lost: {reason}")
        self.resource = resource
        self.token = token
        #: A ``LeaseLoss`` (see lease.py).
        self.reason = reason


class AttemptEnded(FencedError):
    """The acquisition attempt's lease ended before its grant reached this
    client (a retry after a lost reply came too late): nothing is held."""

    def __init__(self, resource: str, reason: str):
        super().__init__(
            f"acquire on {resource}: the attempt's lease already ended ({reason}); nothing is held"
        )
        self.resource = resource
        self.reason = reason


class NotGranted(FencedError):
    """``lock`` waited ``wait`` and the resource was still held."""

    def __init__(self, resource: str, current_token: int, remaining_ms: int):
        super().__init__(
            f"not granted within the wait: {resource} is held by token "
            f"{current_token} for {remaining_ms} ms more"
        )
        self.resource = resource
        self.current_token = current_token
        self.remaining_ms = remaining_ms
