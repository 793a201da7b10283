# -*- test-case-name: tests.server.test_limits -*-
"""
How a client connection is read: backpressure (stop reading while the
answers do not drain) and the per-iteration read budget shared by every
connection (L{ReadBudget}), so no client, however much it sends or
however little it reads, holds the node up or costs unbounded memory.

L{PacedReceiver} is the base of the client connection
(L{lockservice.server.protocol.LockProtocol}), which parses and answers;
this class decides when the transport reads.  It knows its factory only
as L{PacedFactory}, so this module imports nothing of the protocol's.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol

from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.protocols.basic import LineOnlyReceiver
from zope.interface import implementer

from lockservice.server.hangups import HangUpSweep

# Client input handled per reactor iteration, all connections together:
# past it, a connection's input waits (unread in the kernel) for the next
# iteration.  Without it, 50 connections each delivering 64 KiB of
# pipelined requests kept one iteration busy for over a second: no
# heartbeat went out, and a standby promoted.  256 KiB is about 12,000
# requests, some tens of milliseconds.
READ_BUDGET = 256 * 1024
RESET_AFTER = 32 * 1024
# The least input a connection put off handles per iteration (a few lines).
MIN_SHARE = 256

# Backpressure also counts what the transport does not see: answers held
# back for send order (behind an earlier acquire of the same key), and the
# connection's acquires still queued.  Past either bound the connection is
# not read until they drain.
MAX_HELD_BACK_BYTES = 256 * 1024
MAX_QUEUED_ACQUIRES = 100_000


class PacedFactory(Protocol):
    """
    What a paced connection reads of its factory: the node's read budget
    and its hang-up sweep (shared by every connection).
    """

    readBudget: "ReadBudget"
    hangUps: HangUpSweep


@implementer(IPushProducer)
class PacedReceiver(LineOnlyReceiver):
    """
    A line receiver read only while its answers drain and the node's
    read budget allows.

    Backpressure: the connection is a streaming producer of answers for its
    transport.  When the transport's unsent answers pass its buffer size it
    pauses us, and we stop reading the client's requests until they drain,
    so a client that sends without reading costs bounded memory.  Answers
    held back for send order, and the connection's queued acquires, count
    too (L{MAX_HELD_BACK_BYTES}, L{MAX_QUEUED_ACQUIRES}); the subclass
    keeps C{_heldBytes} and C{_queued}.
    """

    factory: PacedFactory

    def __init__(self) -> None:
        # Set once the client is gone (or sent its end of input).
        self.gone = False
        # Paused by the transport (its buffer is full), and paused by us
        # (held-back answers, queued acquires, input put off, slowed).
        self._writePaused = False
        self._readPaused = False
        # The same, for the hand-over and the hang-up sweep: a connection
        # not read must have its socket checked (see server/hangups.py).
        self.notRead = False
        self._heldBytes = 0
        self._queued = 0
        self._lost = False
        # Input put off to the next reactor iteration (see READ_BUDGET).
        self._putOff = b""
        # Left unread for a while at first (a new connection from an address
        # that guesses tokens over reconnects; see admission.py).
        self._slowed: Optional[IDelayedCall] = None

    def pauseProducing(self) -> None:
        self._writePaused = True
        self._updateReading()

    def resumeProducing(self) -> None:
        self._writePaused = False
        self._updateReading()

    def _overloaded(self) -> bool:
        return (self._heldBytes > MAX_HELD_BACK_BYTES or self._queued > MAX_QUEUED_ACQUIRES
                or bool(self._putOff))

    def readPutOff(self, share: int) -> None:
        """
        A new reactor iteration: handle up to C{share} bytes of the input
        put off (see L{ReadBudget}), cut at a line's end; the rest waits
        for the next iteration again, behind the other connections put off,
        so one connection's small request never waits behind all of
        another's backlog.  Read again once nothing is put off.
        """
        data, self._putOff = self._putOff, b""
        if self._lost:
            return
        rest = b""
        if len(data) > share:
            cut = data.rfind(b"\n", 0, share) + 1 or share
            data, rest = data[:cut], data[cut:]
        if data:
            self.dataReceived(data)
        if rest and not self._lost:
            if self._putOff:
                self._putOff += rest  # put off again, and queued again, by dataReceived
            else:
                self._putOff = rest
                self.factory.readBudget.requeue(self)
        self._updateReading()

    def _updateReading(self) -> None:
        """
        Read while the transport's buffer has room and neither held-back
        answers nor queued acquires pass their bound.
        """
        paused = self._writePaused or self._overloaded() or self._slowed is not None
        if paused == self._readPaused or self.gone:
            return
        self._readPaused = self.notRead = paused
        self.factory.hangUps.watch(self, paused)
        if paused:
            self.transport.pauseProducing()  # type: ignore[union-attr]
        else:
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def hungUp(self) -> bool:
        """
        For a connection not read: whether its peer went away (see
        L{lockservice.server.hangups}).
        """
        raise NotImplementedError

    def stopProducing(self) -> None:
        pass  # the connection is going away; connectionLost cleans up


class ReadBudget:
    """
    How much client input the node handles per reactor iteration
    (L{READ_BUDGET}), over all its connections.  A connection over budget
    stops reading, and its input is handled first thing in the next
    iterations, in the order the connections were put off, a fair share
    of the budget each per iteration.

    What was spent resets at the next iteration, once it passes
    L{RESET_AFTER}: below that, no timer is set (most iterations of a busy
    node read a few requests; a timer per iteration would cost more than
    the requests).
    """

    def __init__(self, clock: Any, budget: int = READ_BUDGET) -> None:
        self.clock = clock
        self.budget = budget
        self.spent = 0
        self.waiting: List["PacedReceiver"] = []
        self._served: List["PacedReceiver"] = []
        self._next: Optional[IDelayedCall] = None

    def spend(self, protocol: "PacedReceiver", size: int) -> bool:
        """
        @return: True when C{protocol} may handle C{size} bytes now; False
            when it must wait for the next iteration (it is then queued).
        """
        if self.spent >= self.budget:
            self.waiting.append(protocol)
            if self._next is None:
                self._next = self.clock.callLater(0, self._nextIteration)
            return False
        self.spent += size
        if self.spent > RESET_AFTER and self._next is None:
            self._next = self.clock.callLater(0, self._nextIteration)
        return True

    def requeue(self, protocol: "PacedReceiver") -> None:
        """
        C{protocol} handled its share of this iteration and still has
        input put off: it goes on at a next iteration, behind the
        connections that did not have their turn in this one.
        """
        self._served.append(protocol)

    def _nextIteration(self) -> None:
        self._next = None
        self.spent = 0
        waiting, self.waiting = self.waiting, []
        # Round robin: each connection put off handles its share of this
        # iteration's budget, so a connection with one request behind a
        # thousand with 64 KiB each is answered in this iteration or the
        # next, not after all of theirs (measured from outside: a worst
        # ping of 0.6 s).  Those put off again without their turn (the
        # budget ran out) lead the next iteration.
        share = max(MIN_SHARE, self.budget // max(1, len(waiting)))
        for protocol in waiting:
            protocol.readPutOff(share)
        served, self._served = self._served, []
        if served:
            self.waiting.extend(served)
            if self._next is None:
                self._next = self.clock.callLater(0, self._nextIteration)
