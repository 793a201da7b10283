# -*- test-case-name: tests.server.test_http -*-
"""
The HTTP endpoint's site: how many requests are answered at once (the
rest: 503 at once), small send buffers per connection, and request
bodies refused (413) before they are read.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.web.http import HTTPChannel
from twisted.web.resource import IResource
from twisted.web.server import Request, Site

from lockservice.server.webjson import dumps, secure

# Unsent bytes Twisted keeps per HTTP connection beyond the kernel's
# socket buffer before the answer is paused (its default is 64 KiB).
SEND_BUFFER = 16 * 1024
# The kernel's send buffer of an HTTP connection (Linux doubles it).
KERNEL_SEND_BUFFER = 64 * 1024
# Requests in progress at once; the next ones are answered 503 at once.
MAX_REQUESTS = 256


# Request bodies larger than this (or of unknown length: chunked) are
# refused (413) before one byte of them is read; the force-release
# reason is the only body any page reads.
MAX_BODY = 8 * 1024


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
            body = dumps({"error": f"request bodies over {self.maxBody} bytes "
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
            secure(self)
            self.setHeader(b"content-type", b"application/json")
            self.setHeader(b"retry-after", b"1")
            self.write(dumps({"error": "too many HTTP requests at once; retry"}) + b"\n")
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
