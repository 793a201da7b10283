"""
O <key> <token|?> <wait>: observers of a key, and the holder names they
are shown, bytes in and bytes out through StringTransport, time through
task.Clock.
"""

from __future__ import annotations

from typing import List

import pytest

from lockservice.core.election import HANDING_OFF, STANDBY
from lockservice.server.chores import CHUNK_BUDGET
from tests.support.protocol import Conn, Node, token


@pytest.fixture
def node() -> Node:
    return Node()


def woken(node: Node, conn: Conn) -> bytes:
    """
    What C{conn} is told once the reactor turn after a change has run
    (observers are woken then: see lockservice.server.observing).
    """
    node.clock.advance(0)
    return conn.take()


def oneTurn(node: Node) -> None:
    """
    One reactor turn: the calls due now, not those they schedule
    (task.Clock.advance would run those too).
    """
    clock = node.clock
    for call in [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]:
        clock.calls.remove(call)
        call.called = 1
        call.func(*call.args, **call.kw)


def named(node: Node, name: bytes) -> Conn:
    conn = node.connect()
    assert conn.ask(b"I " + name) == b"I " + name + b"\n"
    return conn


# -- answered at once -------------------------------------------------------------


def test_question_mark_answers_at_once_with_the_state(node: Node) -> None:
    watcher = node.connect()
    assert watcher.ask(b"O k ? 0") == b"O k 0 -\n"
    named(node, b"alice#1").ask(b"A k 30 0")
    assert watcher.ask(b"O k ? 5") == b"O k %s alice#1\n" % token(0)
    node.connect().ask(b"A j 30 0")  # never named itself: -
    assert watcher.ask(b"O j ? 0") == b"O j %s -\n" % token(1)


def test_a_token_that_is_not_the_newest_is_answered_at_once(node: Node) -> None:
    named(node, b"a").ask(b"A k 30 0")
    watcher = node.connect()
    assert watcher.ask(b"O k 0 5") == b"O k %s a\n" % token(0)
    assert watcher.ask(b"O k 12345 0") == b"O k %s a\n" % token(0)
    assert node.service.observing.count == 0  # answered at once: no place taken


# -- each change wakes -------------------------------------------------------------


def test_a_grant_wakes_an_observer_of_a_free_key(node: Node) -> None:
    watcher = node.connect()
    assert watcher.ask(b"O k 0 0") == b""
    named(node, b"bob").ask(b"A k 30 0")
    assert woken(node, watcher) == b"O k %s bob\n" % token(0)
    assert node.service.observing.count == 0


def test_a_release_an_expiry_and_a_hand_over_each_wake(node: Node) -> None:
    a, b = named(node, b"a"), named(node, b"b")
    watcher = node.connect()
    a.ask(b"A k 5 0")
    b.ask(b"A k 5 0")
    watcher.ask(b"O k %s 0" % token(0))
    a.ask(b"R k %s" % token(0))  # a hand-over: one change, to the new holder
    assert woken(node, watcher) == b"O k %s b\n" % token(1)
    watcher.ask(b"O k %s 0" % token(1))
    node.clock.advance(5)  # an expiry
    assert woken(node, watcher) == b"O k 0 -\n"
    a.ask(b"A k 5 0")
    watcher.ask(b"O k %s 0" % token(2))
    a.ask(b"R k %s" % token(2))  # a release
    assert woken(node, watcher) == b"O k 0 -\n"


def test_a_renewal_changes_nothing_an_observer_sees(node: Node) -> None:
    a = named(node, b"a")
    a.ask(b"A k 5 0")
    watcher = node.connect()
    assert watcher.ask(b"O k %s 0" % token(0)) == b""
    assert a.ask(b"N k %s 30" % token(0)) == b"N k OK\n"
    node.clock.advance(10)
    assert watcher.take() == b""


def test_when_the_wait_runs_out_the_unchanged_state_is_answered(node: Node) -> None:
    named(node, b"a").ask(b"A k 60 0")
    watcher = node.connect()
    assert watcher.ask(b"O k %s 2" % token(0)) == b""
    node.clock.advance(1.9)
    assert watcher.take() == b""
    node.clock.advance(0.1)
    assert woken(node, watcher) == b"O k %s a\n" % token(0)
    assert node.service.observing.count == 0
    assert watcher.ask(b"O k 0 2.5") == b"O k %s a\n" % token(0)


