# -*- test-case-name: tests.test_http -*-
"""
The HTTP status endpoint (twisted.web): C{/status}, C{/locks},
C{/metrics} and a small self-refreshing page at C{/}.
"""

from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Optional

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import serverFromString
from twisted.web.pages import notFound
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

import lockservice
from lockservice.internals import raiseBindErrorsAtStart
from lockservice.server.clusterview import ClusterView
from lockservice.server.metrics import CONTENT_TYPE, Metrics
from lockservice.server.service import LockService

LOCKS_LIMIT = 1000


def status(locks: LockService, cluster: Optional[ClusterView]) -> Dict[str, Any]:
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
    return {
        "node": node,
        "role": locks.role,
        "term": term,
        "active": active,
        "peers": peers,
        "held_keys": len(locks.table),
        "waiters": locks.table.waiterCount,
        "connections": len(locks.connections),
        "highest_token": locks.table.tokens.last,
        "uptime_seconds": round(locks.uptime(), 3),
        "version": lockservice.__version__,
    }


def heldLocks(locks: LockService, key: Optional[bytes] = None,
              limit: int = LOCKS_LIMIT) -> Dict[str, Any]:
    """
    Who holds what: token, age, remaining lease, queue length per key.
    """
    now = locks.clock.seconds()
    table = locks.table

    def describe(k: bytes, holder: Any) -> Dict[str, Any]:
        return {
            "key": k.decode("utf-8"),
            "token": holder.token,
            "age_seconds": round(now - holder.grantedAt, 3),
            "remaining_seconds": round(max(0.0, holder.expiresAt - now), 3),
            "queue_length": table.queueLength(k),
        }

    if key is not None:
        holder = table.holder(key)
        if holder is None:
            return {"key": key.decode("utf-8", "replace"), "held": False}
        return dict(describe(key, holder), held=True)
    listed: List[Dict[str, Any]] = []
    for k, holder in table.holders():
        if len(listed) >= limit:
            break
        listed.append(describe(k, holder))
    return {"count": len(table), "truncated": len(table) > len(listed), "locks": listed}


def _json(request: Request, data: Any) -> bytes:
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(data, indent=2).encode() + b"\n"


class _NodeResource(Resource):
    """
    A leaf resource that reads this node's lock service and cluster.
    """

    isLeaf = True

    def __init__(self, locks: LockService, cluster: Optional[ClusterView]) -> None:
        super().__init__()
        self.locks = locks
        self.cluster = cluster


class StatusResource(_NodeResource):
    def render_GET(self, request: Request) -> bytes:
        return _json(request, status(self.locks, self.cluster))


class LocksResource(_NodeResource):
    def render_GET(self, request: Request) -> bytes:
        args = request.args or {}
        key = args.get(b"key", [None])[0]
        try:
            limit = int(args.get(b"limit", [LOCKS_LIMIT])[0])
        except ValueError:
            request.setResponseCode(400)
            return _json(request, {"error": "limit must be an integer"})
        return _json(request, heldLocks(self.locks, key, limit))


class MetricsResource(Resource):
    isLeaf = True

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self.metrics = metrics

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        return self.metrics.render()


class PageResource(_NodeResource):
    """
    A human-readable page of the same status; refreshes every 2 seconds.
    """

    def render_GET(self, request: Request) -> bytes:
        s = status(self.locks, self.cluster)
        e = html.escape
        rows = "".join(
            f"<tr><td>{e(p['address'])}</td><td>{p['priority']}</td><td>{e(p['role'])}</td>"
            f"<td>{'yes' if p['alive'] else 'no'}</td><td>{p['term']}</td>"
            f"<td>{p['last_heard_seconds_ago']}</td></tr>"
            for p in s["peers"]
        )
        held = heldLocks(self.locks, limit=50)["locks"]
        lockRows = "".join(
            f"<tr><td>{e(h['key'])}</td><td>{h['token']}</td><td>{h['age_seconds']}</td>"
            f"<td>{h['remaining_seconds']}</td><td>{h['queue_length']}</td></tr>"
            for h in held
        )
        page = f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>lockservice {e(str(s['node'] or ''))}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 10px;text-align:left}}</style>
</head><body>
<h1>lockservice {e(str(s['node'] or 'single node'))}</h1>
<p>role <b>{e(s['role'])}</b> &middot; term {s['term']} &middot; active {e(str(s['active']))}
&middot; held keys {s['held_keys']} &middot; waiters {s['waiters']}
&middot; connections {s['connections']} &middot; highest token {s['highest_token']}
&middot; up {s['uptime_seconds']:.0f} s &middot; version {e(s['version'])}</p>
<h2>Peers</h2><table><tr><th>address</th><th>priority</th><th>role</th><th>alive</th>
<th>term</th><th>last heard (s ago)</th></tr>{rows}</table>
<h2>Held locks (first 50)</h2><table><tr><th>key</th><th>token</th><th>age (s)</th>
<th>remaining (s)</th><th>queue</th></tr>{lockRows}</table>
<p><a href="/status">/status</a> &middot; <a href="/locks">/locks</a> &middot;
<a href="/metrics">/metrics</a></p>
</body></html>
"""
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return page.encode()


class _Root(Resource):
    def getChild(self, path: bytes, request: Request) -> IResource:  # type: ignore[override]
        return notFound()


def makeRoot(locks: LockService, cluster: Optional[ClusterView]) -> Resource:
    metrics = Metrics(locks, cluster)
    wrapper = _Root()
    wrapper.putChild(b"", PageResource(locks, cluster))
    wrapper.putChild(b"status", StatusResource(locks, cluster))
    wrapper.putChild(b"locks", LocksResource(locks, cluster))
    wrapper.putChild(b"metrics", MetricsResource(metrics))
    return wrapper


def makeHTTPService(reactor: Any, description: str, locks: LockService,
                    cluster: Optional[ClusterView]) -> StreamServerEndpointService:
    site = Site(makeRoot(locks, cluster))
    site.noisy = False
    site.log = lambda request: None  # type: ignore[method-assign, assignment]
    service = StreamServerEndpointService(serverFromString(reactor, description), site)
    raiseBindErrorsAtStart(service)
    return service
