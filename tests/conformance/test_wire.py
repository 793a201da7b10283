"""
What each driver's client puts on the wire, watched (and faulted) through a
line proxy in front of a real lone node: the seconds grammar, tokens,
connections per address, round-robin, one A and one O per key per
connection, the withdrawal of a crossed grant, release retries,
reconnection, keep-alive cadence.
"""

from __future__ import annotations

import statistics
import time
from decimal import Decimal
from typing import List, Tuple

import pytest

from .conftest import LONG, wait_until
from .util import err, ok, same_seconds, seconds_field, token_of

pytestmark = pytest.mark.faults


def _fields(proxy, prefix: str) -> List[List[str]]:
    return [text.split(" ") for _, _, text in proxy.lines_up(prefix)]


def _one(proxy, prefix: str) -> List[str]:
    found = _fields(proxy, prefix)
    assert len(found) == 1, f"one line {prefix!r} expected on the wire, got {found}"
    return found[0]


def _through(proxy_factory, lone, start_driver, name=None):
    proxy = proxy_factory(lone.port)
    d = start_driver(proxy.address, name=name)
    return proxy, d


def test_seconds_grammar_on_the_wire(kind, lone, start_driver, proxy_factory, key, raws):
    proxy, d = _through(proxy_factory, lone, start_driver)
    cases: List[Tuple[str, float, float]] = [
        (key("a"), 30, 5),
        (key("b"), 0.5, 2.5),
        (key("c"), 1.2345674, 0.1),
        (key("d"), 1e-9, 1e-9),
        (key("e"), 1e-7, 0),
        (key("f"), 7.0000004, 2e-6),
        (key("g"), 86400, 86400),
    ]
    tokens = {}
    for k, lease, wait in cases:
        r = d.call("acquire", key=k, lease=lease, wait=wait, timeout=15)
        tokens[k] = token_of(r)
        f = _one(proxy, f"A {k} ")
        assert len(f) == 4, f"exclusive: no share field (or none needed): {f}"
        same_seconds(f[2], lease)
        same_seconds(f[3], wait, spent=0.05)
    # Above the node's maxima: sent as written (no exponent), rejected by the node.
    for k, lease, wait in ((key("big"), LONG + 0.5, 1), (key("huge"), 1e21, 1),
                           (key("hugewait"), 30, 1e21)):
        err(d.call("acquire", key=k, lease=lease, wait=wait, timeout=15), "rejected")
        for f in _fields(proxy, f"A {k} "):
            seconds_field(f[2])
            seconds_field(f[3])
    # renew, observe, campaign.
    k = cases[0][0]
    ok(d.call("renew", key=k, token=tokens[k], lease=12.5))
    f = _one(proxy, f"N {k} ")
    assert f[2] == tokens[k]
    same_seconds(f[3], 12.5)
    err(d.call("observe", key=k, token=tokens[k], wait=0.25), "timeout")
    f = _fields(proxy, f"O {k} ")[0]
    assert f[2] == tokens[k]
    same_seconds(f[3], 0.25, spent=0.05)
    e = key("elect")
    token_of(d.call("campaign", election=e, value="v", lease=2.5))
    f = _fields(proxy, f"A {e} ")[0]
    same_seconds(f[2], 2.5)
    assert Decimal(f[3]) == 0, f"a campaign waits without limit (wait 0): {f}"
    ok(d.call("resign", election=e))
    # A positive wait is never written as 0 (which would wait forever).
    held = key("held")
    holder = lone.hold(held)
    raws.append(holder)
    ident = d.cmd("acquire", key=held, lease=30, wait=1e-9)
    line = d.result_line(ident, 10)
    err(line.obj, "timeout")
    assert d.elapsed(ident, line) < 3
    same_seconds(_one(proxy, f"A {held} ")[3], 1e-9)
    ident = d.cmd("observe", key=held, token=str(holder.token), wait=1e-9)
    line = d.result_line(ident, 10)
    err(line.obj, "timeout")
    assert d.elapsed(ident, line) < 3
    same_seconds(_fields(proxy, f"O {held} ")[0][3], 1e-9)
    assert lone.waiters(held) == 0


