# -*- test-case-name: tests.process.test_tls -*-
"""
TLS for every connection of the project: a node's listener, its peer
links, and clients.  Shared by the server, the cluster and the client; it
imports none of them.

Files are PEM.  A certificate file may hold a chain (the node's certificate
first, then intermediates); a CA file may hold several certificates (any of
them is trusted).  Every problem with a file is reported as one
L{TLSError} naming the file, never as a traceback of OpenSSL internals.

    node = NodeTLS.fromFiles("node.pem", "node.key", ca="ca.pem")
    factory = node.wrapServerFactory(factory)         # the client port
    endpoint = wrapClientTLS(node.peerOptions(host), endpoint)   # a peer link

    client = ClientTLS.fromFiles(ca="ca.pem", cert="me.pem", key="me.key")
    endpoint = wrapClientTLS(client.options(host), endpoint)

Twisted's TLS needs C{pyOpenSSL} and C{service_identity} (the
C{twisted[tls]} extra), both install requirements of lockservice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence

if TYPE_CHECKING:
    from twisted.internet.interfaces import IProtocolFactory
    from twisted.internet.ssl import Certificate, PrivateCertificate

_BEGIN_CERT = b"-----BEGIN CERTIFICATE-----"
_END_CERT = b"-----END CERTIFICATE-----"


class TLSError(ValueError):
    """
    A TLS file that cannot be read or used; the message is one line that
    names the file.
    """


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TLSError(f"cannot read {what} {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TLSError(f"{what} {path} is not a PEM file")
    return data


def _describe(e: BaseException) -> str:
    # pyOpenSSL errors are lists of (lib, function, reason) tuples.
    args = getattr(e, "args", ())
    if args and isinstance(args[0], list) and args[0] and isinstance(args[0][0], tuple):
        return "; ".join(str(item[-1]) for item in args[0])
    return str(e) or type(e).__name__


def loadCertificates(path: str, what: str = "certificate") -> List["Certificate"]:
    """
    Every certificate of a PEM file, in file order.

    @raise TLSError: the file cannot be read or holds no valid certificate.
    """
    from twisted.internet.ssl import Certificate

    data = _read(path, what)
    blocks: List[bytes] = []
    start = data.find(_BEGIN_CERT)
    while start != -1:
        end = data.find(_END_CERT, start)
        if end == -1:
            break
        blocks.append(data[start:end + len(_END_CERT)] + b"\n")
        start = data.find(_BEGIN_CERT, end)
    if not blocks:
        raise TLSError(f"{what} {path} holds no certificate")
    try:
        return [Certificate.loadPEM(block) for block in blocks]
    except Exception as e:
        raise TLSError(f"{what} {path} is not valid: {_describe(e)}") from None


def loadPrivateCertificate(
    certPath: str, keyPath: str
) -> "tuple[PrivateCertificate, List[Certificate]]":
    """
    A certificate with its private key, and the rest of the certificate
    file's chain.

    @raise TLSError: a file cannot be read, or the key does not match.
    """
    from OpenSSL.crypto import FILETYPE_PEM
    from twisted.internet.ssl import KeyPair, PrivateCertificate

    certificates = loadCertificates(certPath, "certificate")
    keyData = _read(keyPath, "private key")
    try:
        key = KeyPair.load(keyData, FILETYPE_PEM)
    except Exception as e:
        raise TLSError(f"private key {keyPath} is not valid: {_describe(e)}") from None
    try:
        private = PrivateCertificate.fromCertificateAndKeyPair(certificates[0], key)
    except Exception as e:
        raise TLSError(f"private key {keyPath} does not match certificate {certPath}: "
                       f"{_describe(e)}") from None
    return private, certificates[1:]


class NodeTLS:
    """
    A node's TLS: its certificate and key (C{--tls-cert}, C{--tls-key}) and,
    for mutual TLS, the CA (C{--tls-ca}) that clients' and peers'
    certificates must be signed by.

    @ivar certificate: the node's certificate with its key.
    @ivar chain: intermediates sent after it.
    @ivar authorities: the trusted CA certificates; empty when clients are
        not asked for a certificate.
    """

    def __init__(self, certificate: Optional["PrivateCertificate"],
                 chain: Sequence["Certificate"] = (),
                 authorities: Sequence["Certificate"] = ()) -> None:
        self.certificate = certificate
        self.chain = list(chain)
        self.authorities = list(authorities)

    @classmethod
    def fromFiles(cls, cert: str, key: str, ca: Optional[str] = None) -> "NodeTLS":
        """
        @raise TLSError: a file cannot be read or used.
        """
        private, chain = loadPrivateCertificate(cert, key)
        authorities = loadCertificates(ca, "CA certificate") if ca is not None else []
        node = cls(private, chain, authorities)
        node.serverOptions()  # any remaining problem shows now, at start
        return node

    @property
    def mutual(self) -> bool:
        """
        True when clients and peers must present a certificate signed by
        one of C{authorities}.
        """
        return bool(self.authorities)

    def serverOptions(self) -> Any:
        """
        The context factory of the node's listener: it presents the node's
        certificate and, under mutual TLS, refuses a client without a
        certificate signed by the CA.
        """
        from twisted.internet.ssl import CertificateOptions, trustRootFromCertificates

        if self.certificate is None:
            raise TLSError("a TLS listener needs a certificate and a key")
        options: dict = dict(
            privateKey=self.certificate.privateKey.original,
            certificate=self.certificate.original,
        )
        if self.chain:
            options["extraCertChain"] = [c.original for c in self.chain]
        if self.authorities:
            options["trustRoot"] = trustRootFromCertificates(self.authorities)
        try:
            return CertificateOptions(**options)
        except Exception as e:
            raise TLSError(f"cannot use the certificate: {_describe(e)}") from None

    def wrapServerFactory(self, factory: "IProtocolFactory") -> "IProtocolFactory":
        """
        C{factory} behind TLS: every byte it writes is encrypted.
        """
        from twisted.protocols.tls import TLSMemoryBIOFactory

        return TLSMemoryBIOFactory(self.serverOptions(), False, factory)

    def peerOptions(self, host: str) -> Any:
        """
        Client options for this node's link to the peer at C{host}.  Under
        mutual TLS the peer's certificate must be signed by the CA and name
        C{host}, and this node presents its own certificate; without a CA
        the link is encrypted but the peer is not verified (the shared
        secret of the peer handshake authenticates it).
        """
        if self.authorities:
            from twisted.internet.ssl import optionsForClientTLS, trustRootFromCertificates

            return optionsForClientTLS(
                host, trustRoot=trustRootFromCertificates(self.authorities),
                clientCertificate=self.certificate,
            )
        from twisted.internet.ssl import CertificateOptions

        if self.certificate is None:
            return CertificateOptions()
        return CertificateOptions(privateKey=self.certificate.privateKey.original,
                                  certificate=self.certificate.original)


class ClientTLS:
    """
    A client's TLS: the CA that signed the nodes' certificates and, for a
    node under mutual TLS, the client's own certificate.  A node's
    certificate must name the host (or IP address) the client dials.
    """

    def __init__(self, authorities: Sequence["Certificate"],
                 certificate: Optional["PrivateCertificate"] = None) -> None:
        self.authorities = list(authorities)
        self.certificate = certificate

    @classmethod
    def fromFiles(cls, ca: str, cert: Optional[str] = None,
                  key: Optional[str] = None) -> "ClientTLS":
        """
        @raise TLSError: a file cannot be read or used, or only one of
            C{cert} and C{key} is given.
        """
        if (cert is None) != (key is None):
            raise TLSError("a client certificate needs both a certificate and a key file")
        certificate = None
        if cert is not None and key is not None:
            certificate, _ = loadPrivateCertificate(cert, key)
        return cls(loadCertificates(ca, "CA certificate"), certificate)

    def options(self, host: str) -> Any:
        """
        The connection creator for a connection to C{host}: verifies the
        node's certificate against the CA and C{host}; presents the
        client's certificate if it has one.
        """
        from twisted.internet.ssl import optionsForClientTLS, trustRootFromCertificates

        return optionsForClientTLS(host, trustRoot=trustRootFromCertificates(self.authorities),
                                   clientCertificate=self.certificate)
