"""
Lease deadlines in millisecond buckets (L{LockService}'s lease timers):
never early, at most a millisecond late, in deadline order, and no pile-up
of the entries that releases and renewals leave behind.
"""

from __future__ import annotations

import random
from typing import List, Optional, Tuple

import pytest
from twisted.internet.task import Clock

from lockservice.core.election import ACTIVE, HANDING_OFF, STANDBY
from lockservice.core.table import EXCLUSIVE, READ
from lockservice.server.service import LockService, PendingAcquire


class Conn:
    name = "tester"
    gone = False
    notRead = False

    def __init__(self) -> None:
        self.answers: List[bytes] = []

    def finish(self, waiter: PendingAcquire, answer: bytes) -> None:
        self.answers.append(answer)

    def flushAnswers(self) -> None:
        pass


class Expiries:
    """
    A change observer noting when each grant expired (service time).
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.seen: List[Tuple[bytes, float]] = []

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes] = None) -> None:
        pass

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        pass

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        if expired:
            self.seen.append((key, self.clock.seconds()))


def service() -> Tuple[LockService, Clock, Expiries, Conn]:
    clock = Clock()
    clock.advance(1000)
    counter = iter(range(1, 10**9))
    locks = LockService(clock, lambda: next(counter))
    expiries = Expiries(clock)
    locks.observers.append(expiries)
    return locks, clock, expiries, Conn()


def acquire(locks: LockService, conn: Conn, key: bytes, lease: float,
            share: int = EXCLUSIVE) -> Optional[bytes]:
    waiter = PendingAcquire(key, lease, conn)
    waiter.share = share
    return locks.acquire(waiter, 0.0)


def tokenOf(answer: Optional[bytes]) -> int:
    assert answer is not None and answer.startswith(b"A "), answer
    return int(answer.split()[2])


def test_leases_sharing_a_millisecond_expire_each_at_its_own_deadline() -> None:
    locks, clock, expiries, conn = service()
    rng = random.Random(15)
    deadlines = {}
    for i in range(300):
        key = b"k%d" % i
        assert acquire(locks, conn, key, 5 + rng.random() * 0.004)
        holder = locks.table.holder(key)
        assert holder is not None
        deadlines[key] = holder.expiresAt
        clock.advance(rng.random() * 0.00002)  # grants a few microseconds apart
    while len(expiries.seen) < len(deadlines) and clock.seconds() < 1010:
        clock.advance(0.00005)
    assert len(expiries.seen) == len(deadlines)
    for key, at in expiries.seen:
        assert deadlines[key] <= at <= deadlines[key] + 0.001 + 0.00005, key
    # The order of one heap of (deadline, key).
    assert [k for k, _ in expiries.seen] == sorted(deadlines, key=lambda k: (deadlines[k], k))


def test_a_lone_lease_expires_exactly_at_its_deadline() -> None:
    locks, clock, expiries, conn = service()
    clock.advance(0.1234567)
    assert acquire(locks, conn, b"k", 2.5)
    holder = locks.table.holder(b"k")
    assert holder is not None
    [call] = clock.getDelayedCalls()
    assert call.getTime() == holder.expiresAt


def test_renewed_and_shortened_leases_follow_their_new_deadline() -> None:
    locks, clock, expiries, conn = service()
    answer = acquire(locks, conn, b"long", 10)
    assert answer
    token = int(answer.split()[2])
    answer2 = acquire(locks, conn, b"short", 1)
    assert answer2
    token2 = int(answer2.split()[2])
    replies: List[bytes] = []
    locks.renew(b"long", token, 0.5, replies.append)  # shortened
    locks.renew(b"short", token2, 3, replies.append)  # lengthened
    assert replies == [b"N long OK\n", b"N short OK\n"]
    clock.advance(0.499)
    assert expiries.seen == []
    clock.advance(0.002)
    assert [k for k, _ in expiries.seen] == [b"long"]
    clock.advance(1.0)
    assert [k for k, _ in expiries.seen] == [b"long"]  # its old deadline is gone
    clock.advance(1.496)
    assert [k for k, _ in expiries.seen] == [b"long"]
    clock.advance(0.004)
    assert [k for k, _ in expiries.seen] == [b"long", b"short"]


def test_hand_over_into_the_millisecond_being_expired() -> None:
    """
    An expiry hands the key to a waiter whose lease ends in the same
    millisecond: its deadline is kept, not expired early nor lost.
    """
    locks, clock, expiries, conn = service()
    assert acquire(locks, conn, b"k", 1)
    assert acquire(locks, conn, b"k", 0.0002) is None
    clock.advance(1)
    assert len(expiries.seen) == 1 and len(conn.answers) == 1
    clock.advance(0.0001)
    assert len(expiries.seen) == 1
    clock.advance(0.0001)
    assert len(expiries.seen) == 2 and locks.table.holder(b"k") is None
    assert not clock.getDelayedCalls()


def test_entries_left_behind_by_renewals_do_not_pile_up() -> None:
    locks, clock, expiries, conn = service()
    answer = acquire(locks, conn, b"k", 30)
    assert answer
    token = int(answer.split()[2])
    for _ in range(20000):
        locks.renew(b"k", token, 30, lambda line: None)
        clock.advance(0.001)
    assert locks.leases.entries <= 2 * len(locks.table) + 4096
    assert len(locks.leases.buckets) <= 4096 + 2
    clock.advance(30)
    assert [k for k, _ in expiries.seen] == [b"k"]


def test_a_crowded_millisecond_is_scanned_once_and_expires_in_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """
    20,000 leases ending in the same millisecond expire 1,000 per reactor
    turn, in (deadline, key) order, and their bucket is read once, not once
    per turn.
    """
    locks, clock, expiries, conn = service()
    keys = [b"k%05d" % i for i in range(20000)]
    for key in reversed(keys):
        assert acquire(locks, conn, key, 5)
    scanned: List[int] = []
    original = locks.leases.bucketEntries

    def counting(bucket: int) -> List[Tuple[bytes, int]]:
        found = original(bucket)
        scanned.append(len(found))
        return found

    monkeypatch.setattr(locks.leases, "bucketEntries", counting)
    turns: List[int] = []
    fire = locks.alarm.fire

    def counted(at: float) -> None:
        before = len(expiries.seen)
        fire(at)
        turns.append(len(expiries.seen) - before)

    locks.alarm.fire = counted
    clock.advance(5)
    assert turns == [1000] * 20  # one turn's budget each
    assert [k for k, _ in expiries.seen] == keys
    assert sum(scanned) < 3 * len(keys), sum(scanned)


def test_a_pause_in_handing_off_keeps_the_leases_filed() -> None:
    """
    An active that holds back for a moment (a peer joining must get the
    stream first: handing off, then active again) expires nothing while
    frozen, refiles nothing when it goes on (a million keys took 0.4 s),
    and then expires each lease that ran out meanwhile, and the others on
    time, with a grant merged in while frozen.
    """
    locks, clock, expiries, conn = service()
    assert acquire(locks, conn, b"soon", 1)
    assert acquire(locks, conn, b"later", 3)
    refiled: List[int] = []
    rebuild = locks.timers.fileAll
    locks.timers.fileAll = lambda: (refiled.append(1), rebuild())  # type: ignore[method-assign]
    locks.setRole(HANDING_OFF, None)
    assert not clock.getDelayedCalls()
    locks.installHolder(b"merged", 10**9, 1.5)  # a heal's merge while frozen
    clock.advance(2)  # "soon" and "merged" ran out meanwhile
    assert expiries.seen == [] and len(locks.table) == 3
    locks.setRole(ACTIVE, None)
    assert refiled == []
    clock.advance(0)
    assert sorted(k for k, _ in expiries.seen) == [b"merged", b"soon"]
    clock.advance(0.999)
    assert len(expiries.seen) == 2
    clock.advance(0.002)
    assert [k for k, _ in expiries.seen][2:] == [b"later"] and len(locks.table) == 0
    assert not clock.getDelayedCalls()


def test_a_standby_files_no_leases_and_refiles_all_when_promoted() -> None:
    locks, clock, expiries, conn = service()
    assert acquire(locks, conn, b"k", 1)
    locks.setRole(HANDING_OFF, None)
    locks.setRole(STANDBY, None)
    assert locks.leases.entries == 0 and not clock.getDelayedCalls()
    locks.installHolder(b"mirrored", 10**9, 2)
    clock.advance(5)
    assert expiries.seen == []
    locks.setRole(ACTIVE, None)
    clock.advance(0)
    assert sorted(k for k, _ in expiries.seen) == [b"k", b"mirrored"]


def test_a_standby_promoted_through_a_frozen_moment_expires_its_mirrored_leases() -> None:
    """
    A promoted standby is first frozen (handing off) until its peers take
    its stream, then serves: the leases it mirrored must be filed on the
    way, or they never run out (black-box finding: every key held at a
    failover stayed held for good).
    """
    locks, clock, expiries, conn = service()
    locks.setRole(STANDBY, None)
    locks.installHolder(b"mirrored", 10**9, 2)
    locks.setRole(HANDING_OFF, None)
    clock.advance(1)
    locks.setRole(ACTIVE, None)
    clock.advance(0.5)
    assert expiries.seen == []
    clock.advance(1)
    assert [k for k, _ in expiries.seen] == [b"mirrored"]


def test_an_exclusive_grant_is_filed_as_its_bare_key() -> None:
    """
    An exclusive grant's lease entry is its key alone (its token is the
    key's current one): about 40 bytes per held key less (issue 22).
    """
    locks, clock, expiries, conn = service()
    assert acquire(locks, conn, b"k", 1)
    assert list(locks.leases.buckets.values()) == [b"k"]


@pytest.mark.parametrize("again", ["renewed", "re-granted"])
def test_a_stale_bare_entry_does_not_hide_a_later_lease(again: str) -> None:
    """
    A key's bare entry left in an early bucket, after its grant was renewed
    or released and granted again with a longer lease, is skipped when the
    bucket comes up: it does not stand for the key's new grant there (which
    would arm the alarm for that grant's deadline and let another lease,
    due in between, expire late).
    """
    locks, clock, expiries, conn = service()
    assert acquire(locks, conn, b"early", 0.5)  # the alarm looks ahead when it has run
    token = tokenOf(acquire(locks, conn, b"k", 1))
    assert acquire(locks, conn, b"between", 2)
    if again == "renewed":
        replies: List[bytes] = []
        locks.renew(b"k", token, 5, replies.append)
        assert replies == [b"N k OK\n"]
    else:
        replies = []
        locks.release(b"k", token, replies.append)
        assert replies == [b"R k OK\n"]
        assert tokenOf(acquire(locks, conn, b"k", 5)) != token
    clock.advance(0.5)  # (task.Clock runs what comes due at the end of each advance)
    assert [k for k, _ in expiries.seen] == [b"early"]
    clock.advance(1.0)
    assert [k for k, _ in expiries.seen] == [b"early"]
    clock.advance(0.501)
    assert [k for k, _ in expiries.seen] == [b"early", b"between"]
    clock.advance(2.999)
    assert [k for k, _ in expiries.seen] == [b"early", b"between", b"k"]
    assert not clock.getDelayedCalls() and len(locks.table) == 0


@pytest.mark.parametrize("share", [READ, 3])
def test_shared_grants_expire_each_by_its_own_token(share: int) -> None:
    """
    A shared key's grants (readers, a semaphore's slots) each run out at
    their own deadline, also two in the same millisecond and one renewed
    into another's millisecond; the key stays held by the others meanwhile.
    """
    locks, clock, expiries, conn = service()
    first = tokenOf(acquire(locks, conn, b"s", 1.0002, share))
    second = tokenOf(acquire(locks, conn, b"s", 1.0004, share))  # the same millisecond
    third = tokenOf(acquire(locks, conn, b"s", 2, share))
    replies: List[bytes] = []
    locks.renew(b"s", third, 3.0004, replies.append)
    assert replies == [b"N s OK\n"]
    fourth = tokenOf(acquire(locks, conn, b"s", 3.0002, share)) if share == READ else None
    grants = lambda: sorted(t for t, *_ in locks.table.sharedGrantsOf(b"s"))  # noqa: E731
    assert grants() == sorted(t for t in (first, second, third, fourth) if t is not None)
    clock.advance(1.0003)
    assert grants() == sorted(t for t in (second, third, fourth) if t is not None)
    clock.advance(0.0002)
    assert grants() == sorted(t for t in (third, fourth) if t is not None)
    clock.advance(1.5)
    assert grants() == sorted(t for t in (third, fourth) if t is not None)
    clock.advance(0.5)  # 3.0005: past both of the last millisecond
    assert grants() == [] and len(locks.table) == 0
    assert len(expiries.seen) == (4 if share == READ else 3)
    assert not clock.getDelayedCalls()
