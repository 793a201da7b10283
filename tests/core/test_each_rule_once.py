"""
Each rule of the lock table holds alike for a key of one exclusive grant,
a read lock and a semaphore: the table keeps one representation of a key
(its grants, and a record when it has more than one exclusive grant or
waiters), so every rule here runs on each kind.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import pytest

from lockservice.core.shares import EXCLUSIVE, READ, fits, fitTogether
from lockservice.core.table import (
    Grant,
    HandOverFailed,
    LockTable,
    StaleHolder,
    TokenIssuer,
    Waiter,
)

SEMAPHORE = 2
SHARES = [EXCLUSIVE, READ, SEMAPHORE]


class Conn:
    """
    A client as the service's connections are: a name shown, and the
    holder name (C{ident}) grants are made under.
    """

    def __init__(self, name: str, ident: Optional[bytes] = None) -> None:
        self.name = name
        self.ident = ident


class ConnWaiter(Waiter):
    __slots__ = ("conn",)

    def __init__(self, key: bytes, lease: float, share: int, conn: Conn) -> None:
        super().__init__(key, lease, share)
        self.conn = conn

    def client(self) -> object:
        return self.conn


def makeTable() -> LockTable:
    clock = iter(range(1_000_000, 10**12))
    return LockTable(TokenIssuer(lambda: next(clock)))


def take(table: LockTable, share: int, now: float = 0.0, lease: float = 10.0,
         name: str = "a", key: bytes = b"k") -> Tuple[Waiter, Optional[Grant]]:
    waiter = ConnWaiter(key, lease, share, Conn(name, name.encode()))
    return waiter, table.acquire(waiter, now)


def both(share: int) -> int:
    """
    How many grants of C{share} hold a key at once here (the grants each
    test makes): one writer, two readers, two of a semaphore's slots.
    """
    return 1 if share == EXCLUSIVE else 2


def contender(share: int) -> int:
    """
    The share of an acquire that waits while the key's grants hold it.
    """
    return SEMAPHORE if share == SEMAPHORE else EXCLUSIVE


def holdAll(table: LockTable, share: int) -> List[Grant]:
    grants = [take(table, share, lease=10.0 + i, name=f"h{i}")[1] for i in range(both(share))]
    assert all(grants)
    return grants  # type: ignore[return-value]


@pytest.mark.parametrize("share", SHARES)
def test_an_expired_grant_keeps_its_place_until_its_delay_ends(share: int) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    first = grants[0]
    waiter, queued = take(table, contender(share), name="w")
    assert queued is None and waiter.queued
    table.startDelay(b"k", first.token, 15.0)
    # No longer held: no holding, no renewal, not the newest; its place stays.
    assert table.holdingOf(b"k", first.token) is None
    assert table.renew(b"k", first.token, 10.0, 1.0) is None
    place = table.placeOf(b"k", first.token)
    assert place is not None and (place[0], place[1], place[3]) == (0.0, 15.0, True)
    assert table.delayedUntil(b"k") == 15.0
    assert table.newest(b"k")[0] != first.token
    assert (first.token, 0.0, 15.0, share, b"h0", True) in table.sharedGrantsOf(b"k")
    assert [g[6] for g in table.everyGrant() if g[1] == first.token] == [True]
    assert table.leaseOf(b"k", first.token) == 15.0
    # The other grants end: the place still takes its slot of the key.
    for grant in grants[1:]:
        assert table.release(b"k", grant.token, 2.0) == (True, None)
    if share == SEMAPHORE:
        # One slot of two is free: the waiter comes in beside the place.
        assert table.nextPending() == b"k"
        assert table.grantHead(b"k", 2.0).waiter is waiter  # type: ignore[union-attr]
        assert table.expire(b"k", first.token, 15.0) == (True, None)
        assert table.holderCount(b"k") == 1
        return
    assert waiter.queued and table.nextPending() is None
    assert table.expire(b"k", first.token, 14.0) == (False, None)  # not yet
    ok, handed = table.expire(b"k", first.token, 15.0)
    assert ok and handed is not None and handed.waiter is waiter
    assert table.delayedUntil(b"k") is None


@pytest.mark.parametrize("share", SHARES)
def test_a_renewal_moves_one_grant_counts_and_keeps_its_token(share: int) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    last = grants[-1]
    view = table.renew(b"k", last.token, 30.0, 5.0)
    assert view is not None and view.token == last.token
    assert (view.expiresAt, view.renewals, view.grantedAt) == (35.0, 1, 0.0)
    table.renew(b"k", last.token, 30.0, 6.0)
    assert table.holder(b"k") is not None
    assert [h.renewals for h in table.grantsOf(b"k")] == [0] * (len(grants) - 1) + [2]
    # The key shows its grant that runs out first.
    assert table.expiresAt(b"k") == min([10.0 + i for i in range(len(grants) - 1)] + [36.0])
    assert table.renew(b"k", last.token, 30.0, 36.0) is None  # ran out
    assert table.renew(b"k", 12345, 30.0, 6.0) is None


@pytest.mark.parametrize("share", SHARES)
def test_a_grant_is_named_when_made_and_keeps_its_name(share: int) -> None:
    table = makeTable()
    conn = Conn("first", b"first")
    grant = table.acquire(ConnWaiter(b"k", 10.0, share, conn), 0.0)
    assert grant is not None
    conn.ident, conn.name = b"renamed", "renamed"
    assert table.nameOfGrant(b"k", grant.token) == b"first"
    assert table.newest(b"k") == (grant.token, b"first")
    assert table.grantsOf(b"k")[0].owner == "renamed"  # shown by its name now
    assert table.firstGrants(b"k", 5) == [
        (grant.token, 0.0, 10.0, conn, 0, b"first", False)]
    assert table.nameOfGrant(b"k", grant.token + 1) is None


@pytest.mark.parametrize("share", SHARES)
def test_exhausted_tokens_at_a_hand_over_free_the_key_and_answer_its_waiters(share: int
                                                                             ) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    writer, _ = take(table, contender(share), name="w")
    assert writer.queued
    table.tokens.last = 2**64 - 1
    for grant in grants[:-1]:
        table.release(b"k", grant.token, 1.0)
    with pytest.raises(HandOverFailed) as caught:
        table.release(b"k", grants[-1].token, 1.0)
    assert caught.value.waiters == [writer] and not writer.queued
    assert b"k" not in table and table.waiterCount == 0 and table.sharedGrants == 0


@pytest.mark.parametrize("share", SHARES)
def test_installing_the_same_grant_moves_it_and_keeps_its_grant_time(share: int) -> None:
    table = makeTable()
    table.install(b"k", 10, 1.0, 20.0, share, b"n", False)
    table.install(b"k", 10, 5.0, 40.0, share, b"n", True)  # now a kept place
    assert table.sharedGrantsOf(b"k") == [(10, 1.0, 40.0, share, b"n", True)]
    assert table.holding(b"k") is None and table.newest(b"k") == (0, None)
    table.install(b"k", 10, 5.0, 50.0, share, b"n", False)  # live again
    assert table.holding(b"k") == (10, 1.0, 50.0, None)
    assert table.plainGrantOf(b"k") == ((10, 1.0, 50.0, b"n") if share == EXCLUSIVE else None)
    table.drop(b"k", 10)
    assert b"k" not in table and table.sharedGrants == 0 and not table._records


@pytest.mark.parametrize("share", SHARES)
def test_a_heal_that_drops_every_grant_of_a_waited_for_key_installs_the_next(share: int
                                                                            ) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    waiter, _ = take(table, contender(share), name="w")
    for grant in grants:
        table.drop(b"k", grant.token)
    # Nothing holds it, its waiter still waits: the heal's grant comes next.
    assert waiter.queued and b"k" in table and table.holding(b"k") is None
    assert table.clientOf(b"k") is None and table.newest(b"k") == (0, None)
    assert table.holderCount(b"k") == 0 and table.sharedGrantsOf(b"k") == []
    table.install(b"k", 2**60, 0.0, 30.0, share, b"theirs")
    assert [h.token for h in table.grantsOf(b"k")] == [2**60] and waiter.queued
    assert table.holding(b"k") == (2**60, 0.0, 30.0, None)
    ok, handed = table.release(b"k", 2**60, 1.0)
    assert ok and handed is not None and handed.waiter is waiter
    slots = [slot for key in table.keys() for _, slot in table._slotsOf(key)]
    assert len(slots) + len(table._free) == len(table._clients)


@pytest.mark.parametrize("share", SHARES)
def test_a_view_follows_its_grant_and_moves_it(share: int) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    view = table.grantsOf(b"k")[-1]
    view.expiresAt = 1.0
    assert table.expiresAt(b"k") == 1.0 and table.tokenOf(b"k") == grants[-1].token
    assert view.share == share
    table.release(b"k", grants[-1].token, 2.0)
    with pytest.raises(StaleHolder):
        assert view.grantedAt is None


@pytest.mark.parametrize("held, count, share, fit", [
    (EXCLUSIVE, 0, SEMAPHORE, True),   # beside nothing, anything
    (EXCLUSIVE, 1, EXCLUSIVE, False),
    (EXCLUSIVE, 1, READ, False),
    (READ, 1, EXCLUSIVE, False),
    (READ, 5, READ, True),
    (READ, 1, SEMAPHORE, False),
    (SEMAPHORE, 1, SEMAPHORE, True),
    (SEMAPHORE, 2, SEMAPHORE, False),
    (SEMAPHORE, 1, 4, False),          # another slot count
    (SEMAPHORE, 1, READ, False),
])
def test_one_fit_rule_for_acquires_installs_and_heals(held: int, count: int, share: int,
                                                      fit: bool) -> None:
    assert fits(held, count, share) == fit
    # An acquire beside those grants (nobody waiting) is granted just when
    # it fits; a heal keeps the grant with them just when it fits.
    table = makeTable()
    for i in range(count):
        table.install(b"k", 10 + i, 0.0, 30.0, held)
    if count and held != share and (held > EXCLUSIVE or share > EXCLUSIVE):
        return  # another kind: refused (ShareMismatch), see test_shared_table
    assert (take(table, share)[1] is not None) == fit
    offered = [(10 + i, held) for i in range(count)] + [(1, share)]
    assert (1 in fitTogether(offered)) == fit


@pytest.mark.parametrize("share", SHARES)
def test_the_grant_a_heal_installs_after_dropping_every_grant_may_hold_otherwise(
        share: int) -> None:
    table = makeTable()
    grants = holdAll(table, share)
    waiter, _ = take(table, contender(share), name="w")
    for grant in grants:
        table.drop(b"k", grant.token)
    installed = EXCLUSIVE if share != EXCLUSIVE else READ
    table.install(b"k", 2**60, 0.0, 30.0, installed, b"theirs")
    assert table.sharedGrantsOf(b"k") == [(2**60, 0.0, 30.0, installed, b"theirs", False)]
    assert table.isShared(b"k") == (installed != EXCLUSIVE)
    assert table.sharedGrants == (1 if installed != EXCLUSIVE else 0)
    assert waiter.queued and table.grantCount() == 1 + table.sharedGrants
