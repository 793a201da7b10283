"""
Shared keys in real clusters of twistd processes: readers and semaphore
grants replicate before their answers, survive kill -9 failover and a
graceful handoff, and merge on a heal as SPEC section 2 says.
"""

from __future__ import annotations

import signal
import time
from typing import List

import pytest

from lockservice.testing.harness import LineClient, probeRole, waitFor
from tests.support.clusterprocess import onlyActive

pytestmark = pytest.mark.slow


def ask(port: int, line: bytes) -> bytes:
    """
    One request, retried while the node answers C{M <op> <key> *} (a new
    active, until its live peers take its stream).
    """
    deadline = time.monotonic() + 15
    while True:
        with LineClient(port) as c:
            answer: bytes = c.ask(line, timeout=10)
        if not (answer.startswith(b"M ") and answer.endswith(b" *")) \
                or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def take(port: int, key: bytes, share: bytes) -> int:
    answer = ask(port, b"A " + key + b" 60 5 " + share)
    assert answer.startswith(b"A " + key + b" "), answer
    return int(answer.split()[2])


def holdShared(port: int) -> List[int]:
    """
    Three readers of C{rk} and two grants of the semaphore of 2 C{sk}.
    """
    return [take(port, b"rk", b"r") for _ in range(3)] + [take(port, b"sk", b"2")
                                                          for _ in range(2)]


def checkStillHeld(port: int, tokens: List[int]) -> None:
    # The kinds came across: a writer and a third semaphore grant wait, a
    # reader fits beside the readers, another slot count is refused.
    assert ask(port, b"A rk 30 0.3") == b"T rk"
    assert ask(port, b"A sk 30 0.3 2") == b"T sk"
    assert ask(port, b"A sk 30 0 3").startswith(b"E A sk the share does not match")
    extra = take(port, b"rk", b"r")
    assert extra > max(tokens)
    # Every grant came across with its own token.
    with LineClient(port) as c:
        for key, token in zip([b"rk"] * 3 + [b"sk"] * 2 + [b"rk"], tokens + [extra], strict=True):
            assert c.ask(b"R %s %d" % (key, token)) == b"R %s OK" % key


def test_shared_grants_survive_kill_9_of_the_active(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2)
    first, second = c.nodes
    waitFor(lambda: onlyActive(c, first), 15, what="node0 active")
    waitFor(lambda: probeRole(second.port) == "M " + first.address, 10, what="node1 follows")
    tokens = holdShared(first.port)
    first.kill()  # no pause: the standby had every grant before its answer
    waitFor(lambda: probeRole(second.port) == "active", 10, what="node1 active")
    checkStillHeld(second.port, tokens)


def test_shared_grants_survive_a_graceful_handoff(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2)
    first, second = c.nodes
    waitFor(lambda: onlyActive(c, first), 15, what="node0 active")
    waitFor(lambda: probeRole(second.port) == "M " + first.address, 10, what="node1 follows")
    tokens = holdShared(first.port)
    assert first.interrupt(15) in (0, -signal.SIGINT)
    waitFor(lambda: probeRole(second.port) == "active", 10, what="node1 active")
    checkStillHeld(second.port, tokens)


def test_a_heal_keeps_the_readers_of_both_sides_and_the_newer_kind(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    node1 serves readers of C{rk} and a semaphore C{sk}, and is paused;
    node0 restarts empty and serves readers of C{rk} too, and readers of
    C{sk}.  On the heal the readers of both sides fit together and are all
    kept; C{sk}'s kinds disagree, so the side with the highest token
    (node0's readers) keeps its grants and its kind.
    """
    c = cluster(2)
    node0, node1 = c.nodes
    waitFor(lambda: onlyActive(c, node0), 15, what="node0 active")
    node0.kill()
    waitFor(lambda: probeRole(node1.port) == "active", 10, what="node1 active")
    paused = [take(node1.port, b"rk", b"r") for _ in range(2)]
    semaphore = take(node1.port, b"sk", b"2")
    node1.signal(signal.SIGSTOP)
    try:
        node0.start()
        waitFor(lambda: probeRole(node0.port) == "active", 15, what="node0 active, empty")
        fresh = [take(node0.port, b"rk", b"r") for _ in range(2)]
        readersOfSk = take(node0.port, b"sk", b"r")
    finally:
        node1.signal(signal.SIGCONT)
    waitFor(lambda: probeRole(node1.port, timeout=1) == "M " + node0.address, 10,
            what="node1 steps down")
    # The merge is over once node1 follows and its offer was read: wait for
    # its readers to be known.
    with LineClient(node0.port) as conn:
        waitFor(lambda: conn.ask(b"N rk %d 60" % paused[0]) == b"N rk OK", 10,
                what="node1's readers merged")
        for token in paused + fresh:
            assert conn.ask(b"R rk %d" % token) == b"R rk OK"
        assert conn.ask(b"R sk %d" % semaphore) == b"R sk STALE"
        assert conn.ask(b"R sk %d" % readersOfSk) == b"R sk OK"
