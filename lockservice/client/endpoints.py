# -*- test-case-name: tests.client.test_client_tls -*-
"""
From an address to a client endpoint: plain TCP, or TLS verified against a
CA (optionally presenting a client certificate, for a node started with
C{--tls-ca}).  The TLS settings are L{lockservice.tls.ClientTLS}, shared
with the node's peer links.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from twisted.internet.interfaces import IStreamClientEndpoint

from lockservice.tcp import clientEndpoint
from lockservice.tls import ClientTLS

Address = Union[str, IStreamClientEndpoint]
EndpointFactory = Callable[[Address], IStreamClientEndpoint]

CONNECT_TIMEOUT = 5.0


def splitAddress(address: str) -> "tuple[str, int]":
    """
    C{host:port} (C{[v6]:port} too) to (host, port).

    @raise ValueError: when it is not of that form.
    """
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not port.isascii() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def endpointFactory(reactor: Any, tls: Optional[ClientTLS] = None,
                    timeout: float = CONNECT_TIMEOUT) -> EndpointFactory:
    """
    The default C{endpointFor}: C{host:port} strings become TCP (or TLS)
    endpoints; endpoint objects are used as they are.
    """
    def endpointFor(address: Address) -> IStreamClientEndpoint:
        if not isinstance(address, str):
            return address
        host, port = splitAddress(address)
        endpoint = clientEndpoint(reactor, host, port, timeout=timeout)
        if tls is None:
            return endpoint  # type: ignore[no-any-return]
        from twisted.internet.endpoints import wrapClientTLS

        # The reactor given, not the global one: the blocking and asyncio
        # faces run a private reactor in a thread, and TLS schedules its
        # small-write flushes on this clock.
        try:
            return wrapClientTLS(tls.options(host), endpoint, clock=reactor)  # type: ignore[no-any-return]
        except TypeError:  # a Twisted without the clock argument
            return wrapClientTLS(tls.options(host), endpoint)  # type: ignore[no-any-return]

    return endpointFor
