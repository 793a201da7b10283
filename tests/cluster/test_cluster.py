"""
Real clusters of twistd processes on loopback, with real signals.  Each
test asserts what a client sees: who is active, which keys are still held,
whether tokens rose.
"""

from __future__ import annotations

import signal
import time

import pytest

from lockservice.testing.harness import LineClient, probeRole, waitFor
from tests.support.clusterprocess import onlyActive

pytestmark = pytest.mark.slow


def acquire(port: int, key: bytes, lease: bytes, wait: bytes) -> bytes:
    """
    One acquire, retried while the node answers C{M A <key> *}: a new
    active does so until its live peers receive its stream (a heartbeat
    or two after a promotion, longer on a loaded machine).
    """
    deadline = time.monotonic() + 15
    while True:
        with LineClient(port) as c:
            answer: bytes = c.ask(b"A " + key + b" " + lease + b" " + wait, timeout=10)
        if answer != b"M A " + key + b" *" or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def grant(port: int, key: bytes, lease: bytes = b"30") -> int:
    answer = acquire(port, key, lease, b"5")
    assert answer.startswith(b"A " + key + b" "), answer
    return int(answer.split()[2])


def isHeld(port: int, key: bytes) -> bool:
    """
    True when the active at C{port} answers a short acquire of C{key} with T.
    """
    answer = acquire(port, key, b"30", b"0.3")
    if answer.startswith(b"A "):
        with LineClient(port) as c:
            c.ask(b"R " + key + b" " + answer.split()[2])
        return False
    assert answer == b"T " + key, answer
    return True


