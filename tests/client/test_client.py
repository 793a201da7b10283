"""
The client library, deterministic: fake endpoints hand out StringTransport
connections the test controls, and task.Clock drives retries.
"""

from __future__ import annotations

import gc
import re
from typing import List, Optional

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from lockservice.client.api import (
    Lock,
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
    connect,
)
from tests.support.fakenet import (
    Network,
    failureOf,
    makeClient,
    result,
)


def test_single_address_gets_two_connections() -> None:
    clock, net, client = makeClient(["h:1"])
    assert net.attempts == ["h:1", "h:1"]
    assert len(client.slots) == 2 and all(s.up for s in client.slots)


def test_several_addresses_one_connection_each() -> None:
    clock, net, client = makeClient(["a:1", "b:2", "c:3"])
    assert net.attempts == ["a:1", "b:2", "c:3"]


def test_acquire_and_release() -> None:
    clock, net, client = makeClient(["h:1"])
    d = client.acquire("k", 30, 5)
    conn = net.carrier()
    assert conn.sent() == [b"A k 30 5"]
    conn.answer(b"A k 123")
    lock = result(d)
    assert (lock.key, lock.token) == ("k", 123)
    r = client.release(lock)
    sent = [(c, c.sent()) for c in net.connections]
    carrier, lines = next((c, s) for c, s in sent if s)
    assert lines == [b"R k 123"]
    carrier.answer(b"R k OK")
    assert result(r) is True


def test_release_stale_is_false() -> None:
    clock, net, client = makeClient(["h:1"])
    r = client.release(Lock("k", 5))
    carrier = net.carrier()
    carrier.answer(b"R k STALE")
    assert result(r) is False


def test_round_robin_over_connections() -> None:
    clock, net, client = makeClient(["a:1", "b:2", "c:3"])
    for i in range(6):
        client.acquire(f"k{i}", 1, 0)
    counts = {c.address: len(c.sent()) for c in net.connections}
    assert counts == {"a:1": 2, "b:2": 2, "c:3": 2}


def test_down_connection_is_skipped_and_retried_every_3s() -> None:
    clock, net, client = makeClient(["a:1", "b:2"], down=["b:2"])
    for i in range(4):
        client.acquire(f"k{i}", 1, 0)
    live = [c for c in net.connections if c.address == "a:1"]
    assert len(live) == 1 and len(live[0].sent()) == 4
    assert net.attempts == ["a:1", "b:2"]
    clock.advance(2.9)
    assert net.attempts == ["a:1", "b:2"]
    clock.advance(0.1)
    assert net.attempts == ["a:1", "b:2", "b:2"]
    clock.advance(3)
    assert net.attempts.count("b:2") == 3
    net.down["b:2"] = False
    clock.advance(3)
    assert client.slots[1].up
    client.acquire("x", 1, 0)
    client.acquire("y", 1, 0)
    assert sum(len(c.sent()) for c in net.connections) == 2


def test_dropped_connection_reconnects_at_once_then_every_3s() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    a = net.connections[0]
    clock.advance(3)  # the connection lasted
    net.down["a:1"] = True
    a.drop()
    clock.advance(0)
    assert net.attempts == ["a:1", "b:2", "a:1"]
    clock.advance(3)
    assert net.attempts == ["a:1", "b:2", "a:1", "a:1"]


def test_a_node_that_closes_every_connection_at_once_is_redialled_every_3s() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    for _ in range(3):
        assert client.slots[0].up
        client.slots[0].protocol.transport.loseConnection()  # type: ignore[union-attr]
        client.slots[0].protocol.connectionLost(  # type: ignore[union-attr]
            Failure(ConnectionDone()))
        clock.advance(2.9)
        assert not client.slots[0].up, "redialled before 3 s had passed since the last attempt"
        clock.advance(0.1)
    assert net.attempts.count("a:1") == 4


