# -*- test-case-name: tests.test_waitfor -*-
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

import re
import weakref
from collections import deque
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
)

Client = object  # hashable by identity (the server passes connections)

# A client library instance's connection name: <name>#<12 lowercase hex>.
_INSTANCE = re.compile(r"#[0-9a-f]{12}\Z")


class Instance:
    """
    The one client all connections named C{full} stand for (a client
    library instance); shown by its name without the instance id.  One
    object per name while the graph refers to it, so clients still
    compare by identity.
    """

    __slots__ = ("full", "__weakref__")

    def __init__(self, full: str) -> None:
        self.full = full

    @property
    def name(self) -> str:
        shown = self.full[:-13]
        return shown if shown else self.full

    def __repr__(self) -> str:
        return f"Instance({self.full!r})"


def isInstanceName(name: object) -> bool:
    """
    Whether a connection's C{I} name was given by a client library
    instance (it ends in C{#} and 12 lowercase hex characters).
    """
    return isinstance(name, str) and _INSTANCE.search(name) is not None
Step = Tuple[Client, bytes]  # (client, the key it waits for)
CycleId = FrozenSet[Client]

_WAIT, _HOLD, _RECHECK, _SHARED = 0, 1, 2, 3

# Connection names whose client (an Instance, or the connection) is
# remembered at once.
NAMES_CACHED = 4096

# What the graph is told of a key held in shared form (readers, or a
# semaphore): its slots (1 for a read-write key), its holders and its
# queue (FIFO) as (connection, READ or WRITE) pairs, at most the cap
# asked for of each; and whether its holders were cut at the cap.
SharedView = Tuple[int, List[Tuple[Client, str]], List[Tuple[Client, str]], bool]


class Cycle:
    """
    A deadlock: C{steps[i]} = (client i, key it waits for), and that key is
    held by client i+1 (the last key by client 0).  Rotated so that the
    smallest key comes first (a stable order to show).
    """

    __slots__ = ("steps", "since", "via", "support")

    def __init__(self, steps: Tuple[Step, ...], since: float,
                 via: Optional[Dict[Step, Tuple[str, Tuple[Client, ...]]]] = None,
                 support: FrozenSet[Step] = frozenset()) -> None:
        self.steps = steps
        self.since = since
        # Through shared keys (L{WaitForGraph.sharedOf}): per step whose
        # key is shared, how it waits (ALL or ANY) and for whom of the
        # deadlock; and every wait the deadlock rests on (a change to any
        # of them checks it again).  Empty for a cycle of exclusive keys.
        self.via = via or {}
        self.support = support

    @property
    def shared(self) -> bool:
        """
        Whether the deadlock runs through a shared key (read lock or
        semaphore).
        """
        return bool(self.via)

    @property
    def clients(self) -> List[Client]:
        return [who for who, _ in self.steps]

    @property
    def keys(self) -> List[bytes]:
        return [key for _, key in self.steps]

    def describe(self, nameOf: Callable[[Client], str] = str) -> str:
        """
        C{a waits for k1 (held by b) -> b waits for k2 (held by a)}.

        A step through a shared key says so: C{(every slot held by a, b)}
        for a semaphore (its waiter needs one of them to go, and none can;
        C{every other slot} when the waiter holds one itself),
        C{(blocked by b)} for a read-write key (b holds it or is a writer
        queued ahead).
        """
        parts = []
        for i, (who, key) in enumerate(self.steps):
            holder = self.steps[(i + 1) % len(self.steps)][0]
            shown = key.decode('utf-8', 'replace')
            via = self.via.get((who, key))
            if via is None:
                why = f"held by {nameOf(holder)}"
            elif via[0] == ANY:
                others = [b for b in via[1] if b is not who]
                why = ("every other slot held by " if len(others) < len(via[1])
                       else "every slot held by ") + ", ".join(nameOf(b) for b in others)
            else:
                why = f"blocked by {nameOf(holder)}"
            parts.append(f"{nameOf(who)} waits for {shown} ({why})")
        return " -> ".join(parts)

    def asDict(self, nameOf: Callable[[Client], str] = str) -> Dict[str, object]:
        out: Dict[str, object] = {
            "length": len(self.steps),
            "clients": [nameOf(c) for c in self.clients],
            "keys": [k.decode("utf-8", "replace") for k in self.keys],
            "since": self.since,
            "description": self.describe(nameOf),
            "shared": self.shared,
        }
        if self.shared:
            # Everyone the deadlock holds (a semaphore's holders beside the
            # cycle), by name, in a stable order.
            out["deadlocked"] = sorted(nameOf(c) for c in _clientsOf(self))
        return out


