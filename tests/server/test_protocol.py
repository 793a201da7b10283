"""
The client line protocol, bytes in and bytes out, through StringTransport
with a task.Clock driving leases and waits.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import pytest

from lockservice.core.election import STANDBY
from tests.support.protocol import T0, Node, token


@pytest.fixture
def node() -> Node:
    return Node()



def test_grant_release_and_stale(node: Node) -> None:
    c = node.connect()
    assert c.ask(b"A orders/42 30 5") == b"A orders/42 " + token(0) + b"\n"
    assert c.ask(b"R orders/42 " + token(0)) == b"R orders/42 OK\n"
    assert c.ask(b"R orders/42 " + token(0)) == b"R orders/42 STALE\n"
    assert c.ask(b"R orders/42 0") == b"R orders/42 STALE\n"
    assert c.ask(b"R never-held 007") == b"R never-held STALE\n"


def test_ping(node: Node) -> None:
    assert node.connect().ask(b"P hello") == b"P hello\n"


def test_crlf_accepted_and_empty_lines_ignored(node: Node) -> None:
    c = node.connect()
    c.send(b"\n\r\nP x\r\n\n")
    assert c.take() == b"P x\n"


def test_fifo_handover_on_release_with_new_token(node: Node) -> None:
    a, b, c = node.connect(), node.connect(), node.connect()
    assert a.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    assert b.ask(b"A k 30 0") == b""
    assert c.ask(b"A k 30 0") == b""
    node.wall.micros += 5
    assert a.ask(b"R k " + token(0)) == b"R k OK\n"
    assert b.take() == b"A k " + token(5) + b"\n"
    assert c.take() == b""
    assert b.ask(b"R k " + token(5)) == b"R k OK\n"
    assert c.take() == b"A k " + token(6) + b"\n"


def test_a_hand_over_sends_the_new_holders_grant_before_the_releasers_answer(
        node: Node) -> None:
    """
    Issue 20: the grant is what the next request of a contended key waits
    for (its holder releases, the next waiter is granted, ...), so it goes
    to the socket first; the releaser's "R ... OK" follows in the same
    turn.  Sent the other way round, every hand-off waited one more send:
    17% fewer contended hand-offs per second.
    """
    a, b = node.connect(), node.connect()
    assert a.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    assert b.ask(b"A k 30 0") == b""
    sent: List[bytes] = []
    for conn in (a, b):
        conn.transport.write = sent.append  # type: ignore[method-assign]
    a.send(b"R k " + token(0) + b"\n")
    assert sent == [b"A k " + token(1) + b"\n", b"R k OK\n"]


def test_lease_expiry_hands_to_next_waiter(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 2.5 0")
    b.ask(b"A k 10 0")
    node.clock.advance(2.4)
    assert b.take() == b""
    node.clock.advance(0.1)
    assert b.take() == b"A k " + token(1) + b"\n"
    assert a.ask(b"R k " + token(0)) == b"R k STALE\n"
    # The new holder's lease runs from its grant.
    node.clock.advance(9.9)
    assert a.ask(b"A k 1 0") == b""
    node.clock.advance(0.1)
    assert a.take() == b"A k " + token(2) + b"\n"


def test_expired_lease_frees_key(node: Node) -> None:
    a = node.connect()
    a.ask(b"A k 1 0")
    node.clock.advance(1)
    assert node.service.table.holder(b"k") is None
    assert a.ask(b"A k 1 0") == b"A k " + token(1) + b"\n"


def test_wait_timeout_answers_T_and_leaves_queue(node: Node) -> None:
    a, b, c = node.connect(), node.connect(), node.connect()
    a.ask(b"A k 30 0")
    assert b.ask(b"A k 30 1.5") == b""
    c.ask(b"A k 30 0")
    node.clock.advance(1.5)
    assert b.take() == b"T k\n"
    assert a.ask(b"R k " + token(0)) == b"R k OK\n"
    assert b.take() == b""
    assert c.take() == b"A k " + token(1) + b"\n"


def test_wait_zero_waits_forever(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 100000 0")
    b.ask(b"A k 5 0")
    node.clock.advance(99999)
    assert b.take() == b""


def test_waiter_dropped_when_its_connection_closes(node: Node) -> None:
    a, b, c = node.connect(), node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 5")
    c.ask(b"A k 30 0")
    b.close()
    assert node.service.table.queueLength(b"k") == 1
    a.ask(b"R k " + token(0))
    assert c.take() == b"A k " + token(1) + b"\n"
    # b's wait timer went with it: its expiry changes nothing.
    node.clock.advance(5)
    assert node.service.stats.timeouts == 0


def test_held_lock_outlives_holder_disconnect_until_lease(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 3 0")
    a.close()
    assert b.ask(b"A k 3 0") == b""
    node.clock.advance(2.9)
    assert b.take() == b""
    node.clock.advance(0.1)
    assert b.take() == b"A k " + token(1) + b"\n"


def test_not_reentrant_on_same_connection(node: Node) -> None:
    a = node.connect()
    assert a.ask(b"A k 30 0") == b"A k " + token(0) + b"\n"
    assert a.ask(b"A k 30 0") == b""
    assert a.ask(b"R k " + token(0)) == b"R k OK\nA k " + token(1) + b"\n"


def test_pipelined_requests_answered_with_echo(node: Node) -> None:
    a = node.connect()
    a.send(b"A x 30 0\nA y 30 0\nP w\nR x " + token(0) + b"\nR y 1\n")
    assert a.take() == (
        b"A x " + token(0) + b"\nA y " + token(1) + b"\nP w\nR x OK\nR y STALE\n"
    )


def test_equal_pairs_answered_in_send_order_even_when_later_times_out_first(
    node: Node,
) -> None:
    holder, a = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    a.send(b"A k 30 10\nA k 30 1\n")
    node.clock.advance(1)
    # The second request timed out but the first is still waiting: held back.
    assert a.take() == b""
    assert node.service.table.queueLength(b"k") == 1
    holder.ask(b"R k " + token(0))
    assert a.take() == b"A k " + token(1) + b"\nT k\n"


@pytest.mark.parametrize("bad", [b"A k 30 0 x", b"A k 30 0 0", b"A k 30 0 2 5", b"A k 0 0",
                                 b"A k 30 x", b"A k 99999999 0"])
def test_a_malformed_acquire_is_answered_after_an_earlier_acquire_of_its_key(
    node: Node, bad: bytes,
) -> None:
    """
    Found from outside: `E A k ...` for a malformed acquire overtook the
    same connection's earlier, queued `A k` (SPEC section 3: equal (op,
    key) are answered in send order), so a client pairing answers by
    (op, key) took the E for its first acquire.  Other keys and other ops
    are not held back.
    """
    holder, a = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    a.send(b"A k 30 0\n" + bad + b"\nA j 30 0 x\nR k 1\n")
    answers = a.take().split(b"\n")
    assert answers[0].startswith(b"E A j ") and answers[1] == b"R k STALE"
    assert len(answers) == 3 and node.service.table.queueLength(b"k") == 1
    holder.ask(b"R k " + token(0))
    granted, refused, rest = a.take().split(b"\n", 2)
    assert granted == b"A k " + token(1) and refused.startswith(b"E A k ") and rest == b""
    assert a.ask(b"P still") == b"P still\n"


def test_timers_follow_the_monotonic_clock_not_the_wall_clock(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 10 0")
    b.ask(b"A k 10 0")
    node.wall.micros += 3600 * 10**6  # wall clock jumps an hour ahead
    node.clock.advance(9)
    assert b.take() == b""
    node.wall.micros -= 7200 * 10**6  # and two hours back
    node.clock.advance(1)
    assert b.take() == b"A k " + token(1) + b"\n"


def test_token_stays_above_clock_after_wall_steps_back(node: Node) -> None:
    a = node.connect()
    a.ask(b"A a 10 0")
    node.wall.micros -= 10**9
    assert a.ask(b"A b 10 0") == b"A b " + token(1) + b"\n"


def test_stop_service_cancels_every_timer(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 10 0")
    b.ask(b"A k 10 5")
    node.service.startService()
    node.service.stopService()
    assert node.clock.getDelayedCalls() == []


def test_standby_redirects(node: Node) -> None:
    c = node.connect()
    node.service.setRole(STANDBY, b"127.0.0.1:7702")
    assert c.ask(b"A k 30 0") == b"M A k 127.0.0.1:7702\n"
    assert c.ask(b"R k 5") == b"M R k 127.0.0.1:7702\n"
    assert c.ask(b"P k") == b"P k\n"
    assert c.ask(b"A k x 0") == b"E A k bad lease: seconds, 0 < lease <= 86400, digits only\n"
    node.service.setRole(STANDBY, None)
    assert c.ask(b"A k 30 0") == b"M A k *\n"


def test_demotion_redirects_queued_waiters(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 9")
    node.service.setRole(STANDBY, b"h:1")
    assert b.take() == b"M A k h:1\n"
    assert node.clock.getDelayedCalls() == []


# -- bad input --------------------------------------------------------------

LONG_KEY = b"k" * 250
BAD_REQUESTS: List[bytes] = [
    b"X k 1 1",
    b"a k 1 1",
    b"A",
    b"A k",
    b"A k 30",
    b"A k 30 0 extra",
    b" A k 30 0",
    b"A k 30 0 ",
    b"A  k 30 0",
    b"A k  30 0",
    b"A k 0 0",
    b"A k 0.0 0",
    b"A k -1 0",
    b"A k +5 0",
    b"A k 1e3 0",
    b"A k 1_0 0",
    b"A k inf 0",
    b"A k nan 0",
    b"A k .5 0",
    b"A k 5. 0",
    "A k \uff15 0".encode(),
    b"A k 86400.001 0",
    b"A k 86401 0",
    b"A k 30 86400.0000001",
    b"A k 30 -0",
    b"A k 30 x",
    b"A " + b"k" * 251 + b" 30 0",
    b"A k\x01 30 0",
    b"A k\x7f 30 0",
    "A k\u0085 30 0".encode(),
    b"A \xff\xfe 30 0",
    b"A \xed\xa0\x80 30 0",
    b"A k\t 30 0",
    b"R k",
    b"R k x",
    b"R k -1",
    b"R k 18446744073709551616",
    b"R k 1.0",
    b"R k 1 2",
    b"P",
    b"P a b",
    b"P \x01",
    b"HELLO 1 a:1 n",
]


@pytest.mark.parametrize("line", BAD_REQUESTS)
def test_bad_request_answered_E_and_connection_stays_usable(node: Node, line: bytes) -> None:
    c = node.connect()
    answer = c.ask(line)
    assert answer.startswith(b"E ") and answer.endswith(b"\n")
    assert answer.count(b"\n") == 1
    assert not c.transport.disconnecting
    assert c.ask(b"P alive") == b"P alive\n"
    assert node.service.table.holder(b"k") is None


@pytest.mark.parametrize(
    "line, echo",
    [
        (b"X k 1 1", b"E * k "),
        (b"A", b"E A * "),
        (b"A k 30", b"E A k "),
        (b"A k\x01 30 0", b"E A * "),
        (b"R k x", b"E R k "),
        (b"P", b"E P * "),
        (b"A \xff 30 0", b"E A * "),
        (b"Z \xff", b"E * * "),
    ],
)
def test_bad_request_echoes_op_and_key_or_star(node: Node, line: bytes, echo: bytes) -> None:
    assert node.connect().ask(line).startswith(echo)


def test_exact_error_message_for_wrong_arity(node: Node) -> None:
    assert node.connect().ask(b"A k 30") == b"E A k expected: A <key> <lease> <wait> [<share>]\n"


@pytest.mark.parametrize(
    "line, answer",
    [
        (b"A " + LONG_KEY + b" 86400 86400", b"A " + LONG_KEY + b" " + token(0) + b"\n"),
        (b"A k 0.000001 0", b"A k " + token(0) + b"\n"),
        (b"A k 86400.000 0", b"A k " + token(0) + b"\n"),
        (b"A \xc3\xa9t\xc3\xa9 1 0", "A \u00e9t\u00e9 ".encode() + token(0) + b"\n"),
        (b"R k 18446744073709551615", b"R k STALE\n"),
        (b"R k 0000000000000000000000000000018446744073709551615", b"R k STALE\n"),
        (b"P " + LONG_KEY, b"P " + LONG_KEY + b"\n"),
    ],
)
def test_edge_values_are_valid(node: Node, line: bytes, answer: bytes) -> None:
    assert node.connect().ask(line) == answer


def test_limits_follow_max_lease_and_max_wait() -> None:
    node = Node(maxLease=60, maxWait=10)
    c = node.connect()
    assert c.ask(b"A k 61 0").startswith(b"E A k bad lease")
    assert c.ask(b"A k 30 11").startswith(b"E A k bad wait")
    assert c.ask(b"A k 60 10") == b"A k " + token(0) + b"\n"


def test_line_too_long_closes_connection(node: Node) -> None:
    c = node.connect()
    c.send(b"P " + b"x" * 4095 + b"\n")
    assert c.take() == b"E * * line too long\n"
    assert c.transport.disconnecting


def test_line_of_exactly_4096_bytes_is_read(node: Node) -> None:
    c = node.connect()
    c.send(b"P " + b"x" * 4094 + b"\r\n")
    assert c.take().startswith(b"E P * bad word")
    assert not c.transport.disconnecting


def test_4097_bytes_without_newline_closes_at_once(node: Node) -> None:
    c = node.connect()
    c.send(b"x" * 4096)
    assert c.take() == b""
    c.send(b"x")
    assert c.take() == b"E * * line too long\n"
    assert c.transport.disconnecting


def test_waiting_request_dropped_when_line_too_long_closes(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.send(b"A k 30 0\n" + b"x" * 5000)
    assert b.take() == b"E * * line too long\n"
    b.close()
    assert node.service.table.queueLength(b"k") == 0


def test_promoted_standby_runs_replicated_leases_from_remaining_time(node: Node) -> None:
    c = node.connect()
    node.service.setRole(STANDBY, b"h:1")
    node.service.table.install(b"short", 500, 0.0, 2.0)
    node.service.table.install(b"long", 501, 0.0, 10.0)
    node.clock.advance(1)
    assert node.clock.getDelayedCalls() == []  # a standby runs no lease timers
    node.service.setRole("active", None)
    assert c.ask(b"A short 5 0") == b""
    node.clock.advance(1)
    assert c.take() == b"A short " + token(0) + b"\n"
    assert c.ask(b"R long 501") == b"R long OK\n"


def test_released_leases_do_not_pile_up(node: Node) -> None:
    """
    Released grants leave nothing behind: the memory held after 20,000
    more acquire/release pairs does not grow with their number.
    """
    import tracemalloc

    c = node.connect()

    def cycles(n: int) -> None:
        for _ in range(n):
            answer = c.ask(b"A k 30 0")
            c.ask(b"R k " + answer.split()[2])

    cycles(20000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cycles(20000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # One leftover timer entry per pair would be about 2.5 MB.
    assert grown < 1_000_000


def test_end_of_input_withdraws_queued_acquires_at_once(node: Node) -> None:
    holder, c, d = node.connect(), node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    c.send(b"A k 30 0\nA other 30 0\nP x\n")
    assert c.take() == b"A other " + token(1) + b"\nP x\n"
    d.send(b"A k 30 0\n")
    c.proto.readConnectionLost()  # a FIN (close, exit, or shutdown(SHUT_WR))
    assert c.transport.disconnecting
    assert node.service.table.queueLength(b"k") == 1
    holder.ask(b"R k " + token(0))
    assert d.take() == b"A k " + token(2) + b"\n"
    assert c.take() == b""


def test_end_of_input_still_writes_decided_answers(node: Node) -> None:
    holder, c = node.connect(), node.connect()
    holder.ask(b"A k 30 0")
    # The second request's timeout is decided but held back behind the first.
    c.send(b"A k 30 0\nA k 30 1\n")
    node.clock.advance(1)
    assert c.take() == b""
    c.proto.readConnectionLost()
    assert c.take() == b"T k\n"
    assert c.transport.disconnecting
    assert node.service.table.queueLength(b"k") == 0


def test_half_closed_client_with_nothing_queued_is_closed(node: Node) -> None:
    c = node.connect()
    assert c.ask(b"P x") == b"P x\n"
    c.proto.readConnectionLost()
    assert c.transport.disconnecting


# -- renew and identify -----------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: List[tuple] = []

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes] = None) -> None:
        self.events.append(("granted", key, token, grantedAt, expiresAt))

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        self.events.append(("renewed", key, token, grantedAt, expiresAt))

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        self.events.append(("dropped", key, token, heldFor, expired))


def test_renew_extends_the_lease_from_now_and_keeps_the_token(node: Node) -> None:
    recorder = Recorder()
    node.service.observers.append(recorder)
    a, b = node.connect(), node.connect()
    a.ask(b"A k 10 0")
    b.ask(b"A k 10 0")
    node.clock.advance(8)
    assert a.ask(b"N k " + token(0) + b" 5") == b"N k OK\n"
    assert recorder.events[-1] == ("renewed", b"k", T0, 0.0, 13.0)
    node.clock.advance(4.9)
    assert b.take() == b""
    assert node.service.table.holder(b"k").renewals == 1  # type: ignore[union-attr]
    node.clock.advance(0.1)
    assert b.take() == b"A k " + token(1) + b"\n"
    # The old token no longer holds the key: nothing changes.
    assert a.ask(b"N k " + token(0) + b" 5") == b"N k STALE\n"
    assert a.ask(b"N free 1 5") == b"N free STALE\n"
    assert node.service.stats.renewalsStale == 2


def test_renew_can_shorten_a_lease(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 100 0")
    b.ask(b"A k 10 0")
    assert a.ask(b"N k " + token(0) + b" 1") == b"N k OK\n"
    node.clock.advance(1)
    assert b.take() == b"A k " + token(1) + b"\n"


def test_renew_on_a_standby_redirects(node: Node) -> None:
    c = node.connect()
    node.service.setRole(STANDBY, b"10.0.0.1:7701")
    assert c.ask(b"N k 5 30") == b"M N k 10.0.0.1:7701\n"


@pytest.mark.parametrize(
    "line, answer",
    [
        (b"N k 5", b"E N k expected: N <key> <token> <lease>\n"),
        (b"N k 5 30 1", b"E N k expected: N <key> <token> <lease>\n"),
        (b"N k x 30", b"E N k bad token: decimal digits, at most 2^64-1\n"),
        (b"N k 5 0", b"E N k bad lease: seconds, 0 < lease <= 86400, digits only\n"),
        (b"N k 5 86401", b"E N k bad lease: seconds, 0 < lease <= 86400, digits only\n"),
        (b"N k\x01 5 30", b"E N * bad key: 1-250 bytes of UTF-8, no spaces or control "
                          b"characters\n"),
        (b"I", b"E I * expected: I <name>\n"),
        (b"I a b", b"E I a expected: I <name>\n"),
        (b"I " + b"n" * 251, b"E I * bad name: 1-250 bytes of UTF-8, no spaces or control "
                             b"characters\n"),
    ],
)
def test_bad_renew_and_identify(node: Node, line: bytes, answer: bytes) -> None:
    c = node.connect()
    assert c.ask(line) == answer
    assert c.ask(b"P alive") == b"P alive\n"


def test_identify_names_holders_and_waiters(node: Node) -> None:
    a, b = node.connect(), node.connect()
    assert a.ask(b"I billing-worker-3") == b"I billing-worker-3\n"
    a.ask(b"A k 30 0")
    a.ask(b"A j 30 0")
    b.ask(b"A k 30 0")
    k, j = node.service.table.holder(b"k"), node.service.table.holder(b"j")
    assert k is not None and j is not None
    assert k.owner == "billing-worker-3"
    assert k.owner is j.owner  # one shared str, no copy per key
    [waiter] = list(k.waiters())
    # Unnamed: the peer address.
    assert waiter.conn.name == "192.168.1.1:54321"  # type: ignore[attr-defined]
    assert b.ask(b"I payroll") == b"I payroll\n"
    a.ask(b"R k " + token(0))
    k = node.service.table.holder(b"k")  # the grant to b (a view shows one grant)
    assert k is not None and k.owner == "payroll"
    # Holders are shown by their connection's current name.
    assert a.ask(b"I billing-worker-4") == b"I billing-worker-4\n"
    assert node.service.table.ownerOf(b"j") == "billing-worker-4"


def test_identify_is_answered_by_a_standby(node: Node) -> None:
    c = node.connect()
    node.service.setRole(STANDBY, None)
    assert c.ask(b"I x") == b"I x\n"


# -- robustness of the lease alarm ------------------------------------------


class Exploding(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes] = None) -> None:
        if self.armed and waited > 0:
            raise RuntimeError("boom")


def test_an_exception_in_a_hand_over_stops_neither_it_nor_later_expiries(node: Node) -> None:
    from twisted.logger import globalLogPublisher

    logged: List[dict] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        node.service.observers.append(Exploding())
        a, b, c = node.connect(), node.connect(), node.connect()
        a.ask(b"A k 1 0")
        b.ask(b"A k 1 0")
        a.ask(b"A j 1 0")
        c.ask(b"A j 2 0")
        node.clock.advance(1)
        # Both hand-overs happened and were answered despite the observer.
        assert b.take().startswith(b"A k ")
        assert c.take().startswith(b"A j ")
        # And the alarm still runs: the new leases expire on time.
        node.clock.advance(1)
        assert node.service.table.holder(b"k") is None
        node.clock.advance(1)
        assert node.service.table.holder(b"j") is None
    finally:
        globalLogPublisher.removeObserver(logged.append)
    failures = [e for e in logged if "log_failure" in e]
    assert len(failures) == 1  # logged once, not once per occurrence
    assert node.service.stats.internalErrors == 2


def test_lease_alarm_survives_an_exception_inside_expiry(node: Node) -> None:
    calls = []
    original = node.service._expire

    def flaky(key: bytes, token: int, now: float) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError("boom")
        original(key, token, now)

    node.service.timers.expired = flaky
    a = node.connect()
    a.ask(b"A first 1 0")
    a.ask(b"A second 1 0")
    a.ask(b"A later 5 0")
    node.clock.advance(1)
    node.clock.advance(4)
    assert calls == [b"first", b"second", b"later"]
    assert node.service.table.holder(b"later") is None


def test_exhausted_tokens_at_hand_over_free_the_key_and_answer_waiters(node: Node) -> None:
    a, b = node.connect(), node.connect()
    a.ask(b"A k 30 0")
    b.ask(b"A k 30 0")
    node.wall.micros = 2**64  # no token left to issue
    assert a.ask(b"R k " + token(0)) == b"R k OK\n"
    assert b.take() == b"E A k fencing token space exhausted\n"
    assert node.service.table.holder(b"k") is None
    assert node.service.table.waiterCount == 0


def test_a_small_request_put_off_waits_behind_no_ones_backlog(node: Node) -> None:
    """
    Found from outside: 1,000 connections each sending 64 KiB of acquires
    at once put a ping of another connection behind all their input (each
    put-off connection's whole backlog was handled in turn): a worst ping
    of 0.6 s.  Each put-off connection now handles a share of the budget
    per iteration, cut at a line's end, in order.
    """
    node.factory.readBudget.budget = 2000
    written: List[Tuple[str, int]] = []
    bulk = [node.connect() for _ in range(4)]
    late = node.connect()
    for name, c in [("bulk", c) for c in bulk] + [("late", late)]:
        write = c.transport.write

        def logged(data: bytes, write: Any = write, name: str = name) -> None:
            written.append((name, len(data)))
            write(data)

        c.transport.write = logged  # type: ignore[method-assign]
    pings = b"".join(b"P %04d\n" % i for i in range(3000))  # 21,000 bytes each
    for c in bulk:
        c.proto.dataReceived(pings)  # the first read is handled whole; the others wait
    late.proto.dataReceived(b"P late\n")
    assert late.take() == b""  # put off: the budget of this iteration is spent
    before = len(written)
    node.clock.advance(0)  # every following iteration (task.Clock runs them all)
    assert late.take() == b"P late\n"
    # Answered in the first iteration after, behind 3 shares of 1 KiB, not
    # behind the 63,000 bytes waiting before it.
    answeredBefore = 0
    for name, size in written[before:]:
        if name == "late":
            break
        answeredBefore += size
    assert answeredBefore <= 3 * 1024
    for c in bulk:
        assert c.take() == pings  # all of it, in order
        assert c.transport.producerState == "producing"


def test_input_past_the_budget_of_a_reactor_iteration_waits_for_the_next(node: Node) -> None:
    """
    Many connections delivering big pipelined writes at once must not keep
    one reactor iteration busy for long (no heartbeat would go out): past
    the node's input budget, a connection stops reading and its input is
    handled, in order, first thing in the next iteration.
    """
    node.factory.readBudget.budget = 1000
    a, b, c = node.connect(), node.connect(), node.connect()
    pings = b"".join(b"P %04d\n" % i for i in range(120))  # 840 bytes
    a.proto.dataReceived(pings)
    b.proto.dataReceived(pings)
    c.proto.dataReceived(b"A k 30 0\n" + pings[:70])
    assert a.take() == pings and b.take() == pings
    assert c.take() == b""
    assert c.transport.producerState == "paused"
    # More input, even with budget to spare, waits behind what waits.
    node.factory.readBudget.spent = 0
    c.proto.dataReceived(b"P late\n")
    assert c.take() == b""
    node.clock.advance(0)  # the next reactor iteration
    answers = c.take().split(b"\n")
    assert answers[0].startswith(b"A k ")
    assert b"\n".join(answers[1:]) == pings[:70] + b"P late\n"
    assert c.transport.producerState == "producing"
    assert a.transport.producerState == "producing"