def test_pipelined_answers_paired_by_op_and_key_in_send_order() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    client.slots[1].protocol.transport.loseConnection()  # type: ignore[union-attr]
    net.down["b:2"] = True
    client.slots[1].protocol.connectionLost(Failure(ConnectionDone()))  # type: ignore[union-attr]
    conn = net.connections[0]
    d1 = client.acquire("k", 30, 0)
    d2 = client.acquire("k", 30, 0)
    d3 = client.acquire("other", 30, 0)
    # At most one outstanding A per key per connection: the second A of k
    # waits its turn (so a C always means the request it should).
    assert conn.sent() == [b"A k 30 0", b"A other 30 0"]
    conn.answer(b"A other 7")
    conn.answer(b"A k 5")
    other, k = result(d3), result(d1)
    assert other.token == 7 and k.token == 5
    assert conn.sent() == [b"A k 30 0"]
    conn.answer(b"T k")
    with pytest.raises(LockTimeout):
        result(d2)
    # Equal pairs of other ops are pipelined and answered in send order.
    r1 = client.release(k)
    r2 = client.release(other)
    r3 = client.release(Lock("k", 6))
    assert conn.sent() == [b"R k 5", b"R other 7", b"R k 6"]
    conn.answer(b"R other OK")
    conn.answer(b"R k OK")
    conn.answer(b"R k STALE")
    assert result(r1) is True and result(r2) is True and result(r3) is False


def test_error_answer_is_a_rejection_with_message() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 99999999, 0)
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"E A k bad lease: seconds, 0 < lease <= 86400, digits only")
    f = failureOf(d)
    assert f.check(LockRejected)
    assert "bad lease" in f.value.message


def test_invalid_key_is_refused_before_sending() -> None:
    clock, net, client = makeClient(["a:1"])
    with pytest.raises(ValueError):
        client.acquire("has space", 1, 0)
    with pytest.raises(ValueError):
        client.acquire("x" * 251, 1, 0)


def test_drop_during_acquire_moves_to_next_connection() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    d = client.acquire("k", 30, 0)
    first = net.carrier()
    first.sent()
    net.down[first.address] = True
    first.drop()
    other = next(c for c in net.connections if c is not first and c.transport.value())
    assert other.sent() == [b"A k 30 0"]
    other.answer(b"A k 9")
    assert result(d).token == 9


def test_error_only_after_as_many_drops_as_connections() -> None:
    clock, net, client = makeClient(["a:1", "b:2", "c:3"])
    for a in ["a:1", "b:2", "c:3"]:
        net.down[a] = True
    d = client.acquire("k", 30, 0)
    for attempt in range(3):
        carrier = next(
            c for c in net.connections if c.transport.value() and not c.closedByClient
        )
        carrier.sent()
        if attempt < 2:
            assert not d.called
        carrier.drop()
        carrier.transport.loseConnection()
    assert failureOf(d).check(NoConnection)


def test_redirect_switches_connection_and_resends() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 0)
    standby = net.carrier()
    standby.sent()
    standby.answer(b"M A k act:9")
    assert standby.closedByClient
    standby.drop()
    clock.advance(0)
    active = net.connections[-1]
    assert active.address == "act:9"
    assert active.sent() == [b"A k 30 0"]
    active.answer(b"A k 11")
    assert result(d).token == 11


def test_redirected_slot_goes_home_when_active_is_lost() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    d = client.acquire("k", 30, 0)
    standby = net.carrier()
    standby.sent()
    standby.answer(b"M A k act:9")
    standby.drop()
    clock.advance(0)
    active = net.connections[-1]
    active.answer(b"A k 11")
    result(d)
    clock.advance(3)  # the connection to the active lasted
    net.down["act:9"] = True
    active.drop()
    clock.advance(0)
    assert net.attempts[-1] == standby.address


def test_redirect_to_unknown_active_retries_shortly() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 0)
    conn = net.carrier()
    conn.sent()
    conn.answer(b"M A k *")
    assert not d.called
    clock.advance(0.1)
    carrier = net.carrier()
    assert carrier.sent() == [b"A k 30 0"]
    carrier.answer(b"A k 3")
    assert result(d).token == 3


def test_release_retried_every_200ms_across_drops() -> None:
    clock, net, client = makeClient(["a:1"])
    for c in list(net.connections):
        net.down["a:1"] = True
        c.drop()
    r = client.release(Lock("k", 42))
    assert not r.called
    clock.advance(0.2)
    assert not r.called
    net.down["a:1"] = False
    clock.advance(3)  # background reconnect
    clock.advance(0.2)
    carrier = net.carrier()
    assert carrier.sent() == [b"R k 42"]
    carrier.answer(b"R k OK")
    assert result(r) is True


def test_release_gives_up_after_5s() -> None:
    clock, net, client = makeClient(["a:1"])
    for c in list(net.connections):
        net.down["a:1"] = True
        c.drop()
    r = client.release(Lock("k", 42))
    for _ in range(30):
        clock.advance(0.2)
    assert failureOf(r).check(ReleaseFailed)