def _clientsOf(cycle: "Cycle") -> Set[Client]:
    clients = set(cycle.clients)
    for _, blockers in cycle.via.values():
        clients.update(blockers)
    return clients


def _rotated(steps: List[Step]) -> Tuple[Step, ...]:
    # Keys in a cycle are distinct (each is held by a different client).
    start = min(range(len(steps)), key=lambda i: steps[i][1])
    return tuple(steps[start:] + steps[:start])


class WaitForGraph:
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

    # -- connections and clients -------------------------------------------------

    def clientOf(self, conn: Optional[Client]) -> Optional[Client]:
        """
        The client C{conn} belongs to: its L{Instance} when its name is an
        instance name, else the connection itself.
        """
        if conn is None:
            return None
        pinned = self._pinned.get(conn)
        if pinned is not None:
            return pinned[0]
        name = getattr(conn, "name", None)
        known = self._names.get(name)
        if known is None:
            known = self._classify(name)
        return conn if known is False else known

    def _classify(self, name: object) -> "Instance | bool":
        """
        C{name}'s L{Instance}, or False for a name that is not an
        instance name; remembered for the next look-up (a bounded cache:
        the regular expression and a new Instance per wait and grant cost
        more than the rest of the graph's work on a contended key).  The
        cache holds its Instances alive; when it is emptied, an Instance
        still referred to stays the one of its name (the weak dictionary
        keeps it), so clients still compare by identity.
        """
        if len(self._names) >= NAMES_CACHED:
            self._names.clear()
        if not isInstanceName(name):
            self._names[name] = False
            return False
        assert isinstance(name, str)
        instance = self._instances.get(name)
        if instance is None:
            instance = self._instances[name] = Instance(name)
        self._names[name] = instance
        return instance

    def holderOf(self, key: bytes) -> Optional[Client]:
        """
        The client holding C{key} now (None: free, or unknown here).
        """
        return self.clientOf(self.connectionHolding(key))

    # -- changes (O(1), never search) ------------------------------------------

    def hold(self, key: bytes, who: Optional[Client]) -> None:
        """
        C{key} is now held by C{who} (None: by a client unknown here, e.g.
        a grant learned by replication): C{holderOf(key)} says so already.
        """
        # As unhold (inline, not a call: this runs at every grant).
        for cid in self._byKey.get(key, ()):
            self._suspect(cid)
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
        # The cycles through key lost their edge: check them again.
        for cid in self._byKey.get(key, ()):
            self._suspect(cid)

    def wait(self, key: bytes, who: Client) -> None:
        """
        C{who} (a connection) queued for C{key}.
        """
        # _pin and holderOf, inline: this runs at every wait.
        conn, pins = who, self._pinned
        pinned = pins.get(conn)
        if pinned is None:
            who = self.clientOf(conn)
            pins[conn] = (who, 1)
        else:
            who = pinned[0]
            pins[conn] = (who, pinned[1] + 1)
        keys = self._waits.get(who)
        if keys is None:
            keys = self._waits[who] = {}
        count = keys[key] = keys.get(key, 0) + 1
        self._waitedFor[key] = self._waitedFor.get(key, 0) + 1
        holder = self.clientOf(self.connectionHolding(key))
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
        # _unpin, inline: this runs at every grant to a waiter.
        if pinned[1] == 1:
            del self._pinned[conn]
        else:
            self._pinned[conn] = (who, pinned[1] - 1)
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

    def _foundShared(self, cycle: Cycle, now: float, found: List[Cycle]) -> None:
        cid = _cidOf(cycle)
        if cid in self.cycles:
            return
        if len(self.cycles) >= self.maxCycles:
            self.unlisted += 1
            return
        cycle.since = now
        self._add(cid, cycle)
        self.detected += 1
        found.append(cycle)

    def _found(self, steps: List[Step], now: float, found: List[Cycle]) -> None:
        cid: CycleId = frozenset(who for who, _ in steps)
        if cid in self.cycles:
            return  # these clients are already reported as deadlocked
        if len(self.cycles) >= self.maxCycles:
            self.unlisted += 1
            return
        cycle = Cycle(_rotated(steps), now)
        self._add(cid, cycle)
        self.detected += 1
        found.append(cycle)

    def _add(self, cid: CycleId, cycle: Cycle) -> None:
        self.cycles[cid] = cycle
        if cycle.shared:
            for step in cycle.support:
                self._byStep.setdefault(step, set()).add(cid)
                self._byKey.setdefault(step[1], set()).add(cid)
            return
        steps = cycle.steps
        for i, step in enumerate(steps):
            self._byStep.setdefault(step, set()).add(cid)
            self._byKey.setdefault(step[1], set()).add(cid)
            pair = (step[0], steps[(i + 1) % len(steps)][0])
            self._pairs[pair] = self._pairs.get(pair, 0) + 1

    def _forget(self, cid: CycleId) -> None:
        cycle = self.cycles.pop(cid, None)
        if cycle is None:
            return
        if cycle.shared:
            for step in cycle.support:
                _discard(self._byStep, step, cid)
                _discard(self._byKey, step[1], cid)
            return
        steps = cycle.steps
        for i, step in enumerate(steps):
            _discard(self._byStep, step, cid)
            _discard(self._byKey, step[1], cid)
            pair = (step[0], steps[(i + 1) % len(steps)][0])
            if self._pairs[pair] == 1:
                del self._pairs[pair]
            else:
                self._pairs[pair] -= 1


