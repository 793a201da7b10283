"""
A cluster node in-process: its peer links on StringTransports, its time
on a task.Clock (no sockets, no sleeping).
"""

from __future__ import annotations

from typing import List, Tuple

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from lockservice.cluster.node import Cluster
from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE
from lockservice.server.protocol import LockFactory
from lockservice.server.service import LockService

PEERS = ["10.0.0.1:7701", "10.0.0.2:7702", "10.0.0.3:7703"]
NOW_US = 1_800_000_000_000_000


class Transport(StringTransport):
    """
    A StringTransport that also logs, in one shared list, what was written
    where and in which order.
    """

    def __init__(self, name: str, log: List[Tuple[str, bytes]]) -> None:
        super().__init__()
        self.name = name
        self.log = log

    def write(self, data: bytes) -> None:
        self.log.append((self.name, data))
        super().write(data)


class Lab:
    def __init__(self, me: int = 0, replication: str = "sent", **options: float) -> None:
        """
        @param replication: C{"sent"} by default: these links never
            acknowledge unless a test makes them.
        """
        self.clock = Clock()
        self.clock.advance(1000)
        self.wall = NOW_US
        self.log: List[Tuple[str, bytes]] = []
        self.locks = LockService(self.clock, lambda: self.wall)
        self.cluster = Cluster(None, self.locks, PEERS, PEERS[me], b"s3cret",
                               wallMicros=lambda: self.wall, replication=replication,
                               **options)  # type: ignore[arg-type]

    def link(self, j: int, outbound: bool) -> PeerChannel:
        """
        An authenticated link to peer C{j}, as the handshake leaves it.
        """
        t = Transport(f"{'out' if outbound else 'in'}{j}", self.log)
        channel = PeerChannel(self.cluster.receiver, t, outbound=outbound, remote=j)
        channel._cancelTimeout()
        channel.authenticated = True
        self.cluster.receiver.channelUp(channel)
        t.clear()
        return channel

    def hear(self, channel: PeerChannel, *lines: bytes) -> None:
        channel.dataReceived(b"".join(line + b"\n" for line in lines))

    def client(self) -> Transport:
        factory = LockFactory(self.locks)
        protocol = factory.buildProtocol(None)
        t = Transport("client", self.log)
        protocol.makeConnection(t)
        self.protocol = protocol
        return t

    def ask(self, line: bytes) -> bytes:
        self.protocol.dataReceived(line + b"\n")
        self.clock.advance(0)  # the end of the reactor turn: answers go out
        answer: bytes = self.protocol.transport.value()  # type: ignore[union-attr]
        self.protocol.transport.clear()  # type: ignore[union-attr]
        return answer


def lines(channel: PeerChannel, positions: bool = False) -> List[bytes]:
    """
    What was written on C{channel} since the last look, one line each;
    the stream's position marks (S) left out unless C{positions}.
    """
    t = channel.transport
    data = t.value()  # type: ignore[attr-defined]
    t.clear()  # type: ignore[attr-defined]
    return [line for line in data.split(b"\n")
            if line and (positions or not line.startswith(b"S "))]


def activeWithFollower(lab: Lab) -> PeerChannel:
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    follower = lab.link(1, outbound=False)
    lab.hear(follower, b"SYNC")
    producer = follower.snapshot
    while producer is not None and not producer.stopped:
        producer.resumeProducing()
    assert lines(follower)[-1] == b"SNAPEND" and follower.synced
    return follower


# -- replicate before answer -------------------------------------------------


def following(lab: Lab, leader: int = 0) -> PeerChannel:
    channel = lab.link(leader, outbound=True)
    lab.hear(channel, b"HB %d active - 5 0" % NOW_US)
    assert lab.cluster.leader == leader
    assert b"SYNC" in lines(channel)
    return channel


def winnerHolding(lab: Lab, *keys: bytes) -> Tuple[PeerChannel, List[int], PeerChannel]:
    """
    An active with a follower (node 1) that holds C{keys} for 30 s, and
    the link of a node (2) that lost a split brain and is about to offer.

    @return: the follower's link, the keys' tokens, the loser's link.
    """
    follower = activeWithFollower(lab)
    lab.client()
    tokens = [int(lab.ask(b"A %s 30 0" % key).split()[2]) for key in keys]
    lines(follower)
    return follower, tokens, lab.link(2, outbound=False)
