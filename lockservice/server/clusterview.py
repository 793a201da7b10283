"""
What the status page and the metrics read of the cluster layer.

The server never imports the cluster package (an import-linter contract):
the cluster object handed to the HTTP resources only has to look like this.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Protocol

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