def test_share_on_the_wire(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    kr, ks, k1 = key("r"), key("s"), key("one")
    tr = token_of(d.call("acquire", key=kr, lease=30, wait=5, share="r"))
    assert _one(proxy, f"A {kr} ")[4:] == ["r"]
    ts = token_of(d.call("acquire", key=ks, lease=30, wait=5, share=7))
    assert _one(proxy, f"A {ks} ")[4:] == ["7"]
    t1 = token_of(d.call("acquire", key=k1, lease=30, wait=5, share=1))
    assert _one(proxy, f"A {k1} ")[4:] in ([], ["1"])
    for k, t in ((kr, tr), (ks, ts), (k1, t1)):
        ok(d.call("release", key=k, token=t))
        assert _one(proxy, f"R {k} ") == ["R", k, t], "release carries the exact token"


def test_server_tokens_exact_to_2_64(kind, lone, start_driver, proxy_factory, key):
    """
    Tokens up to 2^64-1 go through exactly, both ways (the proxy answers
    for two keys with tokens a float64 cannot hold).
    """
    proxy, d = _through(proxy_factory, lone, start_driver)
    big = {key("max"): "18446744073709551615", key("odd"): "9007199254740993"}

    def answer(line: str):
        f = line.split(" ")
        if len(f) >= 2 and f[1] in big:
            t = big[f[1]]
            return {"A": f"A {f[1]} {t}", "R": f"R {f[1]} OK", "N": f"N {f[1]} OK",
                    "O": f"O {f[1]} {t} someone#1", "C": f"C {f[1]} NONE"}.get(f[0])
        return None

    proxy.answer_with(answer)
    for k, t in big.items():
        r = d.call("acquire", key=k, lease=30, wait=5)
        assert token_of(r) == t, f"token {t} must come back exactly, got {r}"
        ok(d.call("renew", key=k, token=t, lease=30))
        assert _one(proxy, f"N {k} ")[2] == t
        r = d.call("observe", key=k, token="0", wait=5)
        assert token_of(r) == t and r.get("holder") == "someone#1", r
        ok(d.call("release", key=k, token=t))
        assert _one(proxy, f"R {k} ") == ["R", k, t]


def test_two_connections_per_address_round_robin(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    keys = [key(f"rr{i}") for i in range(10)]
    ok(d.call("leader", election=key("warm")))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "two connections to the one address")
    tokens = [token_of(d.call("acquire", key=k, lease=30, wait=5)) for k in keys]
    for k, t in zip(keys, tokens, strict=True):
        ok(d.call("release", key=k, token=t))
    time.sleep(0.5)
    assert len(proxy.all_links()) == 2 and len(proxy.open_links()) == 2, \
        f"exactly two connections, kept: {[(lk.n, lk.open) for lk in proxy.all_links()]}"
    for op in ("A", "R"):
        per_link = {}
        for _, n, text in proxy.lines_up(op + " "):
            if text.split(" ")[1] in keys:
                per_link[n] = per_link.get(n, 0) + 1
        assert len(per_link) == 2 and min(per_link.values()) >= 4, \
            f"{op} requests round-robin over both connections: {per_link}"


def test_one_connection_per_address_when_several(kind, lone, start_driver, proxy_factory, key):
    proxies = [proxy_factory(lone.port) for _ in range(3)]
    d = start_driver(",".join(p.address for p in proxies))
    for i in range(6):
        k = key(f"k{i}")
        t = token_of(d.call("acquire", key=k, lease=30, wait=5))
        ok(d.call("release", key=k, token=t))
    wait_until(lambda: all(len(p.open_links()) == 1 for p in proxies), 8,
               "one connection to each address")
    time.sleep(0.5)
    assert [len(p.all_links()) for p in proxies] == [1, 1, 1]


def _max_outstanding(proxy, op: str, k: str) -> Tuple[int, int]:
    """
    The most requests C{op} of key C{k} in flight at once on one
    connection, and how many connections carried one.
    """
    answers = {"A": ("A", "T", "E A", "M A"), "O": ("O", "E O", "M O")}[op]
    worst, carriers = 0, 0
    for link in proxy.all_links():
        out, used = 0, False
        for direction, _, text in link.both:
            f = text.split(" ")
            if direction == "up" and f[0] == op and len(f) > 1 and f[1] == k:
                out += 1
                used = True
                worst = max(worst, out)
            elif direction == "down":
                for a in answers:
                    head = a.split(" ")
                    if f[:len(head)] == head and len(f) > len(head) and f[len(head)] == k:
                        out -= 1
                        break
        carriers += used
    return worst, carriers


def test_one_outstanding_A_and_O_per_key_per_connection(kind, lone, start_driver,
                                                        proxy_factory, key, raws):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    acquires = [d.cmd("acquire", key=k, lease=30, wait=2.0) for _ in range(4)]
    observes = [d.cmd("observe", key=k, token=str(holder.token), wait=2.0) for _ in range(3)]
    for ident in acquires:
        err(d.result(ident, 12), "timeout")
    for ident in observes:
        err(d.result(ident, 12), "timeout")
    worst, carriers = _max_outstanding(proxy, "A", k)
    assert worst == 1, f"at most one outstanding A per key per connection, saw {worst}"
    assert carriers == 2, "more acquires of one key use the other connection"
    worst, carriers = _max_outstanding(proxy, "O", k)
    assert worst == 1, f"at most one outstanding O per key per connection, saw {worst}"
    assert carriers == 2, "more observes of one key use the other connection"
    assert lone.waiters(k) == 0


@pytest.mark.parametrize("op", ["acquire", "campaign"])
def test_cancel_after_crossed_grant_releases_it(kind, op, lone, start_driver, proxy_factory,
                                                key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    ok(d.call("leader", election=key("warm")))  # connections up
    # The node's answers about k are held back (the others pass).
    proxy.hold_down(lambda line: line.split(" ")[1:2] == [k])
    if op == "acquire":
        target = d.cmd("acquire", key=k, lease=60, wait=10)
    else:
        target = d.cmd("campaign", election=k, value="crossed", lease=60)
    wait_until(lambda: len(lone.holders(k)) == 1, 10, "the node granted (answer held back)")
    granted = lone.tokens(k)[0]
    cancel = d.cmd("cancel", target=target)
    wait_until(lambda: proxy.lines_up(f"C {k}"), 5, "the client withdraws with C at once")
    time.sleep(0.3)
    proxy.release_down()
    done = d.result_line(cancel, 10)
    ok(done.obj)
    mine = d.result_line(target, 1)
    assert mine.index < done.index, "the target's result comes before the cancel's ok"
    if mine.obj.get("ok"):
        assert token_of(mine.obj) == str(granted)
    else:
        err(mine.obj, "cancelled")
    try:
        wait_until(lambda: lone.holders(k) == [], 5, "the crossed grant released (no lock leaks)")
    except AssertionError as e:
        wire = [(lk.n, [t for _, _, t in lk.both if k in t]) for lk in proxy.all_links()]
        raise AssertionError(f"{e}: the node holds {lone.holders(k)}; the wire about the key: "
                             f"{[w for w in wire if w[1]]}\n{d.describe()}") from None
    assert [f[2] for f in _fields(proxy, f"R {k} ")][:1] == [str(granted)]
    types = [e["type"] for e in lone.events(k)]
    assert "release" in types and "expiry" not in types, types
    # No lost event: the client released it itself.
    assert d.events() == []


def test_release_retried_on_the_other_connection(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    t = token_of(d.call("acquire", key=k, lease=60, wait=5))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    proxy.cut_on_line(lambda line: line.startswith(f"R {k} "), times=1)
    ident = d.cmd("release", key=k, token=t)
    line = d.result_line(ident, 10)
    ok(line.obj)
    assert d.elapsed(ident, line) < 2.0, "a dropped release is retried (200 ms), not lost"
    assert lone.holders(k) == []
    sent = proxy.lines_up(f"R {k} ")
    assert len(sent) >= 2 and sent[0][1] != sent[1][1], \
        f"the retry goes on another connection: {sent}"
    assert sent[1][0] - sent[0][0] <= 0.7, f"retried at 200 ms: {sent}"


def test_release_gives_up_after_5s_of_retries(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    t = token_of(d.call("acquire", key=k, lease=60, wait=5))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    # Every connection that carries the release is cut: the node never gets it.
    proxy.cut_on_line(lambda line: line.startswith(f"R {k} "))
    ident = d.cmd("release", key=k, token=t)
    line = d.result_line(ident, 15)
    err(line.obj, "no_connection")
    took = d.elapsed(ident, line)
    assert 4.5 <= took <= 8.0, f"no_connection after 5 s of retries, took {took:.2f}s"
    time.sleep(1.0)
    sent = proxy.lines_up(f"R {k} ")
    first = sent[0][0]
    assert len(sent) >= 3, f"retried: {[(round(s - first, 2), n) for s, n, _ in sent]}"
    assert sent[1][0] - first <= 0.7, "the first retry comes at 200 ms"
    assert sent[-1][0] - first <= 5.6, "no retry after the 5 s"
    # Every connection that came up during the retries got the release promptly.
    for link in proxy.all_links():
        if first < link.accepted < first + 4.5:
            carried = [s for s, n, _ in sent if n == link.n]
            assert carried and carried[0] - link.accepted <= 0.7, \
                f"link {link.n} up at +{link.accepted - first:.2f}s carried no prompt retry"
    assert lone.tokens(k) == [int(t)]


def test_reconnect_and_down_connection_skipped(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    ok(d.call("leader", election=key("warm")))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    victim = proxy.open_links()[0]
    cut_at = time.monotonic()
    proxy.cut(victim)
    for i in range(4):  # the down connection is skipped: no error, no wait
        ident = d.cmd("acquire", key=key(f"k{i}"), lease=30, wait=5)
        line = d.result_line(ident, 10)
        token_of(line.obj)
        assert d.elapsed(ident, line) < 1.5
    new = wait_until(lambda: [lk for lk in proxy.all_links() if lk.accepted > cut_at], 6,
                     "a redial of the cut connection")
    assert new[0].accepted - cut_at <= 5.0
    time.sleep(0.3)
    assert len(proxy.open_links()) == 2

    # A node that closes every connection is redialled every 3 s, not in a loop.
    proxy.set_refuse(True)
    refused_from = time.monotonic()
    proxy.cut_all()
    time.sleep(7.0)
    attempts = [t for t in proxy.refused if t >= refused_from]
    assert 2 <= len(attempts) <= 8, \
        f"redials every 3 s per connection: {[round(t - refused_from, 2) for t in attempts]}"
    proxy.set_refuse(False)
    back = time.monotonic()
    wait_until(lambda: len(proxy.open_links()) == 2, 8, "both connections back")
    assert time.monotonic() - back <= 6.5
    t = token_of(d.call("acquire", key=key("after"), lease=30, wait=5))
    assert t


def test_keepalive_cadence_on_the_wire(kind, lone, start_driver, proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    ident = d.cmd("acquire", key=k, lease=1.5, wait=5, keepalive=True)
    line = d.result_line(ident, 10)
    t = token_of(line.obj)
    time.sleep(3.2)
    renewals = proxy.lines_up(f"N {k} ")
    times = [s for s, _, _ in renewals]
    assert 4 <= len(renewals) <= 12, f"every third of the lease: {len(renewals)} in 3.2 s"
    assert 0.2 <= times[0] - line.time <= 1.0, f"first renewal {times[0] - line.time:.2f}s"
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    assert 0.3 <= statistics.median(gaps) <= 0.8, gaps
    for _, _, text in renewals:
        f = text.split(" ")
        assert f[2] == t
        same_seconds(f[3], 1.5)
    assert [str(x) for x in lone.tokens(k)] == [t]
    ok(d.call("release", key=k, token=t))
    count = len(proxy.lines_up(f"N {k} "))
    time.sleep(1.0)
    assert len(proxy.lines_up(f"N {k} ")) == count, "no renewal after the release"


def test_acquire_moves_to_the_next_connection_on_a_drop(kind, lone, start_driver,
                                                        proxy_factory, key, raws):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    ok(d.call("leader", election=key("warm")))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    waiting = d.cmd("acquire", key=k, lease=30, wait=15)
    wait_until(lambda: lone.waiters(k) == 1, 10, "the acquire queued")
    carrier = [lk for lk in proxy.all_links() if any(t.startswith(f"A {k} ") for _, t in lk.up)]
    assert len(carrier) == 1
    proxy.cut(carrier[0])
    wait_until(lambda: len({n for _, n, _ in proxy.lines_up(f"A {k} ")}) == 2, 5,
               "the acquire re-sent on the other connection")
    wait_until(lambda: lone.waiters(k) == 1, 5, "queued again")
    assert d.results_for(waiting) == []
    holder.release()
    t = token_of(d.result(waiting, 10))
    assert lone.tokens(k) == [int(t)]
    ok(d.call("release", key=k, token=t))


def test_acquire_fails_after_as_many_drops_as_connections(kind, lone, start_driver,
                                                          proxy_factory, key):
    proxy, d = _through(proxy_factory, lone, start_driver)
    k = key()
    ok(d.call("leader", election=key("warm")))
    wait_until(lambda: len(proxy.open_links()) == 2, 5, "both connections up")
    proxy.cut_on_line(lambda line: line.startswith(f"A {k} "))
    ident = d.cmd("acquire", key=k, lease=30, wait=5)
    line = d.result_line(ident, 13)
    err(line.obj, "no_connection")
    assert d.elapsed(ident, line) <= 10 + 1.5
    tries = proxy.lines_up(f"A {k} ")
    assert len({n for _, n, _ in tries}) >= 2, \
        f"an error only after as many tries as connections: {tries}"
    assert lone.holders(k) == [] and lone.waiters(k) == 0
