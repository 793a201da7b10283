"""
The wait-for graph's search for deadlocks through shared keys (read
locks, semaphores), whose waiters wait for ALL or ANY of several clients
(see L{lockservice.core.sharedwaits}).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from lockservice.core.clients import Client, ConnectionClients
from lockservice.core.cycles import Cycle, CycleId, ReportedCycles, Step, _cidOf, _order, _rotated
from lockservice.core.sharedwaits import ALL, ANY, Wait, deadlockedClients, keyWaits

# What the graph is told of a key held in shared form (readers, or a
# semaphore): its slots (1 for a read-write key), its holders and its
# queue (FIFO) as (connection, READ or WRITE) pairs, at most the cap
# asked for of each; and whether its holders were cut at the cap.
SharedView = Tuple[int, List[Tuple[Client, str]], List[Tuple[Client, str]], bool]


# A key's waits as _component reads them: one Wait for every waiter (a
# key in the one-holder form), or the waits by client (a shared key).
_KeyWaits = Any


class SharedDeadlocks(ReportedCycles, ConnectionClients):
    """
    The search through shared keys of a
    L{lockservice.core.waitfor.WaitForGraph}.
    """

    sharedOf: Optional[Callable[[bytes, int], Optional[SharedView]]]
    isShared: Optional[Callable[[bytes], bool]]
    maxSearch: int
    maxShared: int
    _waits: Dict[Client, Dict[bytes, int]]
    _keyCache: Dict[bytes, Any]

    # -- through shared keys (ALL and ANY waits, see keyWaits below) ----------

    def _keyWaits(self, key: bytes, cache: Dict[bytes, "_KeyWaits"]) -> Tuple["_KeyWaits", int]:
        """
        The waits of the clients queued for C{key}, and what reading them
        cost.  A key in the one-holder form: each waiter waits for its
        holder (as the exclusive search has it), one L{Wait} for all.  A
        shared key: L{keyWaits} of what the table shows (at most
        C{maxShared} holders and waiters), by client; a semaphore whose
        holders were cut gives no waits at all (an ANY wait may never lose
        a blocker: that could make a false deadlock; a wait left out can
        only miss one).
        """
        known = cache.get(key)
        if known is not None:
            return known, 1
        assert self.sharedOf is not None
        view = self.sharedOf(key, self.maxShared)
        if view is None:
            holder = self.holderOf(key)
            plain: _KeyWaits = Wait(ALL, frozenset((holder,)), key) if holder is not None else {}
            cache[key] = plain
            return plain, 1
        slots, holders, queue, cut = view
        clientOf = self.clientOf
        byClient: Dict[Client, List[Wait]] = {}
        if not (cut and slots > 1):
            for who, wait in keyWaits(key, [(clientOf(c), m) for c, m in holders],
                                      [(clientOf(c), m) for c, m in queue], slots):
                byClient.setdefault(who, []).append(wait)
        cache[key] = byClient
        return byClient, 1 + len(holders) + len(queue)

    def _component(self, start: Client) -> Tuple[List[Tuple[Client, Wait]], int]:
        """
        The waits of the clients reachable from C{start} along waits
        (breadth first, about C{maxSearch} edges): a client not reached
        in time is given no waits, so it counts as one that finishes
        (this can miss a deadlock, never make a false one).
        """
        cache = self._keyCache
        waits: List[Tuple[Client, Wait]] = []
        seen: Set[Client] = {start}
        todo: Deque[Client] = deque([start])
        budget = self.maxSearch
        while todo and budget > 0:
            who = todo.popleft()
            for key in list(self._waits.get(who, ())):
                known, cost = self._keyWaits(key, cache)
                budget -= cost
                if isinstance(known, Wait):
                    mine = [known] if who not in known.blockers else []
                else:
                    mine = known.get(who, [])
                for wait in mine:
                    # The fixed point reads every blocker: count them too.
                    budget -= len(wait.blockers)
                    if budget <= 0:
                        break  # the wait left out: it can only miss a deadlock
                    waits.append((who, wait))
                    for b in wait.blockers:
                        if b not in seen:
                            seen.add(b)
                            todo.append(b)
        return waits, self.maxSearch - budget

    def _sharedDeadlock(self, start: Client
                        ) -> Tuple[Optional[Cycle], Optional[Set[Client]], int]:
        """
        The deadlock C{start} is in or waits behind, through a shared
        key: a cycle of it (to show and report) with the waits it rests
        on, or None (none, or one of exclusive keys only, which the
        exclusive search reports); and the deadlocked set found.
        """
        waits, cost = self._component(start)
        stuck = deadlockedClients(waits)
        if not stuck:
            return None, stuck, cost
        waitsOf: Dict[Client, List[Wait]] = {}
        for who, wait in waits:
            waitsOf.setdefault(who, []).append(wait)

        def unmet(who: Client) -> Tuple[Wait, List[Client]]:
            # A wait of a stuck client that cannot be met, and the stuck
            # blockers that keep it so (ALL: one of them is enough; ANY:
            # every one).
            for wait in waitsOf[who]:
                inside = sorted((b for b in wait.blockers if b in stuck and b is not who),
                                key=_order)
                live = [b for b in wait.blockers if b is not who]
                if wait.how == ALL and inside:
                    return wait, inside
                if wait.how == ANY and live and len(inside) == len(live):
                    return wait, inside
            raise AssertionError("a deadlocked client has an unmet wait")

        # Walk from start along unmet waits until a client repeats: the
        # walk's tail from there is a cycle.
        who = start if start in stuck else min(stuck, key=_order)
        order: List[Client] = []
        at: Dict[Client, int] = {}
        chosen: Dict[Client, Tuple[Wait, List[Client]]] = {}
        while who not in at:
            at[who] = len(order)
            order.append(who)
            chosen[who] = unmet(who)
            who = chosen[who][1][0]
        ring = order[at[who]:]
        steps = [(w, chosen[w][0].key) for w in ring]
        via: Dict[Step, Tuple[str, Tuple[Client, ...]]] = {}
        for w in ring:
            wait, inside = chosen[w]
            if self.sharedOf is not None and self.isShared is not None \
                    and self.isShared(wait.key):
                # A semaphore waiter holding a slot itself is shown among
                # its blockers (the description says "every other slot").
                own = (w,) if wait.own else ()
                via[(w, wait.key)] = (wait.how, tuple(inside) + own)
        if not via:
            return None, stuck, cost  # exclusive keys only: not ours to report
        # Who the deadlock holds: the ring, and every holder of a
        # semaphore on it (each must be stuck); the waits it rests on:
        # every wait of each of them.
        members = set(ring)
        for how, blockers in via.values():
            if how == ANY:
                members.update(blockers)
        support = frozenset((w, wait.key) for w in members for wait in waitsOf.get(w, ()))
        return Cycle(_rotated(steps), 0.0, via, support), stuck, cost

    def _checkShared(self, who: Client, now: float, found: List[Cycle]) -> int:
        if self.sharedOf is None or who not in self._waits:
            return 1
        cycle, _, cost = self._sharedDeadlock(who)
        if cycle is not None:
            self._foundShared(cycle, now, found)
        return cost

    def _recheckShared(self, cid: CycleId, cycle: Cycle, now: float,
                       found: List[Cycle]) -> int:
        # From a client of it that still waits (the first one's wait may be
        # the one that ended, and the others still be stuck).
        start = next((who for who, _ in cycle.steps if who in self._waits), None)
        again, stuck, cost = self._sharedDeadlock(start) if start is not None \
            else (None, None, 1)
        if stuck is not None and cid <= stuck and again is not None \
                and _cidOf(again) == cid:
            self._forget(cid)
            again.since = cycle.since
            self._add(cid, again)  # the same deadlock, its waits as they are now
            return cost
        self._forget(cid)
        if again is not None:
            self._foundShared(again, now, found)
        return cost
