"""
Limits and abuse, bytes in and bytes out (StringTransport, task.Clock):
--max-keys, --max-waiters, --max-connections (peers still get in),
backpressure as a streaming producer, and the STALE flood guard.
"""

from __future__ import annotations

from typing import Any, List

from lockservice.server.protocol import PEER_GRACE, PEER_RESERVE, STALE_LIMIT
from tests.test_protocol import Node, token

TOO_MANY = b"E * * too many connections\n"


def test_max_keys_refuses_a_new_key_but_queues_on_a_held_one() -> None:
    node = Node(maxKeys=2)
    a, b = node.connect(), node.connect()
    assert a.ask(b"A one 30 0") == b"A one " + token(0) + b"\n"
    assert a.ask(b"A two 30 0") == b"A two " + token(1) + b"\n"
    assert a.ask(b"A three 30 0") == b"E A three too many keys\n"
    assert b.ask(b"A one 30 0") == b""  # queued: no new key
    assert node.service.table.holder(b"three") is None
    a.ask(b"R two " + token(1))
    assert a.ask(b"A three 30 0") == b"A three " + token(2) + b"\n"
    assert node.service.stats.rejectedKeys == 1


def test_max_waiters_refuses_one_more_waiter_on_that_key() -> None:
    node = Node(maxWaiters=2)
    a, b, c = node.connect(), node.connect(), node.connect()
    a.ask(b"A k 30 0")
    assert b.ask(b"A k 30 0") == b""
    assert b.ask(b"A k 30 0") == b""
    assert c.ask(b"A k 30 0") == b"E A k too many waiters\n"
    assert c.ask(b"A other 30 0") == b"A other " + token(1) + b"\n"
    assert node.service.table.queueLength(b"k") == 2
    a.ask(b"R k " + token(0))
    assert b.take() == b"A k " + token(2) + b"\n"
    assert c.ask(b"A k 30 0") == b""  # room again


def test_limits_do_not_apply_before_the_redirect() -> None:
    from lockservice.core.election import STANDBY

    node = Node(maxKeys=1)
    c = node.connect()
    c.ask(b"A one 30 0")
    node.service.setRole(STANDBY, b"h:1")
    assert c.ask(b"A two 30 0") == b"M A two h:1\n"


def test_max_connections_refuses_one_more_and_closes_it() -> None:
    node = Node(maxConnections=2)
    a, b = node.connect(), node.connect()
    c = node.connect()
    assert c.take() == TOO_MANY
    assert c.transport.disconnecting
    assert c.transport.producer is None  # nothing holds the close back
    assert a.ask(b"P a") == b"P a\n" and b.ask(b"P b") == b"P b\n"
    assert node.service.stats.rejectedConnections == 1
    c.close()
    a.close()
    d = node.connect()
    assert d.ask(b"P d") == b"P d\n"


class FakePeer:
    def __init__(self, transport: Any, hello: bytes) -> None:
        self.transport = transport
        self.hello = hello
        self.received: List[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)

    def connectionLost(self, reason: object) -> None:
        pass


def peerNode(**limits: Any) -> "tuple[Node, List[FakePeer]]":
    peers: List[FakePeer] = []

    def accept(transport: Any, hello: bytes) -> FakePeer:
        peer = FakePeer(transport, hello)
        peers.append(peer)
        return peer

    return Node(peerAcceptor=accept, **limits), peers


def test_a_full_node_still_accepts_its_peers() -> None:
    node, peers = peerNode(maxConnections=1)
    node.connect()
    peer = node.connect()
    assert peer.take() == b""  # on probation: it may be a peer
    peer.send(b"HELLO 2 a:1 nonce\nmore")
    assert [p.hello for p in peers] == [b"HELLO 2 a:1 nonce"]
    assert peers[0].received == [b"more"]
    assert not peer.transport.disconnecting
    assert peer.transport.producer is None  # the peer channel writes on its own terms
    node.clock.advance(PEER_GRACE * 2)
    assert not peer.transport.disconnecting
    assert node.factory.probation == 0


def test_a_client_beyond_the_limit_is_refused_at_its_first_line_or_after_the_grace() -> None:
    node, peers = peerNode(maxConnections=1)
    node.connect()
    talker, silent = node.connect(), node.connect()
    assert talker.ask(b"A k 30 0") == TOO_MANY
    assert talker.transport.disconnecting
    assert node.service.table.holder(b"k") is None
    node.clock.advance(PEER_GRACE - 0.1)
    assert silent.take() == b"" and not silent.transport.disconnecting
    node.clock.advance(0.1)
    assert silent.take() == TOO_MANY and silent.transport.disconnecting
    assert node.factory.probation == 0 and peers == []


def test_a_probation_connection_is_admitted_when_room_came_back() -> None:
    node, _ = peerNode(maxConnections=1)
    first = node.connect()
    late = node.connect()
    first.close()
    assert late.ask(b"P hi") == b"P hi\n"
    assert late.proto in node.service.connections


def test_probation_is_bounded() -> None:
    node, _ = peerNode(maxConnections=1)
    node.connect()
    waiting = [node.connect() for _ in range(PEER_RESERVE)]
    assert all(c.take() == b"" for c in waiting)
    extra = node.connect()
    assert extra.take() == TOO_MANY and extra.transport.disconnecting
    for c in waiting:
        c.close()
    assert node.factory.probation == 0


def test_more_than_100_stale_answers_within_a_second_close_the_connection() -> None:
    node = Node()
    holder, guesser = node.connect(), node.connect()
    holder.ask(b"A payroll 30 0")
    guesser.send(b"".join(b"R payroll %d\n" % i for i in range(1, STALE_LIMIT + 1)))
    assert guesser.take().count(b"R payroll STALE\n") == STALE_LIMIT
    assert not guesser.transport.disconnecting
    # The 101st (here a renewal) within the same second closes it, and the
    # rest of its input is not read.
    guesser.send(b"N payroll 7 30\nR payroll " + token(0) + b"\n")
    assert guesser.take() == b"N payroll STALE\n"
    assert guesser.transport.disconnecting
    assert node.service.table.holder(b"payroll") is not None
    assert node.service.stats.staleFloods == 1


def test_stale_answers_spread_over_time_are_fine() -> None:
    node = Node()
    c = node.connect()
    for i in range(3 * STALE_LIMIT):
        assert c.ask(b"R k %d" % i) == b"R k STALE\n"
        node.clock.advance(0.011)
    assert not c.transport.disconnecting


def test_the_connection_is_a_streaming_producer_that_stops_reading() -> None:
    node = Node()
    c = node.connect()
    assert c.transport.producer is c.proto and c.transport.streaming
    c.proto.pauseProducing()
    assert c.transport.producerState == "paused"
    c.proto.resumeProducing()
    assert c.transport.producerState == "producing"


def test_end_of_input_closes_even_while_paused() -> None:
    node = Node()
    c = node.connect()
    c.proto.pauseProducing()
    c.proto.readConnectionLost()
    assert c.transport.disconnecting and c.transport.producer is None
