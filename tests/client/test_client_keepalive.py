"""
Renewals, keep-alive and the lost-lock signal (SPEC sections 3 and 5),
deterministic: StringTransport connections and task.Clock.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from lockservice.client import Lock, LockLost, ReleaseFailed
from tests.support.fakenet import Network, failureOf, makeClient, result


def grant(clock: Clock, net: Network, d: "Deferred[Lock]", token: int = 7,
          after: float = 0.0) -> Lock:
    carrier = net.carrier()
    assert carrier.sent()[0].startswith(b"A ")
    clock.advance(after)
    carrier.answer(b"A k %d" % token)
    return result(d)  # type: ignore[no-any-return]


def run(clock: Clock, net: Network, until: float, answer: bool = True,
        stale: bool = False) -> List[Tuple[float, bytes]]:
    """
    Jump from one scheduled call to the next until C{until}; every line the
    client sends is noted with its time and (C{answer}) answered OK.
    """
    seen: List[Tuple[float, bytes]] = []
    while True:
        for c in list(net.connections):
            for line in c.sent():
                seen.append((round(clock.seconds(), 6), line))
                if answer and line.startswith(b"N "):
                    c.answer(b"N k STALE" if stale else b"N k OK")
        calls = [c.getTime() for c in clock.getDelayedCalls() if c.getTime() <= until]
        if not calls:
            clock.advance(until - clock.seconds())
            return seen
        clock.advance(max(min(calls) - clock.seconds(), 0))


def test_keep_alive_renews_every_third_of_the_lease_counted_from_the_send() -> None:
    clock, net, client = makeClient(["h:1"])
    d = client.acquire("k", 30, 0, keepAlive=True)
    lock = grant(clock, net, d, after=1.0)  # the answer took 1 s
    assert lock.expires == 30.0  # from the send at 0, not the answer at 1
    seen = run(clock, net, 65)
    assert seen == [(10.0, b"N k 7 30"), (20.0, b"N k 7 30"), (30.0, b"N k 7 30"),
                    (40.0, b"N k 7 30"), (50.0, b"N k 7 30"), (60.0, b"N k 7 30")]
    assert lock.expires == 90.0 and not lock.lost.called


def test_refused_renewal_fires_lost_once_and_renewals_stop() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    seen = run(clock, net, 100, stale=True)
    assert seen == [(10.0, b"N k 7 30")]
    lost = result(lock.lost)
    assert isinstance(lost, LockLost) and "STALE" in lost.reason
    assert lock.isLost


def test_lease_runs_out_while_disconnected_fires_lost_at_the_local_expiry() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True), after=2.0)
    for c in list(net.connections):
        net.down["h:1"] = True
        c.drop()
    clock.advance(29.99 - clock.seconds())
    assert not lock.lost.called
    clock.advance(0.01)
    lost = result(lock.lost)
    assert "ran out" in lost.reason
    # No connection ever carried a renewal, and none is scheduled any more.
    net.down["h:1"] = False
    seen = run(clock, net, 200)
    assert [line for _, line in seen if line.startswith(b"N")] == []


def test_renewals_are_retried_every_200ms_until_one_gets_through() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    clock.advance(9.9)
    # Renewals at 10 and 10.2 are cut; the one at 10.4 is answered.
    times = []
    while clock.seconds() < 10.5:
        for c in list(net.connections):
            for _line in c.sent():
                times.append(round(clock.seconds(), 6))
                if len(times) < 3:
                    c.drop()
                else:
                    c.answer(b"N k OK")
        clock.advance(0.05)
    assert times[:3] == [10.0, 10.2, 10.4]
    assert lock.expires == pytest.approx(40.4) and not lock.lost.called


def test_release_stops_keep_alive_and_no_renewal_is_sent_after_it() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    clock.advance(5)
    r = client.release(lock)
    carrier = net.carrier()
    assert carrier.sent() == [b"R k 7"]
    carrier.answer(b"R k OK")
    assert result(r) is True
    seen = run(clock, net, 300)
    assert seen == []
    assert not lock.lost.called  # a released lock is never "lost"


def test_release_during_a_renewal_retry_sends_no_more_renewals() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    clock.advance(10)
    first = net.carrier()
    assert first.sent() == [b"N k 7 30"]
    first.drop()  # the renewal is now being retried every 200 ms
    released = client.release(lock)
    seen = run(clock, net, 100, answer=False)
    assert [line for _, line in seen if line.startswith(b"N")] == []
    assert not lock.lost.called
    assert failureOf(released).check(ReleaseFailed)  # nobody answered the R


def test_cancelled_acquire_never_renews() -> None:
    clock, net, client = makeClient(["h:1"])
    d = client.acquire("k", 30, 0, keepAlive=True)
    carrier = net.carrier()
    carrier.sent()
    d.cancel()
    assert carrier.sent() == [b"C k"]
    carrier.answer(b"A k 7")  # the late grant is released, not kept alive
    seen = run(clock, net, 100)
    assert {line for _, line in seen} == {b"R k 7"}


def test_manual_renew_extends_from_its_send_and_stale_loses() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 10, 0))
    clock.advance(4)
    r = lock.renew(60)
    carrier = net.carrier()
    assert carrier.sent() == [b"N k 7 60"]
    clock.advance(0.1)
    carrier.answer(b"N k OK")
    assert result(r) is True and lock.expires == 64.0
    r2 = lock.renew()
    carrier = net.carrier()
    assert carrier.sent() == [b"N k 7 10"]
    carrier.answer(b"N k STALE")
    assert result(r2) is False and lock.isLost


def test_lock_without_keep_alive_is_lost_when_its_lease_runs_out() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 10, 0))
    clock.advance(9.99)
    assert not lock.lost.called
    clock.advance(0.01)
    assert "ran out" in result(lock.lost).reason
    assert [line for c in net.connections for line in c.sent()] == []


def test_grant_after_a_wait_longer_than_the_lease_is_renewed_at_once() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 10, 0, keepAlive=True), after=25.0)
    clock.advance(0)
    carrier = net.carrier()
    assert carrier.sent() == [b"N k 7 10"]
    assert not lock.lost.called
    carrier.answer(b"N k OK")
    assert lock.expires == 35.0 and not lock.lost.called


def test_close_leaves_no_timers_behind_with_locks_kept_alive() -> None:
    clock, net, client = makeClient(["h:1"])
    grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    client.close()
    assert clock.getDelayedCalls() == []


def test_async_with_keep_alive_renews_inside_the_block_and_releases() -> None:
    clock, net, client = makeClient(["h:1"])
    inside: Deferred[None] = Deferred()
    got: List[Lock] = []

    async def work() -> None:
        async with client.lock("k", 3, 0, keepAlive=True) as lock:
            got.append(lock)
            await inside

    d = Deferred.fromCoroutine(work())
    carrier = net.carrier()
    carrier.sent()
    carrier.answer(b"A k 7")
    seen = run(clock, net, 3.5)
    assert [line for _, line in seen] == [b"N k 7 3", b"N k 7 3", b"N k 7 3"]
    inside.callback(None)
    carrier = net.carrier()
    assert carrier.sent() == [b"R k 7"]
    carrier.answer(b"R k OK")
    result(d)
    assert run(clock, net, 100) == []


def test_renewal_follows_a_redirect() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 30, 0, keepAlive=True))
    clock.advance(10)
    standby = net.carrier()
    assert standby.sent() == [b"N k 7 30"]
    standby.answer(b"M N k act:9")
    clock.advance(0)
    active = net.connections[-1]
    assert active.address == "act:9" and active.sent() == [b"N k 7 30"]
    active.answer(b"N k OK")
    assert lock.expires == 40.0


def test_renewal_unanswered_until_expiry_loses_the_lock() -> None:
    clock, net, client = makeClient(["h:1"])
    lock = grant(clock, net, client.acquire("k", 3, 0, keepAlive=True))
    run(clock, net, 2.99, answer=False)
    assert not lock.lost.called
    clock.advance(0.01)
    assert lock.isLost
