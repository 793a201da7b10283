"""
Observers and the lock-delay on real nodes: across a failover (kill -9),
a graceful handoff (SIGTERM) and a restart with --state-dir.
"""

from __future__ import annotations

import signal
import time
from typing import List

import pytest

from lockservice.client import sync
from lockservice.testing.harness import LineClient, Node, freePort, probeRole, waitFor

pytestmark = pytest.mark.slow


def activeOf(nodes: List[Node]) -> Node:
    return waitFor(lambda: next((n for n in nodes if n.process is not None
                                 and n.process.poll() is None
                                 and probeRole(n.port) == "active"), None),
                   20, what="an active node")


def grant(node: Node, line: bytes) -> bytes:
    """
    The answer to an acquire, asked again while the node answers M ... *
    (a new active waits a moment for its standbys to follow it).
    """
    deadline = time.monotonic() + 15
    while True:
        with LineClient(node.port) as c:
            answer = c.ask(line, timeout=15)
        if not answer.startswith(b"M ") or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def test_a_watcher_sees_every_change_across_a_failover(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    A client watching a key (the blocking client's observe iterator) sees
    the grant, then -- after a kill -9 of the active -- the release made
    on the new active: it re-observes there with the token it last saw,
    so no change is missed.
    """
    c = cluster(3)
    addresses = ",".join(n.address for n in c.nodes)
    holder = sync.connect(addresses, name="holder")
    watcher = sync.connect(addresses, name="watcher")
    try:
        states = watcher.observe("watched", timeout=20)
        assert next(states).token == 0
        lock = holder.acquire("watched", lease=60, wait=5)
        seen = next(states)
        assert (seen.token, seen.value) == (lock.token, "holder")
        time.sleep(0.3)  # the grant reaches the standbys
        c.nodes[0].kill()
        successor = activeOf(c.nodes[1:])
        assert holder.release(lock) is True
        after = next(states)
        assert after.token == 0, f"{after} after the release on {successor.name}"
        states.close()
    finally:
        holder.close()
        watcher.close()


def test_a_waiting_observer_is_redirected_at_a_handoff_and_the_new_active_answers(
        cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    old = c.nodes[0]
    token = grant(old, b"A k 60 5").split()[2]
    with LineClient(old.port) as watcher:
        watcher.send(b"O k " + token + b" 0\n")
        time.sleep(0.3)
        old.signal(signal.SIGTERM)
        answer = watcher.readline(timeout=15)
    assert answer.startswith(b"M O k "), answer
    successor = activeOf(c.nodes[1:])
    with LineClient(successor.port) as again:
        # The state it last saw is still the state: it waits; a release
        # there answers it.
        again.send(b"O k " + token + b" 0\n")
        with LineClient(successor.port) as releaser:
            assert releaser.ask(b"R k " + token, timeout=10) == b"R k OK"
        assert again.readline(timeout=10) == b"O k 0 -"


def test_the_lock_delay_survives_a_failover(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    A grant expires on the active (its place kept for 3 s by the
    lock-delay); the active is killed: the new active keeps the place
    until the delay ends, then grants the key.
    """
    c = cluster(3, args=["--lock-delay", "3"])
    assert grant(c.nodes[0], b"A k 1 5").startswith(b"A k ")
    expired = time.monotonic() + 1.0
    time.sleep(1.5)  # expired; the delay runs, replicated
    c.nodes[0].kill()
    successor = activeOf(c.nodes[1:])
    answer = grant(successor, b"A k 10 10")
    granted = time.monotonic()
    assert answer.startswith(b"A k "), answer
    assert granted >= expired + 3 - 0.2, f"granted {granted - expired:.2f} s after the expiry"


def test_the_lock_delay_survives_a_restart_with_state_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = Node(freePort(), logDir=str(tmp_path),
                args=["--lock-delay", "5", "--state-dir", str(tmp_path / "state")])
    node.start()
    try:
        with LineClient(node.port) as holder:
            holder.ask(b"A k 1 5")
        expired = time.monotonic() + 1.0
        with LineClient(node.port) as observer:
            # The lease has run out once the key shows a place, not a grant
            # (however late a busy machine fires the node's timer).
            waitFor(lambda: observer.ask(b"O k ? 0") == b"O k 0 -", 15)
        node.signal(signal.SIGTERM)
        assert node.process is not None and node.process.wait(15) in (0, -signal.SIGTERM)
        node.start()
        with LineClient(node.port) as waiter:
            assert waiter.ask(b"O k ? 0") == b"O k 0 -"  # a place, not a grant
            answer = waiter.ask(b"A k 10 10", timeout=15)
        granted = time.monotonic()
        assert answer.startswith(b"A k "), answer
        assert granted >= expired + 5 - 0.2, f"granted {granted - expired:.2f} s after expiry"
    finally:
        node.stop()
