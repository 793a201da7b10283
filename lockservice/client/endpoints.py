# -*- test-case-name: tests.test_client_tls -*-
"""
From an address to a client endpoint: plain TCP, or TLS verified against a
CA (optionally presenting a client certificate, for a node started with
C{--tls-ca}).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from twisted.internet.interfaces import IStreamClientEndpoint

from lockservice.tcp import clientEndpoint

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


class ClientTLS:
    """
    TLS settings of a client: the CA that signed the nodes' certificates
    and, for mutual TLS, the client's own certificate and key (PEM files).
    A node's certificate must name the host (or IP address) the client
    dials.

    @raise ValueError: at construction, when a file cannot be read or
        parsed (one clear message, naming the file).
    """

    def __init__(self, ca: str, cert: Optional[str] = None, key: Optional[str] = None) -> None:
        from twisted.internet.ssl import Certificate, PrivateCertificate

        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both a certificate and a key file")
        self.trustRoot = Certificate.loadPEM(_read(ca, "CA certificate"))
        self.clientCertificate: Optional[Any] = None
        if cert is not None and key is not None:
            try:
                self.clientCertificate = PrivateCertificate.loadPEM(
                    _read(cert, "client certificate") + b"\n" + _read(key, "client key"))
            except Exception as e:
                raise ValueError(f"cannot use client certificate {cert} with key {key}: "
                                 f"{_describe(e)}") from None

    def options(self, host: str) -> Any:
        from twisted.internet.ssl import optionsForClientTLS

        return optionsForClientTLS(host, trustRoot=self.trustRoot,
                                   clientCertificate=self.clientCertificate)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"{what} {path} is not a PEM file")
    return data


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__


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

        return wrapClientTLS(tls.options(host), endpoint)  # type: ignore[no-any-return]

    return endpointFor
