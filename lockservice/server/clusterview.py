"""
What the status page and the metrics read of the cluster layer.

The server never imports the cluster package (an import-linter contract):
the cluster object handed to the HTTP resources only has to look like this.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol

from lockservice.core.election import PeerView


class ClusterView(Protocol):
    """
    C{views[j].secretMismatch} is True while peer j answers this node's
    handshakes with another --secret (shown per peer on /status).
    """

    myEntry: bytes
    peers: List[bytes]
    term: int
    promotions: int
    views: Dict[int, PeerView]
    lastHeard: Dict[int, float]
    # Why this node distrusts its own clock and stands by, or None.
    clockSuspect: Optional[str]
    @property
    def state(self) -> str:
        """
        Its state (lockservice.cluster.serving), shown on /status.
        """

    def activeAddress(self) -> Optional[bytes]: ...


# -- replication's figures (the cluster's replication stream) -------------------


def replication(cluster: object) -> Optional[Dict[str, Any]]:
    """
    What the cluster's replication stream (its C{stream}, a
    L{lockservice.cluster.replication.Stream}) tells /status and /metrics:
    its mode, how many standbys answers wait for now (in sync), and the
    median and 99th percentile of how long the latest writes waited for
    every in-sync standby's acknowledgement (C{--replication ack}; None
    with C{sent}, or before any wait).  None without a stream.
    """
    stream: Any = getattr(cluster, "stream", None)
    if stream is None:
        return None
    p50, p99 = stream.ackWaits()
    return {
        "mode": "ack" if stream.acknowledged else "sent",
        "in_sync_standbys": stream.inSync(),
        "ack_wait_p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "ack_wait_p99_ms": None if p99 is None else round(p99 * 1000, 3),
    }