@pytest.mark.parametrize("wait, bound", [(2, 2.0), (0, 10.0)])
def test_no_active_node_is_asked_again_until_the_wait_runs_out_then_no_connection(
        wait: float, bound: float) -> None:
    """
    M A k * (no active known right now) is retried until the acquire's
    wait runs out (10 s when it waits for ever), then it is a
    NoConnection, not a timeout.
    """
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, wait)
    asked = 0
    while not d.called and clock.seconds() < bound + 5:
        for c in net.connections:
            for _ in c.sent():
                asked += 1
                c.answer(b"M A k *")
        clock.advance(0.05)
    assert failureOf(d).check(NoConnection)
    assert bound <= clock.seconds() <= bound + 0.6
    assert asked >= bound / 0.2


def test_cancelled_acquire_releases_a_late_grant() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 0)
    carrier = net.carrier()
    carrier.sent()
    d.cancel()
    assert failureOf(d).check(CancelledError)
    # Withdrawn at once; the grant crossed the withdrawal: released.
    assert carrier.sent() == [b"C k"]
    carrier.answer(b"A k 77")
    carrier.answer(b"C k NONE")
    lines = [line for c in net.connections for line in c.sent()]
    assert lines == [b"R k 77"]


def test_a_cancelled_acquire_is_withdrawn_and_its_T_releases_nothing() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 1)
    carrier = net.carrier()
    carrier.sent()
    d.cancel()
    assert carrier.sent() == [b"C k"]
    carrier.answer(b"T k")
    carrier.answer(b"C k OK")
    assert [line for c in net.connections for line in c.sent()] == []


def test_an_acquire_cancelled_before_any_connection_is_up_is_never_sent() -> None:
    clock, net, client = makeClient(["a:1"], down=["a:1"])
    d = client.acquire("k", 30, 0)
    d.cancel()
    failureOf(d).trap(CancelledError)
    net.down["a:1"] = False
    clock.advance(3)  # the redial succeeds
    assert net.connections and all(c.sent() == [] for c in net.connections)


def test_a_second_acquire_of_a_key_waits_for_a_free_connection_and_its_cancel_is_quiet(
        ) -> None:
    clock, net, client = makeClient(["a:1"])
    first, second = client.acquire("k", 30, 0), client.acquire("k", 30, 0)
    sent = [line for c in net.connections for line in c.sent()]
    assert sent == [b"A k 30 0", b"A k 30 0"]  # one on each of the two connections
    third = client.acquire("k", 30, 0)
    assert [line for c in net.connections for line in c.sent()] == []  # waits its turn
    third.cancel()
    failureOf(third).trap(CancelledError)
    for c in net.connections:
        c.answer(b"T k")
    failureOf(first).trap(LockTimeout)
    failureOf(second).trap(LockTimeout)
    assert [line for c in net.connections for line in c.sent()] == []


def test_locked_helper_releases_when_function_fails() -> None:
    clock, net, client = makeClient(["a:1"])

    def boom(lock: Lock) -> None:
        raise RuntimeError("inside")

    d = client.locked("k", 30, 0, boom)
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"A k 5")
    releaser = net.carrier()
    assert releaser.sent() == [b"R k 5"]
    releaser.answer(b"R k OK")
    assert failureOf(d).check(RuntimeError)


def test_async_with_releases_on_success() -> None:
    clock, net, client = makeClient(["a:1"])
    seen: List[int] = []

    async def work() -> str:
        async with client.lock("k", 30, 0) as lock:
            seen.append(lock.token)
            return "done"

    d = Deferred.fromCoroutine(work())
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"A k 8")
    releaser = net.carrier()
    assert releaser.sent() == [b"R k 8"]
    releaser.answer(b"R k OK")
    assert result(d) == "done" and seen == [8]


def test_async_with_cancelled_inside_block_releases() -> None:
    clock, net, client = makeClient(["a:1"])
    blocker: Deferred[None] = Deferred()

    async def work() -> None:
        async with client.lock("k", 30, 0):
            await blocker

    d = Deferred.fromCoroutine(work())
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"A k 8")
    d.cancel()
    releaser = net.carrier()
    assert releaser.sent() == [b"R k 8"]
    releaser.answer(b"R k OK")
    assert failureOf(d).check(CancelledError)


