"""
Limits and abuse against a real C{twistd} node over TCP: a client that
sends without reading, the exact answers of the limits, too many
connections, and a token-guessing flood of releases.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from typing import List

import pytest

from lockservice.testing.harness import LineClient, twistdEnvironment

MiB = 1024 * 1024


def readAll(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """
    Everything until the node closes the connection.
    """
    sock.settimeout(timeout)
    received = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        received += data
    return received


def readLines(sock: socket.socket, count: int, timeout: float = 10.0) -> bytes:
    """
    Up to C{count} lines, fewer when the node closes the connection first.
    """
    sock.settimeout(timeout)
    received = b""
    while received.count(b"\n") < count:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        received += data
    return received


def floodUntilBackpressure(flood: socket.socket, chunk: bytes, limit: int) -> int:
    """
    Send C{chunk} after C{chunk} on non-blocking C{flood} (never reading)
    until C{limit} bytes went out or the node stopped reading for 2 s.

    @return: the bytes sent.
    """
    sent = 0
    while sent < limit:
        _, writable, _ = select.select([], [flood], [], 2.0)
        if not writable:
            break  # the node stopped reading for 2 s: backpressure
        try:
            sent += flood.send(chunk)
        except BlockingIOError:
            pass
    return sent


def test_a_client_that_never_reads_costs_bounded_memory(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as warm:
        warm.send(b"P warm\n" * 20000)
        for _ in range(20000):
            warm.readline()
    before = node.rss()
    flood = socket.create_connection(("127.0.0.1", node.port))
    flood.setblocking(False)
    chunk = b"P x\n" * 16384
    limit = 48 * MiB
    try:
        sent = floodUntilBackpressure(flood, chunk, limit)
        grown = node.rss() - before
        # The node still serves everybody else meanwhile.
        with LineClient(node.port) as other:
            assert other.ask(b"P other", timeout=10) == b"P other"
    finally:
        flood.close()
    print(f"sent {sent / MiB:.1f} MiB, grown {grown / MiB:.1f} MiB")
    assert sent < limit, "the node read everything a non-reading client sent"
    assert grown < 16 * MiB, f"the node grew by {grown / MiB:.1f} MiB"


def test_limits_answer_exactly(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn(args=["--max-keys", "2", "--max-waiters", "1"])
    with LineClient(node.port) as a, LineClient(node.port) as b, LineClient(node.port) as c:
        assert a.ask(b"A one 30 0").startswith(b"A one ")
        assert a.ask(b"A two 30 0").startswith(b"A two ")
        assert a.ask(b"A three 30 0") == b"E A three too many keys"
        b.send(b"A one 30 0\n")
        assert b.ask(b"P queued") == b"P queued"
        assert c.ask(b"A one 30 0") == b"E A one too many waiters"
        assert c.ask(b"P still-usable") == b"P still-usable"


def test_too_many_connections(spawn) -> None:  # type: ignore[no-untyped-def]
    from lockservice.testing.harness import waitFor

    node = spawn(args=["--max-connections", "3"])
    clients: List[LineClient] = []

    def admitted() -> bool:
        # True once a new connection is served (the harness's readiness
        # pings may still count for a moment after they closed).
        c = LineClient(node.port)
        try:
            if c.ask(b"P in", timeout=10) == b"P in":
                clients.append(c)
                return True
        except ConnectionError:
            pass
        c.close()
        return False

    try:
        for _ in range(3):
            waitFor(admitted, timeout=10, what="a connection admitted")
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as extra:
            assert readAll(extra) == b"E * * too many connections\n"
        clients.pop().close()
        waitFor(admitted, timeout=10, what="room for one more connection")
    finally:
        for c in clients:
            c.close()


def test_guessing_tokens_gets_the_connection_closed(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as holder:
        token = int(holder.ask(b"A payroll 30 0").split()[2])
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as guesser:
            guesses = b"".join(b"R payroll %d\n" % (token - 1000 + i) for i in range(500))
            guesser.sendall(guesses)
            answers = readAll(guesser).splitlines()
        assert answers == [b"R payroll STALE"] * 101
        assert holder.ask(b"R payroll %d" % token) == b"R payroll OK"


def test_neighbours_stale_answers_lock_nobody_out(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    SPEC section 7 (v3), the outside H9 case: 8 connections from 127.0.0.1
    release 15 stale tokens each (120 STALE answers in a burst); no
    connection is refused or closed, and an innocent holder's release and
    renewal on that address are answered OK at once.
    """
    node = spawn()
    with LineClient(node.port) as holder:
        live = int(holder.ask(b"A kept 30 0").split()[2])
        releasers = [LineClient(node.port) for _ in range(8)]
        try:
            for n, c in enumerate(releasers):
                c.send(b"".join(b"R gone%d-%d %d\n" % (n, i, live - 1 - i) for i in range(15)))
            for n, c in enumerate(releasers):
                for i in range(15):
                    assert c.readline() == b"R gone%d-%d STALE" % (n, i)
            for c in releasers:
                assert c.ask(b"P still-here") == b"P still-here"
            started = time.monotonic()
            assert holder.ask(b"N kept %d 30" % live) == b"N kept OK"
            assert holder.ask(b"R kept %d" % live) == b"R kept OK"
            assert time.monotonic() - started < 2.0
        finally:
            for c in releasers:
                c.close()


