"""
The pure election rules.
"""

from __future__ import annotations

from lockservice.core.election import (
    ACTIVE,
    HANDING_OFF,
    LEAVING,
    STANDBY,
    SYNCING,
    Action,
    PeerView,
    SelfView,
    decide,
)


def me(role: str, term: int = 1, leader=None, grace: bool = True) -> SelfView:  # type: ignore[no-untyped-def]
    return SelfView(role, term, leader, grace)


def peer(role: str, term: int = 1, leader=None, alive: bool = True) -> PeerView:  # type: ignore[no-untyped-def]
    return PeerView(role, term, leader, alive)


def test_standby_follows_the_highest_priority_active() -> None:
    assert decide(2, me(STANDBY), {0: peer(ACTIVE), 1: peer(ACTIVE, 2)}) == Action("follow", 0)
    assert decide(2, me(STANDBY, leader=0), {0: peer(ACTIVE), 1: peer(STANDBY)}) is None


def test_standby_promotes_when_active_dies_and_it_is_highest_stateful() -> None:
    peers = {0: peer(ACTIVE, alive=False), 2: peer(STANDBY, leader=0)}
    assert decide(1, me(STANDBY, leader=0), peers) == Action("promote")
    peers = {0: peer(ACTIVE, alive=False), 1: peer(STANDBY, leader=0)}
    assert decide(2, me(STANDBY, leader=0), peers) is None


def test_lower_standby_promotes_when_higher_node_is_only_syncing() -> None:
    peers = {0: peer(SYNCING), 1: peer(ACTIVE, alive=False)}
    assert decide(2, me(STANDBY, leader=1), peers) == Action("promote")


def test_handing_off_node_counts_as_serving_so_nobody_promotes() -> None:
    peers = {0: peer(HANDING_OFF), 2: peer(STANDBY, leader=0)}
    assert decide(1, me(STANDBY, leader=0), peers) is None


def test_leaving_node_does_not_count() -> None:
    peers = {0: peer(LEAVING), 2: peer(STANDBY)}
    assert decide(1, me(STANDBY, leader=0), peers) == Action("promote")


def test_lower_priority_active_steps_down_for_equal_or_higher_term() -> None:
    assert decide(1, me(ACTIVE, 5), {0: peer(ACTIVE, 5)}) == Action("step-down", 0)
    assert decide(1, me(ACTIVE, 5), {0: peer(ACTIVE, 7)}) == Action("step-down", 0)


def test_stale_heartbeat_from_before_handoff_does_not_demote_new_active() -> None:
    assert decide(1, me(ACTIVE, 6), {0: peer(ACTIVE, 5)}) is None


def test_higher_priority_active_outranks_a_newer_term() -> None:
    assert decide(0, me(ACTIVE, 5), {1: peer(ACTIVE, 6)}) == Action("bump-term", term=7)
    assert decide(0, me(ACTIVE, 7), {1: peer(ACTIVE, 6)}) is None


def test_active_hands_off_to_synced_higher_priority_node() -> None:
    assert decide(1, me(ACTIVE), {0: peer(STANDBY, leader=1)}) == Action("hand-off", 0)
    assert decide(1, me(ACTIVE), {0: peer(SYNCING, leader=1)}) is None
    assert decide(1, me(ACTIVE), {2: peer(STANDBY, leader=1)}) is None


def test_syncing_node_waits_for_grace_then_promotes_if_alone() -> None:
    assert decide(0, me(SYNCING, grace=False), {1: peer(SYNCING, alive=False)}) is None
    assert decide(0, me(SYNCING), {1: peer(SYNCING, alive=False)}) == Action("promote")


def test_syncing_node_never_promotes_over_stateful_peer() -> None:
    assert decide(0, me(SYNCING), {1: peer(STANDBY)}) is None


def test_fresh_cluster_highest_priority_syncing_node_promotes() -> None:
    peers = {1: peer(SYNCING), 2: peer(SYNCING)}
    assert decide(0, me(SYNCING), peers) == Action("promote")
    assert decide(1, me(SYNCING), {0: peer(SYNCING), 2: peer(SYNCING)}) is None


def test_in_transit_nodes_do_nothing() -> None:
    assert decide(0, me(HANDING_OFF), {1: peer(ACTIVE, 9)}) is None
    assert decide(0, me(LEAVING), {}) is None


def test_a_peer_that_distrusts_its_clock_is_neither_waited_for_nor_handed_the_role() -> None:
    """
    Issue 21 item 5: a node far behind stands by saying "suspect"; the
    others promote past it and never hand off to it.
    """
    suspect = PeerView(STANDBY, 1, 1, True, clockSuspect=True)
    peers = {0: suspect, 1: peer(ACTIVE, alive=False)}
    assert decide(2, me(STANDBY, leader=1), peers) == Action("promote")
    assert decide(1, me(ACTIVE, 5), {0: PeerView(STANDBY, 1, 1, True, clockSuspect=True)}) is None
    assert decide(1, me(SYNCING), {0: PeerView(SYNCING, 1, None, True, clockSuspect=True)}) \
        == Action("promote")


def test_the_standby_whose_copy_of_the_stream_goes_furthest_promotes() -> None:
    """
    Node1's link to the active was cut one way while the active went on
    (releases node2 acknowledged): node1's copy is shorter.  When the
    active dies node2 promotes over node1, whose priority is higher;
    equal copies, or copies of different leaders' streams, leave it to
    priority.
    """
    dead = peer(ACTIVE, alive=False)
    ahead = PeerView(STANDBY, 1, 0, True, position=120)
    behind = PeerView(STANDBY, 1, 0, True, position=100)
    assert decide(1, SelfView(STANDBY, 1, 0, True, position=100), {0: dead, 2: ahead}) is None
    assert decide(2, SelfView(STANDBY, 1, 0, True, position=120),
                  {0: dead, 1: behind}) == Action("promote")
    level = PeerView(STANDBY, 1, 0, True, position=120)
    assert decide(1, SelfView(STANDBY, 1, 0, True, position=120),
                  {0: dead, 2: level}) == Action("promote")
    assert decide(2, SelfView(STANDBY, 1, 0, True, position=120), {0: dead, 1: level}) is None
    # Another leader's stream: positions do not compare; priority decides.
    other = PeerView(STANDBY, 1, 3, True, position=999)
    assert decide(1, SelfView(STANDBY, 1, 0, True, position=100),
                  {0: dead, 2: other}) == Action("promote")