def test_close_stops_reconnecting_and_leaves_no_timers() -> None:
    clock, net, client = makeClient(["a:1", "b:2"], down=["b:2"])
    client.whenConnected()
    d = client.close()
    for c in net.connections:
        assert c.closedByClient
        c.drop()
    assert d.called
    assert clock.getDelayedCalls() == []
    before = len(net.attempts)
    clock.advance(10)
    assert len(net.attempts) == before


def test_resent_acquire_asks_only_for_the_wait_left() -> None:
    clock, net, client = makeClient(["a:1", "b:2"])
    d = client.acquire("k", 30, 5)
    first = net.carrier()
    assert first.sent() == [b"A k 30 5"]
    clock.advance(2)
    net.down[first.address] = True
    first.drop()
    other = next(c for c in net.connections if c is not first and c.transport.value())
    assert other.sent() == [b"A k 30 3"]
    other.answer(b"T k")
    assert failureOf(d).check(LockTimeout)


def test_unanswered_acquire_times_out_client_side_and_late_grant_is_released() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 2)
    carrier = net.carrier()
    carrier.sent()
    clock.advance(2.4)
    assert not d.called
    clock.advance(0.1)
    assert failureOf(d).check(LockTimeout)
    assert carrier.sent() == [b"C k"]  # withdrawn, should the node wake up
    carrier.answer(b"A k 99")  # the stalled grant finally arrives
    assert [line for c in net.connections for line in c.sent()] == [b"R k 99"]


def test_ping_is_echoed() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.ping("hello")
    carrier = net.carrier()
    assert carrier.sent() == [b"P hello"]
    carrier.answer(b"P hello")
    assert result(d) is True


# -- release: the retry schedule and its contract (SPEC section 5) -------------


def releaseSends(clock: Clock, net: Network, r: Deferred, answer: Optional[bytes],  # type: ignore[type-arg]
                 until: float = 12.0) -> List[float]:
    """
    Jump from one scheduled call to the next; every R the client sends is
    noted with its time, then answered with C{answer} (None: the
    connection drops).
    """
    times: List[float] = []
    while clock.seconds() < until and not r.called:
        for c in list(net.connections):
            for line in c.sent():
                if line.startswith(b"R "):
                    times.append(round(clock.seconds(), 6))
                    if answer is None:
                        c.drop()
                    else:
                        c.answer(answer)
        calls = clock.getDelayedCalls()
        if not calls:
            break
        clock.advance(max(min(c.getTime() for c in calls) - clock.seconds(), 0))
    return times


def test_release_is_sent_on_every_connection_up_for_5s_exactly() -> None:
    # Each connection that carries the release drops: the release goes to
    # the other one 200 ms later, then to each as it is redialled (every
    # 3 s: a connection that dropped at once is not redialled in a loop).
    clock, net, client = makeClient(["a:1"])
    r = client.release(Lock("k", 42))
    times = releaseSends(clock, net, r, None)
    assert times == [0.0, 0.2, 3.0, 3.2]
    assert failureOf(r).check(ReleaseFailed)
    # ... and it failed at 5 s, not later.
    assert round(clock.seconds(), 2) <= 5.01


def test_release_on_m_star_fails_within_5s_as_release_failed() -> None:
    clock, net, client = makeClient(["a:1"])
    r = client.release(Lock("k", 42))
    times = releaseSends(clock, net, r, b"M R k *")
    assert r.called and round(clock.seconds(), 2) <= 5.01
    assert failureOf(r).check(ReleaseFailed)
    assert times[0] == 0 and times[-1] <= 4.8


def test_release_answered_e_is_release_failed_not_rejected() -> None:
    clock, net, client = makeClient(["a:1"])
    r = client.release(Lock("k", 42))
    net.carrier().answer(b"E R k bad token")
    assert failureOf(r).check(ReleaseFailed)


def test_release_to_a_node_that_never_answers_fails_at_5s_without_flooding() -> None:
    clock, net, client = makeClient(["a:1"])
    r = client.release(Lock("k", 42))
    sent = 0
    for _ in range(60):
        sent += sum(len(c.sent()) for c in net.connections)
        clock.advance(0.1)
    assert failureOf(r).check(ReleaseFailed)
    # One copy per connection at most while the earlier ones are unanswered.
    assert sent == 2


