"""
A line-aware TCP forwarder for the conformance suite (one thread, plain
sockets: the tests are blocking code, no reactor).

It sits between a driver and a real node and records what crossed it:
every connection (when accepted, when closed) and every line in each
direction with its time.  Faults on demand:

- ``stall()`` / ``resume()``: hold every byte both ways (a paused node:
  connections stay open, nothing is answered);
- ``hold_down()`` / ``release_down()``: hold only the node's answers;
- ``cut(link)`` / ``cut_all()``: reset connections (both sides);
- ``refuse = True``: accept new connections and close them at once;
- ``cut_on_line(pred, times)``: a client line matching ``pred`` is not
  forwarded, its connection is cut instead (``times`` first matches);
- ``answer_with(fn)``: ``fn(line)`` may return an answer line that the
  proxy writes back itself instead of forwarding the request.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple


@dataclass
class Link:
    n: int
    accepted: float
    client: socket.socket
    upstream: Optional[socket.socket] = None
    closed: Optional[float] = None
    up: List[Tuple[float, str]] = field(default_factory=list)     # client -> node lines
    down: List[Tuple[float, str]] = field(default_factory=list)   # node -> client lines
    upBuffer: bytes = b""
    downBuffer: bytes = b""
    heldUp: bytes = b""
    heldDown: bytes = b""
    heldLines: List[bytes] = field(default_factory=list)  # answers held by hold_down(pred)
    # Every line on this link in order: ("up"|"down", time, text).
    both: List[Tuple[str, float, str]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.closed is None


def _reset(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class LineProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.lock = threading.RLock()
        self.links: List[Link] = []
        self.refused: List[float] = []   # times of connections closed at once (refuse)
        self.stalled = False
        self.downHeld = False
        self.downPredicate: Optional[Callable[[str], bool]] = None
        self.refuse = False
        self._cutRules: List[List[object]] = []  # [predicate, remaining]
        self._answer: Optional[Callable[[str], Optional[str]]] = None
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.selector = selectors.DefaultSelector()
        self._wakeR, self._wakeW = socket.socketpair()
        self._wakeR.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, ("listen", None))
        self.selector.register(self._wakeR, selectors.EVENT_READ, ("wake", None))
        self._stopping = False
        self._pending: List[Callable[[], None]] = []
        self.thread = threading.Thread(target=self._loop, name=f"proxy-{self.port}", daemon=True)
        self.thread.start()

    # -- controls (any thread) -------------------------------------------------

    def _call(self, fn: Callable[[], None]) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        with self.lock:
            self._pending.append(run)
        self._wake()
        if not done.wait(5):
            raise TimeoutError("proxy loop did not run a control call")

    def _wake(self) -> None:
        try:
            self._wakeW.send(b"x")
        except OSError:
            pass

    def stall(self) -> None:
        self._call(lambda: setattr(self, "stalled", True))

    def resume(self) -> None:
        def run() -> None:
            self.stalled = False
            self.downHeld = False
            for link in self.links:
                self._flush(link)
        self._call(run)

    def hold_down(self, predicate: Optional[Callable[[str], bool]] = None) -> None:
        """
        Hold the node's answers (only the lines matching C{predicate} when
        given; the others pass) until L{release_down}.
        """
        def run() -> None:
            if predicate is None:
                self.downHeld = True
            else:
                self.downPredicate = predicate
        self._call(run)

    def release_down(self) -> None:
        def run() -> None:
            self.downHeld = False
            self.downPredicate = None
            for link in self.links:
                held, link.heldLines = link.heldLines, []
                if held and link.closed is None:
                    try:
                        self._send(link.client, b"".join(held))
                    except OSError:
                        self._close(link, reset=True)
                        continue
                self._flush(link)
        self._call(run)

    def cut(self, link: Link) -> None:
        self._call(lambda: self._close(link, reset=True))

    def cut_all(self) -> int:
        count = []

        def run() -> None:
            live = [lk for lk in self.links if lk.open]
            for lk in live:
                self._close(lk, reset=True)
            count.append(len(live))
        self._call(run)
        return count[0]

    def cut_on_line(self, predicate: Callable[[str], bool], times: int = 1 << 30) -> None:
        with self.lock:
            self._cutRules.append([predicate, times])

    def clear_rules(self) -> None:
        with self.lock:
            self._cutRules = []
            self._answer = None

    def answer_with(self, fn: Optional[Callable[[str], Optional[str]]]) -> None:
        with self.lock:
            self._answer = fn

    def set_refuse(self, refuse: bool) -> None:
        with self.lock:
            self.refuse = refuse

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self.thread.join(5)

    # -- views -----------------------------------------------------------------

    def open_links(self) -> List[Link]:
        with self.lock:
            return [lk for lk in self.links if lk.open]

    def all_links(self) -> List[Link]:
        with self.lock:
            return list(self.links)

    def lines_up(self, prefix: str = "") -> List[Tuple[float, int, str]]:
        """
        Every client line (time, link number, text) starting with C{prefix}.
        """
        with self.lock:
            out = [(t, lk.n, text) for lk in self.links for (t, text) in lk.up
                   if text.startswith(prefix)]
        return sorted(out)

    def lines_down(self, prefix: str = "") -> List[Tuple[float, int, str]]:
        with self.lock:
            out = [(t, lk.n, text) for lk in self.links for (t, text) in lk.down
                   if text.startswith(prefix)]
        return sorted(out)

    # -- the loop ----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            for key, _ in self.selector.select(0.2):
                kind, link = key.data
                try:
                    if kind == "listen":
                        self._accept()
                    elif kind == "wake":
                        try:
                            self._wakeR.recv(4096)
                        except OSError:
                            pass
                    elif kind == "client":
                        self._fromClient(link)
                    elif kind == "upstream":
                        self._fromUpstream(link)
                except Exception:  # a proxy bug must not kill the loop
                    import traceback
                    traceback.print_exc()
            with self.lock:
                pending, self._pending = self._pending, []
            for fn in pending:
                fn()
        for link in list(self.links):
            self._close(link, reset=True)
        try:
            self.selector.unregister(self.listener)
        except Exception:
            pass
        self.listener.close()
        self._wakeR.close()
        self._wakeW.close()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        now = time.monotonic()
        if self.refuse:
            self.refused.append(now)
            _reset(sock)
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            link = Link(n=len(self.links), accepted=now, client=sock)
            self.links.append(link)
        try:
            up = socket.create_connection(self.target, timeout=2)
        except OSError:
            self._close(link, reset=True)
            return
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up.setblocking(False)
        sock.setblocking(False)
        link.upstream = up
        self.selector.register(sock, selectors.EVENT_READ, ("client", link))
        self.selector.register(up, selectors.EVENT_READ, ("upstream", link))

    def _close(self, link: Link, reset: bool) -> None:
        if link.closed is not None:
            return
        link.closed = time.monotonic()
        for sock in (link.client, link.upstream):
            if sock is None:
                continue
            try:
                self.selector.unregister(sock)
            except Exception:
                pass
            if reset:
                _reset(sock)
            else:
                try:
                    sock.close()
                except OSError:
                    pass

    def _send(self, sock: Optional[socket.socket], data: bytes) -> None:
        if sock is None or not data:
            return
        sock.setblocking(True)
        sock.settimeout(2)
        try:
            sock.sendall(data)
        finally:
            try:
                sock.setblocking(False)
            except OSError:
                pass

    def _fromClient(self, link: Link) -> None:
        try:
            data = link.client.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close(link, reset=False)
            return
        now = time.monotonic()
        link.upBuffer += data
        forward = b""
        while b"\n" in link.upBuffer:
            raw, link.upBuffer = link.upBuffer.split(b"\n", 1)
            text = raw.decode("utf-8", "replace").rstrip("\r")
            with self.lock:
                link.up.append((now, text))
                link.both.append(("up", now, text))
                rule = next((r for r in self._cutRules if r[1] > 0 and r[0](text)), None)  # type: ignore[operator]
                if rule is not None:
                    rule[1] -= 1  # type: ignore[operator]
                answer = self._answer(text) if (rule is None and self._answer) else None
            if rule is not None:
                if forward and not self.stalled:
                    try:
                        self._send(link.upstream, link.heldUp + forward)
                    except OSError:
                        pass
                self._close(link, reset=True)
                return
            if answer is not None:
                with self.lock:
                    link.down.append((now, answer))
                    link.both.append(("down", now, answer))
                try:
                    self._send(link.client, answer.encode() + b"\n")
                except OSError:
                    self._close(link, reset=True)
                    return
                continue
            forward += raw + b"\n"
        if self.stalled:
            link.heldUp += forward
            return
        try:
            self._send(link.upstream, link.heldUp + forward)
            link.heldUp = b""
        except OSError:
            self._close(link, reset=True)

    def _fromUpstream(self, link: Link) -> None:
        assert link.upstream is not None
        try:
            data = link.upstream.recv(65536)
        except OSError:
            data = b""
        if not data:
            if link.heldDown and not (self.stalled or self.downHeld):
                self._flush(link)
            self._close(link, reset=False)
            return
        link.heldDown += data
        self._flush(link)

    def _flush(self, link: Link) -> None:
        if link.closed is not None:
            return
        if not self.stalled and link.heldUp:
            try:
                self._send(link.upstream, link.heldUp)
                link.heldUp = b""
            except OSError:
                self._close(link, reset=True)
                return
        if self.stalled or self.downHeld or not link.heldDown:
            return
        data, link.heldDown = link.heldDown, b""
        now = time.monotonic()
        link.downBuffer += data
        out: List[bytes] = []
        while b"\n" in link.downBuffer:
            raw, link.downBuffer = link.downBuffer.split(b"\n", 1)
            text = raw.decode("utf-8", "replace").rstrip("\r")
            with self.lock:
                link.down.append((now, text))
                link.both.append(("down", now, text))
            if self.downPredicate is not None and (link.heldLines or self.downPredicate(text)):
                link.heldLines.append(raw + b"\n")
            else:
                out.append(raw + b"\n")
        try:
            self._send(link.client, b"".join(out))
        except OSError:
            self._close(link, reset=True)
