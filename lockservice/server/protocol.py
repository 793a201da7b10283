# -*- test-case-name: tests.server.test_protocol -*-
"""
The client line protocol: parse a line, ask the service, write the answer.
When a connection is read (backpressure, the per-iteration read budget)
is L{lockservice.server.reading}'s job; who may connect and who is closed
for STALE floods is decided in L{lockservice.server.admission}.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, List, Optional, Protocol

from twisted.internet.interfaces import IDelayedCall, IHalfCloseableProtocol
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from lockservice.core import groupwire, wire
from lockservice.internals import END_OF_INPUT, plainSocket, sendNow
from lockservice.server.admission import (  # noqa: F401 (re-exported for the tests)
    ADDRESS_TABLE_SIZE,
    ADMITTED,
    CLOSE_DECAY,
    PEER_GRACE,
    PEER_RESERVE,
    PROBATION,
    REFUSED,
    SLOW_AFTER_CLOSES,
    SLOW_STEP,
    STALE_LIMIT,
    STALE_WINDOW,
    Admission,
    StaleWindow,
)
from lockservice.server.hangups import HangUpSweep
from lockservice.server.observing import Observation
from lockservice.server.reading import (  # noqa: F401 (re-exported for the tests)
    MAX_HELD_BACK_BYTES,
    MAX_QUEUED_ACQUIRES,
    MIN_SHARE,
    READ_BUDGET,
    RESET_AFTER,
    PacedReceiver,  # noqa: F401 (the base of SendOrder, named in the docstrings)
    ReadBudget,
)
from lockservice.server.sendorder import SendOrder
from lockservice.server.service import LockService, PendingAcquire
from lockservice.tcp import noDelay

PEER_HELLO = b"HELLO"

# Default of --max-connections (client connections open at once); lowered
# at start when the file descriptor limit is smaller (see tap.py).
DEFAULT_MAX_CONNECTIONS = 10_000


class PeerHandler(Protocol):
    """
    What takes over a connection whose first line was a peer C{HELLO}.
    """

    def dataReceived(self, data: bytes) -> None: ...

    def connectionLost(self, reason: Failure) -> None: ...


# Given the transport and the HELLO line, returns the handler that gets
# every later byte of that connection (the cluster layer provides it).
PeerAcceptor = Callable[[Any, bytes], PeerHandler]


_ADMITTED, _PROBATION, _REFUSED = ADMITTED, PROBATION, REFUSED


@implementer(IHalfCloseableProtocol)
class LockProtocol(SendOrder):
    """
    One client connection.

    Its answers are written in send order per key, and a gone client's
    waits withdrawn, by its base L{SendOrder}; when it is read
    (backpressure, the read budget) is L{PacedReceiver}'s job, below that.

    @ivar name: who this connection is (shown for its holders and
        waiters): the name it sent with C{I}, else its peer address.
    @ivar ident: the name it sent with C{I} (None before): the holder name
        of the grants it is given from then on (L{LockTable} keeps each
        grant's, so a later C{I} does not rename a grant already made).
    """

    delimiter = b"\n"
    # A line may carry "\r\n": its content is still limited to MAX_LINE.
    MAX_LENGTH = wire.MAX_LINE + 1
    factory: "LockFactory"

    def __init__(self) -> None:
        super().__init__()
        self.ident: Optional[bytes] = None
        self._seenRequest = False
        self.peer: Optional[PeerHandler] = None
        self._batch: Optional[List[bytes]] = None
        self._socket: Any = None
        self._producing = False
        self._admission = _ADMITTED
        self._probation: Optional[IDelayedCall] = None
        self._staleWindow: Optional[StaleWindow] = None
        self.name = "?"
        # The peer's host (the key of the per-address STALE budget).
        self.host = "?"

    def connectionMade(self) -> None:
        service = self.service = self.factory.service
        address = self.transport.getPeer()  # type: ignore[union-attr]
        self.name = _addressName(address)
        self.host = str(getattr(address, "host", address))
        noDelay(self.transport)
        # A plain TCP transport lets us send straight to the socket; any
        # other transport (TLS, tests) goes through transport.write().
        self._socket = plainSocket(self.transport)
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._producing = True
        self._admission = self.factory.admission.admit(len(service.connections))
        delay = self.factory.admission.readDelay(self, service.clock.seconds())
        if delay > 0:
            self._slowed = service.clock.callLater(delay, self._endSlowStart)
            self._updateReading()
        if self._admission == _ADMITTED:
            service.connections.add(self)
            service.stats.connections += 1
        elif self._admission == _PROBATION:
            self._probation = service.clock.callLater(PEER_GRACE, self._refuse)
        else:
            self._refuse()

    def _endSlowStart(self) -> None:
        self._slowed = None
        self._updateReading()

    def _refuse(self) -> None:
        """
        Too many connections: say so and close.
        """
        self._probation = None
        self._leaveProbation()
        self.service.stats.rejectedConnections += 1
        self.write(wire.TOO_MANY_CONNECTIONS)
        self._close()

    def _leaveProbation(self) -> None:
        if self._admission == _PROBATION:
            self.factory.admission.probation -= 1
            self._admission = _REFUSED
            if self._probation is not None and self._probation.active():
                self._probation.cancel()
            self._probation = None

    def _close(self) -> None:
        """
        Send what is gathered, then close (a registered producer would keep
        the transport open: unregister it first).
        """
        self.flushAnswers()
        self._stopProducing()
        self.transport.loseConnection()  # type: ignore[union-attr]

    def _stopProducing(self) -> None:
        if self._producing:
            self._producing = False
            self.transport.unregisterProducer()  # type: ignore[union-attr]

    def hungUp(self) -> bool:
        """
        For a connection not read: when its socket says the peer went away
        (L{lockservice.internals.peerHungUp}), treat it as lost, as the
        reactor would once it read: its waiters are passed by and
        withdrawn.  A reset closes it (nobody reads what we would write).
        An end of input (a FIN) is handled as the reactor's
        C{readConnectionLost}, at once: its queued acquires are withdrawn,
        and the requests it sent that are still unread in the socket (a
        client that pipelined more than it read, then closed) are dropped
        with the connection -- read, they could only add waiters nobody
        would hear of.

        @return: True when the peer went away.
        """
        what = self.factory.hangUps.check(self.transport)
        if what is None or (what == END_OF_INPUT and self._putOff):
            # Input read and put off to the next iteration (the read
            # budget) is handled first: it may be a half-closed client's
            # last requests, whose answers it still reads.
            return False
        if what == END_OF_INPUT:
            self._buffer = b""
            self.readConnectionLost()
        else:
            # Lost: nobody reads what we would write, and input put off is
            # dropped, as at any reset of a connection not read.
            self._lost = True
            self._putOff = b""
            self._leave(writeDecided=False)
            self.transport.abortConnection()  # type: ignore[union-attr]
        return True

    # -- writing ---------------------------------------------------------

    def write(self, data: bytes) -> None:
        """
        Send an answer.  Answers produced during one of the service's turns
        (a chunk of input being processed, a batch of timers) are gathered
        and sent together at its end.
        """
        if self._batch is not None:
            self._batch.append(data)
            return
        turn = self.service.answers.current
        if turn is not None:
            self._batch = [data]
            turn.append(self)
        elif self.service.answers.mayAnswerNow():
            # Straight to the socket when nothing is buffered (see
            # internals.sendNow); the answer turn let replication go first.
            sendNow(self._socket, self.transport, data)
        else:
            self._batch = [data]
            self.service.answers.hold(self)

    def flushAnswers(self) -> None:
        batch, self._batch = self._batch, None
        if batch:
            sendNow(self._socket, self.transport, b"".join(batch))

    # -- reading ---------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.dataReceived(data)
            return
        if self._putOff or not self.factory.readBudget.spend(self, len(data)):
            # This iteration has handled enough input: the rest waits
            # (behind what already waits, in order).
            self._putOff += data
            self._updateReading()
            return
        answers = self.service.answers
        outer = answers.open()
        try:
            # The lines, read here rather than in a method of their own
            # (this is every request).
            if self._buffer:
                data = self._buffer + data
            lines = data.split(b"\n")
            self._buffer = lines.pop()
            for index, line in enumerate(lines):
                if line[-1:] == b"\r":
                    line = line[:-1]
                if len(line) > wire.MAX_LINE:
                    return self.lineLengthExceeded(line)
                self.lineReceived(line)
                if self.peer is not None:
                    # A peer handshake switched this connection over.
                    rest = b"\n".join(lines[index + 1:] + [self._buffer])
                    self._buffer = b""
                    self.flushAnswers()
                    if rest:
                        self.peer.dataReceived(rest)
                    return
                if self.transport.disconnecting:  # type: ignore[union-attr]
                    return
            if len(self._buffer) > wire.MAX_LINE and not (
                len(self._buffer) == wire.MAX_LINE + 1 and self._buffer[-1:] == b"\r"
            ):
                self.lineLengthExceeded(self._buffer)
        finally:
            if outer:
                answers.closeSoon()

    def lineLengthExceeded(self, line: bytes) -> None:
        self._buffer = b""
        self.service.stats.errors += 1
        self.write(wire.LINE_TOO_LONG)
        self._close()

    def lineReceived(self, line: bytes) -> None:
        if not line:
            return
        if not self._seenRequest:
            self._seenRequest = True
            acceptPeer = self.factory.peerAcceptor
            if line.startswith(PEER_HELLO + b" ") and acceptPeer is not None:
                # No longer a client connection: it carries the cluster's
                # peer protocol from now on (and writes on its own terms).
                self._leaveProbation()
                self.service.connections.discard(self)
                self._stopProducing()
                self.peer = acceptPeer(self.transport, line)
                return
            if self._admission == _PROBATION:
                if self.factory.admission.full(len(self.service.connections)):
                    self._refuse()
                    return
                self._leaveProbation()
                self._admission = _ADMITTED
                self.service.connections.add(self)
                self.service.stats.connections += 1
        service = self.service
        if line[:1] == b"G":
            fields = line.split(b" ")
            if fields[0] in groupwire.OPS:
                self._group(fields)
                return
        try:
            request = wire.parseRequest(line, service.maxLease, service.maxWait)
        except wire.BadRequest as e:
            service.stats.errors += 1
            if e.op == b"A" and e.key in self._pending:
                self._answerInTurn(e.key, e.answer())
            else:
                self.write(e.answer())
            return
        if isinstance(request, wire.Acquire):
            self._acquire(request)
        elif isinstance(request, wire.Release):
            service.release(request.key, request.token, self._tokenAnswer)
        elif isinstance(request, wire.Renew):
            service.renew(request.key, request.token, request.lease, self._tokenAnswer)
        elif isinstance(request, wire.Withdraw):
            self._withdraw(request.key)
        elif isinstance(request, wire.Observe):
            self._observe(request)
        elif isinstance(request, wire.Ping):
            self.write(wire.pong(request.word))
        else:
            # One str per connection: every key it then holds shares it.
            self.name = request.name.decode("utf-8")
            self.ident = request.name
            self.write(wire.identified(request.name))

    def _tokenAnswer(self, answer: bytes) -> None:
        """
        Write the answer to a release or renewal; count STALE answers, and
        close a connection that guesses tokens.
        """
        self.write(answer)
        if answer[-7:] != b" STALE\n":
            return
        now = self.service.clock.seconds()
        window = self._staleWindow
        if window is None:
            window = self._staleWindow = StaleWindow()
        admission = self.factory.admission
        if admission.stale(window, now):
            self.service.stats.staleFloods += 1
            admission.staleFlood(self, now)
            self._close()

    def _acquire(self, request: wire.Acquire) -> None:
        waiter = PendingAcquire(request.key, request.lease, self, request.share)
        answer = self.service.acquire(waiter, request.wait)
        earlier = self._pending.get(request.key)
        if answer is not None and not earlier:
            self.write(answer)
            return
        if earlier is None:
            earlier = self._pending[request.key] = deque()
        earlier.append(waiter)
        self._queued += 1
        if answer is not None:
            self.finish(waiter, answer)
        elif self._queued > MAX_QUEUED_ACQUIRES:
            self._updateReading()

    def _group(self, fields: List[bytes]) -> None:
        """
        A request of the group extension (see L{lockservice.core.groupwire}).
        """
        service = self.service
        try:
            request = groupwire.parseGroupRequest(fields, service.maxLease)
        except wire.BadRequest as e:
            service.stats.errors += 1
            self.write(e.answer())
            return
        self.write(service.groups.handle(request))

    def _withdraw(self, key: bytes) -> None:
        """
        C{C key}: withdraw this connection's oldest waiting acquire of
        C{key}, answered C{T key} before C{C key OK}; C{C key NONE} when
        none waits (a grant that crossed the withdrawal was written first).
        """
        service = self.service
        if not service.serving():
            service.stats.redirects += 1
            self.write(wire.redirect(b"C", key, service.activeAddress))
            return
        # Answers leave a key's queue from its front as soon as they are
        # decided, so its first entry is the oldest acquire still waiting.
        queue = self._pending.get(key)
        waiter = queue[0] if queue else None
        if waiter is None or waiter.answer is not None or not service.cancelWait(waiter):
            self.write(wire.withdrawn(key, False))
            return
        self.finish(waiter, wire.timedOut(key))
        self.write(wire.withdrawn(key, True))

    def _observe(self, request: wire.Observe) -> None:
        observation = Observation(request.key, request.token, self)
        answer = self.service.observe(observation, request.wait)
        earlier = self._observing.get(request.key)
        if answer is not None and not earlier:
            self.write(answer)
            return
        if earlier is None:
            earlier = self._observing[request.key] = deque()
        earlier.append(observation)
        self._queued += 1
        if answer is not None:
            self.finishObserve(observation, answer)
        elif self._queued > MAX_QUEUED_ACQUIRES:
            self._updateReading()

    def readConnectionLost(self) -> None:
        if self.peer is None:
            self._leave(writeDecided=True)
        else:
            self._close()

    def writeConnectionLost(self) -> None:
        self._close()

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self._producing = False
        self._lost = True
        self._leaveProbation()
        if self._slowed is not None and self._slowed.active():
            self._slowed.cancel()
        self._slowed = None
        if self.peer is not None:
            self.peer.connectionLost(reason)
            self.peer = None
        self.service.connections.discard(self)
        self.factory.hangUps.forget(self)
        self._leave(writeDecided=False)


def _addressName(address: Any) -> str:
    """
    C{host:port} of a peer address (C{[host]:port} for IPv6).
    """
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if host is None or port is None:
        return str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class LockFactory(Factory):
    """
    Builds client connections for one L{LockService}, at most
    C{maxConnections} of them at once (peer connections do not count).
    """

    protocol = LockProtocol  # type: ignore[assignment]
    noisy = False
    log = Logger()

    def __init__(self, service: LockService, peerAcceptor: Optional[PeerAcceptor] = None,
                 maxConnections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.service = service
        self.peerAcceptor = peerAcceptor
        self.readBudget = ReadBudget(service.clock)
        self.hangUps = HangUpSweep(service.clock)
        self.admission = Admission(maxConnections, acceptsPeers=peerAcceptor is not None)

    @property
    def probation(self) -> int:
        """
        Connections on probation now (see L{Admission}).
        """
        return self.admission.probation
