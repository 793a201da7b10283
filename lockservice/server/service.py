# -*- test-case-name: tests.server.test_protocol -*-
"""
The lock service: the lock table plus the clock that drives it.

It answers the connections' requests (acquire, release, renew), expires
leases and ends waits, and says what changed.  Its rooms, one job each:

    timers.py     the wait and lease deadlines (deadlines.py, pure), one alarm
    turn.py       the answer turn: answers go out when replication allows
    observers.py  the fan-out of each change to its observers
    waiters.py    queued acquires and the runs of a gone connection
    chores.py     background work (withdrawals), bounded per reactor turn
    grants.py     how a grant is made and ends, and the key handed on
    stats.py      the plain counters
    mirror.py     what the cluster drives: tokens, redirects, the mirror

Whether this node serves, is frozen or redirects (L{lockservice.server.modes})
is decided by the cluster layer through L{LockService.setMode}.  Connections, and who may
connect, are L{lockservice.server.protocol} and
L{lockservice.server.admission}.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Set, Tuple, cast

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from lockservice.core import wire
from lockservice.core.election import ACTIVE
from lockservice.core.table import (
    EXCLUSIVE,
    HandOverFailed,
    LockTable,
    ShareMismatch,
    TokenExhausted,
    TokenIssuer,
    Waiter,
)
from lockservice.server.chores import CHUNK_BUDGET, Chores
from lockservice.server.deadlines import TIMER_BUDGET
from lockservice.server.grants import Grants
from lockservice.server.groups import GroupService
from lockservice.server.mirror import Mirroring
from lockservice.server.modes import OWN_TABLE, REDIRECTING, SERVING, modeOf, roleShown
from lockservice.server.monitor import REDIRECT, TIMEOUT, WITHDRAWAL, ActivityObserver
from lockservice.server.observers import ChangeObserver, Observers
from lockservice.server.observing import DEFAULT_MAX_OBSERVERS, KeyObservers, Observation
from lockservice.server.stats import Stats
from lockservice.server.timers import Timers
from lockservice.server.turn import HOLD_RETRY, AnswerTurn, HookGate
from lockservice.server.waiters import (
    AnswerSink,
    PendingAcquire,
    joinRun,
    passGone,
    unqueue,
)

__all__ = [
    "AnswerSink", "CHUNK_BUDGET", "ChangeObserver", "DEFAULT_MAX_KEYS", "DEFAULT_MAX_WAITERS",
    "HOLD_RETRY", "LockService", "PendingAcquire", "Stats", "TIMER_BUDGET",
]

# Limits (options --max-keys, --max-waiters): far above what an ordinary
# deployment uses, low enough that one client cannot take the machine
# (a held key costs a few hundred bytes, a waiter about as much).
DEFAULT_MAX_KEYS = 1_000_000
DEFAULT_MAX_WAITERS = 10_000

class LockService(Grants, Mirroring, Service):
    """
    Serves acquire/release requests on one node.

    @ivar observers: the change observers (replication, metrics).
    @ivar activity: the activity observers (the operator's view).
    @ivar answers: the answer turn (L{lockservice.server.turn}).
    @ivar beforeAnswerHooks: called before any answer is written to a
        client (the cluster writes its replication stream there); one
        returning False holds the answers until it agrees.
    @ivar beforeTurnHooks: called when a turn of requests or timers begins.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        wallMicros: Callable[[], int],
        maxLease: float = 86400.0,
        maxWait: float = 86400.0,
        maxKeys: int = DEFAULT_MAX_KEYS,
        maxWaiters: int = DEFAULT_MAX_WAITERS,
        maxObservers: int = DEFAULT_MAX_OBSERVERS,
        lockDelay: float = 0.0,
    ) -> None:
        """
        @param maxKeys: an acquire that would make more keys held (or
            queued for) is refused C{E A <key> too many keys}.
        @param maxWaiters: an acquire that would queue more waiters on one
            key is refused C{E A <key> too many waiters}.
        @param maxObservers: an observe that would make more observers wait
            on one key is refused C{E O <key> too many observers}.
        @param lockDelay: seconds an expired grant keeps its place in its
            key (0: none), so that a holder that was only paused can notice
            it lost the lock before anyone else starts.
        """
        self.clock = clock
        self.maxLease = maxLease
        self.maxWait = maxWait
        self.maxKeys = maxKeys
        self.maxWaiters = maxWaiters
        self.lockDelay = lockDelay
        self.table = LockTable(TokenIssuer(wallMicros))
        self.stats = Stats()
        self.notify = Observers(self._internalError)
        self.observers: List[ChangeObserver] = self.notify.changes
        self.activity: List[ActivityObserver] = self.notify.activity
        gate = HookGate()
        self.beforeAnswerHooks = gate.hooks
        self.answers = AnswerTurn(clock, gate, self._internalError)
        self.beforeTurnHooks = self.answers.onOpen
        # What this node does with requests (modes.py), and the role it
        # shows for it (/status, metrics, the peers' heartbeats).
        self.mode = SERVING
        self.role = ACTIVE
        self.activeAddress: Optional[bytes] = None
        self.startedAt = clock.seconds()
        self.connections: Set[object] = set()
        self._errorsLogged: Set[str] = set()
        self.timers: Timers[PendingAcquire] = Timers(
            clock, self.table, self.answers, self._timedOut, self._expire, self._internalError)
        # Its parts, named here for the requests, the mirror and the tests.
        timers = self.timers
        self.waits, self.leases, self.alarm = timers.waits, timers.leases, timers.alarm
        self.chores = Chores(clock, self._inTurn, self._internalError)
        self.groups = GroupService(clock, wallMicros, lambda: self.mode == SERVING,
                                   lambda: self.activeAddress)
        self.observing = KeyObservers(self.table.newest, self.runInChunks,
                                      lambda work: clock.callLater(0, work), maxObservers)
        # The observed keys (observing.byKey): every change looks here first.
        self._observed = self.observing.byKey
        # Whether the grant of the table's pending runs (readers after a
        # writer, free semaphore slots) is under way as a chore.
        self._lettingIn = False

    # -- the answer turn (see turn.py) -------------------------------------

    def _inTurn(self, work: Callable[[], None]) -> None:
        outer = self.answers.open()
        try:
            work()
        finally:
            if outer:
                self.answers.close()

    def runInChunks(self, work: Iterator[object]) -> None:
        """
        Run C{work} a bounded chunk per reactor turn (see L{Chores}).
        """
        self.chores.run(work)

    # -- mode (see modes.py) ----------------------------------------------

    def setRole(self, role: str, activeAddress: Optional[bytes]) -> None:
        """
        Show C{role} and do what it means (L{modes.modeOf}): C{active}
        serves, C{handing-off} is frozen, any other redirects to
        C{activeAddress}.
        """
        self.setMode(modeOf(role), activeAddress, role)

    def setMode(self, mode: str, activeAddress: Optional[bytes],
                role: Optional[str] = None) -> None:
        """
        Change what this node does with requests (see L{lockservice.server.modes}):
        serve, freeze, or redirect to C{activeAddress}, showing C{role}
        (what a redirecting node is: standby, syncing or leaving).
        """
        before = self.mode
        self.mode = mode
        self.role = roleShown(mode, role)
        self.timers.expiring = mode == SERVING
        self.activeAddress = activeAddress
        self.notify.roleChanged(self.clock.seconds(), self.role, self.table.holders)
        # Lease deadlines stay filed while frozen (none expires, and the
        # table changes only by a merge, filed too): an active that holds
        # back for a moment (a peer joining must get the stream first)
        # must not refile every held key when it goes on (a million keys:
        # about 0.4 s of frozen reactor).
        if before in OWN_TABLE and mode not in OWN_TABLE:
            self.leases.clear()
        if mode in OWN_TABLE and before not in OWN_TABLE:
            # A redirecting node files no leases: a promotion files every
            # mirrored one, whether the new active serves at once or is
            # first frozen until its peers take its stream.
            self.timers.fileAll()
        self.alarm.rearm()  # leases are due only while serving
        if mode == REDIRECTING:
            outer = self.answers.open()
            try:
                for waiter in self._takeWaiters():
                    self.stats.redirects += 1
                    self._waitEnded(waiter, REDIRECT)
                    waiter.conn.finish(waiter, wire.redirect(b"A", waiter.key, activeAddress))
            finally:
                if outer:
                    self.answers.close()
            if self.observing.count:
                self.runInChunks(self._redirectObservers(activeAddress))

    def serving(self) -> bool:
        """
        Whether this node still has clients' waits of its own: serving, or
        frozen (its waiters are still its own).
        """
        return self.mode in OWN_TABLE

    # -- requests from connections ---------------------------------------

    def acquire(self, waiter: PendingAcquire, wait: float) -> Optional[bytes]:
        """
        @return: the answer line when the request is answered at once, or
            None when it is queued (the connection is told later through
            C{finish}).
        """
        if self.mode != SERVING:
            self.stats.redirects += 1
            return wire.redirect(b"A", waiter.key, self.activeAddress)
        # A free key with waiters never exists, so "keys held or queued
        # for" is the number of held keys.
        table = self.table
        queued = table.queued(waiter.key)
        if queued is None:
            if len(table.held) >= self.maxKeys:
                self.stats.rejectedKeys += 1
                return wire.BadRequest(b"A", waiter.key, "too many keys").answer()
        elif queued >= self.maxWaiters:
            self.stats.rejectedWaiters += 1
            return wire.BadRequest(b"A", waiter.key, "too many waiters").answer()
        now = self.clock.seconds()
        try:
            grant = table.acquire(waiter, now)
        except (TokenExhausted, ShareMismatch) as e:
            self.stats.errors += 1
            return wire.BadRequest(b"A", waiter.key, str(e)).answer()
        if grant is not None:
            self._granted(grant, now, 0.0, waiter.conn, waiter.share != EXCLUSIVE)
            return wire.granted(grant.key, grant.token)
        if wait > 0:
            self.waits.add(waiter, now + wait)
            self.alarm.arm(waiter.deadline)
        joinRun(waiter)
        if self.activity:
            self.notify.queued(now, waiter)
        return None

    def release(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        """
        Release C{token}'s hold on C{key}; C{reply} gets the answer after the
        observers heard of it, in the same turn as the key's next waiter
        hears of its grant (which goes to its socket first: see turn.py).
        """
        if self.mode != SERVING:
            self.stats.redirects += 1
            reply(wire.redirect(b"R", key, self.activeAddress))
            return
        holding = self.table.holding(key)
        if holding is None or holding[0] != token:
            # Another grant of a shared key (the one shown may also be a
            # place kept by the lock-delay)?
            holding = self.table.holdingOf(key, token)
        if holding is None:
            self.stats.releasesStale += 1
            reply(wire.released(key, False))
            return
        self._takeBack(key, holding, self.clock.seconds(), expired=False, reply=reply)

    def renew(self, key: bytes, token: int, lease: float,
              reply: Callable[[bytes], object]) -> None:
        """
        Extend C{token}'s hold on C{key} to C{lease} seconds from now.
        """
        if self.mode != SERVING:
            self.stats.redirects += 1
            reply(wire.redirect(b"N", key, self.activeAddress))
            return
        now = self.clock.seconds()
        table = self.table
        holder = table.renew(key, token, lease, now)
        if holder is None:
            self.stats.renewalsStale += 1
            reply(wire.renewed(key, False))
            return
        self.stats.renewalsOk += 1
        held, grantedAt, expiresAt = cast("Tuple[int, float, float]", table.grantOf(key))
        owner: Callable[[], Optional[str]] = lambda: table.ownerOf(key)  # noqa: E731
        if held != token:  # one of a shared key's grants
            grantedAt, expiresAt = holder.grantedAt, holder.expiresAt
            owner = lambda: holder.owner  # noqa: E731
        # One of a shared key's grants, or its earliest (shown in its slot).
        self.timers.fileLease(key, token, expiresAt, held != token or table.isShared(key))
        self.notify.renewed(now, key, token, grantedAt, expiresAt, owner)
        reply(wire.renewed(key, True))

    def observe(self, observation: Observation, wait: float) -> Optional[bytes]:
        """
        C{O}: the answer when it is answered at once (a redirect, a limit,
        or the key's newest live grant is not the token it sent), or None
        when it waits for a change (its connection is told through
        C{finishObserve}).
        """
        key = observation.key
        if self.mode != SERVING:
            self.stats.redirects += 1
            return wire.redirect(b"O", key, self.activeAddress)
        observing = self.observing
        answer = observing.answerNow(observation)
        if answer is not None:
            return answer
        if observing.full(key):
            self.stats.rejectedObservers += 1
            return wire.BadRequest(b"O", key, "too many observers").answer()
        observing.add(observation)
        if wait > 0:
            self.waits.add(observation, self.clock.seconds() + wait)  # type: ignore[arg-type]
            self.alarm.arm(observation.deadline)
        return None

    def unobserve(self, observation: Observation) -> None:
        """
        Drop an observer whose connection closed: O(1).
        """
        if self.observing.remove(observation):
            self.timers.forgetWait(observation)  # type: ignore[arg-type]

    def _observedTimedOut(self, observation: Observation) -> None:
        if self.observing.remove(observation):
            observation.conn.finishObserve(observation,
                                           self.observing.state(observation.key))

    def _redirectObservers(self, activeAddress: Optional[bytes]) -> Iterator[None]:
        for observation in self.observing.takeAll():
            self.timers.forgetWait(observation)  # type: ignore[arg-type]
            self.stats.redirects += 1
            observation.conn.finishObserve(
                observation, wire.redirect(b"O", observation.key, activeAddress))
            yield None

    def withdraw(self, waiter: PendingAcquire) -> None:
        """
        Drop a waiter whose connection closed: O(1) (amortized).
        """
        if self._unwait(waiter):
            self.stats.waitersDropped += 1

    def cancelWait(self, waiter: PendingAcquire) -> bool:
        """
        Take a waiter out of its queue because its client withdrew it
        (C{C}): O(1).  Its connection answers it C{T}.  Also on a frozen
        node: the waiters it still has are its own to withdraw.

        @return: False when it was no longer waiting.
        """
        if self._unwait(waiter):
            self.stats.withdrawals += 1
            return True
        return False

    def _unwait(self, waiter: PendingAcquire) -> bool:
        if not unqueue(self.table, waiter):
            return False
        self.timers.forgetWait(waiter)
        self._waitEnded(waiter, WITHDRAWAL)
        if self.table.pending:
            self._letIn()  # the waiters behind it may fit now
        return True

    def _letIn(self) -> None:
        """
        Grant the waiters that fit beside their keys' holders now (the run
        of readers after a writer's release, semaphore slots freed, the
        readers behind a withdrawn writer), in FIFO order per key, at most
        a chore's budget per reactor turn: 100,000 readers let in at once
        do not stall the others.  New acquires of those keys queue behind
        them meanwhile.
        """
        if not self._lettingIn:
            self._lettingIn = True
            self.runInChunks(self._grantPending())

    def _grantPending(self) -> Iterator[None]:
        table = self.table
        try:
            while self.mode == SERVING:
                key = table.nextPending()
                if key is None:
                    return
                passGone(table, key, self.withdraw)
                now = self.clock.seconds()
                orphans: List[Waiter] = []
                try:
                    grant = table.grantHead(key, now)
                except HandOverFailed as e:
                    grant, orphans = None, e.waiters
                self._afterHandOver(grant, orphans, now)
                yield None
        finally:
            self._lettingIn = False

    # -- deadlines (see timers.py) -----------------------------------------

    def _timedOut(self, waiter: PendingAcquire, now: float) -> None:
        if type(waiter) is Observation:
            self._observedTimedOut(waiter)  # type: ignore[arg-type]
            return
        if unqueue(self.table, waiter):
            self.stats.timeouts += 1
            self._waitEnded(waiter, TIMEOUT)
            waiter.conn.finish(waiter, wire.timedOut(waiter.key))
            if self.table.pending:
                self._letIn()

    def _takeWaiters(self) -> List[PendingAcquire]:
        waiters = cast("List[PendingAcquire]", self.table.takeWaiters())
        for waiter in waiters:
            waiter.deadline = 0.0
        self.timers.forgetWaits()
        return waiters

    def _waitEnded(self, waiter: PendingAcquire, reason: str) -> None:
        if self.activity:
            self.notify.waitEnded(self.clock.seconds(), waiter, reason)

    def _internalError(self, where: str) -> None:
        """
        Log the exception being handled, once per C{where} (a bug that
        repeats must not flood the log), and count every occurrence.
        """
        self.stats.internalErrors += 1
        if where not in self._errorsLogged:
            self._errorsLogged.add(where)
            self.log.failure("internal error in {where} (logged once; later ones are counted "
                             "in lockservice_internal_errors)", where=where)

    # -- lifecycle -------------------------------------------------------

    def uptime(self) -> float:
        return self.clock.seconds() - self.startedAt

    def stopService(self) -> None:
        super().stopService()
        self.answers.close()
        self._takeWaiters()
        self.observing.takeAll()
        self.timers.stop()
