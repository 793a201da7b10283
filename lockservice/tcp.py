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


def clientEndpoint(reactor: Any, host: str, port: int, timeout: float) -> Any:
    """
    A client endpoint for C{host:port}.  An IP literal gets a plain TCP
    endpoint: HostnameEndpoint would first resolve it in a thread and, in
    our measurements, take about a second to report a refused connection,
    which slows down (re)joining peers.
    """
    from twisted.internet.abstract import isIPAddress, isIPv6Address
    from twisted.internet.endpoints import (
        HostnameEndpoint,
        TCP4ClientEndpoint,
        TCP6ClientEndpoint,
    )

    host = host.strip("[]")
    if isIPAddress(host):
        return TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    if isIPv6Address(host):
        return TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
    return HostnameEndpoint(reactor, host, port, timeout=timeout)
