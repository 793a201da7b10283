"""
--lock-delay: an expired grant keeps its place in its key for a while, so
a holder that was only paused can notice it lost the lock before anyone
else starts.  Bytes in and out through StringTransport, time through
task.Clock.
"""

from __future__ import annotations

from typing import List

import pytest

from lockservice.core.election import ACTIVE, STANDBY
from tests.support.protocol import Node, token

DELAY = 5.0


@pytest.fixture
def node() -> Node:
    return Node(lockDelay=DELAY)


def test_an_expired_exclusive_grant_keeps_the_key_until_the_delay_ends(node: Node) -> None:
    holder, waiter, watcher = node.connect(), node.connect(), node.connect()
    holder.ask(b"I paused")
    assert holder.ask(b"A k 10 0") == b"A k %s\n" % token(0)
    assert waiter.ask(b"A k 10 0") == b""
    node.clock.advance(10)  # expired: its place stays taken
    assert waiter.take() == b""
    # The expired grant is over: STALE to R and N, not shown by O.
    assert holder.ask(b"R k %s" % token(0)) == b"R k STALE\n"
    assert holder.ask(b"N k %s 10" % token(0)) == b"N k STALE\n"
    assert watcher.ask(b"O k ? 0") == b"O k 0 -\n"
    assert node.connect().ask(b"A k 10 0") == b""  # queues behind the first
    node.clock.advance(DELAY - 0.01)
    assert waiter.take() == b""
    node.clock.advance(0.01)
    assert waiter.take() == b"A k %s\n" % token(1)  # FIFO service when it ends
    assert node.service.stats.expirations == 1


def test_the_key_lives_on_in_its_delay_and_counts_as_a_key() -> None:
    node = Node(lockDelay=DELAY, maxKeys=1)
    conn = node.connect()
    conn.ask(b"A k 1 0 r")
    node.clock.advance(1)
    assert len(node.service.table) == 1
    assert conn.ask(b"A other 1 0") == b"E A other too many keys\n"
    # Its kind is kept: a semaphore acquire does not match a read-write key.
    assert conn.ask(b"A k 1 0 3").startswith(b"E A k the share does not match")
    node.clock.advance(DELAY)
    assert len(node.service.table) == 0


def test_a_release_never_starts_a_delay(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 10 0")
    waiter.ask(b"A k 10 0")
    assert holder.ask(b"R k %s" % token(0)) == b"R k OK\n"
    assert waiter.take() == b"A k %s\n" % token(1)


def test_a_withdrawal_never_starts_a_delay(node: Node) -> None:
    holder, waiter, other = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 10 0")
    waiter.ask(b"A k 10 0")
    other.ask(b"A k 10 0")
    waiter.ask(b"C k")
    holder.ask(b"R k %s" % token(0))
    assert other.take() == b"A k %s\n" % token(1)


def test_a_waiter_s_own_wait_still_runs_during_a_delay(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 10 0")
    node.clock.advance(9)
    waiter.ask(b"A k 10 3")
    node.clock.advance(3)
    assert waiter.take() == b"T k\n"


def test_a_read_key_still_admits_readers_but_no_writer(node: Node) -> None:
    r1, r2, writer = node.connect(), node.connect(), node.connect()
    r1.ask(b"A k 10 0 r")
    node.clock.advance(10)  # r1 expired: its place stays
    assert r2.ask(b"A k 10 0 r") == b"A k %s\n" % token(1)
    assert writer.ask(b"A k 10 0") == b""
    r2.ask(b"R k %s" % token(1))
    assert writer.take() == b""  # the expired reader's place still
    node.clock.advance(DELAY)
    assert writer.take() == b"A k %s\n" % token(2)


def test_a_writer_waits_for_the_later_end_of_two_expired_readers(node: Node) -> None:
    r1, r2, writer = node.connect(), node.connect(), node.connect()
    r1.ask(b"A k 2 0 r")
    r2.ask(b"A k 4 0 r")
    writer.ask(b"A k 10 0")
    node.clock.advance(4)  # both expired, at 2 and at 4
    node.clock.advance(DELAY - 2)  # r1's place frees at 2 + DELAY
    assert writer.take() == b""
    node.clock.advance(2)  # r2's at 4 + DELAY
    assert writer.take() == b"A k %s\n" % token(2)


def test_a_semaphore_slot_stays_used(node: Node) -> None:
    a, b, c = node.connect(), node.connect(), node.connect()
    a.ask(b"A s 1 0 2")
    b.ask(b"A s 30 0 2")
    node.clock.advance(1)
    assert c.ask(b"A s 30 0 2") == b""
    node.clock.advance(DELAY)
    assert c.take() == b"A s %s\n" % token(2)


def test_observers_see_the_expiry_and_not_the_delay(node: Node) -> None:
    holder, watcher = node.connect(), node.connect()
    holder.ask(b"A k 10 0")
    watcher.ask(b"O k %s 0" % token(0))
    node.clock.advance(10)
    assert watcher.take() == b"O k 0 -\n"
    watcher.ask(b"O k 0 0")
    node.clock.advance(DELAY)  # the place frees: nothing an observer sees
    assert watcher.take() == b""


def test_a_force_release_ends_the_delays_of_the_key(node: Node) -> None:
    r1, r2, writer = node.connect(), node.connect(), node.connect()
    r1.ask(b"A k 1 0 r")
    r2.ask(b"A k 30 0 r")
    writer.ask(b"A k 30 0")
    node.clock.advance(1)
    answers: List[bytes] = []
    node.service.forceRelease(b"k", int(token(1)), answers.append)
    assert answers == [b"R k OK\n"]
    node.clock.advance(0)
    assert writer.take() == b"A k %s\n" % token(2)
    # A key only in its delay: a force-release by the place's token ends it.
    a, b = node.connect(), node.connect()
    a.ask(b"A j 1 0")
    b.ask(b"A j 30 0")
    node.clock.advance(1)
    answers.clear()
    node.service.forceRelease(b"j", int(token(3)), answers.append)
    assert answers == [b"R j OK\n"]
    assert b.take() == b"A j %s\n" % token(4)


def test_no_delay_by_default() -> None:
    node = Node()
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 10 0")
    waiter.ask(b"A k 10 0")
    node.clock.advance(10)
    assert waiter.take() == b"A k %s\n" % token(1)


def test_a_promoted_standby_keeps_a_replicated_delay(node: Node) -> None:
    """
    A standby learns the place with its remaining time (the peer line's
    d mark); promoted, it serves the key only when the delay ends.
    """
    node.service.setRole(STANDBY, b"a:1")
    node.service.mirror([(b"k", 9, 0.0, 3.0, 1, b"paused", True)])
    assert node.service.table.newest(b"k") == (0, None)
    node.service.setRole(ACTIVE, None)
    waiter = node.connect()
    assert waiter.ask(b"A k 10 0") == b""
    assert waiter.ask(b"R k 9") == b"R k STALE\n"
    node.clock.advance(3)
    assert waiter.take() == b"A k %s\n" % token(0)
