"""
The heal's merge of shared keys on the winner (SPEC section 2, "Shared
keys"), bytes in and out of the peer links, task.Clock time.
"""

from __future__ import annotations

from lockservice.core.table import READ
from tests.support.cluster import Lab, activeWithFollower, lines


def readers(lab: Lab, key: bytes, count: int) -> list[int]:
    lab.client()
    return [int(lab.ask(b"A %s 30 0 r" % key).split()[2]) for _ in range(count)]


def test_the_readers_of_both_sides_are_kept_and_a_renewal_there_survives() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    first, second = readers(lab, b"rk", 2)
    lines(follower)
    loser = lab.link(2, outbound=False)
    lab.hear(loser, b"MERGE rk %d 900000000 5000000 r -" % second,  # renewed there
             b"MERGE rk 77 20000000 0 r -",  # a reader of theirs
             b"MERGE rk 50 20000000 0 1 -",  # a writer of theirs, below our readers
             b"SYNC")
    table = lab.locks.table
    assert sorted(h.token for h in table.grantsOf(b"rk")) == [77, first, second]
    assert all(h.share == READ for h in table.grantsOf(b"rk"))
    assert table.leaseOf(b"rk", second) == lab.clock.seconds() + 900
    assert sorted(line for line in lines(follower) if line.startswith((b"G", b"D"))) == [
        b"G rk %d 900000000 5000000 r -" % second, b"G rk 77 20000000 0 r -"]


def test_a_higher_writer_of_the_other_side_pushes_our_readers_out() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    ours = readers(lab, b"rk", 2)
    lines(follower)
    loser = lab.link(2, outbound=False)
    writer = max(ours) + 100
    lab.hear(loser, b"MERGE rk %d 30000000 0 1 -" % writer, b"SYNC")
    table = lab.locks.table
    assert [h.token for h in table.grantsOf(b"rk")] == [writer]
    assert not table.isShared(b"rk")
    assert sorted(line for line in lines(follower) if line.startswith((b"G", b"D"))) == sorted(
        [b"D rk %d" % t for t in ours] + [b"G rk %d 30000000 0 1 -" % writer])
    assert lab.ask(b"R rk %d" % ours[0]) == b"R rk STALE\n"


def test_a_semaphore_keeps_its_n_highest_tokens_and_other_slot_counts_do_not_fit() -> None:
    lab = Lab()
    follower = activeWithFollower(lab)
    lab.client()
    mine = [int(lab.ask(b"A sk 30 0 2").split()[2]) for _ in range(2)]
    lines(follower)
    loser = lab.link(2, outbound=False)
    top = max(mine) + 100
    lab.hear(loser, b"MERGE sk %d 30000000 0 2 -" % top, b"MERGE sk 60 30000000 0 2 -",
             b"MERGE sk %d 30000000 0 3 -" % (top - 1), b"SYNC")
    assert sorted(h.token for h in lab.locks.table.grantsOf(b"sk")) == [max(mine), top]
    assert lab.locks.table.kindOf(b"sk") == 2
