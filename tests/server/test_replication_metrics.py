"""
What /status and /metrics tell of acknowledged replication: the standbys
in sync (those answers wait for), and how long writes waited for every
one's acknowledgement (median, 99th percentile).
"""

from __future__ import annotations

from typing import Any

from lockservice.server.metrics import Metrics
from lockservice.server.webpages import status
from tests.support.cluster import Lab, activeWithFollower, lines


def test_status_and_metrics_show_the_standbys_in_sync_and_the_ack_wait() -> None:
    lab = Lab(replication="ack")
    assert status(lab.locks, lab.cluster)["replication"] == {
        "mode": "ack", "in_sync_standbys": 0, "ack_wait_p50_ms": None,
        "ack_wait_p99_ms": None}
    follower = activeWithFollower(lab)
    lab.client()
    protocol: Any = lab.protocol
    for wait in (0.002, 0.002, 0.010):
        assert lab.ask(b"P x") == b"P x\n"  # nothing changed: nothing waits
        protocol.dataReceived(b"A k 30 0\n")
        lab.clock.advance(0)
        position = lines(follower, positions=True)[-1].split()[1]
        lab.clock.advance(wait)
        assert lab.protocol.transport.value() == b""  # type: ignore[union-attr]
        follower.dataReceived(b"ACK " + position + b"\n")
        answer = lab.protocol.transport.value()  # type: ignore[union-attr]
        lab.protocol.transport.clear()  # type: ignore[union-attr]
        assert lab.ask(b"R k " + answer.split()[2]) == b""  # held until acknowledged
        lab.clock.advance(0.001)
        follower.dataReceived(b"ACK %d\n" % lab.cluster.stream.position)
        assert lab.protocol.transport.value() == b"R k OK\n"  # type: ignore[union-attr]
        lab.protocol.transport.clear()  # type: ignore[union-attr]
    figures = status(lab.locks, lab.cluster)["replication"]
    assert figures["mode"] == "ack" and figures["in_sync_standbys"] == 1
    assert figures["ack_wait_p50_ms"] == 2.0
    assert figures["ack_wait_p99_ms"] == 10.0
    text = Metrics(lab.locks, lab.cluster).render().decode()
    assert "lockservice_in_sync_standbys 1.0" in text
    assert 'lockservice_replication_ack_wait_seconds{quantile="0.5"} 0.002' in text
    assert 'lockservice_replication_ack_wait_seconds{quantile="0.99"} 0.01' in text


def test_with_replication_sent_nothing_waits_for_an_acknowledgement() -> None:
    lab = Lab(replication="sent")
    activeWithFollower(lab)
    lab.client()
    assert lab.ask(b"A k 30 0").startswith(b"A k ")
    figures = status(lab.locks, lab.cluster)["replication"]
    assert figures == {"mode": "sent", "in_sync_standbys": 1, "ack_wait_p50_ms": None,
                       "ack_wait_p99_ms": None}
    assert "lockservice_in_sync_standbys 1.0" in Metrics(lab.locks, lab.cluster).render().decode()
