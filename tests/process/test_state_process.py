"""
C{--state-dir} on real C{twistd} processes: held locks across a graceful
restart, tokens that rise across a restart with the clock behind, and a
state file that is refused in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, Optional

import pytest

from lockservice.testing.harness import (
    LineClient,
    Node,
    activeNodes,
    freePort,
    freePorts,
    probeRole,
    twistdEnvironment,
    waitFor,
)
from tests.support.faketime import requireFaketime


def stateNode(tmp_path, name: str = "lone", args: Optional[List[str]] = None) -> Node:  # type: ignore[no-untyped-def]
    state = str(tmp_path / f"{name}-state")
    return Node(freePort(), args=["--state-dir", state] + (args or []),
                logDir=str(tmp_path), name=name)


def startWith(node: Node, env: Dict[str, str]) -> Node:
    full = twistdEnvironment()
    full.update(env)
    with open(os.path.join(node.logDir, f"{node.name}.stderr"), "ab") as stderr:
        node.process = subprocess.Popen(node.command(), env=full, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=stderr)
    node.waitReady()
    return node


def terminate(node: Node) -> None:
    assert node.process is not None
    node.signal(signal.SIGTERM)
    assert node.process.wait(15) in (0, -signal.SIGTERM)


def grant(port: int, key: bytes, lease: int = 60) -> int:
    with LineClient(port) as c:
        answer = c.ask(b"A %s %d 5" % (key, lease)).split()
    assert answer[:2] == [b"A", key], answer
    return int(answer[2])


def test_a_lone_node_keeps_held_locks_across_a_graceful_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = stateNode(tmp_path)
    node.start()
    try:
        held = grant(node.port, b"orders/42")
        short = grant(node.port, b"short", lease=1)
        terminate(node)
        import time

        time.sleep(1.2)  # the short lease runs out while the node is down
        node.start()
        with LineClient(node.port) as c:
            assert c.ask(b"N orders/42 %d 60" % held) == b"N orders/42 OK"
            assert c.ask(b"R short %d" % short) == b"R short STALE"
            # Held: a new acquire waits; the holder's release hands it over.
            c.send(b"A orders/42 60 5\n")
            with LineClient(node.port) as holder:
                assert holder.ask(b"R orders/42 %d" % held) == b"R orders/42 OK"
            after = c.readline(timeout=5).split()
        assert after[:2] == [b"A", b"orders/42"] and int(after[2]) > held
    finally:
        node.stop()


def grantShared(port: int, key: bytes, share: bytes) -> int:
    with LineClient(port) as c:
        answer = c.ask(b"A %s 60 0 %s" % (key, share)).split()
    assert answer[:2] == [b"A", key], answer
    return int(answer[2])


def test_shared_grants_survive_a_graceful_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 24 with shared keys: both readers of a read lock and both slots
    taken of a 2-slot semaphore are held again after the restart, and the
    key's kind with them (a writer waits; a third slot waits).
    """
    node = stateNode(tmp_path)
    node.start()
    try:
        readers = [grantShared(node.port, b"doc", b"r") for _ in range(2)]
        slots = [grantShared(node.port, b"pool", b"2") for _ in range(2)]
        terminate(node)
        node.start()
        with LineClient(node.port) as c:
            for token in readers:
                assert c.ask(b"N doc %d 60" % token) == b"N doc OK"
            for token in slots:
                assert c.ask(b"N pool %d 60" % token) == b"N pool OK"
            assert c.ask(b"A doc 60 0.3") == b"T doc"  # the writer does not fit
            assert c.ask(b"A pool 60 0.3 2") == b"T pool"  # no free slot
            assert c.ask(b"A pool 60 0.3 3").startswith(b"E A pool")  # kind kept
            assert c.ask(b"A doc 60 0.3 r").startswith(b"A doc ")  # readers still fit
    finally:
        node.stop()


