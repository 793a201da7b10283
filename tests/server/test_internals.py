"""
The private Twisted internals of lockservice.internals still behave as we
rely on, on whichever Twisted this run uses (tox runs the oldest and the
newest supported).
"""

from __future__ import annotations

import socket
from typing import Any, List, Optional

import pytest
import pytest_twisted
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import StringTransport

from lockservice import internals


class _Keep(Protocol):
    made: "Deferred[Any]"

    def connectionMade(self) -> None:
        self.made.callback(self.transport)


def test_plainSocketNotForTestTransports() -> None:
    assert internals.plainSocket(StringTransport()) is None


def test_plainSocketNotForWrappers() -> None:
    """
    A wrapping transport (as TLS is) that forwards attribute look-ups to the
    TCP transport below must not be taken for a plain socket.
    """

    class Forwarding:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    fake = Forwarding(StringTransport())
    fake._inner.socket = object()
    fake._inner._tempDataLen = 0
    assert internals.plainSocket(fake) is None


@pytest_twisted.inlineCallbacks
def test_plainSocketAndBufferOnRealTcp() -> Any:
    server = Factory.forProtocol(Protocol)
    port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(server)
    try:
        proto = _Keep()
        proto.made = Deferred()
        yield connectProtocol(
            TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port), proto
        )
        transport = yield proto.made
        sock = internals.plainSocket(transport)
        assert isinstance(sock, socket.socket)
        assert internals.nothingBuffered(transport)
        transport.write(b"x" * 10)  # buffered until the next write round
        assert not internals.nothingBuffered(transport)
        transport.loseConnection()
    finally:
        yield port.stopListening()


def test_pendingTimedCallsSeesScheduledCalls() -> None:
    call = reactor.callLater(1000, lambda: None)
    try:
        calls: List[Any] = (internals.pendingTimedCalls(reactor) or []) + internals.newTimedCalls(
            reactor
        )
        assert call in calls
    finally:
        call.cancel()


def test_raiseBindErrorsAtStart() -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        endpoint = TCP4ServerEndpoint(reactor, busy.getsockname()[1], interface="127.0.0.1")
        service = StreamServerEndpointService(endpoint, Factory.forProtocol(Protocol))
        internals.raiseBindErrorsAtStart(service)
        with pytest.raises(Exception, match="[Aa]ddress"):
            service.startService()
    finally:
        busy.close()


def test_quietClientServiceLogsNothing() -> None:
    """
    ClientService logs each connection attempt through its class-level
    C{_log}; the quiet subclass's logger reaches no observer.
    """
    from twisted.logger import globalLogPublisher

    events: List[Any] = []
    globalLogPublisher.addObserver(events.append)
    try:
        internals.QuietClientService._log.warn("connection attempt")
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert events == []


class _Lost(Protocol):
    lost: "Deferred[Any]"
    made: "Deferred[Any]"

    def connectionMade(self) -> None:
        self.made.callback(self.transport)

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback([reason])  # a bare Failure would errback


