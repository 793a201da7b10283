# -*- test-case-name: tests.server.test_health -*-
"""
C{GET /health} and C{GET /ready}: probes for Kubernetes, load balancers
and monitoring.

  - C{/health} (liveness): 200 while the process runs its reactor.
  - C{/ready} (readiness): 200 only while the node does its job now: the
    active serving, or a standby in sync with a reachable active.  503
    otherwise, with a one-line C{reason}: catching up (syncing), handing
    off, distrusting its own clock, a standby that reaches no active and
    has not promoted, a peer refused for its protocol version, stopping.

An active that serves is ready even when it reaches no peer (the body says
C{peers_reachable: 0}).  A node whose state directory cannot be written
says so in the body (and on C{/status}, and in
C{lockservice_state_save_failures_total}), without failing the probe: it
still serves, and a restart would not make the disk writable.

Both bodies are small JSON objects built from a few attributes: no page
work, cheap enough to be asked every second.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Protocol, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.web.resource import Resource
from twisted.web.server import Request

from lockservice.core.election import ACTIVE, HANDING_OFF, LEAVING, STANDBY, SYNCING
from lockservice.server.clusterview import ClusterView
from lockservice.server.service import LockService


class StateSaves(Protocol):
    """
    What the probes read of the node's state directory
    (L{lockservice.state.NodeState}).
    """

    saveFailing: bool
    saveError: Optional[str]
    saveFailures: int


def stateFields(state: Optional[StateSaves]) -> Dict[str, Any]:
    """
    The state directory's health as fields of C{/status} and C{/ready}.
    """
    if state is None:
        return {"state_dir": None, "state_save_failing": False, "state_save_error": None,
                "state_save_failures": 0}
    directory = getattr(state, "directory", None)
    return {
        "state_dir": getattr(directory, "path", None),
        "state_save_failing": bool(state.saveFailing),
        "state_save_error": state.saveError if state.saveFailing else None,
        "state_save_failures": state.saveFailures,
    }


def _name(entry: bytes) -> str:
    return entry.decode("utf-8", "replace")


def readiness(locks: LockService, cluster: Optional[ClusterView],
              state: Optional[StateSaves] = None) -> Tuple[bool, Dict[str, Any]]:
    """
    Whether this node does its job now, and the body of C{/ready}.
    """
    role = locks.role
    body: Dict[str, Any] = {"ready": False, "reason": None, "role": role}
    if cluster is None:
        body.update(node=None, active=None, peers=0, peers_reachable=0)
        if role != ACTIVE:
            body["reason"] = f"{role}: not serving"
    else:
        address = cluster.activeAddress()
        active = _name(address) if address is not None else None
        reachable = sum(1 for view in cluster.views.values() if view.alive)
        body.update(node=_name(cluster.myEntry), active=active, peers=len(cluster.views),
                    peers_reachable=reachable)
        body["reason"] = _clusterReason(role, active, cluster)
    body["ready"] = body["reason"] is None
    body.update(stateFields(state))
    return body["ready"], body


def _clusterReason(role: str, active: Optional[str], cluster: ClusterView) -> Optional[str]:
    """
    Why a cluster node is not ready, or None when it is.
    """
    incompatible: List[Any] = list(getattr(cluster, "incompatiblePeers", None) or [])
    if incompatible:
        names = ", ".join(_name(p) if isinstance(p, bytes) else str(p) for p in incompatible)
        return f"peer(s) {names} refused for their protocol version"
    suspect = getattr(cluster, "clockSuspect", None)
    if suspect:
        return f"clock suspect: {suspect}"
    if role == ACTIVE:
        return None
    if role == HANDING_OFF:
        if getattr(cluster, "role", None) == ACTIVE:
            return "active, not serving until its live peers receive its stream"
        return "handing off: the active role is moving to another node"
    if role == SYNCING:
        if active is not None:
            return f"syncing: catching up with the active {active}"
        return "syncing: no active reachable yet"
    if role == STANDBY:
        if active is not None:
            return None  # in sync with the active it follows
        return "standby: no active reachable, and not promoted"
    if role == LEAVING:
        return "leaving: the node is stopping"
    return f"{role}: not serving"


def _answer(request: Request, code: int, body: Dict[str, Any]) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    # A probe's answer is for now only.
    request.setHeader(b"cache-control", b"no-store")
    request.setHeader(b"x-content-type-options", b"nosniff")
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


class HealthResource(Resource):
    """
    C{GET /health}: liveness.  Answered by the reactor, so an answer is
    proof that it runs.
    """

    isLeaf = True

    def __init__(self, locks: LockService) -> None:
        super().__init__()
        self.locks = locks

    def render_GET(self, request: Request) -> bytes:
        return _answer(request, 200, {"alive": True, "role": self.locks.role,
                                      "uptime_seconds": round(self.locks.uptime(), 3)})


class ReadyResource(Resource):
    """
    C{GET /ready}: readiness (see L{readiness}).
    """

    isLeaf = True

    def __init__(self, locks: LockService, cluster: Optional[ClusterView],
                 state: Optional[StateSaves] = None) -> None:
        super().__init__()
        self.locks = locks
        self.cluster = cluster
        self.state = state

    def render_GET(self, request: Request) -> bytes:
        ready, body = readiness(self.locks, self.cluster, self.state)
        return _answer(request, 200 if ready else 503, body)


class StateSaveCollector(Collector):
    """
    C{lockservice_state_save_failures_total} and
    C{lockservice_state_save_failing}.
    """

    def __init__(self, state: Optional[StateSaves]) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        state = self.state
        yield CounterMetricFamily(
            "lockservice_state_save_failures",
            "Writes of the --state-dir state file that failed since the start",
            value=state.saveFailures if state is not None else 0)
        yield GaugeMetricFamily(
            "lockservice_state_save_failing",
            "1 while the last write of the --state-dir state file failed",
            value=1 if state is not None and state.saveFailing else 0)


def register(root: Resource, locks: LockService, cluster: Optional[ClusterView],
             registry: Any, state: Optional[StateSaves] = None) -> None:
    """
    Add C{/health} and C{/ready} to the HTTP endpoint's C{root}, and the
    state directory's metrics to its Prometheus C{registry}.
    """
    root.putChild(b"health", HealthResource(locks))
    root.putChild(b"ready", ReadyResource(locks, cluster, state))
    registry.register(StateSaveCollector(state))
