# -*- test-case-name: tests.test_monitor -*-
"""
The operator's view of one node: what happened (the event ring), to which
keys (per-key statistics), how busy the node was second by second, which
grants are held too long, which clients are deadlocked, and the admin's
force-release.

L{Monitor} is told of every change by the L{LockService} (it is one of
its C{activity} observers).  On that hot path it only notes the change (one
tuple appended to a log) and keeps the wait-for graph current (for a key
nobody waits for, two dict look-ups); the event ring, the per-key
statistics and the per-second series are derived from the log when
something reads them (a page, a check), or when it reaches L{FOLD_AT}
entries, so they cost little per request.  The ring keeps the log's
entries as they are and makes events of them only when they are read.
Deadlocks through shared keys (read locks, semaphores) are found from the
table's holders and queues (L{SharedTable}), read only when a check runs.  It is also told
of the cluster's events (L{Monitor.clusterEvent}); it never changes the
table itself except through the service's normal
release path (force-release), so replication and the other observers see
that release like any other.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import islice
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Protocol, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.core import events as ev
from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.core.events import EventRing
from lockservice.core.series import Series
from lockservice.core.sketch import KeyStats
from lockservice.core.table import READ as TABLE_READ
from lockservice.core.table import READ_WRITE
from lockservice.core.waitfor import READ, WRITE, SharedView, WaitForGraph

# Why a queued acquire stopped waiting without a grant.
TIMEOUT = ev.TIMEOUT
WITHDRAWAL = ev.WITHDRAWAL
REDIRECT = "redirect"


class Named(Protocol):
    """
    A client connection: the wait-for graph's vertex (by identity), shown
    by its current C{name}.
    """

    name: str


class Waiter(Protocol):
    """
    A queued acquire as the monitor sees it (the table's waiters).

    @ivar conn: the connection that waits.
    """

    key: bytes
    lease: float
    queuedAt: float
    conn: Named

    def holderName(self) -> Optional[str]:
        """
        The waiting connection's name, or its peer address.
        """


class HeldKey(Protocol):
    """
    A held key's current grant as the monitor sees it (the table's holders).
    """

    token: int
    owner: Optional[str]
    grantedAt: float


class ActivityObserver(Protocol):
    """
    What the lock service tells about each change, with who did it.  Every
    method gets the service's (monotonic) time C{now}; C{owner} is the
    holding connection's name or peer address (None when unknown, e.g. a
    grant learned by replication).
    """

    def queued(self, now: float, waiter: Waiter) -> None: ...

    def waitEnded(self, now: float, waiter: Waiter, reason: str) -> None: ...

    def granted(self, now: float, key: bytes, token: int, owner: Optional[str],
                waiter: Optional[Waiter], waited: float,
                conn: Optional[Named] = None) -> None: ...

    def dropped(self, now: float, key: bytes, token: int, owner: Optional[str],
                heldFor: float, expired: bool) -> None: ...

    def renewed(self, now: float, key: bytes, token: int, owner: Optional[str],
                expiresAt: float) -> None: ...

    def roleChanged(self, now: float, role: str,
                    holders: Iterable[Tuple[bytes, HeldKey]]) -> None: ...


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


class Releaser(Protocol):
    """
    The part of the lock service that force-release needs.
    """

    def release(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None: ...


# The roles whose grants and queues are watched: handing off is a frozen
# active (its queues stay).
_WATCHED = (ACTIVE, HANDING_OFF)

# Edges of the wait-for graph visited per reactor turn (about 2 ms).
CHECK_BUDGET = 5000
# Cycles listed on /status and the dashboard (the rest are counted).
DEADLOCKS_LISTED = 20
# Changes noted before they are folded into the events, statistics and
# series even if nobody reads them (bounds the log's memory).
FOLD_AT = 1024

# The kinds of noted change (the first item of a log entry; its second
# is the monotonic time, its third the key, as the event ring wants).
_GRANTED, _DROPPED, _QUEUED, _ENDED, _RENEWED, _EVENT = range(6)


def _name(conn: Any) -> str:
    return str(getattr(conn, "name", conn))


class _Held:
    __slots__ = ("token", "owner", "grantedAt", "long")

    def __init__(self, token: int, owner: Optional[str], grantedAt: float) -> None:
        self.token = token
        self.owner = owner
        self.grantedAt = grantedAt
        self.long = False


class Monitor:
    """
    @ivar warnHold: seconds after which a grant still held is a long hold
        (logged once, counted, flagged), or None for no such check.
    @ivar longHolds: how many grants have been flagged since start.
    @ivar forceReleases: how many force-releases were done.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, holderOf: Callable[[bytes], object],
                 wallTime: Callable[[], float] = time.time,
                 warnHold: Optional[float] = None, events: int = 10000,
                 trackedKeys: int = 1000, seriesSpan: int = 300,
                 table: Optional["SharedTable"] = None) -> None:
        """
        @param holderOf: who holds a key now, as the lock table says: the
            holding connection (the wait-for graph's vertex), or None.  The
            graph keeps no copy of who holds what (a held key would cost
            it a dict entry).
        @param table: the lock table, for the holders and queues of shared
            keys (read locks, semaphores: deadlocks through them); by
            default the table whose C{clientOf} C{holderOf} is.
        """
        self.clock = clock
        self.wallTime = wallTime
        self.warnHold = warnHold
        self._events = EventRing(events, self._decoder)
        self._queuedNoted = False  # a _QUEUED entry is in the log
        self._keys = KeyStats(trackedKeys)
        self._series = Series(seriesSpan)
        # Changes not yet folded into the three above (see fold).
        self._log: List[Tuple[Any, ...]] = []
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
        # The graph's keys waited for and keys of reported cycles: read on
        # every grant and release, so that one of a key nobody waits for
        # costs two dict look-ups here, not two calls into the graph.
        self._waitedFor = self.graph.waitedFor
        self._cycleKeys = self.graph.cycleKeys
        self._notes = self.graph.notes
        self._checking: Optional[IDelayedCall] = None
        self.longHolds = 0
        self._longNow = 0  # flagged grants still held: /status is O(1)
        self.forceReleases = 0
        # Per grant, (key, token): a shared key has several.
        self._held: Dict[Tuple[bytes, int], _Held] = {}
        self._forcing: Optional[Tuple[bytes, int, str]] = None
        self._due: Deque[Tuple[float, bytes, int]] = deque()
        self._alarm: Optional[IDelayedCall] = None
        self._role = ACTIVE  # a lock service starts active

    # -- what is derived lazily ------------------------------------------------

    @property
    def events(self) -> EventRing:
        """
        The event ring, with every change noted so far.
        """
        if self._log:
            self.fold()
        return self._events

    @property
    def keys(self) -> KeyStats:
        """
        The per-key statistics, with every change noted so far.
        """
        if self._log:
            self.fold()
        return self._keys

    @property
    def series(self) -> Series:
        """
        The per-second series, with every change noted so far.
        """
        if self._log:
            self.fold()
        return self._series

    def fold(self) -> None:
        """
        Fold the noted changes into the events, statistics and series, in
        the order they happened.  The event ring takes the log's entries
        as they are (L{_decoder} reads them when a page does); the
        statistics and the series are counted here, one loop over the
        batch with the per-key record read inline.
        """
        log, self._log = self._log, []
        if not log:
            return
        if self._queuedNoted:
            # A queued acquire is counted, not an event.
            self._queuedNoted = False
            self._events.extend([entry for entry in log if entry[0] != _QUEUED])
        else:
            self._events.extend(log)
        keys = self._keys
        records, recordOf = keys.records, keys.record
        series = self._series
        GRANTED, DROPPED, QUEUED, ENDED = _GRANTED, _DROPPED, _QUEUED, _ENDED  # locals
        # The series counts per whole second: a batch per second, not a
        # call per event.  The log is in time order, so a second ends when
        # an entry reaches the next one (and, should a time go back, when
        # one is before it).
        second = end = -1.0
        grants = waits = holds = 0
        holdTotal = holdMax = 0.0
        for entry in log:
            kind, now = entry[0], entry[1]
            if now >= end or now < second:
                if grants or waits or holds:
                    series.add(second, grants, waits, holds, holdTotal, holdMax)
                second = now // 1
                end = second + 1
                grants = waits = holds = 0
                holdTotal = holdMax = 0.0
            if kind == GRANTED:
                key = entry[2]
                record = records.get(key) or recordOf(key)
                record.activity += 1
                record.grants += 1
                waited = entry[5]
                if waited == 0.0:
                    # Sketch.add of a grant at once, inline (most grants)
                    wait = record.wait
                    wait.count += 1
                    wait.zeros += 1
                    wait.low = 0.0
                else:
                    record.wait.add(waited)
                grants += 1
            elif kind == DROPPED:
                key, heldFor = entry[2], entry[5]
                record = records.get(key) or recordOf(key)
                record.activity += 1
                if entry[6]:
                    record.expiries += 1
                else:
                    record.releases += 1
                record.hold.add(heldFor)
                holds += 1
                holdTotal += heldFor
                if heldFor > holdMax:
                    holdMax = heldFor
            elif kind == QUEUED:
                key = entry[2]
                record = records.get(key) or recordOf(key)
                record.activity += 1
                record.waits += 1
                waits += 1
            elif kind == ENDED and entry[5] == TIMEOUT:
                keys.timedOut(entry[2], entry[4])
            # renewals and the other events: events only
        if grants or waits or holds:
            series.add(second, grants, waits, holds, holdTotal, holdMax)

    def _decoder(self) -> Callable[[Tuple[Any, ...]], Tuple[Any, ...]]:
        """
        What turns a noted change into its event's fields, for one read
        of the ring: its wall-clock time is its monotonic time moved by
        the current offset between the two clocks.
        """
        offset = self.wallTime() - self.clock.seconds()

        def decode(entry: Tuple[Any, ...]) -> Tuple[Any, ...]:
            kind, wall, key = entry[0], entry[1] + offset, entry[2]
            if kind == _GRANTED:
                _, _, _, token, owner, waited, queued = entry
                if queued:
                    return wall, ev.GRANT, key, token, owner, "after waiting %.3f s", waited
                return wall, ev.GRANT, key, token, owner, None, None
            if kind == _DROPPED:
                _, _, _, token, owner, heldFor, expired, forced = entry
                if forced is not None:
                    return wall, ev.FORCE_RELEASE, key, token, owner, forced, None
                return (wall, ev.EXPIRY if expired else ev.RELEASE, key, token, owner,
                        "after %.3f s", heldFor)
            if kind == _ENDED:
                _, _, _, who, waited, reason = entry
                return wall, reason, key, None, who, "after %.3f s", waited
            if kind == _RENEWED:
                _, _, _, token, owner, lease = entry
                return wall, ev.RENEWAL, key, token, owner, "lease %.3f s", lease
            _, _, _, type, token, who, detail, seconds = entry  # _EVENT
            return wall, type, key, token, who, detail, seconds

        return decode

    def _note(self, entry: Tuple[Any, ...]) -> None:
        log = self._log
        log.append(entry)
        if len(log) >= FOLD_AT:
            self.fold()

    def _event(self, type: str, key: Optional[bytes] = None, token: Optional[int] = None,
               who: Optional[str] = None, detail: Optional[str] = None,
               seconds: Optional[float] = None) -> None:
        # An event not noted by the hot path, in order with those.
        self._note((_EVENT, self.clock.seconds(), key, type, token, who, detail, seconds))

    # -- the activity observer -------------------------------------------------

    def queued(self, now: float, waiter: Waiter) -> None:
        self._queuedNoted = True
        log = self._log  # as _note, inline: this runs at every wait
        log.append((_QUEUED, now, waiter.key))
        if len(log) >= FOLD_AT:
            self.fold()
        self.graph.wait(waiter.key, waiter.conn)
        if self._checking is None and self._notes:  # _checkSoon, inline
            self._checkSoon()

    def waitEnded(self, now: float, waiter: Waiter, reason: str) -> None:
        if reason in (TIMEOUT, WITHDRAWAL):  # the events; a redirect is none
            self._note((_ENDED, now, waiter.key, waiter.holderName(),
                        now - waiter.queuedAt, reason))
        self.graph.unwait(waiter.key, waiter.conn)
        self._checkSoon()

    def granted(self, now: float, key: bytes, token: int, owner: Optional[str],
                waiter: Optional[Waiter], waited: float,
                conn: Optional[Named] = None) -> None:
        """
        C{key} was granted with C{token} to connection C{conn} (named
        C{owner} then), at once (C{waiter} None) or to a queued C{waiter};
        the table (C{holderOf}) says so already.
        """
        log = self._log  # as _note, inline: this runs at every grant and release
        log.append((_GRANTED, now, key, token, owner, waited, waiter is not None))
        if len(log) >= FOLD_AT:
            self.fold()
        if self.warnHold is not None:
            # Only long-hold checks need a record per grant: without
            # --warn-hold the table's holders are all there is per key.
            self._held[(key, token)] = _Held(token, owner, now)
            self._watch(now + self.warnHold, key, token)
        if waiter is not None:
            graph = self.graph
            graph.unwait(key, waiter.conn)
            graph.hold(key, waiter.conn if conn is None else conn)
            if self._checking is None and self._notes:  # _checkSoon, inline
                self._checkSoon()
        elif key in self._waitedFor or key in self._cycleKeys:
            # A grant at once to a key somebody waits for (a shared key's
            # reader) or that a reported cycle ran through; any other
            # grant at once changes nothing the graph looks at (as
            # WaitForGraph.hold has it, without the call).
            self.graph.hold(key, conn)
            self._checkSoon()

    def dropped(self, now: float, key: bytes, token: int, owner: Optional[str],
                heldFor: float, expired: bool) -> None:
        if self._held:
            held = self._forgetHeld(key, token)
            if held is not None and owner is None:
                owner = held.owner
        forcing = self._forcing
        forced = forcing[2] if forcing is not None and forcing[:2] == (key, token) else None
        log = self._log  # as _note, inline: this runs at every grant and release
        log.append((_DROPPED, now, key, token, owner, heldFor, expired, forced))
        if len(log) >= FOLD_AT:
            self.fold()
        if key in self._cycleKeys:
            # Only a reported cycle through key has anything to check (as
            # WaitForGraph.unhold has it, without the call).
            self.graph.unhold(key)
            self._checkSoon()

    def renewed(self, now: float, key: bytes, token: int, owner: Optional[str],
                expiresAt: float) -> None:
        self._note((_RENEWED, now, key, token, owner, expiresAt - now))

    def roleChanged(self, now: float, role: str,
                    holders: Iterable[Tuple[bytes, HeldKey]]) -> None:
        """
        Only the active node's grants and queues are watched: what a
        standby mirrors comes and goes by replication, unseen here.  A node
        that becomes active starts from the grants it holds then (learned
        by replication, so their holders may be unknown).  Handing off is
        still active for this: the node is frozen, its grants and queues
        stay (an active holds back so for a moment when a peer joins), so
        nothing is forgotten or gone through again.
        """
        before, self._role = self._role, role
        if (role in _WATCHED) == (before in _WATCHED):
            return
        self._held.clear()
        self._longNow = 0
        self.graph.clear()
        self.stop()  # timers and long-hold deadlines start again from here
        if role not in _WATCHED:
            return
        # The wait-for graph reads the holders from the table (those that
        # came by replication have no connection: unknown to it).
        if self.warnHold is None:
            return
        for key, holder in sorted(holders, key=lambda item: item[1].grantedAt):
            self._held[(key, holder.token)] = _Held(holder.token, holder.owner,
                                                    holder.grantedAt)
            self._watch(holder.grantedAt + self.warnHold, key, holder.token)

    # -- the cluster's event sink ----------------------------------------------

    def clusterEvent(self, type: str, who: Optional[str] = None,
                     detail: Optional[str] = None) -> None:
        """
        Record a cluster event: C{promotion}, C{handoff}, C{peer-up} or
        C{peer-down}; C{who} names the node concerned.
        """
        self._event(type, None, None, who, detail)

    # -- deadlocks -------------------------------------------------------------

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

    def _checkSoon(self) -> None:
        if self._checking is None and self._notes:
            self._checking = self.clock.callLater(0, self._checkCycles)

    def _checkCycles(self) -> None:
        self._checking = None
        for cycle in self.graph.check(self.clock.seconds(), CHECK_BUDGET):
            # Not an event of the ring (its types are a fixed contract):
            # /status, the metrics and the log report deadlocks.
            self.log.warn("Deadlock: {cycle}", cycle=cycle.describe(_name))
        self._checkSoon()

    def deadlocks(self, limit: int = DEADLOCKS_LISTED) -> List[Dict[str, Any]]:
        """
        The first C{limit} cycles present now (oldest first); C{since} as
        Unix time.
        """
        now, wall = self.clock.seconds(), self.wallTime()
        out = []
        for cycle in islice(self.graph.cycles.values(), limit):
            entry = cycle.asDict(_name)
            entry["since"] = round(wall - (now - cycle.since), 3)
            out.append(entry)
        return out

    # -- long holds ------------------------------------------------------------

    # Every grant is watched for the same warnHold, so deadlines come in
    # grant order: a FIFO (not a heap) and one timer for its head.

    def _watch(self, at: float, key: bytes, token: int) -> None:
        self._due.append((at, key, token))
        if len(self._due) > 2 * len(self._held) + 4096:
            # Released grants leave their entries behind; drop them so
            # memory follows the held keys, not the grant rate.
            self._due = deque(entry for entry in self._due
                              if (entry[1], entry[2]) in self._held)
        if self._alarm is None:
            self._arm()

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
            held = self._held.get((key, token))
            if held is None or held.long:
                continue  # released (or handed over) in time
            held.long = True
            self._longNow += 1
            self.longHolds += 1
            who = held.owner or "unknown"
            self.log.warn(
                "Long hold: {key} held by {who} (token {token}) for more than {limit} s",
                key=key.decode("utf-8", "replace"), who=who, token=token,
                limit=f"{self.warnHold:g}",
            )
        self._arm()

    def isLongHold(self, key: bytes, token: int) -> bool:
        held = self._held.get((key, token))
        return held is not None and held.long

    def currentLongHolds(self) -> int:
        return self._longNow

    def _forgetHeld(self, key: bytes, token: int) -> Optional[_Held]:
        held = self._held.pop((key, token), None)
        if held is not None and held.long:
            self._longNow -= 1
        return held

    def stop(self) -> None:
        if self._alarm is not None and self._alarm.active():
            self._alarm.cancel()
        self._alarm = None
        if self._checking is not None and self._checking.active():
            self._checking.cancel()
        self._checking = None
        self._due.clear()

    # -- force-release ---------------------------------------------------------

    def forceRelease(self, service: Releaser, key: bytes, token: int, reason: str,
                     who: str) -> bool:
        """
        Release C{key}'s grant C{token} through the service's normal release
        path, recording the event as a force-release by C{who} for
        C{reason}.

        @return: True if the grant was released.
        """
        answers: List[bytes] = []
        self._forcing = (key, token, f"by {who}: {reason}")
        try:
            service.release(key, token, answers.append)
        finally:
            self._forcing = None
        released = bool(answers) and answers[0].endswith(b" OK\n")
        if released:
            self.forceReleases += 1
            self.log.warn("Force-release of {key} (token {token}) by {who}: {reason}",
                          key=key.decode("utf-8", "replace"), token=token, who=who,
                          reason=reason)
        return released

    # -- the mirror observer ---------------------------------------------------

    def mirrored(self, now: float,
                 changes: Iterable[Tuple[bytes, int, float, Optional[float], int]]) -> None:
        """
        A batch of changes learned from a peer: on an active node, the
        grants a heal merged in (and those it pushed out), shown as events
        and watched for long holds; a standby's mirror is not watched (see
        L{roleChanged}), so its batches are skipped at once.
        """
        if self._role not in _WATCHED:
            return
        for key, token, grantedAt, expiresAt, _ in changes:
            if expiresAt is None:
                self._forgetHeld(key, token)
                self._event(ev.RELEASE, key, token, None, "pushed out by a heal's merge")
                continue
            self._event(ev.GRANT, key, token, None, "merged on a heal")
            if self.warnHold is not None:
                self._held[(key, token)] = _Held(token, None, grantedAt)
                # Granted before the grants watched already: not before
                # them (the long-hold deadlines are a FIFO).
                at = grantedAt + self.warnHold
                self._watch(max(at, self._due[-1][0]) if self._due else at, key, token)
