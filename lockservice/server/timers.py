# -*- test-case-name: tests.server.test_leases -*-
"""
The service's timers: the wait and lease deadlines of one lock service
(the pure bookkeeping of L{lockservice.server.deadlines}) under one
reactor alarm, which rings for the earliest of them.

What comes due is handed back to the service, a bounded number per
reactor turn (L{TIMER_BUDGET} of each kind), inside one answer turn: a
wait that ran out to C{timedOut(waiter, now)}, a lease that ran out to
C{expired(key, token, now)}.  Leases come due only while C{expiring}
(a serving node): a standby mirrors its active's leases and never
expires one itself, and a frozen node keeps them filed until it serves
(L{lockservice.server.modes}).
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, Tuple, TypeVar

from lockservice.core.table import EXCLUSIVE, LockTable
from lockservice.server.deadlines import (
    TIMER_BUDGET,
    Alarm,
    Clock,
    HasDeadline,
    LeaseDeadlines,
    WaitDeadlines,
)
from lockservice.server.turn import AnswerTurn

W = TypeVar("W", bound=HasDeadline)


class Timers(Generic[W]):
    """
    @ivar waits: the deadlines of queued acquires that wait for a time.
    @ivar leases: the deadlines of grants (only filed while C{expiring}
        or frozen; see L{lockservice.server.modes}).
    @ivar alarm: the one reactor alarm, for the earliest of both.
    @ivar expiring: whether leases come due (this node serves).
    """

    def __init__(self, clock: Clock, table: LockTable, answers: AnswerTurn,
                 timedOut: Callable[[W, float], None],
                 expired: Callable[[bytes, int, float], None],
                 internalError: Callable[[str], None]) -> None:
        self.clock = clock
        self.table = table
        self.answers = answers
        self.timedOut = timedOut
        self.expired = expired
        self.internalError = internalError
        self.expiring = True
        self.waits: WaitDeadlines[W] = WaitDeadlines()
        self.leases = LeaseDeadlines(table.leaseOf, self._currentLease)
        self.alarm = Alarm(clock, self._due, self._nextDue)

    def _currentLease(self, key: bytes) -> Optional[Tuple[int, float]]:
        grant = self.table.grantOf(key)
        return None if grant is None else (grant[0], grant[2])

    def _nextDue(self) -> Optional[float]:
        due = self.waits.nextDue()
        if self.expiring:
            lease = self.leases.nextDue()
            if lease is not None and (due is None or lease < due):
                due = lease
        return due

    def _due(self, at: float) -> None:
        # The reactor judged `at` due; do not let float rounding disagree.
        now = max(self.clock.seconds(), at)
        outer = self.answers.open()
        try:
            for waiter in self.waits.due(now, TIMER_BUDGET):
                try:
                    self.timedOut(waiter, now)
                except Exception:
                    self.internalError("wait timeout")
            if self.expiring:  # not frozen or gone standby since armed
                for key, token in self.leases.due(now, TIMER_BUDGET):
                    try:
                        self.expired(key, token, now)
                    except Exception:
                        # One bad hand-over must not stop every later expiry.
                        self.internalError("lease expiry")
        finally:
            if outer:
                self.answers.close()

    def forgetWait(self, waiter: W) -> None:
        """
        C{waiter} left its queue before its wait ran out.
        """
        if self.waits.forget(waiter, mayRebuild=not self.alarm.firing):
            self.alarm.rearm()

    def fileLease(self, key: bytes, token: int, expiresAt: float, shared: bool) -> None:
        """
        File the lease of the grant C{token} of C{key}: C{shared} when it is
        one of a shared key's grants, else the key's only holder (see
        L{LeaseDeadlines}).
        """
        self.leases.file(key, token, expiresAt, shared)
        if expiresAt < self.alarm.at:
            self.alarm.arm(expiresAt)
        elif (not self.alarm.firing
              and self.leases.crowded(len(self.table.held) + self.table.sharedGrants)):
            self.fileAll()

    def fileAll(self) -> None:
        """
        File every grant's lease afresh (a promotion, or too many stale
        entries).
        """
        self.leases.clear()
        for key, token, _, expiresAt, share, _, delayed in self.table.everyGrant():
            assert expiresAt is not None  # (None marks a drop, never a grant)
            self.leases.file(key, token, expiresAt, share != EXCLUSIVE or delayed)
        self.alarm.rearm()

    def forgetWaits(self) -> None:
        """
        Every waiter left its queue (taken by the service).
        """
        self.waits.clear()
        self.alarm.rearm()

    def stop(self) -> None:
        self.leases.clear()
        self.waits.clear()
        self.alarm.cancel()
