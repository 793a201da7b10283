"""
GET /health and /ready: the rules on fakes, the resources through StubTreq
on a protocol-level node, the state directory's write failures on /status,
/ready and /metrics, and real nodes (a lone node; a cluster node that
waits, promotes, and a standby that follows).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import pytest

from lockservice.core.election import PeerView
from lockservice.server.health import readiness
from lockservice.server.http import makeRoot
from lockservice.testing.harness import LineClient, freePort, freePorts, waitFor
from tests.support.protocol import Node as ProtocolNode
from tests.support.state import (
    brokenState,
)
from tests.support.web import fetch, stubFor


class FakeLocks:
    def __init__(self, role: str) -> None:
        self.role = role


class FakeCluster:
    def __init__(self, role: str = "standby", active: Optional[bytes] = b"b:2",
                 alive: Tuple[bool, ...] = (True, True)) -> None:
        self.myEntry = b"a:1"
        self.peers = [b"a:1", b"b:2", b"c:3"]
        self.role = role
        self.term = 3
        self.promotions = 0
        self.views = {j + 1: PeerView(alive=up) for j, up in enumerate(alive)}
        self.lastHeard: Dict[int, float] = {}
        self.clockSuspect: Optional[str] = None
        self.active = active

    def activeAddress(self) -> Optional[bytes]:
        return self.active


def ready(role: str, cluster: Any = None, state: Any = None) -> Tuple[bool, Dict[str, Any]]:
    return readiness(FakeLocks(role), cluster, state)  # type: ignore[arg-type]


def test_a_lone_node_is_ready_while_active() -> None:
    ok, body = ready("active")
    assert ok and body["ready"] is True and body["reason"] is None
    assert body["peers_reachable"] == 0 and body["state_save_failing"] is False


def test_an_active_that_serves_is_ready_even_reaching_no_peer() -> None:
    ok, body = ready("active", FakeCluster("active", b"a:1", alive=(False, False)))
    assert ok and body["peers_reachable"] == 0 and body["active"] == "a:1"


def test_a_standby_in_sync_with_a_reachable_active_is_ready() -> None:
    ok, body = ready("standby", FakeCluster())
    assert ok and body["active"] == "b:2" and body["peers_reachable"] == 2


@pytest.mark.parametrize("role, cluster, reason", [
    ("syncing", FakeCluster("syncing"), "syncing: catching up with the active b:2"),
    ("syncing", FakeCluster("syncing", None), "syncing: no active reachable yet"),
    ("standby", FakeCluster("standby", None), "standby: no active reachable, and not promoted"),
    ("handing-off", FakeCluster("handing-off"), "handing off"),
    ("handing-off", FakeCluster("active", None),
     "active, not serving until its live peers receive its stream"),
    ("leaving", FakeCluster("leaving"), "leaving: the node is stopping"),
])
def test_not_ready(role: str, cluster: FakeCluster, reason: str) -> None:
    ok, body = ready(role, cluster)
    assert not ok and body["ready"] is False and body["reason"].startswith(reason)


def test_a_node_distrusting_its_clock_is_not_ready() -> None:
    cluster = FakeCluster()
    cluster.clockSuspect = "peer b:2 has a token 2.0 h ahead of this node's clock"
    ok, body = ready("standby", cluster)
    assert not ok and body["reason"].startswith("clock suspect: peer b:2")


def test_a_peer_refused_for_its_protocol_version_makes_the_node_not_ready() -> None:
    cluster = FakeCluster("active", b"a:1")
    cluster.incompatiblePeers = ["c:3"]  # type: ignore[attr-defined]
    ok, body = ready("active", cluster)
    assert not ok and body["reason"] == "peer(s) c:3 refused for their protocol version"
    cluster.incompatiblePeers = []  # type: ignore[attr-defined]
    assert ready("active", cluster)[0]


def test_state_save_failures_show_on_ready_status_and_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = ProtocolNode()
    state, directory = brokenState(node, tmp_path)
    stub = stubFor(node, makeRoot(node.service, None, state=state))
    assert node.connect().ask(b"A k 30 0").startswith(b"A k ")  # needs a new mark: fails
    assert state.saveFailing and state.saveFailures == 1
    response, body = fetch(stub, "/ready")
    data = json.loads(body)
    # It still serves (a restart would not make the disk writable).
    assert response.code == 200 and data["ready"] is True
    assert data["state_save_failing"] is True and data["state_save_failures"] == 1
    assert "No space left on device" in data["state_save_error"]
    assert data["state_dir"] == str(tmp_path / "state")
    status = json.loads(fetch(stub, "/status")[1])
    assert status["state_save_failing"] is True and "No space" in status["state_save_error"]
    metrics = fetch(stub, "/metrics")[1].decode()
    assert "lockservice_state_save_failures_total 1.0" in metrics
    assert "lockservice_state_save_failing 1.0" in metrics
    # A write that works again clears the flag (the count stays).
    directory.broken = False
    node.service.table.tokens.mark = 0  # type: ignore[attr-defined]
    assert node.connect().ask(b"A j 30 0").startswith(b"A j ")
    assert not state.saveFailing and state.saveFailures == 1
    assert json.loads(fetch(stub, "/status")[1])["state_save_failing"] is False


def test_a_failed_save_at_a_graceful_stop_is_counted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = ProtocolNode()
    state, _ = brokenState(node, tmp_path)
    assert state.stopped(node.service, keepLocks=True) == -1
    assert state.saveFailing and state.saveFailures == 1


def test_resources_answer_json_with_the_right_codes() -> None:
    node = ProtocolNode()
    stub = stubFor(node, makeRoot(node.service, None))
    response, body = fetch(stub, "/health")
    assert response.code == 200 and json.loads(body)["alive"] is True
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
    response, body = fetch(stub, "/ready")
    assert response.code == 200 and json.loads(body)["ready"] is True
    cluster = FakeCluster("syncing", None)
    node.service.setRole("syncing", None)
    stub = stubFor(node, makeRoot(node.service, cluster))  # type: ignore[arg-type]
    response, body = fetch(stub, "/ready")
    data = json.loads(body)
    assert response.code == 503 and data == {**data, "ready": False, "role": "syncing",
                                              "reason": "syncing: no active reachable yet"}
    assert fetch(stub, "/health")[0].code == 200  # alive all the same
    assert b"\n" not in body.rstrip(b"\n")


# -- real nodes ------------------------------------------------------------------------


def get(port: int, path: str) -> Tuple[int, Dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:
        return 0, {}


def test_a_lone_real_node(spawn) -> None:  # type: ignore[no-untyped-def]
    http = freePort()
    spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1"])
    assert get(http, "/health")[0] == 200
    code, body = get(http, "/ready")
    assert code == 200 and body["role"] == "active" and body["peers_reachable"] == 0


def test_a_real_cluster_node_waits_promotes_and_a_standby_follows(cluster) -> None:  # type: ignore[no-untyped-def]
    """
    The second node of two starts first: while it waits for a peer it is
    not ready (syncing, no active); once it promotes it is; the first
    node, started later, is ready once it follows (and then takes over).
    """
    c = cluster(2, start=False)
    https = freePorts(2)
    for node, http in zip(c.nodes, https, strict=True):
        node.args = [*node.args, "--http", f"tcp:{http}:interface=127.0.0.1"]
    c.nodes[1].start(wait=True)
    codes: List[Tuple[int, str]] = []

    def promoted() -> bool:
        code, body = get(https[1], "/ready")
        codes.append((code, body.get("reason") or ""))
        return code == 200

    waitFor(promoted, 15, what="node 1 promoted")
    assert (503, "syncing: no active reachable yet") in codes, codes
    assert get(https[1], "/ready")[1]["peers_reachable"] == 0  # active, alone: ready
    with LineClient(c.nodes[1].port) as client:
        assert client.ask(b"A held 60 0").startswith(b"A held ")
    c.nodes[0].start(wait=True)
    waitFor(lambda: get(https[0], "/ready")[0] == 200, 15, what="node 0 ready")
    code, body = get(https[0], "/ready")
    assert body["peers_reachable"] == 1 and body["role"] in ("standby", "active")
    waitFor(lambda: get(https[0], "/ready")[1].get("role") == "active"
            and get(https[1], "/ready")[0] == 200, 15, what="node 0 took over")
    assert get(https[1], "/ready")[1]["active"] == c.nodes[0].address