def test_release_ok_overtaken_by_its_own_stale_retry_is_still_ok() -> None:
    clock, net, client = makeClient(["a:1"])
    r = client.release(Lock("k", 42))
    first = net.carrier()
    assert first.sent() == [b"R k 42"]
    clock.advance(0.2)
    second = net.carrier()
    assert second is not first and second.sent() == [b"R k 42"]
    second.answer(b"R k STALE")
    assert not r.called
    first.answer(b"R k OK")
    assert result(r) is True


# -- acquire against nodes that never answer -----------------------------------


def test_acquire_with_no_connection_fails_no_connection_after_the_wait() -> None:
    clock, net, client = makeClient(["a:1"], down=["a:1"])
    d = client.acquire("k", 30, 1)
    clock.advance(1.4)
    assert not d.called
    clock.advance(0.1)
    f = failureOf(d)
    assert f.check(NoConnection) and "a:1" in f.getErrorMessage()


def test_acquire_wait_0_with_no_connection_fails_after_5s() -> None:
    clock, net, client = makeClient(["a:1"], down=["a:1"])
    d = client.acquire("k", 30, 0)
    clock.advance(4.9)
    assert not d.called
    clock.advance(0.1)
    assert failureOf(d).check(NoConnection)


def test_redirect_retires_the_old_connection_without_losing_a_grant() -> None:
    """
    Following a redirect must not cut a connection that still has an answer
    on its way: a grant lost that way is held by nobody for a whole lease.
    """
    clock, net, client = makeClient(["a:1"])
    s1, s2 = net.connections
    net.down["a:1"] = True
    s2.drop()  # everything now goes through s1
    d1 = client.acquire("k1", 30, 0)
    d2 = client.acquire("k2", 30, 0)
    assert s1.sent() == [b"A k1 30 0", b"A k2 30 0"]
    s1.answer(b"M A k2 act:9")
    # Half-closed (the server still writes what it decided), not closed.
    assert s1.transport.halfClosed and not s1.closedByClient  # type: ignore[attr-defined]
    s1.answer(b"A k1 5")
    assert result(d1).token == 5
    assert s1.closedByClient  # nothing pending any more: now closed
    clock.advance(0)
    active = net.connections[-1]
    assert active.address == "act:9" and active.sent() == [b"A k2 30 0"]
    active.answer(b"A k2 6")
    assert result(d2).token == 6


# -- names ---------------------------------------------------------------------


def test_name_is_sent_first_on_every_connection_and_reconnection() -> None:
    clock = Clock()
    net = Network()
    client = connect(clock, ["a:1"], endpointFor=net.endpointFor, name="host1:42:billing")
    # The name plus this client's instance: 12 lowercase hex, the same on
    # every connection of the client (the node joins them for deadlocks).
    hello = b"I host1:42:billing#" + client.instance.encode() + b"\n"
    assert re.fullmatch(rb"I host1:42:billing#[0-9a-f]{12}\n", hello)
    assert [c.hello for c in net.connections] == [hello] * 2
    net.connections[0].answer(hello.rstrip())
    net.connections[0].drop()
    clock.advance(0)
    assert net.connections[-1].hello == hello
    d = client.acquire("k", 30, 0)
    carrier = net.carrier()
    assert carrier.sent() == [b"A k 30 0"]
    carrier.answer(b"A k 1")
    assert result(d).token == 1


def test_each_client_instance_has_its_own_suffix_and_unnamed_clients_send_one_too() -> None:
    net = Network()
    one = connect(Clock(), ["a:1"], endpointFor=net.endpointFor)
    two = connect(Clock(), ["a:1"], endpointFor=net.endpointFor)
    assert one.instance != two.instance
    hellos = [c.hello for c in net.connections]
    assert hellos == [b"I #" + one.instance.encode() + b"\n"] * 2 + [
        b"I #" + two.instance.encode() + b"\n"] * 2
    assert all(re.fullmatch(rb"I #[0-9a-f]{12}\n", h) for h in hellos)


def test_a_name_too_long_for_its_suffix_is_refused_at_once() -> None:
    net = Network()
    connect(Clock(), ["a:1"], endpointFor=net.endpointFor, name="x" * 237)
    with pytest.raises(ValueError, match="at most 237 bytes"):
        connect(Clock(), ["a:1"], endpointFor=net.endpointFor, name="x" * 238)


def test_invalid_name_is_refused() -> None:
    with pytest.raises(ValueError):
        connect(Clock(), ["a:1"], endpointFor=Network().endpointFor, name="two words")


