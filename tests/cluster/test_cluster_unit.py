"""
The cluster layer in-process: replication stream, merge on heal,
liveness and handoff, with StringTransport links and a task.Clock (no
sockets, no sleeping).
"""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure

from lockservice.cluster import handoff, merge, replication, terms
from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE, HANDING_OFF, STANDBY, SYNCING
from tests.support.cluster import (
    NOW_US,
    PEERS,
    Lab,
    activeWithFollower,
    following,
    lines,
    winnerHolding,
)


def test_changes_reach_the_standby_before_the_client_hears() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    client = lab.client()
    lab.log.clear()
    granted = lab.ask(b"A k 30 0")
    assert granted.startswith(b"A k ")
    token = granted.split()[2].strip()
    assert lab.ask(b"N k " + token + b" 60") == b"N k OK\n"
    assert lab.ask(b"R k " + token) == b"R k OK\n"
    where = [name for name, _ in lab.log]
    # Each answer comes after the change went to the follower.
    assert where == ["in1", "client"] * 3, lab.log
    stream = lines(follower)
    assert [line.split()[0] for line in stream] == [b"G", b"G", b"D"]
    assert stream[1].split()[3] == b"60000000"  # the renewal's new lease
    assert client is lab.protocol.transport


def test_a_turn_of_changes_goes_in_one_write() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.client()
    lab.log.clear()
    lab.protocol.dataReceived(b"".join(b"A k%d 30 0\n" % i for i in range(50)))
    assert lab.log == []  # nothing leaves before the end of the reactor turn
    lab.clock.advance(0)
    assert [name for name, _ in lab.log] == ["in1", "client"]
    assert len(lines(follower)) == 50


def test_a_turn_of_changes_costs_one_end_of_turn_call() -> None:
    """
    The stream leaves with the turn's answers: it schedules no flush of
    its own while the lock service's turn is open (one C{callLater(0)} per
    reactor turn, not two).
    """
    lab = Lab()
    activeWithFollower(lab)
    lab.client()
    assert not lab.clock.getDelayedCalls()
    lab.protocol.dataReceived(b"A k1 30 0\nA k2 30 0\n")
    due = [c for c in lab.clock.getDelayedCalls() if c.getTime() <= lab.clock.seconds()]
    assert len(due) == 1, due


def test_every_connection_of_a_reactor_turn_shares_one_replication_write() -> None:
    """
    The connections the reactor found readable in one iteration are
    answered together at its end, after one write per standby carrying all
    their changes (not one write per standby per connection).
    """
    lab = Lab()
    follower = activeWithFollower(lab)
    clients = []
    for _ in range(4):
        lab.client()
        clients.append(lab.protocol)
    lab.log.clear()
    for i, protocol in enumerate(clients):
        protocol.dataReceived(b"A c%d 30 0\n" % i)
    assert lab.log == []
    lab.clock.advance(0)
    where = [name for name, _ in lab.log]
    assert where == ["in1"] + ["client"] * 4, where
    assert len(lines(follower)) == 4
    for i, protocol in enumerate(clients):
        assert protocol.transport.value().startswith(b"A c%d " % i)  # type: ignore[union-attr]


def test_answers_wait_while_a_standby_leaves_the_stream_unread() -> None:
    """
    A stopped or overloaded standby leaves our writes in this host's send
    queue, where a kill -9 would lose them: the answers that report those
    changes (and every answer after them) wait until it has taken them.
    """
    from lockservice.server.service import HOLD_RETRY

    lab = Lab()
    follower = activeWithFollower(lab)
    unsent = {"now": True}
    lab.cluster.stream.leftUnsent = lambda channel: unsent["now"]
    lab.client()
    client = lab.protocol.transport
    assert lab.ask(b"A k 30 0") == b""  # held: the standby has not taken it
    assert lab.ask(b"P x") == b""  # answers keep their order behind it
    lab.clock.advance(HOLD_RETRY)
    assert client.value() == b""  # type: ignore[union-attr]
    unsent["now"] = False
    lab.clock.advance(HOLD_RETRY)
    answers = client.value().split(b"\n")  # type: ignore[union-attr]
    assert answers[0].startswith(b"A k ") and answers[1] == b"P x"
    assert [line.split()[0] for line in lines(follower)] == [b"G"]


def test_a_standby_that_reads_nothing_for_peer_timeout_is_cut_off() -> None:
    from lockservice.server.service import HOLD_RETRY

    lab = Lab()
    follower = activeWithFollower(lab)
    lab.cluster.stream.leftUnsent = lambda channel: True
    lab.client()
    assert lab.ask(b"A k 30 0") == b""
    waited = 0.0
    while not lab.protocol.transport.value() and waited < 5:  # type: ignore[union-attr]
        lab.clock.advance(HOLD_RETRY * 10)
        waited += HOLD_RETRY * 10
    assert lab.protocol.transport.value().startswith(b"A k ")  # type: ignore[union-attr]
    assert lab.cluster.peerTimeout <= waited < lab.cluster.peerTimeout + 0.1
    assert follower.lagging and follower.transport.disconnecting  # type: ignore[attr-defined]


def test_a_follower_still_syncing_is_not_waited_for() -> None:
    lab = Lab()
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    follower = lab.link(1, outbound=False)
    lab.hear(follower, b"SYNC")  # its snapshot is not sent yet
    lab.cluster.stream.leftUnsent = lambda channel: True
    assert not follower.synced
    lab.client()
    assert lab.ask(b"P x") == b"P x\n"


def test_an_expiry_with_no_answer_leaves_in_the_same_turn() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.client()
    lab.ask(b"A k 5 0")
    lines(follower)
    lab.clock.advance(5)
    lab.clock.advance(0)
    assert [line.split()[0] for line in lines(follower)] == [b"D"]


# -- applying the stream -----------------------------------------------------


def test_a_standby_applies_snapshot_and_stream_with_ages_and_term() -> None:
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 42" % NOW_US, b"H a 7 10000000 3000000 1 -",
             b"H b 8 20000000 0 1 -", b"SNAPEND", b"G c 9 5000000 0 1 -", b"D b 8")
    assert lab.cluster.role == STANDBY
    assert b"SYNCED" in lines(leader)  # the leader may forget its notes
    assert lab.cluster.term == NOW_US  # a standby shows its active's term
    held = dict(lab.locks.heldKeys())
    assert sorted(held) == [b"a", b"c"]
    now = lab.clock.seconds()
    assert held[b"a"].expiresAt == now + 10 and held[b"a"].grantedAt == now - 3
    assert lab.locks.lastToken() == 42


