# -*- test-case-name: tests.test_http -*-
"""
The HTTP endpoint (twisted.web): C{/status}, C{/locks} (holders and
queues), C{/locks/stats}, C{/events}, C{/metrics}, the admin's
C{POST /locks/<key>/release}, and the live dashboard at C{/} (a static
page shipped with the package, fed by C{/dashboard.json}).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import time
import unicodedata
from importlib import resources
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.task import Cooperator, TaskFinished
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

import lockservice
from lockservice.core import wire
from lockservice.core.table import EXCLUSIVE, READ, READ_WRITE, Holder, nameOf
from lockservice.internals import raiseBindErrorsAtStart
from lockservice.server import health
from lockservice.server.clusterview import ClusterView
from lockservice.server.metrics import CONTENT_TYPE, Metrics
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.state import clockBehind

# Defaults and ceilings of what one request may ask for (a larger ask is
# answered 400).  Big answers are produced a step at a time (see
# L{Answer}), so these bound an answer's size, not a stall.
LOCKS_LIMIT = 1000      # keys per /locks page (default and most)
WAITERS_LIMIT = 100     # waiters listed per key (default)
WAITERS_MAX = 1000      # waiters listed per key (most)
WAITERS_TOTAL = 5000    # waiters listed in one answer, all keys together
HOLDERS_LIMIT = 100     # grants listed per key (default; a shared key has many)
HOLDERS_MAX = 1000      # grants listed per key (most)
HOLDERS_TOTAL = 5000    # grants listed in one answer, all keys together
STATS_LIMIT = 100       # keys on /locks/stats (default)
STATS_MAX = 1000
EVENTS_LIMIT = 1000     # events per /events answer (default and most)


class BadQuery(Exception):
    """
    A query parameter that cannot be read (answered 400).
    """


def status(locks: LockService, cluster: Optional[ClusterView],
           monitor: Optional[Monitor] = None) -> Dict[str, Any]:
    """
    This node and what it knows of the cluster, as plain data.
    """
    now = locks.clock.seconds()
    peers: List[Dict[str, Any]] = []
    node: Optional[str] = None  # a single node has no --peers entry
    active: Optional[str] = None
    term = 0
    if cluster is not None:
        node = cluster.myEntry.decode()
        address = cluster.activeAddress()
        active = address.decode() if address is not None else None
        term = cluster.term
        for j, view in sorted(cluster.views.items()):
            heard = cluster.lastHeard.get(j)
            peers.append({
                "address": cluster.peers[j].decode(),
                "priority": j,
                "alive": view.alive,
                "role": view.role if view.alive else "unknown",
                "term": view.term,
                "secret_mismatch": view.secretMismatch,
                "last_heard_seconds_ago": round(now - heard, 3) if heard is not None else None,
            })
    data: Dict[str, Any] = {
        "node": node,
        "role": locks.role,
        # What the node is doing now (lockservice.cluster.serving's states;
        # a node without peers: its lock service's mode): the role alone
        # says handing-off whenever the node is frozen, for any reason.
        "state": getattr(cluster, "state", None) or locks.mode,
        "term": term,
        "active": active,
        "peers": peers,
        "held_keys": len(locks.table),
        "waiters": locks.table.waiterCount,
        # Grants of keys held by readers or as semaphores (each key above
        # counts once, however many grants hold it).
        "shared_grants": locks.table.sharedGrants,
        "connections": len(locks.connections),
        # Observers (O) waiting for a change, and keys kept by the
        # lock-delay after an expiry.
        "observers": locks.observing.count,
        "lock_delay_seconds": locks.lockDelay,
        # Queued acquires withdrawn by their client (C), and dropped
        # because their connection went away.
        "withdrawals": locks.stats.withdrawals,
        "waiters_dropped": locks.stats.waitersDropped,
        "highest_token": locks.table.tokens.last,
        # Why this node's clock looks wrong, or null: the cluster's own
        # suspicion (a peer far ahead) first, else lockservice.state's.
        "clock_warning": (getattr(cluster, "clockSuspect", None)
                          or clockBehind(locks.table.tokens, time.time_ns() // 1000)),
        "uptime_seconds": round(locks.uptime(), 3),
        "version": lockservice.__version__,
    }
    if cluster is not None:
        # Peer handshakes this node refused (a stranger, another cluster's
        # node): counted here, logged once per source and reason.
        data["refused_handshakes"] = getattr(getattr(cluster, "links", None),
                                             "refusedHandshakes", 0)
        # Peers refused for speaking no peer protocol version of ours.
        data["incompatible_peers"] = list(getattr(cluster, "incompatiblePeers", []))
    if monitor is not None:
        data["warn_hold_seconds"] = monitor.warnHold
        data["long_holds"] = monitor.currentLongHolds()
        # Bounded: the first cycles, and how many there are in all.
        data["deadlocks"] = monitor.deadlocks()
        data["deadlocks_count"] = len(monitor.graph.cycles)
    return data


def _wallAt(locks: LockService, monitor: Optional[Monitor], when: float) -> float:
    """
    The Unix time of the service's (monotonic) time C{when}.
    """
    wall = monitor.wallTime() if monitor is not None else time.time()
    return wall - (locks.clock.seconds() - when)


# How a grant holds its key, or how a waiter would (the "mode" fields).
def modeOf(share: int) -> str:
    """
    C{exclusive} (a plain lock, or the writer of a read-write key),
    C{reader}, or C{semaphore} (one of its slots).
    """
    if share == EXCLUSIVE:
        return "exclusive"
    return "reader" if share == READ else "semaphore"


def kindOf(locks: LockService, key: bytes) -> Tuple[str, Optional[int]]:
    """
    A held key's kind as the pages show it, and a semaphore's slot count:
    C{semaphore}; C{read-write} while readers hold it; C{exclusive} while
    one exclusive grant holds it (a plain lock, or the writer of a
    read-write key).
    """
    table = locks.table
    kind = table.kindOf(key)
    if kind is not None and kind != READ_WRITE:
        return "semaphore", kind
    return ("read-write" if table.isShared(key) else "exclusive"), None


def holderName(name: Optional[bytes], client: object) -> Optional[str]:
    """
    How a grant's holder is shown: the C{I} name its connection had when
    it was granted, else (a connection that never named itself) that
    connection's address while this node knows it.
    """
    if name is not None:
        return name.decode("utf-8", "replace")
    return nameOf(client)


def describeLock(locks: LockService, monitor: Optional[Monitor], key: bytes,
                 holder: Holder, waiters: int = WAITERS_LIMIT,
                 holders: int = HOLDERS_LIMIT) -> Dict[str, Any]:
    """
    One held key: its kind, its holders (the first C{holders} of them,
    oldest first) and the first C{waiters} of its queue.  The top-level
    C{token}, C{holder}, ... fields are those of C{holder}: the key's one
    grant, or of a shared key the grant whose lease runs out first.

    @param holder: a view of the key's grant, read here and dropped.
    """
    now = locks.clock.seconds()
    table = locks.table
    queue = []
    for waiter in islice(holder.waiters(), waiters):
        queue.append({
            "who": waiter.holderName(),
            "lease_seconds": waiter.lease,
            "waited_seconds": round(now - waiter.queuedAt, 3),
            "mode": modeOf(waiter.share),
        })
    kind, slots = kindOf(locks, key)
    share = holder.share
    listed = []
    for token, grantedAt, expiresAt, client, renewals, name, delayed in table.firstGrants(
            key, holders):
        listed.append({
            "token": token,
            "holder": holderName(name, client),
            "delayed": delayed,
            "mode": modeOf(share),
            "granted_at": round(_wallAt(locks, monitor, grantedAt), 3),
            "age_seconds": round(now - grantedAt, 3),
            "remaining_seconds": round(max(0.0, expiresAt - now), 3),
            "renewals": renewals,
            "long_hold": monitor is not None and monitor.isLongHold(key, token),
        })
    count = table.holderCount(key)
    delayedUntil = table.delayedUntil(key)
    return {
        "key": key.decode("utf-8", "replace"),
        "token": holder.token,
        "holder": holderName(table.nameOfGrant(key, holder.token), holder.client),
        "granted_at": round(_wallAt(locks, monitor, holder.grantedAt), 3),
        "age_seconds": round(now - holder.grantedAt, 3),
        "remaining_seconds": round(max(0.0, holder.expiresAt - now), 3),
        "renewals": holder.renewals,
        "long_hold": monitor is not None and (monitor.isLongHold(key, holder.token)
                                              or any(h["long_hold"] for h in listed)),
        "queue_length": holder.waiting,
        "waiters": queue,
        "waiters_truncated": holder.waiting > len(queue),
        "kind": kind,
        "slots": slots,
        "holder_count": count,
        "holders": listed,
        "holders_truncated": count > len(listed),
        # The lock-delay: places kept after their grants expired.
        "delayed": delayedUntil is not None,
        "delay_ends_at": (None if delayedUntil is None
                          else round(_wallAt(locks, monitor, delayedUntil), 3)),
        "delay_remaining_seconds": (None if delayedUntil is None
                                    else round(max(0.0, delayedUntil - now), 3)),
    }


def heldLocks(locks: LockService, key: Optional[bytes] = None, limit: int = LOCKS_LIMIT,
              offset: int = 0, monitor: Optional[Monitor] = None,
              waiters: int = WAITERS_LIMIT, holders: int = HOLDERS_LIMIT) -> Dict[str, Any]:
    """
    Who holds what and who waits, for one key or a page of held keys.
    """
    table = locks.table
    if key is not None:
        holder = table.holder(key)
        if holder is None:
            return {"key": key.decode("utf-8", "replace"), "held": False}
        return dict(describeLock(locks, monitor, key, holder, waiters, holders), held=True)
    listed = []
    # Waiters and grants listed in all; the rest are counted only.
    budget, grants = WAITERS_TOTAL, HOLDERS_TOTAL
    for k in table.page(offset, limit):
        h = table.holder(k)
        assert h is not None
        entry = describeLock(locks, monitor, k, h, min(waiters, budget), min(holders, grants))
        budget -= len(entry["waiters"])
        grants -= len(entry["holders"])
        listed.append(entry)
    return {
        "count": len(table),
        "offset": offset,
        "limit": limit,
        "truncated": offset + len(listed) < len(table),
        "locks": listed,
    }


def keyStats(monitor: Monitor, limit: int = STATS_LIMIT) -> Dict[str, Any]:
    """
    The busiest keys' statistics, most active first.
    """
    return {
        "tracked": len(monitor.keys),
        "capacity": monitor.keys.capacity,
        "keys": [dict(key=k.decode("utf-8", "replace"), **record.asDict())
                 for k, record in monitor.keys.top(limit)],
    }


def recentEvents(monitor: Monitor, since: int = 0, key: Optional[bytes] = None,
                 limit: int = EVENTS_LIMIT) -> Dict[str, Any]:
    """
    The events after C{since}; C{gap} (with C{missed}, how many) says that
    some of them are gone from the ring: the reader fell behind by more
    than the ring holds.  C{oldest} is the oldest sequence number kept.
    """
    ring = monitor.events
    missed = ring.missed(since)
    found, nxt = ring.since(since, key, limit)
    return {"events": [event.asDict() for event in found], "next": nxt,
            "oldest": ring.oldest, "gap": missed > 0, "missed": missed}


def dashboard(locks: LockService, cluster: Optional[ClusterView], monitor: Monitor,
              seconds: int = 300) -> Dict[str, Any]:
    """
    Everything the dashboard page shows, in one answer.
    """
    now = locks.clock.seconds()
    found, _ = monitor.events.since(max(0, monitor.events.last - 50))
    return {
        "status": status(locks, cluster, monitor),
        "locks": heldLocks(locks, limit=50, monitor=monitor, waiters=20, holders=20),
        "series": monitor.series.last(now, seconds),
        "events": [event.asDict() for event in reversed(found)],
        "stats": keyStats(monitor, 10)["keys"],
    }


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
# Unsent bytes Twisted keeps per HTTP connection beyond the kernel's
# socket buffer before the answer is paused (its default is 64 KiB).
SEND_BUFFER = 16 * 1024
# The kernel's send buffer of an HTTP connection (Linux doubles it).
KERNEL_SEND_BUFFER = 64 * 1024
# Requests in progress at once; the next ones are answered 503 at once.
MAX_REQUESTS = 256
# /metrics is rendered at most once per this many seconds (a scrape shows
# figures at most this old), and written in pieces of this size.
METRICS_TTL = 1.0
METRICS_PIECE = 16 * 1024
# An answer paused this long (its client reads nothing) is given up and
# its connection aborted, so its slot comes back.
STALL_SECONDS = 30.0
# Request bodies larger than this (or of unknown length: chunked) are
# refused (413) before one byte of them is read; the force-release
# reason is the only body any page reads.
MAX_BODY = 8 * 1024


class Items:
    """
    A JSON array produced item by item: C{items} yields C{(item, cost)}
    pairs, each made with bounded work, C{cost} units of it.
    """

    def __init__(self, items: Iterable[Tuple[Any, int]]) -> None:
        self.items = items


def _dumps(value: Any) -> bytes:
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
        out.append((b"," if n else b"") + _dumps(name) + b":")
        if not isinstance(value, Items):
            piece = _dumps(value)
            out.append(piece)
            cost += 1 + len(piece) // 100  # its size is the measure of its work
            if cost >= stepCost:
                yield b"".join(out)
                out, cost = [], 0
            continue
        out.append(b"[")
        first = True
        for item, itemCost in value.items:
            out.append(_dumps(item) if first else b"," + _dumps(item))
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


def _headers(request: Request, code: int = 200) -> None:
    request.setResponseCode(code)
    _secure(request)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")


def heldLocksParts(locks: LockService, limit: int = LOCKS_LIMIT, offset: int = 0,
                   monitor: Optional[Monitor] = None, waiters: int = WAITERS_LIMIT,
                   holders: int = HOLDERS_LIMIT) -> List[Tuple[str, Any]]:
    """
    A page of held keys as L{jsonPieces} parts, C{locks} made key by key.
    Each key is described as it is when its turn comes: a key released
    while the page is written is left out (C{count} and C{truncated} are
    as they were when the page was asked for).
    """
    table = locks.table
    keys = table.page(offset, limit)

    def entries() -> Iterator[Tuple[Dict[str, Any], int]]:
        # Waiters and grants listed in all; the rest are counted only.
        budget, grants = WAITERS_TOTAL, HOLDERS_TOTAL
        for k in keys:
            h = table.holder(k)
            if h is None:
                continue
            entry = describeLock(locks, monitor, k, h, min(waiters, budget),
                                 min(holders, grants))
            listed, held = len(entry["waiters"]), len(entry["holders"])
            budget -= listed
            grants -= held
            yield entry, 1 + listed + held

    return [("count", len(table)), ("offset", offset), ("limit", limit),
            ("truncated", offset + len(keys) < len(table)), ("locks", Items(entries()))]


def statsParts(monitor: Monitor, limit: int = STATS_LIMIT) -> List[Tuple[str, Any]]:
    """
    L{keyStats} as L{jsonPieces} parts, the keys turned into JSON a step at
    a time.
    """
    return [("tracked", len(monitor.keys)), ("capacity", monitor.keys.capacity),
            ("keys", Items((dict(key=k.decode("utf-8", "replace"), **record.asDict()), 1)
                           for k, record in monitor.keys.top(limit)))]


def eventsParts(monitor: Monitor, since: int = 0, key: Optional[bytes] = None,
                limit: int = EVENTS_LIMIT) -> Iterator[Tuple[str, Any]]:
    """
    L{recentEvents} as L{jsonPieces} parts, the events turned into JSON a
    step at a time.  Nothing is read before the first step: a burst of
    requests costs the reactor turn that receives them nothing but their
    parsing.
    """
    ring = monitor.events
    missed = ring.missed(since)
    found, nxt = ring.since(since, key, limit)
    yield "events", Items((event.asDict(), 1) for event in found)
    yield "next", nxt
    yield "oldest", ring.oldest
    yield "gap", missed > 0
    yield "missed", missed


def dashboardParts(locks: LockService, cluster: Optional[ClusterView], monitor: Monitor,
                   seconds: int = 300) -> Iterator[Tuple[str, Any]]:
    """
    L{dashboard} as L{jsonPieces} parts, each made when its turn comes.
    """
    now = locks.clock.seconds()
    yield "status", status(locks, cluster, monitor)
    yield "locks", heldLocks(locks, limit=50, monitor=monitor, waiters=20, holders=20)
    yield "series", monitor.series.last(now, seconds)
    found, _ = monitor.events.since(max(0, monitor.events.last - 50))
    yield "events", [event.asDict() for event in reversed(found)]
    yield "stats", keyStats(monitor, 10)["keys"]


# -- resources ---------------------------------------------------------------


# JSON and text answers: nothing may load, run or frame them.
API_POLICY = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def _secure(request: Request, policy: bytes = API_POLICY) -> None:
    """
    Security headers on every answer: a Content-Security-Policy that forbids
    loads from anywhere else, no framing (clickjacking of the admin's
    force-release), and no MIME sniffing.
    """
    request.setHeader(b"content-security-policy", policy)
    request.setHeader(b"x-frame-options", b"DENY")
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"referrer-policy", b"no-referrer")


def _json(request: Request, data: Any, code: int = 200, compact: bool = False) -> bytes:
    """
    Answer C{data} as JSON: indented for the small answers people read,
    compact for the large ones (lists of locks, events, statistics), which
    Python's C encoder writes several times faster than an indented one
    (the reactor waits meanwhile).
    """
    request.setResponseCode(code)
    _secure(request)
    if compact:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(data, separators=(",", ":")).encode() + b"\n"
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(data, indent=2).encode() + b"\n"


def _arg(request: Request, name: bytes) -> Optional[bytes]:
    values = (request.args or {}).get(name)
    return values[0] if values else None


def _int(request: Request, name: bytes, default: int, low: int = 0,
         high: int = 10**9) -> int:
    raw = _arg(request, name)
    if raw is None or raw == b"":
        return default
    if not raw.isdigit():
        raise BadQuery(f"{name.decode()} must be a whole number")
    value = int(raw)
    if not low <= value <= high:
        raise BadQuery(f"{name.decode()} must be between {low} and {high}")
    return value


REASON_LIMIT = 500


def cleanReason(raw: bytes) -> str:
    """
    A force-release reason fit for one log line and the event ring: control
    characters and line separators escaped (C{\\n}, C{\\x1b}), so a reason
    cannot forge log lines or terminal output; at most L{REASON_LIMIT}
    characters.
    """
    pieces: List[str] = []
    size = 0
    for c in raw.decode("utf-8", "replace").strip():
        piece = (c.encode("unicode_escape").decode("ascii")
                 if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c)
        if size + len(piece) > REASON_LIMIT:
            # Cut, escapes counted, with room for the mark of the cut (and
            # never through an escape).
            while size + 3 > REASON_LIMIT:
                size -= len(pieces.pop())
            pieces.append("...")
            break
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)


def _key(raw: Optional[bytes]) -> Optional[bytes]:
    if raw is None:
        return None
    if not wire.isValidKey(raw):
        raise BadQuery("bad key: 1-250 bytes of UTF-8, no spaces or control characters")
    return raw


class _NodeResource(Resource):
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
            return _json(request, {"error": str(e)}, 400)

    def stream(self, request: Request, pieces: Iterator[bytes]) -> Any:
        """
        Answer a JSON object a piece per step (L{Answer}): C{pieces} from
        L{jsonPieces}, called by each page, where its parts are made.
        """
        _headers(request)
        Answer(request, pieces, self.cooperator, self.locks.clock)
        return NOT_DONE_YET


class StatusResource(_NodeResource):
    # The state directory whose write failures /status shows (makeRoot).
    state: Optional[health.StateSaves] = None

    def render_GET(self, request: Request) -> bytes:
        return _json(request, {**status(self.locks, self.cluster, self.monitor),
                               **health.stateFields(self.state)})


class LocksResource(_NodeResource):
    """
    C{GET /locks}, C{GET /locks?key=K}, C{GET /locks/K}, C{GET /locks/stats},
    and the admin's C{POST /locks/K/release} or C{POST /locks/release?key=K}.
    Keys may hold slashes (C{/locks/orders/42/release}) or percent-escapes
    (C{%2F} is a slash, C{%25} a percent sign).

    The query form (C{?key=K}) names any key without ambiguity; the path
    form cannot name a key called C{stats} (that is the statistics page).
    """

    def __init__(self, locks: LockService, cluster: Optional[ClusterView],
                 monitor: Optional[Monitor] = None,
                 adminSecret: Optional[bytes] = None,
                 cooperator: Optional[Cooperator] = None) -> None:
        super().__init__(locks, cluster, monitor, cooperator)
        self.forceRelease = ForceRelease(locks, monitor, adminSecret)

    def _path(self, request: Request) -> List[bytes]:
        # twisted.web has already percent-decoded each segment (after
        # splitting on "/", so %2F stays inside its segment): decoding
        # again would turn the key "a%41" into "aA".
        path = list(request.postpath or [])
        return [] if path == [b""] else path  # /locks/ is /locks

    def render_GET(self, request: Request) -> Any:
        path = self._path(request)
        waiters = _int(request, b"waiters", WAITERS_LIMIT, 0, WAITERS_MAX)
        holders = _int(request, b"holders", HOLDERS_LIMIT, 0, HOLDERS_MAX)
        if path == [b"stats"]:
            if self.monitor is None:
                return _json(request, {"error": "no statistics on this node"}, 404)
            return self.stream(request, jsonPieces(statsParts(
                self.monitor, _int(request, b"limit", STATS_LIMIT, 0, STATS_MAX))))
        key = _key(b"/".join(path)) if path else _key(_arg(request, b"key"))
        limit = _int(request, b"limit", LOCKS_LIMIT, 0, LOCKS_LIMIT)
        offset = _int(request, b"offset", 0, 0)
        if key is not None:
            # One key (up to WAITERS_MAX waiters and HOLDERS_MAX grants)
            # is one step, made on the Cooperator's turn: a queue cannot
            # be read across turns.
            def one(key: bytes = key) -> Iterator[Tuple[str, Any]]:
                yield from heldLocks(self.locks, key, monitor=self.monitor,
                                     waiters=waiters, holders=holders).items()
            return self.stream(request, jsonPieces(one()))
        return self.stream(request, jsonPieces(heldLocksParts(
            self.locks, limit, offset, self.monitor, waiters, holders)))

    def render_POST(self, request: Request) -> bytes:
        return self.forceRelease.render(request, self._path(request))


class ForceRelease:
    """
    The admin's C{POST /locks/K/release} or C{POST /locks/release?key=K}
    (with --admin-secret): the grant released through the monitor, which
    logs it and shows it as a force-release.
    """

    def __init__(self, locks: LockService, monitor: Optional[Monitor],
                 adminSecret: Optional[bytes]) -> None:
        self.locks = locks
        self.monitor = monitor
        self.adminSecret = adminSecret

    def render(self, request: Request, path: List[bytes]) -> bytes:
        query = _arg(request, b"key")
        if path == [b"release"] and query is not None:
            raw = query  # POST /locks/release?key=K: any key, unambiguous
        elif len(path) >= 2 and path[-1] == b"release" and query is None:
            raw = b"/".join(path[:-1])
        else:
            return _json(request, {"error": "POST /locks/<key>/release "
                                            "or /locks/release?key=<key>"}, 404)
        if self.adminSecret is None or self.monitor is None:
            return _json(request, {"error": "force-release is off: no --admin-secret"}, 403)
        if not self._authorized(request):
            request.setHeader(b"www-authenticate", b'Bearer realm="lockservice"')
            return _json(request, {"error": "wrong or missing admin secret"}, 401)
        key = _key(raw)
        assert key is not None
        reason = cleanReason(_arg(request, b"reason") or b"") or "no reason given"
        if self.locks.role != "active":
            active = self.locks.activeAddress
            return _json(request, {
                "error": "this node is not active",
                "active": active.decode() if active is not None else None,
            }, 409)
        # ?token=T names one grant of a shared key; without it, the
        # key's (first-expiring) grant, as for an exclusive key.
        given = _arg(request, b"token")
        if given is not None:
            if not given.isdigit() or int(given) >= 2**64:
                raise BadQuery("token must be a whole number below 2^64")
            token: Optional[int] = int(given)
            if self.locks.table.placeOf(key, int(given)) is None:
                token = None
        else:
            token = self.locks.table.tokenOf(key)
        if token is None:
            return _json(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        peer = request.getClientAddress()
        who = f"admin@{getattr(peer, 'host', peer)}"
        table = self.locks.table
        issuedBefore = table.tokens.last
        if not self.monitor.forceRelease(self.locks, key, token, reason, who):
            return _json(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        # The next token is that of a grant this release made (a waiter's;
        # the first, should it let several readers in), not any grant of
        # the key: a shared key's other holders were there before.
        made = [held.token for held in table.grantsOf(key) if held.token > issuedBefore]
        return _json(request, {
            "key": key.decode("utf-8", "replace"),
            "released_token": token,
            "next_token": min(made) if made else None,
            "reason": reason,
        })

    def _authorized(self, request: Request) -> bool:
        assert self.adminSecret is not None
        header = request.getHeader(b"authorization") or b""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer":
            given = b""
        # Constant time whatever the given secret: no timing oracle.
        return hmac.compare_digest(given.strip(), self.adminSecret)


class EventsResource(_NodeResource):
    def render_GET(self, request: Request) -> Any:
        assert self.monitor is not None
        return self.stream(request, jsonPieces(eventsParts(
            self.monitor,
            since=_int(request, b"since", 0, 0, 2**63),
            key=_key(_arg(request, b"key")),
            limit=_int(request, b"limit", EVENTS_LIMIT, 1, EVENTS_LIMIT),
        )))


class DashboardDataResource(_NodeResource):
    def render_GET(self, request: Request) -> Any:
        assert self.monitor is not None
        return self.stream(request, jsonPieces(dashboardParts(
            self.locks, self.cluster, self.monitor,
            _int(request, b"seconds", 300, 1, 3600))))


class MetricsResource(Resource):
    """
    C{GET /metrics}: rendered at most once per L{METRICS_TTL} (a burst of
    scrapes shares one rendering), and written a piece per step of the
    endpoint's cooperator, like every big answer.
    """

    isLeaf = True

    def __init__(self, metrics: Metrics, clock: IReactorTime, cooperator: Cooperator) -> None:
        super().__init__()
        self.metrics = metrics
        self.clock = clock
        self.cooperator = cooperator
        self._rendered: Optional[bytes] = None
        self._renderedAt = 0.0

    def rendered(self) -> bytes:
        now = self.clock.seconds()
        if self._rendered is None or not 0 <= now - self._renderedAt < METRICS_TTL:
            self._rendered = self.metrics.render()
            self._renderedAt = now
        return self._rendered

    def render_GET(self, request: Request) -> Any:
        body = self.rendered()
        _secure(request)
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        request.setHeader(b"content-length", b"%d" % len(body))
        pieces = (body[i:i + METRICS_PIECE] for i in range(0, len(body), METRICS_PIECE))
        Answer(request, pieces, self.cooperator, self.clock)
        return NOT_DONE_YET


def _page() -> bytes:
    return resources.files("lockservice.server").joinpath("dashboard.html").read_bytes()


def pagePolicy(page: bytes) -> bytes:
    """
    The dashboard's Content-Security-Policy: its one inline script (allowed
    by hash, so no other script can run), inline styles, and requests to
    this node only; nothing from elsewhere.
    """
    start = page.index(b"<script>") + len(b"<script>")
    script = page[start:page.index(b"</script>", start)]
    digest = base64.b64encode(hashlib.sha256(script).digest())
    return (b"default-src 'none'; script-src 'sha256-" + digest + b"'; "
            b"style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
            b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


class PageResource(Resource):
    """
    The dashboard: one static page (no external assets) that polls
    C{/dashboard.json}.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.page = _page()
        self.policy = pagePolicy(self.page)

    def render_GET(self, request: Request) -> bytes:
        if request.postpath and any(request.postpath):
            _secure(request)
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"not found\n"
        _secure(request, self.policy)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return self.page


