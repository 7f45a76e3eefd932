"""Leases that renew themselves and say, at once, when they are lost.

The loss rules are the Rust client's (crates/fenced-client/src/lease.rs):

- The local deadline is the moment the acquire or the last successful renew
  was SENT, plus the TTL, minus a safety margin, on a clock that counts
  suspend (CLOCK_BOOTTIME). It always falls before the cluster's expiry.
- A keeper thread renews every third of the TTL (±10% jitter). A transient
  failure (no node answered) is retried every 100 ms until the deadline. The
  lease is lost when the cluster refuses a renewal (expired, released,
  superseded), when the deadline passes without a successful renewal (the
  cluster unreachable, or this process paused or suspended), or when a
  renewal fails in a way retrying cannot fix.
- Loss is never silent: ``lease.lost`` (a threading.Event) is set, the
  ``on_lost`` callbacks run, a warning is logged, ``lease.check()`` raises
  ``LeaseLost``, and with ``interrupt=True`` the main thread is interrupted
  inside the ``with`` block.
"""

import enum
import logging
import random
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional

from . import _clock
from .errors import FencedError, LeaseLost
from .outcomes import Granted, Lost, LostReason, ReleaseOutcome, Renewed

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("fenced_client")

#: After a transient renewal failure, the next try comes this much later.
RETRY_RENEW_AFTER = 0.1

#: The keeper wakes at least this often, so that a suspend (during which its
#: wait, timed on CLOCK_MONOTONIC, stands still) is noticed soon after resume.
MAX_KEEPER_SLEEP = 1.0

#: How long leaving a ``with`` block over a lost lease waits for the keeper
#: to finish running the on_lost callbacks.
CALLBACK_WAIT = 5.0

#: The signal ``interrupt=True`` sends to the main thread unless told another.
DEFAULT_INTERRUPT_SIGNAL = signal.SIGUSR2


@dataclass(frozen=True)
class LeaseOptions:
    """How a keeper renews a lease and how early it gives up (seconds)."""

    #: How often to renew; default a third of the TTL.
    renew_every: Optional[float] = None
    #: Taken off the TTL for the local deadline; default a tenth of the TTL,
    #: at least 100 ms, at most the TTL. Covers clock-rate differences
    #: between this host and the cluster's leader.
    margin: Optional[float] = None
    #: ±10% on each interval, so that many clients do not renew in lockstep.
    jitter: bool = True

    def renew_interval(self, ttl: float) -> float:
        return self.renew_every if self.renew_every is not None else ttl / 3

    def safety_margin(self, ttl: float) -> float:
        m = self.margin if self.margin is not None else max(ttl / 10, 0.1)
        return min(m, ttl)

    def jittered(self, d: float) -> float:
        return d * (1 + 0.1 * random.uniform(-1, 1)) if self.jitter else d


class LossKind(enum.Enum):
    #: The cluster refused a renewal: expired, released or superseded.
    REFUSED = "refused"
    #: The local deadline passed without a successful renewal. The cluster's
    #: own expiry is later, so nobody else can hold the lease yet.
    DEADLINE_PASSED = "deadline passed"
    #: This client released it.
    RELEASED = "released"
    #: A renewal failed in a way retrying cannot fix.
    FAILED = "failed"


@dataclass(frozen=True)
class LeaseLoss:
    """Why a lease ended (the Rust client's ``LeaseLoss``). ``LostReason``
    is the cluster's refusal inside it, when there is one."""

    kind: LossKind
    #: REFUSED: the cluster's answer.
    refusal: Optional[Lost] = None
    #: FAILED: the error.
    detail: str = ""

    @classmethod
    def refused(cls, lost: Lost) -> "LeaseLoss":
        return cls(LossKind.REFUSED, refusal=lost)

    def __str__(self) -> str:
        if self.kind == LossKind.REFUSED and self.refusal is not None:
            if self.refusal.reason == LostReason.SUPERSEDED:
                return f"renewal refused: superseded by token {self.refusal.current_token}"
            return f"renewal refused: {self.refusal.reason.value}"
        if self.kind == LossKind.DEADLINE_PASSED:
            return "no successful renewal before the local deadline"
        if self.kind == LossKind.FAILED:
            return f"renewal failed: {self.detail}"
        return "released"


#: The earlier name of ``LeaseLoss``, kept so existing imports still work.
LossReason = LeaseLoss


class LeaseInterrupted(BaseException):
    """Raised in the main thread inside ``with client.lock(..., interrupt=True)``
    when the lease is lost; the block's exit turns it into ``LeaseLost``.
    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in
    the body does not swallow it."""


