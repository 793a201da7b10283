"""
The HTTP status endpoint: resources through treq's StubTreq (no sockets),
plus one real treq request against a running node.
"""

from __future__ import annotations

import json
from typing import Any, List, Tuple

import pytest
import pytest_twisted
import treq
from treq.testing import StubTreq

from lockservice.server.deadlocks import WAIT_ENTERS_AFTER
from lockservice.server.http import makeRoot
from lockservice.testing.harness import LineClient, Node, freePort, waitFor
from tests.support.protocol import Node as ProtocolNode
from tests.support.web import SECRET, fetch, post, stubFor, withMonitor


@pytest.fixture
def node() -> ProtocolNode:
    return ProtocolNode()


def test_status_json(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
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
    assert data["active"] is None and data["node"] is None
    assert data["deadlocks"] == [] and data["long_holds"] == 0
    assert data["warn_hold_seconds"] is None
    assert "version" in data


def test_locks_says_who_holds_what(node: ProtocolNode) -> None:
    stub, _ = withMonitor(node)
    a, b, c = node.connect(), node.connect(), node.connect()
    a.ask(b"I alice")
    b.ask(b"I bob")
    a.ask(b"A orders/1 30 0")
    a.ask(b"A orders/2 10 0")
    node.clock.advance(1)
    b.ask(b"A orders/1 20 0")
    node.clock.advance(1)
    c.ask(b"A orders/1 5 0")  # unnamed: shown by peer address
    a.ask(b"N orders/1 1700000000000000 40")
    node.clock.advance(2)
    response, body = fetch(stub, "/locks")
    data = json.loads(body)
    assert (data["count"], data["offset"], data["truncated"]) == (2, 0, False)
    byKey = {entry["key"]: entry for entry in data["locks"]}
    peer = c.proto.transport.getPeer()
    assert byKey["orders/1"] == {
        "key": "orders/1", "token": 1_700_000_000_000_000, "holder": "alice",
        "granted_at": 1_700_000_000.0, "age_seconds": 4, "remaining_seconds": 38,
        "renewals": 1, "long_hold": False, "queue_length": 2,
        "waiters": [
            {"who": "bob", "lease_seconds": 20, "waited_seconds": 3, "mode": "exclusive"},
            {"who": f"{peer.host}:{peer.port}", "lease_seconds": 5, "waited_seconds": 2,
             "mode": "exclusive"},
        ],
        "waiters_truncated": False,
        # For shared keys: an exclusive key's one grant.
        "kind": "exclusive", "slots": None, "holder_count": 1, "holders_truncated": False,
        "holders": [{"token": 1_700_000_000_000_000, "holder": "alice", "mode": "exclusive",
                     "granted_at": 1_700_000_000.0, "age_seconds": 4, "delayed": False,
                     "remaining_seconds": 38, "renewals": 1, "long_hold": False}],
        # The lock-delay: none here.
        "delayed": False, "delay_ends_at": None, "delay_remaining_seconds": None,
    }
    assert byKey["orders/2"]["remaining_seconds"] == 6
    assert byKey["orders/2"]["waiters"] == []
    _, one = fetch(stub, "/locks?key=orders/2")
    assert json.loads(one)["held"] is True and json.loads(one)["token"] == 1_700_000_000_000_001
    _, path = fetch(stub, "/locks/orders/1?waiters=1")
    assert json.loads(path)["waiters_truncated"] is True
    assert [w["who"] for w in json.loads(path)["waiters"]] == ["bob"]
    _, none = fetch(stub, "/locks?key=free")
    assert json.loads(none) == {"key": "free", "held": False}
    _, limited = fetch(stub, "/locks?limit=1")
    assert json.loads(limited)["truncated"] is True and len(json.loads(limited)["locks"]) == 1
    _, second = fetch(stub, "/locks?limit=1&offset=1")
    assert [e["key"] for e in json.loads(second)["locks"]] == ["orders/2"]
    assert json.loads(second)["truncated"] is False
    bad, body = fetch(stub, "/locks?limit=x")
    assert bad.code == 400 and "limit" in json.loads(body)["error"]
    bad, body = fetch(stub, "/locks?key=two%20words")
    assert bad.code == 400 and "bad key" in json.loads(body)["error"]


def test_names_follow_a_rename_and_a_handover(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"I first")
    b.ask(b"A k 30 0")
    b.ask(b"I second")
    a.ask(b"R k 1700000000000000")
    _, body = fetch(stub, "/locks?key=k")
    assert json.loads(body)["holder"] == "second"


def test_key_statistics(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    for i in range(3):
        a.ask(b"A hot 30 0")
        b.ask(b"A hot 30 0")
        node.clock.advance(2)
        a.ask(b"R hot %d" % (1_700_000_000_000_000 + 2 * i))
        node.clock.advance(1)
        b.ask(b"R hot %d" % (1_700_000_000_000_001 + 2 * i))
    a.ask(b"A cold 1 0")
    b.ask(b"A cold 1 0.5")
    node.clock.advance(2)
    _, body = fetch(stub, "/locks/stats")
    data = json.loads(body)
    assert data["tracked"] == 2 and data["capacity"] == 1000
    hot, cold = data["keys"]
    assert hot["key"] == "hot" and hot["grants"] == 6 and hot["releases"] == 6
    assert hot["hold_seconds"]["count"] == 6 and hot["hold_seconds"]["mean"] == 1.5
    assert hot["wait_seconds"]["mean"] == 1.0  # three at once, three after 2 s
    assert abs(hot["wait_seconds"]["p99"] - 2.0) < 0.15
    assert (cold["grants"], cold["timeouts"], cold["expiries"]) == (1, 1, 1)
    _, top = fetch(stub, "/locks/stats?limit=1")
    assert [k["key"] for k in json.loads(top)["keys"]] == ["hot"]


def test_events_contract(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"I alice")
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 0.5")
    node.clock.advance(1)  # b times out
    a.ask(b"A other 30 0")
    a.ask(b"N k 1700000000000000 30")
    a.ask(b"R k 1700000000000000")
    response, body = fetch(stub, "/events")
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    data = json.loads(body)
    assert set(data) == {"events", "next", "oldest", "gap", "missed"}
    events = data["events"]
    assert [e["type"] for e in events] == ["grant", "timeout", "grant", "renewal", "release"]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5] and data["next"] == 5
    for e in events:
        assert set(e) == {"seq", "time", "type", "key", "token", "who", "detail"}
        assert isinstance(e["time"], float) and e["time"] > 1_600_000_000
    assert events[0]["key"] == "k" and events[0]["token"] == 1_700_000_000_000_000
    assert events[0]["who"] == "alice"
    _, later = fetch(stub, "/events?since=3")
    assert [e["seq"] for e in json.loads(later)["events"]] == [4, 5]
    _, keyed = fetch(stub, "/events?key=other&since=0")
    assert [e["seq"] for e in json.loads(keyed)["events"]] == [3]
    assert json.loads(keyed)["next"] == 5
    _, none = fetch(stub, "/events?since=5")
    assert json.loads(none) == {"events": [], "next": 5, "oldest": 1, "gap": False,
                                "missed": 0}
    bad, _ = fetch(stub, "/events?since=-1")
    assert bad.code == 400


def test_deadlock_on_status(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    x, y = node.connect(), node.connect()
    x.ask(b"I x")
    y.ask(b"I y")
    x.ask(b"A k1 30 0")
    y.ask(b"A k2 30 0")
    x.ask(b"A k2 30 0")
    y.ask(b"A k1 30 0")
    node.clock.advance(0)
    _, body = fetch(stub, "/status")
    assert json.loads(body)["deadlocks"] == []  # the waits are not in the graph yet
    # Once they have lasted WAIT_ENTERS_AFTER, they are, and are checked.
    node.clock.advance(WAIT_ENTERS_AFTER)
    _, body = fetch(stub, "/status")
    [cycle] = json.loads(body)["deadlocks"]
    assert json.loads(body)["deadlocks_count"] == 1
    assert cycle["length"] == 2 and cycle["clients"] == ["y", "x"]
    assert cycle["keys"] == ["k1", "k2"]
    _, metrics = fetch(stub, "/metrics")
    assert "lockservice_deadlocks_total 1.0" in metrics.decode()
    assert "lockservice_deadlocks_now 1.0" in metrics.decode()
    y.close()  # y's wait is withdrawn: no deadlock any more
    node.clock.advance(0)
    _, body = fetch(stub, "/status")
    assert json.loads(body)["deadlocks"] == []


def test_force_release(node: ProtocolNode) -> None:
    stub, monitor = withMonitor(node, adminSecret=SECRET)
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"I stuck-worker")
    old = holder.ask(b"A orders/42 300 0").split()[2]
    waiter.ask(b"A orders/42 30 0")
    assert post(stub, "/locks/orders/42/release", secret=None)[0] == 401
    assert post(stub, "/locks/orders/42/release", secret=b"wrong")[0] == 401
    assert post(stub, "/locks/orders/42/release", secret=SECRET + b"x")[0] == 401
    assert post(stub, "/locks/free/release")[0] == 404
    code, answer = post(stub, "/locks/orders/42/release")
    assert code == 200
    granted = waiter.take().split()
    assert granted[:2] == [b"A", b"orders/42"]
    assert answer == {"key": "orders/42", "released_token": int(old),
                      "next_token": int(granted[2]), "reason": "stuck job"}
    assert int(granted[2]) > int(old)
    # The old holder is fenced: its release is stale, its renewal too.
    assert holder.ask(b"R orders/42 " + old) == b"R orders/42 STALE\n"
    assert holder.ask(b"N orders/42 " + old + b" 30") == b"N orders/42 STALE\n"
    events = monitor.events.since(0)[0]
    forced = [e for e in events if e.type == "force-release"]
    assert len(forced) == 1 and forced[0].who == "stuck-worker"
    assert forced[0].detail is not None and "stuck job" in forced[0].detail
    assert forced[0].detail.startswith("by admin@")
    # A key with no waiter: next_token is null.
    code, answer = post(stub, "/locks/orders%2F42/release", reason=None)
    assert code == 200 and answer["next_token"] is None
    assert answer["reason"] == "no reason given"
    assert node.service.table.holder(b"orders/42") is None


def test_force_release_refused_without_admin_secret(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    node.connect().ask(b"A k 30 0")
    code, answer = post(stub, "/locks/k/release")
    assert code == 403 and "admin-secret" in answer["error"]
    assert node.service.table.holder(b"k") is not None


def test_force_release_on_a_standby(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None, adminSecret=SECRET))
    node.connect().ask(b"A k 30 0")
    node.service.setRole("standby", b"h:1")
    code, answer = post(stub, "/locks/k/release")
    assert code == 409 and answer["active"] == "h:1"


def test_the_plain_histograms_render_as_prometheus_clients_own() -> None:
    """
    Issue 20: the hold and wait histograms are counted in a plain list (a
    bisect per observation, not prometheus_client's lock per bucket), and
    scrape exactly as a prometheus_client Histogram fed the same values:
    the bounds inclusive, the counts cumulative, the sum.
    """
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from lockservice.server.metrics import _BUCKETS, Buckets

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = Buckets("h_seconds", "doc", _BUCKETS)
    ours.register(plain)
    reference = Histogram("h_seconds", "doc", buckets=_BUCKETS, registry=theirs)
    rng = random.Random(20)
    values = [0.0, 0.0005, 1, 60, 3600, 3600.5, 1e9] + list(_BUCKETS)
    values += [rng.choice((0.0, 10 ** rng.uniform(-6, 4))) for _ in range(2000)]
    for value in values:
        plain.observe(value)
        reference.observe(value)

    def samples(registry: Any) -> List[Tuple[str, Any, float]]:
        # (Theirs also has its creation time, a gauge of its own.)
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                      for metric in registry.collect() for s in metric.samples
                      if not s.name.endswith("_created"))

    assert samples(ours) == samples(theirs)
    assert b'h_seconds_bucket{le="1.0"}' in generate_latest(ours)


