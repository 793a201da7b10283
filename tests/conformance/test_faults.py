"""
Faults on one node: a node that never answers (stalled at a proxy, or
paused with SIGSTOP), no node at all, redirects (`M host:port` and
`M ... *`), keep-alive losing its lease.
"""

from __future__ import annotations

import signal
import socket
import time

import pytest

from .conftest import wait_until
from .util import err, ok, token_of

pytestmark = pytest.mark.faults


def _dead_address() -> str:
    """
    A loopback address where nothing listens (connections refused).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _ends(d, ident, codes, low, high, what):
    line = d.result_line(ident, high + 2)
    assert line.obj.get("ok") is False and line.obj.get("error") in codes, \
        f"{what}: expected {codes}, got {line.obj}"
    took = d.elapsed(ident, line)
    assert low <= took <= high, f"{what}: ended after {took:.2f}s, expected {low}..{high}s"
    return line


def test_stalled_node_holds_no_command_forever(kind, lone, start_driver, proxy_factory, key):
    proxy = proxy_factory(lone.port)
    d = start_driver(proxy.address)
    ka, kb, kc = key("a"), key("b"), key("c")
    ta = token_of(d.call("acquire", key=ka, lease=60, wait=5))
    line_b = d.result_line(d.cmd("acquire", key=kb, lease=3, wait=5), 10)
    tb = token_of(line_b.obj)
    e = key("e")
    token_of(d.call("campaign", election=e, value="stalled", lease=60))
    proxy.stall()
    release = d.cmd("release", key=ka, token=ta)
    resign = d.cmd("resign", election=e)
    renew = d.cmd("renew", key=kb, token=tb, lease=30)
    acquire = d.cmd("acquire", key=kc, lease=30, wait=1)
    observe = d.cmd("observe", key=ka, token=ta, wait=1)
    _ends(d, acquire, ("timeout", "no_connection"), 0.9, 1 + 3 + 1.0,
          "an acquire with wait 1 on a stalled node (at most 3 s after its wait)")
    _ends(d, observe, ("timeout", "no_connection"), 0.9, 1 + 3 + 2.0,
          "an observe with wait 1 on a stalled node")
    renewed = d.result_line(renew, 10)
    err(renewed.obj, "no_connection")
    assert renewed.time <= line_b.time + 3 + 1.0, \
        f"renew must end by the time the lease (3 s) runs out: {renewed.time - line_b.time:.2f}s"
    _ends(d, release, ("no_connection",), 4.5, 8.0, "a release after its 5 s of retries")
    _ends(d, resign, ("no_connection",), 4.5, 8.0, "a resign (a release) after 5 s of retries")
    proxy.resume()


def test_no_node_no_connection(kind, start_driver):
    d = start_driver(f"{_dead_address()},{_dead_address()}")
    a0 = d.cmd("acquire", key="k0", lease=30, wait=0)
    a30 = d.cmd("acquire", key="k30", lease=30, wait=30)
    a2 = d.cmd("acquire", key="k2", lease=30, wait=2)
    release = d.cmd("release", key="k", token="123")
    renew = d.cmd("renew", key="k", token="123", lease=2)
    observe = d.cmd("observe", key="k", token="0", wait=0)
    campaign = d.cmd("campaign", election="e", value="v", lease=5)
    leader = d.cmd("leader", election="e")
    for ident in (a0, a30, a2):
        _ends(d, ident, ("no_connection",), 0, 11.5,
              "an acquire with no usable connection (within 10 s whatever its wait)")
    _ends(d, release, ("no_connection",), 4.5, 8.0, "a release after its 5 s of retries")
    for ident, what in ((renew, "renew"), (observe, "observe"), (campaign, "campaign"),
                        (leader, "leader")):
        _ends(d, ident, ("no_connection",), 0, 12.0, f"{what} with no usable connection")


def test_redirect_followed_to_the_active(kind, lone, start_driver, proxy_factory, key):
    standby = proxy_factory(lone.port)
    active = proxy_factory(lone.port)

    def redirect(line: str):
        f = line.split(" ")
        if f[0] in ("A", "R", "N", "C", "O") and len(f) > 1:
            return f"M {f[0]} {f[1]} {active.address}"
        return None

    standby.answer_with(redirect)
    d = start_driver(standby.address)
    k1, k2 = key("1"), key("2")
    t1 = token_of(d.call("acquire", key=k1, lease=30, wait=5))
    assert lone.tokens(k1) == [int(t1)]
    assert [text for _, _, text in active.lines_up(f"A {k1} ")], "the acquire went to the active"
    t2 = token_of(d.call("acquire", key=k2, lease=30, wait=5))
    ok(d.call("release", key=k1, token=t1))
    ok(d.call("release", key=k2, token=t2))
    assert lone.holders(k1) == [] and lone.holders(k2) == []
    r = d.call("observe", key=k1, token="1", wait=5)
    assert token_of(r) == "0"
    assert active.lines_up(f"O {k1} ")


def test_no_active_known_retried_until_wait(kind, lone, start_driver, proxy_factory, key):
    proxy = proxy_factory(lone.port)
    k0, k1, k2 = key("wait0"), key("wait1"), key("later")
    no_active_until = [0.0]

    def answer(line: str):
        f = line.split(" ")
        if len(f) > 1 and f[0] == "A" and (f[1] in (k0, k1) or (
                f[1] == k2 and time.monotonic() < no_active_until[0])):
            return f"M A {f[1]} *"
        return None

    proxy.answer_with(answer)
    d = start_driver(proxy.address)
    ok(d.call("leader", election=key("warm")))
    no_active_until[0] = time.monotonic() + 1.5
    later = d.cmd("acquire", key=k2, lease=30, wait=6)
    w1 = d.cmd("acquire", key=k1, lease=30, wait=1)
    w0 = d.cmd("acquire", key=k0, lease=30, wait=0)
    line = d.result_line(later, 10)
    t = token_of(line.obj)
    assert d.elapsed(later, line) >= 1.3
    assert len(proxy.lines_up(f"A {k2} ")) >= 2, "M ... * is retried"
    assert lone.tokens(k2) == [int(t)]
    _ends(d, w1, ("no_connection",), 0.9, 4.5, "M * with wait 1: retried until the wait runs out")
    _ends(d, w0, ("no_connection",), 8.5, 13.5, "M * with wait 0: retried 10 s")
    assert len(proxy.lines_up(f"A {k0} ")) >= 2
    ok(d.call("release", key=k2, token=t))


def test_lost_when_lease_runs_out_on_a_paused_node(kind, node_factory, start_driver, key):
    box = node_factory()
    d = start_driver(box.address)
    kept, plain, e = key("kept"), key("plain"), key("e")
    tk = token_of(d.call("acquire", key=kept, lease=2, wait=5, keepalive=True))
    token_of(d.call("acquire", key=plain, lease=2, wait=5))
    te = token_of(d.call("campaign", election=e, value="paused-leader", lease=2))
    time.sleep(0.8)
    paused = time.monotonic()
    box.node.signal(signal.SIGSTOP)
    try:
        lost = d.event(kept, 2 + 3)
        lost_e = d.event(e, 2)
    finally:
        box.node.signal(signal.SIGCONT)
    assert lost.obj.get("token") == tk and lost_e.obj.get("token") == te
    for ln in (lost, lost_e):
        assert 0.9 <= ln.time - paused <= 2 + 1.5, \
            f"lost when the lease ran out while renewals failed: +{ln.time - paused:.2f}s"
    time.sleep(1.0)
    assert [o for o in d.events() if o.get("key") == plain] == [], "no keep-alive, no lost"
    assert len(d.events()) == 2, f"one lost event each: {d.events()}"
    wait_until(lambda: box.holders(kept) == [] and box.holders(e) == [], 5,
               "the node expired them once resumed")


def test_close_on_a_stalled_node_ends_in_time(kind, lone, start_driver, proxy_factory, key,
                                              raws):
    proxy = proxy_factory(lone.port)
    d = start_driver(proxy.address)
    busy, mine = key("busy"), key("mine")
    holder = lone.hold(busy)
    raws.append(holder)
    token_of(d.call("acquire", key=mine, lease=60, wait=5))
    waiting = d.cmd("acquire", key=busy, lease=30, wait=0)
    wait_until(lambda: lone.waiters(busy) == 1, 10, "the acquire queued")
    proxy.stall()
    close = d.cmd("close")
    line = d.result_line(close, 12)
    ok(line.obj)
    assert d.elapsed(close, line) <= 5 + 1.5, \
        f"held locks released best effort, within 5 s, then ok\n{d.describe()}"
    err(d.result(waiting, 1), "cancelled")
    assert d.wait_exit(5) == 0
    proxy.resume()


def test_keepalive_survives_dropped_connections(kind, lone, start_driver, proxy_factory, key):
    proxy = proxy_factory(lone.port)
    d = start_driver(proxy.address)
    k = key()
    t = token_of(d.call("acquire", key=k, lease=6, wait=5, keepalive=True))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    # Redials within 3 s, renewals every 2 s: the 6 s lease never runs out.
    proxy.cut_all()
    time.sleep(6.5)
    assert d.events() == [], "a drop with the node alive is no loss: renewals go on"
    assert [str(x) for x in lone.tokens(k)] == [t]
    renewed_after = [s for s, _, _ in proxy.lines_up(f"N {k} ")]
    assert len(renewed_after) >= 2
    ok(d.call("release", key=k, token=t))
