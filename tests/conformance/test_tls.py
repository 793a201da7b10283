"""
TLS and mutual TLS: a driver given --tls-ca verifies the node's certificate
against that CA and against the host in --addrs (an IP address matches an
IP SAN); a wrong CA, a certificate for another host, or a missing client
certificate on a mutual-TLS node is no_connection.
"""

from __future__ import annotations

import ssl
from typing import Dict, Iterator

import pytest

from lockservice.testing.certs import TestCA

from .conftest import NodeBox, start_node
from .util import err, ok, token_of, value_of

pytestmark = pytest.mark.tls


class TLSWorld:
    def __init__(self, tmp) -> None:
        self.ca = TestCA(tmp, name="conformance CA")
        self.other = TestCA(tmp, name="another CA")
        self.server = self.ca.issue("node", hosts=["127.0.0.1"])
        self.elsewhere = self.ca.issue("elsewhere", hosts=["127.0.0.2", "node.invalid"])
        self.client = self.ca.issue("client", hosts=None)
        self.stranger = self.other.issue("stranger", hosts=None)
        self.nodes: Dict[str, NodeBox] = {}

    def context(self, client_cert: bool = False, check: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca.cert)
        if not check:
            ctx.check_hostname = False
        if client_cert:
            ctx.load_cert_chain(self.client.cert, self.client.key)
        return ctx


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Iterator[TLSWorld]:
    world = TLSWorld(tmp_path_factory.mktemp("ca"))
    try:
        world.nodes["tls"] = start_node(
            str(tmp_path_factory.mktemp("tls")),
            ["--tls-cert", world.server.cert, "--tls-key", world.server.key],
            tls=world.context(), big_tokens=True)
        world.nodes["mtls"] = start_node(
            str(tmp_path_factory.mktemp("mtls")),
            ["--tls-cert", world.server.cert, "--tls-key", world.server.key,
             "--tls-ca", world.ca.cert],
            tls=world.context(client_cert=True), big_tokens=True)
        world.nodes["elsewhere"] = start_node(
            str(tmp_path_factory.mktemp("elsewhere")),
            ["--tls-cert", world.elsewhere.cert, "--tls-key", world.elsewhere.key],
            tls=world.context(check=False))
        yield world
    finally:
        for box in world.nodes.values():
            box.node.stop()


def _round_trip(d, box: NodeBox, k: str) -> None:
    t = token_of(d.call("acquire", key=k, lease=30, wait=5, timeout=15))
    assert box.tokens(k) == [int(t)]
    r = d.call("observe", key=k, token="0", wait=5)
    assert token_of(r) == t
    ok(d.call("release", key=k, token=t))
    assert box.holders(k) == []


def test_tls_verified_against_ca_and_ip_san(kind, tls, start_driver, key):
    box = tls.nodes["tls"]
    d = start_driver(box.address, name="tls-client", args=["--tls-ca", tls.ca.cert])
    _round_trip(d, box, key())
    e = key("e")
    t = token_of(d.call("campaign", election=e, value="over-tls", lease=5))
    assert value_of(box.holders(e)[0]["holder"]) == "over-tls"
    r = d.call("leader", election=e)
    assert r.get("value") == "over-tls" and r.get("token") == t
    ok(d.call("resign", election=e))


def test_mutual_tls_with_client_certificate(kind, tls, start_driver, key):
    box = tls.nodes["mtls"]
    d = start_driver(box.address, args=["--tls-ca", tls.ca.cert, "--tls-cert", tls.client.cert,
                                        "--tls-key", tls.client.key])
    _round_trip(d, box, key())


def test_tls_refusals_are_no_connection(kind, tls, start_driver, key):
    cases = {
        "wrong CA": (tls.nodes["tls"], ["--tls-ca", tls.other.cert]),
        "certificate for another host": (tls.nodes["elsewhere"], ["--tls-ca", tls.ca.cert]),
        "no client certificate on mutual TLS": (tls.nodes["mtls"], ["--tls-ca", tls.ca.cert]),
        "client certificate of another CA": (
            tls.nodes["mtls"], ["--tls-ca", tls.ca.cert, "--tls-cert", tls.stranger.cert,
                                "--tls-key", tls.stranger.key]),
        "plain text to a TLS node": (tls.nodes["tls"], []),
    }
    running = {}
    for what, (box, args) in cases.items():
        d = start_driver(box.address, args=args)
        k = key("refused")
        running[what] = (d, d.cmd("acquire", key=k, lease=30, wait=0), box, k)
    for what, (d, ident, box, k) in running.items():
        line = d.result_line(ident, 13)
        err(line.obj, "no_connection")
        assert d.elapsed(ident, line) <= 11.5, f"{what}: within 10 s"
        assert box.holders(k) == [], f"{what}: nothing granted"