def test_a_forged_huge_token_or_term_changes_nothing() -> None:
    lab = Lab(me=1)
    leader = following(lab)
    before = lab.locks.lastToken()
    top = 2**64 - 1
    lab.hear(leader, b"HB 0 active - %d 0" % top, b"HB %d active - 1 0" % top,
             b"SNAP %d 1" % top, b"G k %d 1000 0 1 -" % top)
    assert lab.locks.lastToken() == before
    assert lab.cluster.maxTerm < top and lab.cluster.views[0].term < top
    assert dict(lab.locks.heldKeys()) == {}
    # Within an hour of our clock is fine.
    lab.hear(leader, b"HB %d active - %d 0" % (NOW_US, NOW_US + 3599 * 10**6))
    assert lab.locks.lastToken() == NOW_US + 3599 * 10**6


def test_stream_lines_from_a_non_leader_are_ignored() -> None:
    lab = Lab(me=2)
    leader = following(lab, leader=0)
    other = lab.link(1, outbound=True)
    lab.hear(other, b"G k 9 5000000 0 1 -")
    assert dict(lab.locks.heldKeys()) == {}
    lab.hear(leader, b"G k 10 5000000 0 1 -")
    lab.hear(other, b"D k 10")
    assert [(k, h.token) for k, h in lab.locks.heldKeys()] == [(b"k", 10)]


def test_a_run_of_changes_applies_in_order_and_skips_bad_lines() -> None:
    """
    A busy stream alternates grants and drops; one run is applied in
    order, a malformed line is skipped (and logged), the rest still apply.
    """
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"SNAPEND",
             b"G a 11 5000000 0 1 -", b"D a 11", b"G a 12 5000000 0 1 -", b"D zz",
             b"G b 13 5000000 0 1 -", b"D b 99", b"G c 14 5000000 0 1 -", b"D c 14")
    assert sorted((k, h.token) for k, h in lab.locks.heldKeys()) == [(b"a", 12), (b"b", 13)]


# -- acknowledged replication (--replication ack) ------------------------------


def test_with_ack_answers_wait_until_the_standby_acknowledged_them() -> None:
    """
    Issue 24 item 3: each flush ends with its stream position; a client's
    answer goes out only once every synchronised standby acknowledged that
    position, in order.
    """
    lab = Lab(replication="ack")
    follower = activeWithFollower(lab)
    lab.client()
    lab.protocol.dataReceived(b"A k 30 0\n")
    lab.clock.advance(0)
    stream = lines(follower, positions=True)
    assert [line.split()[0] for line in stream] == [b"G", b"S"]
    position = int(stream[-1].split()[1])
    lab.clock.advance(0.01)
    assert lab.protocol.transport.value() == b""  # type: ignore[union-attr]
    lab.protocol.dataReceived(b"P later\n")  # answers stay in order
    lab.clock.advance(0.01)
    assert lab.protocol.transport.value() == b""  # type: ignore[union-attr]
    lab.hear(follower, b"ACK %d" % (position - 1))
    lab.clock.advance(0.01)
    assert lab.protocol.transport.value() == b""  # type: ignore[union-attr]
    lab.hear(follower, b"ACK %d" % position)
    lab.clock.advance(0.01)
    answers = lab.protocol.transport.value().split(b"\n")  # type: ignore[union-attr]
    assert answers[0].startswith(b"A k ") and answers[1] == b"P later"


def test_with_ack_acknowledgements_do_not_make_a_timer_each() -> None:
    """
    Held answers are looked at again every HOLD_RETRY until released; an
    acknowledgement releases them at once.  That must not cancel the retry
    and make a new one each time (a timed call per stream position on a
    busy active): one retry stays armed however many positions are
    acknowledged meanwhile.
    """
    lab = Lab(replication="ack")
    follower = activeWithFollower(lab)
    lab.client()
    made: List[str] = []
    callLater = lab.clock.callLater

    def counting(delay: float, f: Any, *a: Any, **kw: Any) -> Any:
        made.append(getattr(f, "__name__", "?"))
        return callLater(delay, f, *a, **kw)

    lab.clock.callLater = counting  # type: ignore[method-assign]
    for n in range(100):
        lab.protocol.dataReceived(b"P %d\n" % n)  # a turn held behind the last change
        lab.protocol.dataReceived(b"A k%d 30 0\n" % n)
        lab.clock.advance(0)
        position = int(lines(follower, positions=True)[-1].split()[1])
        lab.hear(follower, b"ACK %d" % position)
        assert lab.protocol.transport.value().endswith(b"\n")  # type: ignore[union-attr]
        lab.protocol.transport.clear()  # type: ignore[union-attr]
    retries = [name for name in made if name in ("_retried", "_release")]
    assert len(retries) <= 1, retries


def test_a_follower_of_an_earlier_term_holds_no_answer_after_a_handoff_back() -> None:
    """
    A node that led, handed off and leads again: the peers that followed
    it in its earlier term follow another now, and ask again (SYNC) when
    they follow it again.  Their old links must not count as synchronised
    followers meanwhile: answers waited for an acknowledgement they never
    sent (after a rejoin and a SIGINT, every handoff took ~105 ms: until
    the next heartbeat).
    """
    lab = Lab(replication="ack")
    follower = activeWithFollower(lab)
    lab.cluster.setRole(STANDBY)  # handed off: that follower follows the successor
    lab.cluster.setRole(ACTIVE)   # took over again, before it asked again
    assert not follower.synced and not follower.replicating
    lab.client()
    assert lab.ask(b"A k 30 0").startswith(b"A k ")
    lab.hear(follower, b"SYNC")  # it follows this node again: a fresh snapshot
    producer = follower.snapshot
    while producer is not None and not producer.stopped:
        producer.resumeProducing()
    assert follower.synced and b"H k " in follower.transport.value()  # type: ignore[attr-defined]


def test_with_ack_a_standby_that_does_not_acknowledge_is_cut_off() -> None:
    lab = Lab(replication="ack")
    follower = activeWithFollower(lab)
    lab.client()
    lab.protocol.dataReceived(b"A k 30 0\n")
    lab.clock.advance(0)
    for _ in range(110):
        lab.clock.advance(0.01)
    assert follower.lagging and follower.closing
    assert lab.protocol.transport.value().startswith(b"A k ")  # type: ignore[union-attr]


