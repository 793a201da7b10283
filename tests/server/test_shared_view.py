"""
The operator's view of shared keys (issue 22): read locks and semaphores on
/status, /locks, /metrics, and deadlocks through them, driven through the
real protocol (StringTransport) on a task.Clock, answers read as JSON.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from lockservice.server import webpages as http
from lockservice.server.deadlocks import WAIT_ENTERS_AFTER
from tests.support.protocol import T0
from tests.support.protocol import Node as ProtocolNode
from tests.support.web import SECRET, fetch, post, withMonitor


@pytest.fixture
def node() -> ProtocolNode:
    return ProtocolNode()


def named(node: ProtocolNode, name: str) -> Any:
    conn = node.connect()
    conn.ask(b"I " + name.encode())
    return conn


def tokenOf(answer: bytes) -> int:
    assert answer.startswith(b"A "), answer
    return int(answer.split()[2])


def status(stub: Any) -> Dict[str, Any]:
    _, body = fetch(stub, "/status")
    return json.loads(body)  # type: ignore[no-any-return]


def test_a_read_lock_shows_every_reader_and_each_waiters_mode(node: ProtocolNode) -> None:
    stub, _ = withMonitor(node)
    r1, r2, w, r3 = (named(node, n) for n in ("r1", "r2", "w", "r3"))
    assert tokenOf(r1.ask(b"A k 30 0 r")) == T0
    node.clock.advance(1)
    assert tokenOf(r2.ask(b"A k 20 0 r")) == T0 + 1
    assert w.ask(b"A k 30 5") == b""       # a writer waits for both readers
    assert r3.ask(b"A k 10 5 r") == b""    # and a reader behind it for the writer
    node.clock.advance(2)
    _, body = fetch(stub, "/locks?key=k")
    entry = json.loads(body)
    assert entry == {
        "key": "k", "held": True,
        # The top-level grant fields: the grant whose lease runs out first.
        "token": T0 + 1, "holder": "r2", "granted_at": 1_700_000_001.0,
        "age_seconds": 2, "remaining_seconds": 18, "renewals": 0, "long_hold": False,
        "queue_length": 2,
        "waiters": [
            {"who": "w", "lease_seconds": 30, "waited_seconds": 2, "mode": "exclusive"},
            {"who": "r3", "lease_seconds": 10, "waited_seconds": 2, "mode": "reader"},
        ],
        "waiters_truncated": False,
        "kind": "read-write", "slots": None, "holder_count": 2, "holders_truncated": False,
        "holders": [
            {"token": T0, "holder": "r1", "mode": "reader", "granted_at": 1_700_000_000.0,
             "age_seconds": 3, "remaining_seconds": 27, "renewals": 0, "long_hold": False,
             "delayed": False},
            {"token": T0 + 1, "holder": "r2", "mode": "reader",
             "granted_at": 1_700_000_001.0, "age_seconds": 2, "remaining_seconds": 18,
             "renewals": 0, "long_hold": False, "delayed": False},
        ],
        "delayed": False, "delay_ends_at": None, "delay_remaining_seconds": None,
    }
    data = status(stub)
    assert (data["held_keys"], data["shared_grants"], data["waiters"]) == (1, 2, 2)
    _, metrics = fetch(stub, "/metrics")
    assert "lockservice_shared_grants 2.0" in metrics.decode()
    assert "lockservice_held_keys 1.0" in metrics.decode()


def test_a_semaphore_shows_its_slots_and_a_capped_list_of_holders(
        node: ProtocolNode) -> None:
    stub, _ = withMonitor(node)
    a, b = named(node, "a"), named(node, "b")
    a.send(b"".join(b"A s 30 0 3\n" for _ in range(2)))
    assert [tokenOf(line + b"\n") for line in a.take().splitlines()] == [T0, T0 + 1]
    assert tokenOf(b.ask(b"A s 30 0 3")) == T0 + 2
    assert b.ask(b"A s 30 5 3") == b""
    _, body = fetch(stub, "/locks?key=s&holders=2")
    entry = json.loads(body)
    assert (entry["kind"], entry["slots"], entry["holder_count"]) == ("semaphore", 3, 3)
    assert [(h["token"], h["holder"], h["mode"]) for h in entry["holders"]] == [
        (T0, "a", "semaphore"), (T0 + 1, "a", "semaphore")]
    assert entry["holders_truncated"] is True
    assert [(w["who"], w["mode"]) for w in entry["waiters"]] == [("b", "semaphore")]
    _, page = fetch(stub, "/locks")
    [listed] = json.loads(page)["locks"]
    assert listed["holder_count"] == 3 and len(listed["holders"]) == 3
    response, _ = fetch(stub, "/locks?key=s&holders=1001")
    assert response.code == 400


def test_holders_listed_are_bounded_per_key_and_per_answer(
        node: ProtocolNode) -> None:
    """
    A semaphore with 6,000 grants: /locks?key= lists at most 1,000 of them;
    a page lists at most 5,000 in all (HOLDERS_TOTAL) and says the rest are
    cut, and is written in many bounded pieces.
    """
    stub, _ = withMonitor(node)
    holder = named(node, "many")
    for n in range(6):
        holder.send(b"".join(b"A s%d 30 0 65535\n" % n for _ in range(1000)))
        assert holder.take().count(b"\n") == 1000
    assert node.service.table.sharedGrants == 6000
    _, body = fetch(stub, "/locks?key=s0&holders=1000")
    entry = json.loads(body)
    assert entry["holder_count"] == 1000 and len(entry["holders"]) == 1000
    assert entry["holders_truncated"] is False
    pieces: List[bytes] = []
    original = http.jsonPieces

    def counted(*args: Any, **kw: Any) -> Any:
        for piece in original(*args, **kw):
            pieces.append(piece)
            yield piece

    http.jsonPieces = counted  # type: ignore[assignment]
    try:
        _, page = fetch(stub, "/locks?holders=1000")
    finally:
        http.jsonPieces = original  # type: ignore[assignment]
    locks = json.loads(page)["locks"]
    assert sum(len(lock["holders"]) for lock in locks) == http.HOLDERS_TOTAL
    assert [len(lock["holders"]) for lock in locks] == [1000] * 5 + [0]
    assert locks[5]["holders_truncated"] and locks[5]["holder_count"] == 1000
    assert len(pieces) >= 6  # a key's list of grants per step, not the page at once


def test_force_release_of_one_grant_of_a_shared_key(node: ProtocolNode) -> None:
    stub, monitor = withMonitor(node, adminSecret=SECRET)
    r1, r2 = named(node, "r1"), named(node, "r2")
    first, second = tokenOf(r1.ask(b"A k 30 0 r")), tokenOf(r2.ask(b"A k 60 0 r"))
    code, answer = post(stub, f"/locks/k/release?token={second}")
    assert code == 200 and answer["released_token"] == second
    assert [t for t, *_ in node.service.table.firstGrants(b"k", 10)] == [first]
    assert monitor.forceReleases == 1


# -- deadlocks through shared keys ---------------------------------------------


def deadlocks(node: ProtocolNode, stub: Any) -> List[Dict[str, Any]]:
    # Waits enter the wait-for graph once they have lasted a while; the
    # check runs then.
    node.clock.advance(WAIT_ENTERS_AFTER)
    data = status(stub)
    assert data["deadlocks_count"] == len(data["deadlocks"])
    return data["deadlocks"]  # type: ignore[no-any-return]


def test_a_cycle_through_a_read_lock_is_reported(node: ProtocolNode) -> None:
    """
    r holds k as a reader; w holds m and waits to write k (for every
    reader); r waits for m: deadlocked.
    """
    stub, _ = withMonitor(node)
    r, w = named(node, "r"), named(node, "w")
    tokenOf(r.ask(b"A k 30 0 r"))
    tokenOf(w.ask(b"A m 30 0"))
    assert w.ask(b"A k 30 60") == b""
    assert deadlocks(node, stub) == []
    assert r.ask(b"A m 30 60") == b""
    assert deadlocks(node, stub) == [{
        "length": 2, "clients": ["w", "r"], "keys": ["k", "m"],
        "since": 1_700_000_000.1,  # found once r's wait had lasted 0.05 s
        "description": "w waits for k (blocked by r) -> r waits for m (held by w)",
        "shared": True, "deadlocked": ["r", "w"],
    }]
    # r gives up waiting for m: the cycle is gone, and so is the report.
    node.clock.advance(60)
    assert b"T m" in r.take()
    assert deadlocks(node, stub) == []


@pytest.mark.parametrize("share", [b"", b" r", b" 2"])
def test_a_cycle_through_a_shared_key_with_thousands_queued_is_reported(
        node: ProtocolNode, share: bytes) -> None:
    """
    Found by a black-box helper: h reads k (or holds a slot of it), q
    queues to write it first (the semaphore: waits for a slot), then 3,000
    more acquires queue behind q; q takes x, and h waits for x.  Reading
    k's 3,000 waiters used up the whole search, and the cycle was never
    reported, not even after the queue emptied.
    """
    stub, _ = withMonitor(node)
    h, q, filler = named(node, "h"), named(node, "q"), named(node, "filler")
    other = named(node, "other")
    holdShare, waitShare = (b" r", b"") if share != b" 2" else (b" 2", b" 2")
    tokenOf(h.ask(b"A k 30 0" + holdShare))
    if share == b" 2":
        tokenOf(other.ask(b"A k 30 0 2"))  # the semaphore's second slot
    assert q.ask(b"A k 30 60" + waitShare) == b""
    assert deadlocks(node, stub) == []  # (q's wait is checked on its own)
    filler.send(b"".join([b"A k 30 60" + (share or waitShare) + b"\n"] * 3000))
    assert filler.take() == b""
    assert deadlocks(node, stub) == []  # (and the 3,000 behind it)
    tokenOf(q.ask(b"A x 30 0"))
    assert h.ask(b"A x 30 60") == b""
    if share == b" 2":
        assert other.ask(b"A x 30 60") == b""  # every slot's holder is stuck
    [found] = deadlocks(node, stub)
    assert found["keys"] == ["k", "x"] and "q waits for k" in found["description"]


def test_a_reader_behind_a_queued_writer_waits_for_that_writer(
        node: ProtocolNode) -> None:
    """
    a reads k; b queues to write k; c queues to read k behind b (a reader
    never overtakes a waiting writer), and holds x; a waits for x: a -> c
    -> b -> a.
    """
    stub, _ = withMonitor(node)
    a, b, c = named(node, "a"), named(node, "b"), named(node, "c")
    tokenOf(a.ask(b"A k 30 0 r"))
    tokenOf(c.ask(b"A x 30 0"))
    assert b.ask(b"A k 30 60") == b"" and c.ask(b"A k 30 60 r") == b""
    assert deadlocks(node, stub) == []
    assert a.ask(b"A x 30 60") == b""
    [found] = deadlocks(node, stub)
    assert found["description"] == ("c waits for k (blocked by b) -> "
                                    "b waits for k (blocked by a) -> "
                                    "a waits for x (held by c)")
    assert found["deadlocked"] == ["a", "b", "c"]


def test_readers_waiting_on_each_other_through_a_semaphore_with_a_free_path(
        node: ProtocolNode) -> None:
    """
    Readers a and b hold k; a holds x too; the semaphore s (2 slots) is
    held by b and c; a waits for a slot of s, b waits for x (a holds it).
    Each reader waits on the other, but c waits for nothing: its slot
    comes free, a gets it, and all unwinds.  No deadlock.  Once c waits
    for x too, every holder of s is stuck: a deadlock, reported once.
    """
    stub, _ = withMonitor(node)
    a, b, c = named(node, "a"), named(node, "b"), named(node, "c")
    tokenOf(a.ask(b"A k 30 0 r"))
    tokenOf(b.ask(b"A k 30 0 r"))
    tokenOf(a.ask(b"A x 30 0"))
    tokenOf(b.ask(b"A s 30 0 2"))
    tokenOf(c.ask(b"A s 30 0 2"))
    assert a.ask(b"A s 30 60 2") == b""
    assert b.ask(b"A x 30 60") == b""
    assert deadlocks(node, stub) == []
    assert c.ask(b"A x 30 60") == b""
    [found] = deadlocks(node, stub)
    assert found["deadlocked"] == ["a", "b", "c"]
    assert found["keys"] == ["s", "x"]
    assert found["description"] == ("a waits for s (every slot held by b, c) -> "
                                    "b waits for x (held by a)")
    assert deadlocks(node, stub) == [found]  # not reported again
    # c's slot goes: a takes it, the deadlock is over.
    node.clock.advance(30)
    assert deadlocks(node, stub) == []


def test_a_semaphore_waiter_holding_a_slot_itself_waits_for_every_other_slot(
        node: ProtocolNode) -> None:
    """
    Found by a black-box helper: a and b hold the two slots of s; a holds
    x and waits for another slot of s; b waits for x.  The description
    said "every slot held by b", though a holds one of them.
    """
    stub, _ = withMonitor(node)
    a, b = named(node, "a"), named(node, "b")
    tokenOf(a.ask(b"A s 30 0 2"))
    tokenOf(b.ask(b"A s 30 0 2"))
    tokenOf(a.ask(b"A x 30 0"))
    assert a.ask(b"A s 30 60 2") == b"" and b.ask(b"A x 30 60") == b""
    [found] = deadlocks(node, stub)
    assert found["description"] == ("a waits for s (every other slot held by b) -> "
                                    "b waits for x (held by a)")
    assert found["deadlocked"] == ["a", "b"]


def test_a_wait_on_a_semaphore_with_a_free_slot_is_no_deadlock(
        node: ProtocolNode) -> None:
    """
    While a semaphore has a free slot, its first waiter takes it: waiting
    behind a pending grant is not being blocked by the holders.
    """
    from lockservice.core.waitfor import ANY, keyWaits

    [(_, first), (_, second)] = keyWaits(b"s", [("h", "w")], [("p", "w"), ("q", "w")], 2)
    assert (first.how, first.blockers) == (ANY, frozenset())
    assert (second.how, second.blockers) == (ANY, frozenset({"h", "p"}))


@pytest.mark.parametrize("share", [b"r", b"3"])
def test_the_end_of_every_grant_of_a_shared_key_names_its_holder(
        node: ProtocolNode, share: bytes) -> None:
    """
    A release or an expiry of any grant of a shared key (the one whose
    lease runs out first included: the grant the key's slot shows) is an
    event that names the grant's holder, as for an exclusive key (found
    from outside: most of them said null).
    """
    _, monitor = withMonitor(node)
    alice, bob, carol = (named(node, n) for n in ("alice", "bob", "carol"))
    first = tokenOf(alice.ask(b"A k 30 0 " + share))
    second = tokenOf(bob.ask(b"A k 60 0 " + share))
    tokenOf(carol.ask(b"A k 5 0 " + share))
    assert alice.ask(b"R k %d" % first) == b"R k OK\n"  # not the first to run out
    node.clock.advance(6)  # carol's runs out first: it expires
    assert bob.ask(b"R k %d" % second) == b"R k OK\n"  # the last one
    ended = [(e.type, e.who) for e in monitor.events.since(0)[0]
             if e.type in ("release", "expiry")]
    assert ended == [("release", "alice"), ("expiry", "carol"), ("release", "bob")]


def test_force_release_of_a_shared_grant_names_the_grant_it_made_as_next(
        node: ProtocolNode) -> None:
    """
    C{next_token} is the token of the grant the force-release made (the
    waiter's), or null: never another holder's grant of the same shared
    key (found from outside: a semaphore's force-release reported the other
    slot's token, and a reader's the other reader's).
    """
    stub, _ = withMonitor(node, adminSecret=SECRET)
    s0, s1, s2 = (named(node, n) for n in ("s0", "s1", "s2"))
    first, second = tokenOf(s0.ask(b"A sem 30 0 2")), tokenOf(s1.ask(b"A sem 30 0 2"))
    assert s2.ask(b"A sem 30 5 2") == b""  # waits for a slot

    def force(token: int, key: str = "sem") -> Dict[str, Any]:
        code, answer = post(stub, f"/locks/{key}/release?token={token}")
        assert code == 200, answer
        return answer  # type: ignore[no-any-return]

    answer = force(first)
    waiterGot = tokenOf(s2.take())
    assert answer["released_token"] == first and answer["next_token"] == waiterGot
    assert force(second)["next_token"] is None  # nobody waited: s2's grant is older
    r1, r2 = named(node, "r1"), named(node, "r2")
    reader = tokenOf(r1.ask(b"A rw 30 0 r"))
    tokenOf(r2.ask(b"A rw 30 0 r"))
    assert force(reader, "rw")["next_token"] is None  # the other reader was there before
