"""
HTTP load against a node while its lock port is pinged: the heavy pages
that once froze a node (C{/locks?limit=1000&waiters=1000} on
20,000 held keys, 1,000 of them with 5 waiters), many at once, and
clients that ask for big answers and never read them.

The HTTP clients run in a child process (C{python -m
lockservice.testing.httpload load ...}) so that their own work (reading
and counting megabytes) never competes for the GIL with the pinger, whose
round trips are the measure: the worst one is how long the node's reactor
was held up.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional

from lockservice.testing.bulk import holdMany
from lockservice.testing.harness import LineClient, twistdEnvironment, waitFor

HEAVY = "/locks?limit=1000&waiters=1000"


def statusOf(httpPort: int) -> Dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/status", timeout=30) as r:
        return dict(json.loads(r.read()))


def fill(port: int, httpPort: int, keys: int = 20_000, queued: int = 1000,
         waitersEach: int = 5) -> LineClient:
    """
    Hold C{keys} keys (C{bulk/0}...), the first C{queued} of them with
    C{waitersEach} waiters each, queued on the returned connection (keep
    it open: closing it withdraws them).
    """
    assert holdMany(port, keys, lease=86400) == keys
    waiting = LineClient(port, timeout=120)
    waiting.send(b"".join(b"A bulk/%d 86400 0\n" % i
                          for i in range(queued) for _ in range(waitersEach)))
    waitFor(lambda: statusOf(httpPort)["waiters"] >= queued * waitersEach, 120,
            what="waiters queued")
    return waiting


class Pinger:
    """
    Pings the lock port from a thread, a round trip every few ms; keeps
    the worst one since the last L{reset}.
    """

    def __init__(self, port: int) -> None:
        self.client = LineClient(port, timeout=60)
        self.worst = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            answer = self.client.ask(b"P x", timeout=60)
            assert answer == b"P x", answer
            self.worst = max(self.worst, time.perf_counter() - started)
            self.count += 1
            self._stop.wait(0.002)

    def reset(self) -> None:
        self.worst = 0.0

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(60)
        self.client.close()
        return self.worst


# -- the child process: concurrent readers -------------------------------------


def _reader(port: int, path: str, until: float, out: Dict[str, int],
            lock: threading.Lock) -> None:
    while time.monotonic() < until:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            size = len(response.read())
            status = response.status
        except OSError:
            status, size = 0, 0
        finally:
            conn.close()
        with lock:
            out[str(status)] = out.get(str(status), 0) + 1
            out["bytes"] = out.get("bytes", 0) + size


def load(port: int, heavy: int, light: int, seconds: float) -> Dict[str, int]:
    """
    C{heavy} threads asking for L{HEAVY} over and over, and C{light}
    threads for C{/status} and C{/events}, for C{seconds}: answers counted
    by status code, and the bytes read.
    """
    until = time.monotonic() + seconds
    out: Dict[str, int] = {}
    lock = threading.Lock()
    paths = [HEAVY] * heavy + ["/status", "/events?limit=1000"] * (light // 2)
    threads = [threading.Thread(target=_reader, args=(port, path, until, out, lock),
                                daemon=True) for path in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 300)
    return out


def burst(port: int, path: str, count: int, rounds: int) -> Dict[str, int]:
    """
    C{count} connections, opened first; then, C{rounds} times, each sends
    C{GET path} at once (a burst of scrapes) and reads its whole answer.
    Answers counted by status code, and the bytes read.  One thread, the
    sockets multiplexed: 3,000 of them cost no threads.
    """
    import selectors

    out: Dict[str, int] = {}
    socks = []
    for n in range(count):
        if n % 25 == 24:
            time.sleep(0.01)  # within the node's listen backlog
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=60))
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    for _ in range(rounds):
        selector = selectors.DefaultSelector()
        answers: Dict[socket.socket, bytearray] = {}
        for sock in socks:
            sock.sendall(request)
            sock.setblocking(False)
            answers[sock] = bytearray()
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + 120
        while answers and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1):
                sock = key.fileobj  # type: ignore[assignment]
                data = answers[sock]
                chunk = sock.recv(1 << 16)
                data += chunk
                head, sep, body = bytes(data).partition(b"\r\n\r\n")
                if not sep:
                    continue
                length, chunked = 0, False
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                    elif name.strip().lower() == b"transfer-encoding":
                        chunked = b"chunked" in value.lower()
                done = body.endswith(b"0\r\n\r\n") if chunked else len(body) >= length
                if done or not chunk:
                    status = head.split(b" ", 2)[1].decode()
                    out[status] = out.get(status, 0) + 1
                    out["bytes"] = out.get("bytes", 0) + len(body)
                    selector.unregister(sock)
                    sock.setblocking(True)
                    del answers[sock]
        out["unanswered"] = out.get("unanswered", 0) + len(answers)
        selector.close()
        for sock in list(answers):
            socks.remove(sock)
            sock.close()
    for sock in socks:
        sock.close()
    return out


def burstInChild(port: int, path: str, count: int, rounds: int) -> Dict[str, int]:
    """
    L{burst} in a child process (its result on stdout as JSON).
    """
    child = subprocess.run(
        [sys.executable, "-m", "lockservice.testing.httpload", "burst", str(port), path,
         str(count), str(rounds)],
        capture_output=True, env=twistdEnvironment(), timeout=600, check=True)
    return dict(json.loads(child.stdout))


def bursts(lockPort: int, httpPort: int, path: str, count: int, rounds: int
           ) -> Dict[str, Any]:
    """
    The worst lock-port ping (a ping every 2 ms) while C{rounds} bursts of
    C{count} concurrent C{GET path} run.
    """
    pinger = Pinger(lockPort)
    waitFor(lambda: pinger.count >= 20, 30, what="pings before")
    pinger.reset()
    answers = burstInChild(httpPort, path, count, rounds)
    worst = pinger.stop()
    return {"path": path, "concurrent": count, "rounds": rounds,
            "worst_ping_ms": round(worst * 1000, 1), "pings": pinger.count,
            "answers": answers}


def loadInChild(port: int, heavy: int, light: int, seconds: float) -> Dict[str, int]:
    """
    L{load} in a child process (its result on stdout as JSON).
    """
    child = subprocess.run(
        [sys.executable, "-m", "lockservice.testing.httpload", "load", str(port),
         str(heavy), str(light), str(seconds)],
        capture_output=True, env=twistdEnvironment(), timeout=seconds + 600, check=True)
    return dict(json.loads(child.stdout))


def heavyPages(lockPort: int, httpPort: int, heavy: int, light: int = 0,
               seconds: float = 5.0) -> Dict[str, Any]:
    """
    The worst lock-port ping while C{heavy} (and C{light}) HTTP readers
    run for C{seconds}.
    """
    pinger = Pinger(lockPort)
    waitFor(lambda: pinger.count >= 20, 30, what="pings before")
    pinger.reset()
    answers = loadInChild(httpPort, heavy, light, seconds)
    worst = pinger.stop()
    return {"heavy": heavy, "light": light, "worst_ping_ms": round(worst * 1000, 1),
            "pings": pinger.count, "answers": answers}


def nonReaders(lockPort: int, httpPort: int, count: int, path: str = HEAVY
               ) -> List[socket.socket]:
    """
    C{count} connections that each ask for C{path} and never read.
    """
    socks = []
    for n in range(count):
        if n % 25 == 24:
            # Let the node accept: a burst beyond its listen backlog (50)
            # would have SYNs dropped and retried a second later.
            time.sleep(0.01)
        sock = socket.create_connection(("127.0.0.1", httpPort), timeout=30)
        # A small receive buffer: the answer piles up on the node's side.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(sock)
    return socks


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lockservice.testing.httpload")
    sub = p.add_subparsers(dest="cmd", required=True)
    child = sub.add_parser("load", help="concurrent HTTP readers (the benchmark's child)")
    child.add_argument("port", type=int)
    child.add_argument("heavy", type=int)
    child.add_argument("light", type=int)
    child.add_argument("seconds", type=float)
    scrapes = sub.add_parser("burst", help="bursts of concurrent requests (a child)")
    scrapes.add_argument("port", type=int)
    scrapes.add_argument("path")
    scrapes.add_argument("count", type=int)
    scrapes.add_argument("rounds", type=int)
    args = p.parse_args(argv)
    if args.cmd == "burst":
        print(json.dumps(burst(args.port, args.path, args.count, args.rounds)))
        return 0
    print(json.dumps(load(args.port, args.heavy, args.light, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