def test_wait_zero_waits_for_ever(node: Node) -> None:
    watcher = node.connect()
    watcher.ask(b"O k 0 0")
    node.clock.advance(86400 * 7)
    assert watcher.take() == b""
    node.connect().ask(b"A k 1 0")
    assert woken(node, watcher) == b"O k %s -\n" % token(0)


def test_on_a_shared_key_the_newest_token_can_fall(node: Node) -> None:
    r1, r2 = named(node, b"r1"), named(node, b"r2")
    r1.ask(b"A k 30 0 r")
    r2.ask(b"A k 30 0 r")
    watcher = node.connect()
    assert watcher.ask(b"O k ? 0") == b"O k %s r2\n" % token(1)
    watcher.ask(b"O k %s 0" % token(1))
    r1.ask(b"R k %s" % token(0))  # an older reader leaves: the newest stays
    assert watcher.take() == b""
    r1.ask(b"A k 30 0 r")
    assert woken(node, watcher) == b"O k %s r1\n" % token(2)
    watcher.ask(b"O k %s 0" % token(2))
    r1.ask(b"R k %s" % token(2))  # the newest reader leaves: it falls
    assert woken(node, watcher) == b"O k %s r2\n" % token(1)


def test_a_force_release_wakes_observers(node: Node) -> None:
    named(node, b"a").ask(b"A k 30 0")
    watcher = node.connect()
    watcher.ask(b"O k %s 0" % token(0))
    answers: List[bytes] = []
    node.service.forceRelease(b"k", int(token(0)), answers.append)
    assert answers == [b"R k OK\n"]
    assert woken(node, watcher) == b"O k 0 -\n"


def test_each_observer_gets_the_state_as_it_is_when_answered(node: Node) -> None:
    """
    Two changes in one turn: the observer hears the state after both.
    """
    a = named(node, b"a")
    watcher = node.connect()
    watcher.ask(b"O k 0 0")
    a.send(b"A k 30 0\nR k %s\nA k 30 0\n" % token(0))
    assert woken(node, watcher) == b"O k %s a\n" % token(1)


# -- limits and lifetimes ---------------------------------------------------------


def test_max_observers_counts_only_those_that_wait() -> None:
    node = Node(maxObservers=2)
    conns = [node.connect() for _ in range(4)]
    assert conns[0].ask(b"O k 0 0") == b""
    assert conns[1].ask(b"O k 0 0") == b""
    assert conns[2].ask(b"O k 0 0") == b"E O k too many observers\n"
    # Answered at once: takes no place, so it is not refused.
    assert conns[3].ask(b"O k ? 0") == b"O k 0 -\n"
    assert conns[3].ask(b"O other 0 0") == b""  # the limit is per key
    conns[0].close()
    node.clock.advance(0)
    assert conns[2].ask(b"O k 0 0") == b""


def test_observers_are_neither_waiters_nor_keys() -> None:
    node = Node(maxKeys=1, maxWaiters=1)
    watchers = [node.connect() for _ in range(5)]
    for w in watchers:
        w.ask(b"O free 0 0")
        w.ask(b"O k 0 0")
    holder = node.connect()
    assert holder.ask(b"A k 30 0") == b"A k %s\n" % token(0)  # the one key
    assert node.connect().ask(b"A k 30 0") == b""  # the one waiter
    assert node.service.table.waiterCount == 1 and len(node.service.table) == 1


def test_an_observer_is_dropped_with_its_connection(node: Node) -> None:
    watcher = node.connect()
    watcher.ask(b"O k 0 30")
    watcher.close()
    node.clock.advance(0)
    assert node.service.observing.count == 0
    node.connect().ask(b"A k 30 0")  # nothing to answer, nothing breaks
    node.clock.advance(31)


def test_equal_O_requests_on_one_connection_are_answered_in_send_order(node: Node) -> None:
    watcher = node.connect()
    # The second would be answered at once, but waits behind the first.
    assert watcher.ask(b"O k 0 5") == b""
    assert watcher.ask(b"O k ? 0") == b""
    node.connect().ask(b"A k 30 0")
    assert woken(node, watcher) == b"O k %s -\nO k %s -\n" % (token(0), token(0))


def test_a_standby_redirects_and_a_demotion_redirects_waiting_observers(node: Node) -> None:
    watcher = node.connect()
    watcher.ask(b"O k 0 0")
    node.service.setRole(HANDING_OFF, None)
    assert watcher.ask(b"O j ? 0") == b"M O j *\n"
    node.service.setRole(STANDBY, b"b:7700")
    node.clock.advance(0)
    assert watcher.take() == b"M O k b:7700\n"
    assert watcher.ask(b"O k ? 0") == b"M O k b:7700\n"
    assert node.service.observing.count == 0