def test_a_standby_acknowledges_each_read_on_receipt_and_reads_unpaced() -> None:
    """
    One ACK per read, for the last position in it, written before the
    read's changes are applied; and no read pacing, which would delay it.
    """
    lab = Lab(me=1, replication="ack")
    leader = following(lab)
    assert not leader.paced
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"SNAPEND")
    lines(leader)
    acked: List[bytes] = []
    applied = lab.cluster.following.applyChanges

    def applyChanges(j, channel, changes):  # type: ignore[no-untyped-def]
        acked.append(lab.log[-1][1])  # what was written before applying
        applied(j, channel, changes)

    lab.cluster.following.applyChanges = applyChanges  # type: ignore[method-assign]
    lab.hear(leader, b"G a 11 5000000 0 1 -", b"S 7", b"G b 12 5000000 0 1 -", b"S 8")
    assert lines(leader) == [b"ACK 8"]
    assert acked[0] == b"ACK 8\n"
    assert sorted(k for k, _ in lab.locks.heldKeys()) == [b"a", b"b"]
    lab.hear(leader, b"HB %d active - 12 0" % NOW_US)
    assert lines(leader) == []  # nothing to acknowledge in that read


# -- merge on heal -------------------------------------------------------------


def test_the_winner_keeps_every_key_and_the_higher_token() -> None:
    lab = Lab()
    follower, (mine, kept), loser = winnerHolding(lab, b"both", b"kept")
    lab.hear(loser, b"MERGE only-theirs 77 20000000 1000000 1 -",
             b"MERGE both %d 30000000 0 1 -" % (mine + 1),
             b"MERGE kept %d 30000000 0 1 -" % (kept - 1), b"SYNC")
    held = dict(lab.locks.heldKeys())
    assert held[b"only-theirs"].token == 77
    assert held[b"both"].token == mine + 1
    assert held[b"kept"].token == kept
    # The merged keys reach the other standbys, and the old holder is stale.
    assert sorted(line.split()[1] for line in lines(follower)) == [b"both", b"only-theirs"]
    assert lab.ask(b"R both %d" % mine) == b"R both STALE\n"
    # A merged lease runs on the winner.
    lab.clock.advance(20)
    assert b"only-theirs" not in dict(lab.locks.heldKeys())


def test_a_renewal_answered_on_the_losing_side_survives_the_heal() -> None:
    """
    The same grant on both sides: the later deadline (a renewal answered
    by the other side during the split) is kept and reaches our standbys;
    our own deadline coming back a little late changes nothing.
    """
    lab = Lab()
    follower, (renewed, same), loser = winnerHolding(lab, b"renewed", b"same")
    lab.hear(loser, b"MERGE renewed %d 900000000 5000000 1 -" % renewed,
             b"MERGE same %d 30500000 0 1 -" % same, b"SYNC")
    now = lab.clock.seconds()
    assert lab.locks.table.expiresAt(b"renewed") == now + 900
    assert lab.locks.table.expiresAt(b"same") == now + 30
    changes = [line for line in lines(follower) if line.startswith(b"G ")]
    assert changes == [b"G renewed %d 900000000 5000000 1 -" % renewed]
    lab.clock.advance(31)
    assert sorted(dict(lab.locks.heldKeys())) == [b"renewed"]


def test_a_heal_does_not_undo_what_the_winner_released_while_cut_off() -> None:
    """
    A partition: the active goes on serving on its side while its follower
    keeps a copy of every grant.  At the heal, the follower (which promoted
    meanwhile, on its side) offers that copy: the grants the winner released
    after the cut -- or just before it noticed, while the follower was
    already silent -- stay released.  A grant that only expired on our side
    is still taken back (a renewal answered by the other side may have kept
    it), and so is everything the other side granted.
    """
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    lab.client()
    token = {k: int(lab.ask(b"A %s 600 0" % k).split()[2])
             for k in (b"before-cut", b"after-cut", b"kept")}
    expiring = int(lab.ask(b"A expiring 1 0").split()[2])
    ticks(lab, 0.3)
    # The cut: the follower goes silent; we release one key before noticing.
    ticks(lab, 0.5)
    assert lab.ask(b"R before-cut %d" % token[b"before-cut"]) == b"R before-cut OK\n"
    ticks(lab, 0.7)  # silent for --peer-timeout: the link is closed
    assert follower.closing
    follower.connectionLost(Failure(ConnectionLost()))
    ticks(lab, 0.3)
    assert lab.ask(b"R after-cut %d" % token[b"after-cut"]) == b"R after-cut OK\n"
    assert b"expiring" not in dict(lab.locks.heldKeys())
    # The heal: the other side offers its copy, and what it granted.
    back = lab.link(1, outbound=False)
    lab.hear(back, b"OFFER 1 %d 0" % (NOW_US + 9),
             b"MERGE before-cut %d 590000000 1000000 1 -" % token[b"before-cut"],
             b"MERGE after-cut %d 590000000 1000000 1 -" % token[b"after-cut"],
             b"MERGE kept %d 590000000 1000000 1 -" % token[b"kept"],
             b"MERGE expiring %d 30000000 1000000 1 -" % expiring,
             b"MERGE theirs %d 30000000 0 1 -" % (NOW_US + 10), b"SYNC")
    assert sorted(dict(lab.locks.heldKeys())) == [b"expiring", b"kept", b"theirs"]
    # Once every peer follows us again and has applied our snapshot (not
    # before: cut again mid-snapshot, it would offer its old copy again),
    # the notes are forgotten.
    other = lab.link(2, outbound=False)
    lab.hear(back, b"HB %d standby 0 1 0" % NOW_US)
    lab.hear(other, b"SYNC", b"HB %d standby 0 1 0" % NOW_US)
    lab.cluster.tick()
    assert lab.cluster.releases.noted
    lab.hear(back, b"SYNCED")
    lab.hear(other, b"SYNCED")
    lab.cluster.tick()
    assert not lab.cluster.releases.noted and lab.cluster.releases.watermark is None


def test_an_offer_is_kept_in_one_run_that_skips_bad_and_forged_lines() -> None:
    lab = Lab()
    activeWithFollower(lab)
    loser = lab.link(2, outbound=False)
    lab.hear(loser, b"MERGE a 11 20000000 0 1 -", b"MERGE b x 20000000 0 1 -", b"MERGE c 12",
             b"MERGE d %d 20000000 0 1 -" % (2**63), b"MERGE e 13 20000000 0 1 -", b"SYNC")
    assert sorted((k, h.token) for k, h in lab.locks.heldKeys()) == [(b"a", 11), (b"e", 13)]
    assert lab.cluster.merged == 2


def test_a_node_that_steps_down_offers_its_keys_before_syncing() -> None:
    lab = Lab(me=1)
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    lab.client()
    token = int(lab.ask(b"A mine 30 0").split()[2])
    higher = lab.link(0, outbound=True)
    lab.hear(higher, b"HB %d active - 5 0" % (NOW_US + 1))
    assert lab.cluster.role == STANDBY
    sent = lines(higher)
    merges = [line for line in sent if line.startswith(b"MERGE ")]
    assert [m.split()[1:3] for m in merges] == [[b"mine", b"%d" % token]]
    assert sent.index(merges[0]) < sent.index(b"SYNC")
    # The offer says whose keys these are: our own, of our term.
    assert sent[sent.index(merges[0]) - 1] == b"OFFER 1 %d %d" % (NOW_US, terms.WHOLE)


