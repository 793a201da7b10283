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
import time
import unicodedata
from importlib import resources
from itertools import islice
from typing import Any, Dict, List, Optional, Tuple

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

import lockservice
from lockservice.core import wire
from lockservice.core.table import Holder
from lockservice.internals import raiseBindErrorsAtStart
from lockservice.server.clusterview import ClusterView
from lockservice.server.metrics import CONTENT_TYPE, Metrics
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.state import clockBehind

# Defaults and ceilings of what one request may ask for: an answer is
# built in one reactor turn, so its size is what bounds the stall it causes
# (SPEC section 7); a larger ask is answered 400.
LOCKS_LIMIT = 1000      # keys per /locks page (default and most)
WAITERS_LIMIT = 100     # waiters listed per key (default)
WAITERS_MAX = 1000      # waiters listed per key (most)
WAITERS_TOTAL = 5000    # waiters listed in one answer, all keys together
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
        "term": term,
        "active": active,
        "peers": peers,
        "held_keys": len(locks.table),
        "waiters": locks.table.waiterCount,
        "connections": len(locks.connections),
        "highest_token": locks.table.tokens.last,
        # Why this node's clock looks wrong, or null: the cluster's own
        # suspicion (a peer far ahead) first, else lockservice.state's.
        "clock_warning": (getattr(cluster, "clockSuspect", None)
                          or clockBehind(locks.table.tokens, time.time_ns() // 1000)),
        "uptime_seconds": round(locks.uptime(), 3),
        "version": lockservice.__version__,
    }
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


def describeLock(locks: LockService, monitor: Optional[Monitor], key: bytes,
                 holder: Holder, waiters: int = WAITERS_LIMIT) -> Dict[str, Any]:
    """
    One held key: its holder and the first C{waiters} of its queue.

    @param holder: a view of the key's grant, read here and dropped.
    """
    now = locks.clock.seconds()
    queue = []
    for waiter in islice(holder.waiters(), waiters):
        queue.append({
            "who": waiter.holderName(),
            "lease_seconds": waiter.lease,
            "waited_seconds": round(now - waiter.queuedAt, 3),
        })
    return {
        "key": key.decode("utf-8", "replace"),
        "token": holder.token,
        "holder": holder.owner,
        "granted_at": round(_wallAt(locks, monitor, holder.grantedAt), 3),
        "age_seconds": round(now - holder.grantedAt, 3),
        "remaining_seconds": round(max(0.0, holder.expiresAt - now), 3),
        "renewals": holder.renewals,
        "long_hold": monitor is not None and monitor.isLongHold(key, holder.token),
        "queue_length": holder.waiting,
        "waiters": queue,
        "waiters_truncated": holder.waiting > len(queue),
    }


def heldLocks(locks: LockService, key: Optional[bytes] = None, limit: int = LOCKS_LIMIT,
              offset: int = 0, monitor: Optional[Monitor] = None,
              waiters: int = WAITERS_LIMIT) -> Dict[str, Any]:
    """
    Who holds what and who waits, for one key or a page of held keys.
    """
    table = locks.table
    if key is not None:
        holder = table.holder(key)
        if holder is None:
            return {"key": key.decode("utf-8", "replace"), "held": False}
        return dict(describeLock(locks, monitor, key, holder, waiters), held=True)
    listed = []
    budget = WAITERS_TOTAL  # waiters listed in all; the rest are counted only
    for k in table.page(offset, limit):
        h = table.holder(k)
        assert h is not None
        entry = describeLock(locks, monitor, k, h, min(waiters, budget))
        budget -= len(entry["waiters"])
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
        "locks": heldLocks(locks, limit=50, monitor=monitor, waiters=20),
        "series": monitor.series.last(now, seconds),
        "events": [event.asDict() for event in reversed(found)],
        "stats": keyStats(monitor, 10)["keys"],
    }


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
    text = raw.decode("utf-8", "replace").strip()
    if len(text) > REASON_LIMIT:
        text = text[:REASON_LIMIT] + "..."
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
        for c in text
    )


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
                 monitor: Optional[Monitor] = None) -> None:
        super().__init__()
        self.locks = locks
        self.cluster = cluster
        self.monitor = monitor

    def render(self, request: Request) -> bytes:
        try:
            return super().render(request)  # type: ignore[no-any-return]
        except BadQuery as e:
            return _json(request, {"error": str(e)}, 400)


