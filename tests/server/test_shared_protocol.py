"""
Shared keys through the client protocol, exact bytes (SPEC section 2,
"Shared keys", and the C{<share>} row of section 3): StringTransport and a
task.Clock, no sockets.
"""

from __future__ import annotations

from typing import List

from lockservice.server.chores import CHUNK_BUDGET
from tests.support.protocol import Node, token


def test_readers_share_a_writer_waits_and_a_late_reader_does_not_overtake_it() -> None:
    node = Node()
    r1, r2, w, r3 = (node.connect() for _ in range(4))
    assert r1.ask(b"A k 30 0 r") == b"A k " + token(0) + b"\n"
    assert r2.ask(b"A k 30 0 r") == b"A k " + token(1) + b"\n"
    assert w.ask(b"A k 30 0") == b""
    assert r3.ask(b"A k 30 0 r") == b""
    assert r1.ask(b"R k " + token(0)) == b"R k OK\n"
    assert w.take() == b""
    assert r2.ask(b"R k " + token(1)) == b"R k OK\n"
    assert w.take() == b"A k " + token(2) + b"\n"
    assert r3.take() == b""
    assert w.ask(b"R k " + token(2)) == b"R k OK\n"
    assert r3.take() == b"A k " + token(3) + b"\n"


def test_a_semaphore_holds_n_and_1_is_exclusive() -> None:
    node = Node()
    a, b, c = (node.connect() for _ in range(3))
    assert a.ask(b"A s 30 0 2") == b"A s " + token(0) + b"\n"
    assert b.ask(b"A s 30 0 2") == b"A s " + token(1) + b"\n"
    assert c.ask(b"A s 30 0 2") == b""
    assert b.ask(b"R s " + token(1)) == b"R s OK\n"
    assert c.take() == b"A s " + token(2) + b"\n"
    # "1" is the same as no fifth field: an exclusive lock.
    assert a.ask(b"A x 30 0 1") == b"A x " + token(3) + b"\n"
    assert b.ask(b"A x 30 0") == b""


def test_a_mismatched_share_is_answered_E_and_the_connection_stays_usable() -> None:
    node = Node()
    a, b = node.connect(), node.connect()
    assert a.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    assert b.ask(b"A k 30 0 3") == b"E A k the share does not match the key: it is read-write\n"
    assert b.ask(b"A s 30 0 4") == b"A s " + token(1) + b"\n"
    refused = b"E A s the share does not match the key: it is a semaphore of 4 slots\n"
    assert a.ask(b"A s 30 0 r") == refused
    assert a.ask(b"A s 30 0 5") == refused
    assert a.ask(b"A s 30 0") == refused
    assert a.ask(b"P alive") == b"P alive\n"
    # Once the key is gone, the next acquire sets its kind afresh.
    assert b.ask(b"R s " + token(1)) == b"R s OK\n"
    assert a.ask(b"A s 30 0 r") == b"A s " + token(2) + b"\n"


def test_bad_shares_are_answered_E_and_change_nothing() -> None:
    node = Node()
    c = node.connect()
    for line in (b"A k 30 0 0", b"A k 30 0 65536", b"A k 30 0 x", b"A k 30 0 +2",
                 b"A k 30 0 01"):
        assert c.ask(line) == (b"E A k bad share: r, or slots 1-65535 (digits, no leading "
                               b"zero)\n")
    assert c.ask(b"A k 30 0 r 1") == b"E A k expected: A <key> <lease> <wait> [<share>]\n"
    assert node.service.table.kindOf(b"k") is None
    assert c.ask(b"A k 30 0 65535") == b"A k " + token(0) + b"\n"


