"""
Socket options shared by every connection of the project.
"""

from __future__ import annotations

from typing import Any


def noDelay(transport: Any) -> None:
    """
    Turn Nagle's algorithm off: answers and replication lines are small
    writes, and Nagle holding one back until the peer's delayed ACK (40 ms
    on Linux) would add that to a grant's latency.
    """
    setTcpNoDelay = getattr(transport, "setTcpNoDelay", None)
    if setTcpNoDelay is not None:
        setTcpNoDelay(True)
