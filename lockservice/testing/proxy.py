# -*- test-case-name: tests.client.test_client_e2e -*-
"""
A fault-injecting TCP port forwarder, for tests and the chaos suite.

Clients connect to the proxy's port; it forwards to the target.  The test
can then cut every link (both sides see a close), cut only the links that
carried requests, or stall them (bytes are held, not lost, until resumed).
"""

from __future__ import annotations

from typing import Any, List, Optional

from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from lockservice.tcp import noDelay


class _Upstream(Protocol):
    def __init__(self, downstream: "_Downstream") -> None:
        self.downstream = downstream

    def dataReceived(self, data: bytes) -> None:
        self.downstream.toClient(data)

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.downstream.transport.loseConnection()  # type: ignore[union-attr]


class _Downstream(Protocol):
    """
    The client side of one proxied link.
    """

    def __init__(self, proxy: "FaultProxy") -> None:
        self.proxy = proxy
        self.upstream: Optional[_Upstream] = None
        self.held: List[bytes] = []
        self.heldBack: List[bytes] = []
        self.bytesUp = 0

    def connectionMade(self) -> None:
        self.proxy.links.append(self)
        noDelay(self.transport)
        endpoint = TCP4ClientEndpoint(self.proxy.reactor, self.proxy.host, self.proxy.port)
        d = connectProtocol(endpoint, _Upstream(self))
        d.addCallbacks(self._connected, lambda f: self.transport.loseConnection())  # type: ignore[union-attr]

    def _connected(self, upstream: _Upstream) -> None:
        self.upstream = upstream
        noDelay(upstream.transport)
        if self.transport.disconnected:  # type: ignore[union-attr]
            upstream.transport.loseConnection()  # type: ignore[union-attr]
            return
        self.flush()

    def dataReceived(self, data: bytes) -> None:
        self.bytesUp += len(data)
        self.held.append(data)
        self.flush()

    def toClient(self, data: bytes) -> None:
        if self.proxy.stalled:
            self.heldBack.append(data)
        else:
            self.transport.write(data)  # type: ignore[union-attr]

    def flush(self) -> None:
        if self.proxy.stalled:
            return
        if self.upstream is not None and self.held:
            self.upstream.transport.write(b"".join(self.held))  # type: ignore[union-attr]
            self.held = []
        if self.heldBack:
            self.transport.write(b"".join(self.heldBack))  # type: ignore[union-attr]
            self.heldBack = []

    def cut(self) -> None:
        self.transport.abortConnection()  # type: ignore[union-attr]
        if self.upstream is not None:
            self.upstream.transport.abortConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        if self in self.proxy.links:
            self.proxy.links.remove(self)
        if self.upstream is not None:
            self.upstream.transport.loseConnection()  # type: ignore[union-attr]


class FaultProxy:
    """
    Forwards 127.0.0.1:<listening port> to C{host:port}, with faults on demand.
    """

    def __init__(self, reactor: Any, host: str, port: int) -> None:
        self.reactor = reactor
        self.host = host
        self.port = port
        self.links: List[_Downstream] = []
        self.stalled = False
        self.listening: Optional[IListeningPort] = None
        self.cuts = 0

    async def start(self, listenPort: int = 0) -> int:
        endpoint = TCP4ServerEndpoint(self.reactor, listenPort, interface="127.0.0.1")
        self.listening = await endpoint.listen(Factory.forProtocol(lambda: _Downstream(self)))
        return int(self.listening.getHost().port)  # type: ignore[attr-defined, union-attr]

    @property
    def address(self) -> str:
        assert self.listening is not None
        return f"127.0.0.1:{self.listening.getHost().port}"  # type: ignore[attr-defined, union-attr]

    def cutAll(self) -> int:
        """
        Abort every proxied link (both ends see the connection drop).
        """
        links = list(self.links)
        for link in links:
            link.cut()
        self.cuts += len(links)
        return len(links)

    def cutBusy(self) -> int:
        """
        Abort only the links that have carried client bytes (those with
        requests in flight), leaving idle ones up.
        """
        busy = [link for link in self.links if link.bytesUp]
        for link in busy:
            link.cut()
        self.cuts += len(busy)
        return len(busy)

    def stall(self) -> None:
        """
        Hold every byte in both directions until L{resume}.
        """
        self.stalled = True

    def resume(self) -> None:
        self.stalled = False
        for link in list(self.links):
            link.flush()

    async def stop(self) -> None:
        self.cutAll()
        if self.listening is not None:
            stopped = self.listening.stopListening()
            if stopped is not None:
                await stopped
