"""
The client over TLS: the node's certificate is verified against a CA, a
client certificate is presented when asked, and every TLS failure is the
documented NoConnection.  The server here is a tiny in-process TLS line
server (the real node's TLS is tested with the server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.ssl import Certificate, CertificateOptions, PrivateCertificate
from twisted.protocols.basic import LineOnlyReceiver

from lockservice.client import ClientTLS, NoConnection, connect


@pytest.fixture
def pki(tmp_path: Path) -> Dict[str, str]:
    """
    A CA, a node certificate for 127.0.0.1, a client certificate, and a
    second, unrelated CA (paths without the .pem/.key suffix).
    """
    from lockservice.testing.certs import TestCA

    (tmp_path / "ca").mkdir()
    (tmp_path / "other").mkdir()
    ca = TestCA(tmp_path / "ca")
    other = TestCA(tmp_path / "other", name="other CA")
    server, client = ca.issue("server"), ca.issue("client")
    return {"ca": ca.cert[:-4], "other-ca": other.cert[:-4],
            "server": server.cert[:-4], "client": client.cert[:-4]}


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
        assert any(line.startswith(b"I tls-client#")
                   for line in factory.seen)  # type: ignore[attr-defined]
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