class _NotFound(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return _json(request, {"error": "no such page"}, 404)


class _Root(Resource):
    def getChild(self, path: bytes, request: Request) -> IResource:  # type: ignore[override]
        return _NotFound()


def makeRoot(locks: LockService, cluster: Optional[ClusterView],
             monitor: Optional[Monitor] = None,
             adminSecret: Optional[bytes] = None,
             cooperator: Optional[Cooperator] = None,
             state: Optional[health.StateSaves] = None) -> Resource:
    """
    The resource tree; a L{Monitor} is made (and attached to C{locks})
    when none is given.

    @param cooperator: runs the steps of every big answer (one for the
        whole tree, so the slice per reactor turn is shared by all
        requests); by default one on C{locks.clock}.
    @param state: the node's state directory (its write failures are shown).
    """
    if monitor is None:
        monitor = Monitor(locks.clock, locks.table.clientOf)
        locks.notify.attach(monitor)
    if cooperator is None:
        cooperator = makeCooperator(locks.clock)
    metrics = Metrics(locks, cluster, monitor)
    root = _Root()
    root.putChild(b"", PageResource())
    root.putChild(b"dashboard.json",
                  DashboardDataResource(locks, cluster, monitor, cooperator))
    statusResource = StatusResource(locks, cluster, monitor, cooperator)
    statusResource.state = state
    root.putChild(b"status", statusResource)
    health.register(root, locks, cluster, metrics.registry, state)
    root.putChild(b"locks", LocksResource(locks, cluster, monitor, adminSecret, cooperator))
    root.putChild(b"events", EventsResource(locks, cluster, monitor, cooperator))
    root.putChild(b"metrics", MetricsResource(metrics, locks.clock, cooperator))
    return root


# -- the site: admission, send buffers, request bodies ---------------------------


class NodeChannel(HTTPChannel):
    """
    One HTTP connection: a small send buffer, and request bodies over
    L{MAX_BODY} (or chunked, of unknown length) refused with 413 before
    they are read (twisted.web would spool them to a temporary file).

    @ivar sendPaused: the transport's send buffer is full (an L{Answer}
        registered now starts paused).
    """

    sendPaused = False
    refused = False
    maxBody = MAX_BODY

    def connectionMade(self) -> None:
        super().connectionMade()
        transport: Any = self.transport
        if hasattr(transport, "bufferSize"):
            # What is kept beyond the kernel's buffer before the answer's
            # producer is paused: 3,000 clients that never read cost
            # 3,000 small buffers.
            transport.bufferSize = SEND_BUFFER
        handle = getattr(transport, "getHandle", lambda: None)()
        if isinstance(handle, socket.socket) and handle.family != socket.AF_UNIX:
            # And a small kernel buffer: loopback's autotuning would take
            # megabytes per connection from the machine (not our RSS) for
            # a client that never reads.
            handle.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SEND_BUFFER)

    def allHeadersReceived(self) -> None:
        if self.length is None or self.length > self.maxBody:
            self.refused = True
            body = _dumps({"error": f"request bodies over {self.maxBody} bytes "
                                    f"(or chunked) are refused"}) + b"\n"
            transport: Any = self.transport
            transport.write(
                b"HTTP/1.1 413 Content Too Large\r\n"
                b"Content-Type: application/json\r\n"
                b"X-Content-Type-Options: nosniff\r\n"
                b"Connection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
            # Nothing more is read: the rest of this read is dropped by
            # LineReceiver (the transport is disconnecting), later reads
            # by dataReceived.
            self.loseConnection()
            return
        super().allHeadersReceived()

    def dataReceived(self, data: bytes) -> None:
        if not self.refused:
            super().dataReceived(data)

    def pauseProducing(self) -> None:
        self.sendPaused = True
        super().pauseProducing()

    def resumeProducing(self) -> None:
        self.sendPaused = False
        super().resumeProducing()


class NodeRequest(Request):
    """
    A request admitted only while fewer than the site's C{maxRequests}
    are in progress; above it, answered 503 at once (fast refusal, never a
    stall).
    """

    def process(self) -> None:
        site: NodeSite = self.channel.site  # type: ignore[attr-defined]
        if site.inProgress >= site.maxRequests:
            site.refusedBusy += 1
            self.site = site
            self.setResponseCode(503)
            _secure(self)
            self.setHeader(b"content-type", b"application/json")
            self.setHeader(b"retry-after", b"1")
            self.write(_dumps({"error": "too many HTTP requests at once; retry"}) + b"\n")
            self.finish()
            return
        site.inProgress += 1
        self.notifyFinish().addBoth(site._finished)
        super().process()


class NodeSite(Site):
    """
    The endpoint's site: L{NodeChannel} connections, L{NodeRequest}s.

    @ivar inProgress: requests being answered now.
    @ivar refusedBusy: requests answered 503 since start.
    """

    protocol = NodeChannel  # type: ignore[assignment]  # HTTP/1.1 only (no h2 wrapper)
    requestFactory = NodeRequest
    maxRequests = MAX_REQUESTS

    def __init__(self, resource: IResource, **kw: Any) -> None:
        super().__init__(resource, **kw)
        self.inProgress = 0
        self.refusedBusy = 0
        self.noisy = False

    def _finished(self, result: object) -> None:
        self.inProgress -= 1

    def log(self, request: Any) -> None:
        pass  # no access log (the node's log is for the lock service)


def makeHTTPService(reactor: Any, description: str, locks: LockService,
                    cluster: Optional[ClusterView], monitor: Optional[Monitor] = None,
                    adminSecret: Optional[bytes] = None,
                    state: Optional[health.StateSaves] = None) -> StreamServerEndpointService:
    # Idle keep-alive connections are closed after a minute (twisted.web
    # keeps them for 12 hours).
    site = NodeSite(makeRoot(locks, cluster, monitor, adminSecret, state=state), timeout=60)
    service = StreamServerEndpointService(serverFromString(reactor, description), site)
    raiseBindErrorsAtStart(service)
    return service


__all__: Tuple[str, ...] = ("makeRoot", "makeHTTPService", "status", "heldLocks", "NodeSite")
