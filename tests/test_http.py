"""
The HTTP status endpoint: resources through treq's StubTreq (no sockets),
plus one real treq request against a running node.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq
from treq.testing import StubTreq

from lockservice.server.http import makeRoot
from lockservice.testing.harness import LineClient, Node, freePort, waitFor
from tests.test_protocol import Node as ProtocolNode


def fetch(stub: StubTreq, path: str):  # type: ignore[no-untyped-def]
    responses: list = []  # type: ignore[type-arg]
    stub.get("http://node" + path).addCallback(
        lambda r: r.content().addCallback(lambda body: responses.append((r, body)))
    )
    stub.flush()
    assert responses, f"no response for {path}"
    return responses[0]


@pytest.fixture
def node() -> ProtocolNode:
    return ProtocolNode()


def test_status_json(node: ProtocolNode) -> None:
    stub = StubTreq(makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 0")
    node.clock.advance(5)
    response, body = fetch(stub, "/status")
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    data = json.loads(body)
    assert data["role"] == "active"
    assert data["held_keys"] == 1
    assert data["waiters"] == 1
    assert data["connections"] == 2
    assert data["highest_token"] == 1_700_000_000_000_000
    assert data["uptime_seconds"] == 5
    assert data["peers"] == []
    assert "version" in data


def test_locks_says_who_holds_what(node: ProtocolNode) -> None:
    stub = StubTreq(makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"A orders/1 30 0")
    a.ask(b"A orders/2 10 0")
    b.ask(b"A orders/1 30 0")
    node.clock.advance(4)
    response, body = fetch(stub, "/locks")
    data = json.loads(body)
    assert data["count"] == 2 and data["truncated"] is False
    byKey = {entry["key"]: entry for entry in data["locks"]}
    assert byKey["orders/1"] == {
        "key": "orders/1", "token": 1_700_000_000_000_000, "age_seconds": 4,
        "remaining_seconds": 26, "queue_length": 1,
    }
    assert byKey["orders/2"]["remaining_seconds"] == 6
    _, one = fetch(stub, "/locks?key=orders/2")
    assert json.loads(one)["held"] is True and json.loads(one)["token"] == 1_700_000_000_000_001
    _, none = fetch(stub, "/locks?key=free")
    assert json.loads(none) == {"key": "free", "held": False}
    _, limited = fetch(stub, "/locks?limit=1")
    assert json.loads(limited)["truncated"] is True and len(json.loads(limited)["locks"]) == 1


def test_metrics_exposition(node: ProtocolNode) -> None:
    stub = StubTreq(makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 1")
    node.clock.advance(1)  # b times out
    a.ask(b"R k 1700000000000000")
    a.ask(b"R k 1")
    a.ask(b"A x 2 0")
    node.clock.advance(2)  # x expires
    a.ask(b"nonsense")
    response, body = fetch(stub, "/metrics")
    text = body.decode()
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
    for line in [
        "lockservice_grants_total 2.0",
        'lockservice_releases_total{result="ok"} 1.0',
        'lockservice_releases_total{result="stale"} 1.0',
        "lockservice_expirations_total 1.0",
        "lockservice_timeouts_total 1.0",
        "lockservice_errors_total 1.0",
        "lockservice_held_keys 0.0",
        "lockservice_waiters 0.0",
        "lockservice_open_connections 2.0",
        'lockservice_role{role="active"} 1.0',
        'lockservice_role{role="standby"} 0.0',
        "lockservice_acquire_wait_seconds_count 2.0",
        "lockservice_hold_seconds_count 2.0",
        'lockservice_hold_seconds_bucket{le="1.0"} 1.0',
    ]:
        assert line in text, line


def test_redirects_counted(node: ProtocolNode) -> None:
    stub = StubTreq(makeRoot(node.service, None))
    node.service.setRole("standby", b"h:1")
    node.connect().ask(b"A k 1 0")
    _, body = fetch(stub, "/metrics")
    assert "lockservice_redirects_total 1.0" in body.decode()
    assert 'lockservice_role{role="standby"} 1.0' in body.decode()


def test_human_page_refreshes_itself(node: ProtocolNode) -> None:
    stub = StubTreq(makeRoot(node.service, None))
    node.connect().ask(b"A shown/key 30 0")
    response, body = fetch(stub, "/")
    assert b'http-equiv="refresh"' in body
    assert b"shown/key" in body
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/html")
    missing, _ = fetch(stub, "/nothing-here")
    assert missing.code == 404


@pytest_twisted.ensureDeferred
async def test_real_treq_against_running_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    node = Node(freePort(), logDir=str(tmp_path),
                args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    node.start()
    try:
        with LineClient(node.port) as c:
            token = c.ask(b"A real/key 30 0").split()[2]
        response = await treq.get(f"http://127.0.0.1:{httpPort}/locks?key=real/key")
        data = await response.json()
        assert data["held"] is True and data["token"] == int(token)
        response = await treq.get(f"http://127.0.0.1:{httpPort}/status")
        assert (await response.json())["held_keys"] == 1
    finally:
        node.stop()


def test_cluster_status_shows_peers(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import urllib.request

    ports = [freePort(), freePort()]
    c = cluster(2, start=False)
    for node, port in zip(c.nodes, ports, strict=True):
        node.args = ["--http", f"tcp:{port}:interface=127.0.0.1"]
    c.start()

    def status(port: int) -> dict:  # type: ignore[type-arg]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
            return json.loads(r.read())

    waitFor(lambda: status(ports[0])["role"] == "active"
            and status(ports[1])["role"] == "standby", 10, what="roles settled")
    standby = status(ports[1])
    assert standby["active"] == c.nodes[0].address
    assert standby["node"] == c.nodes[1].address
    assert standby["peers"][0]["address"] == c.nodes[0].address
    assert standby["peers"][0]["alive"] is True
    assert standby["peers"][0]["role"] == "active"
    # A grant on the active reaches the standby's table quickly.
    with LineClient(c.nodes[0].port) as conn:
        conn.ask(b"A replicated 30 0")
    waitFor(lambda: status(ports[1])["held_keys"] == 1, 2, interval=0.01,
            what="grant replicated")
