"""
The load generator: plain non-blocking sockets in several processes
(not Twisted, so the generator stays cheap per request) driving one
scenario against one server, and its figures.
"""

from __future__ import annotations

import multiprocessing
import os
import selectors
import socket
import sys
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

SCENARIOS = ("uncontended", "contended", "echo", "dflockd-uncontended", "dflockd-contended")
# The peer measured against (see /work/shared/anchors/README.md): dflockd.
DFLOCKD = os.environ.get("LOCKSERVICE_BENCH_DFLOCKD", "/work/shared/anchors/dflockd-go")
LATENCY_SAMPLES = 200_000


# -- the load generator (one process) ---------------------------------------------


class _Conn:
    __slots__ = ("sock", "buffer", "pending", "out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.pending: Dict[Tuple[bytes, bytes], Deque[float]] = {}
        self.out: List[bytes] = []


Shard = Optional[Tuple[List[bytes], int]]


def keyOn(base: bytes, shard: Shard) -> bytes:
    """
    C{base}, or the first C{base~N} that the client library's rendezvous
    hashing maps to this worker's cluster (so a sharded run sends every key
    to the cluster that owns it, as a real client would).
    """
    if shard is None or len(shard[0]) == 1:
        return base
    from lockservice.client.sharding import choose

    ids, mine = shard
    n = 0
    while True:
        key = base + b"~%d" % n
        if choose(ids, key) == mine:
            return key
        n += 1


def _singleWorker(host: str, port: int, scenario: str, warmup: float, duration: float,
                  ident: int, results: Any, shard: Shard = None) -> None:
    """
    One closed-loop connection: a blocking socket, no selector, so the
    generator adds as little as possible to the measured latency.
    """
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = keyOn(b"hot" if scenario == "contended" else b"k%d" % ident, shard)
    acquire = b"A " + key + b" 30 0\n"
    now = time.perf_counter
    measureFrom = now() + warmup
    stopAt = measureFrom + duration
    latencies: List[float] = []
    pairs = errors = 0
    send, recv = sock.send, sock.recv
    while True:
        sentAt = now()
        if sentAt >= stopAt:
            break
        send(acquire)
        answer = recv(4096)
        gotAt = now()
        if answer[:1] != b"A":
            errors += 1
            continue
        if scenario != "echo":
            send(b"R " + key + b" " + answer.split(b" ")[2])
            if recv(4096)[:1] != b"R":
                errors += 1
        if gotAt >= measureFrom:
            pairs += 1
            if len(latencies) < LATENCY_SAMPLES:
                latencies.append(gotAt - sentAt)
    sock.close()
    results.put({"pairs": pairs, "latencies": latencies, "timeouts": 0, "errors": errors})


def _dflockdWorker(host: str, port: int, scenario: str, conns: int, warmup: float,
                   duration: float, ident: int, results: Any) -> None:
    """
    Closed-loop acquire+release pairs against dflockd (3-line requests:
    C{l\\n<key>\\n<timeout> <lease>\\n} answered C{ok <token> <lease>},
    C{r\\n<key>\\n<token>\\n} answered C{ok}), one request at a time per
    connection.
    """
    sel = selectors.DefaultSelector()
    now = time.perf_counter
    state: Dict[socket.socket, List[Any]] = {}
    for i in range(conns):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        key = b"hot" if scenario == "dflockd-contended" else b"k%d-%d" % (ident, i)
        state[sock] = [key, b"l", b"", now()]  # key, waiting for, buffer, sent at
        sel.register(sock, selectors.EVENT_READ)
        sock.send(b"l\n" + key + b"\n30 30\n")
    measureFrom = now() + warmup
    stopAt = measureFrom + duration
    latencies: List[float] = []
    pairs = errors = 0
    while now() < stopAt:
        for selectorKey, _ in sel.select(0.5):
            sock = selectorKey.fileobj  # type: ignore[assignment]
            entry = state[sock]
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("dflockd closed a connection")
            lines = (entry[2] + data).split(b"\n")
            entry[2] = lines.pop()
            for line in lines:
                t = now()
                if not line.startswith(b"ok"):
                    errors += 1
                if entry[1] == b"l":
                    if measureFrom <= t and len(latencies) < LATENCY_SAMPLES:
                        latencies.append(t - entry[3])
                    fields = line.split()
                    entry[1] = b"r"
                    sock.send(b"r\n" + entry[0] + b"\n" + (fields[1] if len(fields) > 1
                                                            else b"0") + b"\n")
                else:
                    if measureFrom <= t < stopAt:
                        pairs += 1
                    entry[1] = b"l"
                    entry[3] = t
                    sock.send(b"l\n" + entry[0] + b"\n30 30\n")
    for sock in state:
        sock.close()
    results.put({"pairs": pairs, "latencies": latencies, "timeouts": 0, "errors": errors})


def _worker(host: str, port: int, scenario: str, conns: int, depth: int, warmup: float,
            duration: float, ident: int, results: Any, shard: Shard = None) -> None:
    if scenario.startswith("dflockd-"):
        return _dflockdWorker(host, port, scenario, conns, warmup, duration, ident, results)
    if conns == 1 and depth == 1:
        return _singleWorker(host, port, scenario, warmup, duration, ident, results, shard)
    hot = keyOn(b"hot", shard)
    sel = selectors.DefaultSelector()
    connections: List[_Conn] = []
    for _ in range(conns):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = _Conn(sock)
        connections.append(conn)
        sel.register(sock, selectors.EVENT_READ, conn)
    now = time.perf_counter
    start = now()
    measureFrom = start + warmup
    stopAt = measureFrom + duration
    latencies: List[float] = []
    pairs = 0
    timeouts = 0
    errors = 0

    def send(conn: _Conn, op: bytes, key: bytes, line: bytes) -> None:
        conn.pending.setdefault((op, key), deque()).append(now())
        conn.out.append(line)

    for i, conn in enumerate(connections):
        for d in range(depth):
            key = hot if scenario == "contended" else keyOn(b"k%d-%d-%d" % (ident, i, d), shard)
            send(conn, b"A", key, b"A " + key + b" 30 0\n")
        conn.sock.send(b"".join(conn.out))
        conn.out = []

    stopping = False
    while True:
        t = now()
        if t >= stopAt:
            if not stopping:
                stopping = True
            if all(not any(c.pending.values()) for c in connections) or t > stopAt + 5:
                break
        for selectorKey, _ in sel.select(0.5):
            conn = selectorKey.data
            try:
                data = conn.sock.recv(262144)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("server closed a connection")
            lines = (conn.buffer + data).split(b"\n")
            conn.buffer = lines.pop()
            t = now()
            measuring = measureFrom <= t < stopAt
            for line in lines:
                fields = line.split(b" ")
                kind = fields[0]
                if scenario == "echo":
                    sentAt = conn.pending[(b"A", fields[1])].popleft()
                    if measuring:
                        pairs += 1
                        if len(latencies) < LATENCY_SAMPLES:
                            latencies.append(t - sentAt)
                    if not stopping:
                        send(conn, b"A", fields[1], line + b"\n")
                elif kind == b"A":
                    sentAt = conn.pending[(b"A", fields[1])].popleft()
                    if measuring and len(latencies) < LATENCY_SAMPLES:
                        latencies.append(t - sentAt)
                    send(conn, b"R", fields[1], b"R " + fields[1] + b" " + fields[2] + b"\n")
                elif kind == b"R":
                    conn.pending[(b"R", fields[1])].popleft()
                    if measuring:
                        pairs += 1
                    if not stopping:
                        send(conn, b"A", fields[1], b"A " + fields[1] + b" 30 0\n")
                elif kind == b"T":
                    conn.pending[(b"A", fields[1])].popleft()
                    timeouts += 1
                else:
                    errors += 1
            if conn.out:
                conn.sock.send(b"".join(conn.out))
                conn.out = []
    for conn in connections:
        conn.sock.close()
    results.put({"pairs": pairs, "latencies": latencies, "timeouts": timeouts,
                 "errors": errors})


def cpuSeconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(sorted_values: List[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index]


def _progress(total: float, label: str, stop: Any) -> None:
    started = time.monotonic()
    width = 30
    while not stop.wait(0.25):
        done = min(1.0, (time.monotonic() - started) / total)
        bar = "#" * int(done * width) + "." * (width - int(done * width))
        print(f"\r  {label:40} [{bar}] {done * 100:3.0f}%", end="", file=sys.stderr, flush=True)
    print("\r" + " " * (width + 52) + "\r", end="", file=sys.stderr, flush=True)


def _interactive() -> bool:
    """
    Progress bars only for a person watching: not into a file or a pipe.
    """
    return sys.stderr.isatty()


def say(message: str) -> None:
    """
    One line of progress for long phases (always: a long silence looks like
    a hang, and one line per phase is fine in a log file too).
    """
    print(f"  {message}", file=sys.stderr, flush=True)


def run(addr: str, scenario: str, conns: int, depth: int = 1, duration: float = 5.0,
        warmup: float = 1.0, procs: Optional[int] = None, serverPid: Optional[int] = None,
        progress: bool = True, otherPids: Sequence[int] = ()) -> Dict[str, Any]:
    """
    Drive the server at C{addr}; return pairs/s (round trips/s for echo),
    acquire latency percentiles and, given its pid, the server's CPU use
    (percent of one core, and microseconds per pair).  C{otherPids} are
    other servers the load reaches indirectly (a cluster's standbys): their
    CPU per pair is reported too.
    """
    import threading

    # "a:1;b:2": several clusters (shards), each given by its active node's
    # address, exactly as the client library takes them; the cluster id in
    # the key-to-cluster hashing is that first address.
    targets = [part.split(",")[0].strip() for part in addr.split(";") if part.strip()]
    ids = [t.encode() for t in targets]
    procs = max(procs or min(conns, 2), len(targets))
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    shares = [conns // procs + (1 if i < conns % procs else 0) for i in range(procs)]
    workers = []
    for i, share in enumerate(shares):
        if not share:
            continue
        mine = i % len(targets)
        host, _, port = targets[mine].rpartition(":")
        shard = (ids, mine) if len(targets) > 1 else None
        workers.append(ctx.Process(target=_worker, args=(
            host, int(port), scenario, share, depth, warmup, duration, i, results, shard)))
    stop = threading.Event()
    label = f"{scenario} c={conns} depth={depth}"
    bar = threading.Thread(target=_progress, args=(warmup + duration, label, stop), daemon=True)
    progress = progress and _interactive()
    if progress:
        bar.start()
    for w in workers:
        w.start()
    time.sleep(warmup)
    cpuBefore = cpuSeconds(serverPid) if serverPid else None
    othersBefore = [cpuSeconds(p) for p in otherPids]
    time.sleep(duration)
    cpuAfter = cpuSeconds(serverPid) if serverPid else None
    othersAfter = [cpuSeconds(p) for p in otherPids]
    collected = [results.get(timeout=duration + 60) for _ in workers]
    for w in workers:
        w.join(30)
    stop.set()
    if progress:
        bar.join()
    latencies = sorted(x for r in collected for x in r["latencies"])
    pairs = sum(r["pairs"] for r in collected)
    out = {
        "scenario": scenario,
        "clusters": len(targets),
        "connections": conns,
        "depth": depth,
        "mode": "closed-loop" if depth == 1 else f"pipelined({depth})",
        "duration_s": duration,
        ("round_trips_per_s" if scenario == "echo" else "pairs_per_s"): round(pairs / duration),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "p999_ms": round(_percentile(latencies, 0.999) * 1000, 3),
        "timeouts": sum(r["timeouts"] for r in collected),
        "errors": sum(r["errors"] for r in collected),
    }
    if cpuBefore is not None and cpuAfter is not None:
        out["server_cpu_percent"] = round((cpuAfter - cpuBefore) / duration * 100, 1)
        if pairs:
            out["server_cpu_us_per_pair"] = round((cpuAfter - cpuBefore) / pairs * 1e6, 1)
    if otherPids and pairs:
        spent = [after - before for before, after in zip(othersBefore, othersAfter, strict=True)]
        out["standbys_cpu_us_per_pair"] = round(sum(spent) / pairs * 1e6, 1)
        out["each_standby_cpu_us_per_pair"] = [round(s / pairs * 1e6, 1) for s in spent]
    return out


def fixedPairs(host: str, port: int, conns: int, pairs: int) -> int:
    """
    Drive exactly C{pairs} acquire+release pairs over C{conns} closed-loop
    connections (each on its own key); for measures that count work, not
    time (L{instructions}).

    @return: the pairs completed.
    """
    chooser = selectors.DefaultSelector()
    state: Dict[socket.socket, List[Any]] = {}
    for i in range(conns):
        sock = socket.create_connection((host, port), timeout=600)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        state[sock] = [b"fixed%d" % i, None, b""]  # key, token held, unread input
        chooser.register(sock, selectors.EVENT_READ)
    left, done = pairs, 0

    def step(sock: socket.socket) -> bool:
        nonlocal left
        key, token, _ = state[sock]
        if token is None:
            if left == 0:
                return False
            left -= 1
            sock.send(b"A " + key + b" 30 0\n")
        else:
            sock.send(b"R " + key + b" " + token + b"\n")
        return True

    busy = sum(step(sock) for sock in state)
    while busy:
        for ready, _ in chooser.select(600):
            sock = ready.fileobj  # type: ignore[assignment]
            entry = state[sock]
            entry[2] += sock.recv(65536)
            while b"\n" in entry[2]:
                line, entry[2] = entry[2].split(b"\n", 1)
                fields = line.split()
                if fields[0] == b"A":
                    entry[1] = fields[2]
                else:
                    entry[1] = None
                    done += 1
                if not step(sock):
                    busy -= 1
    for sock in state:
        sock.close()
    return done