def test_request_resent_after_a_drop_never_goes_to_the_dead_connection() -> None:
    """
    The re-send runs synchronously inside connectionLost: the dying
    connection must already be out of the rotation (a failover test hung
    on this: the re-sent acquire was written to the dead socket).
    """
    clock, net, client = makeClient(["a:1", "b:2"])
    s1, s2 = net.connections
    net.down["b:2"] = True
    s2.drop()
    d = client.acquire("k", 30, 0)
    assert s1.sent() == [b"A k 30 0"]
    clock.advance(3)  # the connection lasted
    s1.drop()
    assert s1.sent() == []
    clock.advance(0)  # a:1 redialled
    fresh = net.connections[-1]
    assert fresh is not s1 and fresh.sent() == [b"A k 30 0"]
    fresh.answer(b"A k 4")
    assert result(d).token == 4


def test_against_an_address_that_never_answers_every_call_ends_as_documented() -> None:
    """
    A blackholed address (connection attempts never complete): acquire with
    a wait fails NoConnection at wait + 0.5 s, acquire without one after
    5 s, and a release with ReleaseFailed after 5 s.
    """
    clock = Clock()
    net = Network()
    net.blackholes.add("void:1")
    client = connect(clock, ["void:1"], endpointFor=net.endpointFor)
    timed = client.acquire("k", 30, 1)
    forever = client.acquire("k", 30, 0)
    released = client.release(Lock("k", 5))
    clock.advance(1.49)
    assert not timed.called
    clock.advance(0.01)
    assert failureOf(timed).check(NoConnection)
    clock.advance(3.49)
    assert not forever.called and not released.called
    clock.advance(0.01)
    assert failureOf(forever).check(NoConnection)
    assert failureOf(released).check(ReleaseFailed)


# -- shared keys (issue 22): the fifth field, exact bytes ------------------------


@pytest.mark.parametrize("call, line, share", [
    (lambda c: c.acquire("k", 30, 5), b"A k 30 5", None),
    (lambda c: c.acquire("k", 30, 5, share=None), b"A k 30 5", None),
    (lambda c: c.acquire("k", 30, 5, share=1), b"A k 30 5", None),
    (lambda c: c.acquire("k", 30, 5, share="r"), b"A k 30 5 r", "r"),
    (lambda c: c.acquire("k", 30, 5, share=2), b"A k 30 5 2", 2),
    (lambda c: c.acquire("k", 30, 5, share=65535), b"A k 30 5 65535", 65535),
    (lambda c: c.readLock("k", 30, 5), b"A k 30 5 r", "r"),
    (lambda c: c.writeLock("k", 30, 5), b"A k 30 5", None),
    (lambda c: c.semaphore("k", 4, 30, 5), b"A k 30 5 4", 4),
    (lambda c: c.semaphore("k", 4, 30), b"A k 30 0 4", 4),
])
def test_share_is_the_fifth_field_and_the_lock_knows_it(call, line, share) -> None:  # type: ignore[no-untyped-def]
    clock, net, client = makeClient(["a:1"])
    d = call(client)
    carrier = net.carrier()
    assert carrier.sent() == [line]
    carrier.answer(b"A k 7")
    lock = result(d)
    assert (lock.token, lock.share) == (7, share)
    r = client.release(lock)
    releaser = net.carrier()
    assert releaser.sent() == [b"R k 7"]
    releaser.answer(b"R k OK")
    assert result(r) is True


@pytest.mark.parametrize("share", [0, 65536, -1, "w", "R", "2", 2.0, True, False, b"r", [2]])
def test_a_bad_share_is_refused_at_once_and_nothing_is_sent(share) -> None:  # type: ignore[no-untyped-def]
    clock, net, client = makeClient(["a:1"])
    with pytest.raises(ValueError, match="invalid share"):
        client.acquire("k", 30, 5, share=share)
    assert all(c.transport.value() == b"" for c in net.connections)


@pytest.mark.parametrize("slots", [0, 1, 65536, "4", True, 4.0])
def test_a_bad_semaphore_size_is_refused_at_once(slots) -> None:  # type: ignore[no-untyped-def]
    clock, net, client = makeClient(["a:1"])
    with pytest.raises(ValueError, match="invalid slots"):
        client.semaphore("k", slots, 30, 5)
    assert all(c.transport.value() == b"" for c in net.connections)