def test_a_standby_that_changes_leader_says_whose_stream_its_keys_mirror() -> None:
    lab = Lab(me=2)
    old = following(lab, leader=1)
    lab.hear(old, b"SNAP %d 1" % NOW_US, b"H k 9 30000000 0 1 -", b"SNAPEND")
    new = lab.link(0, outbound=True)
    lab.hear(new, b"HB %d active - 5 0" % (NOW_US + 5))
    assert lab.cluster.leader == 0
    sent = lines(new)
    at = sent.index(b"OFFER 1 %d 0" % NOW_US)
    assert sent[at + 1:at + 3] == [b"MERGE k 9 30000000 0 1 -", b"SYNC"]


def test_a_standby_reads_its_old_leaders_link_up_before_it_offers_its_keys() -> None:
    """
    The new active's heartbeat overtook the old leader's last release
    (still unread in our socket): we apply that first, so our offer does
    not hand the new active a lock whose release was answered OK.
    """
    lab = Lab(me=2)
    old = following(lab, leader=1)
    lab.hear(old, b"SNAP %d 1" % NOW_US, b"H k 9 30000000 0 1 -", b"H kept 8 30000000 0 1 -",
             b"SNAPEND")
    unread = [b"D k 9"]

    def catchUp() -> None:  # what readWaiting delivers on a real link
        while unread:
            lab.hear(old, unread.pop())

    old.catchUp = catchUp  # type: ignore[method-assign]
    new = lab.link(0, outbound=True)
    lab.hear(new, b"HB %d active - 5 0" % (NOW_US + 5))
    assert lab.cluster.leader == 0
    offered = [line.split()[1] for line in lines(new) if line.startswith(b"MERGE ")]
    assert offered == [b"kept"]


def test_an_offer_of_the_stream_taken_over_by_handoff_brings_back_no_released_key() -> None:
    """
    The new active took its old leader's stream over whole (the HANDOFF
    came after it).  The other standby, still a step behind on that stream
    when it switches to us, offers a key whose release was already answered
    OK: the offer is ignored, the key stays free.  An offer of another
    stream (a split brain's other side) is still merged.
    """
    lab = Lab()
    leader = following(lab, leader=1)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"H kept 1 30000000 0 1 -",
             b"G released 3 30000000 0 1 -", b"D released 3", b"SNAPEND")
    fromOther = lab.link(2, outbound=False)
    lab.hear(fromOther, b"HB %d standby 1 1 0" % NOW_US)
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 5))
    assert lab.cluster.role == ACTIVE
    lab.hear(fromOther, b"OFFER 1 %d 0" % NOW_US, b"MERGE kept 1 30000000 0 1 -",
             b"MERGE released 3 30000000 0 1 -", b"SYNC")
    assert sorted(dict(lab.locks.heldKeys())) == [b"kept"]
    assert lab.cluster.merged == 0
    lab.hear(fromOther, b"OFFER 2 %d 0" % (NOW_US + 2), b"MERGE theirs 4 30000000 0 1 -")
    assert sorted(dict(lab.locks.heldKeys())) == [b"kept", b"theirs"]


def test_after_a_promotion_an_offer_that_goes_further_in_the_stream_is_merged() -> None:
    """
    A standby promoted on its leader's death may have missed the last of
    that leader's stream: the other standby's offer of it, from further
    in that stream, is merged; an offer from no further than our copy
    went (its link was cut meanwhile) brings nothing we lack, and is
    ignored.
    """
    lab = Lab(me=1)
    leader = following(lab, leader=0)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"SNAPEND", b"G kept 2 30000000 0 1 -", b"S 7")
    lab.cluster._promote()
    assert lab.cluster.eras.inheritedFrom == (0, NOW_US, 7)
    fromOther = lab.link(2, outbound=False)
    lab.hear(fromOther, b"OFFER 0 %d 6" % NOW_US, b"MERGE released 3 30000000 0 1 -")
    assert sorted(dict(lab.locks.heldKeys())) == [b"kept"]
    lab.hear(fromOther, b"OFFER 0 %d 9" % NOW_US, b"MERGE kept 2 30000000 0 1 -",
             b"MERGE missed 4 30000000 0 1 -", b"SYNC")
    assert sorted(dict(lab.locks.heldKeys())) == [b"kept", b"missed"]


def test_a_release_answered_past_the_end_of_our_cut_copy_ends_the_grant_here() -> None:
    """
    Our link to the active was cut (one way) while it went on, answering
    releases the other standby acknowledged; we promoted with our short
    copy.  The other standby's offer, from further in that stream, lacks
    those grants: they end here (a release answered OK is never undone),
    the waiters get the keys, and our standbys hear of it.  Grants we made
    ourselves since, and those it offers, stay.
    """
    lab = Lab(me=1)
    leader = following(lab, leader=0)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"H released 2 30000000 0 1 -",
             b"H kept 3 30000000 0 1 -", b"SNAPEND", b"S 7")
    lab.cluster.views[0].alive = False
    lab.cluster._promote()
    lab.client()
    mine = int(lab.ask(b"A mine 30 0").split()[2])
    assert lab.ask(b"A released 30 0") == b""  # queued behind the stale copy
    other = lab.link(2, outbound=False)
    lab.hear(other, b"OFFER 0 %d 9" % NOW_US, b"MERGE kept 3 30000000 0 1 -", b"SYNC")
    lab.clock.advance(0)
    held = {key: h.token for key, h in lab.locks.heldKeys()}
    assert held[b"kept"] == 3 and held[b"mine"] == mine
    assert held[b"released"] > mine  # the waiter got it
    assert lab.protocol.transport.value().startswith(b"A released ")  # type: ignore[union-attr]


def test_the_losers_releases_stay_released_after_the_heal() -> None:
    """
    Issue 21 item 4: the other side released grants we still hold (it
    served while we were cut off or stopped).  Its release notes drop
    them here -- also in an offer otherwise ignored, and with a waiter
    here, which gets the key -- and reach our standbys; a note of another
    grant of the key changes nothing.
    """
    lab = Lab()
    follower, (gone, waited, other), loser = winnerHolding(lab, b"gone", b"waited", b"other")
    waiter = lab.client()
    lab.protocol.dataReceived(b"A waited 30 10\n")
    lab.clock.advance(0)
    lab.cluster.eras.inheritedFrom = (1, NOW_US, terms.WHOLE)
    lab.hear(loser, b"OFFER 1 %d 0" % NOW_US, b"RELEASED gone %d" % gone,
             b"RELEASED waited %d" % waited, b"RELEASED other %d" % (other - 1),
             b"MERGE gone %d 30000000 0 1 -" % gone, b"SYNC")
    lab.clock.advance(0)
    held = dict(lab.locks.heldKeys())
    assert b"gone" not in held and held[b"other"].token == other
    assert held[b"waited"].token > waited
    assert waiter.value().startswith(b"A waited ")
    stream = lines(follower)
    assert b"D gone %d" % gone in stream and b"D waited %d" % waited in stream


