"""
A client whose connection the node stopped reading (backpressure) and
that then goes away, against a real C{twistd} node: its waiters never get
the key, and they are dropped soon, so the queue's room comes back
(SPEC §2: a waiter whose connection closes is dropped at once).
"""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.request
from typing import Any, Dict

from lockservice.testing.harness import LineClient, freePort, waitFor

# The flood: many more acquires than a queue takes, so the node holds back
# the refusals behind the first queued one and stops reading.
FLOOD = 300_000
LINE = b"A hot 30 0\n"


def statusOf(httpPort: int) -> Dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def floodWithoutReading(sock: socket.socket) -> None:
    """
    Pipeline L{FLOOD} acquires of C{hot} on C{sock}, never reading, until
    they are all sent or the node stopped reading for 2 s (backpressure).
    """
    sock.setblocking(False)
    data = LINE * FLOOD
    sent = 0
    while sent < len(data):
        _, writable, _ = select.select([], [sock], [], 2.0)
        if not writable:
            break
        try:
            sent += sock.send(data[sent:sent + 65536])
        except BlockingIOError:
            pass


def flooder(port: int) -> socket.socket:
    """
    A raw connection with an unread answer (its first line is a ping), so
    that its close() sends a reset, as a client closing with unread
    answers does.
    """
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"P unread\n")
    assert select.select([sock], [], [], 10)[0], "no answer to the flooder's ping"
    return sock


def test_a_paused_connection_that_resets_never_gets_the_key(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    5,000 acquires of the flooder, then a live waiter, then the flood:
    the node stops reading the flooder.  It closes (a reset); the holder
    releases at once: the live waiter gets the key within a second or so
    (not 30 s later, after a grant to the dead flooder), and the
    flooder's waiters go.
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    with LineClient(node.port) as holder, LineClient(node.port) as live:
        token = holder.ask(b"A hot 30 0").split()[2]
        flood = flooder(node.port)
        try:
            # The flooder's first 5,000 acquires queue ahead of the live one.
            flood.sendall(LINE * 5000)
            waitFor(lambda: statusOf(httpPort)["waiters"] == 5000, timeout=20,
                    what="5,000 waiters queued")
            live.send(b"A hot 30 0\n")
            assert live.ask(b"P queued", timeout=10) == b"P queued"
            floodWithoutReading(flood)
            waitFor(lambda: statusOf(httpPort)["waiters"] == 10_000, timeout=20,
                    what="the queue full")
        finally:
            flood.close()  # unread answer: a reset
        assert holder.ask(b"R hot " + token, timeout=10) == b"R hot OK"
        started = time.monotonic()
        answer = live.readline(timeout=20)
        waited = time.monotonic() - started
        assert answer.startswith(b"A hot "), answer
        print(f"the live waiter got the key {waited * 1000:.0f} ms after the release")
        assert waited < 5.0, f"the live waiter got the key only after {waited:.1f} s"
        waitFor(lambda: statusOf(httpPort)["waiters"] == 0, timeout=10,
                what="the flooder's waiters dropped")


def test_a_paused_connection_that_resets_frees_its_queue_room(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    A flooder fills the queue (10,000 waiters: everybody else gets
    C{too many waiters}) and is paused; it closes (a reset).  With no
    release at all, its waiters are dropped within a few seconds, a new
    acquire queues again, and gets the key at the release.
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    with LineClient(node.port) as holder, LineClient(node.port) as live:
        token = holder.ask(b"A hot 30 0").split()[2]
        flood = flooder(node.port)
        floodWithoutReading(flood)
        waitFor(lambda: statusOf(httpPort)["waiters"] == 10_000, timeout=20,
                what="the queue full")
        assert live.ask(b"A hot 30 0", timeout=10) == b"E A hot too many waiters"
        flood.close()  # unread answer: a reset
        started = time.monotonic()
        waitFor(lambda: statusOf(httpPort)["waiters"] == 0, timeout=10,
                what="the flooder's waiters dropped")
        print(f"dropped within {(time.monotonic() - started) * 1000:.0f} ms")
        live.send(b"A hot 30 0\n")
        assert live.ask(b"P queued", timeout=10) == b"P queued"
        assert statusOf(httpPort)["waiters"] == 1
        assert holder.ask(b"R hot " + token, timeout=10) == b"R hot OK"
        assert live.readline(timeout=10).startswith(b"A hot ")


def test_dead_waiters_of_a_paused_connection_that_sends_its_end_of_input_never_get_the_key(
        spawn) -> None:  # type: ignore[no-untyped-def]
    """
    A client with a 4 KiB receive buffer pipelines 25,000 acquires without
    reading: 10,000 queue, and the refusals of the rest are held back
    behind them until the node stops reading it (backpressure), with
    about 5,000 requests unread in its socket.  The client then shuts
    down its sending side: a FIN, behind those unread requests.  The
    holder releases: the key must not go to that connection's queued
    waiters -- a fresh acquire from another client gets it within 1.5 s
    (it waited a whole lease when the FIN stayed unseen behind the unread
    requests).  (A FIN still in the client's own send queue, behind
    requests the node's full receive buffer keeps out, reaches nobody:
    that connection's waiters go when its kernel gives up on it.)
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    with LineClient(node.port) as holder, LineClient(node.port) as fresh:
        token = holder.ask(b"A hot 10 0").split()[2]
        flood = socket.socket()
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        flood.connect(("127.0.0.1", node.port))
        try:
            flood.settimeout(20)
            flood.sendall(LINE * 25_000)  # all of it reaches the node's socket
            waitFor(lambda: statusOf(httpPort)["waiters"] == 10_000, timeout=20,
                    what="the flooder's waiters queued")
            flood.shutdown(socket.SHUT_WR)  # a FIN behind unread requests
            assert holder.ask(b"R hot " + token, timeout=10) == b"R hot OK"
            released = time.monotonic()
            fresh.send(b"A hot 10 0.3\n")
            answer = fresh.readline(timeout=20)
            waited = time.monotonic() - released
            print(f"the fresh acquire: {answer!r} {waited * 1000:.0f} ms after the release")
            assert answer.startswith(b"A hot "), answer
            assert waited < 1.5, f"granted only {waited:.1f} s after the release"
            waitFor(lambda: statusOf(httpPort)["waiters"] == 0, timeout=10,
                    what="the flooder's waiters dropped")
            status = statusOf(httpPort)
            assert status["waiters_dropped"] >= 1000
        finally:
            flood.close()
