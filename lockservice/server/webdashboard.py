# -*- test-case-name: tests.server.test_http -*-
"""
The live dashboard: the static page at C{/} (shipped with the package,
allowed only its own script) and C{GET /dashboard.json}, everything it
shows in one answer.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources
from typing import Any, Dict, Iterator, Optional, Tuple

from twisted.web.resource import Resource
from twisted.web.server import Request

from lockservice.server.clusterview import ClusterView
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.server.webevents import keyStats
from lockservice.server.webjson import NodeResource, jsonPieces, queryInt, secure
from lockservice.server.webpages import heldLocks, status


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


class DashboardDataResource(NodeResource):
    def render_GET(self, request: Request) -> Any:
        assert self.monitor is not None
        return self.stream(request, jsonPieces(dashboardParts(
            self.locks, self.cluster, self.monitor,
            queryInt(request, b"seconds", 300, 1, 3600))))


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
            secure(request)
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"not found\n"
        secure(request, self.policy)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return self.page
