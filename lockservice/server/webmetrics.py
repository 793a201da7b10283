# -*- test-case-name: tests.server.test_http -*-
"""
C{GET /metrics}: the Prometheus text of the node's metrics
(L{lockservice.server.metrics}), rendered at most once per
L{METRICS_TTL} and written a piece per step.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from lockservice.server.metrics import CONTENT_TYPE, Metrics
from lockservice.server.webjson import Answer, secure

# /metrics is rendered at most once per this many seconds (a scrape shows
# figures at most this old), and written in pieces of this size.
METRICS_TTL = 1.0
METRICS_PIECE = 16 * 1024


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
        secure(request)
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        request.setHeader(b"content-length", b"%d" % len(body))
        pieces = (body[i:i + METRICS_PIECE] for i in range(0, len(body), METRICS_PIECE))
        Answer(request, pieces, self.cooperator, self.clock)
        return NOT_DONE_YET
