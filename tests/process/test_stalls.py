"""
No request and no closing connection may stall the node: a real
C{twistd} process with a queue of 100,000 waiters, while 10,000 more are
withdrawn at once or time out at once, keeps answering another client's
pings within 100 ms.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, List

import pytest

from lockservice.testing import httpload
from lockservice.testing.harness import LineClient, freePort, waitFor

STALL_BOUND = 0.1


def statusOf(httpPort: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def queue(port: int, count: int, line: bytes) -> LineClient:
    """
    A connection with C{count} acquires queued (they are all read by the
    node when its ping after them is answered).
    """
    client = LineClient(port, timeout=120)
    client.send(line * count + b"P filled\n")
    assert client.readline() == b"P filled"
    return client


class Pinger(threading.Thread):
    """
    Pings the node continuously on its own connection; records each
    round trip.
    """

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = LineClient(port, timeout=30)
        self.rtts: List[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            assert self.client.ask(b"P x") == b"P x"
            self.rtts.append(time.perf_counter() - started)

    def during(self, action: Callable[[], None]) -> float:
        """
        Run C{action} while pinging; the slowest round trip seen since the
        action started (or since it called L{measureFromHere}).
        """
        self.start()
        waitFor(lambda: len(self.rtts) >= 20, timeout=30, what="pings before")
        self.rtts.clear()
        action()
        count = len(self.rtts)
        waitFor(lambda: len(self.rtts) >= count + 20, timeout=30, what="pings after")
        self.stop.set()
        self.join(30)
        self.client.close()
        return max(self.rtts)

    def measureFromHere(self) -> None:
        self.rtts.clear()


def test_mass_withdrawal_from_a_long_queue_does_not_stall(spawn) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--max-waiters", "200000"])
    with LineClient(node.port) as holder:
        holder.ask(b"A k 30 0")
        first = queue(node.port, 100_000, b"A k 30 0\n")
        leaving = queue(node.port, 10_000, b"A k 30 0\n")
        assert statusOf(httpPort)["waiters"] == 110_000

        def reset() -> None:
            # An abortive close (RST), as a crashed client's kernel sends.
            leaving.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    b"\x01\x00\x00\x00\x00\x00\x00\x00")
            leaving.close()
            waitFor(lambda: statusOf(httpPort)["waiters"] == 100_000, timeout=30,
                    what="10,000 waiters withdrawn")

        slowest = Pinger(node.port).during(reset)
        first.close()
        print(f"slowest ping {slowest * 1000:.1f} ms")
        assert slowest < STALL_BOUND, f"a ping took {slowest * 1000:.0f} ms"


def test_mass_wait_timeout_does_not_stall(spawn) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--max-waiters", "200000"])
    with LineClient(node.port) as holder:
        holder.ask(b"A k 30 0")
        first = queue(node.port, 100_000, b"A k 30 0\n")
        pinger = Pinger(node.port)

        def timeouts() -> None:
            # Queued within a few hundred ms, the 10,000 waits run out
            # together 3 s later, while the pings are measured.
            client = queue(node.port, 10_000, b"A k 30 3\n")
            pinger.measureFromHere()
            assert statusOf(httpPort)["waiters"] == 110_000, "measured too late"
            waitFor(lambda: statusOf(httpPort)["waiters"] == 100_000, timeout=30,
                    what="10,000 waits ran out")
            client.close()

        slowest = pinger.during(timeouts)
        first.close()
        print(f"slowest ping {slowest * 1000:.1f} ms")
        assert slowest < STALL_BOUND, f"a ping took {slowest * 1000:.0f} ms"


@pytest.mark.parametrize("connections", [1, 500])
def test_closing_connections_with_100000_waiters_does_not_stall(  # type: ignore[no-untyped-def]
        spawn, connections: int) -> None:
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--max-waiters", "200000"])
    with LineClient(node.port) as holder:
        live = holder.ask(b"A k 30 0").split()[2]
        leaving = [queue(node.port, 100_000 // connections, b"A k 30 0\n")
                   for _ in range(connections)]
        staying = queue(node.port, 1, b"A k 30 0\n")
        granted: List[float] = []

        def close() -> None:
            for client in leaving:
                client.close()
            # Released at once: the key passes the dead waiters by.
            started = time.perf_counter()
            assert holder.ask(b"R k " + live, timeout=30) == b"R k OK"
            assert staying.readline(timeout=30).startswith(b"A k ")
            granted.append(time.perf_counter() - started)
            waitFor(lambda: statusOf(httpPort)["waiters"] == 0, timeout=30,
                    what="100,000 waiters withdrawn")

        slowest = Pinger(node.port).during(close)
        staying.close()
        print(f"slowest ping {slowest * 1000:.1f} ms, next waiter granted in "
              f"{granted[0] * 1000:.1f} ms")
        assert slowest < STALL_BOUND, f"a ping took {slowest * 1000:.0f} ms"
        assert granted[0] < 1.0, f"the next live waiter waited {granted[0]:.1f} s"


# -- HTTP never freezes the reactor (issue 21 item 2) --------------------------

# Generous for a shared 2-core machine; the benchmark's target is 100 ms
# (`python -m lockservice.bench http`, docs/performance.md).
HTTP_STALL_BOUND = 0.5


def test_concurrent_heavy_pages_do_not_stall_the_lock_port(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    20,000 held keys, 1,000 with 5 waiters each; 64 clients asking for
    C{/locks?limit=1000&waiters=1000} over and over, and 8 for /status
    and /events: the lock port's worst ping stays far below the freeze
    (2.5 s before the fix), and the pages are answered (200) or refused
    at once (503), never broken.
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--max-keys", "50000"])
    waiting = httpload.fill(node.port, httpPort)
    result = httpload.heavyPages(node.port, httpPort, heavy=64, light=8, seconds=4)
    waiting.close()
    print(result)
    answers = result["answers"]
    assert answers.get("200", 0) > 0 and set(answers) <= {"200", "503", "bytes"}, answers
    assert result["worst_ping_ms"] < HTTP_STALL_BOUND * 1000, result


def test_heavy_pages_on_the_active_cause_no_promotion(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    The same load (128 heavy readers) on the active of 3 nodes: its
    heartbeats keep flowing (no standby promotes, no term changes) and its
    lock port's worst ping stays under the bound.
    """
    ports = [freePort() for _ in range(3)]
    c = cluster(3, args=["--max-keys", "50000"], start=False)
    for node, port in zip(c.nodes, ports, strict=True):
        node.args = node.args + ["--http", f"tcp:{port}:interface=127.0.0.1"]
    c.start()
    waitFor(lambda: [statusOf(p)["role"] for p in ports] == ["active", "standby", "standby"],
            30, what="roles settled")
    terms = [statusOf(p)["term"] for p in ports]
    waiting = httpload.fill(c.nodes[0].port, ports[0])
    result = httpload.heavyPages(c.nodes[0].port, ports[0], heavy=128, light=8, seconds=5)
    print(result)
    time.sleep(1.5)  # a promotion would follow a missed peer timeout (1 s)
    after = [statusOf(p) for p in ports]
    waiting.close()
    assert [s["role"] for s in after] == ["active", "standby", "standby"], after
    assert [s["term"] for s in after] == terms, after
    assert result["worst_ping_ms"] < HTTP_STALL_BOUND * 1000, result


