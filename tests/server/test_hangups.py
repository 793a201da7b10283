"""
Connections the node does not read (backpressure), whose peer went away:
the check before a hand-over and the sweep (server/hangups.py), through
StringTransport and task.Clock, with the socket check injected.
"""

from __future__ import annotations

from typing import Any, List, Optional

from lockservice.internals import END_OF_INPUT, RESET
from lockservice.server.hangups import SWEEP_INTERVAL
from tests.support.protocol import Conn, Node, token


class Check:
    """
    An injected socket check: says C{what} for the transports in C{dead},
    None for the others, and records every transport it was asked about.
    """

    def __init__(self, what: str = RESET) -> None:
        self.what = what
        self.dead: List[Any] = []
        self.asked: List[Any] = []

    def __call__(self, transport: Any) -> Optional[str]:
        self.asked.append(transport)
        return self.what if transport in self.dead else None


def setUp(what: str = RESET, **limits: Any) -> Any:
    node = Node(**limits)
    check = node.factory.hangUps.check = Check(what)
    return node, check


def sweeps(node: Node) -> List[Any]:
    """
    The sweep's rounds scheduled on the node's clock.
    """
    return [call for call in node.clock.getDelayedCalls()
            if call.func == node.factory.hangUps.sweep]


def paused(c: Conn) -> None:
    """
    What the transport does when its buffer is full: the node stops
    reading C{c}.
    """
    c.proto.pauseProducing()
    assert c.transport.producerState == "paused" and c.proto.notRead


def test_a_hand_over_passes_a_paused_connection_whose_peer_reset() -> None:
    node, check = setUp(RESET)
    holder, flooder, live = node.connect(), node.connect(), node.connect()
    assert holder.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    flooder.send(b"A k 30 0\n" * 3)
    live.send(b"A k 30 0\n")
    paused(flooder)
    check.dead.append(flooder.transport)
    node.wall.micros += 5
    assert holder.ask(b"R k " + token(0)) == b"R k OK\n"
    assert live.take() == b"A k " + token(5) + b"\n"
    assert flooder.take() == b""
    assert check.asked == [flooder.transport]  # once; never the live ones
    assert flooder.transport.disconnecting  # aborted: nobody reads it
    assert flooder.proto.gone
    node.clock.advance(0)
    assert node.service.table.waiterCount == 0


def test_a_hand_over_passes_a_paused_connection_that_ended_its_input() -> None:
    """
    An end of input with nothing unread before it: as if the reactor had
    read it (its waiters withdrawn, decided answers written, then closed).
    """
    node, check = setUp(END_OF_INPUT, maxWaiters=2)
    holder, flooder, live = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    flooder.send(b"A k 30 0\n")
    live.send(b"A k 30 0\n")
    assert flooder.ask(b"A k 30 0") == b""  # refused, held back behind its first
    paused(flooder)
    check.dead.append(flooder.transport)
    node.wall.micros += 5
    assert holder.ask(b"R k " + token(0)) == b"R k OK\n"
    assert live.take() == b"A k " + token(5) + b"\n"
    node.clock.advance(0)
    assert flooder.take() == b"E A k too many waiters\n"
    assert flooder.transport.disconnecting
    assert node.service.table.waiterCount == 0


def test_a_paused_connection_whose_peer_is_there_still_gets_the_key() -> None:
    node, check = setUp()
    holder, slow, live = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    slow.send(b"A k 30 0\n")
    live.send(b"A k 30 0\n")
    paused(slow)
    node.wall.micros += 5
    holder.ask(b"R k " + token(0))
    assert slow.take() == b"A k " + token(5) + b"\n"
    assert live.take() == b""
    assert check.asked == [slow.transport]


def test_a_connection_being_read_is_never_checked() -> None:
    """
    The reactor tells of a connection it reads: no system call for it,
    whatever the check would say.
    """
    node, check = setUp()
    holder, waiter = node.connect(), node.connect()
    check.dead.append(waiter.transport)
    holder.ask(b"A k 30 0")
    waiter.send(b"A k 30 0\n")
    node.wall.micros += 5
    holder.ask(b"R k " + token(0))
    assert waiter.take() == b"A k " + token(5) + b"\n"
    node.clock.advance(SWEEP_INTERVAL * 3)
    assert check.asked == []


def test_the_sweep_drops_the_waiters_of_a_paused_connection_whose_peer_reset() -> None:
    node, check = setUp()
    holder, flooder = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    flooder.send(b"A k 30 0\n" * 5)
    paused(flooder)
    check.dead.append(flooder.transport)
    assert node.service.table.waiterCount == 5
    node.clock.advance(SWEEP_INTERVAL)
    assert node.service.table.waiterCount == 0
    assert flooder.transport.disconnecting
    flooder.close()  # the abort's connectionLost
    assert len(node.factory.hangUps) == 0
    assert sweeps(node) == []  # nothing paused: no more rounds


def test_the_sweep_checks_a_bounded_number_per_round_round_robin() -> None:
    node, check = setUp()
    node.factory.hangUps.budget = 2
    conns = [node.connect() for _ in range(5)]
    for c in conns:
        paused(c)
    transports = [c.transport for c in conns]
    node.clock.advance(SWEEP_INTERVAL)
    assert check.asked == transports[:2]
    node.clock.advance(SWEEP_INTERVAL)
    node.clock.advance(SWEEP_INTERVAL)
    assert check.asked == transports + transports[:1]
    # A connection read again leaves the sweep; when none is left, it stops.
    for c in conns:
        c.proto.resumeProducing()
    assert len(node.factory.hangUps) == 0
    node.clock.advance(SWEEP_INTERVAL)
    assert sweeps(node) == []
    assert len(check.asked) == 6


def test_input_put_off_to_the_next_iteration_comes_before_an_end_of_input() -> None:
    """
    A connection paused only until the next reactor iteration (its input
    over the iteration's budget) has requests read and not handled yet:
    an end of input behind them is not acted on; a reset drops them.
    """
    for what in (END_OF_INPUT, RESET):
        node, check = setUp(what)
        node.factory.readBudget.budget = 10
        holder, other = node.connect(), node.connect()
        holder.ask(b"A k 30 0")
        other.proto.dataReceived(b"P first-iteration-only\n")  # spends the budget
        other.take()
        late = node.connect()
        late.proto.dataReceived(b"A k 30 0\nP put-off\n")
        assert late.proto.notRead and late.take() == b""
        check.dead.append(late.transport)
        assert late.proto.hungUp() is (what == RESET)
        node.clock.advance(0)  # the next iteration
        if what == END_OF_INPUT:
            assert late.take() == b"P put-off\n"
            assert node.service.table.waiterCount == 1
        else:
            assert late.take() == b""
            assert node.service.table.waiterCount == 0