# A key's waits as _component reads them: one Wait for every waiter (a
# key in the one-holder form), or the waits by client (a shared key).
_KeyWaits = Any


def _cidOf(cycle: Cycle) -> CycleId:
    return frozenset(_clientsOf(cycle))


def _order(who: Client) -> Tuple[str, int]:
    # A stable order to pick among blockers: by name, then identity.
    return (str(getattr(who, "name", who)), id(who))


def _discard(index: Dict[Any, Set[CycleId]], at: Any, cid: CycleId) -> None:
    ids = index.get(at)
    if ids is not None:
        ids.discard(cid)
        if not ids:
            del index[at]


# -- shared keys: who a waiter waits for ------------------------------------
#
# With read locks and semaphores a waiter may wait for several clients at
# once, in one of two ways:
#
# - ALL: it is granted only once every one of them is gone: a writer waits
#   for every holder and every waiter ahead of it (FIFO: they go first); a
#   reader waits for the writers ahead of it, holding or queued (readers
#   ahead of it are granted with it, never before it is due).
# - ANY: it is granted as soon as one of them goes: a semaphore waiter
#   needs one of the n slots, so it is blocked by a deadlock only when
#   every one of the n holders is in it.  (A waiter further back needs more
#   slots; counting it as ANY can only miss a deadlock, never report a
#   false one.)
#
# A set of clients is deadlocked when none of them can be granted whatever
# the others outside it do; found as the complement of the clients that can
# finish (a least fixed point, O(clients + blockers)).

READ = "r"
WRITE = "w"   # an exclusive acquire (share None or 1)
ALL = "all"
ANY = "any"


class Wait:
    """
    One queued acquire's wait: for C{ALL} or C{ANY} of C{blockers}.

    @ivar own: the waiter is one of the key's holders itself (a semaphore
        waiter holding a slot: it waits for every other slot).
    """

    __slots__ = ("how", "blockers", "key", "own")

    def __init__(self, how: str, blockers: FrozenSet[Client], key: bytes = b"",
                 own: bool = False) -> None:
        self.how = how
        self.blockers = blockers
        self.key = key
        self.own = own

    def __repr__(self) -> str:
        return f"Wait({self.how}, {set(self.blockers)!r}, {self.key!r})"


