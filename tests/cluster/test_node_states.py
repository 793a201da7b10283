"""
The node's states (lockservice.cluster.serving): which one a node is in,
the role it shows for it, and what its lock service does then
(lockservice.server.modes), as /status reports them.
"""

from __future__ import annotations

from typing import List, Tuple

from lockservice.cluster import serving
from lockservice.cluster.serving import MOVES, ROLE_OF, NodeState
from lockservice.core.election import ACTIVE, HANDING_OFF, ROLES, STANDBY
from lockservice.server import modes
from lockservice.server.webpages import status
from tests.support.cluster import NOW_US, Lab, activeWithFollower


def _ticks(lab: Lab, seconds: float) -> None:
    for _ in range(round(seconds / 0.1)):
        lab.clock.advance(0.1)
        lab.cluster.tick()


def test_every_state_shows_a_role_and_every_role_has_a_state() -> None:
    assert set(ROLE_OF) == set(MOVES)
    assert set(ROLE_OF.values()) == set(ROLES)
    assert serving.FROZEN <= set(MOVES)
    assert MOVES[serving.LEAVING] == frozenset()


def test_a_move_the_table_does_not_list_is_reported_and_made() -> None:
    unexpected: List[Tuple[str, str]] = []
    state = NodeState(lambda before, to: unexpected.append((before, to)))
    assert state.current == serving.SYNCING and state.role == "syncing"
    assert state.move(serving.STANDBY) and not unexpected
    assert not state.move(serving.STANDBY)
    state.move(serving.LEAVING)
    state.move(serving.SERVING)
    assert unexpected == [(serving.LEAVING, serving.SERVING)]
    assert state.current == serving.SERVING and state.role == ACTIVE


def test_the_lock_service_modes_follow_the_roles_it_shows() -> None:
    assert modes.modeOf(ACTIVE) == modes.SERVING
    assert modes.modeOf(HANDING_OFF) == modes.FROZEN
    assert modes.modeOf(STANDBY) == modes.REDIRECTING
    assert modes.roleShown(modes.FROZEN, None) == HANDING_OFF
    assert modes.roleShown(modes.REDIRECTING, "leaving") == "leaving"


def test_a_new_active_awaits_its_standbys_and_shows_handing_off_meanwhile() -> None:
    lab = Lab()
    assert lab.cluster.state == serving.SYNCING
    lab.hear(lab.link(1, outbound=False), b"HB %d standby - 1 0" % NOW_US)
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)  # node 1 is live and does not take our stream yet
    report = status(lab.locks, lab.cluster)
    assert (report["role"], report["state"]) == ("handing-off", "awaiting-standbys")
    assert lab.cluster.role == ACTIVE and lab.locks.mode == modes.FROZEN


def test_an_active_that_did_not_run_reads_its_peers_before_it_serves_again() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    _ticks(lab, 0.3)
    assert status(lab.locks, lab.cluster)["state"] == serving.SERVING
    lab.clock.advance(1.5)  # stopped
    lab.cluster.tick()  # late: read the peers first
    report = status(lab.locks, lab.cluster)
    assert (report["role"], report["state"]) == ("handing-off", "reading-peers")
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    lab.clock.advance(0)
    report = status(lab.locks, lab.cluster)
    assert (report["role"], report["state"]) == ("active", "serving")


def test_a_handoff_is_shown_as_one() -> None:
    lab = Lab()
    activeWithFollower(lab)
    lab.cluster.handingOff()
    report = status(lab.locks, lab.cluster)
    assert (report["role"], report["state"]) == ("handing-off", "handing-off")
    assert lab.cluster.role == HANDING_OFF and lab.locks.mode == modes.FROZEN
    lab.cluster.handoffFailed()
    assert lab.cluster.role == ACTIVE


def test_a_single_node_reports_its_lock_service_mode() -> None:
    lab = Lab()
    lab.locks.setRole(ACTIVE, None)
    assert status(lab.locks, None)["state"] == "serving"
    lab.locks.setRole(HANDING_OFF, None)
    assert status(lab.locks, None)["state"] == "frozen"
