"""
The pure lock table: unit tests and property tests over random operation
sequences.  No reactor, no sleeping: time is a number we pass in.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockservice.core.table import (
    MAX_TOKEN,
    HandOverFailed,
    LockTable,
    StaleHolder,
    TokenExhausted,
    TokenIssuer,
    Waiter,
)


class FakeWall:
    def __init__(self, micros: int = 1_000_000) -> None:
        self.micros = micros

    def __call__(self) -> int:
        return self.micros


def makeTable(micros: int = 1_000_000) -> Tuple[LockTable, FakeWall]:
    wall = FakeWall(micros)
    return LockTable(TokenIssuer(wall)), wall


def test_free_key_granted_at_once_with_clock_token() -> None:
    table, wall = makeTable(5_000_000)
    grant = table.acquire(Waiter(b"k", 30.0), now=100.0)
    assert grant is not None
    assert grant.token == 5_000_000
    assert grant.expiresAt == 130.0
    assert grant.waiter is None


def test_tokens_rise_by_one_when_clock_stands_still() -> None:
    table, wall = makeTable()
    first = table.acquire(Waiter(b"a", 1.0), 0.0)
    second = table.acquire(Waiter(b"b", 1.0), 0.0)
    assert first and second
    assert second.token == first.token + 1


def test_tokens_follow_clock_when_it_runs_ahead() -> None:
    table, wall = makeTable()
    table.acquire(Waiter(b"a", 1.0), 0.0)
    wall.micros = 9_000_000
    grant = table.acquire(Waiter(b"b", 1.0), 0.0)
    assert grant and grant.token == 9_000_000


def test_tokens_never_fall_when_clock_steps_back() -> None:
    table, wall = makeTable(9_000_000)
    first = table.acquire(Waiter(b"a", 1.0), 0.0)
    wall.micros = 1
    second = table.acquire(Waiter(b"b", 1.0), 0.0)
    assert first and second and second.token == first.token + 1


def test_observed_tokens_raise_the_floor() -> None:
    tokens = TokenIssuer(FakeWall(10))
    tokens.observe(500)
    tokens.observe(20)
    assert tokens.issue() == 501


def test_token_space_exhaustion_is_an_error_not_a_wrap() -> None:
    tokens = TokenIssuer(FakeWall(10), last=MAX_TOKEN)
    with pytest.raises(TokenExhausted):
        tokens.issue()


def test_held_key_queues_and_release_hands_over_fifo() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    first, second = Waiter(b"k", 5.0), Waiter(b"k", 7.0)
    assert table.acquire(first, 1.0) is None
    assert table.acquire(second, 2.0) is None
    assert table.queueLength(b"k") == 2
    ok, handed = table.release(b"k", grant.token, 3.0)
    assert ok and handed is not None
    assert handed.waiter is first
    assert handed.token > grant.token
    assert handed.expiresAt == 8.0
    holder = table.holder(b"k")
    assert holder and holder.token == handed.token


def test_release_with_stale_token_changes_nothing() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    assert table.release(b"k", grant.token + 1, 1.0) == (False, None)
    assert table.release(b"other", grant.token, 1.0) == (False, None)
    assert table.release(b"k", 0, 1.0) == (False, None)
    holder = table.holder(b"k")
    assert holder and holder.token == grant.token


def test_release_of_last_holder_frees_key() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    assert table.release(b"k", grant.token, 1.0) == (True, None)
    assert table.holder(b"k") is None
    assert len(table) == 0
    assert table.release(b"k", grant.token, 1.0) == (False, None)


def test_expiry_only_after_lease_and_only_for_current_holder() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    waiter = Waiter(b"k", 3.0)
    table.acquire(waiter, 1.0)
    assert table.expire(b"k", grant.token, 9.999) == (False, None)
    expired, handed = table.expire(b"k", grant.token, 10.0)
    assert expired and handed and handed.waiter is waiter
    assert table.expire(b"k", grant.token, 50.0) == (False, None)


def test_withdraw_removes_waiter_once() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    waiter = Waiter(b"k", 3.0)
    table.acquire(waiter, 0.0)
    assert table.withdraw(waiter) is True
    assert table.withdraw(waiter) is False
    assert table.waiterCount == 0
    assert table.release(b"k", grant.token, 1.0) == (True, None)


class Named(Waiter):
    __slots__ = ("name",)

    def __init__(self, key: bytes, lease: float, name: str) -> None:
        super().__init__(key, lease)
        self.name = name

    def holderName(self) -> str:
        return self.name


def test_same_owner_is_not_reentrant() -> None:
    table, _ = makeTable()
    assert table.acquire(Named(b"k", 10.0, "me"), 0.0) is not None
    assert table.acquire(Named(b"k", 10.0, "me"), 0.0) is None


def test_holder_records_who_holds_it_at_every_grant() -> None:
    table, _ = makeTable()
    first = table.acquire(Named(b"k", 10.0, "alice"), 0.0)
    assert first
    bob = Named(b"k", 10.0, "bob")
    table.acquire(bob, 0.0)
    holder = table.holder(b"k")
    assert holder and holder.owner == "alice" and list(holder.waiters()) == [bob]
    table.renew(b"k", first.token, 20.0, 1.0)
    assert holder.renewals == 1
    table.release(b"k", first.token, 2.0)
    with pytest.raises(StaleHolder):  # a view shows one grant, which has ended
        assert holder.owner is None
    holder = table.holder(b"k")
    assert holder and holder.owner == "bob" and holder.renewals == 0 and holder.waiting == 0


def test_withdraw_from_the_middle_keeps_fifo_order() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    waiters = [Waiter(b"k", 1.0) for _ in range(5)]
    for w in waiters:
        table.acquire(w, 0.0)
    for i in (2, 0, 4):
        assert table.withdraw(waiters[i])
    holder = table.holder(b"k")
    assert holder and list(holder.waiters()) == [waiters[1], waiters[3]]
    assert table.queueLength(b"k") == 2 == table.waiterCount
    _, handed = table.release(b"k", grant.token, 1.0)
    assert handed and handed.waiter is waiters[1]
    _, handed = table.release(b"k", handed.token, 1.0)
    assert handed and handed.waiter is waiters[3]
    assert table.release(b"k", handed.token, 1.0) == (True, None)
    assert table.holder(b"k") is None


def test_renew_moves_expiry_and_keeps_token() -> None:
    table, _ = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    holder = table.renew(b"k", grant.token, 30.0, 5.0)
    assert holder and holder.token == grant.token and holder.expiresAt == 35.0
    assert table.expire(b"k", grant.token, 34.9) == (False, None)
    assert table.renew(b"k", grant.token + 1, 30.0, 6.0) is None
    assert table.renew(b"other", grant.token, 30.0, 6.0) is None
    assert holder.expiresAt == 35.0
    # A lease that has run out cannot be renewed any more.
    assert table.renew(b"k", grant.token, 30.0, 35.0) is None
    assert table.expire(b"k", grant.token, 35.0) == (True, None)


def test_exhausted_tokens_at_hand_over_free_the_key_and_return_waiters() -> None:
    table, wall = makeTable()
    grant = table.acquire(Waiter(b"k", 10.0), 0.0)
    assert grant
    waiters = [Waiter(b"k", 1.0), Waiter(b"k", 1.0)]
    for w in waiters:
        table.acquire(w, 0.0)
    wall.micros = MAX_TOKEN + 1
    with pytest.raises(HandOverFailed) as caught:
        table.expire(b"k", grant.token, 10.0)
    assert caught.value.waiters == waiters
    assert not any(w.queued for w in waiters)
    assert table.holder(b"k") is None and table.waiterCount == 0


def test_install_and_drop_mirror_replicated_holders() -> None:
    table, _ = makeTable(1)
    table.install(b"k", 777, 0.0, 20.0)
    holder = table.holder(b"k")
    assert holder and holder.token == 777 and holder.expiresAt == 20.0
    assert table.tokens.last == 777
    table.drop(b"k", 776)
    assert table.holder(b"k") is not None
    table.drop(b"k", 777)
    assert table.holder(b"k") is None


class Client:
    """
    What a waiter stands for (the server's connection): shown by its name.
    """

    def __init__(self, name: str) -> None:
        self.name = name


class ClientWaiter(Waiter):
    __slots__ = ("conn",)

    def __init__(self, key: bytes, lease: float, conn: Client) -> None:
        super().__init__(key, lease)
        self.conn = conn

    def client(self) -> object:
        return self.conn


def test_a_released_slot_is_reused_and_a_view_of_the_old_grant_fails_loudly() -> None:
    table, wall = makeTable()
    alice, bob = Client("alice"), Client("bob")
    first = table.acquire(ClientWaiter(b"a", 10.0, alice), 1.0)
    assert first
    old = table.holder(b"a")
    assert old and old.client is alice and old.owner == "alice"
    assert table.release(b"a", first.token, 2.0) == (True, None)
    wall.micros += 1_000
    second = table.acquire(ClientWaiter(b"b", 30.0, bob), 3.0)
    assert second
    assert table._keys[b"b"] == 0 and len(table._clients) == 1  # the same slot
    # The old view must not read b's grant from the reused slot.
    for name in ("grantedAt", "expiresAt", "client", "owner", "renewals", "queue", "waiting"):
        with pytest.raises(StaleHolder):
            getattr(old, name)
    with pytest.raises(StaleHolder):
        old.waiters()
    with pytest.raises(StaleHolder):
        old.expiresAt = 99.0
    new = table.holder(b"b")
    assert new and (new.token, new.grantedAt, new.expiresAt) == (second.token, 3.0, 33.0)
    assert new.client is bob and new.owner == "bob" and new.renewals == 0
    assert table.holder(b"a") is None and table.grantOf(b"a") is None
    # The same key taken again is a new grant too: the old view stays stale.
    table.release(b"b", second.token, 4.0)
    assert table.acquire(ClientWaiter(b"a", 10.0, alice), 5.0)
    with pytest.raises(StaleHolder):
        assert old.grantedAt is None


def test_renewals_and_waiters_never_leak_into_a_reused_slot() -> None:
    table, _ = makeTable()
    alice, bob, carol = Client("alice"), Client("bob"), Client("carol")
    grant = table.acquire(ClientWaiter(b"a", 10.0, alice), 0.0)
    assert grant
    table.renew(b"a", grant.token, 10.0, 1.0)
    table.renew(b"a", grant.token, 10.0, 2.0)
    late = ClientWaiter(b"a", 10.0, carol)
    assert table.acquire(late, 2.0) is None
    assert table.withdraw(late)  # the queue goes, the renewals stay
    held = table.holder(b"a")
    assert held and held.renewals == 2 and held.waiting == 0
    table.release(b"a", grant.token, 3.0)
    # b takes a's slot: none of a's renewals, queue or client.
    grant = table.acquire(ClientWaiter(b"b", 10.0, bob), 4.0)
    assert grant and table._keys[b"b"] == 0
    held = table.holder(b"b")
    assert held and (held.renewals, held.waiting, held.queue, held.client) == (0, 0, None, bob)
    # Waiters and renewals on the reused slot, then a hand-over.
    waiter = ClientWaiter(b"b", 20.0, carol)
    assert table.acquire(waiter, 4.0) is None
    renewed = table.renew(b"b", grant.token, 10.0, 5.0)
    assert renewed and renewed.renewals == 1 and list(renewed.waiters()) == [waiter]
    ok, handed = table.release(b"b", grant.token, 6.0)
    assert ok and handed and handed.waiter is waiter
    held = table.holder(b"b")
    assert held and (held.token, held.client, held.renewals, held.waiting) == (
        handed.token, carol, 0, 0)
    assert (held.grantedAt, held.expiresAt) == (6.0, 26.0)
    assert table.renew(b"b", handed.token, 10.0, 7.0)
    assert table.holder(b"b").renewals == 1  # type: ignore[union-attr]
    # Released: the slot is free again and holds nobody.
    table.release(b"b", handed.token, 8.0)
    assert table._free == [0] and table._clients == [None] and len(table) == 0


def test_mirrored_holders_reuse_slots_and_have_no_client() -> None:
    table, _ = makeTable(1)
    for i, key in enumerate((b"x", b"y", b"z")):
        table.install(key, 100 + i, 0.0, 10.0 + i)
    table.drop(b"y", 101)
    table.install(b"w", 200, 1.0, 50.0)
    assert table._keys[b"w"] == 1 and len(table._clients) == 3
    assert table.grantOf(b"w") == (200, 1.0, 50.0)
    assert table.clientOf(b"w") is None and table.ownerOf(b"w") is None
    assert sorted(table.grants()) == [
        (b"w", 200, 1.0, 50.0), (b"x", 100, 0.0, 10.0), (b"z", 102, 0.0, 12.0)]
    table.install(b"x", 300, 2.0, 60.0)  # a new grant of x
    assert table.grantOf(b"x") == (300, 2.0, 60.0)
    table.clear()
    assert len(table) == 0 and table.grantOf(b"w") is None and table._clients == []


def test_take_waiters_keeps_holders() -> None:
    table, _ = makeTable()
    table.acquire(Waiter(b"k", 10.0), 0.0)
    waiters = [Waiter(b"k", 1.0), Waiter(b"k", 1.0)]
    for w in waiters:
        table.acquire(w, 0.0)
    assert table.takeWaiters() == waiters
    assert table.holder(b"k") is not None
    assert table.waiterCount == 0 and table.queueLength(b"k") == 0


# -- property tests ---------------------------------------------------------

KEYS = [b"a", b"b", b"c"]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(KEYS), st.integers(1, 5)),
        st.tuples(st.just("release"), st.sampled_from(KEYS), st.booleans()),
        st.tuples(st.just("renew"), st.sampled_from(KEYS), st.integers(0, 5)),
        st.tuples(st.just("withdraw"), st.integers(0, 50), st.none()),
        st.tuples(st.just("tick"), st.integers(1, 4), st.none()),
        st.tuples(st.just("wallstep"), st.integers(-3_000_000, 3_000_000), st.none()),
    ),
    max_size=120,
)


class Model:
    """
    Drives a LockTable the way the service does (including lease expiry
    at the right moments) and records every event for the checks.
    """

    def __init__(self) -> None:
        self.wall = FakeWall(1_000_000)
        self.table = LockTable(TokenIssuer(self.wall))
        self.now = 0.0
        self.waiters: List[Waiter] = []
        self.fate: Dict[int, str] = {}
        self.queueOrder: Dict[bytes, List[int]] = {k: [] for k in KEYS}
        self.grantOrder: Dict[bytes, List[int]] = {k: [] for k in KEYS}
        self.tokens: List[int] = []
        self.holding: Dict[bytes, Optional[Tuple[int, float]]] = {k: None for k in KEYS}

    def grant(self, key: bytes, token: int, expiresAt: float, waiter: Optional[Waiter]) -> None:
        assert self.holding[key] is None, "two holders at once"
        self.holding[key] = (token, expiresAt)
        self.tokens.append(token)
        if waiter is not None:
            ident = self.waiters.index(waiter)
            self.fate[ident] = "granted"
            self.grantOrder[key].append(ident)

    def freed(self, key: bytes) -> None:
        self.holding[key] = None

    def handOver(self, key: bytes, grant: object) -> None:
        self.freed(key)
        if grant is not None:
            self.grant(key, grant.token, grant.expiresAt, grant.waiter)  # type: ignore[attr-defined]

    def expireDue(self) -> None:
        for key in KEYS:
            held = self.holding[key]
            while held is not None and held[1] <= self.now:
                expired, grant = self.table.expire(key, held[0], self.now)
                assert expired
                self.handOver(key, grant)
                held = self.holding[key]

    def run(self, op: str, a: object, b: object) -> None:
        if op == "acquire":
            waiter = Waiter(a, float(b))  # type: ignore[arg-type]
            self.waiters.append(waiter)
            ident = len(self.waiters) - 1
            grant = self.table.acquire(waiter, self.now)
            if grant is None:
                self.fate[ident] = "waiting"
                self.queueOrder[a].append(ident)  # type: ignore[index]
            else:
                self.fate[ident] = "granted"
                self.grant(a, grant.token, grant.expiresAt, None)  # type: ignore[arg-type]
        elif op == "release":
            held = self.holding[a]  # type: ignore[index]
            token = held[0] if held and b else 12345
            ok, grant = self.table.release(a, token, self.now)  # type: ignore[arg-type]
            assert ok == bool(held and b)
            if ok:
                self.handOver(a, grant)  # type: ignore[arg-type]
        elif op == "renew":
            held = self.holding[a]  # type: ignore[index]
            token = held[0] if held and b else 12345
            holder = self.table.renew(a, token, float(b) or 1.0, self.now)  # type: ignore[arg-type]
            assert (holder is not None) == bool(held and b)
            if holder is not None:
                assert holder.token == token
                self.holding[a] = (token, self.now + float(b))  # type: ignore[arg-type,index]
        elif op == "withdraw":
            if self.waiters:
                ident = a % len(self.waiters)  # type: ignore[operator]
                waiter = self.waiters[ident]
                was = self.fate[ident] == "waiting"
                assert self.table.withdraw(waiter) == was
                if was:
                    self.fate[ident] = "dropped"
                    self.queueOrder[waiter.key].remove(ident)
        elif op == "tick":
            self.now += float(a)  # type: ignore[arg-type]
            self.expireDue()
        elif op == "wallstep":
            self.wall.micros = max(0, self.wall.micros + a)  # type: ignore[operator]


    def check(self) -> None:
        """
        The table says what the model says, key by key, and its slots add
        up: every slot is either one held key's or free, never both.
        """
        table = self.table
        for key in KEYS:
            held = self.holding[key]
            grant = table.grantOf(key)
            assert (grant[0], grant[2]) == held if grant else held is None
            waiting = [i for i in self.queueOrder[key] if self.fate[i] == "waiting"]
            assert table.queueLength(key) == len(waiting)
        used = {slot for key in table.keys() for _, slot in table._slotsOf(key)}
        assert used == set(table._keys.values())  # one grant per exclusive key
        free = set(table._free)
        assert len(used) == len(table) and len(free) == len(table._free)
        assert not used & free and used | free == set(range(len(table._clients)))
        assert all(table._clients[slot] is None for slot in free)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_random_sequences_keep_the_invariants(ops: List[Tuple[str, object, object]]) -> None:
    model = Model()
    for op in ops:
        model.run(*op)
        model.check()
    # Run out every lease: every waiter must end granted or dropped.
    for _ in range(len(model.waiters) + 1):
        model.now += 10
        model.expireDue()
    # Tokens strictly increasing, whatever the wall clock did.
    assert all(a < b for a, b in zip(model.tokens, model.tokens[1:], strict=False))
    # FIFO: per key, queued waiters were granted in queue order.
    for key in KEYS:
        assert model.grantOrder[key] == model.queueOrder[key]
    assert set(model.fate.values()) <= {"granted", "dropped"}
    assert model.table.waiterCount == 0
    assert len(model.table) == 0


def test_a_page_of_held_keys_skips_the_ones_before_it() -> None:
    from lockservice.core.table import LockTable, TokenIssuer, Waiter

    table = LockTable(TokenIssuer(lambda: 1))
    for i in range(10):
        assert table.acquire(Waiter(b"k%d" % i, 30.0), 0.0) is not None
    assert table.page(0, 3) == [b"k0", b"k1", b"k2"]
    assert table.page(8, 5) == [b"k8", b"k9"]
    assert table.page(10, 5) == []
