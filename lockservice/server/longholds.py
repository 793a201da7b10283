# -*- test-case-name: tests.server.test_monitor -*-
"""
The monitor's long-hold watch (C{--warn-hold}): a grant still held after
the limit is logged once, counted and flagged for the pages.

Only the L{Monitor<lockservice.server.monitor.Monitor>} feeds it, and only
when a limit is set: without one a grant costs it nothing.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Iterable, Optional, Protocol, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger


class HeldKey(Protocol):
    """
    A held key's current grant as the monitor sees it (the table's holders).
    """

    token: int
    owner: Optional[str]
    grantedAt: float


class _Held:
    __slots__ = ("token", "owner", "grantedAt", "long")

    def __init__(self, token: int, owner: Optional[str], grantedAt: float) -> None:
        self.token = token
        self.owner = owner
        self.grantedAt = grantedAt
        self.long = False


class LongHolds:
    """
    The grants watched for one limit, and one timer for the first due.

    @ivar held: per grant, (key, token), its record: a shared key has
        several.  The monitor reads it (is anything watched?) on every
        release, so it is never replaced, only changed.
    @ivar count: how many grants have been flagged since start.
    @ivar current: flagged grants still held (so /status is O(1)).
    """

    def __init__(self, clock: IReactorTime, limit: float, log: Logger) -> None:
        """
        @param limit: seconds after which a grant still held is a long hold
            (C{math.inf} for none: the monitor then watches no grant).
        @param log: where a long hold is logged (the monitor's log).
        """
        self.clock = clock
        self.limit = limit
        self.log = log
        self.count = 0
        self.current = 0
        self.held: Dict[Tuple[bytes, int], _Held] = {}
        self._due: Deque[Tuple[float, bytes, int]] = deque()
        self._alarm: Optional[IDelayedCall] = None

    # Every grant is watched for the same limit, so deadlines come in
    # grant order: a FIFO (not a heap) and one timer for its head.

    def watch(self, key: bytes, token: int, owner: Optional[str], grantedAt: float) -> None:
        """
        Watch a grant from the time it was granted.  One learned late (a
        grant merged on a heal, granted before grants watched already)
        waits behind them: an entry is checked against its own deadline
        only once those before it are done, so it may be flagged late,
        never early.
        """
        self.held[(key, token)] = _Held(token, owner, grantedAt)
        # The record and the deadline in one call: with --warn-hold this
        # runs at every grant.
        self._due.append((grantedAt + self.limit, key, token))
        if len(self._due) > 2 * len(self.held) + 4096:
            # Released grants leave their entries behind; drop them so
            # memory follows the held keys, not the grant rate.
            self._due = deque(entry for entry in self._due
                              if (entry[1], entry[2]) in self.held)
        if self._alarm is None:
            self._arm()

    def watchAll(self, holders: Iterable[Tuple[bytes, HeldKey]]) -> None:
        """
        Watch the grants held now, oldest first (their deadlines in order).
        """
        for key, holder in sorted(holders, key=lambda item: item[1].grantedAt):
            self.watch(key, holder.token, holder.owner, holder.grantedAt)

    def _arm(self) -> None:
        if self._due:
            delay = max(0.0, self._due[0][0] - self.clock.seconds())
            self._alarm = self.clock.callLater(delay, self._check)

    def _check(self) -> None:
        self._alarm = None
        now = self.clock.seconds()
        due = self._due
        while due and due[0][0] <= now:
            _, key, token = due.popleft()
            held = self.held.get((key, token))
            if held is None or held.long:
                continue  # released (or handed over) in time
            held.long = True
            self.current += 1
            self.count += 1
            who = held.owner or "unknown"
            self.log.warn(
                "Long hold: {key} held by {who} (token {token}) for more than {limit} s",
                key=key.decode("utf-8", "replace"), who=who, token=token,
                limit=f"{self.limit:g}",
            )
        self._arm()

    def isLongHold(self, key: bytes, token: int) -> bool:
        held = self.held.get((key, token))
        return held is not None and held.long

    def forget(self, key: bytes, token: int) -> Optional[_Held]:
        """
        A grant ended: its record (None if it was not watched).
        """
        held = self.held.pop((key, token), None)
        if held is not None and held.long:
            self.current -= 1
        return held

    def clear(self) -> None:
        """
        Forget every grant (the node stopped being active).
        """
        self.held.clear()
        self.current = 0

    def stop(self) -> None:
        """
        Cancel the timer and forget the deadlines (the records stay).
        """
        if self._alarm is not None and self._alarm.active():
            self._alarm.cancel()
        self._alarm = None
        self._due.clear()
