"""
A 3-node cluster: redirects from standbys, failover after kill -9 of the
active (the next acquire on the successor, a kept-alive lock and a
leadership kept or told lost, an observer that misses no change), and a
graceful handoff under a waiting acquire.  Each test has a cluster of its
own (it kills nodes).
"""

from __future__ import annotations

import signal
import time
from typing import Iterator, List

import pytest

from .conftest import NodeBox, start_cluster, wait_until
from .util import err, ok, token_of, value_of

pytestmark = [pytest.mark.cluster, pytest.mark.faults]


@pytest.fixture
def cluster(tmp_path) -> Iterator[List[NodeBox]]:
    boxes = start_cluster(str(tmp_path))
    yield boxes
    for box in boxes:
        if box.node.alive():
            box.node.signal(signal.SIGCONT)
        box.node.stop()


def _addrs(boxes: List[NodeBox]) -> str:
    # Standbys first: the client must follow M to the active.
    return ",".join(b.address for b in reversed(boxes))


def _all_on_the_active(*drivers) -> None:
    """
    Enough requests that every connection of each driver has met a
    standby's M and followed it to the active (so the kill drops them all).
    """
    for d in drivers:
        for _ in range(6):
            ok(d.call("leader", election="warm-up"))


def _kept_or_lost(d, node: NodeBox, key: str, token: str) -> str:
    lost = [o for o in d.events() if o.get("key") == key]
    if lost:
        assert [o.get("token") for o in lost] == [token], f"lost told once, its token: {lost}"
        return "lost"
    held = [str(t) for t in node.tokens(key)]
    assert held == [token], (f"{key}: no lost event, so the successor must still hold "
                             f"{token} (kept alive past its lease): it holds {held}")
    return "kept"


def test_failover_after_kill_of_the_active(kind, cluster, start_driver, key):
    n0, n1, _ = cluster
    d = start_driver(_addrs(cluster), name="fo")
    watcher = start_driver(_addrs(cluster), name="watcher")
    k1, k2, k3, e = key("plain"), key("kept"), key("after"), key("e")
    t1 = token_of(d.call("acquire", key=k1, lease=60, wait=10, timeout=15))
    assert n0.tokens(k1) == [int(t1)], "the grant is on the active"
    t2 = token_of(d.call("acquire", key=k2, lease=3, wait=10, keepalive=True))
    te = token_of(d.call("campaign", election=e, value="cand-1", lease=3))
    r = watcher.call("leader", election=e)
    assert r.get("value") == "cand-1" and r.get("token") == te, r
    _all_on_the_active(d, watcher)
    observing = watcher.cmd("observe", key=k1, token=t1, wait=0)
    wait_until(lambda: all(str(t) in map(str, n1.tokens(k)) for k, t in
                           ((k1, t1), (k2, t2), (e, te))), 5, "replicated to node1")
    time.sleep(0.3)
    assert watcher.results_for(observing) == []

    killed = time.monotonic()
    n0.node.kill()
    ident = d.cmd("acquire", key=k3, lease=30, wait=10)
    line = d.result_line(ident, 15)
    t3 = token_of(line.obj)
    assert line.time - killed <= 5 + 3, f"the next acquire on the successor: {line.time - killed}"
    assert n1.tokens(k3) == [int(t3)] and n1.status()["role"] == "active"
    assert int(t3) > max(int(t1), int(t2), int(te))

    # Past the 3 s leases: kept alive on the successor, or told lost.
    time.sleep(max(0.0, killed + 4.5 - time.monotonic()))
    outcomes = {k: _kept_or_lost(d, n1, k, t) for k, t in ((k2, t2), (e, te))}

    # The observer misses no change: the release on the successor answers it.
    ok(d.call("release", key=k1, token=t1))
    r = watcher.result(observing, 10)
    assert token_of(r) == "0" and r.get("holder") is None, r
    r = watcher.call("leader", election=e)
    if outcomes[e] == "kept":
        assert r.get("value") == "cand-1" and r.get("token") == te, r
        ok(d.call("resign", election=e))
        wait_until(lambda: n1.holders(e) == [], 5, "resigned on the successor")
    r = watcher.call("leader", election=e)
    assert r.get("value") is None and r.get("token") == "0", r
    if outcomes[k2] == "kept":
        ok(d.call("release", key=k2, token=t2))
    ok(d.call("release", key=k3, token=t3))
    assert n1.holders(k3) == []


def test_campaign_across_a_failover(kind, cluster, start_driver, key):
    n0, n1, _ = cluster
    a = start_driver(_addrs(cluster), name="a")
    b = start_driver(_addrs(cluster), name="b")
    e = key("e")
    ta = token_of(a.call("campaign", election=e, value="alpha", lease=2, timeout=15))
    _all_on_the_active(a, b)
    pending = b.cmd("campaign", election=e, value="beta", lease=2)
    wait_until(lambda: n0.waiters(e) == 1, 10, "b waits for the election")
    wait_until(lambda: n1.tokens(e) == [int(ta)], 5, "replicated")
    n0.node.kill()
    time.sleep(3.5)
    lost = [o for o in a.events() if o.get("key") == e]
    if not lost:
        assert n1.tokens(e) == [int(ta)], "alpha still leads on the successor"
        assert b.results_for(pending) == []
        ok(a.call("resign", election=e))
    # b's campaign, re-sent on the successor, wins.
    tb = token_of(b.result(pending, 15))
    assert int(tb) > int(ta)
    r = a.call("leader", election=e)
    assert r.get("value") == "beta" and r.get("token") == tb, r
    assert value_of(n1.holders(e)[0]["holder"]) == "beta"
    ok(b.call("resign", election=e))


def test_graceful_handoff_under_a_waiting_acquire(kind, cluster, start_driver, key):
    n0, n1, _ = cluster
    d = start_driver(_addrs(cluster))
    other = start_driver(_addrs(cluster))
    k = key()
    t = token_of(d.call("acquire", key=k, lease=30, wait=10, timeout=15))
    _all_on_the_active(d, other)
    waiting = other.cmd("acquire", key=k, lease=30, wait=20)
    observing = other.cmd("observe", key=k, token=t, wait=0)
    wait_until(lambda: n0.waiters(k) == 1, 10, "the acquire waits on the active")
    wait_until(lambda: n0.status()["observers"] == 1, 10, "the observe waits on the active")
    n0.node.signal(signal.SIGTERM)
    wait_until(lambda: n1.status()["role"] == "active", 10, "node1 took over")
    wait_until(lambda: n1.waiters(k) == 1, 10,
               "the waiting acquire followed M to the successor and waits there")
    wait_until(lambda: n1.status()["observers"] == 1, 10,
               "the waiting observe followed M to the successor")
    assert other.results_for(waiting) == [] and other.results_for(observing) == []
    ok(d.call("release", key=k, token=t))
    t2 = token_of(other.result(waiting, 10))
    r = other.result(observing, 10)
    assert token_of(r) in ("0", t2), f"the observer misses no change: {r}"
    assert n1.tokens(k) == [int(t2)]
    ok(other.call("release", key=k, token=t2))
    err(d.call("release", key=k, token=t), "stale")