def test_each_reader_expires_and_renews_by_its_own_token() -> None:
    node = Node()
    a, b, w = node.connect(), node.connect(), node.connect()
    assert a.ask(b"A k 10 0 r") == b"A k " + token(0) + b"\n"
    assert b.ask(b"A k 20 0 r") == b"A k " + token(1) + b"\n"
    assert w.ask(b"A k 30 0") == b""
    node.clock.advance(5)
    assert b.ask(b"N k " + token(1) + b" 30") == b"N k OK\n"
    assert a.ask(b"N k 12345 30") == b"N k STALE\n"
    node.clock.advance(5)  # a's lease ran out; b holds until 35
    assert w.take() == b""
    assert a.ask(b"R k " + token(0)) == b"R k STALE\n"
    node.clock.advance(24.9)
    assert w.take() == b""
    node.clock.advance(0.2)
    assert w.take() == b"A k " + token(2) + b"\n"


def test_a_closed_writers_connection_lets_the_readers_behind_it_in() -> None:
    node = Node()
    r1, w, r2 = node.connect(), node.connect(), node.connect()
    assert r1.ask(b"A k 30 0 r") == b"A k " + token(0) + b"\n"
    assert w.ask(b"A k 30 0") == b""
    assert r2.ask(b"A k 30 0 r") == b""
    w.close()
    node.clock.advance(0)
    assert r2.take() == b"A k " + token(1) + b"\n"


def test_a_waiting_writer_that_times_out_lets_the_readers_behind_it_in() -> None:
    node = Node()
    r1, w, r2 = node.connect(), node.connect(), node.connect()
    assert r1.ask(b"A k 30 0 r") == b"A k " + token(0) + b"\n"
    assert w.ask(b"A k 30 1") == b""
    assert r2.ask(b"A k 30 0 r") == b""
    node.clock.advance(1)
    assert w.take() == b"T k\n"
    assert r2.take() == b"A k " + token(1) + b"\n"


def test_limits_count_a_shared_key_once() -> None:
    node = Node(maxKeys=1, maxWaiters=1)
    a, b, c, d = (node.connect() for _ in range(4))
    assert a.ask(b"A k 30 0 r") == b"A k " + token(0) + b"\n"
    assert b.ask(b"A k 30 0 r") == b"A k " + token(1) + b"\n"
    assert c.ask(b"A j 30 0 r") == b"E A j too many keys\n"
    assert c.ask(b"A k 30 0") == b""
    assert d.ask(b"A k 30 0 r") == b"E A k too many waiters\n"


def test_a_long_run_of_readers_is_granted_in_chunks_in_fifo_order() -> None:
    node = Node()
    w = node.connect()
    assert w.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    readers = [node.connect() for _ in range(3 * CHUNK_BUDGET + 10)]
    for r in readers:
        assert r.ask(b"A k 30 0 r") == b""
    other = node.connect()
    assert w.ask(b"R k " + token(0)) == b"R k OK\n"
    answered: List[int] = [i for i, r in enumerate(readers) if r.transport.value()]
    # One turn lets in at most a chore budget (plus the first, at once).
    assert 0 < len(answered) <= CHUNK_BUDGET + 1
    # Meanwhile others are served, and a new reader queues behind the run.
    assert other.ask(b"P alive") == b"P alive\n"
    assert other.ask(b"A k 30 0 r") == b""
    # Run the reactor's delayed calls one at a time (Clock.advance(0) would
    # run the calls they schedule too, in one go): each lets in a chunk.
    steps: List[int] = [len(answered)]
    while not other.transport.value():
        call = min(node.clock.getDelayedCalls(), key=lambda c: c.getTime())
        node.clock.calls.remove(call)
        call.func(*call.args, **call.kw)
        steps.append(sum(1 for r in readers if r.transport.value()))
        assert len(steps) < 100
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= CHUNK_BUDGET
    assert len([1 for a, b in zip(steps, steps[1:], strict=False) if b > a]) >= 3
    got = [int(r.take().split()[2]) for r in readers]
    assert got == sorted(got) and len(set(got)) == len(got)  # FIFO, a token each
    assert int(other.take().split()[2]) > got[-1]
    assert node.service.table.holderCount(b"k") == len(readers) + 1
