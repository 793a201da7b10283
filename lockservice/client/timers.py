# -*- test-case-name: tests.client.test_client -*-
"""
A client's timers, all cancelled when the client closes: whatever still
waits on one is told why (L{Timers.whenClosed}) instead of waiting for ever.
"""

from __future__ import annotations

from typing import Callable, Optional, Set

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime


class Timers:
    """
    @ivar clock: the reactor's clock.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self._pending: Set[IDelayedCall] = set()
        self._closing: Set[Callable[[Exception], None]] = set()

    def later(self, delay: float, f: Callable[[], object]) -> IDelayedCall:
        """
        Call C{f()} after C{delay} seconds (at once when it is negative),
        unless cancelled or the client closes first.
        """
        def run() -> None:
            self._pending.discard(call)
            f()

        call = self.clock.callLater(max(delay, 0), run)
        self._pending.add(call)
        return call

    def cancel(self, call: Optional[IDelayedCall]) -> None:
        if call is not None:
            self._pending.discard(call)
            if call.active():
                call.cancel()

    def sleep(self, delay: float) -> "Deferred[None]":
        """
        Fires after C{delay} seconds, or fails with the client's closing
        error.
        """
        d: "Deferred[None]" = Deferred()

        def wake() -> None:
            self._closing.discard(d.errback)
            d.callback(None)

        self._closing.add(d.errback)
        self.later(delay, wake)
        return d

    def whenClosed(self, stop: Callable[[Exception], None]) -> None:
        """
        Call C{stop(error)} if the client closes before L{forget}C{(stop)}.
        """
        self._closing.add(stop)

    def forget(self, stop: Callable[[Exception], None]) -> None:
        self._closing.discard(stop)

    def close(self, error: Exception) -> None:
        """
        Cancel every timer, and tell whatever waits on one: C{error}.
        """
        for call in list(self._pending):
            if call.active():
                call.cancel()
        self._pending.clear()
        stopping, self._closing = self._closing, set()
        for stop in stopping:
            stop(error)
