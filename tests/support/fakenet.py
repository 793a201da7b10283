"""
The Twisted client against fake nodes: a network that decides which
connection attempts succeed, and the far end of each connection (what the
client wrote, answers, drops).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from lockservice.client.api import (
    connect,
)


class HalfCloseableTransport(StringTransport):
    halfClosed = False

    def loseWriteConnection(self) -> None:
        self.halfClosed = True


class FakeServerSide:
    """
    The far end of one fake connection: what the client wrote, and a way
    to answer or drop.
    """

    def __init__(self, address: str, protocol) -> None:  # type: ignore[no-untyped-def]
        self.address = address
        self.protocol = protocol
        self.transport = HalfCloseableTransport()
        protocol.makeConnection(self.transport)
        # Every connection names itself first (`I <name>#<instance>`); the
        # tests below look at what follows.
        self.hello = self.transport.value()
        self.transport.clear()

    def sent(self) -> List[bytes]:
        data = self.transport.value()
        self.transport.clear()
        return [line for line in data.split(b"\n") if line]

    def answer(self, line: bytes) -> None:
        self.protocol.dataReceived(line + b"\n")

    def drop(self) -> None:
        self.protocol.connectionLost(Failure(ConnectionDone()))

    @property
    def closedByClient(self) -> bool:
        return bool(self.transport.disconnecting)


class Network:
    """
    Decides, per address, whether connection attempts succeed.
    """

    def __init__(self) -> None:
        self.down: Dict[str, bool] = {}
        self.blackholes: Set[str] = set()
        self.attempts: List[str] = []
        self.connections: List[FakeServerSide] = []

    def endpointFor(self, address):  # type: ignore[no-untyped-def]
        network = self

        class Endpoint:
            def connect(self, factory):  # type: ignore[no-untyped-def]
                network.attempts.append(address)
                if address in network.blackholes:
                    return Deferred()  # a SYN into the void: never answered
                if network.down.get(address):
                    return fail(ConnectionRefusedError(address))
                protocol = factory.buildProtocol(None)
                network.connections.append(FakeServerSide(address, protocol))
                return succeed(protocol)

        return Endpoint()

    def carrier(self) -> FakeServerSide:
        """
        The connection the client last wrote to (unread bytes waiting).
        """
        return next(c for c in self.connections if c.transport.value())


def makeClient(addresses: List[str], down: Optional[List[str]] = None):  # type: ignore[no-untyped-def]
    clock = Clock()
    net = Network()
    for a in down or []:
        net.down[a] = True
    client = connect(clock, addresses, endpointFor=net.endpointFor)
    return clock, net, client


def result(d: Deferred):  # type: ignore[no-untyped-def, type-arg]
    out: list = []  # type: ignore[type-arg]
    d.addBoth(out.append)
    assert out, "Deferred has not fired"
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


def failureOf(d: Deferred) -> Failure:  # type: ignore[type-arg]
    out: list = []  # type: ignore[type-arg]
    d.addBoth(out.append)
    assert out and isinstance(out[0], Failure), f"expected a failure, got {out}"
    return out[0]
