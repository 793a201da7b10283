# -*- test-case-name: tests.client.test_client -*-
"""
Releases and renewals: idempotent requests, sent again on other
connections until one is answered or a deadline passes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Set, Tuple

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall

from lockservice.client.errors import LockRejected
from lockservice.client.pool import Pool, Slot
from lockservice.client.protocol import Fields
from lockservice.client.timers import Timers

RELEASE_RETRY_FOR = 5.0
RELEASE_RETRY_EVERY = 0.2
RENEW_RETRY_EVERY = 0.2
# Float sums of 0.2 drift; times closer than this are the same instant.
EPSILON = 1e-6


class GaveUp(Exception):
    """
    A retried request got no usable answer before its deadline.
    """


class Abandoned(Exception):
    """
    A retried request is no longer wanted (a renewal after a release).
    """


class Retried:
    """
    One idempotent request (C{R}, C{N}) sent at once, then again every
    C{every} seconds -- at start + k * every exactly, each time on a
    connection that is not already carrying a copy -- until an answer
    settles it, or until C{giveUpAt} (then L{GaveUp}).  A redirect (C{M
    op key host:port}) is followed at once; C{M op key *} and drops just
    wait for the next tick.

    An C{OK} answer settles at once; a C{STALE} one only when no other copy
    is still on its way (a retry may overtake the copy that did the work and
    come back C{STALE} first), or at C{giveUpAt}.
    """

    def __init__(self, timers: Timers, pool: Pool, op: bytes, key: bytes, line: bytes,
                 every: float, giveUpAt: float, wanted: Callable[[], bool]) -> None:
        self.timers = timers
        self.pool = pool
        self.op = op
        self.key = key
        self.line = line
        self.every = every
        self.giveUpAt = giveUpAt
        self.wanted = wanted
        self.result: "Deferred[Tuple[Fields, float]]" = Deferred()
        self.carrying: Set[int] = set()  # id() of slots with a copy on its way
        self.stale: Optional[Tuple[Fields, float]] = None
        self.problem = "no connection up"
        self.sends = 0
        self.started = 0.0
        self.tickCall: Optional[IDelayedCall] = None
        self.endCall: Optional[IDelayedCall] = None

    def start(self) -> "Deferred[Tuple[Fields, float]]":
        self.started = self.timers.clock.seconds()
        self.endCall = self.timers.later(self.giveUpAt - self.started, self._end)
        self.timers.whenClosed(self._finish)
        self._tick()
        return self.result

    def _finish(self, value: Any) -> None:
        self.timers.forget(self._finish)
        if self.result.called:
            return
        self.timers.cancel(self.tickCall)
        self.timers.cancel(self.endCall)
        if isinstance(value, Exception):
            self.result.errback(value)
        else:
            self.result.callback(value)

    def _tick(self) -> None:
        self.tickCall = None
        if self.result.called:
            return
        if not self.wanted():
            self._finish(Abandoned())
            return
        slot = self._freeSlot()
        if slot is not None:
            self._sendOn(slot)
        self.sends += 1
        at = self.started + self.sends * self.every
        if at < self.giveUpAt - EPSILON:
            self.tickCall = self.timers.later(at - self.timers.clock.seconds(), self._tick)

    def _end(self) -> None:
        self.endCall = None
        self._finish(self.stale if self.stale is not None else GaveUp(self.problem))

    def _freeSlot(self) -> Optional[Slot]:
        """
        The next connected slot (round-robin) not carrying a copy already.
        """
        for _ in range(len(self.pool.slots)):
            slot = self.pool.pick()
            if slot is None:
                return None
            if id(slot) not in self.carrying:
                return slot
        return None

    def _sendOn(self, slot: Slot) -> None:
        if self.result.called or not self.wanted():
            self._finish(Abandoned())
            return
        assert slot.protocol is not None
        sentAt = self.timers.clock.seconds()
        self.carrying.add(id(slot))
        d = slot.protocol.request(self.op, self.key, self.line)
        d.addCallbacks(lambda fields: self._answered(slot, fields, sentAt),
                       lambda failure: self._dropped(slot, failure))

    def _answered(self, slot: Slot, fields: Fields, sentAt: float) -> None:
        self.carrying.discard(id(slot))
        if fields[0] == b"M":
            target = fields[3] if len(fields) > 3 else b"*"
            if target == b"*":
                self.problem = "no active node (M *)"
                self._settleStale()
                return
            self.problem = f"redirected to {target.decode()}"
            slot.switchTo(target.decode()).addCallbacks(
                lambda _: self._sendOn(slot) if slot.up and not self.result.called else None,
                lambda f: None)
            return
        if fields[0] == b"E":
            self._finish(LockRejected(b" ".join(fields[3:]).decode("utf-8", "replace")))
            return
        if len(fields) >= 3 and fields[2] == b"STALE":
            self.stale = (fields, sentAt)
            self._settleStale()
            return
        self._finish((fields, sentAt))

    def _dropped(self, slot: Slot, failure: Any) -> None:
        self.carrying.discard(id(slot))
        self.problem = f"connection dropped ({failure.getErrorMessage()})"
        self._settleStale()

    def _settleStale(self) -> None:
        if self.stale is not None and not self.carrying:
            self._finish(self.stale)
