# -*- test-case-name: tests.server.test_monitor -*-
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

from collections import OrderedDict
from itertools import islice
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.core.table import READ as TABLE_READ
from lockservice.core.table import READ_WRITE
from lockservice.core.waitfor import READ, WRITE, SharedView, WaitForGraph

# Edges of the wait-for graph visited per reactor turn (about 2 ms).
CHECK_BUDGET = 5000
# A wait enters the wait-for graph once it has lasted this long: nearly
# every wait of a busy key is shorter (a hand-off takes about 0.1 ms), and
# costs the graph nothing then (about a tenth of a contended hand-off's
# server CPU).  A deadlock lasts until a lease ends it: it is
# found this much later, and no wait it consists of is missed.
WAIT_ENTERS_AFTER = 0.05
# Waits entered into the graph per reactor turn (a burst of 100,000).
ENTER_BUDGET = 5000
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
    @ivar pending: the check asked for and not run yet, or None.
    @ivar fresh: the waits (queued acquires) not in the graph yet, oldest
        first; the monitor adds and removes them, and calls L{enterSoon}
        when it added one.
    @ivar entering: the call that enters the waits of C{fresh} that have
        lasted L{WAIT_ENTERS_AFTER} into the graph, or None.
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
        # (An OrderedDict: the oldest is taken from the front at O(1), where
        # a dict would walk over the slots of those taken before it.)
        self.fresh: "OrderedDict[Any, None]" = OrderedDict()
        self.entering: Optional[IDelayedCall] = None

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

    # Waits enter the graph late, in the order they were queued, and the
    # graph notes what they close as if they had just been queued then:
    # a cycle's last wait to enter is searched from (WaitForGraph.wait).

    def enterSoon(self) -> None:
        """
        Enter the oldest fresh wait when it has lasted long enough.
        """
        if self.entering is None and self.fresh:
            oldest = next(iter(self.fresh))
            delay = oldest.queuedAt + WAIT_ENTERS_AFTER - self.clock.seconds()
            self.entering = self.clock.callLater(max(0.0, delay), self._enter)

    def _enter(self) -> None:
        self.entering = None
        fresh, wait = self.fresh, self.graph.wait
        # (A microsecond early at most: the call was timed by the same
        # sum, which floats may round the other way.)
        due = self.clock.seconds() - WAIT_ENTERS_AFTER + 1e-6
        budget = ENTER_BUDGET
        while fresh and budget:
            waiter = next(iter(fresh))
            if waiter.queuedAt > due:
                break
            del fresh[waiter]
            wait(waiter.key, waiter.conn)
            budget -= 1
        if fresh and not budget:
            self.entering = self.clock.callLater(0, self._enter)  # the rest next turn
        else:
            self.enterSoon()
        self.soon()

    def forgetWaits(self) -> None:
        """
        Forget the fresh waits (the graph was cleared).
        """
        self.fresh.clear()
        if self.entering is not None and self.entering.active():
            self.entering.cancel()
        self.entering = None

    # Changes only note what to check; the search runs on a later reactor
    # turn, a budget of edges at a time, so a burst of thousands of waits
    # never holds up other clients.

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
        Cancel a pending check, and the entering of fresh waits.
        """
        if self.pending is not None and self.pending.active():
            self.pending.cancel()
        self.pending = None
        if self.entering is not None and self.entering.active():
            self.entering.cancel()
        self.entering = None