def test_reconnecting_does_not_escape_the_guessing_limit(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    One host guessing tokens over reconnects, each connection closed for
    the STALE limit (SPEC section 7: "an address whose connections keep
    being closed for it"), gets its new connections slowed: a few
    connections' worth of guesses a second, not tens of thousands; its live
    connection opened before, and other hosts (127.0.0.1 here), are served
    as usual.
    """
    node = spawn()
    with LineClient(node.port) as holder, \
            LineClient(node.port, host="127.0.0.1") as bystander:
        live = int(holder.ask(b"A payroll 30 0").split()[2])
        with socket.create_connection(("127.0.0.1", node.port), timeout=10,
                                      source_address=("127.0.0.2", 0)) as neighbour:
            neighbour.sendall(b"A own 30 0\n")
            neighbourToken = readLines(neighbour, 1).split()[2]
            stale = connections = 0
            guesses = b"".join(b"R payroll %d\n" % (live - 1000 + i) for i in range(150))
            started = time.monotonic()
            while time.monotonic() - started < 3.0:
                with socket.create_connection(("127.0.0.1", node.port), timeout=10,
                                              source_address=("127.0.0.2", 0)) as guesser:
                    guesser.sendall(guesses)
                    # Closed after its 101st STALE answer.
                    stale += readLines(guesser, 150).count(b"R payroll STALE\n")
                connections += 1
            print(f"{connections} connections in 3 s got {stale} STALE answers")
            assert connections >= 4  # each new one past the third close waits its turn
            assert stale <= (3 + 6) * 101, f"{stale} guesses answered from one address in 3 s"
            # The guesser's neighbour on the same address, connected before,
            # is answered at once; so is the other address.
            asked = time.monotonic()
            neighbour.sendall(b"R own " + neighbourToken + b"\n")
            assert readLines(neighbour, 1) == b"R own OK\n"
            assert time.monotonic() - asked < 0.5
            assert bystander.ask(b"P fine") == b"P fine"
        assert holder.ask(b"R payroll %d" % live) == b"R payroll OK"


def test_held_back_answers_cost_bounded_memory(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    2,000,000 pipelined acquires on a key whose queue is full: every
    refusal is held back behind the first (queued) acquire, and the node
    stops reading instead of growing.
    """
    node = spawn(args=["--max-waiters", "10"])
    with LineClient(node.port) as holder, LineClient(node.port) as warm:
        holder.ask(b"A pm 30 0")
        warm.send(b"A pm 60 0\n" * 20000 + b"P warm\n")
        warm.close()
        before = node.rss()
        flood = socket.create_connection(("127.0.0.1", node.port))
        flood.setblocking(False)
        line = b"A pm 60 0\n"
        chunk = line * 16384
        limit = 2_000_000 * len(line)
        try:
            sent = floodUntilBackpressure(flood, chunk, limit)
            grown = node.rss() - before
            with LineClient(node.port) as other:
                assert other.ask(b"P other", timeout=10) == b"P other"
        finally:
            flood.close()
    print(f"sent {sent // len(line)} acquires, grown {grown / MiB:.1f} MiB")
    assert sent < limit, "the node read every acquire of a non-reading client"
    assert grown < 32 * MiB, f"the node grew by {grown / MiB:.1f} MiB"


@pytest.mark.parametrize("args, message", [
    (["--max-keys", "0"], "--max-keys must be a whole number >= 1, not '0'"),
    (["--max-waiters", "lots"], "--max-waiters must be a whole number >= 1, not 'lots'"),
    (["--max-connections", "1e3"], "--max-connections must be a whole number >= 1"),
])
def test_bad_limit_options(args, message) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
         "-n", "--pidfile=", "lockservice"] + args,
        env=twistdEnvironment(), capture_output=True, timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


