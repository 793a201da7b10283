"""
The monitor on its own: events, long holds (--warn-hold), deadlocks and
force-release, driven through its observer interface with a task.Clock.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent, globalLogPublisher

from lockservice.core.events import TYPES
from lockservice.core.sketch import Sketch
from lockservice.core.table import Waiter
from lockservice.server.deadlocks import WAIT_ENTERS_AFTER
from lockservice.server.monitor import TIMEOUT, WITHDRAWAL, Monitor


class Conn:
    """
    A client connection as the monitor sees it: an identity with a name.
    """

    def __init__(self, name: str) -> None:
        self.name = name


_conns: Dict[str, Conn] = {}


def conn(name: str) -> Conn:
    """
    One connection per name (in these tests).
    """
    return _conns.setdefault(name, Conn(name))


class NamedWaiter(Waiter):
    __slots__ = ("conn",)

    def __init__(self, key: bytes, name: "str | Conn", queuedAt: float = 0.0) -> None:
        super().__init__(key, 30.0)
        self.conn = conn(name) if isinstance(name, str) else name
        self.queuedAt = queuedAt

    def holderName(self) -> Optional[str]:
        return self.conn.name


@pytest.fixture
def log() -> Iterator[List[str]]:
    """
    The monitor's log messages, as formatted text.
    """
    messages: List[str] = []

    def observer(event: LogEvent) -> None:
        # The monitor's, or its subclass's here (TableMonitor).
        if event.get("log_namespace", "").startswith(("lockservice.server.monitor", __name__)):
            messages.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    yield messages
    globalLogPublisher.removeObserver(observer)


class TableMonitor(Monitor):
    """
    A monitor over a table of holders of its own, kept from what it is
    told the way the lock table is: changed first, then the monitor told.
    """

    def __init__(self, clock: Clock, **kw: Any) -> None:
        self.held: Dict[bytes, object] = {}
        super().__init__(clock, self.held.get, **kw)

    def granted(self, now: float, key: bytes, token: int, owner: Optional[str],
                waiter: Optional[Waiter], waited: float,  # type: ignore[override]
                conn: Optional[Conn] = None) -> None:
        holder = conn if conn is not None else getattr(waiter, "conn", None)
        if holder is None:
            self.held.pop(key, None)
        else:
            self.held[key] = holder
        super().granted(now, key, token, owner, waiter, waited, conn)  # type: ignore[arg-type]

    def dropped(self, now: float, key: bytes, token: int, owner: Optional[str],
                heldFor: float, expired: bool) -> None:
        self.held.pop(key, None)
        super().dropped(now, key, token, owner, heldFor, expired)


def monitor(warnHold: Optional[float] = None) -> Monitor:
    clock = Clock()
    clock.advance(1000)
    return TableMonitor(clock, wallTime=lambda: 1_700_000_000.0 + clock.seconds(),
                        warnHold=warnHold)


def types(m: Monitor) -> List[str]:
    return [e.type for e in m.events.since(0)[0]]


def test_events_of_a_grant_wait_and_release() -> None:
    m = monitor()
    m.granted(1000, b"k", 11, "alice", None, 0.0, conn("alice"))
    w = NamedWaiter(b"k", "bob", queuedAt=1000)
    m.queued(1000, w)
    m.dropped(1002, b"k", 11, "alice", 2.0, expired=False)
    m.granted(1002, b"k", 12, "bob", w, 2.0)
    m.renewed(1003, b"k", 12, "bob", 1033)
    m.dropped(1040, b"k", 12, "bob", 38.0, expired=True)
    events = [e.asDict() for e in m.events.since(0)[0]]
    assert [e["type"] for e in events] == ["grant", "release", "grant", "renewal", "expiry"]
    assert events[1]["who"] == "alice" and events[1]["token"] == 11
    assert events[2]["detail"] == "after waiting 2.000 s"
    assert events[0]["time"] == 1_700_000_000.0 + 1000
    record = m.keys.get(b"k")
    assert record is not None and (record.grants, record.releases, record.expiries,
                                   record.waits) == (2, 1, 1, 1)


def test_timeouts_and_withdrawals_are_events() -> None:
    m = monitor()
    m.granted(1000, b"k", 1, "a", None, 0.0)
    w1, w2 = NamedWaiter(b"k", "b", 1000), NamedWaiter(b"k", "c", 1000)
    m.queued(1000, w1)
    m.queued(1000, w2)
    m.waitEnded(1005, w1, TIMEOUT)
    m.waitEnded(1006, w2, WITHDRAWAL)
    events = m.events.since(1)[0]
    assert [(e.type, e.who, e.detail) for e in events] == [
        ("timeout", "b", "after 5.000 s"), ("withdrawal", "c", "after 6.000 s")]
    assert m.keys.get(b"k").timeouts == 1  # type: ignore[union-attr]


def test_long_hold_logged_once_counted_and_flagged(log: List[str]) -> None:
    m = monitor(warnHold=10)
    clock = m.clock
    assert isinstance(clock, Clock)
    m.granted(1000, b"slow", 5, "batch-7", None, 0.0)
    m.granted(1000, b"quick", 6, "web-1", None, 0.0)
    clock.advance(4)
    m.dropped(1004, b"quick", 6, "web-1", 4.0, expired=False)
    clock.advance(5.9)
    assert m.longHolds == 0 and not m.isLongHold(b"slow", 5)
    clock.advance(0.2)
    assert m.longHolds == 1 and m.isLongHold(b"slow", 5) and m.currentLongHolds() == 1
    assert log == ["Long hold: slow held by batch-7 (token 5) for more than 10 s"]
    clock.advance(100)
    assert m.longHolds == 1 and len(log) == 1  # once
    assert "long-hold" not in types(m)  # not an event type of the contract
    m.dropped(clock.seconds(), b"slow", 5, "batch-7", 110, expired=False)
    assert m.currentLongHolds() == 0
    assert not clock.getDelayedCalls()


def test_deadlock_logged_once(log: List[str]) -> None:
    m = monitor()
    clock = m.clock
    assert isinstance(clock, Clock)
    m.granted(1000, b"k1", 1, "x", None, 0.0, conn("x"))
    m.granted(1000, b"k2", 2, "y", None, 0.0, conn("y"))
    m.queued(1000, NamedWaiter(b"k2", "x"))
    wy = NamedWaiter(b"k1", "y")
    m.queued(1000, wy)
    assert log == []  # checked on the next reactor turn, not inline
    clock.advance(0)
    assert log == ["Deadlock: y waits for k1 (held by x) -> x waits for k2 (held by y)"]
    [d] = m.deadlocks()
    assert d["length"] == 2 and d["clients"] == ["y", "x"]
    assert d["since"] == 1_700_000_000.0 + 1000
    m.queued(1000, NamedWaiter(b"k1", "y"))
    clock.advance(0)
    assert len(log) == 1 and m.graph.detected == 1
    m.waitEnded(1000, wy, TIMEOUT)
    clock.advance(0)
    assert len(m.deadlocks()) == 1  # y's second wait keeps the cycle
    assert set(types(m)) <= set(TYPES)  # the contract's event types only
    m.stop()
    assert not clock.getDelayedCalls()


def test_deadlock_after_a_rename_and_no_false_one_for_a_shared_name(
        log: List[str]) -> None:
    """
    The graph is over connections: a client that renames itself after its
    grant is still the holder, and another connection that takes the old
    name is another client.
    """
    m = monitor()
    clock = m.clock
    assert isinstance(clock, Clock)
    x, y, impostor = Conn("x"), Conn("y"), Conn("x")
    m.granted(1000, b"k1", 1, "x", None, 0.0, x)
    m.granted(1000, b"k2", 2, "y", None, 0.0, y)
    x.name = "x-renamed"  # I x-renamed, after the grant
    m.queued(1000, NamedWaiter(b"k2", impostor))  # takes x's old name, waits for k2
    m.queued(1000, NamedWaiter(b"k1", y))
    clock.advance(0)
    assert log == [] and m.deadlocks() == []
    m.queued(1000, NamedWaiter(b"k2", x))  # the real holder of k1 waits for k2
    clock.advance(0)
    assert log == ["Deadlock: y waits for k1 (held by x-renamed) -> "
                   "x-renamed waits for k2 (held by y)"]


def test_deadlock_list_is_bounded() -> None:
    m = monitor()
    clock = m.clock
    assert isinstance(clock, Clock)
    for i in range(50):
        a, b = Conn(f"a{i}"), Conn(f"b{i}")
        m.granted(1000, b"p%d" % i, 1, a.name, None, 0.0, a)
        m.granted(1000, b"q%d" % i, 2, b.name, None, 0.0, b)
        m.queued(1000, NamedWaiter(b"q%d" % i, a))
        m.queued(1000, NamedWaiter(b"p%d" % i, b))
    clock.advance(0)
    assert len(m.graph.cycles) == 50 and len(m.deadlocks()) == 20


class FakeService:
    def __init__(self, m: Monitor) -> None:
        self.monitor = m
        self.held = {b"k": (7, "stuck")}

    def forceRelease(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
        held = self.held.get(key)
        if held is None or held[0] != token:
            reply(b"R " + key + b" STALE\n")
            return
        del self.held[key]
        # Like the lock service, it tells who held the key.
        self.monitor.dropped(1000, key, token, held[1], 3.0, expired=False)
        reply(b"R " + key + b" OK\n")


def test_force_release_goes_through_the_release_path() -> None:
    m = monitor()
    m.granted(997, b"k", 7, "stuck", None, 0.0)
    service = FakeService(m)
    assert m.forceRelease(service, b"k", 7, "job hung", "admin@127.0.0.1")
    assert not m.forceRelease(service, b"k", 7, "again", "admin@127.0.0.1")
    last = m.events.since(0)[0][-1]
    assert (last.type, last.key, last.token, last.who, last.detail) == (
        "force-release", b"k", 7, "stuck", "by admin@127.0.0.1: job hung")
    assert m.forceReleases == 1


class Held:
    def __init__(self, token: int, owner: Optional[str], grantedAt: float) -> None:
        self.token, self.owner, self.grantedAt = token, owner, grantedAt


def test_promotion_starts_from_the_held_keys(log: List[str]) -> None:
    """
    A standby promoted with replicated grants watches them: one already
    held too long is flagged at once, the other when its time comes.
    """
    m = monitor(warnHold=10)
    clock = m.clock
    assert isinstance(clock, Clock)
    m.granted(1000, b"old", 1, "x", None, 0.0)
    m.roleChanged(1000, "standby", [])
    assert m._held == {} and not clock.getDelayedCalls()
    clock.advance(20)  # 1020
    m.roleChanged(1020, "active", [(b"a", Held(7, None, 1015.0)), (b"b", Held(8, None, 1001.0))])
    m.roleChanged(1020, "active", [])  # same role again: nothing forgotten
    clock.advance(0)
    assert m.isLongHold(b"b", 8) and not m.isLongHold(b"a", 7)
    clock.advance(5)
    assert m.isLongHold(b"a", 7) and m.longHolds == 2
    assert log[-1] == "Long hold: a held by unknown (token 7) for more than 10 s"


class ServiceConn(Conn):
    """
    A connection as the lock service sees it (no socket).
    """

    gone = False
    notRead = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.answers: List[bytes] = []

    def finish(self, waiter: object, answer: bytes) -> None:
        self.answers.append(answer)

    def flushAnswers(self) -> None:
        pass


def _serviceWithMonitor() -> Any:
    from lockservice.server.service import LockService, PendingAcquire

    clock = Clock()
    clock.advance(1000)
    locks = LockService(clock, lambda: 1_000_000)
    m = Monitor(clock, locks.table.clientOf)
    locks.notify.attach(m)

    def acquire(conn: ServiceConn, key: bytes) -> Optional[int]:
        answer = locks.acquire(PendingAcquire(key, 30.0, conn), 0.0)
        return int(answer.split()[2]) if answer is not None else None

    return clock, locks, m, acquire


def test_deadlock_through_the_lock_service_table(log: List[str]) -> None:
    """
    The monitor's graph reads who holds what from the service's table (the
    connection kept with each grant), including a renamed connection, a
    hand-over, and a key whose table slot was reused.
    """
    clock, locks, _, acquire = _serviceWithMonitor()
    x, y, z = ServiceConn("x"), ServiceConn("y"), ServiceConn("z")

    gone = acquire(z, b"gone")
    assert gone is not None
    locks.release(b"gone", gone, z.answers.append)
    assert acquire(x, b"k1") is not None  # in the slot "gone" had
    assert locks.table.clientOf(b"k1") is x
    k2 = acquire(z, b"k2")
    assert k2 is not None and acquire(y, b"k2") is None
    locks.release(b"k2", k2, z.answers.append)  # handed over to y
    assert locks.table.clientOf(b"k2") is y
    x.name = "x-renamed"  # I x-renamed
    assert acquire(x, b"k2") is None
    assert acquire(y, b"k1") is None
    assert log == []
    clock.advance(0)
    assert log == []  # the waits enter the wait-for graph once they have lasted
    clock.advance(WAIT_ENTERS_AFTER)
    assert log == ["Deadlock: y waits for k1 (held by x-renamed) -> "
                   "x-renamed waits for k2 (held by y)"]
    assert locks.table.ownerOf(b"k1") == "x-renamed"


def test_a_wait_shorter_than_the_entry_delay_never_touches_the_wait_for_graph() -> None:
    """
    Issue 20: a busy key's waits last about a hand-off (a tenth of a
    millisecond); they cost the wait-for graph nothing (before, each one
    was entered and taken out again: a tenth of the server's CPU per
    contended hand-off).  A wait that lasts is entered, and leaves again.
    """
    clock, locks, m, acquire = _serviceWithMonitor()
    graph = m.graph
    conns = [ServiceConn(f"c{i}") for i in range(4)]
    token = acquire(conns[0], b"hot")
    assert token is not None
    for conn in conns[1:]:
        assert acquire(conn, b"hot") is None
    for _ in range(30):  # hand-offs, 1 ms apart
        clock.advance(0.001)
        holder = locks.table.clientOf(b"hot")
        locks.release(b"hot", token, holder.answers.append)
        assert acquire(holder, b"hot") is None
        token = locks.table.holding(b"hot")[0]
        assert graph.waitedFor == {} and graph._waits == {} and graph._pinned == {}
    # A wait that lasts enters the graph; granted, it leaves it.
    clock.advance(WAIT_ENTERS_AFTER)
    assert graph.waitedFor == {b"hot": 3}
    holder = locks.table.clientOf(b"hot")
    locks.release(b"hot", token, holder.answers.append)
    assert graph.waitedFor == {b"hot": 2}


def test_a_cycle_closed_by_a_hand_over_to_a_wait_not_yet_in_the_graph_is_found(
        log: List[str]) -> None:
    """
    y waits for k1 (x holds it) and for k2 (z holds it); x queues for k2
    behind y.  z releases k2: y gets it while its waits are not in the
    graph yet, and now x and y wait for each other.  Found once the waits
    have lasted the entry delay, as if they had been queued then.
    """
    clock, locks, m, acquire = _serviceWithMonitor()
    x, y, z = ServiceConn("x"), ServiceConn("y"), ServiceConn("z")
    assert acquire(x, b"k1") is not None
    k2 = acquire(z, b"k2")
    assert k2 is not None
    assert acquire(y, b"k1") is None and acquire(y, b"k2") is None
    assert acquire(x, b"k2") is None
    locks.release(b"k2", k2, z.answers.append)  # handed over to y
    assert locks.table.clientOf(b"k2") is y
    clock.advance(WAIT_ENTERS_AFTER / 2)
    assert log == []
    clock.advance(WAIT_ENTERS_AFTER / 2)
    assert log == ["Deadlock: y waits for k1 (held by x) -> x waits for k2 (held by y)"]


def test_a_burst_of_waits_enters_the_graph_a_budget_per_reactor_turn() -> None:
    """
    12,000 waits queued at once enter the graph ENTER_BUDGET per turn, not
    in one turn that would hold every client up.
    """
    from lockservice.server.deadlocks import ENTER_BUDGET

    clock, locks, m, acquire = _serviceWithMonitor()
    assert acquire(ServiceConn("holder"), b"k") is not None
    locks.maxWaiters = 20_000
    for i in range(12_000):
        assert acquire(ServiceConn(f"w{i}"), b"k") is None
    checks = m._checks
    entering = checks.entering
    assert entering is not None and entering.getTime() == clock.seconds() + WAIT_ENTERS_AFTER
    # One turn at a time (task.Clock would run the turns due now in one
    # advance): each enters at most the budget, and leaves the rest to
    # the next turn.
    for entered in (ENTER_BUDGET, 2 * ENTER_BUDGET):
        at = entering.getTime()
        entering.cancel()
        checks.entering = None
        clock.advance(at - clock.seconds())
        checks._enter()
        assert m.graph.waitedFor == {b"k": entered}
        entering = checks.entering
        assert entering is not None and entering.getTime() == clock.seconds()
    clock.advance(0)
    assert m.graph.waitedFor == {b"k": 12_000} and not checks.fresh


def test_a_pause_in_handing_off_forgets_nothing(log: List[str]) -> None:
    """
    Handing off freezes the active with its grants and queues: a pause (a
    peer joining) keeps the deadlocks, waits and long holds it watches; a
    hand-off that ends in standby forgets them.
    """
    m = monitor(warnHold=10)
    clock = m.clock
    assert isinstance(clock, Clock)
    x, y = Conn("px"), Conn("py")
    m.granted(1000, b"k1", 1, "px", None, 0.0, x)
    m.granted(1000, b"k2", 2, "py", None, 0.0, y)
    m.queued(1000, NamedWaiter(b"k2", x))
    clock.advance(11)
    assert m.isLongHold(b"k1", 1)
    m.roleChanged(1011, "handing-off", [])
    m.roleChanged(1011, "active", [])
    m.queued(1011, NamedWaiter(b"k1", y))  # closes the cycle with x's earlier wait
    clock.advance(0)
    assert len(m.deadlocks()) == 1 and m.isLongHold(b"k1", 1)
    m.roleChanged(1011, "handing-off", [])
    m.roleChanged(1011, "standby", [])
    assert m.deadlocks() == [] and not m.isLongHold(b"k1", 1)
    assert not clock.getDelayedCalls()


def test_the_fold_counts_as_the_statistics_would_one_by_one() -> None:
    """
    The fold counts a batch of changes inline (issue 20 item 2): the same
    statistics and series as KeyStats and Series fed one change at a time.
    """
    from lockservice.core.series import Series
    from lockservice.core.sketch import KeyStats

    m = monitor()
    keys, series = KeyStats(), Series()
    waits = [0.0, 0.0, 2e-5, 0.25, 0.0, 3.0]
    holds = [1e-5, 0.5, 0.0, 2.0, 7.25, 0.125]
    for i, (waited, held) in enumerate(zip(waits, holds, strict=True)):
        at = 1000.0 + i * 0.4
        w = NamedWaiter(b"k", "bob", queuedAt=at - waited) if waited else None
        if w is not None:
            m.queued(at - waited, w)
            keys.queued(b"k")
            series.queued(at - waited)
        m.granted(at, b"k", i, "bob", w, waited, conn("bob"))
        keys.granted(b"k", waited)
        series.granted(at)
        m.dropped(at + held, b"k", i, "bob", held, expired=i == 3)
        keys.dropped(b"k", held, i == 3)
        series.held(at + held, held)
    got, want = m.keys.get(b"k"), keys.get(b"k")
    assert got is not None and want is not None
    assert got.asDict() == want.asDict() and got.activity == want.activity
    assert m.series.last(1010.0, 12) == series.last(1010.0, 12)


@pytest.mark.parametrize("seed", range(5))
def test_the_fold_and_derived_counters_match_one_by_one_counting_read_at_any_time(
        seed: int) -> None:
    """
    A record derives its activity and the zero waits of grants at once
    when read (issue 20: fewer counters per change in the fold): read
    between folds, after timeouts and with several keys, every figure is
    what KeyStats fed one change at a time says.
    """
    import random

    from lockservice.core.sketch import KeyStats
    from lockservice.server.monitor import TIMEOUT

    rng = random.Random(seed)
    m = monitor()
    keys = KeyStats()
    names = [b"a", b"b", b"c"]
    waits: Dict[bytes, List[float]] = {key: [] for key in names}  # counted by hand
    changes = dict.fromkeys(names, 0)  # every queue, timeout, grant and drop
    at = 1000.0
    for i in range(3000):
        key = rng.choice(names)
        at += rng.random() * 0.01
        step = rng.random()
        if step < 0.1:
            w = NamedWaiter(key, "bob", queuedAt=at)
            m.queued(at, w)
            keys.queued(key)
            m.waitEnded(at + 0.5, w, TIMEOUT)
            keys.timedOut(key, 0.5)
            waits[key].append(0.5)
            changes[key] += 2
        else:
            waited = 0.0 if step < 0.7 else rng.choice([0.0, 1e-5, 0.3])
            w = NamedWaiter(key, "bob", queuedAt=at - waited) if step >= 0.7 else None
            if w is not None:
                m.queued(at - waited, w)
                keys.queued(key)
            m.granted(at, key, i, "bob", w, waited, conn("bob"))
            keys.granted(key, waited)
            waits[key].append(waited)
            changes[key] += 3 if w is not None else 2  # (its queue,) its grant and drop
            held = rng.choice([0.0, 2e-5, 0.001, 0.25])
            m.dropped(at + held, key, i, "bob", held, expired=step > 0.95)
            keys.dropped(key, held, step > 0.95)
        if rng.random() < 0.01:  # a page reads now and then
            for key in names:
                got, want = m.keys.get(key), keys.get(key)
                assert (got is None) == (want is None)
                if got is not None and want is not None:
                    assert got.asDict() == want.asDict()
    for key in names:
        got, want = m.keys.get(key), keys.get(key)
        assert got is not None and want is not None
        assert got.asDict() == want.asDict() and got.activity == want.activity
        assert got.activity == changes[key]
        for _ in range(2):  # reading derives nothing twice
            assert got.wait.count == len(waits[key])
            assert got.wait.zeros == sum(1 for w in waits[key] if w < Sketch.FLOOR)
            assert got.wait.total == pytest.approx(sum(waits[key]))


def test_a_grant_watched_late_waits_behind_those_before_it_and_is_never_flagged_early() -> None:
    """
    A grant learned late (merged on a heal: granted before grants watched
    already) is checked against its own deadline, but only once the
    grants before it in the FIFO are: flagged late, never early.
    """
    from twisted.logger import Logger

    from lockservice.server.longholds import LongHolds

    clock = Clock()
    holds = LongHolds(clock, 60.0, Logger())
    clock.advance(10)
    holds.watch(b"first", 1, "a", clock.seconds())  # due at 70
    holds.watch(b"late", 2, None, 0.0)  # granted at 0: due at 60
    clock.advance(55)  # 65: past the late grant's deadline, not the first's
    assert not holds.isLongHold(b"late", 2) and not holds.isLongHold(b"first", 1)
    clock.advance(5)  # 70
    assert holds.isLongHold(b"first", 1) and holds.isLongHold(b"late", 2)
    assert holds.current == holds.count == 2
    # Alone in the FIFO, a late grant is flagged at its own deadline.
    holds.watch(b"alone", 3, None, 71.0)
    clock.advance(60.5)  # 130.5: before 131
    assert not holds.isLongHold(b"alone", 3)
    clock.advance(0.5)
    assert holds.isLongHold(b"alone", 3)


class _Called:
    """
    A monitor attached as any other activity observer: told of every
    grant and release by a call (it has no lane).
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def __getattr__(self, name: str) -> Any:
        if name == "lane":
            raise AttributeError(name)
        return getattr(self.monitor, name)


