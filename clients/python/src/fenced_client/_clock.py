"""The clock leases are timed with.

CLOCK_BOOTTIME, not CLOCK_MONOTONIC (what time.monotonic() reads on Linux):
monotonic time stops while the host or VM is suspended, but the cluster's
time does not, so a lease timed with it would look valid after a suspend
longer than the lease. Boot time keeps counting through suspends. Where it
does not exist (not Linux) the monotonic clock is the fallback, and a lease
can then outlive its local deadline across a suspend: `SUSPEND_AWARE` says
which one is in use.
"""

import time
from typing import Callable


def _pick() -> "tuple[Callable[[], float], bool]":
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            time.clock_gettime(boottime)
            return (lambda: time.clock_gettime(boottime)), True
        except OSError:
            pass
    return time.monotonic, False


_read, SUSPEND_AWARE = _pick()


def now() -> float:
    """Seconds on the lease clock (boot time, else monotonic)."""
    return _read()