class Lease:
    """A lease on a resource, renewed by a keeper thread until it is
    released or lost.

    Carry ``lease.token`` with every write it protects. Stop the work when
    ``lease.lost`` is set, and call ``lease.check()`` right before a write:
    it raises ``LeaseLost`` as soon as the local deadline has passed, even
    before the keeper has run (for example just after the process was
    frozen). As a context manager (``with client.lock(...) as lease:``) it
    releases on exit, and raises ``LeaseLost`` out of the block if the lease
    was lost before the block ended (also when the body finished: its work
    was not all done under a valid lease). With ``interrupt=True`` (main
    thread only) a loss raises ``LeaseInterrupted`` in the main thread
    wherever the body is (a blocking ``time.sleep`` or socket read
    included), which the block's exit turns into ``LeaseLost``; it does so
    with a signal (SIGUSR2 unless ``interrupt_signal`` says otherwise) whose
    handler is installed for the block only, so pick a signal the program
    does not use itself. A body stuck inside C code that does not return to
    the interpreter is not interrupted: check ``lease.lost`` there.

    Outside a ``with`` block, call ``release()``: the keeper renews a lease
    that is never released until the process exits.
    """

    def __init__(
        self,
        client: "Client",
        granted: Granted,
        ttl: float,
        *,
        on_lost: Optional[Callable[["Lease"], None]] = None,
        interrupt: bool = False,
        interrupt_signal: Optional[int] = None,
    ):
        if interrupt and threading.current_thread() is not threading.main_thread():
            raise ValueError("interrupt=True: only the main thread can be interrupted (signals)")
        opts = client.lease_options
        self._client = client
        self.granted = granted
        self.resource = granted.resource
        self.owner_id = granted.owner_id
        self.token = granted.token
        self.ttl = float(ttl)
        self._opts = opts
        self._margin = opts.safety_margin(self.ttl)
        self._lock = threading.Lock()
        self._deadline = granted.sent_at + self.ttl - self._margin
        self._reason: Optional[LeaseLoss] = None
        #: Set when the lease is lost or released.
        self.lost = threading.Event()
        self._callbacks: List[Callable[["Lease"], None]] = [on_lost] if on_lost else []
        self._stop = threading.Event()
        self._interrupt = interrupt
        self._signum = interrupt_signal if interrupt_signal is not None else DEFAULT_INTERRUPT_SIGNAL
        self._sig_lock = threading.Lock()
        self._sig_active = False
        self._sig_sent = False
        self._prev_handler = None
        self._keeper = threading.Thread(
            target=self._keep, name=f"fenced-keeper {self.resource}", daemon=True
        )
        self._keeper.start()

    # -- what the work reads -----------------------------------------------

    @property
    def loss_reason(self) -> Optional[LeaseLoss]:
        """Why the lease ended; None while it is held."""
        return self._reason

    def remaining(self) -> float:
        """Seconds left before the local deadline (which falls before the
        cluster's expiry); 0 once it has passed."""
        return max(0.0, self._deadline - _clock.now())

    def check(self) -> None:
        """Returns while the lease is held by the local deadline; raises
        ``LeaseLost`` otherwise."""
        reason = self._current_loss()
        if reason is not None:
            raise LeaseLost(self.resource, self.token, reason)

    @property
    def held(self) -> bool:
        """Whether the lease is held by the local deadline (no exception)."""
        return self._current_loss() is None

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[LeaseLoss]:
        """Blocks until the lease is lost or released (or ``timeout``
        seconds pass: then None) and says why."""
        if self.lost.wait(timeout):
            return self._reason
        return None

    def on_lost(self, callback: Callable[["Lease"], None]) -> None:
        """Adds a callback run once when the lease is lost (not when it is
        released), from the thread that noticed (usually the keeper's). Runs
        at once if the lease is already lost."""
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
                return
            lost = self._reason.kind != LossKind.RELEASED
        if lost:
            self._run_callback(callback)

    # -- ending it -----------------------------------------------------------

    def release(self) -> ReleaseOutcome:
        """Stops renewing and releases the lease; returns what the cluster
        said (``Released`` or ``NotHolder``)."""
        self._stop.set()
        self._lose(LeaseLoss(LossKind.RELEASED))
        return self._client.release(self.resource, self.owner_id, self.token)

    def __enter__(self) -> "Lease":
        if self._interrupt:
            self._prev_handler = signal.signal(self._signum, self._on_signal)
            with self._sig_lock:
                self._sig_active = True
            if self._reason is not None and self._reason.kind != LossKind.RELEASED:
                self.__exit__(None, None, None)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        # First, before anything can raise: no interrupt from here on.
        with self._sig_lock:
            was_active = self._sig_active
            self._sig_active = False
        if was_active:
            signal.signal(self._signum, self._prev_handler)
        self._stop.set()
        reason = self._current_loss()
        if reason is None:
            self._lose(LeaseLoss(LossKind.RELEASED))
            try:
                outcome = self._client.release(self.resource, self.owner_id, self.token)
                log.debug("released %s token %d: %s", self.resource, self.token, outcome)
            except FencedError as e:
                # The work is done; the lease runs out at its TTL by itself.
                # The owner id only at debug: logs reach people the lease's
                # identity does not.
                log.warning(
                    "release of %s (token %d) failed: %s; it expires by its TTL",
                    self.resource, self.token, e,
                )
                log.debug("owner id of %s: %s", self.resource, self.owner_id)
            return False
        # The keeper returns once it has told of the loss: after this, the
        # on_lost callbacks it runs have run (bounded, should one hang).
        if self._keeper is not threading.current_thread():
            self._keeper.join(CALLBACK_WAIT)
        if reason.kind == LossKind.DEADLINE_PASSED:
            # The cluster may still hold it: releasing lets the next owner in
            # now rather than at the cluster's expiry, which is about a margin
            # away, so trying longer than that is pointless.
            try:
                self._client.release(
                    self.resource, self.owner_id, self.token, budget=max(0.5, self._margin)
                )
            except FencedError:
                pass
        if exc is None or isinstance(exc, LeaseInterrupted):
            raise LeaseLost(self.resource, self.token, reason) from exc
        return False  # LeaseLost from check(), or the body's own error

    # -- internals -----------------------------------------------------------

    def _current_loss(self) -> Optional[LeaseLoss]:
        """The loss, also when only the deadline says so and the keeper has
        not run yet (a process that was frozen sees it on its first look)."""
        if self._reason is None and _clock.now() >= self._deadline:
            self._lose(LeaseLoss(LossKind.DEADLINE_PASSED))
        return self._reason

    def _lose(self, reason: LeaseLoss) -> None:
        """Records the loss once, sets ``lost``, then tells everyone."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            callbacks = list(self._callbacks)
        self.lost.set()
        if reason.kind == LossKind.RELEASED:
            return
        log.warning(
            "lease lost: resource=%s token=%d: %s", self.resource, self.token, reason,
        )
        log.debug("lost lease's owner id: resource=%s owner=%s", self.resource, self.owner_id)
        self._interrupt_main()
        for cb in callbacks:
            self._run_callback(cb)

    def _run_callback(self, cb: Callable[["Lease"], None]) -> None:
        try:
            cb(self)
        except Exception:  # a callback's failure must not stop the others
            log.exception("on_lost callback failed for %s token %d", self.resource, self.token)

    def _interrupt_main(self) -> None:
        with self._sig_lock:
            if self._sig_active and not self._sig_sent:
                self._sig_sent = True
                main = threading.main_thread().ident
                if main is not None:
                    signal.pthread_kill(main, self._signum)

    def _on_signal(self, signum, frame) -> None:
        # Raise only inside the block, and not in the block's own exit.
        if (
            self._sig_active
            and self._reason is not None
            and self._reason.kind != LossKind.RELEASED
            and (frame is None or frame.f_code is not Lease.__exit__.__code__)
        ):
            raise LeaseInterrupted(str(self._reason))
        prev = self._prev_handler
        if callable(prev):
            prev(signum, frame)

    def _keep(self) -> None:
        """Renews at the interval; on a transient failure retries quickly
        until the deadline; gives up at the deadline or on a refusal."""
        every = self._opts.renew_interval(self.ttl)
        next_renew = self.granted.sent_at + self._opts.jittered(every)
        while True:
            until = min(next_renew, self._deadline)
            pause = min(max(0.0, until - _clock.now()), MAX_KEEPER_SLEEP)
            if self._stop.wait(pause):
                return
            # The deadline first: after a pause, never renew a lease that may
            # already belong to someone else.
            if self._current_loss() is not None:
                return
            if _clock.now() < next_renew:
                continue
            budget = self._deadline - _clock.now()
            try:
                outcome = self._client.renew(
                    self.resource, self.owner_id, self.token, self.ttl, budget=budget
                )
            except FencedError as e:
                if self._stop.is_set():
                    return
                if e.transient:
                    log.debug("renewal of %s failed; retrying: %s", self.resource, e)
                    next_renew = _clock.now() + RETRY_RENEW_AFTER
                    continue
                self._lose(LeaseLoss(LossKind.FAILED, detail=str(e)))
                return
            except Exception as e:  # e.g. the client was closed under the lease
                if not self._stop.is_set():
                    self._lose(LeaseLoss(LossKind.FAILED, detail=f"{type(e).__name__}: {e}"))
                return
            if self._stop.is_set():
                return
            if isinstance(outcome, Renewed):
                with self._lock:
                    self._deadline = max(
                        self._deadline, outcome.sent_at + self.ttl - self._margin
                    )
                next_renew = outcome.sent_at + self._opts.jittered(every)
                log.debug("lease renewed: resource=%s token=%d", self.resource, self.token)
            else:
                self._lose(LeaseLoss.refused(outcome))
                return
