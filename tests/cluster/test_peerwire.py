"""
The peer line format (lockservice.cluster.peerwire): round trips, and
malformed lines refused with Malformed.
"""

from __future__ import annotations

import pytest

from lockservice.cluster import peerwire
from lockservice.cluster.peerwire import Malformed
from lockservice.core.election import ACTIVE, STANDBY, SYNCING
from lockservice.core.table import EXCLUSIVE, READ


def fields(line: bytes) -> list[bytes]:
    return line.rstrip(b"\n").split(b" ")


@pytest.mark.parametrize("term, role, leader, token, suspect, position", [
    (5, ACTIVE, None, 9, False, 0),
    (2**63, STANDBY, 2, 0, True, 77),
])
def test_heartbeats_round_trip(term, role, leader, token, suspect, position) -> None:  # type: ignore[no-untyped-def]
    line = peerwire.heartbeat(term, role, leader, token, suspect, position)
    assert line.endswith(b" suspect") == suspect
    assert peerwire.parseHeartbeat(fields(line)) == (term, role, leader, token, suspect,
                                                     position)


def test_an_unknown_role_reads_as_syncing() -> None:
    assert peerwire.parseHeartbeat(fields(b"HB 1 leading - 3 0")).role == SYNCING


@pytest.mark.parametrize("line", [b"HB", b"HB 1 active -", b"HB x active - 3 0",
                                  b"HB 1 active y 3 0", b"HB 1 \xff - 3"])
def test_malformed_heartbeats(line: bytes) -> None:
    with pytest.raises(Malformed):
        peerwire.parseHeartbeat(fields(line))


def test_snapshot_and_positions_and_terms_round_trip() -> None:
    assert peerwire.parseSnapshotBegins(fields(peerwire.snapshotBegins(7, 8))) == (7, 8)
    assert peerwire.parsePosition(fields(peerwire.positionLine(12))) == 12
    assert peerwire.parsePosition(fields(peerwire.ackLine(b"12"))) == 12
    for build in (peerwire.handoff, peerwire.taken, peerwire.refused):
        assert peerwire.parseTerm(fields(build(99))) == 99
    assert peerwire.parseOffer(fields(b"OFFER 1 77 5")) == (1, 77, 5)


@pytest.mark.parametrize("parse, line", [
    (peerwire.parseSnapshotBegins, b"SNAP 1"), (peerwire.parseSnapshotBegins, b"SNAP a 1"),
    (peerwire.parsePosition, b"ACK"), (peerwire.parsePosition, b"ACK x"),
    (peerwire.parseTerm, b"HANDOFF"), (peerwire.parseOffer, b"OFFER 1 2"),
])
def test_malformed_short_lines(parse, line: bytes) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Malformed):
        parse(fields(line))


def test_the_last_position_of_a_read() -> None:
    assert peerwire.lastPosition([b"G k 1 2 3", b"S 7", b"G j 2 2 3", b"S 8\r"]) == b"8"
    assert peerwire.lastPosition([b"HB 1 active - 3 0"]) is None


def test_changes_round_trip_in_order() -> None:
    now = 100.0
    lines = [peerwire.grantLine(b"a", 11, 5_000_000, 1_000_000),
             peerwire.dropLine(b"a", 11),
             peerwire.HELD_LINE % (b"b", 12, 2_000_000, 0, b"web#1"),
             peerwire.grantLine(b"r", 13, 3_000_000, 0, READ, b"reader"),
             peerwire.grantLine(b"p", 14, 4_000_000, 0, 3, None, delayed=True)]
    parsed = peerwire.parseChanges([line.rstrip(b"\n") for line in lines], now, 10**6)
    assert parsed.malformed == [] and parsed.implausible == []
    assert parsed.changes == [(b"a", 11, 99.0, 105.0, EXCLUSIVE, None, False),
                              (b"a", 11, 0.0, None, EXCLUSIVE, None, False),
                              (b"b", 12, 100.0, 102.0, EXCLUSIVE, b"web#1", False),
                              (b"r", 13, 100.0, 103.0, READ, b"reader", False),
                              (b"p", 14, 100.0, 104.0, 3, None, True)]
    assert lines[4] == b"G p 14 4000000 0 3 - d\n"


def test_malformed_and_implausible_changes_are_left_out() -> None:
    parsed = peerwire.parseChanges(
        [b"G a x 1 0 1 -", b"G b 1", b"D", b"G c 2 1 0 zz -", b"G d 999 1 0 1 -", b"D d 999",
         b"G e 3 1000000 0 1 -\r", b"G f 4 1 0 1", b"G g 5 1 0 1 - x"], 0.0, 100)
    assert [f[0:2] for f in parsed.malformed] == [[b"G", b"a"], [b"G", b"b"], [b"D"],
                                                  [b"G", b"c"], [b"G", b"f"], [b"G", b"g"]]
    assert parsed.implausible == [999]
    # A drop is kept whatever its token: it ends nothing we rely on.
    assert parsed.changes == [(b"d", 999, 0.0, None, EXCLUSIVE, None, False),
                              (b"e", 3, 0.0, 1.0, EXCLUSIVE, None, False)]


def test_an_offer_round_trips() -> None:
    data = peerwire.offerLines((1, 77, 5), [(b"gone", 5)],
                               [(b"k", 9, 30_000_000, 1_000_000, EXCLUSIVE, b"me", False),
                                (b"r", 10, 20_000_000, 0, READ, None, True)])
    lines = data.rstrip(b"\n").split(b"\n")
    assert peerwire.parseOffer(fields(lines[0])) == (1, 77, 5)
    offered = [peerwire.parseOffered(line) for line in lines[1:]]
    assert offered == [(True, b"gone", 5, 0.0, 0.0, EXCLUSIVE, None, False),
                       (False, b"k", 9, 30.0, 1.0, EXCLUSIVE, b"me", False),
                       (False, b"r", 10, 20.0, 0.0, READ, None, True)]
    assert peerwire.offerLines((1, 77, 5), [], []) == b"OFFER 1 77 5\n"


@pytest.mark.parametrize("line", [b"MERGE k", b"MERGE k x 1 0 1 -", b"MERGE k 1 2",
                                  b"MERGE k 1 2 3 zz -", b"MERGE k 1 2 3 1", b"RELEASED k",
                                  b"MERGE k 1 2 3 1 - e"])
def test_malformed_offered_lines(line: bytes) -> None:
    with pytest.raises(Malformed):
        peerwire.parseOffered(line)


def test_shared_lines_carry_their_share() -> None:
    lines = peerwire.sharedLines(b"H", b"r", [(9, 99.0, 130.0, READ, b"x", False)], 100.0)
    assert lines == [b"H r 9 30000000 1000000 r x"]
    assert peerwire.grantFields(fields(lines[0])) == (READ, b"x", False)
    assert peerwire.grantFields(fields(b"H k 9 1 0 1 - d")) == (EXCLUSIVE, None, True)
    with pytest.raises(Malformed):
        peerwire.grantFields(fields(b"H k 9 1 0 zz -"))


def test_the_handshake_lines() -> None:
    assert peerwire.hello(b"2", b"a:1", b"b:2", b"ab" * 16) == b"HELLO 2 a:1 b:2 " + b"ab" * 16
    assert fields(peerwire.challenge(b"3", b"n", b"m")) == [b"CHALLENGE", b"3", b"n", b"m"]
    assert peerwire.auth(b"m") == b"AUTH m" and peerwire.welcome(b"m") == b"WELCOME m"
    assert peerwire.refusal(b"bad peer hello") == b"E * * bad peer hello"
