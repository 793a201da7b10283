# -*- test-case-name: tests.test_protocol -*-
"""
The client line protocol: parse a line, ask the service, write the answer.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol

from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure
from zope.interface import implementer

from lockservice.core import wire
from lockservice.internals import nothingBuffered, plainSocket
from lockservice.server.service import LockService, PendingAcquire
from lockservice.tcp import noDelay

PEER_HELLO = b"HELLO"


class PeerHandler(Protocol):
    """
    What takes over a connection whose first line was a peer C{HELLO}.
    """

    def dataReceived(self, data: bytes) -> None: ...

    def connectionLost(self, reason: Failure) -> None: ...


# Given the transport and the HELLO line, returns the handler that gets
# every later byte of that connection (the cluster layer provides it).
PeerAcceptor = Callable[[Any, bytes], PeerHandler]


@implementer(IHalfCloseableProtocol)
class LockProtocol(LineOnlyReceiver):
    """
    One client connection.

    Answers to queued acquires are written in send order per key, as the
    protocol requires for equal (op, key) pairs: a later request's timeout
    is held back until the earlier request on the same key is answered.

    An end of input (a FIN: the client closed its socket, died, or only
    shut down its sending side as C{printf ... | nc} does) withdraws every
    acquire of this connection that is still queued, at once: the server
    cannot tell these cases apart, and a dead waiter must never be handed a
    lock.  Answers already decided are written before the server closes.

    @ivar name: who this connection is (shown for its holders and
        waiters): the name it sent with C{I}, else its peer address.
    """

    delimiter = b"\n"
    # A line may carry "\r\n": its content is still limited to MAX_LINE.
    MAX_LENGTH = wire.MAX_LINE + 1
    factory: "LockFactory"

    def __init__(self) -> None:
        self._pending: Dict[bytes, Deque[PendingAcquire]] = {}
        self._seenRequest = False
        self.peer: Optional[PeerHandler] = None
        self._batch: Optional[List[bytes]] = None
        self._socket: Any = None
        self.name = "?"

    def connectionMade(self) -> None:
        self.service = self.factory.service
        self.service.connections.add(self)
        self.service.stats.connections += 1
        self.name = _addressName(self.transport.getPeer())  # type: ignore[union-attr]
        noDelay(self.transport)
        # A plain TCP transport lets us send straight to the socket; any
        # other transport (TLS, tests) goes through transport.write().
        self._socket = plainSocket(self.transport)

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
        turn = self.service.turn
        if turn is not None:
            self._batch = [data]
            turn.append(self)
        else:
            self._send(data)

    def flushAnswers(self) -> None:
        batch, self._batch = self._batch, None
        if batch:
            self._send(b"".join(batch))

    def _send(self, data: bytes) -> None:
        # When nothing is buffered we send at once and hand only what the
        # kernel did not take to the transport (see internals.nothingBuffered).
        self.service.beforeAnswer()
        transport: Any = self.transport
        if self._socket is not None and nothingBuffered(transport):
            try:
                sent = self._socket.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = 0  # the transport will find the error and close
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)

    # -- reading ---------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.dataReceived(data)
            return
        service = self.service
        outer = service.openTurn()
        try:
            self._readLines(data)
        finally:
            if outer:
                service.closeTurn()

    def _readLines(self, data: bytes) -> None:
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

    def lineLengthExceeded(self, line: bytes) -> None:
        self._buffer = b""
        self.service.stats.errors += 1
        self.write(wire.LINE_TOO_LONG)
        self.flushAnswers()
        self.transport.loseConnection()  # type: ignore[union-attr]

    def lineReceived(self, line: bytes) -> None:
        if not line:
            return
        if not self._seenRequest:
            self._seenRequest = True
            acceptPeer = self.factory.peerAcceptor
            if line.startswith(PEER_HELLO + b" ") and acceptPeer is not None:
                # No longer a client connection: it carries the cluster's
                # peer protocol from now on.
                self.service.connections.discard(self)
                self.peer = acceptPeer(self.transport, line)
                return
        service = self.service
        try:
            request = wire.parseRequest(line, service.maxLease, service.maxWait)
        except wire.BadRequest as e:
            service.stats.errors += 1
            self.write(e.answer())
            return
        if isinstance(request, wire.Acquire):
            self._acquire(request)
        elif isinstance(request, wire.Release):
            service.release(request.key, request.token, self.write)
        elif isinstance(request, wire.Renew):
            service.renew(request.key, request.token, request.lease, self.write)
        elif isinstance(request, wire.Ping):
            self.write(wire.pong(request.word))
        else:
            # One str per connection: every key it then holds shares it.
            self.name = request.name.decode("utf-8")
            self.write(wire.identified(request.name))

    def _acquire(self, request: wire.Acquire) -> None:
        waiter = PendingAcquire(request.key, request.lease, self)
        answer = self.service.acquire(waiter, request.wait)
        earlier = self._pending.get(request.key)
        if answer is not None and not earlier:
            self.write(answer)
            return
        if earlier is None:
            earlier = self._pending[request.key] = deque()
        earlier.append(waiter)
        if answer is not None:
            self.finish(waiter, answer)

    def finish(self, waiter: PendingAcquire, answer: bytes) -> None:
        """
        Answer a queued acquire, keeping send order among equal keys.
        """
        waiter.answer = answer
        queue = self._pending[waiter.key]
        while queue and queue[0].answer is not None:
            self.write(queue.popleft().answer)  # type: ignore[arg-type]
        if not queue:
            del self._pending[waiter.key]

    def _withdrawAll(self) -> None:
        """
        Withdraw every queued acquire of this connection (O(1) each) and
        write the answers that were already decided, in order.
        """
        pending, self._pending = self._pending, {}
        service = self.service
        for queue in pending.values():
            for waiter in queue:
                if waiter.answer is None:
                    service.withdraw(waiter)
                else:
                    self.write(waiter.answer)

    def readConnectionLost(self) -> None:
        if self.peer is None:
            self._withdrawAll()
        self.transport.loseConnection()  # type: ignore[union-attr]

    def writeConnectionLost(self) -> None:
        self.transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        if self.peer is not None:
            self.peer.connectionLost(reason)
            self.peer = None
        self.service.connections.discard(self)
        pending, self._pending = self._pending, {}
        for queue in pending.values():
            for waiter in queue:
                self.service.withdraw(waiter)


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
    Builds client connections for one L{LockService}.
    """

    protocol = LockProtocol  # type: ignore[assignment]
    noisy = False

    def __init__(self, service: LockService, peerAcceptor: Optional[PeerAcceptor] = None) -> None:
        self.service = service
        self.peerAcceptor = peerAcceptor
