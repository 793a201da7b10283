# -*- test-case-name: tests.server.test_http -*-
"""
The HTTP endpoint (twisted.web): which page answers which path, and the
service that listens.  Each job is a module of its own:

    webpages      C{/status}, C{/locks} (holders and queues)
    webrelease    the admin's C{POST /locks/<key>/release}
    webevents     C{/events}, C{/locks/stats}
    webdashboard  the live dashboard at C{/}, fed by C{/dashboard.json}
    webmetrics    C{/metrics}
    webjson       JSON answers, made a step at a time; query parameters
    website       the site: requests at once, send buffers, request bodies
    health        C{/health} and C{/ready}
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import Cooperator
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request

from lockservice.internals import raiseBindErrorsAtStart
from lockservice.server import health
from lockservice.server.clusterview import ClusterView
from lockservice.server.metrics import Metrics
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.server.webdashboard import DashboardDataResource, PageResource
from lockservice.server.webevents import EventsResource
from lockservice.server.webjson import (  # noqa: F401 (the endpoint's API, and the tests')
    STALL_SECONDS,
    Items,
    answerJSON,
    jsonPieces,
    makeCooperator,
)
from lockservice.server.webmetrics import MetricsResource
from lockservice.server.webpages import (  # noqa: F401 (the endpoint's API)
    LocksResource,
    StatusResource,
    heldLocks,
    status,
)
from lockservice.server.website import MAX_BODY, NodeSite  # noqa: F401 (the tests')


class _NotFound(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return answerJSON(request, {"error": "no such page"}, 404)


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
