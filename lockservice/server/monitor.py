# -*- test-case-name: tests.server.test_monitor -*-
"""
The operator's view of one node: what happened (the event ring), to which
keys (per-key statistics), how busy the node was second by second, which
grants are held too long, which clients are deadlocked, and the admin's
force-release.

L{Monitor} is told of every change by the L{LockService} (it is one of
its C{activity} observers).  On that hot path it only notes the change (one
tuple appended to a log; for a grant or a release the service's fan-out
appends it itself, through the monitor's L{Lane}, and calls the monitor
only when there is more to do) and keeps the wait-for graph current (for a key
nobody waits for, two dict look-ups; a wait enters the graph only once it
has lasted L{WAIT_ENTERS_AFTER<lockservice.server.deadlocks.WAIT_ENTERS_AFTER>},
so the waits of a busy key, each as long as a hand-off, cost it nothing);
the rest is done by its parts, each in its own module:

  - L{changelog<lockservice.server.changelog>}: the log of noted changes,
    from which the event ring, the per-key statistics and the per-second
    series are derived when something reads them (a page, a check), or
    when it reaches L{FOLD_AT} entries, so they cost little per request;
  - L{deadlocks<lockservice.server.deadlocks>}: the wait-for graph, checked
    on a later reactor turn (deadlocks through shared keys are found from
    the table's holders and queues, read only when a check runs), and the
    cycles as the pages list them;
  - L{longholds<lockservice.server.longholds>}: the C{--warn-hold} watch.

The monitor's hot path reads their lists and calls their methods bound
once at start, so the split costs no call per change
(tests/server/test_callcount.py); they log through the monitor's logger.  It is
also told of the cluster's events (L{Monitor.clusterEvent}); it never
changes the table itself except through the service's normal release path
(force-release), so replication and the other observers see that release
like any other.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Tuple

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from lockservice.core import events as ev
from lockservice.core.election import ACTIVE
from lockservice.core.events import EventRing
from lockservice.core.series import Series
from lockservice.core.sketch import KeyStats
from lockservice.core.table import Change
from lockservice.server import changelog
from lockservice.server.changelog import FOLD_AT, ChangeLog
from lockservice.server.deadlocks import DEADLOCKS_LISTED, DeadlockChecks, SharedTable
from lockservice.server.longholds import HeldKey, LongHolds
from lockservice.server.modes import OWN_TABLE, modeOf

# Why a queued acquire stopped waiting without a grant.
TIMEOUT = ev.TIMEOUT
WITHDRAWAL = ev.WITHDRAWAL
REDIRECT = "redirect"

# The kinds of noted change (L{ChangeLog}'s), by the names the hot path uses.
_GRANTED, _DROPPED, _QUEUED = changelog.GRANTED, changelog.DROPPED, changelog.QUEUED
_ENDED, _RENEWED, _EVENT = changelog.ENDED, changelog.RENEWED, changelog.EVENT

# What DeadlockChecks.fresh.pop gives for a wait no longer fresh (in the
# wait-for graph).
_ENTERED = object()

__all__ = ["TIMEOUT", "WITHDRAWAL", "REDIRECT", "Named", "Waiter", "HeldKey",
           "ActivityObserver", "SharedTable", "Releaser", "Monitor"]


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


class Releaser(Protocol):
    """
    The part of the lock service that force-release needs.
    """

    def forceRelease(self, key: bytes, token: int,
                     reply: Callable[[bytes], object]) -> None: ...



def _watched(role: str) -> bool:
    """
    Whether the grants and queues of a node that shows C{role} are
    watched: its table is its own, serving or frozen (its queues stay).
    """
    return modeOf(role) in OWN_TABLE


class Lane:
    """
    How the service's fan-out (L{Observers<lockservice.server.observers.Observers>})
    notes a grant or a release for the monitor without calling it: it
    appends the entry to C{log} exactly as L{Monitor.granted} and
    L{Monitor.dropped} would, and calls the monitor only when there is
    more to do than the note.  Calling the monitor for every grant and
    release instead costs 7.6% of a node's instructions per acquire+release
    pair (see L{Observers.granted<lockservice.server.observers.Observers.granted>}).

    @ivar log: the monitor's change log (L{ChangeLog.log}).
    @ivar noteOnly: True while a note is all a change needs, unless the
        change ends a wait, its key is in C{waitedFor} or C{cycleKeys}
        (the wait-for graph looks at it), or the log is full: then call
        C{grantNoted} or C{dropNoted}.  False while long holds are
        watched (C{--warn-hold}) or a force-release runs: every change
        goes to the monitor's own C{granted} and C{dropped}.
    """

    __slots__ = ("log", "waitedFor", "cycleKeys", "noteOnly", "grantNoted", "dropNoted",
                 "granted", "dropped")

    def __init__(self, monitor: "Monitor") -> None:
        self.log = monitor._log
        self.waitedFor = monitor._waitedFor
        self.cycleKeys = monitor._cycleKeys
        self.noteOnly = monitor.warnHold is None
        self.grantNoted = monitor.grantNoted
        self.dropNoted = monitor.dropNoted
        self.granted = monitor.granted
        self.dropped = monitor.dropped


class Monitor:
    """
    The activity observer that feeds the operator's view, and what the
    pages ask of it.

    @ivar warnHold: seconds after which a grant still held is a long hold
        (logged once, counted, flagged), or None for no such check.
    @ivar forceReleases: how many force-releases were done.
    @ivar graph: the wait-for graph (its C{cycles} are the deadlocks now).
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
        # The collaborators log as the monitor (one namespace for its log).
        log = self.log
        self._changes = ChangeLog(clock, wallTime, events, trackedKeys, seriesSpan)
        # The parts' lists and methods the hot path uses, bound once so a
        # change costs no look-up through a part, nor a call more.
        self._log = self._changes.log  # appended to directly (and by the lane)
        self._fold = self._changes.fold
        self._note = self._changes.note
        self._checks = DeadlockChecks(clock, holderOf, table, log)
        self.graph = self._checks.graph
        self._checkSoon = self._checks.soon
        # The graph's keys waited for and keys of reported cycles: the lane
        # reads them on every grant and release, so that one of a key
        # nobody waits for costs two dict look-ups, not a call.
        self._waitedFor = self.graph.waitedFor
        self._cycleKeys = self.graph.cycleKeys
        # The waits not in the graph yet (DeadlockChecks.fresh): most end
        # before they would enter it, at the cost of a dict entry.
        self._fresh = self._checks.fresh
        # Without --warn-hold nothing is ever a long hold, and no grant is
        # watched (the table's holders are all there is per key).
        self._holds = LongHolds(clock, math.inf if warnHold is None else warnHold, log)
        self._held = self._holds.held  # read on every release
        self.forceReleases = 0
        self._forcing: Optional[Tuple[bytes, int, str]] = None
        self._role = ACTIVE  # a lock service starts active
        self.lane = Lane(self)

    # -- what is derived lazily ------------------------------------------------

    @property
    def events(self) -> EventRing:
        """
        The event ring, with every change noted so far.
        """
        if self._log:
            self._fold()
        return self._changes.events

    @property
    def keys(self) -> KeyStats:
        """
        The per-key statistics, with every change noted so far.
        """
        if self._log:
            self._fold()
        return self._changes.keys

    @property
    def series(self) -> Series:
        """
        The per-second series, with every change noted so far.
        """
        if self._log:
            self._fold()
        return self._changes.series

    def _event(self, type: str, key: Optional[bytes] = None, token: Optional[int] = None,
               who: Optional[str] = None, detail: Optional[str] = None,
               seconds: Optional[float] = None) -> None:
        # An event not noted by the hot path, in order with those.
        self._note((_EVENT, self.clock.seconds(), key, type, token, who, detail, seconds))

    # -- the activity observer -------------------------------------------------

    def queued(self, now: float, waiter: Waiter) -> None:
        self._changes.queuedNoted = True
        self._note((_QUEUED, now, waiter.key))
        # The wait enters the wait-for graph once it has lasted a while
        # (deadlocks.WAIT_ENTERS_AFTER).
        self._fresh[waiter] = None
        self._checks.enterSoon()

    def waitEnded(self, now: float, waiter: Waiter, reason: str) -> None:
        if reason in (TIMEOUT, WITHDRAWAL):  # the events; a redirect is none
            self._note((_ENDED, now, waiter.key, waiter.holderName(),
                        now - waiter.queuedAt, reason))
        if self._fresh.pop(waiter, _ENTERED) is _ENTERED:
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
        self._log.append((_GRANTED, now, key, token, owner, waited, waiter is not None))
        self.grantNoted(key, token, owner, now, waiter, conn)

    def grantNoted(self, key: bytes, token: int, owner: Optional[str], now: float,
                   waiter: Optional[Waiter], conn: Optional[Named]) -> None:
        """
        What follows the note of a grant (L{granted}; L{Lane}): the fold
        of a full log, the long-hold watch and the wait-for graph.
        """
        if len(self._log) >= FOLD_AT:
            self._fold()
        if self.warnHold is not None:
            # Only long-hold checks need a record per grant: without
            # --warn-hold the table's holders are all there is per key.
            self._holds.watch(key, token, owner, now)
        if waiter is not None and self._fresh.pop(waiter, _ENTERED) is _ENTERED:
            graph = self.graph
            graph.unwait(key, waiter.conn)
            graph.hold(key, waiter.conn if conn is None else conn)
            self._checkSoon()
        else:
            # A grant at once, or to a wait not in the graph yet: the graph
            # looks at it only for a key somebody waits for, or that a
            # reported cycle ran through (WaitForGraph.hold).
            if conn is None and waiter is not None:
                conn = waiter.conn
            self.graph.hold(key, conn)
            self._checkSoon()

    def dropped(self, now: float, key: bytes, token: int, owner: Optional[str],
                heldFor: float, expired: bool) -> None:
        if self._held:
            held = self._holds.forget(key, token)
            if held is not None and owner is None:
                owner = held.owner
        forcing = self._forcing
        forced = forcing[2] if forcing is not None and forcing[:2] == (key, token) else None
        self._log.append((_DROPPED, now, key, token, owner, heldFor, expired, forced))
        self.dropNoted(key)

    def dropNoted(self, key: bytes) -> None:
        """
        What follows the note of a release or an expiry (L{dropped};
        L{Lane}): the fold of a full log, and the wait-for graph.
        """
        if len(self._log) >= FOLD_AT:
            self._fold()
        self.graph.unhold(key)  # (only a reported cycle through key has anything to check)
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
        by replication, so their holders may be unknown).  A frozen node
        is still active for this: its grants and queues stay (an active
        holds back so for a moment when a peer joins), so nothing is
        forgotten or gone through again.
        """
        before, self._role = self._role, role
        if _watched(role) == _watched(before):
            return
        self._holds.clear()
        self.graph.clear()
        self._checks.forgetWaits()
        self.stop()  # timers and long-hold deadlines start again from here
        if not _watched(role):
            return
        # The wait-for graph reads the holders from the table (those that
        # came by replication have no connection: unknown to it).
        if self.warnHold is None:
            return
        self._holds.watchAll(holders)

    # -- the cluster's event sink ----------------------------------------------

    def clusterEvent(self, type: str, who: Optional[str] = None,
                     detail: Optional[str] = None) -> None:
        """
        Record a cluster event: C{promotion}, C{handoff}, C{peer-up} or
        C{peer-down}; C{who} names the node concerned.
        """
        self._event(type, None, None, who, detail)

    # -- what the pages ask ----------------------------------------------------

    def deadlocks(self, limit: int = DEADLOCKS_LISTED) -> List[Dict[str, Any]]:
        """
        The first C{limit} cycles present now (oldest first); C{since} as
        Unix time.
        """
        now, wall = self.clock.seconds(), self.wallTime()
        return self._checks.listed(now, wall, limit)

    @property
    def longHolds(self) -> int:
        """
        How many grants have been flagged as long holds since start.
        """
        return self._holds.count

    def isLongHold(self, key: bytes, token: int) -> bool:
        return self._holds.isLongHold(key, token)

    def currentLongHolds(self) -> int:
        return self._holds.current

    def stop(self) -> None:
        self._holds.stop()
        self._checks.stop()

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
        self.lane.noteOnly = False  # the release's note says it was forced
        try:
            service.forceRelease(key, token, answers.append)
        finally:
            self._forcing = None
            self.lane.noteOnly = self.warnHold is None
        released = bool(answers) and answers[0].endswith(b" OK\n")
        if released:
            self.forceReleases += 1
            self.log.warn("Force-release of {key} (token {token}) by {who}: {reason}",
                          key=key.decode("utf-8", "replace"), token=token, who=who,
                          reason=reason)
        return released

    # -- the mirror observer ---------------------------------------------------

    def mirrored(self, now: float,
                 changes: Iterable[Change]) -> None:
        """
        A batch of changes learned from a peer: on an active node, the
        grants a heal merged in (and those it pushed out), shown as events
        and watched for long holds; a standby's mirror is not watched (see
        L{roleChanged}), so its batches are skipped at once.
        """
        if not _watched(self._role):
            return
        for key, token, grantedAt, expiresAt, *_ in changes:
            if expiresAt is None:
                self._holds.forget(key, token)
                self._event(ev.RELEASE, key, token, None, "pushed out by a heal's merge")
                continue
            self._event(ev.GRANT, key, token, None, "merged on a heal")
            if self.warnHold is not None:
                self._holds.watch(key, token, None, grantedAt)
