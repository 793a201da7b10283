# -*- test-case-name: tests.server.test_protocol -*-
"""
How a grant is made and how it ends, on an active lock service: a
release, an expiry (with or without the lock-delay's kept place), an
operator's force-release, and the hand-over of the key to its next live
waiter (FIFO), each counted, filed under its lease and told to the
observers.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from twisted.internet.interfaces import IReactorTime

from lockservice.core import wire
from lockservice.core.table import EXCLUSIVE, Grant, HandOverFailed, LockTable, Waiter, nameOf
from lockservice.server.deadlines import Alarm, LeaseDeadlines
from lockservice.server.modes import SERVING
from lockservice.server.monitor import ActivityObserver
from lockservice.server.observers import Observers
from lockservice.server.observing import KeyObservers
from lockservice.server.stats import Stats
from lockservice.server.timers import Timers
from lockservice.server.waiters import AnswerSink, PendingAcquire, leaveRun, passGone


class Grants:
    """
    Part of L{lockservice.server.service.LockService}: grants made and
    ended, and hand-overs.
    """

    table: LockTable
    clock: IReactorTime
    mode: str
    lockDelay: float
    stats: Stats
    notify: Observers
    activity: List[ActivityObserver]
    timers: "Timers[PendingAcquire]"
    leases: LeaseDeadlines
    alarm: Alarm
    observing: KeyObservers
    _observed: Dict[bytes, Any]

    def release(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        raise NotImplementedError

    def withdraw(self, waiter: PendingAcquire) -> None:
        raise NotImplementedError

    def _letIn(self) -> None:
        raise NotImplementedError

    def _waitEnded(self, waiter: PendingAcquire, reason: str) -> None:
        raise NotImplementedError

    def _expire(self, key: bytes, token: int, now: float) -> None:
        place = self.table.placeOf(key, token)
        if place is None or place[1] > now:
            return  # released, renewed, handed over or re-installed since
        grantedAt, expiresAt, client, delayed = place
        if delayed:
            self._endPlace(key, token, now)
        elif self.lockDelay > 0:
            self._delay(key, token, grantedAt, expiresAt, client, now)
        else:
            self._takeBack(key, (token, grantedAt, expiresAt, client), now, expired=True)

    def _delay(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
               client: object, now: float) -> None:
        """
        Grant C{token} of C{key} expired: with a lock-delay its place stays
        taken until the delay ends (nobody is let in meanwhile), though the
        grant itself is over (STALE, and no longer observed).
        """
        until = expiresAt + self.lockDelay
        self.table.startDelay(key, token, until)
        self.stats.expirations += 1
        owner = nameOf(client) if self.activity else None
        self.notify.dropped(now, key, token, now - grantedAt, True, owner)
        self.notify.delayed(key, token, until)
        self.timers.fileLease(key, token, until, shared=True)
        if key in self._observed:
            self.observing.changed(key)

    def _endPlace(self, key: bytes, token: int, now: float) -> None:
        """
        A place kept by the lock-delay frees (its delay ended, or a
        force-release ended it): the key goes to its next waiters.
        """
        table = self.table
        orphans: List[Waiter] = []
        if table.waiterCount:
            passGone(table, key, self.withdraw)
        try:
            _, grant = table.release(key, token, now)
        except HandOverFailed as e:
            grant, orphans = None, e.waiters
        self.notify.delayEnded(key, token)
        if grant is not None or orphans:
            self._afterHandOver(grant, orphans, now)
        if table.pending:
            self._letIn()

    def forceRelease(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        """
        An operator's release of grant C{token} of C{key}: a release, which
        also ends every place of the key kept by the lock-delay (C{token}
        may name one).  C{reply} hears C{R key OK} when anything ended.
        """
        if self.mode != SERVING:
            self.release(key, token, reply)
            return
        answers: List[bytes] = []
        if self.table.holdingOf(key, token) is not None:
            self.release(key, token, answers.append)
        now = self.clock.seconds()
        ended = False
        for held, *_, delayed in self.table.sharedGrantsOf(key):
            if delayed:
                self._endPlace(key, held, now)
                ended = True
        reply(wire.released(key, ended or answers == [wire.released(key, True)]))

    def endGrant(self, key: bytes, token: int) -> None:
        """
        End grant C{token} of C{key} whether it holds the key or only keeps
        its place after its expiry (a release answered by a peer, learned
        on a heal: the release wins).
        """
        place = self.table.placeOf(key, token)
        if place is None:
            return
        if place[3]:
            self._endPlace(key, token, self.clock.seconds())
        else:
            self.release(key, token, lambda answer: None)

    def _takeBack(self, key: bytes, holding: Tuple[int, float, float, object], now: float,
                  expired: bool, reply: Optional[Callable[[bytes], object]] = None) -> None:
        """
        End the grant of C{key} that C{holding} (C{table.holding(key)})
        describes, which must still hold it (a release, or an expiry), and
        hand the key to its next live waiter.  C{reply} hears a release's
        answer after the change went to the observers (replication), in
        the same turn as the next waiter hears of its grant.
        """
        table = self.table
        token, grantedAt, _, client = holding
        heldFor = now - grantedAt
        owner = nameOf(client) if self.activity else None  # only the operator's view shows it
        orphans: List[Waiter] = []
        if table.waiterCount:  # (nothing to pass by otherwise)
            passGone(table, key, self.withdraw)
        takeBack = table.expire if expired else table.release
        try:
            _, grant = takeBack(key, token, now)
        except HandOverFailed as e:
            grant, orphans = None, e.waiters
        # The table no longer holds `token` here, whatever happened.
        if expired:
            self.stats.expirations += 1
        else:
            self.stats.releasesOk += 1
        self.notify.dropped(now, key, token, heldFor, expired, owner)
        if reply is not None:
            reply(wire.released(key, True))
        if grant is not None or orphans:
            self._afterHandOver(grant, orphans, now)
        if grant is None and key in self._observed:
            self.observing.changed(key)  # (a hand-over's grant tells them)
        if table.pending:
            self._letIn()

    def _granted(self, grant: Grant, now: float, waited: float, conn: AnswerSink,
                 shared: bool) -> None:
        """
        Count and file a grant made (C{shared}: a reader's or a semaphore's,
        one of its key's grants), and tell the observers.
        """
        self.stats.grants += 1
        self.timers.fileLease(grant.key, grant.token, grant.expiresAt, shared)
        self.notify.granted(now, grant.key, grant.token, grant.expiresAt, waited,
                            grant.waiter, conn)
        if self._observed and grant.key in self._observed:
            self.observing.changed(grant.key)

    def _afterHandOver(self, grant: Optional[Grant], orphans: List[Waiter], now: float) -> None:
        """
        Deliver a FIFO hand-over (after a release or an expiry) to its
        waiter, or answer the waiters that could not be served.
        """
        if grant is not None:
            waiter = grant.waiter
            assert isinstance(waiter, PendingAcquire)
            if waiter.run is not None:
                leaveRun(waiter, waiter.run)
            if waiter.deadline:  # (else it has no wait deadline to forget)
                self.timers.forgetWait(waiter)
            self._granted(grant, now, now - waiter.queuedAt, waiter.conn,
                          waiter.share != EXCLUSIVE)
            waiter.conn.finish(waiter, wire.granted(grant.key, grant.token))
        # (A string: a subscript would be evaluated at every hand-over.)
        for orphan in cast("List[PendingAcquire]", orphans):
            self.timers.forgetWait(orphan)
            self._waitEnded(orphan, "error")
            self.stats.errors += 1
            orphan.conn.finish(
                orphan, wire.BadRequest(b"A", orphan.key, "fencing token space exhausted").answer()
            )
