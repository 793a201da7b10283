# -*- test-case-name: tests.server.test_limits -*-
"""
Queued acquires as the service keeps them: the table's waiter plus where
its answer goes, and the runs that let a gone connection's waiters be cut
out of a queue in O(1).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from lockservice.core.table import EXCLUSIVE, LockTable, Waiter


class AnswerSink(Protocol):
    """
    Where a queued acquire's answer goes (a client connection).

    @ivar name: who the connection is: the name it sent with C{I}, else its
        peer address.  The table keeps the connection itself with each
        grant it holds, so its holders are shown by its current name.
    """

    name: str
    # The name it sent with I (None before): the holder name of its grants.
    ident: Optional[bytes]
    # True once the client is gone: its waiters are withdrawn lazily, and
    # a hand-over passes them by meanwhile.
    gone: bool
    # True while the connection is not read (backpressure): the reactor
    # would not see its peer go, so a hand-over asks hungUp() first.
    notRead: bool

    def finish(self, waiter: "PendingAcquire", answer: bytes) -> None:
        """
        Answer C{waiter} (queued by this connection) with C{answer}.
        """

    def flushAnswers(self) -> None:
        """
        Send the answers gathered during the service's current turn.
        """

    def hungUp(self) -> bool:
        """
        For a connection not read: check its socket; when the peer went
        away, make the connection C{gone} and return True.
        """


class Run:
    """
    Consecutive waiters of one connection in one key's queue (pipelined
    acquires usually are): when that connection is gone and its run comes
    up for a hand-over, the whole run is cut out of the queue in O(1).  A
    waiter queued behind another connection's is in no run until one of
    its own connection's joins it behind (a lone waiter is passed by as
    cheaply, and most waiters are lone: one connection, one wait per key).

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

    def __init__(self, key: bytes, lease: float, conn: AnswerSink,
                 share: int = EXCLUSIVE) -> None:
        # Waiter.__init__, copied here: calling it (super().__init__)
        # costs 1,584 more instructions per acquire+release pair
        # (callgrind, pairs through the real protocol and service in one
        # process): 1.3% of a node's 126,525 per pair (`python -m
        # lockservice.bench instructions`).
        self.key = key
        self.lease = lease
        self.share = share
        self.queuedAt = 0.0
        self.queued = False
        self.prev = None
        self.next = None
        self.conn = conn
        self.deadline = 0.0
        self.answer: Optional[bytes] = None
        self.run: Optional[Run] = None

    def client(self) -> object:
        return self.conn


def joinRun(waiter: PendingAcquire) -> None:
    """
    C{waiter} was just queued: when the waiter before it is of the same
    connection, it extends that waiter's run (or starts one with it, or
    stays alone when that waiter is not its run's last); behind another
    connection's waiter, it stays alone (C{run} None).
    """
    before = waiter.prev
    if not isinstance(before, PendingAcquire) or before.conn is not waiter.conn:
        return
    run = before.run
    if run is None:
        run = before.run = Run()
        run.last = before
        run.count = 1
    elif run.last is not before:
        return
    run.last = waiter
    run.count += 1
    waiter.run = run


def leaveRun(waiter: PendingAcquire, run: Run) -> None:
    """
    C{waiter} leaves its queue: call while it is still linked (its C{prev}
    is still set).
    """
    run.count -= 1
    if run.last is waiter:
        before = waiter.prev
        run.last = (before if isinstance(before, PendingAcquire) and before.run is run
                    else None)


def unqueue(table: LockTable, waiter: PendingAcquire) -> bool:
    """
    Take C{waiter} out of its queue (or, when its run was cut out already,
    only mark it so): O(1).

    @return: True if it was still waiting.
    """
    if not waiter.queued:
        return False
    run = waiter.run
    if run is not None and run.cut:
        waiter.queued = False
        return True
    if run is not None:
        leaveRun(waiter, run)
    return table.withdraw(waiter)


def passGone(table: LockTable, key: bytes, withdraw: Callable[[PendingAcquire], None]) -> None:
    """
    Before a hand-over of C{key}: cut the runs of gone connections' waiters
    out of the head of its queue (O(1) each), so that the key goes to the
    first live waiter and never to a dead one.  A connection that is not
    read (paused) may be gone without knowing it: its socket is asked
    (one system call, for paused connections only; see server/hangups.py).
    """
    queueOf = table.queueOf
    queue = queueOf(key)
    while queue is not None:
        head = queue.head
        if not isinstance(head, PendingAcquire):
            return
        conn = head.conn
        if not conn.gone:
            if not conn.notRead or not conn.hungUp():
                return
            queue = queueOf(key)  # its withdrawal may have begun: look again
            continue
        run = head.run
        if run is None or run.last is None:
            withdraw(head)  # alone (not in a run): at once, O(1)
        else:
            table.cut(key, head, run.last, run.count)
            run.cut = True
            run.count = 0
            run.last = None
        queue = queueOf(key)
