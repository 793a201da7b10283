"""
A lock node driven bytes in, bytes out: its client protocol through
StringTransport, its time through task.Clock.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from lockservice.server.protocol import LockFactory, LockProtocol
from lockservice.server.service import LockService

T0 = 1_700_000_000_000_000  # wall clock, microseconds


class Wall:
    def __init__(self) -> None:
        self.micros = T0

    def __call__(self) -> int:
        return self.micros


class Node:
    def __init__(self, maxLease: float = 86400.0, maxWait: float = 86400.0,
                 **limits: Any) -> None:
        self.clock = Clock()
        self.wall = Wall()
        maxConnections = limits.pop("maxConnections", 10_000)
        peerAcceptor = limits.pop("peerAcceptor", None)
        self.service = LockService(self.clock, self.wall, maxLease, maxWait, **limits)
        self.factory = LockFactory(self.service, peerAcceptor, maxConnections=maxConnections)

    def connect(self, peerAddress: Any = None) -> "Conn":
        return Conn(self, peerAddress)


class Conn:
    def __init__(self, node: Node, peerAddress: Any = None) -> None:
        self.node = node
        self.proto: LockProtocol = node.factory.buildProtocol(None)  # type: ignore[assignment]
        self.transport = StringTransport(peerAddress=peerAddress)
        self.proto.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)
        if self.node.factory.readBudget.waiting:
            # The node's input budget for this reactor iteration ran out:
            # the next iteration handles the rest.
            self.node.clock.advance(0)

    def take(self) -> bytes:
        out = self.transport.value()
        self.transport.clear()
        return out

    def ask(self, line: bytes) -> bytes:
        self.send(line + b"\n")
        return self.take()

    def close(self) -> None:
        self.proto.connectionLost()


def token(n: int) -> bytes:
    return str(T0 + n).encode()
