"""
C <key>: a client withdraws its oldest waiting acquire of a key, bytes in
and bytes out through StringTransport, time through task.Clock.
"""

from __future__ import annotations

from typing import Optional

import pytest

from lockservice.core.election import HANDING_OFF, STANDBY
from tests.support.protocol import Node, token


@pytest.fixture
def node() -> Node:
    return Node()


def test_a_withdrawn_acquire_is_answered_T_before_C_OK(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    assert holder.ask(b"A k 30 0") == b"A k %s\n" % token(0)
    assert waiter.ask(b"A k 30 0") == b""
    # Both answers in one write, T first.
    assert waiter.ask(b"C k") == b"T k\nC k OK\n"
    assert node.service.table.queueLength(b"k") == 0
    assert node.service.stats.withdrawals == 1


def test_nothing_waiting_is_answered_NONE_and_changes_nothing(node: Node) -> None:
    conn = node.connect()
    assert conn.ask(b"C k") == b"C k NONE\n"
    assert conn.ask(b"A k 30 0") == b"A k %s\n" % token(0)
    # Granted, not waiting: NONE, and the grant stands.
    assert conn.ask(b"C k") == b"C k NONE\n"
    assert node.service.table.tokenOf(b"k") == int(token(0))
    assert node.service.stats.withdrawals == 0


def test_only_the_oldest_waiting_acquire_of_that_connection_and_key_leaves(node: Node) -> None:
    holder, conn, other = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    conn.ask(b"A k 30 0")
    other.ask(b"A k 30 0")
    conn.ask(b"A k 30 0")
    conn.ask(b"A j 30 0")  # another key: untouched
    assert conn.ask(b"C k") == b"T k\nC k OK\n"
    assert node.service.table.queueLength(b"k") == 2
    # The key goes to the others in FIFO order: other, then conn's second.
    holder.ask(b"R k %s" % token(0))
    assert other.take() == b"A k %s\n" % token(2)
    other.ask(b"R k %s" % token(2))
    assert conn.take() == b"A k %s\n" % token(3)


def test_the_waiters_behind_move_up_and_readers_that_now_fit_are_granted(node: Node) -> None:
    reader, writer, behind = node.connect(), node.connect(), node.connect()
    assert reader.ask(b"A k 30 0 r") == b"A k %s\n" % token(0)
    assert writer.ask(b"A k 30 0") == b""         # a writer waits for the reader
    assert behind.ask(b"A k 30 0 r") == b""       # a reader waits behind the writer
    assert writer.ask(b"C k") == b"T k\nC k OK\n"
    node.clock.advance(0)
    assert behind.take() == b"A k %s\n" % token(1)


def test_a_withdrawn_acquire_never_times_out_later(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    waiter.ask(b"A k 30 5")
    assert waiter.ask(b"C k") == b"T k\nC k OK\n"
    node.clock.advance(6)
    assert waiter.take() == b""
    assert node.service.stats.timeouts == 0


def test_a_grant_that_crossed_the_withdrawal_arrives_before_NONE(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    waiter.ask(b"A k 30 0")
    # The release and the withdrawal cross: the grant was made first.
    holder.ask(b"R k %s" % token(0))
    assert waiter.ask(b"C k") == b"A k %s\nC k NONE\n" % token(1)


def test_NONE_waits_behind_a_grant_held_for_replication(node: Node) -> None:
    """
    Under acknowledged replication the grant's answer waits for the
    standbys; C k NONE, which says the grant came first, waits behind it.
    """
    acked = [False]
    node.service.beforeAnswerHooks.append(lambda: acked[0])
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    acked[0] = True
    node.clock.advance(0.01)
    holder.take()
    waiter.ask(b"A k 30 0")
    acked[0] = False
    holder.ask(b"R k %s" % token(0))
    assert waiter.ask(b"C k") == b""  # both held
    acked[0] = True
    node.clock.advance(0.01)
    assert waiter.take() == b"A k %s\nC k NONE\n" % token(1)


def test_a_standby_redirects(node: Node) -> None:
    node.service.setRole(STANDBY, b"10.0.0.1:7700")
    assert node.connect().ask(b"C k") == b"M C k 10.0.0.1:7700\n"


def test_a_node_handing_off_still_withdraws_the_waiters_it_has(node: Node) -> None:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    waiter.ask(b"A k 30 0")
    node.service.setRole(HANDING_OFF, None)
    assert waiter.ask(b"C k") == b"T k\nC k OK\n"
    assert waiter.ask(b"C k") == b"C k NONE\n"
    # A new acquire is redirected meanwhile.
    assert waiter.ask(b"A k 30 0") == b"M A k *\n"


@pytest.mark.parametrize("line, answer", [
    (b"C", b"E C * expected: C <key>\n"),
    (b"C k extra", b"E C k expected: C <key>\n"),
    (b"C  k", b"E C * fields must be separated by exactly one space\n"),
    (b"C " + b"x" * 251, b"E C * bad key: 1-250 bytes of UTF-8, no spaces or control characters\n"),
    (b"C k\x01", b"E C * bad key: 1-250 bytes of UTF-8, no spaces or control characters\n"),
])
def test_a_bad_withdrawal_is_answered_E(node: Node, line: bytes, answer: bytes) -> None:
    conn = node.connect()
    assert conn.ask(line) == answer
    assert conn.ask(b"P x") == b"P x\n"  # still usable


def test_2000_abandoned_acquires_leave_the_queue_and_it_serves_normally(node: Node) -> None:
    """
    Acquires timed out by the client (2,000 of them) withdrawn with C:
    nothing is left queued, and another client's acquire queues and times
    out by its own wait instead of being refused.
    """
    node.service.maxWaiters = 2000
    holder, client, other = node.connect(), node.connect(), node.connect()
    holder.ask(b"A hot 30 0")
    for _ in range(2000):
        client.send(b"A hot 30 0\n")
    assert node.service.table.queueLength(b"hot") == 2000
    client.send(b"C hot\n" * 2000)
    answers = client.take()
    assert answers.count(b"T hot\nC hot OK\n") == 2000
    assert node.service.table.queueLength(b"hot") == 0
    assert other.ask(b"A hot 30 1") == b""
    node.clock.advance(1)
    assert other.take() == b"T hot\n"


def test_the_withdrawals_and_the_waiters_dropped_with_their_connection_are_counted(
        node: Node) -> None:
    from lockservice.server.metrics import Metrics

    metrics = Metrics(node.service)
    holder, a, b = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 0")
    a.ask(b"C k")
    b.close()
    node.clock.advance(0)
    text = metrics.render()
    assert b"lockservice_withdrawals_total 1.0" in text
    assert b"lockservice_waiters_dropped_total 1.0" in text


def crossing(node: Node, releaseFirst: bool) -> Optional[bytes]:
    holder, waiter = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    waiter.ask(b"A k 30 0")
    t = node.service.table.tokenOf(b"k")
    if releaseFirst:
        holder.send(b"R k %d\n" % t)
        waiter.send(b"C k\n")
    else:
        waiter.send(b"C k\n")
        holder.send(b"R k %d\n" % t)
    out = waiter.take()
    holder.take()
    for line in out.splitlines():
        if line.startswith(b"A k "):
            assert out.endswith(b"C k NONE\n")
            # The client releases what crossed: no lock leaks.
            waiter.ask(b"R k " + line.split()[2])
            return line
    assert out == b"T k\nC k OK\n"
    return None


@pytest.mark.parametrize("seed", range(50))
def test_no_lock_leaks_whichever_way_a_grant_and_a_withdrawal_cross(seed: int) -> None:
    node = Node()
    crossed = crossing(node, releaseFirst=bool(seed % 2))
    assert (crossed is not None) == bool(seed % 2)
    assert node.service.table.tokenOf(b"k") is None
    assert node.service.table.queueLength(b"k") == 0
