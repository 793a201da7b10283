# -*- test-case-name: tests.test_protocol -*-
"""
The lock service: the lock table plus the clock that drives it.

It owns every timer (lease expiry, wait timeout), answers the connections'
requests, and tells its observers (replication, metrics) about each change
of the table.  Whether this node may serve at all (active or standby) is
decided by the cluster layer through L{LockService.setRole}.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from math import inf
from typing import Callable, Iterator, List, Optional, Protocol, Set, Tuple, cast

from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.core import wire
from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.core.table import Grant, Holder, LockTable, TokenExhausted, TokenIssuer, Waiter


class AnswerSink(Protocol):
    """
    Where a queued acquire's answer goes (a client connection).
    """

    def finish(self, waiter: "PendingAcquire", answer: bytes) -> None: ...


class PendingAcquire(Waiter):
    """
    A queued acquire: the table's waiter plus what is needed to answer it.
    """

    __slots__ = ("conn", "timer", "answer")

    def __init__(self, key: bytes, lease: float, conn: AnswerSink) -> None:
        super().__init__(key, lease)
        self.conn = conn
        self.timer: Optional[IDelayedCall] = None
        self.answer: Optional[bytes] = None


class Stats:
    """
    Plain counters, cheap on the hot path; exported as metrics on demand.
    """

    def __init__(self) -> None:
        self.grants = 0
        self.releasesOk = 0
        self.releasesStale = 0
        self.expirations = 0
        self.timeouts = 0
        self.redirects = 0
        self.errors = 0
        self.connections = 0


class ChangeObserver(Protocol):
    """
    Told of every change to the held keys (replication, metrics).
    """

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float) -> None: ...

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None: ...


class LockService(Service):
    """
    Serves acquire/release requests on one node.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        wallMicros: Callable[[], int],
        maxLease: float = 86400.0,
        maxWait: float = 86400.0,
    ) -> None:
        self.clock = clock
        self.maxLease = maxLease
        self.maxWait = maxWait
        self.table = LockTable(TokenIssuer(wallMicros))
        self.stats = Stats()
        self.observers: List[ChangeObserver] = []
        # Called before any answer is written to a client (the cluster
        # writes its replication stream to the standbys there).
        self.beforeAnswerHooks: List[Callable[[], None]] = []
        self.role = ACTIVE
        self.activeAddress: Optional[bytes] = None
        self.startedAt = clock.seconds()
        self.connections: Set[object] = set()
        self._deadlines: List[Tuple[float, bytes, int]] = []
        self._alarm: Optional[IDelayedCall] = None
        self._alarmAt = inf

    # -- role ------------------------------------------------------------

    def setRole(self, role: str, activeAddress: Optional[bytes]) -> None:
        """
        Change what this node does with requests.

        Only an active node grants, releases and runs lease timers.  While
        handing off, the node is frozen: new requests are answered
        C{M ... *}, queued waiters stay queued until the successor has taken
        over.  In any other role queued waiters are redirected to
        C{activeAddress}, and they move there.
        """
        wasActive = self.role == ACTIVE
        self.role = role
        self.activeAddress = activeAddress
        if wasActive and role != ACTIVE:
            self._cancelLeaseTimers()
        if role == ACTIVE and not wasActive:
            self._armAllLeases()
        if role not in (ACTIVE, HANDING_OFF):
            for waiter in self._takeWaiters():
                self._cancelWaitTimer(waiter)
                self.stats.redirects += 1
                waiter.conn.finish(waiter, wire.redirect(b"A", waiter.key, activeAddress))

    # -- the interface the cluster layer drives ----------------------------

    def setActiveAddress(self, activeAddress: Optional[bytes]) -> None:
        """
        Where redirects (C{M}) point while this node is not active.
        """
        self.activeAddress = activeAddress

    def lastToken(self) -> int:
        """
        The highest fencing token this node has issued or learned.
        """
        return self.table.tokens.last

    def observeToken(self, token: int) -> None:
        """
        Fold in a token learned from a peer (tokens must rise cluster-wide).
        """
        self.table.tokens.observe(token)

    def heldKeys(self) -> Iterator[Tuple[bytes, Holder]]:
        """
        Every held key with its current grant (for snapshots and status).
        """
        return self.table.holders()

    def heldCount(self) -> int:
        return len(self.table)

    def installHolder(self, key: bytes, token: int, remaining: float, age: float = 0.0) -> None:
        """
        Mirror a grant learned by replication (or, on an active node, merged
        on a heal): C{key} held by C{token} for C{remaining} more seconds,
        granted C{age} seconds ago.
        """
        now = self.clock.seconds()
        self.table.install(key, token, now - age, now + remaining)
        if self.role == ACTIVE:
            self._armLease(key, token, now + remaining)

    def beforeAnswer(self) -> None:
        """
        Run the hooks that must complete before a client hears an answer.
        """
        for hook in self.beforeAnswerHooks:
            hook()

    def dropHolder(self, key: bytes, token: int) -> None:
        """
        Mirror a release or expiry learned by replication.
        """
        self.table.drop(key, token)

    def clearHolders(self) -> None:
        """
        Forget every held key (a full snapshot follows).
        """
        self.table.clear()

    # -- requests from connections ---------------------------------------

    def acquire(self, waiter: PendingAcquire, wait: float) -> Optional[bytes]:
        """
        @return: the answer line when the request is answered at once, or
            None when it is queued (the connection is told later through
            C{finish}).
        """
        if self.role != ACTIVE:
            self.stats.redirects += 1
            return wire.redirect(b"A", waiter.key, self.activeAddress)
        now = self.clock.seconds()
        try:
            grant = self.table.acquire(waiter, now)
        except TokenExhausted as e:
            self.stats.errors += 1
            return wire.BadRequest(b"A", waiter.key, str(e)).answer()
        if grant is not None:
            self._granted(grant, now, 0.0)
            return wire.granted(grant.key, grant.token)
        if wait > 0:
            waiter.timer = self.clock.callLater(wait, self._waitExpired, waiter)
        return None

    def release(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        """
        Release C{token}'s hold on C{key}; C{reply} gets the answer before
        the key's next waiter hears of its grant.
        """
        if self.role != ACTIVE:
            self.stats.redirects += 1
            reply(wire.redirect(b"R", key, self.activeAddress))
            return
        now = self.clock.seconds()
        holder = self.table.holder(key)
        if holder is None or holder.token != token:
            self.stats.releasesStale += 1
            reply(wire.released(key, False))
            return
        heldFor = now - holder.grantedAt
        try:
            _, grant = self.table.release(key, token, now)
        except TokenExhausted:
            grant = None
        self.stats.releasesOk += 1
        reply(wire.released(key, True))
        self._dropped(key, token, heldFor, expired=False)
        if grant is not None:
            self._handedOver(grant, now)

    def withdraw(self, waiter: PendingAcquire) -> None:
        """
        Drop a waiter whose connection closed.
        """
        if self.table.withdraw(waiter):
            self._cancelWaitTimer(waiter)

    # -- timers ----------------------------------------------------------

    def _waitExpired(self, waiter: PendingAcquire) -> None:
        waiter.timer = None
        if self.table.withdraw(waiter):
            self.stats.timeouts += 1
            waiter.conn.finish(waiter, wire.timedOut(waiter.key))

    # Lease timers: one heap of (expiresAt, key, token) and a single reactor
    # alarm for its earliest entry.  A release leaves its entry behind (it is
    # skipped when it comes up); that is cheaper on the hot path than a
    # DelayedCall per grant, and the heap is rebuilt when stale entries
    # pile up.

    def _armLease(self, key: bytes, token: int, expiresAt: float) -> None:
        heappush(self._deadlines, (expiresAt, key, token))
        if expiresAt < self._alarmAt:
            self._setAlarm(expiresAt)
        elif self._alarmAt != -inf and len(self._deadlines) > 2 * len(self.table) + 4096:
            self._armAllLeases()

    def _setAlarm(self, at: float) -> None:
        if self._alarm is not None and self._alarm.active():
            self._alarm.cancel()
        self._alarmAt = at
        self._alarm = self.clock.callLater(
            max(0.0, at - self.clock.seconds()), self._leasesDue, at
        )

    def _leasesDue(self, at: float) -> None:
        self._alarm = None
        self._alarmAt = -inf  # no re-arming while we work through the heap
        # The reactor judged `at` due; do not let float rounding disagree.
        now = max(self.clock.seconds(), at)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, key, token = heappop(heap)
            self._expire(key, token, now)
        self._alarmAt = inf
        if heap:
            self._setAlarm(heap[0][0])

    def _expire(self, key: bytes, token: int, now: float) -> None:
        holder = self.table.holder(key)
        if holder is None or holder.token != token or holder.expiresAt > now:
            return  # released, handed over or re-installed since
        heldFor = now - holder.grantedAt
        try:
            _, grant = self.table.expire(key, token, now)
        except TokenExhausted:
            return
        self.stats.expirations += 1
        self._dropped(key, token, heldFor, expired=True)
        if grant is not None:
            self._handedOver(grant, now)

    def _armAllLeases(self) -> None:
        self._deadlines = [(h.expiresAt, k, h.token) for k, h in self.table.holders()]
        heapify(self._deadlines)
        if self._alarmAt != -inf:
            self._alarmAt = inf
            if self._alarm is not None and self._alarm.active():
                self._alarm.cancel()
            self._alarm = None
            if self._deadlines:
                self._setAlarm(self._deadlines[0][0])

    def _cancelLeaseTimers(self) -> None:
        self._deadlines = []
        if self._alarm is not None and self._alarm.active():
            self._alarm.cancel()
        self._alarm = None
        self._alarmAt = inf

    def _takeWaiters(self) -> List[PendingAcquire]:
        return cast(List[PendingAcquire], self.table.takeWaiters())

    def _cancelWaitTimer(self, waiter: PendingAcquire) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    # -- grants ----------------------------------------------------------

    def _granted(self, grant: Grant, now: float, waited: float) -> None:
        self.stats.grants += 1
        self._armLease(grant.key, grant.token, grant.expiresAt)
        for observer in self.observers:
            observer.granted(grant.key, grant.token, now, grant.expiresAt, waited)

    def _handedOver(self, grant: Grant, now: float) -> None:
        """
        Deliver a FIFO hand-over (after a release or an expiry) to its waiter.
        """
        waiter = grant.waiter
        assert isinstance(waiter, PendingAcquire)
        self._cancelWaitTimer(waiter)
        self._granted(grant, now, now - waiter.queuedAt)
        waiter.conn.finish(waiter, wire.granted(grant.key, grant.token))

    def _dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        for observer in self.observers:
            observer.dropped(key, token, heldFor, expired)

    # -- lifecycle -------------------------------------------------------

    def uptime(self) -> float:
        return self.clock.seconds() - self.startedAt

    def stopService(self) -> None:
        super().stopService()
        self._cancelLeaseTimers()
        for waiter in self._takeWaiters():
            self._cancelWaitTimer(waiter)