def test_a_promoted_node_brings_its_releases_of_inherited_grants_to_the_heal() -> None:
    """
    The successor of a stopped active answers R OK for grants it took over;
    when the old active comes back and wins, the successor's offer carries
    those releases (and not its release of a grant of its own term).
    """
    lab = Lab(me=1)
    leader = following(lab, leader=0)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"H k1 5 30000000 0 1 -", b"H k2 6 30000000 0 1 -",
             b"SNAPEND")
    lab.cluster.views[0].alive = False  # stopped
    lab.cluster._promote()
    lab.client()
    assert lab.ask(b"R k1 5") == b"R k1 OK\n"
    mine = int(lab.ask(b"A mine 30 0").split()[2])
    assert lab.ask(b"R mine %d" % mine) == b"R mine OK\n"
    back = lab.link(0, outbound=True)
    lab.hear(back, b"HB %d active - 5 0" % (lab.cluster.term + 1))
    assert lab.cluster.role == STANDBY
    sent = lines(back)
    assert sent[0].startswith(b"OFFER 1 ")
    assert sent[1:4] == [b"RELEASED k1 5", b"MERGE k2 6 30000000 0 1 -", b"SYNC"]
    assert not lab.cluster.releases.noted  # handed over


@pytest.mark.parametrize("held, token, expiresAt, releasedHere, verdict", [
    (None, 5, 100.0, False, merge.TAKE),
    (None, 5, 100.0, True, merge.KEEP),  # we released it: never undone
    ((6, 100.0), 5, 500.0, False, merge.KEEP),  # the higher token wins
    ((4, 100.0), 5, 50.0, False, merge.TAKE),
    ((5, 100.0), 5, 100.5, False, merge.KEEP),  # our own deadline, a little late
    ((5, 100.0), 5, 160.0, False, merge.EXTEND),  # renewed on the other side
])
def test_the_per_grant_heal_rule(held, token, expiresAt, releasedHere, verdict) -> None:  # type: ignore[no-untyped-def]
    assert merge.decide(held, token, expiresAt, releasedHere) == verdict


def test_the_serving_line_counts_only_live_peers_that_receive_the_stream() -> None:
    """
    Issue 21 item 11: after a kill -9 of one peer, "serving: N live
    peer(s) receive the stream" counts the peers that do, not every peer.
    """
    from twisted.logger import Logger, formatEvent

    lab = Lab()
    said: List[str] = []
    lab.cluster.log = Logger(observer=lambda event: said.append(formatEvent(event)))
    follower = lab.link(1, outbound=False)
    lab.hear(follower, b"HB %d standby - 1 0" % NOW_US)
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)  # node 1 is live and not yet ours: not serving
    assert not lab.cluster.serving
    lab.hear(follower, b"SYNC", b"HB %d standby 0 1 0" % NOW_US)
    assert lab.cluster.serving
    serving = [line for line in said if line.startswith("serving:")]
    assert serving and serving[-1].startswith("serving: 1 live peer(s) receive the stream"), said


def saying(lab: Lab) -> List[str]:
    from twisted.logger import Logger, formatEvent

    said: List[str] = []
    lab.cluster.log = Logger(observer=lambda event: said.append(formatEvent(event)))
    return said


def test_a_node_far_behind_its_peers_stands_by_and_says_why() -> None:
    """
    Issue 21 item 5: our clock is 2 h behind the active's.  We refuse its
    term and token, but stand by (never promote, even after the start-up
    grace), say why on /status and once in the log, tell our peers we
    distrust our clock, and ask for no snapshot we would refuse.  Once
    that peer is gone we sync afresh.
    """
    from lockservice.server.webpages import status

    lab = Lab()
    said = saying(lab)
    lab.wall = NOW_US - 7200 * 10**6
    lab.cluster.startService()
    ahead = lab.link(1, outbound=True)
    for _ in range(30):
        lab.hear(ahead, b"HB %d active - %d 0" % (NOW_US, NOW_US))
        ticks(lab, 0.1)
    assert lab.cluster.role == STANDBY and lab.locks.role == STANDBY
    assert lab.locks.lastToken() < NOW_US and lab.cluster.maxTerm < NOW_US
    assert b"SYNC" not in lines(ahead)
    report = status(lab.locks, lab.cluster)
    assert report["role"] == "standby" and report["active"] == PEERS[1]
    assert "ahead of this node's clock" in report["clock_warning"]
    assert sum("looks wrong" in line for line in said) == 1, said
    assert lab.cluster.heartbeats.line().endswith(b" suspect")
    ahead.connectionLost(Failure(ConnectionLost()))
    ticks(lab, 1.5)
    assert lab.cluster.clockSuspect is None
    lab.cluster.stopService()


def test_an_active_that_meets_a_peer_far_ahead_steps_down_and_offers_its_keys() -> None:
    lab = Lab()
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    lab.client()
    token = int(lab.ask(b"A mine 30 0").split()[2])
    ahead = lab.link(1, outbound=True)
    far = NOW_US + 7200 * 10**6
    lab.hear(ahead, b"HB %d active - %d 0" % (far, far))
    assert lab.cluster.role == STANDBY and not lab.cluster.serving
    sent = lines(ahead)
    assert b"MERGE mine %d 30000000 0 1 -" % token in sent and b"SYNC" not in sent
    assert lab.ask(b"A other 30 0") == b"M A other %s\n" % PEERS[1].encode()


# -- liveness -------------------------------------------------------------------


def test_a_reset_link_is_not_a_dead_peer_but_silence_is() -> None:
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"SNAPEND")
    leader.connectionLost(Failure(ConnectionLost()))
    lab.cluster.tick()
    assert lab.cluster.views[0].alive and lab.cluster.role == STANDBY
    lab.clock.advance(0.9)
    lab.cluster.tick()
    assert lab.cluster.role == STANDBY
    lab.clock.advance(0.2)
    lab.cluster.tick()
    assert not lab.cluster.views[0].alive and lab.cluster.role == ACTIVE


def ticks(lab: Lab, seconds: float) -> None:
    """
    Run the heartbeat timer every 0.1 s for C{seconds}.
    """
    for _ in range(round(seconds / 0.1)):
        lab.clock.advance(0.1)
        lab.cluster.tick()


