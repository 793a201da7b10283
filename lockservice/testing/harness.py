"""
Real processes for tests, benchmarks and the chaos suite: start
C{twistd -n lockservice} nodes on loopback, signal them, and talk to them
with a tiny blocking line client.

Blocking on purpose: it is used from test set-up code and from the
harnesses' controller, never from inside a reactor callback.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence


def _ephemeralLow() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_SLICE = 1000
_nextPort: Dict[str, int] = {}


def _portSlice() -> range:
    """
    This process's own ports, below the kernel's ephemeral range.

    A port the kernel hands out (C{bind(0)}) is also the kind it hands to
    outgoing connections, so between choosing it and the node binding it a
    client socket of another test (two pytest-xdist workers run side by
    side) could take it: the node then exits with "Address already in use".
    Below the ephemeral range nothing takes a port unasked, and each worker
    (C{PYTEST_XDIST_WORKER=gwN}) has a slice of its own.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker[:2] == "gw" and worker[2:].isdigit() else 0
    start = 20000 + index * _SLICE
    return range(start, start + _SLICE)


def freePort() -> int:
    """
    A TCP port on 127.0.0.1 that nothing listens on right now, and that no
    other test process will be given (see L{_portSlice}).
    """
    ports = _portSlice()
    if ports.stop > _ephemeralLow():
        # An odd kernel range: fall back to asking the kernel.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    key = f"{ports.start}"
    for _ in range(len(ports)):
        # Start where this process's id points (spread: processes started
        # one after another have close ids), so that two processes of one
        # slice (a benchmark beside the serial tests) rarely meet.
        port = _nextPort.get(key, ports.start + os.getpid() * 7919 % len(ports))
        _nextPort[key] = port + 1 if port + 1 < ports.stop else ports.start
        with socket.socket() as s:
            # As Twisted binds a listening port: a connection of an earlier
            # node lingering in TIME_WAIT does not make the port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port in {ports.start}-{ports.stop - 1}")


def freePorts(count: int) -> List[int]:
    if count > _SLICE:
        raise ValueError(f"at most {_SLICE} ports at once")
    ports: List[int] = []
    while len(ports) < count:
        port = freePort()
        if port not in ports:
            ports.append(port)
    return ports


def twistdEnvironment() -> Dict[str, str]:
    """
    The environment for a child twistd: this process's own.  The child finds
    the plugin wherever lockservice is installed (a wheel, or the
    development install of the README, which exposes C{twisted/plugins}).
    """
    return dict(os.environ)


class LineClient:
    """
    A blocking client for the line protocol (tests and harness control).
    """

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0,
                 tls: Optional[ssl.SSLContext] = None) -> None:
        """
        @param tls: speak TLS with this context (the handshake happens here).
        """
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readline(self, timeout: Optional[float] = None) -> bytes:
        if timeout is not None:
            self.sock.settimeout(timeout)
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def ask(self, line: bytes, timeout: Optional[float] = None) -> bytes:
        self.send(line + b"\n")
        return self.readline(timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "LineClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ping(port: int, timeout: float = 1.0, host: str = "127.0.0.1",
         tls: Optional[ssl.SSLContext] = None) -> bool:
    try:
        with LineClient(port, host=host, timeout=timeout, tls=tls) as c:
            return c.ask(b"P ping") == b"P ping"
    except OSError:
        return False


