"""
The client over TLS: the node's certificate is verified against a CA, a
client certificate is presented when asked, and every TLS failure is the
documented NoConnection.  The server here is a tiny in-process TLS line
server (the real node's TLS is tested with the server).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.ssl import Certificate, CertificateOptions, PrivateCertificate
from twisted.protocols.basic import LineOnlyReceiver

from lockservice.client import ClientTLS, NoConnection, connect


def _name(common: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def makeCert(path: Path, name: str, issuer: Optional[Tuple[Any, Any]] = None,
             ca: bool = False, ip: Optional[str] = None) -> Tuple[Any, Any]:
    """
    Write C{name}.pem and C{name}.key under C{path}; signed by C{issuer}
    (certificate, key), else self-signed.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(issuer[0].subject if issuer else _name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)),
                                         x509.DNSName("localhost")]), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (path / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (path / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert, key


@pytest.fixture
def pki(tmp_path: Path) -> Dict[str, str]:
    ca = makeCert(tmp_path, "ca", ca=True)
    makeCert(tmp_path, "server", issuer=ca, ip="127.0.0.1")
    makeCert(tmp_path, "client", issuer=ca)
    makeCert(tmp_path, "other-ca", ca=True)
    return {n: str(tmp_path / n) for n in ("ca", "server", "client", "other-ca")}


class EchoNode(LineOnlyReceiver):
    """
    Answers P and I like a node; remembers what it was told.
    """

    delimiter = b"\n"
    seen: List[bytes]

    def lineReceived(self, line: bytes) -> None:
        self.factory.seen.append(line)  # type: ignore[attr-defined]
        op, _, rest = line.partition(b" ")
        if op in (b"P", b"I"):
            self.sendLine(line)


async def tlsServer(pki: Dict[str, str], requireClientCert: bool) -> Tuple[Any, Factory]:
    server = PrivateCertificate.loadPEM(
        Path(pki["server"] + ".pem").read_bytes() + Path(pki["server"] + ".key").read_bytes())
    ca = Certificate.loadPEM(Path(pki["ca"] + ".pem").read_bytes())
    options = CertificateOptions(
        privateKey=server.privateKey.original, certificate=server.original,
        **({"trustRoot": ca} if requireClientCert else {}))
    factory = Factory.forProtocol(EchoNode)
    factory.seen = []  # type: ignore[attr-defined]
    port = await SSL4ServerEndpoint(reactor, 0, options, interface="127.0.0.1").listen(factory)
    return port, factory


@pytest_twisted.ensureDeferred
async def test_tls_connection_verifies_the_node_and_names_itself(pki) -> None:  # type: ignore[no-untyped-def]
    port, factory = await tlsServer(pki, requireClientCert=False)
    client = connect(reactor, [f"127.0.0.1:{port.getHost().port}"], name="tls-client",
                     tls=ClientTLS.fromFiles(pki["ca"] + ".pem"))
    try:
        await client.whenConnected(timeout=10)
        assert await client.ping("over-tls") is True
        assert b"I tls-client" in factory.seen  # type: ignore[attr-defined]
    finally:
        await client.close()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_mutual_tls_with_a_client_certificate(pki) -> None:  # type: ignore[no-untyped-def]
    port, factory = await tlsServer(pki, requireClientCert=True)
    tls = ClientTLS.fromFiles(pki["ca"] + ".pem", pki["client"] + ".pem", pki["client"] + ".key")
    client = connect(reactor, [f"127.0.0.1:{port.getHost().port}"], tls=tls)
    try:
        await client.whenConnected(timeout=10)
        assert await client.ping() is True
    finally:
        await client.close()
        await port.stopListening()


@pytest.mark.parametrize("case", ["wrong-ca", "no-client-cert"])
@pytest_twisted.ensureDeferred
async def test_tls_failures_are_no_connection(pki, case) -> None:  # type: ignore[no-untyped-def]
    port, _ = await tlsServer(pki, requireClientCert=(case == "no-client-cert"))
    ca = pki["other-ca"] if case == "wrong-ca" else pki["ca"]
    client = connect(reactor, [f"127.0.0.1:{port.getHost().port}"],
                     tls=ClientTLS.fromFiles(ca + ".pem"))
    try:
        with pytest.raises(NoConnection) as info:
            await client.whenConnected(timeout=10, failFast=True)
        assert "TLS" in str(info.value)
        # An acquire too fails with the documented error, not an OpenSSL one.
        with pytest.raises(NoConnection):
            await client.acquire("k", 30, 2)
    finally:
        await client.close()
        await port.stopListening()


def test_unreadable_tls_files_are_a_value_error(pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="cannot read CA certificate"):
        ClientTLS.fromFiles(str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(ValueError, match="not a PEM file"):
        ClientTLS.fromFiles(str(tmp_path / "junk.pem"))
    with pytest.raises(ValueError, match="both"):
        ClientTLS.fromFiles(pki["ca"] + ".pem", cert=pki["client"] + ".pem")
