# -*- test-case-name: tests.server.test_http -*-
"""
What every page of the HTTP endpoint shares: the JSON answers (small
ones at once, big ones a step at a time on one L{Cooperator} shared by
the endpoint, so the lock port waits at most one slice per reactor
turn), the security headers, the query parameters, and the base
resource of the pages that read the node.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.task import Cooperator, TaskFinished
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from lockservice.core import wire
from lockservice.server.clusterview import ClusterView
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService


class BadQuery(Exception):
    """
    A query parameter that cannot be read (answered 400).
    """


# -- answers produced a step at a time -----------------------------------------

# Every big answer is a generator of JSON pieces: each step (one next())
# does a bounded amount of work, about STEP_COST units (a key listed is 1,
# a waiter listed 1, an event 1), and one Cooperator shared by every
# request of the endpoint runs the steps of all answers in turn, at most
# SLICE seconds per reactor turn: whatever the number of pages asked for
# at once, the lock port waits at most one slice.  A
# step runs only while the HTTP connection can take more (its producer
# is not paused), so an answer nobody reads costs its connection a small
# send buffer, not the whole page.
STEP_COST = 200
SLICE = 0.004


# An answer paused this long (its client reads nothing) is given up and
# its connection aborted, so its slot comes back.
STALL_SECONDS = 30.0


class Items:
    """
    A JSON array produced item by item: C{items} yields C{(item, cost)}
    pairs, each made with bounded work, C{cost} units of it.
    """

    def __init__(self, items: Iterable[Tuple[Any, int]]) -> None:
        self.items = items


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def jsonPieces(parts: Iterable[Tuple[str, Any]], stepCost: int = STEP_COST
               ) -> Iterator[bytes]:
    """
    One compact JSON object, C{parts} its fields in order (a field whose
    value is L{Items} is an array made item by item), as the pieces to
    write: a piece after about C{stepCost} units of work, so each
    C{next()} is a bounded step.  The parts are read lazily too: a part
    is made when its turn comes.
    """
    out: List[bytes] = [b"{"]
    cost = 0
    for n, (name, value) in enumerate(parts):
        out.append((b"," if n else b"") + dumps(name) + b":")
        if not isinstance(value, Items):
            piece = dumps(value)
            out.append(piece)
            cost += 1 + len(piece) // 100  # its size is the measure of its work
            if cost >= stepCost:
                yield b"".join(out)
                out, cost = [], 0
            continue
        out.append(b"[")
        first = True
        for item, itemCost in value.items:
            out.append(dumps(item) if first else b"," + dumps(item))
            first = False
            cost += itemCost
            if cost >= stepCost:
                yield b"".join(out)
                out, cost = [], 0
        out.append(b"]")
    out.append(b"}\n")
    yield b"".join(out)


def _slice() -> Callable[[], bool]:
    end = time.monotonic() + SLICE
    return lambda: time.monotonic() >= end


def makeCooperator(clock: IReactorTime) -> Cooperator:
    """
    The endpoint's one scheduler of answer steps: a slice of L{SLICE}
    seconds, then the reactor runs (I/O first, so the lock port is served)
    before the next slice.
    """
    return Cooperator(terminationPredicateFactory=_slice,
                      scheduler=lambda step: clock.callLater(0, step))


@implementer(IPushProducer)
class Answer:
    """
    Writes one answer's pieces to its request, a step per turn of the
    endpoint's L{Cooperator}, paused while the connection's send buffer is
    full (the request's producer: L{HTTPChannel} pauses and resumes it).
    """

    def __init__(self, request: Request, pieces: Iterator[bytes],
                 cooperator: Cooperator, clock: IReactorTime) -> None:
        self.request = request
        self.pieces = pieces
        self.clock = clock
        self.paused = False
        self._stalled: Optional[IDelayedCall] = None
        self.task = cooperator.cooperate(self._steps())
        request.registerProducer(self, True)
        request.notifyFinish().addErrback(self._lost)
        if getattr(request.channel, "sendPaused", False):
            self.pauseProducing()  # a pipelined request behind a full buffer

    def _steps(self) -> Iterator[None]:
        request = self.request
        for piece in self.pieces:
            request.write(piece)
            yield None
        self._cancelStall()
        request.unregisterProducer()
        request.finish()

    def pauseProducing(self) -> None:
        if not self.paused:
            self.paused = True
            self._try(self.task.pause)
            self._stalled = self.clock.callLater(STALL_SECONDS, self._giveUp)

    def resumeProducing(self) -> None:
        if self.paused:
            self.paused = False
            self._cancelStall()
            self._try(self.task.resume)

    def stopProducing(self) -> None:
        self._cancelStall()
        self._try(self.task.stop)

    def _lost(self, reason: Failure) -> None:
        self.stopProducing()

    def _giveUp(self) -> None:
        self._stalled = None
        channel = self.request.channel
        if channel is not None:
            transport: Any = channel.transport
            transport.abortConnection()

    def _cancelStall(self) -> None:
        if self._stalled is not None and self._stalled.active():
            self._stalled.cancel()
        self._stalled = None

    @staticmethod
    def _try(action: Callable[[], None]) -> None:
        try:
            action()
        except TaskFinished:
            pass  # done already (the last piece went out, or the client left)


def jsonHeaders(request: Request, code: int = 200) -> None:
    request.setResponseCode(code)
    secure(request)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")


# JSON and text answers: nothing may load, run or frame them.
API_POLICY = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def secure(request: Request, policy: bytes = API_POLICY) -> None:
    """
    Security headers on every answer: a Content-Security-Policy that forbids
    loads from anywhere else, no framing (clickjacking of the admin's
    force-release), and no MIME sniffing.
    """
    request.setHeader(b"content-security-policy", policy)
    request.setHeader(b"x-frame-options", b"DENY")
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"referrer-policy", b"no-referrer")


def answerJSON(request: Request, data: Any, code: int = 200, compact: bool = False) -> bytes:
    """
    Answer C{data} as JSON: indented for the small answers people read,
    compact for the large ones (lists of locks, events, statistics), which
    Python's C encoder writes several times faster than an indented one
    (the reactor waits meanwhile).
    """
    request.setResponseCode(code)
    secure(request)
    if compact:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(data, separators=(",", ":")).encode() + b"\n"
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(data, indent=2).encode() + b"\n"


def queryArg(request: Request, name: bytes) -> Optional[bytes]:
    values = (request.args or {}).get(name)
    return values[0] if values else None


def queryInt(request: Request, name: bytes, default: int, low: int = 0,
         high: int = 10**9) -> int:
    raw = queryArg(request, name)
    if raw is None or raw == b"":
        return default
    if not raw.isdigit():
        raise BadQuery(f"{name.decode()} must be a whole number")
    value = int(raw)
    if not low <= value <= high:
        raise BadQuery(f"{name.decode()} must be between {low} and {high}")
    return value


def queryKey(raw: Optional[bytes]) -> Optional[bytes]:
    if raw is None:
        return None
    if not wire.isValidKey(raw):
        raise BadQuery("bad key: 1-250 bytes of UTF-8, no spaces or control characters")
    return raw


class NodeResource(Resource):
    """
    A leaf resource that reads this node's lock service, cluster and monitor.
    """

    isLeaf = True

    def __init__(self, locks: LockService, cluster: Optional[ClusterView],
                 monitor: Optional[Monitor] = None,
                 cooperator: Optional[Cooperator] = None) -> None:
        super().__init__()
        self.locks = locks
        self.cluster = cluster
        self.monitor = monitor
        self.cooperator = cooperator or makeCooperator(locks.clock)

    def render(self, request: Request) -> Any:
        try:
            return super().render(request)
        except BadQuery as e:
            return answerJSON(request, {"error": str(e)}, 400)

    def stream(self, request: Request, pieces: Iterator[bytes]) -> Any:
        """
        Answer a JSON object a piece per step (L{Answer}): C{pieces} from
        L{jsonPieces}, called by each page, where its parts are made.
        """
        jsonHeaders(request)
        Answer(request, pieces, self.cooperator, self.locks.clock)
        return NOT_DONE_YET
