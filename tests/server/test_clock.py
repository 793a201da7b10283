"""
Switching a reactor to monotonic time.
"""

from __future__ import annotations

import time

from twisted.internet.selectreactor import SelectReactor

from lockservice.server.clock import useMonotonicTime, wallMicros


def test_reactor_switches_to_monotonic_and_keeps_pending_delays() -> None:
    reactor = SelectReactor()
    try:
        call = reactor.callLater(10, lambda: None)
        cancelled = reactor.callLater(5, lambda: None)
        cancelled.cancel()
        useMonotonicTime(reactor)
        assert reactor.seconds is time.monotonic
        assert abs(call.getTime() - time.monotonic() - 10) < 0.5
        later = reactor.callLater(1, lambda: None)
        assert abs(later.getTime() - time.monotonic() - 1) < 0.5
        # Idempotent.
        useMonotonicTime(reactor)
        assert abs(call.getTime() - time.monotonic() - 10) < 0.5
        assert reactor.timeout() is not None and 0 < reactor.timeout() <= 1  # type: ignore[operator]
    finally:
        for c in reactor.getDelayedCalls():
            c.cancel()
        reactor._uninstallHandler() if hasattr(reactor, "_uninstallHandler") else None


def test_wall_micros_is_epoch_microseconds() -> None:
    assert abs(wallMicros() / 1e6 - time.time()) < 1