def test_shared_lock_renews_and_keeps_alive_by_its_own_token() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.readLock("k", 30, 5, keepAlive=True)
    carrier = net.carrier()
    assert carrier.sent() == [b"A k 30 5 r"]
    carrier.answer(b"A k 11")
    lock = result(d)
    assert lock.share == "r"
    clock.advance(10)
    assert net.carrier().sent() == [b"N k 11 30"]


def test_a_cancelled_read_lock_releases_its_late_grant() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.readLock("k", 30, 0)
    carrier = net.carrier()
    assert carrier.sent() == [b"A k 30 0 r"]
    d.cancel()
    failureOf(d).trap(CancelledError)
    assert carrier.sent() == [b"C k"]
    carrier.answer(b"A k 12")
    assert [line for c in net.connections for line in c.sent()] == [b"R k 12"]


def test_an_e_answer_for_a_kind_mismatch_is_a_rejection() -> None:
    clock, net, client = makeClient(["a:1"])
    d = client.semaphore("k", 3, 30, 5)
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"E A k the share does not match the key (a semaphore of 4)")
    failure = failureOf(d)
    failure.trap(LockRejected)
    assert failure.value.message == "the share does not match the key (a semaphore of 4)"


# -- close with acquires pending; addresses checked at once (issue 21 item 10) ----


def test_close_fails_pending_acquires_at_once_with_no_connection_and_nothing_unhandled() -> None:
    from twisted.logger import globalLogPublisher

    seen: List[str] = []

    def observe(event):  # type: ignore[no-untyped-def]
        if event.get("log_failure") is not None or "Unhandled" in str(event.get("log_format")):
            seen.append(str(event))

    globalLogPublisher.addObserver(observe)
    try:
        clock, net, client = makeClient(["a:1", "b:2"], down=["b:2"])
        held = client.acquire("k", 30, 0)          # on a connection, sent
        waiting = client.acquire("k", 30, 5)       # queued behind it
        clock2, net2, lonely = makeClient(["c:3"], down=["c:3"])
        unsent = lonely.acquire("k", 30, 0)        # no connection: waiting for one
        errors = []
        for d in (held, waiting, unsent):
            d.addErrback(lambda f: errors.append(f.trap(NoConnection) and str(f.value)))
        client.close()
        lonely.close()
        assert errors == ["client closed"] * 3
        for c in net.connections:
            c.drop()
        clock.advance(10)
        clock2.advance(10)
        del held, waiting, unsent
        gc.collect()
    finally:
        globalLogPublisher.removeObserver(observe)
    assert seen == []


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:x",
                                     "127.0.0.1:70000", ":7700", "a:1,127.0.0.1"])
def test_an_address_without_a_port_is_refused_at_once(address) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="not a host:port address"):
        connect(Clock(), address)


def test_a_try_with_the_smallest_wait_is_sent_with_that_wait() -> None:
    # tooz's acquire(blocking=False): the first send asks for the wait given,
    # even though it has run out on the client's clock by the time it goes.
    clock, net, client = makeClient(["a:1"])
    d = client.acquire("k", 30, 0.000001)
    clock.advance(0.00001)
    carrier = net.carrier()
    assert carrier.sent() == [b"A k 30 0.000001"]
    carrier.answer(b"A k 5")
    assert result(d).token == 5


def test_connections_to_one_node_that_drop_together_cost_a_request_one_try() -> None:
    """
    A failover: both connections had followed M to the active, which dies.
    The acquire and the observe on them are not failed (one try each), and
    are re-sent once the connections are back.
    """
    clock, net, client = makeClient(["a:1"])
    first, second = net.connections
    clock.advance(5)  # the connections lasted: redialled at once when they drop
    acquired = client.acquire("k", 30, 0)
    observed = client.observe("k", 3)
    carriers = [c for c in (first, second) if c.sent()]
    assert carriers
    for side in (first, second):  # the node dies: both go in the same moment
        side.drop()
    assert not acquired.called and not observed.called
    clock.advance(0)
    fresh = [c for c in net.connections if c not in (first, second)]
    assert len(fresh) == 2
    sent = {c: c.sent() for c in fresh}
    assert sorted(line.split(b" ")[0] for lines in sent.values() for line in lines) == [
        b"A", b"O"]
    for c, lines in sent.items():
        for line in lines:
            c.answer(b"A k 9" if line.startswith(b"A") else b"O k 9 -")
    assert result(acquired).token == 9
    assert result(observed).token == 9
