"""
The group extension (what tooz needs beyond locks): the registry, its
requests on the client port, its replication, heals and the state file.
"""

from __future__ import annotations

import os
from typing import List

import pytest
from twisted.internet.task import Clock

from lockservice.core.groups import (
    EXISTS,
    NONE,
    NOTEMPTY,
    NOTJOINED,
    OK,
    GroupRecord,
    Registry,
    escape,
    unescape,
)
from lockservice.server.service import LockService
from lockservice.state import NodeState, StateDir
from tests.support.cluster import NOW_US, Lab, activeWithFollower, following, lines
from tests.support.protocol import Node

# -- the registry ---------------------------------------------------------------


def test_groups_exist_empty_and_are_deleted_only_when_empty() -> None:
    r = Registry()
    assert r.create(b"g", 5) == OK and r.create(b"g", 6) == EXISTS
    assert r.delete(b"nope", 0.0) == NONE
    assert r.join(b"g", b"m", 10.0, b"caps", now=0.0, wall=7) == OK
    assert r.join(b"g", b"m", 10.0, b"", now=1.0, wall=8) == EXISTS
    assert r.delete(b"g", 1.0) == NOTEMPTY
    assert r.leave(b"g", b"m", 1.0) == OK and r.leave(b"g", b"m", 1.0) == NOTJOINED
    assert r.delete(b"g", 1.0) == OK and r.list(None, 10) == ([], None)


def test_a_member_that_stops_beating_is_gone_when_its_lease_runs_out() -> None:
    r = Registry()
    r.create(b"g", 0)
    r.join(b"g", b"quiet", 5.0, b"", now=0.0, wall=0)
    r.join(b"g", b"beating", 5.0, b"", now=0.0, wall=0)
    assert r.beat(b"g", b"beating", 5.0, now=4.0) == OK
    assert r.membersOf(b"g", None, 10, now=4.9) == ([b"beating", b"quiet"], None)
    assert r.membersOf(b"g", None, 10, now=5.0) == ([b"beating"], None)
    assert r.beat(b"g", b"quiet", 5.0, now=5.0) == NOTJOINED
    assert r.members == 1


def test_members_and_groups_come_in_pages() -> None:
    r = Registry()
    for g in (b"c", b"a", b"b"):
        r.create(g, 0)
    assert r.list(None, 2) == ([b"a", b"b"], b"b")
    assert r.list(b"b", 2) == ([b"c"], None)
    for m in (b"m3", b"m1", b"m2"):
        r.join(b"a", m, 9.0, b"", now=0.0, wall=0)
    assert r.membersOf(b"a", None, 1, 0.0) == ([b"m1"], b"m1")
    assert r.membersOf(b"a", b"m2", 5, 0.0) == ([b"m3"], None)
    assert r.membersOf(b"nope", None, 5, 0.0) is None


@pytest.mark.parametrize("blob", [b"", b"-", b"plain{json:1}", b"% and spaces\n\x00\xff",
                                  bytes(range(256))])
def test_a_capability_blob_escapes_to_one_field_and_back(blob: bytes) -> None:
    field = escape(blob)
    assert b" " not in field and b"\n" not in field and field
    assert unescape(field) == blob


# -- on the client port --------------------------------------------------------------


def test_the_requests_and_their_answers() -> None:
    node = Node()
    c = node.connect()
    assert c.ask(b"GCREATE g") == b"GCREATE g OK\n"
    assert c.ask(b"GJOIN g m1 30 %7B%22a%22:1%7D") == b"GJOIN g m1 OK\n"
    assert c.ask(b"GJOIN g m2 30 -") == b"GJOIN g m2 OK\n"
    assert c.ask(b"GMEMBERS g - 1") == b"GMEMBERS g OK m1 m1\n"
    assert c.ask(b"GMEMBERS g m1 1") == b"GMEMBERS g OK - m2\n"
    info = c.ask(b"GINFO g m1").split()
    assert info[:4] == [b"GINFO", b"g", b"m1", b"OK"] and unescape(info[4]) == b'{"a":1}'
    assert c.ask(b"GCAPS g m1 v2") == b"GCAPS g m1 OK\n"
    assert c.ask(b"GINFO g m1").split()[4] == b"v2"
    assert c.ask(b"GLIST - 10") == b"GLIST - - g\n"
    assert c.ask(b"GDELETE g") == b"GDELETE g NOTEMPTY\n"
    node.clock.advance(30)  # neither beat: both gone
    assert c.ask(b"GMEMBERS g - 10") == b"GMEMBERS g OK -\n"
    assert c.ask(b"GDELETE g") == b"GDELETE g OK\n"
    assert c.ask(b"GJOIN g m1 30 -") == b"GJOIN g m1 NONE\n"
    assert c.ask(b"GINFO g m1") == b"GINFO g m1 NONE\n"


@pytest.mark.parametrize("line, answer", [
    (b"GJOIN g", b"E GJOIN g expected: GJOIN <group> <member> <lease> <caps>\n"),
    (b"GJOIN g m 0 -", b"E GJOIN g bad lease: seconds, 0 < lease <= 86400, digits only\n"),
    (b"GJOIN g m 30 %zz", b"E GJOIN g bad capabilities: printable ASCII, other bytes as %XX, "
                          b"- for none\n"),
    (b"GMEMBERS g - 0", b"E GMEMBERS g bad limit: 1-100\n"),
    (b"GMEMBERS g - 101", b"E GMEMBERS g bad limit: 1-100\n"),
    (b"GCREATE g extra", b"E GCREATE g expected: GCREATE <group>\n"),
    (b"GCREATE", b"E GCREATE * expected: GCREATE <group>\n"),
    (b"GNOPE g", b"E * g unknown operation\n"),
])
def test_a_bad_group_request_is_answered_E_and_the_connection_stays_usable(
        line: bytes, answer: bytes) -> None:
    c = Node().connect()
    assert c.ask(line) == answer
    assert c.ask(b"P x") == b"P x\n"