@pytest.mark.parametrize("warnHold", [None, 0.5])
def test_a_change_noted_through_the_lane_is_the_change_the_monitor_notes(
        warnHold: Optional[float]) -> None:
    """
    The fan-out notes grants and releases in the monitor's log itself (its
    lane, issue 20: two calls fewer per pair): the log, the events, the
    statistics, the series, the wait-for graph and the long holds are
    those of a monitor told by calls, whatever the mix of changes
    (waits that end in grants, keys in a deadlock, full logs folded,
    force-releases, long holds).
    """
    import random

    from lockservice.server.observers import Observers

    rng = random.Random(7)
    clocks = [Clock(), Clock()]
    holders: List[Dict[bytes, Any]] = [{}, {}]
    laned = Monitor(clocks[0], holders[0].get, wallTime=lambda: 0.0, warnHold=warnHold)
    called = Monitor(clocks[1], holders[1].get, wallTime=lambda: 0.0, warnHold=warnHold)
    fanOuts = [Observers(lambda where: None), Observers(lambda where: None)]
    fanOuts[0].attach(laned)
    fanOuts[1].attach(_Called(called))  # type: ignore[arg-type]
    assert fanOuts[0]._lane is laned.lane and fanOuts[1]._lane is None

    class Releaser:
        def __init__(self, side: int) -> None:
            self.side = side

        def forceRelease(self, key: bytes, token: int, reply: Callable[[bytes], object]) -> None:
            holders[self.side].pop(key, None)
            fanOuts[self.side].dropped(clocks[self.side].seconds(), key, token, 0.25, False,
                                       "x")
            reply(b"R %s OK\n" % key)

    names = [conn("x"), conn("y"), conn("z")]
    keys = [b"a", b"b", b"c", b"d"]
    held: Dict[bytes, int] = {}
    for i in range(3000):
        key, who = rng.choice(keys), rng.choice(names)
        step = rng.random()
        elapsed = rng.choice([0.0, 1e-5, 0.01, 0.07])
        for side in (0, 1):
            clocks[side].advance(elapsed)
        now = clocks[0].seconds()
        if key in held and step < 0.05:
            for side, monitor in ((0, laned), (1, called)):
                assert monitor.forceRelease(Releaser(side), key, held[key], "stuck", "op")
            del held[key]
        elif key in held:
            other = rng.choice([n for n in names if n is not holders[0][key]])
            waiter = NamedWaiter(key, other, queuedAt=now)
            for side in (0, 1):
                fanOuts[side].queued(now, waiter)
            waited = rng.choice([0.0, 0.01, 0.06])  # the last enters the wait-for graph
            for side in (0, 1):
                clocks[side].advance(waited)
            now = clocks[0].seconds()
            for side in (0, 1):
                holders[side].pop(key)
                fanOuts[side].dropped(now, key, held[key], 0.5, step > 0.9, "x")
                holders[side][key] = other
                fanOuts[side].granted(now, key, i, now + 30, waited, waiter, other)
            held[key] = i
        else:
            for side in (0, 1):
                holders[side][key] = who
                fanOuts[side].granted(now, key, i, now + 30, 0.0, None, who)
            held[key] = i
        assert laned._log == called._log
        assert laned.graph.waitedFor == called.graph.waitedFor
        assert len(laned._fresh) == len(called._fresh)
    assert [e.asDict() for e in laned.events.since(0, limit=10**6)[0]] == [
        e.asDict() for e in called.events.since(0, limit=10**6)[0]]
    for key in keys:
        got, want = laned.keys.get(key), called.keys.get(key)
        assert got is not None and want is not None and got.asDict() == want.asDict()
    assert laned.series.last(clocks[0].seconds(), 400) == called.series.last(
        clocks[1].seconds(), 400)
    assert laned.forceReleases == called.forceReleases > 0
    assert laned.longHolds == called.longHolds
    if warnHold is not None:
        assert laned.longHolds > 0
    # A deadlock (x holds e and waits for f, y the other way round), then
    # the release that breaks it: a key in a reported cycle.
    x, y = conn("x"), conn("y")
    now = clocks[0].seconds()
    for side in (0, 1):
        for key, who in ((b"e", x), (b"f", y)):
            holders[side][key] = who
            fanOuts[side].granted(now, key, 9000, now + 30, 0.0, None, who)
        fanOuts[side].queued(now, NamedWaiter(b"f", x, queuedAt=now))
        fanOuts[side].queued(now, NamedWaiter(b"e", y, queuedAt=now))
        clocks[side].advance(0.06)
        clocks[side].advance(0)
    assert len(laned.deadlocks()) == len(called.deadlocks()) == 1
    for side in (0, 1):
        holders[side].pop(b"e")
        fanOuts[side].dropped(clocks[side].seconds(), b"e", 9000, 0.06, False, "x")
        clocks[side].advance(0)
    assert laned.deadlocks() == called.deadlocks() == []
    assert laned._log == called._log


def test_the_folds_hold_times_are_those_of_the_sketch() -> None:
    """
    The fold adds a hold time to its key's sketch inline (no call per
    release): counts, totals, extremes and buckets equal Sketch.add's,
    zeros, a negative time and times beyond the sketch's ceiling included.
    """
    import random

    rng = random.Random(3)
    m = monitor()
    wants = {b"mixed": Sketch(), b"timed": Sketch()}
    for i in range(5000):
        timed = 10 ** rng.uniform(-6, 9)
        for key, held in ((b"mixed", rng.choice([0.0, -1.0, 5e-7, 1e-6, timed])),
                          (b"timed", timed)):
            m.granted(1000.0 + i, key, i, "bob", None, 0.0, conn("bob"))
            m.dropped(1000.0 + i, key, i, "bob", held, expired=False)
            wants[key].add(held)
    for key, want in wants.items():
        record = m.keys.get(key)
        assert record is not None
        got = record.hold
        assert (got.count, got.total, got.low, got.high, got.zeros, got.counts) == (
            want.count, want.total, want.low, want.high, want.zeros, want.counts)
        assert got.counts is not None and got.counts[-1] > 0  # beyond the ceiling too
