# -*- test-case-name: tests.server.test_clock -*-
"""
Time sources.

Leases and waits must follow a monotonic clock (a wall-clock step must
never end or stretch a lease), but a
Twisted reactor schedules C{callLater} on C{reactor.seconds()}, which is the
wall clock.  L{useMonotonicTime} switches a reactor to C{time.monotonic} so
every timer, ours and Twisted's, ignores wall-clock steps.  Fencing tokens
still need the wall clock (microseconds since the epoch): L{wallMicros}.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from lockservice.internals import newTimedCalls, pendingTimedCalls


def wallMicros() -> int:
    """
    Microseconds since the epoch, from the wall clock (for fencing tokens).
    """
    return time.time_ns() // 1000


def useMonotonicTime(reactor: Any) -> None:
    """
    Make C{reactor.seconds()} (and therefore C{callLater}) monotonic.

    Calls already scheduled are moved to the new time base, so none fires
    early or late because of the switch.
    """
    if reactor.seconds is time.monotonic:
        return
    offset = time.monotonic() - reactor.seconds()
    pending = pendingTimedCalls(reactor)
    if pending is not None:
        calls = pending + newTimedCalls(reactor)
    else:
        calls = list(reactor.getDelayedCalls())
    for call in calls:
        call.time += offset
        call.seconds = time.monotonic
    if pending is not None:
        heapq.heapify(pending)
    reactor.seconds = time.monotonic