def test_three_nodes_one_active_others_redirect(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    first, second, third = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    assert probeRole(second.port) == "M " + first.address
    waitFor(lambda: probeRole(third.port) == "M " + first.address, 5, what="node2 follows node0")
    for node in c.nodes:
        with LineClient(node.port) as conn:
            assert conn.ask(b"P up") == b"P up"
            assert conn.ask(b"A bad 1e3 0").startswith(b"E A bad ")


def test_kill_9_of_active_promotes_next_with_replicated_locks(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    first, second, third = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    tokens = [grant(first.port, b"held/%d" % i) for i in range(5)]
    with LineClient(first.port) as conn:
        released = conn.ask(b"A gone 30 0")
        conn.ask(b"R gone " + released.split()[2])
    # No pause: the standbys have every change before its answer is sent.
    first.kill()
    started = time.monotonic()
    waitFor(lambda: onlyActive(c, second), 5, what="node1 active after kill -9")
    gap = time.monotonic() - started
    assert gap < 5
    # The third node may still wait out --peer-timeout for node0 (when its
    # link saw a reset rather than a FIN) before it redirects to node1; on
    # a busy machine its heartbeats can lag by seconds, hence the bound.
    waitFor(lambda: probeRole(third.port) == "M " + second.address, 15,
            what="node2 redirects to node1")
    for i in range(5):
        assert isHeld(second.port, b"held/%d" % i)
    assert not isHeld(second.port, b"gone")
    assert grant(second.port, b"fresh") > max(tokens)
    # The replicated token releases on the new active.
    with LineClient(second.port) as conn:
        assert conn.ask(b"R held/0 %d" % tokens[0]) == b"R held/0 OK"


def test_graceful_stop_hands_off_without_losing_locks(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    first, second, third = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    token = grant(first.port, b"kept")
    waiter = LineClient(first.port)
    # The ping's answer proves the acquire before it was read and queued.
    assert waiter.ask(b"A kept 30 0\nP queued") == b"P queued"
    assert first.process is not None
    first.signal(signal.SIGINT)
    # The queued waiter is redirected to the successor, not dropped.
    assert waiter.readline(timeout=10) == b"M A kept " + second.address.encode()
    assert first.process.wait(10) in (0, -signal.SIGINT)
    assert onlyActive(c, second)
    assert isHeld(second.port, b"kept")
    with LineClient(second.port) as conn:
        assert conn.ask(b"R kept %d" % token) == b"R kept OK"
    assert grant(second.port, b"next") > token
    waitFor(lambda: probeRole(third.port) == "M " + second.address, 5, what="node2 follows node1")


def test_sigstop_split_brain_resolves_to_higher_priority(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    first, second, third = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    before = grant(first.port, b"before")
    first.signal(signal.SIGSTOP)
    try:
        waitFor(lambda: probeRole(second.port, timeout=1) == "active", 10,
                what="node1 promoted while node0 is paused")
        during = grant(second.port, b"during")
        assert during > before
    finally:
        first.signal(signal.SIGCONT)
    resumed = time.monotonic()
    waitFor(lambda: probeRole(second.port) == "M " + first.address, 10,
            what="node1 steps down")
    assert time.monotonic() - resumed < 10
    waitFor(lambda: onlyActive(c, first), 10, what="node0 the only active")
    waitFor(lambda: probeRole(third.port) == "M " + first.address, 5, what="node2 follows node0")
    # Tokens only rise, whichever side issued them.
    assert grant(first.port, b"after") > during


def test_restarted_higher_priority_node_catches_up_then_takes_over(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    first, second, third = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    first.kill()
    waitFor(lambda: onlyActive(c, second), 5, what="node1 active")
    token = grant(second.port, b"made-on-node1")
    first.start()
    restarted = time.monotonic()
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active again")
    assert time.monotonic() - restarted < 10
    assert isHeld(first.port, b"made-on-node1")
    with LineClient(first.port) as conn:
        assert conn.ask(b"R made-on-node1 %d" % token) == b"R made-on-node1 OK"
    assert probeRole(second.port) == "M " + first.address


def test_two_nodes_failover_and_back(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2)
    first, second = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    token = grant(first.port, b"k")
    first.kill()
    waitFor(lambda: onlyActive(c, second), 5, what="node1 active")
    assert isHeld(second.port, b"k")
    assert grant(second.port, b"k2") > token
    # Graceful stop of the last node: nothing to hand to, it just exits.
    assert second.interrupt(15) in (0, -signal.SIGINT)


def test_standby_graceful_stop_just_leaves(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2)
    first, second = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    assert second.interrupt(15) in (0, -signal.SIGINT)
    assert onlyActive(c, first)


def test_secret_required_from_peers(tmp_path, cluster) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "secret"
    secret.write_text("a-cluster-secret-of-some-length\n")
    c = cluster(2, args=["--secret", str(secret)])
    first, second = c.nodes
    waitFor(lambda: onlyActive(c, first), 10, what="node0 active")
    assert probeRole(second.port) == "M " + first.address
    # An impostor that knows the peer list but not the secret is refused.
    with LineClient(first.port) as impostor:
        answer = impostor.ask(b"HELLO 3 " + second.address.encode() + b" "
                              + first.address.encode() + b" " + b"ab" * 16)
        assert answer.startswith(b"CHALLENGE ")
        assert impostor.ask(b"AUTH " + b"0" * 64) == b"E * * peer authentication failed"
        assert impostor.sock.recv(10) == b""
    # A stranger not in --peers is refused at once.
    with LineClient(first.port) as stranger:
        answer = stranger.ask(b"HELLO 3 10.9.9.9:1 " + first.address.encode() + b" " + b"ab" * 16)
        assert answer == b"E * * not a peer of this cluster"


def test_peer_messages_on_client_connection_are_rejected(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2)
    first = c.nodes[0]
    with LineClient(first.port) as conn:
        assert conn.ask(b"P x") == b"P x"
        assert conn.ask(b"HELLO 1 " + c.nodes[1].address.encode() + b" n").startswith(b"E * ")
        assert conn.ask(b"HB 5 active - 1 0").startswith(b"E * ")
        assert conn.ask(b"SYNC").startswith(b"E * ")