def test_a_silent_link_is_closed_for_a_redial() -> None:
    lab = Lab(me=1)
    leader = following(lab)
    ticks(lab, 0.5)
    assert not leader.transport.disconnecting  # type: ignore[attr-defined]
    ticks(lab, 0.6)
    assert leader.closing and 0 not in lab.cluster.links.outbound


def test_a_standby_that_was_stopped_reads_before_it_judges_silence() -> None:
    """
    A standby stopped (SIGSTOP, starved) for longer than --peer-timeout
    finds on resuming that it heard nothing "for" that long, while the
    active's heartbeats wait unread in its socket.  It reads them first
    (one reactor iteration) instead of promoting itself.
    """
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"HB %d active - 5 0" % NOW_US)
    ticks(lab, 0.3)
    lab.clock.advance(1.5)  # stopped
    lab.cluster.tick()  # timers run first on resuming
    assert lab.cluster.views[0].alive and not leader.closing
    lab.hear(leader, b"HB %d active - 5 0" % NOW_US)  # what waited in the socket
    lab.clock.advance(0)
    assert lab.cluster.views[0].alive and not leader.closing
    assert lab.cluster.role != ACTIVE
    # Had nothing been waiting, the active is silent indeed.
    lab.clock.advance(1.5)
    lab.cluster.tick()
    lab.clock.advance(0)
    assert not lab.cluster.views[0].alive and leader.closing


@pytest.mark.parametrize("tickFirst", [False, True], ids=["requests-first", "tick-first"])
def test_an_active_that_was_stopped_serves_nothing_until_it_has_read_its_peers(
        tickFirst: bool) -> None:
    """
    An active stopped for longer than --peer-timeout finds requests piled
    up in front of its peers' news (a standby may have promoted meanwhile).
    It answers them C{M ... *} until its late tick has read the peers; then,
    nothing having changed, it serves again.  (On resuming, the reactor
    may run the late tick or the requests first.)
    """
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    lab.client()
    token = int(lab.ask(b"A k 600 0").split()[2])
    ticks(lab, 0.3)
    lab.clock.advance(1.5)  # stopped
    if tickFirst:
        lab.cluster.tick()  # late: read first
    assert lab.ask(b"R k %d" % token) == b"M R k *\n"
    assert lab.locks.table.tokenOf(b"k") == token
    if not tickFirst:
        lab.cluster.tick()
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)  # what waited in the socket
    lab.clock.advance(0)
    assert lab.cluster.role == ACTIVE
    assert lab.ask(b"R k %d" % token) == b"R k OK\n"


def test_heartbeats_on_time_never_look_like_a_freeze() -> None:
    """
    With a peer timeout barely above the heartbeat, a tick on time is not
    "late": the active serves on.
    """
    lab = Lab(heartbeat=0.1, peerTimeout=0.15)
    follower = activeWithFollower(lab)
    lab.client()
    for _ in range(5):
        lab.clock.advance(0.1)
        lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
        assert lab.ask(b"A k%d 30 0" % _).startswith(b"A ")
        lab.cluster.tick()


# -- snapshots ----------------------------------------------------------------------


def test_a_snapshot_is_streamed_in_chunks_and_reads_current_state() -> None:
    lab = Lab()
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    lab.client()
    count = replication.SNAPSHOT_CHUNK * 2 + 10
    lab.protocol.dataReceived(b"".join(b"A k%d 30 0\n" % i for i in range(count)))
    tokenOfLast = lab.locks.table.holder(b"k%d" % (count - 1)).token  # type: ignore[union-attr]
    follower = lab.link(1, outbound=False)
    lab.hear(follower, b"SYNC")
    assert lines(follower)[0].startswith(b"SNAP ")
    producer = follower.snapshot
    assert producer is not None
    producer.resumeProducing()
    assert len(lines(follower)) == replication.SNAPSHOT_CHUNK
    # A release while the snapshot is under way goes out live, and the
    # snapshot no longer sends that key.
    assert lab.ask(b"R k%d %d" % (count - 1, tokenOfLast)).endswith(b"OK\n")
    assert lines(follower) == [b"D k%d %d" % (count - 1, tokenOfLast)]
    producer.resumeProducing()
    producer.resumeProducing()
    rest = lines(follower)
    assert rest[-1] == b"SNAPEND" and len(rest) == replication.SNAPSHOT_CHUNK + 10
    assert follower.synced


# -- handoff ---------------------------------------------------------------------


def test_one_successor_per_handoff() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    lab.cluster.handoffs.start(1, stopping=True)
    assert lab.cluster.role == HANDING_OFF
    sent = lines(follower)
    term = int([line for line in sent if line.startswith(b"HANDOFF ")][0].split()[1])
    assert term > NOW_US
    # No TAKEN, but the successor is alive: keep waiting, never a second one.
    for _ in range(int(handoff.HANDOFF_GIVE_UP / handoff.HANDOFF_CHECK) - 2):
        lab.clock.advance(handoff.HANDOFF_CHECK)
        lab.hear(follower, b"HB %d standby 0 1 0" % NOW_US)
    assert lab.cluster.role == HANDING_OFF
    # Its heartbeat shows it took over (the TAKEN was lost): done.
    lab.hear(follower, b"HB %d active - 1 0" % term)
    lab.clock.advance(handoff.HANDOFF_CHECK)
    assert lab.cluster.role != ACTIVE and lab.cluster.handoffs.current is None


def test_a_stopping_active_offers_the_handoff_to_a_standby_heard_lately_first() -> None:
    """
    Found from outside: the highest-priority standby frozen a moment
    before SIGINT was offered the handoff anyway, and waited for until it
    was surely gone (0.5-1 s without an active).  A standby silent for a
    quarter of --peer-timeout comes after one heard lately.
    """
    from twisted.internet.defer import ensureDeferred

    lab = Lab()
    first = activeWithFollower(lab)
    second = lab.link(2, outbound=False)
    lab.hear(second, b"SYNC")
    while second.snapshot is not None:
        second.snapshot.resumeProducing()
    lines(second)
    lab.hear(first, b"HB %d standby 0 1 0" % NOW_US)
    lab.hear(second, b"HB %d standby 0 1 0" % NOW_US)
    lab.clock.advance(0.3)  # node 1 silent since (frozen?), node 2 not
    lab.hear(second, b"HB %d standby 0 1 0" % NOW_US)
    ensureDeferred(lab.cluster.handoffs.beforeStopping())
    assert any(line.startswith(b"HANDOFF ") for line in lines(second))
    assert not any(line.startswith(b"HANDOFF ") for line in lines(first))


