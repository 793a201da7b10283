"""
A deterministic guard on the work of acknowledged replication (C{--replication
ack}), counted as tests/server/test_callcount.py counts the request path: the
source lines run in lockservice's own modules (C{sys.settrace}) and the
Python calls made, per step, on StringTransport links and a task.Clock.

Steps measured, each in the shape of one client connection (every change
in a write of its own, every write acknowledged before the next):

  - what replication adds to an acquire+release pair on the active, with
    two standbys that acknowledge each write: the same pairs on the same
    active with no standby subtracted;
  - a standby's work per change: a write of one change and its position,
    acknowledged and applied.

Measured figures and budgets (lines about 10% above, calls about 25%
above, each at least 6 above), and what the code before this guard ran:

                                             lines    calls    before
  replication's share of a pair (2 acks)     328.0     54.0    614 / 108
  a standby, per change                      137.0     27.5    162 / 38.5

The lines count only lockservice's own code: a standby's CPU per change
is as much in the reactor and the kernel (its wake-up, the read, the ACK's
send), which `lockservice bench replication` measures.
"""

from __future__ import annotations

from typing import Any, List

from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE
from lockservice.server.monitor import Monitor
from tests.support.cluster import NOW_US, Lab, following, lines
from tests.support.counting import Work, counted

PAIR_LINES = 361
PAIR_CALLS = 68
STANDBY_LINES = 151
STANDBY_CALLS = 35

PAIRS = 1024


def _active(standbys: int) -> Lab:
    lab = Lab(replication="ack")
    lab.locks.notify.attach(Monitor(lab.clock, lab.locks.table.clientOf,
                                    wallTime=lambda: 0.0))
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    for j in range(1, standbys + 1):
        follower = lab.link(j, outbound=False)
        lab.hear(follower, b"SYNC")
        producer = follower.snapshot
        while producer is not None and not producer.stopped:
            producer.resumeProducing()
        assert follower.synced
        lines(follower)
    lab.client()
    return lab


def _followers(lab: Lab) -> List[PeerChannel]:
    return [c for c in lab.cluster.links.inbound.values() if c.synced]


def perPair(standbys: int) -> Work:
    """
    Acquire+release pairs on one connection of an active whose standbys
    acknowledge every write as it arrives.
    """
    lab = _active(standbys)
    followers = _followers(lab)
    protocol: Any = lab.protocol
    client = protocol.transport

    def acknowledged() -> None:
        for follower in followers:
            data = follower.transport.value()  # type: ignore[attr-defined]
            follower.transport.clear()  # type: ignore[attr-defined]
            position = data[data.rindex(b"S ") + 2:-1]
            follower.dataReceived(b"ACK " + position + b"\n")

    def pair(i: int) -> None:
        key = b"k%d" % (i % 8)
        protocol.dataReceived(b"A %s 30 0\n" % key)
        lab.clock.advance(0)  # the end of the reactor turn: the stream leaves
        acknowledged()
        answer = client.value()  # type: ignore[union-attr]
        client.clear()  # type: ignore[union-attr]
        assert answer.startswith(b"A " + key + b" "), answer
        protocol.dataReceived(b"R %s %s\n" % (key, answer.split()[2]))
        lab.clock.advance(0)
        acknowledged()
        assert client.value() == b"R " + key + b" OK\n"  # type: ignore[union-attr]
        client.clear()  # type: ignore[union-attr]

    return counted(pair, PAIRS)


def perChange(changes: int = PAIRS) -> Work:
    """
    A standby reading its active's stream one change per write (a grant,
    then its release), each write acknowledged on receipt.
    """
    lab = Lab(me=1, replication="ack")
    monitor = Monitor(lab.clock, lab.locks.table.clientOf, wallTime=lambda: 0.0)
    lab.locks.notify.attach(monitor)
    lab.locks.notify.mirrors.append(monitor)  # as makeService wires it
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"SNAPEND")
    lines(leader)
    position = [0]

    def change(i: int) -> None:
        position[0] += 1
        token = 10 + i // 2
        if i % 2 == 0:
            line = b"G k%d %d 30000000 0 1 -\n" % (i % 8, token)
        else:
            line = b"D k%d %d\n" % ((i - 1) % 8, token)
        leader.dataReceived(line + b"S %d\n" % position[0])
        assert leader.transport.value() == b"ACK %d\n" % position[0]  # type: ignore[attr-defined]
        leader.transport.clear()  # type: ignore[attr-defined]

    return counted(change, changes)


def _within(what: str, measured: Work, lines_: float, calls: float) -> None:
    print(f"{what}: {measured.lines:.1f} lines, {measured.calls:.1f} calls "
          f"(budgets {lines_}, {calls})")
    assert measured.lines <= lines_, (
        f"{what}: {measured.lines:.1f} lines > budget {lines_}: more work on the "
        "replication path (measure it: lockservice bench replication)")
    assert measured.calls <= calls, (
        f"{what}: {measured.calls:.1f} calls > budget {calls}: a new layer of calls on "
        "the replication path (measure it: lockservice bench replication)")


def test_acknowledged_replication_adds_little_to_a_pair() -> None:
    _within("replication's share of a pair", perPair(2) - perPair(0), PAIR_LINES, PAIR_CALLS)


def test_a_standby_applies_a_change_within_its_budget() -> None:
    _within("a standby, per change", perChange(), STANDBY_LINES, STANDBY_CALLS)
