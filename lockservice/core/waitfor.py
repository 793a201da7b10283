# -*- test-case-name: tests.core.test_waitfor -*-
"""
The wait-for graph: which client waits for a key that which client holds,
and the deadlocks (cycles) that follow.

Clients are opaque hashable objects: the server passes the connections
themselves, so a connection that renames itself stays the same client, and
two connections that share a plain name are two clients (no false cycle:
50 processes may all be called C{billing}).  One exception joins
connections (L{clientOf}): a connection whose C{I} name ends in C{#} and
12 lowercase hex characters was named by a client library instance (its
random instance id), so every connection with exactly that name is the
same client, an L{Instance}: the Python client keeps two connections per
address, and a real deadlock between two clients runs through both.
Names are for display only (C{nameOf}).

The graph is bipartite, client -> key (waits for) and key -> client (held
by), so a change (a wait, a hand-over, a withdrawal) costs O(1) whatever
the queue length.  The held-by edges are not stored here: the graph asks
C{holderOf(key)} (the monitor passes one that reads the lock table, which
keeps the holding connection with each grant), so a held key costs the
graph nothing; L{WaitForGraph.hold} and L{WaitForGraph.unhold} only say
that a key changed hands, after the table changed.

Changes never search: they only note what must be checked (a new wait
edge, a hand-over to a key with waiters, a reported cycle that lost an
edge), and L{WaitForGraph.check} works through those notes within a
budget of edges visited per call, so the caller (the reactor) is never
held up for long, however many waits arrive at once.

A cycle is reported once per distinct set of clients: while the clients of
a reported cycle stay deadlocked (through whichever keys), their further
waits for each other are neither searched nor reported again.  It is
forgotten when its clients no longer form a cycle, so one that forms again
later is reported again.

Shared keys (read locks, semaphores: see L{keyWaits} below) have several
holders: given C{sharedOf}, the graph also checks, on every wait and
hand-over while a shared key is waited for, the clients reachable from
the one concerned (a bounded breadth-first walk) with L{deadlockedClients},
and reports a cycle of the deadlocked set found (L{Cycle.via} says how
each shared step waits).

Detect, never break: nothing here changes who holds what.  A client waiting
for a key it holds itself is not a cycle (the lease ends it).  Pure: no
clock, the caller gives the time.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from lockservice.core.clients import (
    NAMES_CACHED,
    Client,
    Instance,
    isInstanceName,
)
from lockservice.core.cycles import Cycle, CycleId, Step, _rotated
from lockservice.core.shareddeadlocks import SharedDeadlocks, SharedView
from lockservice.core.sharedwaits import (
    ALL,
    ANY,
    READ,
    WRITE,
    Wait,
    deadlockedClients,
    keyWaits,
)

__all__ = [
    "ALL", "ANY", "NAMES_CACHED", "READ", "WRITE", "Client", "Cycle", "CycleId", "Instance",
    "SharedView", "Step", "Wait", "WaitForGraph", "deadlockedClients", "isInstanceName",
    "keyWaits",
]

_WAIT, _HOLD, _RECHECK, _SHARED = 0, 1, 2, 3


class WaitForGraph(SharedDeadlocks):
    """
    @ivar holderOf: who holds a key now (None: free, or held by a client
        unknown here, e.g. a grant learned by replication).
    @ivar cycles: the deadlocks present now, by their set of clients.
    @ivar detected: how many cycles were reported since start.
    @ivar maxSearch: edges one search may visit; a cycle beyond it is not
        found (the search gives up rather than stall the server).
    @ivar maxShared: holders and waiters read of one shared key per
        search, a quarter of C{maxSearch}: reading a key with thousands
        queued must leave the search room to go on (read in full, it used
        the whole search, and a cycle through that key's first waiter was
        never found).  A waiter queued behind them is given no waits (it
        can miss a deadlock through it, never make a false one).
    @ivar maxCycles: how many cycles are kept; beyond it new ones are only
        counted in C{unlisted}.
    @ivar maxPending: how many checks may wait; beyond it the oldest are
        dropped and counted in C{skipped}.
    """

    def __init__(self, holderOf: Callable[[bytes], Optional[Client]],
                 maxSearch: int = 2000, maxCycles: int = 10000,
                 maxPending: int = 100000,
                 sharedOf: Optional[Callable[[bytes, int], Optional[SharedView]]] = None,
                 isShared: Optional[Callable[[bytes], bool]] = None) -> None:
        """
        @param sharedOf: what the table holds of a key in shared form
            (L{SharedView}, at most the given count of holders and
            waiters), None for a key in the one-holder form (then
            C{holderOf} says who holds it).  Without it, shared keys are
            not followed (no deadlock through them is found).
        @param isShared: whether a key is held in shared form now (cheap:
            asked at every wait).
        """
        self.connectionHolding = holderOf
        self.sharedOf = sharedOf
        self.isShared = isShared if sharedOf is not None else None
        # Keys waited for that were held in shared form at a wait, while
        # waited for: while there is one, every wait and hand-over is also
        # checked through shared keys (a cycle through one may close
        # anywhere).
        self._sharedKeys: Dict[bytes, None] = {}
        self._sharedNoted: Set[Client] = set()  # clients with a _SHARED note pending
        self._keyCache: Dict[bytes, Any] = {}  # see check
        self._instances: "weakref.WeakValueDictionary[str, Instance]" = \
            weakref.WeakValueDictionary()
        self._names: Dict[object, "Instance | bool"] = {}  # see _classify
        # A connection's client while it waits: fixed at its first wait, so
        # a rename (I) in between cannot split its waits over two clients.
        self._pinned: Dict[Client, Tuple[Client, int]] = {}
        self.maxSearch = maxSearch
        self.maxShared = max(1, maxSearch // 4)
        self.maxCycles = maxCycles
        self.maxPending = maxPending
        self._waits: Dict[Client, Dict[bytes, int]] = {}
        self._waitedFor: Dict[bytes, int] = {}  # waits per key, all clients
        self.cycles: Dict[CycleId, Cycle] = {}
        self._byStep: Dict[Step, Set[CycleId]] = {}
        self._byKey: Dict[bytes, Set[CycleId]] = {}
        # Read-only views for an observer's fast path (the monitor skips
        # hold and unhold for a key in neither): keys waited for (count of
        # waits), keys of reported cycles.
        self.waitedFor: Dict[bytes, int] = self._waitedFor
        self.cycleKeys: Dict[bytes, Set[CycleId]] = self._byKey
        self._pairs: Dict[Tuple[Client, Client], int] = {}  # consecutive in a cycle
        self._pending: Deque[Tuple[Any, ...]] = deque()
        self.notes = self._pending  # read-only: a check is due while not empty
        self._suspects: Set[CycleId] = set()
        self.detected = 0
        self.unlisted = 0
        self.skipped = 0

    # -- changes (O(1), never search) ------------------------------------------

    def hold(self, key: bytes, who: Optional[Client]) -> None:
        """
        C{key} is now held by C{who} (None: by a client unknown here, e.g.
        a grant learned by replication): C{holderOf(key)} says so already.
        """
        self._recheckThrough(key)
        if not self._waitedFor.get(key):
            return  # nobody waits for it: no cycle closes here
        who = self.clientOf(who)
        if who is not None and who in self._waits:
            if self._sharedKeys:
                self._noteShared(who)
            self._note((_HOLD, key, who))

    def unhold(self, key: bytes) -> None:
        """
        C{key} is free, or changed hands (C{holderOf(key)} says so already).
        """
        self._recheckThrough(key)

    def _recheckThrough(self, key: bytes) -> None:
        # The cycles through key lost their edge: check them again.
        for cid in self._byKey.get(key, ()):
            self._suspect(cid)

    def wait(self, key: bytes, who: Client) -> None:
        """
        C{who} (a connection) queued for C{key}.
        """
        who = self._pin(who)
        keys = self._waits.get(who)
        if keys is None:
            keys = self._waits[who] = {}
        count = keys[key] = keys.get(key, 0) + 1
        self._waitedFor[key] = self._waitedFor.get(key, 0) + 1
        holder = self.holderOf(key)
        # A key in shared form has no one holder (holderOf says None):
        # only then is it asked whether it is shared.
        if holder is None and self.isShared is not None and self.isShared(key):
            self._sharedKeys[key] = None
        if self._sharedKeys and count == 1:
            self._noteShared(who)
        # Only a holder that waits itself can lead back to who: otherwise
        # nothing to search now (its own wait, later, searches this edge).
        if count == 1 and holder is not None and holder is not who \
                and holder in self._waits and (who, holder) not in self._pairs:
            self._note((_WAIT, who, key))

    def unwait(self, key: bytes, who: Client) -> None:
        """
        One of C{who}'s (a connection's) waits for C{key} ended (granted,
        timed out, withdrawn).
        """
        pinned = self._pinned.get(who)
        if pinned is None:
            return
        conn, who = who, pinned[0]
        keys = self._waits.get(who)
        if keys is None or key not in keys:
            return
        self._unpin(conn, pinned)
        keys[key] -= 1
        if self._waitedFor[key] == 1:
            del self._waitedFor[key]
            self._sharedKeys.pop(key, None)
        else:
            self._waitedFor[key] -= 1
        if keys[key] > 0:
            return
        del keys[key]
        if not keys:
            del self._waits[who]
        for cid in self._byStep.get((who, key), ()):
            self._suspect(cid)

    def clear(self) -> None:
        """
        Forget everything (this node stopped serving).
        """
        self._waits.clear()
        self._pinned.clear()
        self._waitedFor.clear()
        self._sharedKeys.clear()
        self._sharedNoted.clear()
        self.cycles.clear()
        self._byStep.clear()
        self._byKey.clear()
        self._pairs.clear()
        self._pending.clear()
        self._suspects.clear()

    def _note(self, item: Tuple[Any, ...]) -> None:
        if len(self._pending) >= self.maxPending:
            dropped = self._pending.popleft()
            self.skipped += 1
            if dropped[0] == _SHARED:
                self._sharedNoted.discard(dropped[1])
            elif dropped[0] == _RECHECK:
                self._suspects.discard(dropped[1])
        self._pending.append(item)

    def _noteShared(self, who: Client) -> None:
        # One check through shared keys per client waiting for it.
        if who not in self._sharedNoted:
            self._sharedNoted.add(who)
            self._note((_SHARED, who))

    def _suspect(self, cid: CycleId) -> None:
        if cid not in self._suspects:
            self._suspects.add(cid)
            self._note((_RECHECK, cid))

    # -- checking (bounded work per call) --------------------------------------

    @property
    def pending(self) -> int:
        """
        How many checks are waiting for L{check}.
        """
        return len(self._pending)

    def check(self, now: float, budget: int = 10000) -> List[Cycle]:
        """
        Work through the noted changes, visiting about C{budget} edges (at
        most C{budget + maxSearch}); call again while L{pending}.

        @return: the cycles found that were not reported before.
        """
        found: List[Cycle] = []
        pending = self._pending
        # The keys' waits read by this call's checks through shared keys:
        # the table does not change meanwhile, so a burst of waits on one
        # big shared key reads its holders and queue once, not once each.
        self._keyCache = {}
        try:
            while pending and budget > 0:
                item = pending.popleft()
                if item[0] == _WAIT:
                    budget -= self._checkWait(item[1], item[2], now, found)
                elif item[0] == _HOLD:
                    budget -= self._checkHold(item[1], item[2], now, found)
                elif item[0] == _SHARED:
                    self._sharedNoted.discard(item[1])
                    budget -= self._checkShared(item[1], now, found)
                else:
                    budget -= self._recheck(item[1], now, found)
        finally:
            self._keyCache = {}
        return found

    def _checkWait(self, who: Client, key: bytes, now: float, found: List[Cycle]) -> int:
        holder = self.holderOf(key)
        if (holder is None or holder is who or not self._waits.get(who, {}).get(key)
                or (who, holder) in self._pairs):
            return 1  # gone since, or already part of a reported cycle
        path, cost = self._search(holder, lambda w: w is who)
        if path is not None:
            self._found([(who, key)] + [(w, k) for w, k, _ in path], now, found)
        return cost

    def _checkHold(self, key: bytes, who: Client, now: float, found: List[Cycle]) -> int:
        if self.holderOf(key) is not who or not self._waitedFor.get(key) \
                or who not in self._waits:
            return 1
        path, cost = self._search(
            who, lambda w: w is not who and key in self._waits.get(w, ()))
        if path is not None:
            self._found([(w, k) for w, k, _ in path] + [(path[-1][2], key)], now, found)
        return cost

    def _recheck(self, cid: CycleId, now: float, found: List[Cycle]) -> int:
        """
        A reported cycle lost an edge: keep it (with its new keys) while
        its clients still form a cycle, else forget it.
        """
        self._suspects.discard(cid)
        cycle = self.cycles.get(cid)
        if cycle is None:
            return 1
        if cycle.shared:
            return self._recheckShared(cid, cycle, now, found)
        steps = cycle.steps
        if all(self._waits.get(who, {}).get(key)
               and self.holderOf(key) is steps[(i + 1) % len(steps)][0]
               for i, (who, key) in enumerate(steps)):
            return len(steps)  # still intact (the key changed hands and back)
        start = steps[0][0]
        path, cost = self._search(start, lambda w: w is start, allowed=cid)
        if path is not None and {w for w, _, _ in path} == cid:
            self._forget(cid)
            self._add(cid, Cycle(_rotated([(w, k) for w, k, _ in path]), cycle.since))
            return cost
        self._forget(cid)
        if path is not None:  # a smaller cycle among the same clients
            self._found([(w, k) for w, k, _ in path], now, found)
        return cost

    def _search(self, start: Client, isEnd: Callable[[Client], bool],
                allowed: Optional[CycleId] = None
                ) -> Tuple[Optional[List[Tuple[Client, bytes, Client]]], int]:
        """
        Depth-first from client C{start} along waits-for -> held-by edges
        to a client C{w} with C{isEnd(w)}, visiting at most C{maxSearch}
        edges (and only clients in C{allowed}, when given).

        @return: the edges followed, as (client, key it waits for, holder
            of that key), or None; and the number of edges visited.
        """
        holderOf = self.holderOf
        visited: Set[Client] = {start}
        path: List[Tuple[Client, bytes, Client]] = []
        stack: List[Iterator[bytes]] = [iter(list(self._waits.get(start, ())))]
        current = [start]
        budget = self.maxSearch
        while stack:
            for key in stack[-1]:
                budget -= 1
                if budget <= 0:
                    return None, self.maxSearch
                nxt = holderOf(key)
                if nxt is None or (allowed is not None and nxt not in allowed):
                    continue
                if isEnd(nxt):
                    path.append((current[-1], key, nxt))
                    return path, self.maxSearch - budget
                if nxt in visited:
                    continue
                path.append((current[-1], key, nxt))
                visited.add(nxt)
                current.append(nxt)
                stack.append(iter(list(self._waits.get(nxt, ()))))
                break
            else:
                stack.pop()
                current.pop()
                if path:
                    path.pop()
        return None, self.maxSearch - budget