def test_the_successor_takes_over_only_from_its_leader() -> None:
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"G k 9 30000000 0 1 -", b"SNAPEND")
    other = lab.link(2, outbound=True)
    lab.hear(other, b"HANDOFF %d" % (NOW_US + 5))
    assert b"REFUSED %d" % (NOW_US + 5) in lines(other)
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 5))
    assert b"TAKEN %d" % (NOW_US + 5) in lines(leader)
    assert lab.cluster.role == ACTIVE and lab.cluster.term == NOW_US + 5
    assert dict(lab.locks.heldKeys())[b"k"].token == 9


def test_a_successor_that_just_ran_again_refuses_a_handoff_it_read_late() -> None:
    """
    Found from outside: a standby frozen (SIGSTOP) while its active
    offered it the handoff; the active gave up on it after a second and
    handed off to another node, which then answered releases.  Resumed,
    the frozen standby read the old offer first and took over from its
    stale copy: a second active, whose heal brought the released grants
    back.  An offer read right after such a pause is refused; a later one,
    once the peers are read again, is taken.
    """
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"G k 9 30000000 0 1 -", b"SNAPEND")
    lab.cluster.tick()
    lab.clock.advance(2.0)  # frozen: no tick ran
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 5))
    assert b"REFUSED %d" % (NOW_US + 5) in lines(leader)
    assert lab.cluster.role == STANDBY
    lab.cluster.tick()  # the late tick: it reads first, then judges
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 6))
    assert b"REFUSED %d" % (NOW_US + 6) in lines(leader)
    lab.clock.advance(0)  # the catching-up tick
    lab.hear(leader, b"HB %d active - 9 0" % NOW_US)
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 7))
    assert b"TAKEN %d" % (NOW_US + 7) in lines(leader)
    assert lab.cluster.role == ACTIVE


def test_a_node_that_took_over_by_handoff_notes_its_releases_of_what_it_took_over() -> None:
    """
    A peer that missed the handoff may still hold a copy of the grants it
    handed over: a heal with it must not bring back what the new active
    released (as after a promotion, see released.py).
    """
    lab = Lab(me=1)
    leader = following(lab)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"G k 9 30000000 0 1 -", b"SNAPEND")
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 5))
    assert lab.cluster.role == ACTIVE
    lab.cluster.servingGate.serving = True
    lab.locks.setRole(ACTIVE, None)
    lab.client()
    assert lab.ask(b"R k 9") == b"R k OK\n"
    assert lab.cluster.releases.releasedHere(b"k", 9)


def test_a_syncing_node_with_a_mismatched_peer_does_not_promote() -> None:
    lab = Lab(me=1)
    # What answers on node 0's address fails our proof, and node 0 dials
    # us and fails too: a node with another secret.
    receiver = lab.cluster.receiver
    receiver.handshakeFailed(0, outbound=True, why="secret mismatch")
    receiver.handshakeFailed(0, outbound=False, why="secret mismatch", source="10.0.0.1:5")
    lab.clock.advance(2.5)
    lab.cluster.tick()
    assert lab.cluster.role == SYNCING
    assert lab.cluster.views[0].secretMismatch


# -- a new active serves once its live peers receive its stream ------------------


def takenOver(lab: Lab) -> Tuple[PeerChannel, PeerChannel, PeerChannel]:
    """
    Node 0 follows node 1 (the active), node 2 is a live standby of node 1,
    and node 1 hands the active role to node 0.

    @return: node 0's links: outbound to 1, inbound from 1, inbound from 2.
    """
    leader = following(lab, leader=1)
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"H old 1 30000000 0 1 -", b"SNAPEND")
    assert lab.cluster.role == STANDBY
    fromOld = lab.link(1, outbound=False)
    fromOther = lab.link(2, outbound=False)
    lab.hear(fromOther, b"HB %d standby 1 1 0" % NOW_US)
    lab.hear(leader, b"HANDOFF %d" % (NOW_US + 5))
    assert b"TAKEN %d" % (NOW_US + 5) in lines(leader)
    assert lab.cluster.role == ACTIVE
    lab.hear(leader, b"HB %d handing-off - 1 0" % (NOW_US + 5))
    return leader, fromOld, fromOther


def test_a_new_active_answers_no_change_until_its_live_peers_receive_its_stream() -> None:
    lab = Lab()
    _, fromOld, fromOther = takenOver(lab)
    lab.client()
    # Neither the old active nor the other standby receives our stream yet:
    # a grant answered now would be lost on a kill -9 of this node.
    assert lab.ask(b"A k 30 0") == b"M A k *\n"
    assert lab.ask(b"R old 1") == b"M R old *\n"
    lab.hear(fromOld, b"SYNC", b"HB %d standby 0 1 0" % (NOW_US + 5))
    assert lab.ask(b"A k 30 0") == b"M A k *\n"
    lab.hear(fromOther, b"SYNC", b"HB %d standby 0 1 0" % (NOW_US + 5))
    for channel in (fromOld, fromOther):
        while channel.snapshot is not None:
            channel.snapshot.resumeProducing()
        lines(channel)
    lab.log.clear()
    granted = lab.ask(b"A k 30 0")
    assert granted.startswith(b"A k ")
    assert [name for name, _ in lab.log] == ["in1", "in2", "client"], lab.log
    token = granted.split()[2]
    for channel in (fromOld, fromOther):
        assert lines(channel) == [b"G k %s 30000000 0 1 -" % token]


def test_a_new_active_freezes_again_when_a_subscriber_link_drops() -> None:
    lab = Lab()
    leader, fromOld, fromOther = takenOver(lab)
    for channel in (fromOld, fromOther):
        lab.hear(channel, b"SYNC", b"HB %d standby 0 1 0" % (NOW_US + 5))
    lab.client()
    assert lab.ask(b"A k 30 0").startswith(b"A k ")
    # The old active's link resets; it is alive (heard on our outbound
    # link) but no longer receives the stream until it asks again.
    fromOld.connectionLost(Failure(ConnectionLost()))
    assert lab.ask(b"A j 30 0") == b"M A j *\n"
    again = lab.link(1, outbound=False)
    lab.hear(again, b"SYNC", b"HB %d standby 0 1 0" % (NOW_US + 5))
    assert lab.ask(b"A j 30 0").startswith(b"A j ")


def test_a_live_peer_that_never_follows_does_not_freeze_the_active_forever() -> None:
    lab = Lab()
    leader, fromOld, fromOther = takenOver(lab)
    lab.hear(fromOld, b"SYNC", b"HB %d standby 0 1 0" % (NOW_US + 5))
    lab.client()
    assert lab.ask(b"A k 30 0") == b"M A k *\n"
    # Node 2 stays alive but never asks for our stream.
    for _ in range(19):
        lab.clock.advance(0.1)
        lab.hear(fromOther, b"HB %d standby 1 1 0" % NOW_US)
        lab.hear(fromOld, b"HB %d standby 0 1 0" % (NOW_US + 5))
        lab.cluster.tick()
    assert lab.ask(b"A k 30 0") == b"M A k *\n"
    lab.clock.advance(0.2)
    lab.hear(fromOther, b"HB %d standby 1 1 0" % NOW_US)
    lab.cluster.tick()
    assert lab.ask(b"A k 30 0").startswith(b"A k ")


