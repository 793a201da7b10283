"""
Many observers of one key waking at once, against a running node: the
lock port's worst ping (a ping every 2 ms) while they are answered, which
is how long the wake-up held the node's reactor.  Used by
C{lockservice bench observers} and the tests.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, List

from lockservice.testing.harness import LineClient, waitFor
from lockservice.testing.httpload import Pinger

# Observers per connection (in send order, each answered when the key changes).
PER_CONNECTION = 100


def wake(port: int, statusOf: Any, count: int = 10_000, key: bytes = b"watched",
         host: str = "127.0.0.1") -> Dict[str, Any]:
    """
    Hold C{key}, make C{count} observers of it wait, start pinging, then
    release it: every observer is answered.

    @param statusOf: a callable giving the node's /status as a dict (it
        says when the observers all wait).
    @return: the worst ping during the wake-up and how long it took.
    """
    holder = LineClient(port, host=host, timeout=60)
    token = holder.ask(b"A " + key + b" 300 0").split()[2]
    conns: List[socket.socket] = []
    line = b"O " + key + b" " + token + b" 0\n"
    for _ in range(0, count, PER_CONNECTION):
        sock = socket.create_connection((host, port), timeout=60)
        sock.sendall(line * min(PER_CONNECTION, count - len(conns) * PER_CONNECTION))
        conns.append(sock)
    waitFor(lambda: statusOf()["observers"] == count, 60, what=f"{count} observers waiting")
    pinger = Pinger(port)
    waitFor(lambda: pinger.count >= 20, 30, what="pings before")
    pinger.reset()
    started = time.perf_counter()
    assert holder.ask(b"R " + key + b" " + token) == b"R " + key + b" OK"
    answers = 0
    expected = b"O " + key + b" 0 -\n"
    for sock in conns:
        want = len(expected) * min(PER_CONNECTION, count - answers)
        got = b""
        while len(got) < want:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        answers += got.count(expected)
        sock.close()
    woke = time.perf_counter() - started
    worst = pinger.stop()
    holder.close()
    return {"observers": count, "answered": answers, "wake_ms": round(woke * 1000, 1),
            "worst_ping_ms": round(worst * 1000, 1)}