@pytest.mark.parametrize("line, answer", [
    (b"O k", b"E O k expected: O <key> <token|?> <wait>\n"),
    (b"O k ? 0 1", b"E O k expected: O <key> <token|?> <wait>\n"),
    (b"O k x 0", b"E O k bad token: decimal digits, at most 2^64-1\n"),
    (b"O k 18446744073709551616 0", b"E O k bad token: decimal digits, at most 2^64-1\n"),
    (b"O k ? -1", b"E O k bad wait: seconds, 0 <= wait <= 86400, digits only\n"),
    (b"O k ? 1e3", b"E O k bad wait: seconds, 0 <= wait <= 86400, digits only\n"),
    (b"O k ? 86400.5", b"E O k bad wait: seconds, 0 <= wait <= 86400, digits only\n"),
    (b"O k ?? 0", b"E O k bad token: decimal digits, at most 2^64-1\n"),
])
def test_a_bad_observe_is_answered_E(node: Node, line: bytes, answer: bytes) -> None:
    conn = node.connect()
    assert conn.ask(line) == answer
    assert conn.ask(b"P x") == b"P x\n"


def test_edge_values_of_observe_are_valid(node: Node) -> None:
    conn = node.connect()
    assert conn.ask(b"O k 18446744073709551615 86400") == b"O k 0 -\n"
    assert conn.ask(b"O k 000 0.5") == b""  # 0, the key's state: waits


# -- waking many is bounded work per turn -------------------------------------------


def test_waking_many_observers_is_a_bounded_chunk_per_reactor_turn(node: Node) -> None:
    watchers = [node.connect() for _ in range(3 * CHUNK_BUDGET)]
    for w in watchers:
        w.ask(b"O k 0 0")
    node.connect().ask(b"A k 30 0")
    assert not any(w.transport.value() for w in watchers)  # the next turn
    turns = 0
    while node.service.observing.count:
        before = node.service.observing.count
        oneTurn(node)
        turns += 1
        assert before - node.service.observing.count <= CHUNK_BUDGET
    assert turns >= 3
    assert all(w.take() == b"O k %s -\n" % token(0) for w in watchers)
    assert node.service.observing.count == 0


def test_an_answer_that_reports_a_grant_waits_for_that_grant_s_replication(
        node: Node) -> None:
    acked = [True]
    node.service.beforeAnswerHooks.append(lambda: acked[0])
    watcher, holder = node.connect(), node.connect()
    watcher.ask(b"O k 0 0")
    acked[0] = False
    holder.ask(b"A k 30 0")
    node.clock.advance(0.01)
    assert holder.take() == b"" and watcher.take() == b""
    assert node.connect().ask(b"O k ? 0") == b""  # at once, but after the grant
    acked[0] = True
    node.clock.advance(0.01)
    assert holder.take() == b"A k %s\n" % token(0)
    assert woken(node, watcher) == b"O k %s -\n" % token(0)


# -- holder names ------------------------------------------------------------------


def test_a_grant_keeps_the_name_its_connection_had_when_it_was_made(node: Node) -> None:
    conn = named(node, b"first#1")
    conn.ask(b"A k 30 0")
    conn.ask(b"I second#1")
    conn.ask(b"A j 30 0")
    watcher = node.connect()
    assert watcher.ask(b"O k ? 0") == b"O k %s first#1\n" % token(0)
    assert watcher.ask(b"O j ? 0") == b"O j %s second#1\n" % token(1)
    conn.close()
    node.clock.advance(0)
    assert watcher.ask(b"O k ? 0") == b"O k %s first#1\n" % token(0)


def test_a_waiter_is_granted_under_the_name_its_connection_has_at_the_grant(
        node: Node) -> None:
    holder, waiter = node.connect(), named(node, b"before")
    holder.ask(b"A k 30 0")
    waiter.ask(b"A k 30 0")
    waiter.ask(b"I after")
    holder.ask(b"R k %s" % token(0))
    assert node.connect().ask(b"O k ? 0") == b"O k %s after\n" % token(1)


def test_I_dash_is_refused_and_leaves_the_name_as_it_was(node: Node) -> None:
    conn = named(node, b"me")
    assert conn.ask(b"I -") == b"E I - bad name: - stands for an unnamed connection\n"
    conn.ask(b"A k 30 0")
    assert conn.ask(b"O k ? 0") == b"O k %s me\n" % token(0)
