"""
Shared keys in the pure lock table (SPEC section 2, "Shared keys"): read
locks, semaphores, one FIFO across modes, kinds, the chunked grant of a run
of readers, the heal's fit rule, and a hypothesis model of all the rules.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockservice.core.table import (
    EXCLUSIVE,
    READ,
    READ_WRITE,
    Grant,
    HandOverFailed,
    LockTable,
    ShareMismatch,
    StaleHolder,
    TokenIssuer,
    Waiter,
    fitTogether,
)

W, R = EXCLUSIVE, READ


def makeTable() -> LockTable:
    clock = iter(range(1_000_000, 10**12))
    return LockTable(TokenIssuer(lambda: next(clock)))


def acquire(table: LockTable, key: bytes, share: int, now: float = 0.0,
            lease: float = 30.0) -> Tuple[Waiter, Optional[Grant]]:
    waiter = Waiter(key, lease, share)
    return waiter, table.acquire(waiter, now)


def drain(table: LockTable, now: float = 0.0, budget: int = 10**9) -> List[Grant]:
    grants: List[Grant] = []
    while len(grants) < budget:
        key = table.nextPending()
        if key is None:
            break
        grant = table.grantHead(key, now)
        if grant is not None:
            grants.append(grant)
    return grants


def test_readers_share_and_a_writer_waits_for_all_of_them() -> None:
    table = makeTable()
    _, r1 = acquire(table, b"k", R)
    _, r2 = acquire(table, b"k", R)
    assert r1 and r2 and r2.token > r1.token
    w, none = acquire(table, b"k", W)
    assert none is None and w.queued
    # A reader that comes after the writer queues behind it (no overtaking).
    r3, none = acquire(table, b"k", R)
    assert none is None
    assert table.holderCount(b"k") == 2 and len(table) == 1
    assert table.release(b"k", r1.token, 1.0) == (True, None)
    assert table.release(b"k", r1.token, 1.0) == (False, None)  # STALE now
    ok, grant = table.release(b"k", r2.token, 2.0)
    assert ok and grant is not None and grant.waiter is w
    assert grant.token > r2.token  # a writer's token is above every reader's before it
    assert not table.isShared(b"k")  # a writer holds the key as an exclusive key
    ok, grant = table.release(b"k", grant.token, 3.0)
    assert ok and grant is not None and grant.waiter is r3
    assert table.isShared(b"k") and drain(table) == []


def test_a_writers_release_lets_the_run_of_readers_in_and_stops_at_the_next_writer() -> None:
    table = makeTable()
    _, w = acquire(table, b"k", W)
    assert w is not None
    readers = [acquire(table, b"k", R)[0] for _ in range(5)]
    w2, _ = acquire(table, b"k", W)
    late, _ = acquire(table, b"k", R)
    ok, first = table.release(b"k", w.token, 1.0)
    assert ok and first is not None and first.waiter is readers[0]
    assert table.pending == {b"k": None}
    # Granted in bounded chunks, in FIFO order.
    assert [g.waiter for g in drain(table, 1.0, budget=2)] == readers[1:3]
    # Meanwhile a new reader queues: it never overtakes the waiters.
    newcomer, none = acquire(table, b"k", R)
    assert none is None
    assert [g.waiter for g in drain(table, 1.0)] == readers[3:]
    assert table.nextPending() is None
    assert [w.queued for w in (w2, late, newcomer)] == [True, True, True]
    tokens = [g.token for g in table.grantsOf(b"k")]
    assert tokens == sorted(tokens) and len(tokens) == 5


def test_a_semaphore_of_n_holds_n_and_hands_slots_over_fifo() -> None:
    table = makeTable()
    grants = [acquire(table, b"s", 3)[1] for _ in range(3)]
    assert all(grants)
    waiting = [acquire(table, b"s", 3)[0] for _ in range(2)]
    assert all(w.queued for w in waiting)
    assert table.kindOf(b"s") == 3 and table.holderCount(b"s") == 3
    ok, _ = table.release(b"s", grants[1].token, 1.0)  # type: ignore[union-attr]
    assert ok
    assert [g.waiter for g in drain(table, 1.0)] == waiting[:1]
    assert waiting[1].queued and table.holderCount(b"s") == 3


@pytest.mark.parametrize(
    "first, second, kind",
    [(W, 3, READ_WRITE), (R, 2, READ_WRITE), (3, W, 3), (3, R, 3), (3, 4, 3), (2, 65535, 2)],
)
def test_a_mismatched_share_is_refused_and_changes_nothing(first: int, second: int,
                                                          kind: int) -> None:
    table = makeTable()
    acquire(table, b"k", first)
    before = (table.tokens.last, table.holderCount(b"k"), table.waiterCount,
              table.isShared(b"k"), type(table._clients[table._keys[b"k"]]))
    with pytest.raises(ShareMismatch) as caught:
        acquire(table, b"k", second)
    assert caught.value.kind == kind
    assert (table.tokens.last, table.holderCount(b"k"), table.waiterCount,
            table.isShared(b"k"), type(table._clients[table._keys[b"k"]])) == before


def test_a_waited_for_key_keeps_its_kind_and_a_gone_key_takes_a_new_one() -> None:
    table = makeTable()
    _, w = acquire(table, b"k", W)
    acquire(table, b"k", R)  # queued: the key is read-write while waited for
    with pytest.raises(ShareMismatch):
        acquire(table, b"k", 2)
    ok, reader = table.release(b"k", w.token, 1.0)  # type: ignore[union-attr]
    assert ok and reader is not None
    table.release(b"k", reader.token, 2.0)
    assert b"k" not in table and table.kindOf(b"k") is None
    assert acquire(table, b"k", 2)[1] is not None
    assert table.kindOf(b"k") == 2


def test_cutting_a_run_that_starts_at_the_head_lets_the_readers_behind_it_in() -> None:
    table = makeTable()
    acquire(table, b"k", R)
    w1, _ = acquire(table, b"k", W)
    w2, _ = acquire(table, b"k", W)
    r, _ = acquire(table, b"k", R)
    table.cut(b"k", w1, w2, 2)
    assert [g.waiter for g in drain(table)] == [r]


def test_withdrawing_the_waiting_writer_lets_the_readers_behind_it_in() -> None:
    table = makeTable()
    acquire(table, b"k", R)
    w, _ = acquire(table, b"k", W)
    r, _ = acquire(table, b"k", R)
    assert drain(table) == []
    assert table.withdraw(w)
    assert [g.waiter for g in drain(table)] == [r]


def test_each_grant_has_its_own_lease_and_expires_by_its_token() -> None:
    table = makeTable()
    _, a = acquire(table, b"k", R, lease=10.0)
    _, b = acquire(table, b"k", R, lease=5.0)
    assert a and b
    # The key's slot shows the grant that runs out first.
    assert table.tokenOf(b"k") == b.token and table.expiresAt(b"k") == 5.0
    assert table.expire(b"k", a.token, 6.0) == (False, None)  # not yet
    assert table.renew(b"k", b.token, 20.0, 1.0) is not None  # now runs to 21
    assert table.tokenOf(b"k") == a.token and table.expiresAt(b"k") == 10.0
    assert table.expire(b"k", a.token, 10.0) == (True, None)
    holder = table.holder(b"k")
    assert holder is not None and holder.token == b.token and holder.expiresAt == 21.0
    assert holder.renewals == 1 and holder.share == READ
    assert table.renew(b"k", a.token, 5.0, 11.0) is None
    assert table.expire(b"k", b.token, 21.0) == (True, None)
    with pytest.raises(StaleHolder):
        _ = holder.expiresAt
    assert len(table) == 0


def test_exhausted_tokens_in_a_chunked_grant_answer_the_waiters_and_keep_the_holders() -> None:
    table = makeTable()
    _, w = acquire(table, b"k", W)
    readers = [acquire(table, b"k", R)[0] for _ in range(3)]
    table.release(b"k", w.token, 1.0)  # type: ignore[union-attr]
    table.tokens.last = 2**64 - 1
    with pytest.raises(HandOverFailed) as caught:
        drain(table, 1.0)
    assert caught.value.waiters == readers[1:]
    assert table.holderCount(b"k") == 1 and table.waiterCount == 0


def test_an_exclusive_key_keeps_the_one_holder_form() -> None:
    table = makeTable()
    _, grant = acquire(table, b"k", W)
    assert grant is not None
    slot = table._keys[b"k"]
    assert type(table._clients[slot]) is Waiter  # the bare client: no per-key object
    assert not table.isShared(b"k") and table.grantsOf(b"k")[0].share == EXCLUSIVE


def test_replication_installs_and_drops_shared_grants() -> None:
    table = makeTable()
    table.install(b"k", 10, 0.0, 30.0, READ)
    table.install(b"k", 11, 0.0, 20.0, READ)
    assert table.holderCount(b"k") == 2 and table.tokenOf(b"k") == 11
    assert table.sharedGrantsOf(b"k") == [(11, 0.0, 20.0, READ, None, False),
                                          (10, 0.0, 30.0, READ, None, False)]
    table.install(b"k", 11, 0.0, 40.0, READ)  # a renewal
    assert table.tokenOf(b"k") == 10
    table.drop(b"k", 10)
    table.drop(b"k", 11)
    assert b"k" not in table
    table.install(b"s", 5, 0.0, 9.0, 2)
    table.install(b"s", 6, 0.0, 9.0, W)  # a writer replaces them (the stream's word)
    assert not table.isShared(b"s") and table.tokenOf(b"s") == 6


@pytest.mark.parametrize(
    "grants, kept",
    [
        # Readers of both sides fit together.
        ([(5, R), (3, R), (4, R)], [5, 4, 3]),
        # A writer and readers do not: the side with the highest token wins.
        ([(5, R), (3, R), (4, W)], [5, 3]),
        ([(6, W), (5, R), (7, R)], [7, 5]),
        ([(9, W), (5, R), (7, R)], [9]),
        # Exclusive on both sides: the higher token (as ever).
        ([(3, W), (4, W)], [4]),
        # The same grant on both sides is one grant.
        ([(4, W), (4, W)], [4]),
        # Up to n semaphore grants, highest tokens first.
        ([(9, 3), (5, 3), (4, 3), (8, 3), (7, 3)], [9, 8, 7]),
        # Kinds or slot counts that disagree do not fit.
        ([(5, 3), (6, R), (4, R)], [6, 4]),
        ([(5, 3), (6, 4), (4, 3)], [6]),
    ],
)
def test_the_heal_keeps_what_fits_together(grants: List[Tuple[int, int]],
                                            kept: List[int]) -> None:
    assert fitTogether(grants) == kept


# -- the model ---------------------------------------------------------------

KEYS = [b"a", b"b"]
SHARES = [W, R, 2, 3]

_acquire = st.tuples(st.just("acquire"), st.sampled_from(KEYS), st.sampled_from(SHARES),
                     st.integers(1, 5))
operations = st.lists(
    st.one_of(
        # Acquires weigh thrice: queues must grow for the rules to matter.
        _acquire, _acquire, _acquire,
        st.tuples(st.just("release"), st.sampled_from(KEYS), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("renew"), st.sampled_from(KEYS), st.integers(0, 9),
                  st.integers(1, 5)),
        st.tuples(st.just("withdraw"), st.integers(0, 60), st.none(), st.none()),
        st.tuples(st.just("tick"), st.integers(1, 3), st.none(), st.none()),
        st.tuples(st.just("drain"), st.integers(0, 3), st.none(), st.none()),
    ),
    min_size=10,
    max_size=120,
)


def kindOfShare(share: int) -> int:
    return share if share >= 2 else READ_WRITE


class Model:
    """
    A plain reference of the rules, driven beside the table: every grant
    the table makes must be the one the rules call for, to the waiter.
    """

    def __init__(self) -> None:
        self.table = makeTable()
        self.now = 0.0
        self.waiters: List[Waiter] = []
        # Per key: holders (waiter index -> [token, share, expiresAt]), queue.
        self.holders: Dict[bytes, Dict[int, List[float]]] = {k: {} for k in KEYS}
        self.queue: Dict[bytes, List[int]] = {k: [] for k in KEYS}
        self.kind: Dict[bytes, Optional[int]] = {k: None for k in KEYS}
        self.fate: Dict[int, str] = {}
        self.tokens: List[int] = []

    def fits(self, key: bytes, share: int) -> bool:
        holders = self.holders[key]
        if not holders:
            return True
        if self.kind[key] == READ_WRITE:
            return share == R and all(h[1] == R for h in holders.values())
        return len(holders) < self.kind[key]  # type: ignore[operator]

    def granted(self, key: bytes, ident: int, grant: Grant) -> None:
        waiter = self.waiters[ident]
        assert grant.key == key and grant.waiter in (None, waiter)
        assert self.fits(key, waiter.share), "a grant that does not fit"
        if self.tokens:
            assert grant.token > max(self.tokens)
        self.tokens.append(grant.token)
        self.holders[key][ident] = [grant.token, waiter.share, grant.expiresAt]
        self.fate[ident] = "holding"

    def fromQueue(self, grant: Optional[Grant]) -> None:
        if grant is None:
            return
        key = grant.key
        assert self.queue[key], "a grant with nobody waiting"
        ident = self.queue[key].pop(0)
        assert grant.waiter is self.waiters[ident], "not the first waiter (FIFO)"
        self.granted(key, ident, grant)

    def ended(self, key: bytes, ident: int, grant: Optional[Grant]) -> None:
        del self.holders[key][ident]
        self.fate[ident] = "ended"
        if not self.holders[key] and self.queue[key]:
            assert grant is not None, "nothing holds, the first waiter must be let in"
        self.fromQueue(grant)
        self.forget(key)

    def forget(self, key: bytes) -> None:
        if not self.holders[key] and not self.queue[key]:
            self.kind[key] = None

    def holderAt(self, key: bytes, n: int) -> Optional[int]:
        idents = sorted(self.holders[key])
        return idents[n % len(idents)] if idents else None

    def run(self, op: str, a: object, b: object, c: object) -> None:
        table = self.table
        if op == "acquire":
            key, share, lease = a, b, c
            waiter = Waiter(key, float(lease), share)  # type: ignore[arg-type]
            self.waiters.append(waiter)
            ident = len(self.waiters) - 1
            kind = self.kind[key]  # type: ignore[index]
            if kind is not None and kind != kindOfShare(share):  # type: ignore[arg-type]
                with pytest.raises(ShareMismatch):
                    table.acquire(waiter, self.now)
                self.fate[ident] = "refused"
                return
            grant = table.acquire(waiter, self.now)
            self.kind[key] = kindOfShare(share)  # type: ignore[arg-type,index]
            if not self.queue[key] and self.fits(key, share):  # type: ignore[index,arg-type]
                assert grant is not None, "fits and nobody waits: granted at once"
                self.granted(key, ident, grant)  # type: ignore[arg-type]
            else:
                assert grant is None, "a new acquire overtook a waiter, or does not fit"
                self.queue[key].append(ident)  # type: ignore[index]
                self.fate[ident] = "waiting"
        elif op in ("release", "renew"):
            key = a
            ident = self.holderAt(key, b)  # type: ignore[arg-type]
            token = 12345 if ident is None else int(self.holders[key][ident][0])  # type: ignore[index]
            if op == "release":
                ok, grant = table.release(key, token, self.now)  # type: ignore[arg-type]
                assert ok == (ident is not None)
                if ident is not None:
                    self.ended(key, ident, grant)  # type: ignore[arg-type]
            else:
                holder = table.renew(key, token, float(c), self.now)  # type: ignore[arg-type]
                assert (holder is not None) == (ident is not None)
                if ident is not None:
                    self.holders[key][ident][2] = self.now + float(c)  # type: ignore[index,arg-type]
        elif op == "withdraw":
            if self.waiters:
                ident = a % len(self.waiters)  # type: ignore[operator]
                waiter = self.waiters[ident]
                was = self.fate[ident] == "waiting"
                assert table.withdraw(waiter) == was
                if was:
                    self.fate[ident] = "dropped"
                    self.queue[waiter.key].remove(ident)
                    self.forget(waiter.key)
        elif op == "tick":
            self.now += float(a)  # type: ignore[arg-type]
            self.expireDue()
        elif op == "drain":
            self.drain(a)  # type: ignore[arg-type]

    def drain(self, budget: int) -> None:
        for grant in drain(self.table, self.now, budget):
            self.fromQueue(grant)
        if budget > 10:
            for key in KEYS:
                queue = self.queue[key]
                assert not queue or not self.fits(key, self.waiters[queue[0]].share), \
                    "a waiter that fits was left waiting"

    def expireDue(self) -> None:
        for key in KEYS:
            while True:
                due = [(h[2], i) for i, h in self.holders[key].items() if h[2] <= self.now]
                if not due:
                    break
                _, ident = min(due)
                ok, grant = self.table.expire(key, int(self.holders[key][ident][0]), self.now)
                assert ok
                self.ended(key, ident, grant)

    def check(self) -> None:
        table = self.table
        for key in KEYS:
            holders = self.holders[key]
            assert table.kindOf(key) == self.kind[key]
            assert sorted(g.token for g in table.grantsOf(key)) == sorted(
                int(h[0]) for h in holders.values())
            assert table.holderCount(key) == len(holders)
            for view in table.grantsOf(key):
                ident = next(i for i, h in holders.items() if h[0] == view.token)
                assert view.expiresAt == holders[ident][2]
                assert view.share == (holders[ident][1] if self.kind[key] == READ_WRITE
                                      else self.kind[key])
            if holders:
                assert table.expiresAt(key) == min(h[2] for h in holders.values())
            queue = table.queueOf(key)
            assert [self.waiters.index(w) for w in (queue or ())] == self.queue[key]
            if self.queue[key] and self.fits(key, self.waiters[self.queue[key][0]].share):
                assert key in table.pending, "a waiter that fits is not pending"
            # Safety, whatever the reference says: never a writer beside
            # anyone, never more than n in a semaphore of n.
            shares = [h[1] for h in holders.values()]
            assert W not in shares or len(shares) == 1
            if self.kind[key] not in (None, READ_WRITE):
                assert len(shares) <= self.kind[key]  # type: ignore[operator]
        assert table.waiterCount == sum(len(q) for q in self.queue.values())
        grants = sum(len(h) for h in self.holders.values())
        assert grants <= table.grantCount() <= grants + len(table)
        assert sorted(g[1] for g in table.everyGrant()) == sorted(
            int(h[0]) for hs in self.holders.values() for h in hs.values())
        # Every slot is one grant's (or a key's) or free, never both.
        used = [slot for key in table.keys() for _, slot in table._slotsOf(key)]
        assert len(set(used)) == len(used) and set(table._keys.values()) <= set(used)
        free = set(table._free)
        assert len(free) == len(table._free)
        assert not set(used) & free and set(used) | free == set(range(len(table._clients)))


@settings(max_examples=400, deadline=None)
@given(operations)
def test_random_sequences_follow_the_rules_of_shared_keys(
        ops: List[Tuple[str, object, object, object]]) -> None:
    model = Model()
    for op in ops:
        model.run(*op)
        model.check()
    model.drain(10**9)
    model.check()
    for _ in range(len(model.waiters) + 2):
        model.now += 10
        model.expireDue()
        model.drain(10**9)
        model.check()
    assert set(model.fate.values()) <= {"ended", "dropped", "refused"}
    assert len(model.table) == 0 and model.table.waiterCount == 0


def _mirrorState(table: LockTable) -> object:
    return (sorted(table.everyGrant()), table.tokens.last, len(table), table.sharedGrants,
            table.grantCount())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from([b"a", b"b", b"c", b"d"]),   # key
    st.integers(1, 12),                           # token
    st.booleans(),                                # a drop
    st.sampled_from([EXCLUSIVE, EXCLUSIVE, READ, 2, 3]),   # share
    st.integers(0, 5),                            # time
), max_size=60))
def test_mirrorAll_is_install_and_drop_one_by_one(lines: List[Tuple[bytes, int, bool, int, int]]
                                                  ) -> None:
    """
    A standby's batch (LockTable.mirrorAll) leaves the table exactly as the
    same changes installed and dropped one at a time, whatever they are:
    new keys, re-grants, renewals, shared grants, drops of tokens not held.
    """
    changes = [(key, token, float(t), None if dropped else float(t + 30), share,
                b"n%d" % token, False)
               for key, token, dropped, share, t in lines]
    one, batch = makeTable(), makeTable()
    for key, token, grantedAt, expiresAt, share, name, delayed in changes:
        if expiresAt is None:
            one.drop(key, token)
        else:
            one.install(key, token, grantedAt, expiresAt, share, name, delayed)
    batch.mirrorAll(changes)
    assert _mirrorState(batch) == _mirrorState(one)
    # And a later batch lands on the slots freed by the first as well.
    again = [(key, token + 20, 9.0, 40.0, EXCLUSIVE, None, False)
             for key, token, *_ in changes[:5]]
    one2 = one
    for key, token, grantedAt, expiresAt, share, name, delayed in again:
        one2.install(key, token, grantedAt, expiresAt, share, name, delayed)
    batch.mirrorAll(again)
    assert _mirrorState(batch) == _mirrorState(one2)