class Node:
    """
    One C{twistd -n lockservice} process on 127.0.0.1.
    """

    def __init__(
        self,
        port: int,
        peers: Optional[Sequence[int]] = None,
        args: Sequence[str] = (),
        logDir: Optional[str] = None,
        name: Optional[str] = None,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        """
        @param tls: the client TLS context that reaches this node (for its
            readiness ping), when it is started with TLS options in C{args}.
        """
        self.port = port
        self.tls = tls
        self.host = "127.0.0.1"
        self.address = f"127.0.0.1:{port}"
        # Each peer's client address; --peers is this list, in order.
        self.peerAddresses = [f"127.0.0.1:{p}" for p in peers] if peers else []
        # A command prefix (e.g. `ip netns exec NAME`) to run the node in.
        self.prefix: List[str] = []
        self.peers = list(peers) if peers else []
        self.args = list(args)
        self.logDir = logDir or tempfile.mkdtemp(prefix="lockservice-")
        self.name = name or f"node-{port}"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0
        # Extra environment of the process, and its working directory
        # (another release's source tree, for an upgrade test: the working
        # directory comes first in the child's sys.path).
        self.env: Dict[str, str] = {}
        self.cwd: Optional[str] = None

    def command(self) -> List[str]:
        cmd = self.prefix + [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "-l", self.logPath(), "lockservice",
        ]
        if self.peers:
            cmd += [
                "--peers", ",".join(self.peerAddresses),
                "--node", self.address,
            ]
            if "--secret" not in self.args:
                cmd += ["--secret", self.secretPath()]
        else:
            cmd += ["--listen", f"tcp:{self.port}:interface={self.host}"]
        return cmd + self.args

    def secretPath(self) -> str:
        """
        The shared secret file of this node's cluster (made on first use).
        """
        path = os.path.join(self.logDir, "secret")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("lockservice-test-secret\n")
        return path

    def logPath(self) -> str:
        return os.path.join(self.logDir, f"{self.name}.log")

    def start(self, wait: bool = True, timeout: float = 15.0) -> "Node":
        self.starts += 1
        with open(os.path.join(self.logDir, f"{self.name}.stderr"), "ab") as stderr:
            self.process = subprocess.Popen(
                self.command(),
                env={**twistdEnvironment(), **self.env},
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        if wait:
            self.waitReady(timeout)
        return self

    def waitReady(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n"
                                   + self.tail() + self.stderrTail())
            if ping(self.port, timeout=0.5, host=self.host, tls=self.tls):
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not answer P within {timeout}s:\n" + self.tail())

    def stderrTail(self, lines: int = 10) -> str:
        """
        What twistd wrote to stderr: where it says why it could not start.
        """
        try:
            with open(os.path.join(self.logDir, f"{self.name}.stderr"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.logPath(), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signum)

    def kill(self) -> None:
        """
        C{kill -9}, then reap.
        """
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def interrupt(self, timeout: float = 15.0) -> int:
        """
        SIGINT (a graceful stop), then wait for the exit.
        """
        assert self.process is not None
        self.signal(signal.SIGINT)
        return self.process.wait(timeout)

    def rss(self) -> int:
        """
        Resident set size in bytes (Linux /proc).
        """
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        """
        Make sure the process is gone (test clean-up): resume it if stopped,
        then kill it.
        """
        if self.alive():
            self.signal(signal.SIGCONT)
            self.kill()


class Cluster:
    """
    Nodes on free loopback ports, listed in priority order.
    """

    # Seconds each node has to answer P once all are started.
    readyTimeout = 15.0

    def __init__(self, size: int, args: Sequence[str] = (), logDir: Optional[str] = None) -> None:
        self.ports = freePorts(size)
        self.logDir = logDir or tempfile.mkdtemp(prefix="lockservice-cluster-")
        self.nodes = [
            Node(port, peers=self.ports, args=args, logDir=self.logDir, name=f"node{i}")
            for i, port in enumerate(self.ports)
        ]

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.waitReady(self.readyTimeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def addresses(self) -> List[str]:
        return [n.address for n in self.nodes]


PROBE = b"R __lockservice_probe__ 0"


def probeRole(port: int, timeout: float = 2.0, host: str = "127.0.0.1") -> Optional[str]:
    """
    What a node says to a harmless request: C{"active"} (it serves),
    C{"M <addr>"} (a redirect), or None when it cannot be reached.
    """
    try:
        with LineClient(port, host=host, timeout=timeout) as c:
            answer = c.ask(PROBE)
    except OSError:
        return None
    if answer.startswith(b"R "):
        return "active"
    if answer.startswith(b"M "):
        return "M " + answer.split(b" ")[3].decode()
    return None


def waitFor(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """
    Poll C{predicate} until it returns something truthy; return that.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(interval)


def activeNodes(nodes: Sequence[Node]) -> List[Node]:
    return [n for n in nodes if n.alive() and probeRole(n.port, host=n.host) == "active"]


def firstGrant(nodes: Sequence[Node], started: float, key: bytes, timeout: float = 20.0) -> float:
    """
    Ask C{nodes} in turn (short socket timeouts, so a paused node does not
    hold us up) until one grants C{key}; seconds from C{started} to that
    grant.  The grant is released at once.
    """
    deadline = started + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            if not node.alive():
                continue
            try:
                with LineClient(node.port, host=node.host, timeout=0.3) as c:
                    answer = c.ask(b"A " + key + b" 5 0.2")
                    if answer.startswith(b"A "):
                        elapsed = time.monotonic() - started
                        c.ask(b"R " + key + b" " + answer.split()[2])
                        return elapsed
            except OSError:
                pass
        time.sleep(0.002)
    raise TimeoutError(f"no grant within {timeout}s")
