# -*- test-case-name: tests.test_monitor -*-
"""
The monitor's deadlock checks: the wait-for graph over the lock table,
searched on a later reactor turn, a budget of edges at a time, and the
cycles it found as the pages list them.

Deadlocks through shared keys (read locks, semaphores) are found from the
table's holders and queues (L{SharedTable}), read only when a check runs.
The L{Monitor<lockservice.server.monitor.Monitor>} keeps the graph current
on the hot path and asks for a check (L{DeadlockChecks.soon}).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.core.table import READ as TABLE_READ
from lockservice.core.table import READ_WRITE
from lockservice.core.waitfor import READ, WRITE, SharedView, WaitForGraph

# Edges of the wait-for graph visited per reactor turn (about 2 ms).
CHECK_BUDGET = 5000
# Cycles listed on /status and the dashboard (the rest are counted).
DEADLOCKS_LISTED = 20


class SharedTable(Protocol):
    """
    What the monitor reads of the lock table for shared keys (only when a
    deadlock is checked, never on a request's path).
    """

    def isShared(self, key: bytes) -> bool: ...

    def kindOf(self, key: bytes) -> Optional[int]: ...

    def holderCount(self, key: bytes) -> int: ...

    def firstGrants(self, key: bytes, count: int
                    ) -> List[Tuple[int, float, float, object, int]]: ...

    def queueOf(self, key: bytes) -> Any: ...


_SHARED_VIEW = ("isShared", "kindOf", "holderCount", "firstGrants", "queueOf")


def _name(conn: Any) -> str:
    return str(getattr(conn, "name", conn))


class DeadlockChecks:
    """
    @ivar graph: the wait-for graph (the monitor changes it, pages read
        its C{cycles}).
    @ivar pending: the check asked for and not run yet, or None.  The
        monitor reads it inline on its hot path (no call to ask).
    """

    def __init__(self, clock: IReactorTime, holderOf: Callable[[bytes], object],
                 table: Optional[SharedTable], log: Logger) -> None:
        """
        @param holderOf: who holds a key now, as the lock table says.
        @param table: the lock table, for the holders and queues of shared
            keys; by default the table whose C{clientOf} C{holderOf} is.
        @param log: where deadlocks are logged (the monitor's log).
        """
        self.clock = clock
        self.log = log
        if table is None:
            owner = getattr(holderOf, "__self__", None)
            if all(hasattr(owner, name) for name in _SHARED_VIEW):
                table = owner
        self._table = table
        if table is not None:
            self.graph = WaitForGraph(holderOf, sharedOf=self._sharedOf,
                                      isShared=table.isShared)
        else:
            self.graph = WaitForGraph(holderOf)
        self._notes = self.graph.notes
        self.pending: Optional[IDelayedCall] = None

    def _sharedOf(self, key: bytes, cap: int) -> Optional[SharedView]:
        """
        The wait-for graph's view of a key held in shared form (None for
        one in the one-holder form): at most C{cap} holders and waiters.
        """
        table = self._table
        assert table is not None
        if not table.isShared(key):
            return None
        kind = table.kindOf(key)
        slots = kind if kind is not None and kind != READ_WRITE else 1
        mode = READ if slots == 1 else WRITE
        holders = [(grant[3], mode) for grant in table.firstGrants(key, cap)]
        queue = [(waiter.client(), READ if waiter.share == TABLE_READ else WRITE)
                 for waiter in islice(table.queueOf(key) or (), cap)]
        return slots, holders, queue, table.holderCount(key) > len(holders)

    # Changes only note what to check; the search runs on a later reactor
    # turn, a budget of edges at a time, so a burst of thousands of waits
    # never holds up other clients (SPEC section 7).

    def soon(self) -> None:
        """
        Check on a later turn if the graph noted anything to check.
        """
        if self.pending is None and self._notes:
            self.pending = self.clock.callLater(0, self._checkCycles)

    def _checkCycles(self) -> None:
        self.pending = None
        for cycle in self.graph.check(self.clock.seconds(), CHECK_BUDGET):
            # Not an event of the ring (its types are a fixed contract):
            # /status, the metrics and the log report deadlocks.
            self.log.warn("Deadlock: {cycle}", cycle=cycle.describe(_name))
        self.soon()

    def listed(self, now: float, wall: float,
               limit: int = DEADLOCKS_LISTED) -> List[Dict[str, Any]]:
        """
        The first C{limit} cycles present at C{now} (oldest first); C{since}
        as Unix time, the wall clock reading C{wall} at C{now}.
        """
        out = []
        for cycle in islice(self.graph.cycles.values(), limit):
            entry = cycle.asDict(_name)
            entry["since"] = round(wall - (now - cycle.since), 3)
            out.append(entry)
        return out

    def stop(self) -> None:
        """
        Cancel a pending check.
        """
        if self.pending is not None and self.pending.active():
            self.pending.cancel()
        self.pending = None
