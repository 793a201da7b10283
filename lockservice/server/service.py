# -*- test-case-name: tests.test_protocol -*-
"""
The lock service: the lock table plus the clock that drives it.

It owns every timer (lease expiry, wait timeout), answers the connections'
requests, and tells its observers (replication, metrics) about each change
of the table.  Whether this node may serve at all (active or standby) is
decided by the cluster layer through L{LockService.setRole}.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from math import ceil, inf
from typing import (
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    Optional,
    Protocol,
    Set,
    Tuple,
    Union,
    cast,
)

from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.core import wire
from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.core.table import (
    Grant,
    HandOverFailed,
    Holder,
    LockTable,
    TokenExhausted,
    TokenIssuer,
    Waiter,
)
from lockservice.server.monitor import REDIRECT, TIMEOUT, WITHDRAWAL, ActivityObserver

# Limits (options --max-keys, --max-waiters): far above what an ordinary
# deployment uses, low enough that one client cannot take the machine
# (a held key costs a few hundred bytes, a waiter about as much).
DEFAULT_MAX_KEYS = 1_000_000
DEFAULT_MAX_WAITERS = 10_000

# Deadlines handled per reactor turn: when more are due (10,000 waits that
# run out together), the rest wait for the next turn, so other clients'
# requests are served in between instead of after the whole pile.
TIMER_BUDGET = 1000

# The roles in which lease deadlines are kept filed (only an active node
# expires them).
_FILED = (ACTIVE, HANDING_OFF)

# Steps of background work (withdrawing a closed connection's waiters) per
# reactor turn.
CHUNK_BUDGET = 1000

# While answers are held (a standby has not taken the changes yet), how
# often to look again.
HOLD_RETRY = 0.001


def _leaseBucket(at: float) -> int:
    """
    The millisecond bucket of a lease deadline: bucket C{b} holds the
    deadlines in C{((b - 1) / 1000, b / 1000]}, so a deadline C{<= now}
    is never in a bucket after C{_leaseBucket(now)}.
    """
    return ceil(at * 1000)


class AnswerSink(Protocol):
    """
    Where a queued acquire's answer goes (a client connection).

    @ivar name: who the connection is: the name it sent with C{I}, else its
        peer address.  The table keeps the connection itself with each
        grant it holds, so its holders are shown by its current name.
    """

    name: str
    # True once the client is gone: its waiters are withdrawn lazily, and
    # a hand-over passes them by meanwhile.
    gone: bool

    def finish(self, waiter: "PendingAcquire", answer: bytes) -> None:
        """
        Answer C{waiter} (queued by this connection) with C{answer}.
        """

    def flushAnswers(self) -> None:
        """
        Send the answers gathered during the service's current turn.
        """


class _Run:
    """
    Consecutive waiters of one connection in one key's queue (pipelined
    acquires usually are): when that connection is gone and its run comes
    up for a hand-over, the whole run is cut out of the queue in O(1).

    @ivar last: its last waiter still linked in the queue.
    @ivar count: how many of its waiters are still linked.
    @ivar cut: True once the run was cut out: its waiters only wait for
        their lazy withdrawal.
    """

    __slots__ = ("last", "count", "cut")

    def __init__(self) -> None:
        self.last: Optional[PendingAcquire] = None
        self.count = 0
        self.cut = False


class PendingAcquire(Waiter):
    """
    A queued acquire: the table's waiter plus what is needed to answer it.

    @ivar conn: the connection that asked (its C{name} says who waits).
    @ivar deadline: (monotonic) time its wait runs out, 0 for no limit.
    @ivar answer: the answer once decided (the connection may hold it back
        to keep send order among equal keys).
    """

    __slots__ = ("conn", "deadline", "answer", "run")

    def __init__(self, key: bytes, lease: float, conn: AnswerSink) -> None:
        super().__init__(key, lease)
        self.conn = conn
        self.deadline = 0.0
        self.answer: Optional[bytes] = None
        self.run: Optional[_Run] = None

    def client(self) -> object:
        return self.conn


class _Alarm:
    """
    One reactor timer for the earliest of many deadlines kept in a heap.

    While it rings (C{fire} works through the due deadlines, or a budget of
    them) it is not re-armed; afterwards it is armed for C{nextDue()}, at
    once (the next reactor turn) when more are already due.  An exception
    in C{fire} never leaves it unarmed.
    """

    __slots__ = ("clock", "fire", "nextDue", "call", "at", "firing")

    def __init__(self, clock: IReactorTime, fire: Callable[[float], None],
                 nextDue: Callable[[], Optional[float]]) -> None:
        self.clock = clock
        self.fire = fire
        self.nextDue = nextDue
        self.call: Optional[IDelayedCall] = None
        self.at = inf
        self.firing = False

    def arm(self, at: float) -> None:
        if self.firing or at >= self.at:
            return
        self.cancel()
        self.at = at
        self.call = self.clock.callLater(max(0.0, at - self.clock.seconds()), self._ring)

    def rearm(self) -> None:
        self.cancel()
        due = self.nextDue()
        if due is not None:
            self.arm(due)

    def cancel(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        self.at = inf

    def _ring(self) -> None:
        at = self.at
        self.call = None
        self.at = inf
        self.firing = True
        try:
            self.fire(at)
        finally:
            self.firing = False
            self.rearm()


class Stats:
    """
    Plain counters, cheap on the hot path; exported as metrics on demand.
    """

    def __init__(self) -> None:
        self.grants = 0
        self.releasesOk = 0
        self.releasesStale = 0
        self.renewalsOk = 0
        self.renewalsStale = 0
        self.expirations = 0
        self.timeouts = 0
        self.redirects = 0
        self.errors = 0
        self.connections = 0
        self.internalErrors = 0
        # Refused by a limit: an acquire (keys, waiters), a connection, or
        # a connection closed for collecting STALE answers.
        self.rejectedKeys = 0
        self.rejectedWaiters = 0
        self.rejectedConnections = 0
        self.staleFloods = 0


class ChangeObserver(Protocol):
    """
    Told of every change to the held keys (replication, metrics), before
    the client concerned is answered.
    """

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float) -> None:
        """
        C{key} was granted to C{token} at C{grantedAt} until C{expiresAt}
        (monotonic seconds) after C{waited} seconds in the queue.
        """

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        The grant C{token} of C{key} (granted at C{grantedAt}) now runs
        until C{expiresAt}.
        """

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        """
        The grant C{token} of C{key} ended after C{heldFor} seconds: released,
        or C{expired}.
        """


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
        maxKeys: int = DEFAULT_MAX_KEYS,
        maxWaiters: int = DEFAULT_MAX_WAITERS,
    ) -> None:
        """
        @param maxKeys: an acquire that would make more keys held (or
            queued for) is refused C{E A <key> too many keys}.
        @param maxWaiters: an acquire that would queue more waiters on one
            key is refused C{E A <key> too many waiters}.
        """
        self.clock = clock
        self.maxLease = maxLease
        self.maxWait = maxWait
        self.maxKeys = maxKeys
        self.maxWaiters = maxWaiters
        self.table = LockTable(TokenIssuer(wallMicros))
        self.stats = Stats()
        self.observers: List[ChangeObserver] = []
        # Told who queues, waits, holds and lets go (the operator's view:
        # events, per-key statistics, long holds, deadlocks).
        self.activity: List[ActivityObserver] = []
        # Called before any answer is written to a client (the cluster
        # writes its replication stream to the standbys there).
        self.beforeAnswerHooks: List[Callable[[], Optional[bool]]] = []
        # Called when a turn of requests or timers begins (the cluster
        # checks there that this process has not just been frozen).
        self.beforeTurnHooks: List[Callable[[], None]] = []
        self.role = ACTIVE
        self.activeAddress: Optional[bytes] = None
        self.startedAt = clock.seconds()
        self.connections: Set[object] = set()
        self._errorsLogged: Set[str] = set()
        # Connections whose answers are being gathered in this reactor turn.
        self.turn: Optional[List[AnswerSink]] = None
        self._endOfTurn: Optional[IDelayedCall] = None
        # Connections whose answers wait for a hook (in order), and the
        # call that checks again.
        self._held: List[AnswerSink] = []
        self._retryHeld: Optional[IDelayedCall] = None
        # Lease deadlines, by millisecond bucket (L{_leaseBucket}): a heap of
        # bucket numbers, and per bucket the keys whose lease ends in it (a
        # bare key while it is the only one).  Grants made close together
        # share a bucket, so a held key costs about one list slot here
        # instead of a heap entry of its own; the deadline itself is the
        # holder's C{expiresAt}.  A release, renewal or hand-over leaves its
        # old entry behind (skipped when it comes up: the holder's deadline
        # is no longer in that bucket); they are dropped by a rebuild when
        # they pile up.
        self._leaseBuckets: Dict[int, Union[bytes, List[bytes]]] = {}
        self._leaseOrder: List[int] = []
        self._leaseEntries = 0
        # Due leases left over by the per-turn budget, in expiry order:
        # handled first in the next turn (so a crowded bucket is scanned
        # once, not once per turn).
        self._leaseBacklog: Deque[bytes] = deque()
        self._leaseAlarm = _Alarm(clock, self._leasesDue, self._nextLease)
        # Wait deadlines: (deadline, sequence, waiter).  A waiter that
        # leaves its queue otherwise leaves its entry behind, counted in
        # _staleWaits, and the heap is rebuilt when they pile up.
        self._waits: List[Tuple[float, int, PendingAcquire]] = []
        self._waitSeq = 0
        self._staleWaits = 0
        self._waitAlarm = _Alarm(clock, self._waitsDue, self._nextWait)
        # Background work run a chunk per reactor turn (see runInChunks).
        self._chores: Deque[Iterator[object]] = deque()
        self._choreCall: Optional[IDelayedCall] = None
        self._choresSpent = 0
        self._choresRunning = False

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
        before = self.role
        self.role = role
        self.activeAddress = activeAddress
        for watcher in self.activity:
            self._notify(watcher.roleChanged, self.clock.seconds(), role, self.table.holders())
        # Lease deadlines stay filed while handing off (frozen: none
        # expires, and the table changes only by a merge, filed too): an
        # active that holds back for a moment (a peer joining must get the
        # stream first) must not refile every held key when it goes on
        # (a million keys: about 0.4 s of frozen reactor).
        if before in _FILED and role not in _FILED:
            self._cancelLeaseTimers()
        elif before == ACTIVE and role != ACTIVE:
            self._leaseAlarm.cancel()
        if role in _FILED and before not in _FILED:
            # A standby files no leases: a promotion files every mirrored
            # one, whether the new active serves at once or is first
            # frozen until its peers take its stream.
            self._armAllLeases()
        elif role == ACTIVE and before != ACTIVE and not self._leaseAlarm.firing:
            self._leaseAlarm.rearm()
        if role not in (ACTIVE, HANDING_OFF):
            outer = self.openTurn()
            try:
                for waiter in self._takeWaiters():
                    self.stats.redirects += 1
                    self._waitEnded(waiter, REDIRECT)
                    waiter.conn.finish(waiter, wire.redirect(b"A", waiter.key, activeAddress))
            finally:
                if outer:
                    self.closeTurn()

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
        Every held key with a view of its current grant (read each at once:
        a view of a grant that has ended raises
        L{lockservice.core.table.StaleHolder}).
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
        elif self.role == HANDING_OFF:
            self._fileLease(key, now + remaining)  # armed when it serves again

    def beforeAnswer(self) -> bool:
        """
        Run the hooks that must complete before a client hears an answer.

        @return: True when answers may go out now; False when a hook says
            they must wait (a standby has not yet taken the changes they
            report): then they are held, in order, until it has.
        """
        ready = True
        for hook in self.beforeAnswerHooks:
            if hook() is False:
                ready = False
        return ready

    def mayAnswerNow(self) -> bool:
        """
        Whether an answer given outside a turn may be sent at once: nothing
        is held and every hook agrees.
        """
        if self._held:
            return False
        return not self.beforeAnswerHooks or self.beforeAnswer()

    def hold(self, conn: AnswerSink) -> None:
        """
        Keep C{conn}'s gathered answers until the hooks agree (after every
        answer held before them).
        """
        self._held.append(conn)
        if self._retryHeld is None:
            self._retryHeld = self.clock.callLater(HOLD_RETRY, self._releaseHeld)

    def _releaseHeld(self) -> None:
        self._retryHeld = None
        if not self.beforeAnswer():
            self._retryHeld = self.clock.callLater(HOLD_RETRY, self._releaseHeld)
            return
        held, self._held = self._held, []
        self._sendGathered(held)

    def _sendGathered(self, conns: List[AnswerSink]) -> None:
        for conn in conns:
            try:
                conn.flushAnswers()
            except Exception:
                self._internalError("sending answers")

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
        # A free key with waiters never exists, so "keys held or queued
        # for" is the number of held keys.
        table = self.table
        queued = table.queued(waiter.key)
        if queued is None:
            if len(table) >= self.maxKeys:
                self.stats.rejectedKeys += 1
                return wire.BadRequest(b"A", waiter.key, "too many keys").answer()
        elif queued >= self.maxWaiters:
            self.stats.rejectedWaiters += 1
            return wire.BadRequest(b"A", waiter.key, "too many waiters").answer()
        now = self.clock.seconds()
        try:
            grant = self.table.acquire(waiter, now)
        except TokenExhausted as e:
            self.stats.errors += 1
            return wire.BadRequest(b"A", waiter.key, str(e)).answer()
        if grant is not None:
            self._granted(grant, now, 0.0, waiter.conn)
            return wire.granted(grant.key, grant.token)
        if wait > 0:
            waiter.deadline = deadline = now + wait
            self._waitSeq += 1
            heappush(self._waits, (deadline, self._waitSeq, waiter))
            self._waitAlarm.arm(deadline)
        before = waiter.prev
        if (isinstance(before, PendingAcquire) and before.conn is waiter.conn
                and before.run is not None and before.run.last is before):
            run = before.run
        else:
            run = _Run()
        run.last = waiter
        run.count += 1
        waiter.run = run
        for watcher in self.activity:
            self._notify(watcher.queued, now, waiter)
        return None

    def release(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        """
        Release C{token}'s hold on C{key}; C{reply} gets the answer after the
        observers heard of it and before the key's next waiter hears of its
        grant.
        """
        if self.role != ACTIVE:
            self.stats.redirects += 1
            reply(wire.redirect(b"R", key, self.activeAddress))
            return
        holding = self.table.holding(key)
        if holding is None or holding[0] != token:
            self.stats.releasesStale += 1
            reply(wire.released(key, False))
            return
        self._takeBack(key, holding, self.clock.seconds(), expired=False, reply=reply)

    def renew(self, key: bytes, token: int, lease: float,
              reply: Callable[[bytes], object]) -> None:
        """
        Extend C{token}'s hold on C{key} to C{lease} seconds from now.
        """
        if self.role != ACTIVE:
            self.stats.redirects += 1
            reply(wire.redirect(b"N", key, self.activeAddress))
            return
        now = self.clock.seconds()
        table = self.table
        if table.renew(key, token, lease, now) is None:
            self.stats.renewalsStale += 1
            reply(wire.renewed(key, False))
            return
        self.stats.renewalsOk += 1
        _, grantedAt, expiresAt = cast(Tuple[int, float, float], table.grantOf(key))
        self._armLease(key, token, expiresAt)
        for observer in self.observers:
            self._notify(observer.renewed, key, token, grantedAt, expiresAt)
        if self.activity:
            owner = table.ownerOf(key)
            for watcher in self.activity:
                self._notify(watcher.renewed, now, key, token, owner, expiresAt)
        reply(wire.renewed(key, True))

    def withdraw(self, waiter: PendingAcquire) -> None:
        """
        Drop a waiter whose connection closed: O(1) (amortized).
        """
        if self._unqueue(waiter):
            self._forgetWait(waiter)
            self._waitEnded(waiter, WITHDRAWAL)

    def _unqueue(self, waiter: PendingAcquire) -> bool:
        """
        Take C{waiter} out of its queue (or, when its run was cut out
        already, only mark it so): O(1).

        @return: True if it was still waiting.
        """
        if not waiter.queued:
            return False
        run = waiter.run
        if run is not None and run.cut:
            waiter.queued = False
            return True
        if run is not None:
            self._leaveRun(waiter, run)
        return self.table.withdraw(waiter)

    @staticmethod
    def _leaveRun(waiter: PendingAcquire, run: _Run) -> None:
        # Call while waiter is still linked (its prev is still set).
        run.count -= 1
        if run.last is waiter:
            before = waiter.prev
            run.last = (before if isinstance(before, PendingAcquire) and before.run is run
                        else None)

    def _passGone(self, key: bytes) -> None:
        """
        Before a hand-over of C{key}: cut the runs of gone connections'
        waiters out of the head of its queue (O(1) each), so that the key
        goes to the first live waiter and never to a dead one.
        """
        queueOf = self.table.queueOf
        queue = queueOf(key)
        while queue is not None:
            head = queue.head
            if not isinstance(head, PendingAcquire) or not head.conn.gone:
                return
            run = head.run
            if run is None or run.last is None:
                self.withdraw(head)  # not in a run (never expected): one by one
            else:
                self.table.cut(key, head, run.last, run.count)
                run.cut = True
                run.count = 0
                run.last = None
            queue = queueOf(key)

    def runInChunks(self, work: Iterator[object]) -> None:
        """
        Run C{work} one step per item, at most C{CHUNK_BUDGET} steps per
        reactor turn for all such jobs together, so that long jobs
        (withdrawing 100,000 waiters, or 500 connections closing at once)
        never stall other clients.  Within that budget a job starts at once
        (a small one is then done before this returns).
        """
        self._chores.append(work)
        if self._choresSpent < CHUNK_BUDGET and not self._choresRunning:
            self._runChores(CHUNK_BUDGET - self._choresSpent)

    def _nextChores(self) -> None:
        self._choreCall = None
        self._choresSpent = 0
        if self._chores:
            self._runChores(CHUNK_BUDGET)

    def _runChores(self, budget: int) -> None:
        spent = 0
        outer = self.openTurn()
        self._choresRunning = True
        try:
            while self._chores and spent < budget:
                work = self._chores[0]
                try:
                    for _ in work:
                        spent += 1
                        if spent >= budget:
                            break
                    else:
                        self._chores.popleft()
                except Exception:
                    self._chores.popleft()
                    self._internalError("background work")
        finally:
            self._choresRunning = False
            self._choresSpent += spent
            if outer:
                self.closeTurn()
            # The next reactor turn resets the budget (and goes on).
            if self._choreCall is None:
                self._choreCall = self.clock.callLater(0, self._nextChores)

    # -- answers gathered per reactor turn -----------------------------

    def openTurn(self) -> bool:
        """
        Start gathering answers: until L{closeTurn}, what each connection
        is told is collected and sent in one write per connection.

        @return: True when this call opened the turn (and must close it).
        """
        if self.turn is not None:
            return False
        for hook in self.beforeTurnHooks:
            hook()
        self.turn = []
        return True

    def closeTurnSoon(self) -> None:
        """
        Close the turn once the reactor has handled every connection that
        was ready in this iteration (a C{callLater(0)} runs right after
        them, before the reactor waits again).

        Only when something must happen before answers (replication to
        standbys): then one write per standby carries the changes of all
        those connections, instead of one per connection.  A single node
        answers at once.
        """
        if not self.beforeAnswerHooks:
            self.closeTurn()
        elif self._endOfTurn is None:
            self._endOfTurn = self.clock.callLater(0, self.closeTurn)

    def closeTurn(self) -> None:
        """
        Send every connection the answers gathered since L{openTurn}.
        """
        if self._endOfTurn is not None:
            if self._endOfTurn.active():
                self._endOfTurn.cancel()
            self._endOfTurn = None
        turn, self.turn = self.turn, None
        if self.beforeAnswerHooks:
            # Also for a turn that made changes but answers nobody (an
            # expiry with no waiter): they must not wait for a later answer.
            ready = self.beforeAnswer()
            if self._held or not ready:
                for conn in turn or ():
                    self.hold(conn)
                if not ready and self._retryHeld is None:
                    self._retryHeld = self.clock.callLater(HOLD_RETRY, self._releaseHeld)
                return
        self._sendGathered(turn or [])

    # -- timers ----------------------------------------------------------

    def _nextWait(self) -> Optional[float]:
        return self._waits[0][0] if self._waits else None

    def _waitsDue(self, at: float) -> None:
        now = max(self.clock.seconds(), at)
        heap = self._waits
        budget = TIMER_BUDGET
        outer = self.openTurn()
        try:
            while heap and heap[0][0] <= now and budget:
                budget -= 1
                deadline, _, waiter = heappop(heap)
                if waiter.deadline != deadline:
                    self._staleWaits -= 1
                    continue
                waiter.deadline = 0.0
                try:
                    if self._unqueue(waiter):
                        self.stats.timeouts += 1
                        self._waitEnded(waiter, TIMEOUT)
                        waiter.conn.finish(waiter, wire.timedOut(waiter.key))
                except Exception:
                    self._internalError("wait timeout")
        finally:
            if outer:
                self.closeTurn()

    def _forgetWait(self, waiter: PendingAcquire) -> None:
        """
        C{waiter} left its queue before its wait ran out: its heap entry is
        now stale.
        """
        if waiter.deadline:
            waiter.deadline = 0.0
            self._staleWaits += 1
            if (self._staleWaits > 4096 and 2 * self._staleWaits > len(self._waits)
                    and not self._waitAlarm.firing):
                self._waits = [e for e in self._waits if e[2].deadline == e[0]]
                heapify(self._waits)
                self._staleWaits = 0
                self._waitAlarm.rearm()

    def _bucketKeys(self, bucket: int) -> List[bytes]:
        """
        The keys whose lease (still) ends in C{bucket}: entries left behind
        by a release, renewal or hand-over are skipped, and so is a key
        entered twice.
        """
        entries = self._leaseBuckets.get(bucket)
        if entries is None:
            return []
        expiresAt = self.table.expiresAt
        live: List[bytes] = []
        for key in (entries,) if isinstance(entries, bytes) else dict.fromkeys(entries):
            at = expiresAt(key)
            if at is not None and _leaseBucket(at) == bucket:
                live.append(key)
        return live

    def _nextLease(self) -> Optional[float]:
        if self.role != ACTIVE:
            return None  # only an active node expires leases
        if self._leaseBacklog:
            return 0.0  # due already: the next reactor turn
        order = self._leaseOrder
        while order:
            bucket = order[0]
            live = self._bucketKeys(bucket)
            if live:
                # The latest deadline of the first bucket: at most a
                # millisecond after the others, so they expire together.
                expiresAt = self.table.expiresAt
                return max(cast(float, expiresAt(key)) for key in live)
            heappop(order)
            self._dropBucket(bucket)
        return None

    def _dropBucket(self, bucket: int) -> None:
        entries = self._leaseBuckets.pop(bucket, None)
        if entries is not None:
            self._leaseEntries -= 1 if isinstance(entries, bytes) else len(entries)

    def _fileLease(self, key: bytes, expiresAt: float) -> None:
        bucket = _leaseBucket(expiresAt)
        entries = self._leaseBuckets.get(bucket)
        if entries is None:
            self._leaseBuckets[bucket] = key
            heappush(self._leaseOrder, bucket)
        elif isinstance(entries, bytes):
            self._leaseBuckets[bucket] = [entries, key]
        else:
            entries.append(key)
        self._leaseEntries += 1

    def _armLease(self, key: bytes, token: int, expiresAt: float) -> None:
        self._fileLease(key, expiresAt)
        if expiresAt < self._leaseAlarm.at:
            self._leaseAlarm.arm(expiresAt)
        elif (not self._leaseAlarm.firing
              and self._leaseEntries > 2 * len(self.table) + 4096):
            self._armAllLeases()

    def _leasesDue(self, at: float) -> None:
        if self.role != ACTIVE:
            return  # frozen or gone standby since the alarm was armed
        # The reactor judged `at` due; do not let float rounding disagree.
        now = max(self.clock.seconds(), at)
        last = _leaseBucket(now)
        order = self._leaseOrder
        expiresAt = self.table.expiresAt
        budget = TIMER_BUDGET
        outer = self.openTurn()
        try:
            backlog = self._leaseBacklog
            while backlog and budget:
                budget -= 1
                self._expireDue(backlog.popleft(), now)
            # Not due yet: filed back after the loop (filing them at once
            # would bring their bucket up again).
            later: List[bytes] = []
            while order and order[0] <= last and budget:
                bucket = heappop(order)
                live = self._bucketKeys(bucket)
                self._dropBucket(bucket)
                due = []
                for key in live:
                    if cast(float, expiresAt(key)) <= now:
                        due.append(key)
                    else:
                        later.append(key)
                # The same order as one heap of (deadline, key) would give.
                due.sort(key=lambda k: (cast(float, expiresAt(k)), k))
                backlog.extend(due[budget:])
                for key in due[:budget]:
                    budget -= 1
                    self._expireDue(key, now)
            for key in later:
                deadline = expiresAt(key)
                if deadline is not None:
                    self._fileLease(key, deadline)
        finally:
            if outer:
                self.closeTurn()

    def _expireDue(self, key: bytes, now: float) -> None:
        token = self.table.tokenOf(key)
        if token is None:
            return
        try:
            self._expire(key, token, now)
        except Exception:
            # One bad hand-over must not stop every later expiry.
            self._internalError("lease expiry")

    def _expire(self, key: bytes, token: int, now: float) -> None:
        holding = self.table.holding(key)
        if holding is None or holding[0] != token or holding[2] > now:
            return  # released, renewed, handed over or re-installed since
        self._takeBack(key, holding, now, expired=True)

    def _takeBack(self, key: bytes, holding: Tuple[int, float, float, object], now: float,
                  expired: bool, reply: Optional[Callable[[bytes], object]] = None) -> None:
        """
        End the grant of C{key} that C{holding} (C{table.holding(key)})
        describes, which must still hold it (a release, or an expiry), and
        hand the key to its next live waiter.  C{reply} hears a release's
        answer after the change went to the observers (replication) and
        before the next waiter hears of its grant.
        """
        table = self.table
        token, grantedAt, _, client = holding
        heldFor = now - grantedAt
        # nameOf(client), inline: only the operator's view wants it.
        owner = getattr(client, "name", None) if self.activity else None
        orphans: List[Waiter] = []
        self._passGone(key)
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
        self._dropped(key, token, heldFor, expired=expired, owner=owner, now=now)
        if reply is not None:
            reply(wire.released(key, True))
        self._afterHandOver(grant, orphans, now)

    def _armAllLeases(self) -> None:
        self._leaseBuckets = {}
        self._leaseOrder = []
        self._leaseEntries = 0
        self._leaseBacklog.clear()
        for key, _, _, expiresAt in self.table.grants():
            self._fileLease(key, expiresAt)
        if not self._leaseAlarm.firing:
            self._leaseAlarm.rearm()

    def _cancelLeaseTimers(self) -> None:
        self._leaseBuckets = {}
        self._leaseOrder = []
        self._leaseEntries = 0
        self._leaseBacklog.clear()
        self._leaseAlarm.cancel()

    def _takeWaiters(self) -> List[PendingAcquire]:
        waiters = cast(List[PendingAcquire], self.table.takeWaiters())
        for waiter in waiters:
            waiter.deadline = 0.0
        self._waits = []
        self._staleWaits = 0
        self._waitAlarm.cancel()
        return waiters

    # -- grants ----------------------------------------------------------

    def _granted(self, grant: Grant, now: float, waited: float, conn: AnswerSink) -> None:
        self.stats.grants += 1
        self._armLease(grant.key, grant.token, grant.expiresAt)
        for observer in self.observers:
            self._notify(observer.granted, grant.key, grant.token, now, grant.expiresAt, waited)
        if self.activity:
            owner = conn.name  # the connection the table keeps with the grant
            for watcher in self.activity:
                self._notify(watcher.granted, now, grant.key, grant.token, owner, grant.waiter,
                             waited, conn)

    def _afterHandOver(self, grant: Optional[Grant], orphans: List[Waiter], now: float) -> None:
        """
        Deliver a FIFO hand-over (after a release or an expiry) to its
        waiter, or answer the waiters that could not be served.
        """
        if grant is not None:
            waiter = grant.waiter
            assert isinstance(waiter, PendingAcquire)
            if waiter.run is not None:
                self._leaveRun(waiter, waiter.run)
            self._forgetWait(waiter)
            self._granted(grant, now, now - waiter.queuedAt, waiter.conn)
            waiter.conn.finish(waiter, wire.granted(grant.key, grant.token))
        for orphan in cast(List[PendingAcquire], orphans):
            self._forgetWait(orphan)
            self._waitEnded(orphan, "error")
            self.stats.errors += 1
            orphan.conn.finish(
                orphan, wire.BadRequest(b"A", orphan.key, "fencing token space exhausted").answer()
            )

    def _dropped(self, key: bytes, token: int, heldFor: float, expired: bool,
                 owner: Optional[str] = None, now: float = 0.0) -> None:
        for observer in self.observers:
            self._notify(observer.dropped, key, token, heldFor, expired)
        for watcher in self.activity:
            self._notify(watcher.dropped, now, key, token, owner, heldFor, expired)

    def _waitEnded(self, waiter: PendingAcquire, reason: str) -> None:
        for watcher in self.activity:
            self._notify(watcher.waitEnded, self.clock.seconds(), waiter, reason)

    def _notify(self, method: Callable[..., object], *args: object) -> None:
        # An observer's bug must not leave the table half-updated or a
        # client unanswered.
        try:
            method(*args)
        except Exception:
            self._internalError(f"observer {getattr(method, '__qualname__', method)}")

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
        self.closeTurn()
        self._cancelLeaseTimers()
        self._takeWaiters()
