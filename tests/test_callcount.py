"""
A regression guard for the request path that cannot flake: it counts the
Python function calls made in lockservice's own modules per acquire+release
pair through the real protocol and service (StringTransport, task.Clock),
with the operator's view (the monitor) attached, and fails above a budget.

Only frames whose code lives under lockservice/ count, so the Twisted
version (tox's oldest and newest) does not change the figure.  Measured
when the budget was set: 76 calls a pair (60 with the monitor detached);
08f723a, before the monitor noted changes lazily, made 85 (61).  Then the
wait-for graph learned which connections are one client instance (issue 21
item 8): 2 calls more per grant, 78.  Then the request path was trimmed
(issue 20 item 3, branch speed): 54 (36 detached); a contended hand-off
(one queued acquire and one release handing the key over, 16 connections)
went from 118 to 90.  Separately (issue 20 item 2) the
monitor skipped the wait-for graph for keys nobody waits for and its fold
stopped calling per event: the monitor adds 3 calls a pair (its two observer
calls and the hold time's sketch in the fold); then (2026-12-04) the
fan-out noted grants and releases in the monitor's log itself (its lane)
and the fold added hold times inline: 1 (here the hold time's sketch is
still a call: the Clock does not move, and a zero time takes Sketch.add).  Raise
the budgets only with a measured reason (docs/performance.md).
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Callable, Dict, List, Tuple

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

import lockservice
from lockservice.server.monitor import Monitor
from lockservice.server.protocol import LockFactory
from lockservice.server.service import LockService

# Set from the measurement (2026-12-02, after issue 20's request-path and
# monitor work: 39.0 per pair, 58.0 per hand-off; 78 and 118 on 44f434e;
# 2026-12-03, the wait-for graph's pins inline: 55.0 per hand-off;
# 2026-12-04, a wait enters the graph only once it has lasted 50 ms: 48.0;
# then the monitor's lane: 37.0 per pair, 47.0 per hand-off),
# with two calls of margin: the next 40% cannot land unnoticed.
CALLS_PER_PAIR = 39
# A hand-off: a queued acquire, and the release that hands the key to the
# next waiter (16 connections taking turns on one key).
CALLS_PER_HAND_OFF = 49
# What the monitor may add to a pair (08f723a: 24; 18 before issue 20
# item 2's cut; 3 before its lane).
MONITOR_CALLS = 2  # 1 and the folds (every 1,024 changes)
# Enough pairs that the monitor's lazy folds (every FOLD_AT noted changes)
# are counted too.
PAIRS = 2048

ROOT = os.path.dirname(lockservice.__file__) + os.sep


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


def _counted(step: Callable[[int], None], count: int) -> float:
    for i in range(20):
        step(i)  # first-time paths out of the count
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            calls += 1

    sys.setprofile(profile)
    try:
        for i in range(count):
            step(i)
    finally:
        sys.setprofile(None)
    return calls / count


def callsPerPair(monitor: bool = True, pairs: int = PAIRS) -> float:
    clock, [(protocol, transport)] = _node(monitor)
    return _counted(lambda i: _pair(clock, protocol, transport, i), pairs)


def callsPerHandOff(monitor: bool = True, handOffs: int = PAIRS) -> float:
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

    return _counted(handOff, handOffs)


def test_an_acquire_release_pair_stays_within_its_call_budget() -> None:
    measured = callsPerPair(monitor=True)
    print(f"{measured:.2f} lockservice calls per acquire+release pair, monitor attached")
    assert measured <= CALLS_PER_PAIR, (
        f"{measured:.1f} calls per pair > budget {CALLS_PER_PAIR}: something new on the "
        "request path (measure it, see docs/performance.md)")


def test_a_contended_hand_off_stays_within_its_call_budget() -> None:
    measured = callsPerHandOff(monitor=True)
    print(f"{measured:.2f} lockservice calls per contended hand-off, monitor attached")
    assert measured <= CALLS_PER_HAND_OFF, (
        f"{measured:.1f} calls per hand-off > budget {CALLS_PER_HAND_OFF}: something new on "
        "the hand-over path (measure it, see docs/performance.md)")


def test_the_monitor_costs_few_calls_per_pair() -> None:
    added = callsPerPair(monitor=True) - callsPerPair(monitor=False)
    assert added <= MONITOR_CALLS, f"the monitor adds {added:.1f} calls per pair"


# A contended key (issue 20 item 2): every acquire queues, every release
# hands over.  Measured when the budget was set: the monitor added 47 calls
# per hand-over before (a wait-for check scheduled and searched per wait,
# the instance-name regex and a new Instance per look-up), 16 after; 12
# once the graph pinned connections inline (2026-12-03); 5 once a wait
# enters the graph only when it has lasted 50 ms (2026-12-04: these waits
# never do, as on a busy key).
MONITOR_CALLS_CONTENDED = 7
WAITERS = 4


def callsPerHandOver(monitor: bool = True, steps: int = 1024) -> float:
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

    return _counted(lambda _: handOver(), steps)


def test_the_monitor_costs_few_calls_per_hand_over() -> None:
    added = callsPerHandOver(monitor=True) - callsPerHandOver(monitor=False)
    print(f"the monitor adds {added:.2f} calls per hand-over")
    assert added <= MONITOR_CALLS_CONTENDED, f"the monitor adds {added:.1f} calls per hand-over"


# A standby applying its active's stream (issue: the mirror through the
# service): calls per replicated line, each read one batch with the monitor
# attached as makeService wires it.  Measured when the budget was set, in
# reads of 100 G/D lines: 4.56 per line before the batch (a parse helper
# and a mirror wrapper per line), 3.64 after (the table's own calls are
# most of it).
CALLS_PER_MIRRORED_LINE = 3.7
LINES_PER_READ = 100


def callsPerMirroredLine(reads: int = 200) -> float:
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

    return _counted(read, reads) / LINES_PER_READ


def test_a_standby_mirrors_its_stream_within_its_call_budget() -> None:
    measured = callsPerMirroredLine()
    print(f"{measured:.2f} lockservice calls per replicated line on a standby")
    assert measured <= CALLS_PER_MIRRORED_LINE, (
        f"{measured:.2f} calls per replicated line > budget {CALLS_PER_MIRRORED_LINE}")