class StatusResource(_NodeResource):
    def render_GET(self, request: Request) -> bytes:
        return _json(request, status(self.locks, self.cluster, self.monitor))


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
                 adminSecret: Optional[bytes] = None) -> None:
        super().__init__(locks, cluster, monitor)
        self.adminSecret = adminSecret

    def _path(self, request: Request) -> List[bytes]:
        # twisted.web has already percent-decoded each segment (after
        # splitting on "/", so %2F stays inside its segment): decoding
        # again would turn the key "a%41" into "aA".
        path = list(request.postpath or [])
        return [] if path == [b""] else path  # /locks/ is /locks

    def render_GET(self, request: Request) -> bytes:
        path = self._path(request)
        waiters = _int(request, b"waiters", WAITERS_LIMIT, 0, WAITERS_MAX)
        if path == [b"stats"]:
            if self.monitor is None:
                return _json(request, {"error": "no statistics on this node"}, 404)
            return _json(request, keyStats(self.monitor,
                                           _int(request, b"limit", STATS_LIMIT, 0,
                                                STATS_MAX)), compact=True)
        if path:
            return _json(request, heldLocks(self.locks, _key(b"/".join(path)),
                                            monitor=self.monitor, waiters=waiters))
        return _json(request, heldLocks(
            self.locks, _key(_arg(request, b"key")),
            limit=_int(request, b"limit", LOCKS_LIMIT, 0, LOCKS_LIMIT),
            offset=_int(request, b"offset", 0, 0),
            monitor=self.monitor, waiters=waiters,
        ), compact=True)

    def render_POST(self, request: Request) -> bytes:
        path = self._path(request)
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
        token = self.locks.table.tokenOf(key)
        if token is None:
            return _json(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        peer = request.getClientAddress()
        who = f"admin@{getattr(peer, 'host', peer)}"
        if not self.monitor.forceRelease(self.locks, key, token, reason, who):
            return _json(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        return _json(request, {
            "key": key.decode("utf-8", "replace"),
            "released_token": token,
            "next_token": self.locks.table.tokenOf(key),
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
    def render_GET(self, request: Request) -> bytes:
        assert self.monitor is not None
        return _json(request, recentEvents(
            self.monitor,
            since=_int(request, b"since", 0, 0, 2**63),
            key=_key(_arg(request, b"key")),
            limit=_int(request, b"limit", EVENTS_LIMIT, 1, EVENTS_LIMIT),
        ), compact=True)


class DashboardDataResource(_NodeResource):
    def render_GET(self, request: Request) -> bytes:
        assert self.monitor is not None
        return _json(request, dashboard(self.locks, self.cluster, self.monitor,
                                        _int(request, b"seconds", 300, 1, 3600)),
                     compact=True)


class MetricsResource(Resource):
    isLeaf = True

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self.metrics = metrics

    def render_GET(self, request: Request) -> bytes:
        _secure(request)
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        return self.metrics.render()


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
             adminSecret: Optional[bytes] = None) -> Resource:
    """
    The resource tree; a L{Monitor} is made (and attached to C{locks})
    when none is given.
    """
    if monitor is None:
        monitor = Monitor(locks.clock, locks.table.clientOf)
        locks.activity.append(monitor)
    metrics = Metrics(locks, cluster, monitor)
    root = _Root()
    root.putChild(b"", PageResource())
    root.putChild(b"dashboard.json", DashboardDataResource(locks, cluster, monitor))
    root.putChild(b"status", StatusResource(locks, cluster, monitor))
    root.putChild(b"locks", LocksResource(locks, cluster, monitor, adminSecret))
    root.putChild(b"events", EventsResource(locks, cluster, monitor))
    root.putChild(b"metrics", MetricsResource(metrics))
    return root


def makeHTTPService(reactor: Any, description: str, locks: LockService,
                    cluster: Optional[ClusterView], monitor: Optional[Monitor] = None,
                    adminSecret: Optional[bytes] = None) -> StreamServerEndpointService:
    site = Site(makeRoot(locks, cluster, monitor, adminSecret))
    site.noisy = False
    site.log = lambda request: None  # type: ignore[method-assign, assignment]
    service = StreamServerEndpointService(serverFromString(reactor, description), site)
    raiseBindErrorsAtStart(service)
    return service


__all__: Tuple[str, ...] = ("makeRoot", "makeHTTPService", "status", "heldLocks")