@inlineCallbacks
def _closeSeen(abort: bool) -> Any:
    """
    Connect to a plain socket server, close the server's side with a FIN or
    a reset, and return (errno, TCP reason) as watchSocketError saw them.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        proto = _Lost()
        proto.made, proto.lost = Deferred(), Deferred()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", listener.getsockname()[1])
        yield connectProtocol(endpoint, proto)
        transport = yield proto.made
        seen: List[Any] = []
        assert internals.watchSocketError(transport, lambda e, r: seen.append((e, r)))
        accepted, _ = listener.accept()
        if abort:
            # SO_LINGER 0: close() sends a reset.
            import struct

            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        accepted.close()
        yield proto.lost
        return seen
    finally:
        listener.close()


@pytest_twisted.inlineCallbacks
def test_watchSocketErrorTellsAFinFromAReset() -> Any:
    from twisted.internet.error import ConnectionDone

    fin = yield _closeSeen(False)
    assert len(fin) == 1 and fin[0][0] == 0 and fin[0][1].check(ConnectionDone)
    reset = yield _closeSeen(True)
    assert len(reset) == 1
    errno, reason = reset[0]
    # Either the socket still holds the error, or Twisted read it and says so.
    assert errno != 0 or not reason.check(ConnectionDone)


@inlineCallbacks
def _dialled(listener: socket.socket, proto: Optional[_Keep] = None) -> Any:
    """
    A Twisted TCP transport connected to C{listener} (with C{proto}, by
    default one that does nothing), and the plain socket accepted on the
    other end.
    """
    proto = proto or _Keep()
    proto.made = Deferred()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", listener.getsockname()[1])
    yield connectProtocol(endpoint, proto)
    transport = yield proto.made
    accepted, _ = listener.accept()
    return transport, accepted


@pytest_twisted.inlineCallbacks
def test_flushToKernelSendsWhatTwistedBuffered() -> Any:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        transport, accepted = yield _dialled(listener)
        accepted.settimeout(5)
        transport.write(b"buffered\n")
        assert not internals.nothingBuffered(transport)
        internals.flushToKernel(transport)
        # Without another reactor turn, the bytes are already at the peer.
        assert internals.nothingBuffered(transport)
        assert accepted.recv(100) == b"buffered\n"
        accepted.close()
        transport.loseConnection()
    finally:
        listener.close()


def test_unsentProbeOnTestTransportsSaysNothingIsLeft() -> None:
    assert internals.unsentProbe(StringTransport())() is False


@pytest_twisted.inlineCallbacks
def test_unsentProbeSeesWhatAPeerThatDoesNotReadLeavesHere() -> Any:
    """
    On a real TCP connection: nothing left after a write the peer's kernel
    took; bytes left (in Twisted's buffer, then in our kernel's unsent
    queue) once the peer stops reading and its window is full.
    """
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        transport, accepted = yield _dialled(listener)  # accepted never reads
        left = internals.unsentProbe(transport)
        assert left() is False
        transport.write(b"x" * 10)
        assert left() is True  # in Twisted's buffer
        internals.flushToKernel(transport)
        assert left() is False  # the peer's kernel took it
        sock = internals.plainSocket(transport)
        assert sock is not None
        sock.setblocking(False)
        try:
            while True:
                sock.send(b"y" * 65536)
        except BlockingIOError:
            pass
        assert left() is True  # the peer's window is full: unsent, here
        accepted.close()
        transport.abortConnection()
    finally:
        listener.close()


class _Record(_Keep):
    def connectionMade(self) -> None:
        self.received = b""
        self.lost: "Deferred[Any]" = Deferred()
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback([reason])


def test_readWaitingOnTestTransportsDoesNothing() -> None:
    internals.readWaiting(StringTransport())


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
@pytest_twisted.inlineCallbacks
def test_readWaitingDeliversWaitingBytesAndLeavesTheEndToTheReactor(reset: bool) -> Any:
    """
    Bytes already in the kernel reach dataReceived at once, without a
    reactor turn; the peer's FIN or reset after them is still seen by the
    reactor as what it is.
    """
    from twisted.internet.error import ConnectionDone

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        proto = _Record()
        transport, accepted = yield _dialled(listener, proto)
        accepted.sendall(b"x" * 20_000 + b"tail\n")
        if reset:
            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        accepted.close()
        internals.readWaiting(transport)
        assert proto.received == b"x" * 20_000 + b"tail\n"
        [reason] = yield proto.lost
        assert bool(reason.check(ConnectionDone)) is not reset
    finally:
        listener.close()


def test_peerHungUpOnTestTransportsSaysNothing() -> None:
    assert internals.peerHungUp(StringTransport()) is None


@inlineCallbacks
def _hungUpSeen(transport: Any) -> Any:
    """
    What peerHungUp says of C{transport} once it says something (the
    peer's close reaches us through loopback), or None after 5 s.
    """
    from twisted.internet.task import deferLater

    for _ in range(500):
        seen = internals.peerHungUp(transport)
        if seen is not None:
            return seen
        yield deferLater(reactor, 0.01, lambda: None)
    return None


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.inlineCallbacks
def test_peerHungUpSeesAResetOfAConnectionNotRead(tls: bool) -> Any:
    """
    A peer that closes with our bytes unread sends a reset: the socket of
    a connection the reactor does not read says so, and its error is left
    for Twisted (not consumed).  Over TLS the TCP socket below is asked
    (the peer here never answers the TLS hello: it closes with it unread).
    """
    import errno

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        proto = _Keep()
        proto.made = Deferred()
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", listener.getsockname()[1])
        if tls:
            from twisted.internet.endpoints import wrapClientTLS
            from twisted.internet.ssl import optionsForClientTLS

            endpoint = wrapClientTLS(optionsForClientTLS("localhost"), endpoint)
        yield connectProtocol(endpoint, proto)
        transport = yield proto.made
        transport.pauseProducing()  # not read, as under backpressure
        accepted, _ = listener.accept()
        assert internals.peerHungUp(transport) is None
        if not tls:
            transport.write(b"unread answer\n")
        internals.flushToKernel(transport)  # our bytes (or the TLS hello) now
        accepted.settimeout(5)
        assert accepted.recv(1)  # our bytes reached it (the rest is unread)
        assert internals.peerHungUp(transport) is None
        accepted.close()
        assert (yield _hungUpSeen(transport)) == internals.RESET
        tcp = transport if not tls else transport.transport
        assert tcp.socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
        transport.abortConnection()
    finally:
        listener.close()


@pytest_twisted.inlineCallbacks
def test_peerHungUpSeesAnEndOfInputEvenBehindUnreadRequests() -> Any:
    """
    A FIN is an end of input whether or not requests the connection sent
    before it are still unread (a paused connection of a client that
    pipelined, then closed): POLLRDHUP says so, where a read would not
    until those requests were read.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    try:
        transport, accepted = yield _dialled(listener)
        transport.pauseProducing()
        accepted.sendall(b"R k 1\n" * 1000)
        accepted.shutdown(socket.SHUT_WR)
        assert (yield _hungUpSeen(transport)) == internals.END_OF_INPUT
        transport.abortConnection()
        accepted.close()

        transport, accepted = yield _dialled(listener)
        transport.pauseProducing()
        accepted.shutdown(socket.SHUT_WR)
        assert (yield _hungUpSeen(transport)) == internals.END_OF_INPUT
        transport.abortConnection()
        accepted.close()
    finally:
        listener.close()


class _Ready:
    """A selectable with only what the reactor's dispatch reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "ready"


def test_dispatchWithoutLogContextLeavesOtherReactorsAlone() -> None:
    from twisted.internet.task import Clock

    clock = Clock()
    assert internals.dispatchWithoutLogContext(clock) is False
    assert not hasattr(clock, "doPoll")


def test_dispatchWithoutLogContextHandsEveryReadyDescriptorOnEvenAfterAFailure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Two descriptors ready in one poll: the first's handler raises; the
    error is logged (as C{callWithLogger} would) and the second is still
    handled in the same turn.
    """
    from twisted.internet.epollreactor import EPollReactor
    from twisted.python import log

    fresh = EPollReactor()  # not installed: the suite's reactor stays stock
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        first, second = _Ready(pairs[0][0]), _Ready(pairs[1][0])
        handled: List[Any] = []

        def handle(selectable: Any, fd: int, event: int) -> None:
            handled.append(selectable)
            if selectable is first:
                raise ValueError("handler failed")

        errors: List[Any] = []
        monkeypatch.setattr(log, "err", lambda *a, **k: errors.append(a))
        fresh._doReadOrWrite = handle  # type: ignore[method-assign]
        assert internals.dispatchWithoutLogContext(fresh) is True
        fresh.addReader(first)  # type: ignore[arg-type]
        fresh.addReader(second)  # type: ignore[arg-type]
        for _, other in pairs:
            other.send(b"x")
        fresh.doIteration(1.0)
        assert sorted(map(id, handled)) == sorted([id(first), id(second)])
        assert len(errors) == 1
        fresh.removeAll()
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        fresh._poller.close()


def test_callAfterReadyRunsOnceEveryReadyDescriptorIsHandled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Asked while the first of two ready descriptors is handled, the call
    runs after the second, in the same poll, and costs no timed call; a
    failing call is logged and the next still runs.
    """
    from twisted.internet.epollreactor import EPollReactor
    from twisted.python import log

    fresh = EPollReactor()
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        first, second = _Ready(pairs[0][0]), _Ready(pairs[1][0])
        order: List[Any] = []

        def fail() -> None:
            order.append("fail")
            raise ValueError("after-ready call failed")

        def handle(selectable: Any, fd: int, event: int) -> None:
            order.append(selectable)
            if len(order) == 1:
                internals.callAfterReady(fresh, fail)
                internals.callAfterReady(fresh, lambda: order.append("after"))

        errors: List[Any] = []
        monkeypatch.setattr(log, "err", lambda *a, **k: errors.append(a))
        fresh._doReadOrWrite = handle  # type: ignore[method-assign]
        assert internals.dispatchWithoutLogContext(fresh) is True
        fresh.addReader(first)  # type: ignore[arg-type]
        fresh.addReader(second)  # type: ignore[arg-type]
        for _, other in pairs:
            other.send(b"x")
        fresh.doIteration(1.0)
        assert order[2:] == ["fail", "after"]
        assert sorted(map(id, order[:2])) == sorted([id(first), id(second)])
        assert len(errors) == 1
        assert fresh.getDelayedCalls() == []
        fresh.removeAll()
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        fresh._poller.close()


def test_callAfterReadyOutsideADispatchIsATimedCall() -> None:
    """
    Asked outside a poll's dispatch (a timer's call, an after-ready call
    itself, another reactor), the call must not wait for a poll that may
    never return: it is a callLater(0).
    """
    from twisted.internet.epollreactor import EPollReactor
    from twisted.internet.task import Clock

    clock = Clock()
    ran: List[str] = []
    internals.callAfterReady(clock, lambda: ran.append("clock"))
    assert ran == []
    clock.advance(0)
    assert ran == ["clock"]

    fresh = EPollReactor()
    try:
        assert internals.dispatchWithoutLogContext(fresh) is True
        internals.callAfterReady(fresh, lambda: ran.append("outside"))
        assert len(fresh.getDelayedCalls()) == 1
        fresh.runUntilCurrent()
        assert ran == ["clock", "outside"]
    finally:
        fresh._poller.close()