def keyWaits(key: bytes, holders: Sequence[Tuple[Client, str]],
             queue: Sequence[Tuple[Client, str]], slots: int = 1
             ) -> List[Tuple[Client, Wait]]:
    """
    The waits of C{key}'s queue (FIFO order), from its C{holders} and
    C{queue} as (client, mode) pairs: mode L{READ} or L{WRITE} (exclusive;
    for a semaphore, C{slots} > 1, every grant is a slot).  A client does
    not wait for itself (a lease ends that, it is no deadlock).

    O(holders + queue), whatever the mix: an ALL wait may leave out a
    blocker that another of its blockers waits for anyway (a reader waits
    for the last writer ahead of it, which waits for everything ahead of
    itself; a writer for the last writer ahead and the readers after it),
    and leaving out a blocker of an ALL wait can only miss a deadlock.
    A semaphore waiter that a free slot will take (the first M{free}
    waiters, M{free} = slots - holders) waits for nobody; the others for
    ANY of the holders and of those first waiters (who all go before it).
    """
    out: List[Tuple[Client, Wait]] = []
    if slots > 1:
        free = max(0, slots - len(holders))
        everyone = frozenset([who for who, _ in holders] + [who for who, _ in queue[:free]])
        nobody: FrozenSet[Client] = frozenset()
        for i, (who, _) in enumerate(queue):
            if i < free:
                out.append((who, Wait(ANY, nobody, key)))
            elif who in everyone:
                out.append((who, Wait(ANY, everyone - {who}, key, own=True)))
            else:
                out.append((who, Wait(ANY, everyone, key)))
        return out
    # run: the last writer ahead (first) and everyone after it, or all
    # ahead while no writer is; lastWriter, the writer before it too
    # (for a writer's own later acquire, which may not wait for itself).
    run: List[Client] = []
    writers: List[Client] = []  # the last two distinct writers ahead
    for who, mode in holders:
        if mode != READ:
            run = [who]
            writers = ([who] + [w for w in writers if w is not who])[:2]
        else:
            run.append(who)
    for who, mode in queue:
        if mode == READ:
            nearest = next((w for w in writers if w is not who), None)
            blockers = frozenset((nearest,)) if nearest is not None else frozenset()
            out.append((who, Wait(ALL, blockers, key)))
            run.append(who)
        else:
            out.append((who, Wait(ALL, frozenset(run) - {who}, key)))
            run = [who]
            writers = ([who] + [w for w in writers if w is not who])[:2]
    return out


def deadlockedClients(waits: Iterable[Tuple[Client, Wait]]) -> Set[Client]:
    """
    The clients that can never be granted all they wait for: each wait
    of a client that can finish is met (ALL: every blocker can finish;
    ANY: one can, or it has none); a client that waits for nothing
    finishes (its leases end).  Everything else is deadlocked.
    """
    waitsOf: Dict[Client, List[Wait]] = {}
    for who, wait in waits:
        waitsOf.setdefault(who, []).append(wait)
    # Per wait: how many blockers must still finish before it is met.
    missing: Dict[int, int] = {}
    unmet: Dict[Client, int] = {}
    watchers: Dict[Client, List[Tuple[Client, Wait]]] = {}
    finished: Deque[Client] = deque()
    done: Set[Client] = set()
    for who, ws in waitsOf.items():
        count = 0
        for wait in ws:
            live = [b for b in wait.blockers if b is not who]
            need = len(live) if wait.how == ALL else min(1, len(live))
            missing[id(wait)] = need
            if need:
                count += 1
                for b in live:
                    watchers.setdefault(b, []).append((who, wait))
        unmet[who] = count
        if count == 0:
            finished.append(who)
            done.add(who)
    # Blockers that wait for nothing finish.
    for b in list(watchers):
        if b not in waitsOf:
            finished.append(b)
            done.add(b)
    while finished:
        b = finished.popleft()
        for who, wait in watchers.get(b, ()):
            if who in done or missing[id(wait)] == 0:
                continue
            missing[id(wait)] -= 1
            if missing[id(wait)] == 0:
                unmet[who] -= 1
                if unmet[who] == 0:
                    done.add(who)
                    finished.append(who)
    return {who for who in waitsOf if who not in done}
