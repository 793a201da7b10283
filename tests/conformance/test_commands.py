"""
Every driver command and its results against one real lone node (shared by
the module; each test uses its own keys), checked against what the node saw
(/locks, /events, /status).
"""

from __future__ import annotations

import json
import time

from .conftest import LONG, wait_until
from .util import err, ok, token_of, value_of

# -- acquire / release ------------------------------------------------------------------


def test_acquire_release_token_is_exact_decimal_string(kind, lone, start_driver, key):
    k1, k2 = key("a"), key("b")
    d = start_driver(lone.address, name="conf-a")
    line = d.result_line(d.cmd("acquire", key=k1, lease=30, wait=5, share=None,
                               keepalive=False), 15)
    t1 = token_of(line.obj)
    assert f'"token": "{t1}"' in line.raw or f'"token":"{t1}"' in line.raw, line.raw
    assert int(t1) > 2**53, f"the node's tokens are µs timestamps, above 2^53: {t1}"
    held = lone.holders(k1)
    assert [str(h["token"]) for h in held] == [t1], f"node holds {held}, driver said {t1}"
    assert value_of(held[0]["holder"]) == "conf-a", held
    assert lone.lock(k1)["kind"] == "exclusive"

    # share and keepalive omitted: exclusive, no keep-alive.
    t2 = token_of(d.call("acquire", key=k2, lease=30, wait=5))
    assert int(t2) > int(t1)
    assert lone.lock(k2)["kind"] == "exclusive"
    assert [str(t) for t in lone.tokens(k2)] == [t2]

    ok(d.call("release", key=k1, token=t1))
    assert lone.holders(k1) == []
    released = [e for e in lone.events(k1) if e["type"] == "release"]
    assert [str(e["token"]) for e in released] == [t1]
    err(d.call("release", key=k1, token=t1), "stale")
    err(d.call("release", key=k1, token="0"), "stale")
    err(d.call("release", key=k2, token=str(int(t2) + 1)), "stale")
    assert [str(t) for t in lone.tokens(k2)] == [t2], "a stale release changed nothing"
    # Any client may observe, renew or release a grant by its token.
    other = start_driver(lone.address)
    r = other.call("observe", key=k2, token="0", wait=5)
    assert token_of(r) == t2 and value_of(r.get("holder")) == "conf-a", r
    ok(other.call("renew", key=k2, token=t2, lease=40))
    ok(other.call("release", key=k2, token=t2))
    assert lone.holders(k2) == []
    err(d.call("release", key=k2, token=t2), "stale")


