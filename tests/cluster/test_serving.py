"""
The serving gate (lockservice.cluster.serving): when an active node may
serve.  Pure, told the time.
"""

from __future__ import annotations

from types import SimpleNamespace

from lockservice.cluster import serving
from lockservice.core.election import ACTIVE, LEAVING, STANDBY, PeerView


def gate() -> serving.Gate:
    return serving.Gate(heartbeat=0.1, peerTimeout=1.0, now=0.0)


def test_an_active_serves_once_every_live_peer_receives_its_stream() -> None:
    g = gate()
    g.becameActive(10.0)
    verdict = g.judge(True, [1], 10.0)
    assert not verdict.changed and not g.serving
    verdict = g.judge(True, [], 10.5)
    assert verdict.changed and g.serving
    assert verdict.frozenFor == 0.5 and verdict.sinceActive
    verdict = g.judge(True, [2], 11.0)  # a subscriber's link dropped
    assert verdict.changed and not g.serving and verdict.missing == [2]
    verdict = g.judge(True, [], 11.25)
    assert verdict.changed and verdict.frozenFor == 0.25 and not verdict.sinceActive


def test_a_live_peer_that_never_subscribes_is_waited_for_a_bound_only() -> None:
    g = gate()
    g.becameActive(0.0)
    assert not g.judge(True, [1], 0.0).changed
    assert not g.judge(True, [1], 1.99).changed
    verdict = g.judge(True, [1], 2.0)
    assert verdict.changed and g.serving and verdict.servingWithout == 2.0
    assert g.judge(True, [1], 3.0).servingWithout is None  # said once
    # Each peer gets the bound from when it became a live non-subscriber.
    g.judge(True, [], 4.0)
    g.judge(True, [2], 4.0)
    assert not g.serving
    assert g.judge(True, [2], 6.0).servingWithout == 2.0


def test_a_node_that_did_not_run_serves_nothing_until_it_read_its_peers() -> None:
    g = gate()
    g.becameActive(0.0)
    g.judge(True, [], 0.0)
    assert g.serving
    assert g.frozenAfter == 0.5  # half the peer timeout, over 2.5 heartbeats
    assert not g.late(0.5) and g.late(0.51)
    assert not g.stopUntilRead(0.4)
    assert g.stopUntilRead(1.5)
    assert not g.stopUntilRead(1.5)  # once
    assert g.judge(True, [], 1.5).changed and not g.serving
    g.readUp()
    assert g.judge(True, [], 1.6).changed and g.serving


def test_a_node_that_is_not_active_does_not_serve() -> None:
    g = gate()
    g.serving = True
    verdict = g.judge(False, [], 0.0)
    assert not verdict.changed and not g.serving


def test_unsubscribed_peers() -> None:
    views = {1: PeerView(STANDBY, alive=True, leader=0), 2: PeerView(STANDBY, alive=True, leader=0),
             3: PeerView(LEAVING, alive=True), 4: PeerView(ACTIVE, alive=False),
             5: PeerView(STANDBY, alive=True, clockSuspect=True),
             6: PeerView(STANDBY, alive=True, leader=1)}
    inbound = {1: SimpleNamespace(replicating=True), 2: SimpleNamespace(replicating=False),
               6: SimpleNamespace(replicating=True)}
    assert serving.unsubscribed(0, views, inbound) == [2, 6]
