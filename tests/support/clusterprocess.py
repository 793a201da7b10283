"""
Helpers for tests of real clusters.
"""

from __future__ import annotations

from lockservice.testing.harness import activeNodes


def onlyActive(cluster, expected) -> bool:  # type: ignore[no-untyped-def]
    return [n.port for n in activeNodes(cluster.nodes)] == [expected.port]