def test_capabilities_over_3_KiB_are_refused() -> None:
    c = Node().connect()
    c.ask(b"GCREATE g")
    assert c.ask(b"GJOIN g m 30 " + b"x" * 3073) == (
        b"E GJOIN g capabilities over 3072 bytes\n")
    assert c.ask(b"GJOIN g m 30 " + b"x" * 3072) == b"GJOIN g m OK\n"


def test_a_standby_redirects_group_requests() -> None:
    node = Node()
    node.service.setRole("standby", b"a:7700")
    assert node.connect().ask(b"GJOIN g m 30 -") == b"M GJOIN g a:7700\n"


# -- replicated, kept by failover, heals and restarts ---------------------------------


def test_groups_reach_the_standbys_by_snapshot_and_stream() -> None:
    lab = Lab()
    lab.locks.groups.registry.create(b"early", NOW_US)
    follower = activeWithFollower(lab)
    lab.client()
    lab.ask(b"GCREATE g")
    lab.ask(b"GJOIN g m 30 caps")
    lab.ask(b"GLEAVE g m")
    lab.ask(b"GDELETE g")
    sent = lines(follower)
    assert [line.split()[0] for line in sent] == [b"GG", b"GM", b"GL", b"GD"]
    # A standby that syncs gets the groups with the snapshot.
    standby = Lab(me=1)
    leader = following(standby, leader=0)
    standby.hear(leader, b"SNAP %d 1" % NOW_US, b"GG early %d" % NOW_US,
                 b"GM early m %d %d 20000000 caps" % (NOW_US, NOW_US), b"SNAPEND",
                 b"GG later %d" % NOW_US, b"GL early m")
    registry = standby.locks.groups.registry
    assert sorted(registry.groups) == [b"early", b"later"]
    assert registry.membersOf(b"early", None, 10, standby.clock.seconds()) == ([], None)


def test_a_standby_promoted_keeps_the_groups_and_their_leases() -> None:
    standby = Lab(me=1)
    leader = following(standby, leader=0)
    standby.hear(leader, b"SNAP %d 1" % NOW_US, b"GG g %d" % NOW_US,
                 b"GM g m %d %d 5000000 -" % (NOW_US, NOW_US), b"SNAPEND")
    standby.cluster.views[0].alive = False
    standby.cluster._promote()
    standby.client()
    assert standby.ask(b"GMEMBERS g - 10") == b"GMEMBERS g OK - m\n"
    standby.clock.advance(5)
    assert standby.ask(b"GMEMBERS g - 10") == b"GMEMBERS g OK -\n"


def test_a_heal_keeps_both_sides_groups_and_the_later_lease() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.client()
    lab.ask(b"GCREATE ours")
    lab.ask(b"GCREATE both")
    lab.ask(b"GJOIN both m 10 mine")
    lines(follower)
    loser = lab.link(2, outbound=False)
    lab.hear(loser, b"OFFER 2 %d 0" % NOW_US, b"GG theirs %d" % NOW_US,
             b"GM both m %d %d 60000000 theirs" % (NOW_US, NOW_US), b"SYNC")
    registry = lab.locks.groups.registry
    assert sorted(registry.groups) == [b"both", b"ours", b"theirs"]
    info = registry.info(b"both", b"m", lab.clock.seconds())[1]
    assert info is not None and info.capabilities == b"theirs"
    assert info.expiresAt == lab.clock.seconds() + 60
    # ... and our standbys hear of what the heal brought.
    lab.clock.advance(0)
    assert {line.split()[1] for line in lines(follower) if line[:2] == b"GG"} >= {b"theirs"}


def test_groups_and_members_survive_a_graceful_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [5_000_000_000_000]
    boot = lambda: ("b", now[0])  # noqa: E731

    def start() -> List[object]:
        locks = LockService(Clock(), lambda: now[0])
        state = NodeState(StateDir(str(tmp_path), "c", ""), lambda: now[0], boot=boot)
        state.start(locks)
        return [locks, state]

    locks, state = start()
    locks.groups.registry.create(b"g", now[0])  # type: ignore[attr-defined]
    locks.groups.registry.join(b"g", b"short", 2.0, b"", 0.0, now[0])  # type: ignore[attr-defined]
    locks.groups.registry.join(b"g", b"long", 60.0, b"c", 0.0, now[0])  # type: ignore[attr-defined]
    state.stopped(locks, keepLocks=True)  # type: ignore[attr-defined]
    os.close(state.directory._lock)  # type: ignore[attr-defined]
    now[0] += 3_000_000  # down 3 s: "short" ran out meanwhile
    locks, state = start()
    registry = locks.groups.registry  # type: ignore[attr-defined]
    assert registry.membersOf(b"g", None, 10, 0.0) == ([b"long"], None)
    record = registry.record(b"g", b"long")
    assert record == GroupRecord(b"g", b"long", 5_000_000_000_000, 5_000_000_000_000,
                                 pytest.approx(57.0), b"c")