def test_metrics_exposition(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
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
        "lockservice_highest_token 1700000000000001\n",
        'lockservice_key_grants_total{key="k"} 1.0',
        'lockservice_key_timeouts_total{key="k"} 1.0',
        'lockservice_key_expiries_total{key="x"} 1.0',
        'lockservice_key_hold_seconds_count{key="x"} 1.0',
        'lockservice_key_hold_seconds{key="x",quantile="0.99"} 2.0',
        "lockservice_long_holds_total 0.0",
        "lockservice_force_releases_total 0.0",
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
    stub = stubFor(node, makeRoot(node.service, None))
    node.service.setRole("standby", b"h:1")
    node.connect().ask(b"A k 1 0")
    _, body = fetch(stub, "/metrics")
    assert "lockservice_redirects_total 1.0" in body.decode()
    assert 'lockservice_role{role="standby"} 1.0' in body.decode()


def test_dashboard_page_has_no_external_assets(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    response, body = fetch(stub, "/")
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/html")
    assert b"<title>lockservice</title>" in body
    assert b"dashboard.json" in body
    # Everything inline: no script, style or image from elsewhere.
    for external in (b"<script src", b"<link", b"<img", b"@import", b"url("):
        assert external not in body
    assert body.count(b"http") == body.count(b"http://www.w3.org/2000/svg")
    missing, _ = fetch(stub, "/nothing-here")
    assert missing.code == 404


def test_dashboard_data(node: ProtocolNode) -> None:
    stub = stubFor(node, makeRoot(node.service, None))
    a, b = node.connect(), node.connect()
    a.ask(b"I alice")
    b.ask(b"I bob")
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 0")
    node.clock.advance(2.5)
    _, body = fetch(stub, "/dashboard.json?seconds=5")
    data = json.loads(body)
    assert data["status"]["held_keys"] == 1
    [lock] = data["locks"]["locks"]
    assert lock["holder"] == "alice" and lock["waiters"][0]["who"] == "bob"
    assert [s["ago"] for s in data["series"]] == [5, 4, 3, 2, 1]
    assert data["series"][3]["grants"] == 1 and data["series"][3]["waits"] == 1  # 2 s ago
    assert data["events"][0]["type"] == "grant"
    assert data["stats"][0]["key"] == "k"


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


@pytest.mark.parametrize("path, key", [
    ("/locks/a%2541/release", b"a%41"),      # %25 is a literal percent sign
    ("/locks/a%2Fb/release", b"a/b"),        # %2F is a slash
    ("/locks/a/b/release", b"a/b"),
    ("/locks/x%2520y/release", b"x%20y"),
    ("/locks/stats/release", b"stats"),
    ("/locks/r/release/release", b"r/release"),
    ("/locks/release?key=stats", b"stats"),
    ("/locks/release?key=a%2541", b"a%41"),
    ("/locks/release?key=q%2Frelease", b"q/release"),
])
def test_force_release_names_exactly_one_key(node: ProtocolNode, path: str, key: bytes) -> None:
    """
    The key in the path is percent-decoded once (twisted.web does it), so
    C{a%2541} names the key C{a%41}, never C{aA}; C{?key=} names any key.
    """
    stub, _ = withMonitor(node, adminSecret=SECRET)
    decoys = node.connect()
    for decoy in (b"aA", b"a%41", b"a/b", b"a%2Fb", b"x%20y", b"stats",
                  b"r/release", b"r", b"q/release", b"q"):
        if decoy != key:
            decoys.ask(b"A " + decoy + b" 600 0")
    victim = node.connect()
    token = victim.ask(b"A " + key + b" 600 0").split()[2]
    held = {k for k, _ in node.service.table.holders()}
    code, answer = post(stub, path)
    assert code == 200, answer
    assert answer["key"] == key.decode() and answer["released_token"] == int(token)
    assert {k for k, _ in node.service.table.holders()} == held - {key}


def test_locks_path_names_exactly_one_key(node: ProtocolNode) -> None:
    conn = node.connect()
    conn.ask(b"A aA 600 0")
    token = conn.ask(b"A a%41 600 0").split()[2]
    for path in ("/locks/a%2541", "/locks?key=a%2541"):
        _, body = fetch(node_stub(node), path)
        answer = json.loads(body)
        assert answer["key"] == "a%41" and answer["token"] == int(token), path
    _, body = fetch(node_stub(node), "/locks/")
    assert json.loads(body)["count"] == 2


def node_stub(node: ProtocolNode) -> StubTreq:
    return stubFor(node, makeRoot(node.service, None))


@pytest.mark.parametrize("path", ["/", "/status", "/locks", "/locks/stats", "/events",
                                  "/dashboard.json", "/metrics", "/nothing-here", "/x/y"])
def test_security_headers(node: ProtocolNode, path: str) -> None:
    """
    Every answer forbids external loads, framing and MIME sniffing.
    """
    stub, _ = withMonitor(node)
    response, _ = fetch(stub, path)
    headers = response.headers
    policy = headers.getRawHeaders(b"content-security-policy")[0]
    assert policy.startswith(b"default-src 'none';")
    assert b"frame-ancestors 'none'" in policy and b"http" not in policy
    assert headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
    assert headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]


def test_dashboard_policy_allows_its_own_script_only(node: ProtocolNode) -> None:
    import base64
    import hashlib
    import re
    stub, _ = withMonitor(node)
    response, page = fetch(stub, "/")
    policy = response.headers.getRawHeaders(b"content-security-policy")[0]
    [script] = re.findall(rb"<script>(.*?)</script>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(script).digest())
    assert b"script-src 'sha256-" + digest + b"'" in policy
    assert b"connect-src 'self'" in policy and b"unsafe-eval" not in policy


def test_force_release_reason_cannot_forge_lines(node: ProtocolNode) -> None:
    """
    Newlines and other control characters in a reason are escaped before
    it is logged, stored in the event ring or echoed.
    """
    from twisted.logger import formatEvent, globalLogPublisher
    logged: list = []  # type: ignore[type-arg]

    def observer(event: Any) -> None:
        logged.append(formatEvent(event))

    stub, monitor = withMonitor(node, adminSecret=SECRET)
    node.connect().ask(b"A k 30 0")
    reason = "stuck\n2026-01-01 [lockservice] Force-release of everything\r\x1b[2J\u2028x"
    globalLogPublisher.addObserver(observer)
    try:
        code, answer = post(stub, "/locks/k/release", reason=reason)
    finally:
        globalLogPublisher.removeObserver(observer)
    assert code == 200
    expected = ("stuck\\n2026-01-01 [lockservice] Force-release of everything"
                "\\r\\x1b[2J\\u2028x")
    assert answer["reason"] == expected
    [event] = [e for e in monitor.events.since(0)[0] if e.type == "force-release"]
    assert event.detail is not None and event.detail.endswith(expected)
    [line] = [m for m in logged if "Force-release of k" in m]
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    node.connect().ask(b"A k2 30 0")
    code, answer = post(stub, "/locks/k2/release", reason="x" * 5000)
    # At most 500 characters as documented, the mark of the cut included
    # (found from outside: 503).
    assert code == 200 and answer["reason"] == "x" * 497 + "..."
    # Escapes count, and the cut never splits one (found from outside: 512).
    node.connect().ask(b"A k3 30 0")
    code, answer = post(stub, "/locks/k3/release", reason="ab" + "\x1b" * 300)
    assert code == 200 and answer["reason"] == "ab" + "\\x1b" * 123 + "..."
    assert len(answer["reason"]) == 497


@pytest.mark.parametrize("path", ["/locks?limit=1001", "/locks?limit=1000000000",
                                  "/locks?waiters=1001", "/locks?waiters=10000",
                                  "/locks/k?waiters=1001", "/locks?key=k&waiters=1001",
                                  "/locks/stats?limit=1001", "/events?limit=1001"])
def test_asks_beyond_the_ceilings_are_refused(node: ProtocolNode, path: str) -> None:
    """
    One answer is built in one reactor turn: its size is capped (1000 keys,
    1000 waiters per key, 1000 events, 1000 statistics), larger asks are 400.
    """
    stub, _ = withMonitor(node)
    response, body = fetch(stub, path)
    assert response.code == 400, body
    assert "between" in json.loads(body)["error"]
    name, _, _ = path.rpartition("=")
    ok, _ = fetch(stub, name + "=1000")  # the ceiling itself is fine
    assert ok.code == 200


def test_waiters_listed_in_one_answer_are_bounded(node: ProtocolNode) -> None:
    """
    At most 5,000 waiters in one /locks answer, whatever limit x waiters;
    the keys past that budget say their list is truncated.
    """
    stub, _ = withMonitor(node)
    holder, waiter = node.connect(), node.connect()
    for i in range(12):
        holder.ask(b"A k%02d 300 0" % i)
    waiter.send(b"".join(b"A k%02d 30 0\r\n" % i for i in range(12) for _ in range(1000)))
    assert node.service.table.waiterCount == 12000
    _, body = fetch(stub, "/locks?waiters=1000")
    locks = json.loads(body)["locks"]
    assert sum(len(lock["waiters"]) for lock in locks) == 5000
    assert [len(lock["waiters"]) for lock in locks[4:7]] == [1000, 0, 0]
    assert locks[5]["waiters_truncated"] and locks[5]["queue_length"] == 1000


# -- the site: admission, backpressure, request bodies (issue 21 item 2) --------

from twisted.internet.task import Cooperator  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from lockservice.server import http as nodehttp  # noqa: E402


class SiteNode:
    """
    A L{nodehttp.NodeSite} over StringTransports, its answers' steps run
    on the node's clock.
    """

    def __init__(self, node: ProtocolNode, **kw: Any) -> None:
        self.node = node
        # One step per turn (Clock.advance(0) would also run the calls
        # it schedules: a turn is a microsecond here).
        kw.setdefault("cooperator", Cooperator(
            terminationPredicateFactory=lambda: lambda: True,
            scheduler=lambda step: node.clock.callLater(1e-6, step)))
        self.site = nodehttp.NodeSite(makeRoot(node.service, None, **kw))
        self.site.reactor = node.clock  # type: ignore[assignment]

    def connect(self) -> Tuple[Any, StringTransport]:
        channel = self.site.buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        return channel, transport

    def turn(self, count: int = 1) -> None:
        for _ in range(count):
            self.node.clock.advance(1e-6)


def test_a_large_body_is_refused_before_it_is_read(node: ProtocolNode) -> None:
    """
    A Content-Length over the limit gets 413 and a close as soon as the
    headers are in: no temporary file, not one body byte kept.
    """
    site = SiteNode(node)
    channel, transport = site.connect()
    channel.dataReceived(b"POST /locks/k/release HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1500000000\r\n\r\n" + b"x" * 60000)
    answer = transport.value()
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"Connection: close" in answer and b"x" * 100 not in answer
    assert transport.disconnecting
    assert channel.requests[0].content is None  # no body file made
    channel.dataReceived(b"x" * 100000)  # later reads are dropped
    assert site.site.inProgress == 0


def test_a_chunked_body_is_refused_before_it_is_read(node: ProtocolNode) -> None:
    site = SiteNode(node)
    channel, transport = site.connect()
    channel.dataReceived(b"POST /locks/k/release HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n1000\r\n" + b"y" * 4096)
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    assert transport.disconnecting


def test_a_small_body_is_read(node: ProtocolNode) -> None:
    """
    The force-release reason (a small form body) still works.
    """
    site = SiteNode(node, adminSecret=SECRET)
    conn = node.connect()
    conn.ask(b"A k 600 0")
    channel, transport = site.connect()
    body = b"reason=" + b"r" * (nodehttp.MAX_BODY - 7)
    channel.dataReceived(b"POST /locks/k/release HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + SECRET + b"\r\n"
                         b"Content-Type: application/x-www-form-urlencoded\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = transport.value()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b'"reason": "rrrr' in answer


def _get(channel: Any, path: bytes) -> None:
    channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")


def test_requests_above_the_cap_are_answered_503_at_once(node: ProtocolNode) -> None:
    site = SiteNode(node)
    site.site.maxRequests = 2
    holder = node.connect()
    holder.send(b"".join(b"A k%d 600 0\n" % i for i in range(3000)))
    busy = [site.connect() for _ in range(2)]
    for channel, _ in busy:
        _get(channel, b"/locks?limit=1000")
    assert site.site.inProgress == 2
    channel, transport = site.connect()
    _get(channel, b"/status")
    assert transport.value().startswith(b"HTTP/1.1 503 "), transport.value()[:200]
    assert b"retry-after: 1" in transport.value().lower()
    assert site.site.refusedBusy == 1
    site.turn(1000)  # the two pages are done: their slots are free again
    assert site.site.inProgress == 0
    for _, t in busy:
        assert t.value().startswith(b"HTTP/1.1 200 ") and t.value().endswith(b"0\r\n\r\n")
    channel.connectionLost(None)
    channel, transport = site.connect()
    _get(channel, b"/status")
    assert transport.value().startswith(b"HTTP/1.1 200 ")


def test_a_lost_connection_frees_its_slot_and_stops_its_answer(node: ProtocolNode) -> None:
    from twisted.internet.error import ConnectionLost
    from twisted.python.failure import Failure
    site = SiteNode(node)
    holder = node.connect()
    holder.send(b"".join(b"A k%d 600 0\n" % i for i in range(3000)))
    channel, transport = site.connect()
    _get(channel, b"/locks?limit=1000")
    site.turn(1)
    assert site.site.inProgress == 1
    channel.connectionLost(Failure(ConnectionLost()))
    assert site.site.inProgress == 0
    size = len(transport.value())
    site.turn(100)  # no step runs for a gone client
    assert len(transport.value()) == size


def test_a_big_answer_waits_for_a_reader(node: ProtocolNode) -> None:
    """
    While the connection's send buffer is full (the transport paused its
    producer), no step of the answer runs: what a client that never reads
    costs is bounded; once it reads, the answer goes on to its end.  A
    step is bounded: at most about STEP_COST units of the page.
    """
    site = SiteNode(node)
    holder = node.connect()
    holder.send(b"".join(b"A k%04d 600 0\n" % i for i in range(1000)))
    channel, transport = site.connect()
    _get(channel, b"/locks?limit=1000")
    site.turn(1)
    channel.pauseProducing()  # as the transport does when its buffer is full
    size = len(transport.value())
    site.turn(100)
    assert len(transport.value()) == size
    assert size < 64 * 1024, size
    channel.resumeProducing()
    site.turn(1000)
    body = transport.value()
    assert body.endswith(b"0\r\n\r\n")
    assert body.count(b'"key":"k') == 1000


def test_a_paused_answer_is_given_up_after_a_while(node: ProtocolNode) -> None:
    site = SiteNode(node)
    holder = node.connect()
    holder.send(b"".join(b"A k%04d 600 0\n" % i for i in range(1000)))
    channel, transport = site.connect()
    _get(channel, b"/locks?limit=1000")
    site.turn(1)
    channel.pauseProducing()
    node.clock.advance(nodehttp.STALL_SECONDS - 1)
    assert not transport.disconnecting
    channel.resumeProducing()
    channel.pauseProducing()  # progress resets the deadline
    node.clock.advance(nodehttp.STALL_SECONDS - 1)
    assert not getattr(transport, "aborted", False)
    node.clock.advance(2)
    assert transport.disconnecting  # aborted: its slot comes back


def test_a_page_is_produced_in_bounded_steps() -> None:
    pieces = list(nodehttp.jsonPieces(
        [("count", 3), ("locks", nodehttp.Items(({"n": i}, 10) for i in range(100)))],
        stepCost=50))
    assert json.loads(b"".join(pieces)) == {"count": 3, "locks": [{"n": i} for i in range(100)]}
    assert len(pieces) == 21  # 5 items a step, and the end