def test_acquire_timeout_leaves_nothing_queued(kind, lone, start_driver, key, raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    ident = d.cmd("acquire", key=k, lease=30, wait=0.6)
    line = d.result_line(ident, 10)
    err(line.obj, "timeout")
    assert 0.5 <= d.elapsed(ident, line) <= 3.6, d.elapsed(ident, line)
    assert lone.waiters(k) == 0
    assert lone.tokens(k) == [holder.token]
    # Nothing leaks: the holder's release leaves the key free.
    assert holder.release() == f"R {k} OK"
    time.sleep(0.3)
    assert lone.holders(k) == []


def test_cancel_withdraws_with_C_and_answers_after_the_target(kind, lone, start_driver, key,
                                                              raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    target = d.cmd("acquire", key=k, lease=30, wait=0)
    wait_until(lambda: lone.waiters(k) == 1, 10, "the driver's acquire queued on the node")
    before = lone.status()
    cancel = d.cmd("cancel", target=target)
    done = d.result_line(cancel, 10)
    ok(done.obj)
    mine = d.result_line(target, 1)
    err(mine.obj, "cancelled")
    assert mine.index < done.index, "the target's result must come before the cancel's ok"
    wait_until(lambda: lone.waiters(k) == 0, 5, "the withdrawn acquire left the queue")
    after = lone.status()
    assert after["withdrawals"] == before["withdrawals"] + 1, \
        "the acquire was not withdrawn with C (the node counts no withdrawal)"
    assert after["waiters_dropped"] == before["waiters_dropped"], \
        "the waiter went with a closed connection, not a C"
    # Nothing leaks: once the holder releases, nobody holds the key.
    assert holder.release() == f"R {k} OK"
    time.sleep(0.5)
    assert lone.holders(k) == []
    assert d.results_for(target) == [mine], "one result per command"


def test_cancel_acquires_queued_in_the_client(kind, lone, start_driver, key, raws):
    """
    Three acquires of one key: two on the node (one per connection), one
    waiting its turn in the client; cancelling all leaks nothing.
    """
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    targets = [d.cmd("acquire", key=k, lease=30, wait=0) for _ in range(3)]
    wait_until(lambda: lone.waiters(k) == 2, 10, "two acquires queued on the node")
    time.sleep(0.3)
    for target in targets:
        cancel = d.cmd("cancel", target=target)
        done = d.result_line(cancel, 10)
        ok(done.obj)
        mine = d.result_line(target, 1)
        err(mine.obj, "cancelled")
        assert mine.index < done.index
    wait_until(lambda: lone.waiters(k) == 0, 5, "every acquire withdrawn")
    holder.release()
    time.sleep(0.5)
    assert lone.holders(k) == [], "a cancelled acquire was granted"


def test_cancel_unknown_and_finished_targets(kind, lone, start_driver, key):
    k = key()
    d = start_driver(lone.address)
    err(d.call("cancel", target=987654), "unknown_target")
    err(d.call("cancel", target="no-such-command"), "unknown_target")
    acquired = d.cmd("acquire", key=k, lease=30, wait=5)
    token = token_of(d.result(acquired, 15))
    err(d.call("cancel", target=acquired), "unknown_target")
    observed = d.cmd("observe", key=k, token="0", wait=5)
    ok(d.result(observed, 10))
    err(d.call("cancel", target=observed), "unknown_target")
    assert lone.tokens(k) == [int(token)], "cancelling a finished acquire changed nothing"
    ok(d.call("release", key=k, token=token))


def test_ids_echoed_as_given(kind, lone, start_driver, key, raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    for ident in (0, -7, 123456789, "abc", "", "ключ 1", "7"):
        r = d.result(d.send({"id": ident, "op": "leader", "election": key("e")}), 10)
        assert type(r["id"]) is type(ident) and r["id"] == ident, r
        ok(r)
    # 9 and "9" are two commands: cancelling "9" leaves 9 pending.
    d.send({"id": 9, "op": "acquire", "key": k, "lease": 30, "wait": 0})
    d.send({"id": "9", "op": "acquire", "key": k, "lease": 30, "wait": 0})
    wait_until(lambda: lone.waiters(k) == 2, 10, "both acquires queued")
    ok(d.result(d.send({"id": "c1", "op": "cancel", "target": "9"}), 10))
    err(d.result("9", 1), "cancelled")
    d.no_line(lambda o: o.get("id") == 9, 0.5)
    ok(d.result(d.send({"id": "c2", "op": "cancel", "target": 9}), 10))
    err(d.result(9, 1), "cancelled")
    # A bad command's result echoes its id too.
    r = d.result(d.send({"id": "bad", "op": "no-such-op"}), 10)
    err(r, "bad_command")


def test_large_integer_id_echoed_exactly(kind, lone, start_driver, key):
    d = start_driver(lone.address)
    big = 2**53 + 1
    d.send_raw(json.dumps({"id": big, "op": "leader", "election": key("e")}))
    line = d.wait_line(lambda o: o.get("id") in (big, big - 1, big + 1), 10, "the result")
    assert line.obj["id"] == big and f"{big}" in line.raw, \
        f"id {big} (a JSON integer) must be echoed as given, got {line.raw}"


def test_concurrent_commands_do_not_wait_for_each_other(kind, lone, start_driver, key, raws):
    k, other = key("held"), key("free")
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    blocked = d.cmd("acquire", key=k, lease=30, wait=0)
    wait_until(lambda: lone.waiters(k) == 1, 10, "the acquire queued")
    ident = d.cmd("acquire", key=other, lease=30, wait=5)
    line = d.result_line(ident, 10)
    token = token_of(line.obj)
    assert d.elapsed(ident, line) < 3, "a later command waited for an earlier one"
    ok(d.call("release", key=other, token=token))
    assert d.results_for(blocked) == []
    # Released by the holder: the blocked acquire is granted now.
    holder.release()
    granted = token_of(d.result(blocked, 10))
    assert lone.tokens(k) == [int(granted)]
    ok(d.call("release", key=k, token=granted))


# -- rejected ---------------------------------------------------------------------------


def test_acquire_rejected_on_kind_mismatch(kind, lone, start_driver, key):
    sem, rw = key("sem"), key("rw")
    d = start_driver(lone.address)
    t = token_of(d.call("acquire", key=sem, lease=30, wait=5, share=3))
    assert lone.lock(sem)["kind"] == "semaphore" and lone.lock(sem)["slots"] == 3
    for share in (None, "r", 2, 1):
        r = err(d.call("acquire", key=sem, lease=30, wait=5, share=share), "rejected")
        assert isinstance(r.get("message"), str)
    assert lone.tokens(sem) == [int(t)] and lone.waiters(sem) == 0, "a mismatch changed nothing"
    # The same kind is granted beside it (a second slot).
    t2 = token_of(d.call("acquire", key=sem, lease=30, wait=5, share=3))
    assert sorted(lone.tokens(sem)) == sorted([int(t), int(t2)])

    r1 = token_of(d.call("acquire", key=rw, lease=30, wait=5, share="r"))
    r2 = token_of(d.call("acquire", key=rw, lease=30, wait=5, share="r"))
    modes = {h["mode"] for h in lone.holders(rw)}
    assert modes == {"reader"} and sorted(lone.tokens(rw)) == sorted([int(r1), int(r2)])
    err(d.call("acquire", key=rw, lease=30, wait=5, share=5), "rejected")
    # A writer of a read key is its kind: it waits (and times out here).
    err(d.call("acquire", key=rw, lease=30, wait=0.3, share=1), "timeout")
    for k, tok in ((sem, t), (sem, t2), (rw, r1), (rw, r2)):
        ok(d.call("release", key=k, token=tok))


def test_acquire_rejected_by_a_limit(kind, lone, start_driver, key, raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    for _ in range(3):  # the node's --max-waiters 3
        c = lone.raw()
        raws.append(c)
        c.send(f"A {k} 30 0\n".encode())
    wait_until(lambda: lone.waiters(k) == 3, 10, "three waiters queued")
    d = start_driver(lone.address)
    ident = d.cmd("acquire", key=k, lease=30, wait=5)
    line = d.result_line(ident, 10)
    err(line.obj, "rejected")
    assert d.elapsed(ident, line) < 3, "a limit is an answer, not a timeout"
    assert lone.waiters(k) == 3


def test_server_maxima_are_rejected_not_invalid(kind, lone, start_driver, key):
    k = key()
    d = start_driver(lone.address)
    above = LONG + 1000  # the node's --max-lease and --max-wait are LONG
    err(d.call("acquire", key=k, lease=above, wait=5), "rejected")
    err(d.call("acquire", key=k, lease=30, wait=above), "rejected")
    err(d.call("campaign", election=k, value="v", lease=above), "rejected")
    assert lone.holders(k) == []
    t = token_of(d.call("acquire", key=k, lease=30, wait=5))
    err(d.call("renew", key=k, token=t, lease=above), "rejected")
    ok(d.call("release", key=k, token=t))


def test_waits_and_leases_beyond_24_days(kind, lone, start_driver, key, raws):
    """
    Waits and leases the node allows (its --max-wait/--max-lease are LONG)
    but a 32-bit millisecond timer cannot hold: nothing ends early.
    """
    k, kept, watched = key("held"), key("kept"), key("watched")
    long = LONG - 500_000  # 29 days
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    waiting = d.cmd("acquire", key=k, lease=30, wait=long)
    observing = d.cmd("observe", key=k, token=str(holder.token), wait=long)
    t = token_of(d.call("acquire", key=kept, lease=long, wait=5, keepalive=True))
    tw = token_of(d.call("acquire", key=watched, lease=long, wait=long))
    time.sleep(1.5)
    early = d.results_for(waiting) + d.results_for(observing)
    assert early == [], f"a wait of 29 days must not end in 1.5 s: {[ln.obj for ln in early]}"
    assert lone.waiters(k) == 1, "the long acquire waits on the node"
    assert d.events() == [], "a lease of 29 days is not lost in 1.5 s"
    assert lone.holders(kept)[0]["remaining_seconds"] > long - 100
    holder.release()
    granted = token_of(d.result(waiting, 10))
    r = d.result(observing, 10)
    assert token_of(r) in ("0", granted), r
    ok(d.call("release", key=k, token=granted))
    ok(d.call("release", key=kept, token=t))
    ok(d.call("release", key=watched, token=tw))


# -- renew --------------------------------------------------------------------------------


def test_renew_ok_stale(kind, lone, start_driver, key):
    k = key()
    d = start_driver(lone.address)
    t = token_of(d.call("acquire", key=k, lease=5, wait=5))
    ok(d.call("renew", key=k, token=t, lease=100))
    held = lone.holders(k)
    assert [str(h["token"]) for h in held] == [t], "a renewal keeps the token"
    assert held[0]["remaining_seconds"] > 90, held
    assert held[0]["renewals"] >= 1
    err(d.call("renew", key=k, token="0", lease=30), "stale")
    err(d.call("renew", key=k, token=str(int(t) - 1), lease=30), "stale")
    ok(d.call("release", key=k, token=t))
    err(d.call("renew", key=k, token=t, lease=30), "stale")
    assert lone.holders(k) == []


# -- observe ------------------------------------------------------------------------------


def test_observe_ok_timeout_change(kind, lone, start_driver, key, raws):
    k, anon, free = key("named"), key("anon"), key("free")
    holder = lone.hold(k, name="watched-app#inst42")
    anonymous = lone.hold(anon)
    raws.extend([holder, anonymous])
    d = start_driver(lone.address)

    r = d.call("observe", key=k, token="0", wait=5)
    assert token_of(r) == str(holder.token)
    assert r.get("holder") == "watched-app#inst42", r

    r = d.call("observe", key=anon, token="0", wait=5)
    assert token_of(r) == str(anonymous.token)
    assert "holder" in r and r["holder"] is None, f"holder must be null for '-': {r}"

    r = d.call("observe", key=free, token="12345", wait=5)
    assert token_of(r) == "0" and r.get("holder") is None, r

    # Nothing changes: timeout, repeating the token sent.
    ident = d.cmd("observe", key=k, token=str(holder.token), wait=0.8)
    line = d.result_line(ident, 10)
    err(line.obj, "timeout")
    assert line.obj.get("token") == str(holder.token), line.obj
    assert 0.7 <= d.elapsed(ident, line) <= 3.8
    ident = d.cmd("observe", key=free, token="0", wait=0.5)
    line = d.result_line(ident, 10)
    err(line.obj, "timeout")
    assert line.obj.get("token") == "0"

    # A change answers at once: the release.
    ident = d.cmd("observe", key=k, token=str(holder.token), wait=20)
    wait_until(lambda: lone.status()["observers"] >= 1, 10, "the observer waits on the node")
    time.sleep(0.2)
    assert d.results_for(ident) == []
    released = time.monotonic()
    assert holder.release() == f"R {k} OK"
    line = d.result_line(ident, 10)
    assert token_of(line.obj) == "0" and line.obj.get("holder") is None, line.obj
    assert line.time - released < 2


def test_observe_newest_token_can_fall_on_a_shared_key(kind, lone, start_driver, key, raws):
    k = key()
    first = lone.hold(k, share="r", name="reader-one")
    second = lone.hold(k, share="r", name="reader-two")
    raws.extend([first, second])
    assert second.token > first.token
    d = start_driver(lone.address)
    r = d.call("observe", key=k, token="0", wait=5)
    assert token_of(r) == str(second.token) and r.get("holder") == "reader-two", r
    waiting = d.cmd("observe", key=k, token=str(second.token), wait=20)
    time.sleep(0.5)
    # Releasing the older reader leaves the newest grant as it was: no answer.
    assert first.release() == f"R {k} OK"
    time.sleep(0.5)
    assert d.results_for(waiting) == []
    third = lone.hold(k, share="r", name="reader-three")
    raws.append(third)
    r = d.result(waiting, 10)
    assert token_of(r) == str(third.token) and r.get("holder") == "reader-three", r
    # The newest reader leaves: the newest token falls, and that is a change.
    waiting = d.cmd("observe", key=k, token=str(third.token), wait=20)
    time.sleep(0.3)
    assert third.release() == f"R {k} OK"
    r = d.result(waiting, 10)
    assert token_of(r) == str(second.token) and r.get("holder") == "reader-two", r


def test_observe_rejected_by_max_observers(kind, lone, start_driver, key, raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    for _ in range(2):  # the node's --max-observers 2
        c = lone.raw()
        raws.append(c)
        c.send(f"O {k} {holder.token} 0\n".encode())
    wait_until(lambda: lone.status()["observers"] >= 2, 10, "two observers wait")
    d = start_driver(lone.address)
    err(d.call("observe", key=k, token=str(holder.token), wait=5), "rejected")


def test_cancel_pending_observe(kind, lone, start_driver, key, raws):
    k = key()
    holder = lone.hold(k)
    raws.append(holder)
    d = start_driver(lone.address)
    target = d.cmd("observe", key=k, token=str(holder.token), wait=0)
    time.sleep(0.5)
    cancel = d.cmd("cancel", target=target)
    done = d.result_line(cancel, 10)
    ok(done.obj)
    mine = d.result_line(target, 1)
    err(mine.obj, "cancelled")
    assert mine.index < done.index
    # The driver is still usable for the key.
    r = d.call("observe", key=k, token="0", wait=5)
    assert token_of(r) == str(holder.token)


# -- elections ----------------------------------------------------------------------------


def test_campaign_leader_resign(kind, lone, start_driver, key):
    e = key("e")
    a = start_driver(lone.address, name="driver-a")
    b = start_driver(lone.address, name="driver-b")
    r = a.call("leader", election=e)
    ok(r)
    assert r.get("value") is None and r.get("token") == "0", r

    ta = token_of(a.call("campaign", election=e, value="node-a", lease=1.5))
    held = lone.holders(e)
    assert [str(h["token"]) for h in held] == [ta]
    assert value_of(held[0]["holder"]) == "node-a", \
        f"the campaign value must be the holder name's value: {held[0]['holder']!r}"
    r = b.call("leader", election=e)
    assert r.get("value") == "node-a" and r.get("token") == ta, r

    pending = b.cmd("campaign", election=e, value="node-b", lease=1.5)
    # Keep-alive: a leads past its 1.5 s lease, same token.
    time.sleep(2.5)
    assert b.results_for(pending) == []
    assert lone.tokens(e) == [int(ta)], "the leader's keep-alive must hold the election"
    assert a.events() == []

    ok(a.call("resign", election=e))
    tb = token_of(b.result(pending, 10))
    assert int(tb) > int(ta)
    r = a.call("leader", election=e)
    assert r.get("value") == "node-b" and r.get("token") == tb, r
    assert value_of(lone.holders(e)[0]["holder"]) == "node-b"
    ok(b.call("resign", election=e))
    wait_until(lambda: lone.holders(e) == [], 5, "the election is free after resign")
    r = b.call("leader", election=e)
    assert r.get("value") is None and r.get("token") == "0", r
    ok(a.call("resign", election=e))  # not leading: nothing to do
    assert a.events() == [] and b.events() == [], "a resignation is not a loss"


def test_campaign_values(kind, lone, start_driver, key):
    e = key("e")
    d = start_driver(lone.address, name="drv")
    for bad in ("", "a b", " ", "tab\there", "nl\nx", "ctl\u0001", "del\u007f", "c1\u0085",
                "x" * 250):
        ident = d.cmd("campaign", election=e, value=bad, lease=5)
        line = d.result_line(ident, 10)
        err(line.obj, "invalid")
        assert d.elapsed(ident, line) < 3
    assert lone.holders(e) == [] and lone.waiters(e) == 0, "an invalid campaign sent nothing"
    # '#' is allowed in a value: the name's value is before its last '#'.
    t = token_of(d.call("campaign", election=e, value="a#b", lease=10))
    r = d.call("leader", election=e)
    assert r.get("value") == "a#b" and r.get("token") == t, r
    ok(d.call("resign", election=e))
    t = token_of(d.call("campaign", election=e, value="узел-1", lease=10))
    r = d.call("leader", election=e)
    assert r.get("value") == "узел-1" and r.get("token") == t, r
    ok(d.call("resign", election=e))


def test_campaign_value_length_counts_the_instance_id_in_bytes(kind, lone, start_driver, key):
    e = key("e")
    d = start_driver(lone.address)
    token_of(d.call("campaign", election=e, value="v", lease=10))
    name = lone.holders(e)[0]["holder"]
    assert name.startswith("v#"), f"official clients name connections value#<instance id>: {name}"
    suffix = name[1:]  # "#<instance id>"
    ok(d.call("resign", election=e))
    room = 250 - len(suffix.encode())  # bytes left for the value
    for fill in ("x", "é"):
        longest = fill * (room // len(fill.encode())) + "y" * (room % len(fill.encode()))
        assert len(longest.encode()) == room
        t = token_of(d.call("campaign", election=e, value=longest, lease=10))
        assert lone.holders(e)[0]["holder"] == longest + suffix
        r = d.call("leader", election=e)
        assert r.get("value") == longest and r.get("token") == t
        ok(d.call("resign", election=e))
        wait_until(lambda: lone.holders(e) == [], 5, "resigned")
        over = longest + "z"
        err(d.call("campaign", election=e, value=over, lease=10), "invalid")
        assert lone.holders(e) == [] and lone.waiters(e) == 0


def test_campaign_names_stay_with_their_campaigns(kind, lone, start_driver, key):
    """
    Two campaigns of one driver with different values, and plain acquires
    beside them: each grant carries its own name's value.
    """
    e1, e2, k = key("e1"), key("e2"), key("plain")
    d = start_driver(lone.address, name="plain-name")
    c1 = d.cmd("campaign", election=e1, value="value-one", lease=10)
    c2 = d.cmd("campaign", election=e2, value="value-two", lease=10)
    t1, t2 = token_of(d.result(c1, 10)), token_of(d.result(c2, 10))
    tk = token_of(d.call("acquire", key=k, lease=30, wait=5))
    assert value_of(lone.holders(e1)[0]["holder"]) == "value-one"
    assert value_of(lone.holders(e2)[0]["holder"]) == "value-two"
    assert value_of(lone.holders(k)[0]["holder"]) == "plain-name", \
        "an acquire is not named after a campaign's value"
    for e, v, t in ((e1, "value-one", t1), (e2, "value-two", t2)):
        r = d.call("leader", election=e)
        assert r.get("value") == v and r.get("token") == t, r
    ok(d.call("resign", election=e1))
    assert lone.holders(e1) == [] and [str(x) for x in lone.tokens(e2)] == [t2]
    ok(d.call("resign", election=e2))
    ok(d.call("release", key=k, token=tk))


def test_campaign_rejected_and_cancelled(kind, lone, start_driver, key, raws):
    sem, e = key("sem"), key("e")
    holder = lone.hold(sem, share="3")
    raws.append(holder)
    d = start_driver(lone.address)
    err(d.call("campaign", election=sem, value="v", lease=5), "rejected")
    anonymous = lone.hold(key("anon"))
    raws.append(anonymous)
    r = d.call("leader", election=anonymous.key)
    assert r.get("value") is None and r.get("token") == str(anonymous.token), \
        f"a leader whose name is '-': value null, its token: {r}"
    plain = lone.hold(key("plain"), name="no-hash-name")
    raws.append(plain)
    r = d.call("leader", election=plain.key)
    assert r.get("value") == "no-hash-name" and r.get("token") == str(plain.token), r
    leader = lone.hold(e, name="boss#1")
    raws.append(leader)
    r = d.call("leader", election=e)
    assert r.get("value") == "boss" and r.get("token") == str(leader.token), r
    target = d.cmd("campaign", election=e, value="v", lease=5)
    wait_until(lambda: lone.waiters(e) == 1, 10, "the campaign queued")
    cancel = d.cmd("cancel", target=target)
    done = d.result_line(cancel, 10)
    ok(done.obj)
    mine = d.result_line(target, 1)
    err(mine.obj, "cancelled")
    assert mine.index < done.index
    wait_until(lambda: lone.waiters(e) == 0, 5, "the campaign left the queue")
    leader.release()
    time.sleep(0.5)
    assert lone.holders(e) == [], "a cancelled campaign must not lead"


# -- keep-alive and lost ------------------------------------------------------------------


def test_keepalive_renews_and_plain_lease_expires(kind, lone, start_driver, key):
    kept, plain = key("kept"), key("plain")
    d = start_driver(lone.address)
    tk = token_of(d.call("acquire", key=kept, lease=1.2, wait=5, keepalive=True))
    tp = token_of(d.call("acquire", key=plain, lease=1.0, wait=5, keepalive=False))
    time.sleep(3.0)
    held = lone.holders(kept)
    assert [str(h["token"]) for h in held] == [tk], "keep-alive must hold the lock, same token"
    assert held[0]["renewals"] >= 3, f"renewals every third of the lease: {held[0]}"
    assert lone.holders(plain) == [], "without keep-alive the lease runs out"
    assert [e for e in lone.events(plain) if e["type"] == "renewal"] == []
    assert d.events() == [], "no lost event: the kept lock is held, the plain one had none"
    ok(d.call("release", key=kept, token=tk))
    err(d.call("release", key=plain, token=tp), "stale")
    d.no_line(lambda o: "event" in o, 1.0)


def test_lost_when_renewal_refused_after_force_release(kind, lone, start_driver, key):
    kept, plain, e = key("kept"), key("plain"), key("e")
    d = start_driver(lone.address)
    tk = token_of(d.call("acquire", key=kept, lease=1.5, wait=5, keepalive=True))
    tp = token_of(d.call("acquire", key=plain, lease=30, wait=5))
    te = token_of(d.call("campaign", election=e, value="leader-x", lease=1.5))
    forced = time.monotonic()
    assert lone.force_release(kept)["released_token"] == int(tk)
    assert lone.force_release(plain)["released_token"] == int(tp)
    assert lone.force_release(e)["released_token"] == int(te)
    lost = d.event(kept, 5)
    assert lost.obj == {"event": "lost", "key": kept, "token": tk} or (
        lost.obj.get("token") == tk and lost.obj.get("key") == kept), lost.obj
    assert lost.time - forced < 0.5 * 1.5 + 1.5, "lost must come with the next refused renewal"
    lost_e = d.event(e, 5)
    assert lost_e.obj.get("token") == te, lost_e.obj
    time.sleep(1.0)
    assert [o for o in d.events() if o.get("key") == plain] == [], \
        "no lost event for a lock without keep-alive"
    assert len([o for o in d.events() if o.get("key") == kept]) == 1, "lost is told once"
    for ev in d.events():
        assert isinstance(ev.get("token"), str)
    # Nothing renews a lost lock: the node saw no renewal after the force-release.
    assert lone.holders(kept) == [] and lone.holders(e) == []
    r = d.call("leader", election=e)
    assert r.get("value") is None and r.get("token") == "0"


# -- close and end of input ---------------------------------------------------------------


def _busy_driver(lone, start_driver, key, raws):
    busy, mine, kept, e = key("busy"), key("mine"), key("kept"), key("e")
    holder = lone.hold(busy)
    raws.append(holder)
    d = start_driver(lone.address)
    tm = token_of(d.call("acquire", key=mine, lease=60, wait=5))
    tk = token_of(d.call("acquire", key=kept, lease=3, wait=5, keepalive=True))
    te = token_of(d.call("campaign", election=e, value="closer", lease=3))
    waiting = d.cmd("acquire", key=busy, lease=30, wait=0)
    observing = d.cmd("observe", key=busy, token=str(holder.token), wait=0)
    wait_until(lambda: lone.waiters(busy) == 1, 10, "the acquire queued")
    time.sleep(0.3)
    return d, holder, (busy, mine, kept, e), (tm, tk, te), (waiting, observing)


def _check_closed(lone, holder, keys, waiting_ids, d, t0):
    busy, mine, kept, e = keys
    for ident in waiting_ids:
        err(d.result(ident, 1), "cancelled")
    wait_until(lambda: all(lone.holders(k) == [] for k in (mine, kept, e)), 3,
               "the driver's locks released at close")
    assert lone.waiters(busy) == 0
    assert lone.tokens(busy) == [holder.token]
    # Released (R), not left to expire.
    for k in (mine, kept, e):
        types = [ev["type"] for ev in lone.events(k)]
        assert "release" in types and "expiry" not in types, (k, types)


def test_close_cancels_pending_releases_held_then_ok_and_exit_0(kind, lone, start_driver, key,
                                                                raws):
    d, holder, keys, _, waiting = _busy_driver(lone, start_driver, key, raws)
    t0 = time.monotonic()
    close = d.cmd("close")
    done = d.result_line(close, 10)
    ok(done.obj)
    for ident in waiting:
        assert d.result_line(ident, 1).index < done.index, "pending results before close's ok"
    rc = d.wait_exit(5)
    assert rc == 0, f"exit status {rc} (None: still running 5 s after close's ok)\n{d.describe()}"
    assert time.monotonic() - t0 < 10
    _check_closed(lone, holder, keys, waiting, d, t0)
    d.wait_eof(5)
    assert d.all_lines()[-1].index == done.index, "nothing after close's ok"


def test_end_of_stdin_is_close_without_ok(kind, lone, start_driver, key, raws):
    d, holder, keys, _, waiting = _busy_driver(lone, start_driver, key, raws)
    t0 = time.monotonic()
    d.close_stdin()
    rc = d.wait_exit(10)
    assert rc == 0, f"exit status {rc}\n{d.describe()}"
    d.wait_eof(5)
    _check_closed(lone, holder, keys, waiting, d, t0)
    after = [ln.obj for ln in d.all_lines() if ln.time >= t0]
    assert all(o.get("error") == "cancelled" for o in after), \
        f"on end of stdin only the pending commands' results come, no ok line: {after}"