def test_bursts_of_scrapes_do_not_stall_the_lock_port(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    500 concurrent GET /metrics, then /events and /dashboard.json, on a node
    holding 1,000 keys: the lock port's worst ping (a ping every 2 ms)
    stays under the bound in every burst (/metrics alone: 433-590 ms when
    each scrape rendered the metrics in the reactor turn that received
    it).  Every request is answered (200) or refused at once (503).
    """
    from lockservice.testing.bulk import holdMany

    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    assert holdMany(node.port, 1000, lease=86400) == 1000
    for path in ("/metrics", "/events?limit=1000", "/dashboard.json", "/status"):
        result = httpload.bursts(node.port, httpPort, path, 500, 3)
        print(result)
        answers = result["answers"]
        assert answers.get("200", 0) > 0 and not answers["unanswered"], answers
        assert set(answers) <= {"200", "503", "bytes", "unanswered"}, answers
        assert result["worst_ping_ms"] < HTTP_STALL_BOUND * 1000, result


def test_3000_scrapes_on_the_active_cause_no_promotion(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    3,000 concurrent GET /metrics on the active of 3 nodes holding 1,000
    keys: its heartbeats keep flowing (no standby promotes, no term
    changes; two actives before the fix).
    """
    import resource

    from lockservice.testing.bulk import holdMany

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    ports = [freePort() for _ in range(3)]
    c = cluster(3, start=False)
    for node, port in zip(c.nodes, ports, strict=True):
        node.args = node.args + ["--http", f"tcp:{port}:interface=127.0.0.1"]
    c.start()
    waitFor(lambda: [statusOf(p)["role"] for p in ports] == ["active", "standby", "standby"],
            30, what="roles settled")
    terms = [statusOf(p)["term"] for p in ports]
    assert holdMany(c.nodes[0].port, 1000, lease=86400) == 1000
    result = httpload.bursts(c.nodes[0].port, ports[0], "/metrics", 3000, 2)
    print(result)
    time.sleep(1.5)  # a promotion would follow a missed peer timeout (1 s)
    after = [statusOf(p) for p in ports]
    assert [s["role"] for s in after] == ["active", "standby", "standby"], after
    assert [s["term"] for s in after] == terms, after
    assert not result["answers"]["unanswered"], result


def test_clients_that_never_read_cost_little(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    3,000 HTTP clients ask for the heaviest page and never read: the
    node's memory grows by far less than the answers' size (2.6 GiB
    before the fix), and its lock port keeps answering.
    """
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--max-keys", "50000"])
    waiting = httpload.fill(node.port, httpPort)
    before = node.rss()
    pinger = httpload.Pinger(node.port)
    socks = httpload.nonReaders(node.port, httpPort, 3000)
    time.sleep(3)  # whatever the node will write has been written by now
    grown = node.rss() - before
    worst = pinger.stop()
    # Their answers hold every slot: the endpoint refuses at once (503)...
    started = time.perf_counter()
    with pytest.raises(urllib.error.HTTPError) as refused:
        statusOf(httpPort)
    assert refused.value.code == 503 and time.perf_counter() - started < 1
    for sock in socks:
        sock.close()
    # ... and their slots come back when they leave.
    def answered() -> dict:  # type: ignore[type-arg]
        try:
            return statusOf(httpPort)
        except urllib.error.HTTPError:
            return {}

    assert waitFor(answered, 30, what="a slot")["held_keys"] == 20_000
    waiting.close()
    print(f"3,000 non-readers: +{grown / 2**20:.1f} MiB, worst ping {worst * 1000:.1f} ms")
    assert grown < 100 * 2**20, grown
    # It keeps answering: the ping bound of the heavy-page tests is not
    # asserted here (3,000 connects and 256 pages started at once on a
    # shared 2-core machine: 45-600 ms seen, kernel and scheduler included).
    assert worst < 5, worst


def test_10000_observers_of_one_key_wake_without_stalling_the_lock_port(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    10,000 observers of one key, answered when its holder releases it: a
    bounded chunk per reactor turn, so the lock port's worst ping stays
    small (the benchmark's target is 20 ms: `lockservice bench
    observers`).
    """
    from lockservice.testing.observeload import wake

    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    result = wake(node.port, lambda: statusOf(httpPort), 10_000)
    print(result)
    assert result["answered"] == 10_000
    assert result["worst_ping_ms"] < STALL_BOUND * 1000, result
