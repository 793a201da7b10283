# -*- test-case-name: tests.server.test_hangups -*-
"""
Connections that are not read, and whose peer may have gone away.

A connection the node stopped reading (backpressure: a client that sends
without reading) is not watched by the reactor, so its peer's reset goes
unseen until the node reads or writes it again; its queued acquires would
stay queued (holding the queue's room: C{too many waiters} for everybody
else) and could even be handed the key.  Two checks of its socket
(L{lockservice.internals.peerHungUp}) find such a peer:

  - before a hand-over to one of its waiters
    (L{lockservice.server.waiters.passGone}), so no grant goes to it;
  - L{HangUpSweep}, a bounded number of them per round, so its waiters
    are dropped soon even when its key is never released.

Connections being read are told by the reactor; they cost nothing here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional, Protocol

from lockservice.internals import peerHungUp

# A round of the sweep every SWEEP_INTERVAL seconds while connections are
# paused, checking at most SWEEP_BUDGET of them (one poll() system call
# each, a few microseconds), the longest unchecked first: 10,000 paused
# connections are all checked within 5 s, at a cost of a few ms per round.
SWEEP_INTERVAL = 0.5
SWEEP_BUDGET = 1000


class Unread(Protocol):
    """
    A client connection as the sweep sees it.

    @ivar gone: True once its peer is known to be gone.
    @ivar notRead: True while the node does not read it.
    """

    gone: bool
    notRead: bool

    def hungUp(self) -> bool:
        """
        Check the socket; when the peer went away, treat the connection as
        lost (its waiters withdrawn) and return True.
        """


class HangUpSweep:
    """
    The client connections not read right now, checked round-robin for a
    peer that went away.

    @ivar check: the socket check (L{peerHungUp}; tests inject another).
    """

    def __init__(self, clock: Any, interval: float = SWEEP_INTERVAL,
                 budget: int = SWEEP_BUDGET,
                 check: Callable[[Any], Optional[str]] = peerHungUp) -> None:
        self.clock = clock
        self.interval = interval
        self.budget = budget
        self.check = check
        # In the order they are due for a check (popped from the front).
        self._paused: "OrderedDict[Unread, None]" = OrderedDict()
        self._next: Any = None

    def __len__(self) -> int:
        return len(self._paused)

    def watch(self, conn: Unread, notRead: bool) -> None:
        """
        C{conn} stopped (C{notRead}) or started again being read.
        """
        if not notRead:
            self._paused.pop(conn, None)
            return
        self._paused[conn] = None
        if self._next is None:
            self._next = self.clock.callLater(self.interval, self.sweep)

    def forget(self, conn: Unread) -> None:
        self._paused.pop(conn, None)

    def sweep(self) -> None:
        """
        One round: check the C{budget} connections checked longest ago;
        the live ones go to the back of the line.
        """
        self._next = None
        paused = self._paused
        for _ in range(min(self.budget, len(paused))):
            conn, _ = paused.popitem(last=False)
            if conn.gone or not conn.notRead or conn.hungUp():
                continue
            paused[conn] = None
        if paused:
            self._next = self.clock.callLater(self.interval, self.sweep)

    def stop(self) -> None:
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = None
