"""
TLS on the client port: real C{twistd} nodes with a CA and certificates
made in the test, clients speaking TLS through Python's C{ssl}, and a TCP
proxy that records every raw byte so that not one answer may cross in the
clear.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from typing import List, Optional

import pytest

from lockservice.testing.certs import TestCA
from lockservice.testing.harness import LineClient, freePort, twistdEnvironment
from lockservice.tls import ClientTLS, NodeTLS, TLSError


@pytest.fixture
def ca(tmp_path) -> TestCA:  # type: ignore[no-untyped-def]
    return TestCA(tmp_path)


def clientContext(ca: TestCA, cert: Optional[str] = None,
                  key: Optional[str] = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca.cert)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


class RecordingProxy:
    """
    A TCP forwarder that keeps every byte the node sent.
    """

    def __init__(self, targetPort: int) -> None:
        self.targetPort = targetPort
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.fromNode = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.targetPort))
            threading.Thread(target=self._pump, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if record:
                    with self.lock:
                        self.fromNode += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()

    def recorded(self) -> bytes:
        with self.lock:
            return bytes(self.fromNode)


def tlsRecords(stream: bytes) -> List[int]:
    """
    Parse C{stream} as TLS records; their content types.

    @raise AssertionError: when any byte is not part of a TLS record.
    """
    types = []
    offset = 0
    while offset < len(stream):
        header = stream[offset:offset + 5]
        assert len(header) == 5, f"truncated record at {offset}"
        kind, major, length = header[0], header[1], int.from_bytes(header[3:5], "big")
        assert kind in (20, 21, 22, 23) and major == 3, f"not a TLS record at {offset}"
        offset += 5 + length
        types.append(kind)
    assert offset == len(stream)
    return types


def exercise(port: int, context: ssl.SSLContext) -> List[bytes]:
    """
    Every kind of answer over TLS: at once, in a batch, a FIFO hand-over
    and a timeout (both written by the node outside the asker's input).

    @return: marker strings that must never appear in clear.
    """
    with LineClient(port, tls=context) as a, LineClient(port, tls=context) as b:
        assert a.ask(b"I sniffed-name") == b"I sniffed-name"
        assert a.ask(b"P plaintext-marker") == b"P plaintext-marker"
        token = a.ask(b"A sniffed-key 30 0").split()[2]
        b.send(b"A sniffed-key 30 0\nA sniffed-key 30 0.2\nP queued\n")
        assert b.readline(timeout=10) == b"P queued"
        assert a.ask(b"N sniffed-key " + token + b" 30") == b"N sniffed-key OK"
        assert a.ask(b"R sniffed-key " + token) == b"R sniffed-key OK"
        handed = b.readline(timeout=10).split()
        assert handed[:2] == [b"A", b"sniffed-key"]
        assert b.readline(timeout=10) == b"T sniffed-key"
        a.send(b"P one\nP two\nA batch 1 0\n")
        assert [a.readline(timeout=10) for _ in range(3)][:2] == [b"P one", b"P two"]
    # Whole answers, not 2-byte fragments: "OK" or "T " turn up in a few KB
    # of ciphertext by chance (a flaky test, seen ~1 run in 3).
    return [b"plaintext-marker", b"sniffed", token, handed[2], b"R sniffed-key OK", b"P one",
            b"T sniffed-key"]


def assertNoPlaintext(recorded: bytes, markers: List[bytes]) -> None:
    assert recorded, "the proxy saw nothing"
    for marker in markers:
        assert marker not in recorded, f"{marker!r} crossed the wire in clear"
    types = tlsRecords(recorded)
    assert 23 in types  # application data, encrypted


def test_tls_cert_and_key_encrypt_every_answer(spawn, ca) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    context = clientContext(ca)
    node = spawn(args=["--tls-cert", issued.cert, "--tls-key", issued.key], tls=context)
    proxy = RecordingProxy(node.port)
    try:
        markers = exercise(proxy.port, context)
    finally:
        proxy.close()
    assertNoPlaintext(proxy.recorded(), markers)


def test_listen_ssl_string_encrypts_every_answer(spawn, ca) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    context = clientContext(ca)
    port = freePort()
    node = spawn(port=port, tls=context, args=[
        "--listen", f"ssl:{port}:interface=127.0.0.1:privateKey={issued.key}:"
                    f"certKey={issued.cert}"])
    proxy = RecordingProxy(node.port)
    try:
        markers = exercise(proxy.port, context)
    finally:
        proxy.close()
    assertNoPlaintext(proxy.recorded(), markers)


def test_a_plaintext_client_gets_no_answer(spawn, ca) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    node = spawn(args=["--tls-cert", issued.cert, "--tls-key", issued.key],
                 tls=clientContext(ca))
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"P hello\nA k 30 0\n")
        received = b""
        try:
            while True:
                data = s.recv(4096)
                if not data:
                    break
                received += data
        except (ConnectionResetError, TimeoutError):
            pass
    assert b"P hello" not in received and b"A k" not in received


def refused(port: int, context: ssl.SSLContext) -> bool:
    """
    True when a TLS client with C{context} gets no answer at all.
    """
    try:
        with LineClient(port, timeout=10, tls=context) as c:
            c.ask(b"P let-me-in")
    except (ssl.SSLError, ConnectionError, OSError):
        return True
    return False


def test_mutual_tls_refuses_clients_without_a_certificate_signed_by_the_ca(
        spawn, ca, tmp_path) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    client = ca.issue("client", hosts=None)
    (tmp_path / "other").mkdir()
    stranger = TestCA(tmp_path / "other", name="another CA").issue("stranger", hosts=None)
    good = clientContext(ca, client.cert, client.key)
    node = spawn(args=["--tls-cert", issued.cert, "--tls-key", issued.key,
                       "--tls-ca", ca.cert], tls=good)
    with LineClient(node.port, tls=good) as c:
        assert c.ask(b"P welcome") == b"P welcome"
    assert refused(node.port, clientContext(ca))
    assert refused(node.port, clientContext(ca, stranger.cert, stranger.key))
    # And the node still serves the good client afterwards.
    with LineClient(node.port, tls=good) as c:
        assert c.ask(b"A k 30 0").startswith(b"A k ")


def test_a_client_verifying_against_another_ca_refuses_the_node(spawn, ca, tmp_path) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    node = spawn(args=["--tls-cert", issued.cert, "--tls-key", issued.key],
                 tls=clientContext(ca))
    (tmp_path / "other").mkdir()
    other = TestCA(tmp_path / "other", name="another CA")
    with pytest.raises(ssl.SSLCertVerificationError):
        LineClient(node.port, tls=clientContext(other))


def runTwistd(args: List[str]) -> "subprocess.CompletedProcess[bytes]":
    return subprocess.run(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
         "-n", "--pidfile=", "lockservice"] + args,
        env=twistdEnvironment(), capture_output=True, timeout=60,
    )


@pytest.mark.parametrize("problem", ["missing", "garbage", "mismatch", "lonely-cert",
                                     "ca-alone", "both"])
def test_bad_tls_options_are_one_line_and_exit_2(ca, tmp_path, problem) -> None:  # type: ignore[no-untyped-def]
    issued, other = ca.issue("node"), ca.issue("other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    args, message = {
        "missing": (["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", issued.key],
                    "cannot read certificate"),
        "garbage": (["--tls-cert", str(garbage), "--tls-key", issued.key],
                    "is not valid"),
        "mismatch": (["--tls-cert", issued.cert, "--tls-key", other.key], "does not match"),
        "lonely-cert": (["--tls-cert", issued.cert], "go together"),
        "ca-alone": (["--tls-ca", ca.cert], "--tls-ca needs"),
        "both": (["--tls-cert", issued.cert, "--tls-key", issued.key,
                  "--listen", f"ssl:{freePort()}:privateKey={issued.key}:certKey={issued.cert}"],
                 "not both"),
    }[problem]
    result = runTwistd(args)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert b"Traceback" not in result.stdout + result.stderr


# -- the shared module, in process -----------------------------------------------


def test_node_tls_reports_file_problems_as_one_line(ca, tmp_path) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    with pytest.raises(TLSError, match="cannot read CA certificate"):
        NodeTLS.fromFiles(issued.cert, issued.key, str(tmp_path / "missing"))
    notPem = tmp_path / "x.pem"
    notPem.write_text("hello")
    with pytest.raises(TLSError, match="is not a PEM file"):
        NodeTLS.fromFiles(str(notPem), issued.key)
    with pytest.raises(TLSError, match="needs both"):
        ClientTLS.fromFiles(ca.cert, cert=issued.cert)


def test_node_tls_reads_a_chain_and_a_ca_bundle(ca, tmp_path) -> None:  # type: ignore[no-untyped-def]
    issued = ca.issue("node")
    (tmp_path / "other").mkdir()
    other = TestCA(tmp_path / "other", name="another CA")
    chain = tmp_path / "chain.pem"
    chain.write_bytes(open(issued.cert, "rb").read() + open(ca.cert, "rb").read())
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(open(other.cert, "rb").read() + open(ca.cert, "rb").read())
    node = NodeTLS.fromFiles(str(chain), issued.key, str(bundle))
    assert len(node.chain) == 1 and len(node.authorities) == 2 and node.mutual
    assert NodeTLS.fromFiles(issued.cert, issued.key).mutual is False



@pytest.mark.parametrize("mutual", [True, False])
def test_peer_links_of_a_tls_cluster(ca, tmp_path, mutual) -> None:  # type: ignore[no-untyped-def]
    """
    Two TLS nodes find each other (the peer links speak TLS to a port that
    speaks nothing else): the standby redirects to the active, and a grant
    reaches it.
    """
    from lockservice.testing.harness import Node, freePorts, waitFor

    issued = ca.issue("node")
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tls-test\n")
    client = ca.issue("client", hosts=None)
    context = clientContext(ca, client.cert, client.key) if mutual else clientContext(ca)
    args = ["--tls-cert", issued.cert, "--tls-key", issued.key, "--secret", str(secret)]
    if mutual:
        args += ["--tls-ca", ca.cert]
    ports = freePorts(2)
    nodes = [Node(p, peers=ports, args=args, logDir=str(tmp_path), name=f"tls{i}", tls=context)
             for i, p in enumerate(ports)]
    try:
        for n in nodes:
            n.start()

        def redirected() -> bool:
            with LineClient(ports[1], tls=context) as c:
                return c.ask(b"A k 30 0") == f"M A k 127.0.0.1:{ports[0]}".encode()

        waitFor(redirected, timeout=20, what="the standby redirects to the active")
        with LineClient(ports[0], tls=context) as c:
            assert c.ask(b"A k 30 0").startswith(b"A k ")
    finally:
        for n in nodes:
            n.stop()