def test_a_fresh_active_waits_for_a_syncing_peer_to_subscribe() -> None:
    lab = Lab()
    peer = lab.link(1, outbound=False)
    for _ in range(5):
        lab.clock.advance(0.5)
        lab.hear(peer, b"HB 0 syncing - 0 0")
        lab.cluster.tick()
    assert lab.cluster.role == ACTIVE
    lab.client()
    assert lab.ask(b"A k 30 0") == b"M A k *\n"
    lab.hear(peer, b"SYNC", b"HB %d syncing 0 0 0" % lab.cluster.term)
    assert lab.ask(b"A k 30 0").startswith(b"A k ")


def test_a_stranger_squatting_a_dead_peers_port_does_not_block_promotion() -> None:
    lab = Lab(me=1)
    # Something on node 0's address answers our HELLO with a wrong proof
    # (over and over), but nothing claiming to be node 0 ever dials us.
    for _ in range(30):
        lab.cluster.receiver.handshakeFailed(0, outbound=True, why="secret mismatch")
        lab.clock.advance(0.1)
        lab.cluster.tick()
    assert lab.cluster.role == ACTIVE
    assert not lab.cluster.views[0].secretMismatch


# -- the mirror: batches through the service, told to the observers once ---------


class Batches:
    """
    A mirror observer that records each batch it is told of.
    """

    def __init__(self) -> None:
        self.batches: List[List[Tuple[bytes, int]]] = []

    def mirrored(self, now: float, changes) -> None:  # type: ignore[no-untyped-def]
        self.batches.append([(key, token) for key, token, *_ in changes])


def test_a_standby_mirrors_each_read_as_one_batch_through_the_service() -> None:
    """
    Each read's changes reach the service's mirror observers in one call,
    after the table has them; a standby's stream is not the operator's
    business (the monitor skips it) and goes to no standby of ours.
    """
    from lockservice.server.monitor import Monitor

    lab = Lab(me=1)
    leader = following(lab)
    batches = Batches()
    monitor = Monitor(lab.clock, lab.locks.table.clientOf, wallTime=lambda: 0.0)
    monitor.roleChanged(lab.clock.seconds(), lab.locks.role, [])  # as makeService wires it
    lab.locks.notify.mirrors.extend([batches, monitor])
    lab.hear(leader, b"SNAP %d 1" % NOW_US, b"H a 7 10000000 0 1 -", b"H b 8 10000000 0 1 -",
             b"SNAPEND", b"G c 9 5000000 0 1 -", b"D b 8")
    assert batches.batches == [[(b"a", 7), (b"b", 8)], [(b"c", 9), (b"b", 8)]]
    assert sorted(dict(lab.locks.heldKeys())) == [b"a", b"c"]
    assert monitor.events.since()[0] == [] and lab.locks.stats.merged == 0


def test_a_grant_merged_on_a_heal_is_seen_by_the_metrics_and_the_operators_view() -> None:
    from lockservice.core import events
    from lockservice.server.metrics import Metrics
    from lockservice.server.monitor import Monitor

    lab = Lab()
    monitor = Monitor(lab.clock, lab.locks.table.clientOf, wallTime=lambda: 0.0, warnHold=60)
    lab.locks.notify.attach(monitor)
    lab.locks.notify.mirrors.append(monitor)
    metrics = Metrics(lab.locks, lab.cluster, monitor)
    follower, (mine,), loser = winnerHolding(lab, b"mine")
    lab.hear(loser, b"MERGE theirs 77 120000000 1000000 1 -", b"MERGE mine %d 1 0 1 -" % (mine - 1),
             b"SYNC")
    assert lab.cluster.merged == 1
    assert b"lockservice_merged_grants_total 1.0" in metrics.render()
    merged = [e for e in monitor.events.since()[0] if e.key == b"theirs"]
    assert [(e.type, e.token, e.detail) for e in merged] == [
        (events.GRANT, 77, "merged on a heal")]
    # Watched like any grant: a long hold is flagged (granted 1 s before
    # the heal, it is checked with the grants watched before it).
    lab.clock.advance(58.5)
    assert not monitor.isLongHold(b"theirs", 77)
    lab.clock.advance(1.5)
    assert monitor.isLongHold(b"theirs", 77)


def test_refused_handshakes_are_counted_and_logged_once_per_source_and_reason() -> None:
    """
    A node of another cluster (or a stranger) retries its handshake dozens
    of times a second: each refusal is counted (/status shows the count),
    and logged once per source and reason, not once per attempt.
    """
    from twisted.logger import globalLogPublisher

    lab = Lab()
    logged: List[dict] = []  # type: ignore[type-arg]
    globalLogPublisher.addObserver(logged.append)
    try:
        for _ in range(50):
            lab.cluster.receiver.handshakeRefused("10.9.9.9", "not a peer of this cluster")
        lab.cluster.receiver.handshakeRefused("10.9.9.9", "bad peer hello")
        lab.cluster.receiver.handshakeRefused("10.9.9.8", "bad peer hello")
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert lab.cluster.links.refusedHandshakes == 52
    refusals = [e for e in logged if "refused a peer handshake" in e.get("log_format", "")]
    assert len(refusals) == 3


def test_a_peer_that_subscribed_before_this_node_led_is_sent_its_state_again() -> None:
    """
    A standby (node 0 here) is asked for its state by a peer whose
    heartbeats ran ahead of its promotion: the snapshot of a standby's
    copy.  Once it leads, that early snapshot must not count as in sync
    (a handoff to that peer would let it take over with its own older
    copy: a release answered OK came back so in the chaos suite); it is
    sent the leader's state again.
    """
    lab = Lab()
    lab.cluster.setRole(STANDBY)
    early = lab.link(1, outbound=False)
    lab.hear(early, b"SYNC")
    producer = early.snapshot
    while producer is not None and not producer.stopped:
        producer.resumeProducing()
    lines(early)
    assert early.synced
    lab.cluster.term = NOW_US
    lab.cluster.setRole(ACTIVE)
    assert not early.synced
    sent = lines(early)
    assert sent and sent[0].startswith(b"SNAP "), sent
    producer = early.snapshot
    while producer is not None and not producer.stopped:
        producer.resumeProducing()
    assert lines(early)[-1] == b"SNAPEND" and early.synced