def test_without_state_dir_a_graceful_restart_loses_held_locks(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    The documented default (docs/consistency.md): a throwaway node forgets.
    """
    node = spawn()
    held = grant(node.port, b"k")
    terminate(node)
    node.start()
    with LineClient(node.port) as c:
        assert c.ask(b"R k %d" % held) == b"R k STALE"


@pytest.mark.parametrize("stateDir", [True, False], ids=["state-dir", "no-state-dir"])
def test_tokens_after_a_restart_with_the_clock_600_s_behind(tmp_path, stateDir) -> None:  # type: ignore[no-untyped-def]
    """
    kill -9, then start again with the wall clock ten minutes behind
    (libfaketime): with --state-dir the next token is still higher; without
    it the token falls by about 600 s (SPEC section 2's limit, documented).
    """
    library = requireFaketime()
    node = stateNode(tmp_path) if stateDir else Node(freePort(), logDir=str(tmp_path))
    node.start()
    try:
        before = grant(node.port, b"a")
        node.kill()
        startWith(node, {"LD_PRELOAD": library, "FAKETIME": "-600",
                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        after = grant(node.port, b"b")
        if stateDir:
            assert after > before
        else:
            assert before - after > 590 * 1_000_000
    finally:
        node.stop()


def test_a_lease_that_ran_out_while_down_stays_expired_when_the_clock_steps_back(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    A 3 s lease, a graceful stop, 4 s down, and a start with the wall
    clock an hour behind (libfaketime): the lease ran out while the node
    was down and stays so (the boot clock measured the downtime) -- its
    token is STALE and another client gets the key at once.  (Measured on
    the wall clock, the lease came back for 2.9 s.)  A longer lease keeps
    its time left, holder name included.
    """
    library = requireFaketime()
    node = stateNode(tmp_path)
    node.start()
    try:
        with LineClient(node.port) as c:
            c.ask(b"I paused#1")
            short = int(c.ask(b"A short 3 5").split()[2])
            long = int(c.ask(b"A long 60 5").split()[2])
        terminate(node)
        time.sleep(4)
        startWith(node, {"LD_PRELOAD": library, "FAKETIME": "-3600",
                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        with LineClient(node.port) as c:
            assert c.ask(b"N short %d 10" % short) == b"N short STALE"
            assert c.ask(b"A short 10 0.5").startswith(b"A short ")
            assert c.ask(b"O long ? 0") == b"O long %d paused#1" % long
            assert c.ask(b"N long %d 60" % long) == b"N long OK"
    finally:
        node.stop()


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_bad_state_file_is_refused_in_one_line(tmp_path, damage: str) -> None:  # type: ignore[no-untyped-def]
    node = stateNode(tmp_path)
    node.start()
    try:
        grant(node.port, b"k")
        terminate(node)
    finally:
        node.stop()
    path = tmp_path / "lone-state" / "state"
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        # Another cluster's directory (a node that had peers and a secret).
        secret = tmp_path / "secret"
        secret.write_text("another-cluster-secret-0123456789\n")
        ports = freePorts(2)
        other = Node(ports[0], peers=ports, logDir=str(tmp_path), name="other",
                     args=["--secret", str(secret), "--state-dir", str(tmp_path / "other-state")])
        other.start()
        terminate(other)
        path.write_bytes((tmp_path / "other-state" / "state").read_bytes())
    result = subprocess.run(node.command(), env=twistdEnvironment(), capture_output=True,
                            timeout=60)
    assert result.returncode != 0
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    why = "checksum" if damage == "truncated" else "another cluster"
    assert lines[0].startswith("twistd lockservice: --state-dir ") and why in lines[0]


def stateCluster(cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = cluster(3, start=False)
    for i, node in enumerate(c.nodes):
        node.args += ["--state-dir", str(tmp_path / f"node{i}-state")]
    return c.start()


def heldBy(port: int, key: bytes, token: int) -> bool:
    """
    Whether C{token} holds C{key} on the node at C{port}: a renewal by it
    answers OK (it does not change the token).
    """
    with LineClient(port) as c:
        return c.ask(b"N %s %d 60" % (key, token)) == b"N %s OK" % key


@pytest.mark.parametrize("order", ["lowest-first", "highest-first"])
def test_a_full_graceful_restart_of_three_nodes_keeps_held_locks(cluster, tmp_path, order) -> None:  # type: ignore[no-untyped-def]
    """
    SIGTERM every node (lowest priority first: the active stops last, with
    nobody to hand its locks to; or highest first: the locks move down by
    handoffs and the lowest node stops last), then start all three again:
    the held locks are served again, their holders' releases answer OK,
    and new tokens are higher.
    """
    c = stateCluster(cluster, tmp_path)
    first = c.nodes[0]
    waitFor(lambda: [n.port for n in activeNodes(c.nodes)] == [first.port], 10,
            what="node0 active")
    tokens = {b"held/%d" % i: grant(first.port, b"held/%d" % i) for i in range(5)}
    for node in (reversed(c.nodes) if order == "lowest-first" else c.nodes):
        terminate(node)
    for node in c.nodes:
        node.start(wait=False)
    for node in c.nodes:
        node.waitReady()
    waitFor(lambda: [n.port for n in activeNodes(c.nodes)] == [first.port], 15,
            what="node0 active again")
    waitFor(lambda: all(probeRole(n.port) == "M " + first.address for n in c.nodes[1:]), 15,
            what="the others follow node0")
    for key, token in tokens.items():
        assert heldBy(first.port, key, token), key
    with LineClient(first.port) as conn:
        assert conn.ask(b"R held/0 %d" % tokens[b"held/0"]) == b"R held/0 OK"
    assert grant(first.port, b"fresh") > max(tokens.values())


def test_a_standby_with_its_clock_600_s_behind_says_so_without_state_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Without --state-dir, a node whose clock is ten minutes behind the
    tokens it learns from its active says so on /status and once in its
    log (a restart or a failover to it could issue lower tokens).
    """
    import json
    import urllib.request

    library = requireFaketime()
    ports = freePorts(3)
    peers = ports[:2]
    first = Node(peers[0], peers=peers, logDir=str(tmp_path), name="node0")
    second = Node(peers[1], peers=peers, logDir=str(tmp_path), name="node1",
                  args=["--http", f"tcp:{ports[2]}:interface=127.0.0.1"])
    first.start()
    try:
        startWith(second, {"LD_PRELOAD": library, "FAKETIME": "-600",
                           "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        waitFor(lambda: probeRole(second.port) == "M " + first.address, 15,
                what="node1 follows node0")
        grant(first.port, b"k")

        def warning() -> Optional[str]:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[2]}/status", timeout=10) as r:
                return json.loads(r.read())["clock_warning"]  # type: ignore[no-any-return]

        waitFor(lambda: warning() is not None, 15, what="a clock warning on /status")
        assert "s behind the highest token" in (warning() or "")
        waitFor(lambda: "behind the highest token" in second.tail(200), 15,
                what="the warning in node1's log")
        assert second.tail(400).count("behind the highest token") == 1
    finally:
        first.stop()
        second.stop()


def test_saved_locks_meeting_a_live_active_are_merged_not_served_beside(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    node0 stops last and saves its locks; node1 starts alone first and
    serves (a new grant); then node0 starts with its saved locks: it never
    serves beside node1 (both polled), offers them, and once it has taken
    over (by handoff: it is first in --peers) holds both sides' locks.
    """
    c = cluster(2, start=False)
    for i, node in enumerate(c.nodes):
        node.args += ["--state-dir", str(tmp_path / f"node{i}-state")]
    c.start()
    first, second = c.nodes
    waitFor(lambda: [n.port for n in activeNodes(c.nodes)] == [first.port], 10,
            what="node0 active")
    saved = grant(first.port, b"saved")
    terminate(second)
    terminate(first)
    second.start()
    waitFor(lambda: [n.port for n in activeNodes(c.nodes)] == [second.port], 15,
            what="node1 active alone")
    fresh = grant(second.port, b"fresh")
    first.start(wait=False)
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        actives = activeNodes(c.nodes)
        assert len(actives) <= 1, "two actives at once"
        if [n.port for n in actives] == [first.port] and probeRole(second.port) == (
                "M " + first.address):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("node0 did not take over:\n" + first.tail())
    assert heldBy(first.port, b"saved", saved)
    assert heldBy(first.port, b"fresh", fresh)
    assert grant(first.port, b"next") > max(saved, fresh)
