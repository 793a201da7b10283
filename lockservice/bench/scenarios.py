"""
The other measurements: memory with many keys and connections, shards,
a standby's sync, lock-port stalls under heavy HTTP pages, and many
observers waking.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Dict, List, Optional

from lockservice.bench.load import cpuSeconds, run, say

# -- memory ------------------------------------------------------------------------


def memory(keys: int, idle: int) -> Dict[str, Any]:
    """
    RSS of a node holding C{keys} keys, and of a node with C{idle} open
    idle connections (each still answering at the end).
    """
    import resource

    from lockservice.testing.harness import LineClient, Node, freePort

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = idle + 1024
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    result: Dict[str, Any] = {}
    # Above the default --max-keys / --max-connections on purpose.
    node = Node(freePort(), args=["--max-keys", str(keys + 1)]).start()
    try:
        base = node.rss()
        batch = 5000
        say(f"taking {keys:,} keys on one node (pid {node.pid})")
        with LineClient(node.port, timeout=60) as c:
            for start in range(0, keys, batch):
                if start and start % (keys // 10 or batch) < batch:
                    say(f"{start:,} keys held, RSS {node.rss() / 2**20:.0f} MB")
                n = min(batch, keys - start)
                c.send(b"".join(b"A mem/%d 86400 0\n" % i for i in range(start, start + n)))
                for _ in range(n):
                    line = c.readline(60)
                    assert line.startswith(b"A "), line
            result["held_keys"] = keys
            result["rss_empty_mb"] = round(base / 2**20, 1)
            result["rss_held_mb"] = round(node.rss() / 2**20, 1)
            result["bytes_per_key"] = round((node.rss() - base) / keys)
            assert c.ask(b"A mem/0 1 0.01", 10) == b"T mem/0"
    finally:
        node.stop()
    node = Node(freePort(), args=["--max-connections", str(idle + 16)]).start()
    socks: List[socket.socket] = []
    try:
        base = node.rss()
        say(f"opening {idle:,} idle connections")
        for _ in range(idle):
            socks.append(socket.create_connection(("127.0.0.1", node.port), timeout=30))
        time.sleep(1)
        for s in socks[:: max(1, idle // 100)]:
            s.sendall(b"P alive\n")
            assert s.recv(100) == b"P alive\n"
        result["idle_connections"] = len(socks)
        result["rss_idle_mb"] = round(node.rss() / 2**20, 1)
        result["bytes_per_connection"] = round((node.rss() - base) / idle)
        with LineClient(node.port) as c:
            assert c.ask(b"A after-idle 10 0").startswith(b"A ")
    finally:
        for s in socks:
            s.close()
        node.stop()
    return result


# -- shards: several clusters driven at once ---------------------------------------


def shards(counts: List[int], conns: int, duration: float) -> List[Dict[str, Any]]:
    """
    Aggregate pairs/s over 1, 2, ... independent single-node clusters, the
    keys spread by the client library's rendezvous hashing.
    """
    from lockservice.testing.harness import Node, freePort

    rows: List[Dict[str, Any]] = []
    for count in counts:
        nodes = [Node(freePort()).start() for _ in range(count)]
        try:
            addr = ";".join(n.address for n in nodes)
            row = run(addr, "uncontended", conns, 1, duration)
            cpu = sum(cpuSeconds(n.pid) for n in nodes)
            rows.append(dict(row, shards=count, total_server_cpu_s=round(cpu, 2)))
        finally:
            for n in nodes:
                n.stop()
    return rows


# -- sync: a standby joining an active that holds many keys -----------------------


def sync(keys: int, peerTimeout: float = 1.0) -> Dict[str, Any]:
    """
    Fill an active node with C{keys} held keys, then start a standby and
    time how long it takes to hold the full state; meanwhile ping both
    nodes every 20 ms.  A node whose reactor is frozen (a snapshot written
    or applied in one go) cannot answer a ping, nor send a heartbeat: the
    largest ping latency bounds each node's heartbeat gap from outside.
    """
    import tempfile
    import threading
    import urllib.request

    from lockservice.testing.harness import LineClient, Node, freePorts, probeRole

    ports = freePorts(4)
    work = tempfile.mkdtemp(prefix="lockservice-bench-sync-")
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write("bench-sync-secret\n")
    common = ["--secret", secret, "--peer-timeout", str(peerTimeout),
              "--max-keys", str(keys + 16)]
    nodes = [
        Node(ports[i], peers=ports[:2], logDir=work, name=f"sync{i}",
             args=common + ["--http", f"tcp:{ports[2 + i]}:interface=127.0.0.1"])
        for i in range(2)
    ]

    def status(i: int) -> Dict[str, Any]:
        url = f"http://127.0.0.1:{ports[2 + i]}/status"
        with urllib.request.urlopen(url, timeout=5) as r:
            return dict(json.load(r))

    worst = [0.0, 0.0]
    stop = threading.Event()

    def pinger(i: int) -> None:
        client: Optional[LineClient] = None
        while not stop.is_set():
            try:
                if client is None:
                    client = LineClient(ports[i], timeout=30)
                sent = time.perf_counter()
                client.ask(b"P sync", 30)
                worst[i] = max(worst[i], time.perf_counter() - sent)
            except OSError:
                client = None
            stop.wait(0.02)
        if client is not None:
            client.close()

    result: Dict[str, Any] = {"held_keys": keys, "peer_timeout_s": peerTimeout}
    try:
        nodes[0].start()
        deadline = time.monotonic() + 30
        while probeRole(ports[0]) != "active":
            if time.monotonic() > deadline:
                raise RuntimeError("the first node did not become active")
            time.sleep(0.1)
        say(f"taking {keys:,} keys on the active node")
        with LineClient(ports[0], timeout=120) as c:
            batch = 5000
            for start in range(0, keys, batch):
                n = min(batch, keys - start)
                c.send(b"".join(b"A sync/%d 86400 0\n" % i for i in range(start, start + n)))
                for _ in range(n):
                    line = c.readline(120)
                    assert line.startswith(b"A "), line
        threads = [threading.Thread(target=pinger, args=(i,), daemon=True) for i in range(2)]
        threads[0].start()
        say("starting the standby")
        started = time.monotonic()
        nodes[1].start(wait=True, timeout=60)
        answering = time.monotonic()
        threads[1].start()
        deadline = time.monotonic() + 600
        while True:
            try:
                s1 = status(1)
                if s1.get("role") == "standby" and s1.get("held_keys") == keys:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not catch up within 10 minutes")
            time.sleep(0.02)
        synced = time.monotonic()
        time.sleep(max(0.5, peerTimeout))  # the heartbeats right after the sync count too
        stop.set()
        for t in threads:
            t.join(60)
        s0 = status(0)
        result.update({
            "join_s_from_start": round(synced - started, 2),
            "join_s_from_first_ping": round(synced - answering, 2),
            "active_max_ping_ms": round(worst[0] * 1000, 1),
            "standby_max_ping_ms": round(worst[1] * 1000, 1),
            "half_peer_timeout_ms": round(peerTimeout * 500, 1),
            "active_role_after": s0.get("role"),
            "rss_active_mb": round(nodes[0].rss() / 2**20, 1),
            "rss_standby_mb": round(nodes[1].rss() / 2**20, 1),
        })
    finally:
        stop.set()
        for node in nodes:
            node.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


def httpStall(concurrency: List[int], runs: int = 3, seconds: float = 4.0,
              nonReaders: int = 3000) -> Dict[str, Any]:
    """
    A node with 20,000 held keys (1,000 with 5 waiters);
    for each C{concurrency}, that many clients asking for
    C{/locks?limit=1000&waiters=1000} over and over (plus 8 for /status
    and /events) for C{seconds}, C{runs} times: the median of each run's
    worst lock-port ping.  Then C{nonReaders} clients that ask for that
    page and never read: the node's RSS growth.
    """
    import statistics
    import tempfile

    from lockservice.testing import httpload
    from lockservice.testing.harness import Node, freePorts

    port, httpPort = freePorts(2)
    node = Node(port, logDir=tempfile.mkdtemp(prefix="lockservice-bench-http-"),
                args=["--http", f"tcp:{httpPort}:interface=127.0.0.1", "--max-keys", "50000"])
    rows: List[Dict[str, Any]] = []
    result: Dict[str, Any] = {"rows": rows}
    try:
        node.start()
        waiting = httpload.fill(port, httpPort)
        for heavy in concurrency:
            worst = [httpload.heavyPages(port, httpPort, heavy, 8, seconds)
                     for _ in range(runs)]
            rows.append({"heavy_readers": heavy,
                         "median_worst_ping_ms": statistics.median(
                             w["worst_ping_ms"] for w in worst),
                         "worst_pings_ms": [w["worst_ping_ms"] for w in worst],
                         "answers": worst[-1]["answers"]})
            say(f"{heavy} heavy readers: {rows[-1]['worst_pings_ms']} ms")
        if nonReaders:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
            before = node.rss()
            socks = httpload.nonReaders(port, httpPort, nonReaders)
            time.sleep(3)
            result["non_readers"] = nonReaders
            result["non_readers_rss_growth_mb"] = round((node.rss() - before) / 2**20, 1)
            for sock in socks:
                sock.close()
        waiting.close()
    finally:
        node.stop()
    return result


def observers(count: int = 10_000, rounds: int = 3) -> Dict[str, Any]:
    """
    C{count} observers of one key wake at once, C{rounds} times, on a lone
    node and on the active of three: the lock port's worst ping during
    each wake-up (its median), and how long the wake-up took.
    """
    import json as _json
    import statistics
    import tempfile
    import urllib.request

    from lockservice.testing.harness import Cluster, Node, freePort, waitFor
    from lockservice.testing.observeload import wake

    def statusOf(httpPort: int) -> Any:
        def read() -> Any:
            with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/status",
                                        timeout=30) as r:
                return _json.loads(r.read())
        return read

    result: Dict[str, Any] = {}
    http = freePort()
    node = Node(freePort(), logDir=tempfile.mkdtemp(prefix="lockservice-bench-observe-"),
                args=["--http", f"tcp:{http}:interface=127.0.0.1"])
    try:
        node.start()
        runs = [wake(node.port, statusOf(http), count) for _ in range(rounds)]
        say(f"lone node: {runs}")
        result["lone"] = {"median_worst_ping_ms": statistics.median(
            r["worst_ping_ms"] for r in runs), "runs": runs}
    finally:
        node.stop()
    https = [freePort() for _ in range(3)]
    trio = Cluster(3, logDir=tempfile.mkdtemp(prefix="lockservice-bench-observe-"))
    for member, port in zip(trio.nodes, https, strict=True):
        member.args = member.args + ["--http", f"tcp:{port}:interface=127.0.0.1"]
    try:
        trio.start()
        waitFor(lambda: statusOf(https[0])()["role"] == "active", 30, what="node0 active")
        runs = [wake(trio.nodes[0].port, statusOf(https[0]), count) for _ in range(rounds)]
        say(f"active of 3: {runs}")
        result["active_of_3"] = {"median_worst_ping_ms": statistics.median(
            r["worst_ping_ms"] for r in runs), "runs": runs}
    finally:
        trio.stop()
    return result
