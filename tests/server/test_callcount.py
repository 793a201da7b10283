"""
A deterministic guard on the work of the request path.

It drives the real protocol and service (StringTransport, task.Clock, the
operator's view attached) through a fixed series of requests and counts,
per step, what runs in lockservice's own modules: the source lines
executed (C{sys.settrace} line events) and the Python calls made.  Only
frames whose code lives under lockservice/ count, so the Twisted version
does not change the figures, and the same code counts the same on every
run and machine.

Lines are the main budget: they measure the work itself, which pasting a
helper's body into its caller does not reduce.  Calls have budgets too,
loose enough that a helper may be a function of its own: they catch a
new layer of calls on the hot path, not a call that keeps a concept in
one place.

Budgets are set from the measured figures with a modest margin (about
10% for lines, 25% for calls, and at least 6 of each): what the request
path does today passes, and a change that adds work to every step fails
until it is measured and the budget raised with the reason
(docs/performance.md).

Steps measured:

  - a pair: an acquire of a free key and its release, one connection;
  - a hand-off: 16 connections take turns on one key (a release hands
    it to the next waiter, and the releaser queues again);
  - what the monitor adds to a pair, and to a contended hand-over;
  - a standby applying its active's stream, per replicated line.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from lockservice.server.monitor import Monitor
from lockservice.server.protocol import LockFactory
from lockservice.server.service import LockService
from tests.support.counting import (
    Work,
    counted,
)

# Measured: lines and calls per step, and their budgets (lines about 10%
# above, calls about 25% above, each at least 6 above: folding a helper
# back into a function of its own, which adds a call and a line or two,
# stays within them).
#
#                                   lines    calls
#   a pair                          329.2     47.0
#   a hand-off                      454.1     66.0
#   the monitor's share of a pair    52.2      4.0
#   the monitor's share, hand-over   90.1     14.0
#   a mirrored line                  29.7      1.3
#
# An acquire+release pair, monitor attached.
LINES_PER_PAIR = 363
CALLS_PER_PAIR = 60
# A hand-off: a queued acquire, and the release that hands the key to the
# next waiter (16 connections taking turns on one key).
LINES_PER_HAND_OFF = 501
CALLS_PER_HAND_OFF = 84
# What the monitor adds to a pair (its folds every 1,024 changes included).
MONITOR_LINES = 59
MONITOR_CALLS = 10
# What the monitor adds to a contended hand-over (4 waiters, named).
MONITOR_LINES_CONTENDED = 100
MONITOR_CALLS_CONTENDED = 20
# A standby applying its active's stream, per replicated line (reads of
# 100 G/D lines, the monitor attached as makeService wires it).
LINES_PER_MIRRORED_LINE = 33.0
CALLS_PER_MIRRORED_LINE = 1.7

# Enough pairs that the monitor's lazy folds (every FOLD_AT noted changes)
# are counted too.
PAIRS = 2048


def _node(monitor: bool, connections: int = 1) -> Tuple[Clock, List[Tuple[Any, StringTransport]]]:
    clock = Clock()
    clock.advance(1000)
    counter = iter(range(1, 10**12))
    service = LockService(clock, lambda: next(counter) * 1000)
    if monitor:
        service.notify.attach(Monitor(clock, service.table.clientOf, wallTime=lambda: 0.0))
    factory = LockFactory(service)
    conns = []
    for i in range(connections):
        address = IPv4Address("TCP", "127.0.0.1", 5000 + i)
        protocol = factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        conns.append((protocol, transport))
    return clock, conns


def _pair(clock: Clock, protocol: Any, transport: StringTransport, i: int) -> None:
    key = b"k%d" % (i % 8)
    protocol.dataReceived(b"A %s 30 0\n" % key)
    answer = transport.value()
    transport.clear()
    assert answer.startswith(b"A " + key + b" "), answer
    protocol.dataReceived(b"R %s %s\n" % (key, answer.split()[2]))
    assert transport.value() == b"R " + key + b" OK\n"
    transport.clear()
    clock.advance(0)


def perPair(monitor: bool = True, pairs: int = PAIRS) -> Work:
    clock, [(protocol, transport)] = _node(monitor)
    return counted(lambda i: _pair(clock, protocol, transport, i), pairs)


def perHandOff(monitor: bool = True, handOffs: int = PAIRS) -> Work:
    """
    16 connections take turns on one key: each step, the holder releases
    (the key goes to the next waiter) and queues again behind the others.
    """
    clock, conns = _node(monitor, 16)
    for protocol, _ in conns:
        protocol.dataReceived(b"A hot 30 0\n")
    first = conns[0][1]
    state: Dict[str, Any] = {"holder": 0, "token": first.value().split()[2]}
    first.clear()

    def handOff(i: int) -> None:
        holder = state["holder"]
        following = (holder + 1) % len(conns)
        (protocol, transport), (_, nextTransport) = conns[holder], conns[following]
        protocol.dataReceived(b"R hot %s\n" % state["token"])
        assert transport.value() == b"R hot OK\n"
        granted = nextTransport.value()
        assert granted.startswith(b"A hot "), granted
        transport.clear()
        nextTransport.clear()
        protocol.dataReceived(b"A hot 30 0\n")  # queued, behind the 15 others
        assert transport.value() == b""
        state["holder"], state["token"] = following, granted.split()[2]
        clock.advance(0)

    return counted(handOff, handOffs)


WAITERS = 4


def perHandOver(monitor: bool = True, steps: int = 1024) -> Work:
    """
    4 named connections on one key: the holder releases, the next waiter
    is granted, and the releaser queues again.
    """
    clock, [(protocol, transport)] = _node(monitor)
    service = protocol.factory.service
    conns = [(protocol, transport)]
    for i in range(1, WAITERS):
        address = IPv4Address("TCP", "127.0.0.1", 5000 + i)
        other = LockFactory(service).buildProtocol(address)
        otherTransport = StringTransport(peerAddress=address)
        other.makeConnection(otherTransport)
        conns.append((other, otherTransport))
    for i, (p, t) in enumerate(conns):
        p.dataReceived(b"I worker-%d#%012x\n" % (i, i))
        t.clear()
        p.dataReceived(b"A hot 30 0\n")
    token = conns[0][1].value().split()[2]
    conns[0][1].clear()
    holder = 0

    def handOver() -> None:
        nonlocal holder, token
        p, t = conns[holder]
        p.dataReceived(b"R hot %s\n" % token)
        assert t.value() == b"R hot OK\n"
        t.clear()
        clock.advance(0)
        holder = (holder + 1) % WAITERS
        answer = conns[holder][1].value()
        conns[holder][1].clear()
        assert answer.startswith(b"A hot "), answer
        token = answer.split()[2]
        p.dataReceived(b"A hot 30 0\n")  # back in the queue
        clock.advance(0)

    return counted(lambda _: handOver(), steps)


LINES_PER_READ = 100


def perMirroredLine(reads: int = 200) -> Work:
    from lockservice.cluster.node import Cluster
    from lockservice.cluster.peer import PeerChannel

    clock = Clock()
    clock.advance(1000)
    now = 1_800_000_000_000_000
    service = LockService(clock, lambda: now)
    monitor = Monitor(clock, service.table.clientOf, wallTime=lambda: 0.0)
    service.notify.attach(monitor)
    service.notify.mirrors.append(monitor)
    peers = ["10.0.0.1:7701", "10.0.0.2:7702"]
    cluster = Cluster(None, service, peers, peers[1], b"s", wallMicros=lambda: now,
                      replication="sent")
    channel = PeerChannel(cluster.receiver, StringTransport(), outbound=True, remote=0)
    channel._cancelTimeout()
    channel.authenticated = True
    channel.paced = False
    cluster.receiver.channelUp(channel)
    channel.dataReceived(b"HB %d active - 5 0\nSNAP %d 1\nSNAPEND\n" % (now, now))
    assert cluster.role == "standby"

    def read(i: int) -> None:
        channel.dataReceived(b"".join(
            b"G k%d %d 30000000 0 1 -\nD k%d %d\n" % (n, i * 100 + n + 10, n, i * 100 + n + 10)
            for n in range(LINES_PER_READ // 2)) + b"S %d\n" % i)

    work = counted(read, reads)
    return Work(work.lines / LINES_PER_READ, work.calls / LINES_PER_READ)


def _within(what: str, measured: Work, lines: float, calls: float) -> None:
    print(f"{what}: {measured.lines:.2f} lines, {measured.calls:.2f} calls "
          f"(budgets {lines}, {calls})")
    over = []
    if measured.lines > lines:
        over.append(f"{measured.lines:.1f} lines > budget {lines}: more work on the "
                    "request path")
    if measured.calls > calls:
        over.append(f"{measured.calls:.1f} calls > budget {calls}: a new layer of calls "
                    "on the request path")
    assert not over, f"{what}: " + "; ".join(over) + " (measure it, see docs/performance.md)"


def test_an_acquire_release_pair_stays_within_its_budget() -> None:
    _within("pair", perPair(), LINES_PER_PAIR, CALLS_PER_PAIR)


def test_a_contended_hand_off_stays_within_its_budget() -> None:
    _within("hand-off", perHandOff(), LINES_PER_HAND_OFF, CALLS_PER_HAND_OFF)


def test_the_monitor_adds_little_to_a_pair() -> None:
    _within("the monitor's share of a pair", perPair(True) - perPair(False),
            MONITOR_LINES, MONITOR_CALLS)


def test_the_monitor_adds_little_to_a_contended_hand_over() -> None:
    _within("the monitor's share of a hand-over", perHandOver(True) - perHandOver(False),
            MONITOR_LINES_CONTENDED, MONITOR_CALLS_CONTENDED)


def test_a_standby_mirrors_its_stream_within_its_budget() -> None:
    _within("a mirrored line", perMirroredLine(), LINES_PER_MIRRORED_LINE,
            CALLS_PER_MIRRORED_LINE)
