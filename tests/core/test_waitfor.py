"""
The wait-for graph: deadlock cycles (pure).  Clients are any hashable
objects (the server passes connections); here, strings.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from lockservice.core.table import LockTable, TokenIssuer, Waiter, nameOf
from lockservice.core.waitfor import Client, Cycle, WaitForGraph


class TableGraph(WaitForGraph):
    """
    A graph over a table of holders of its own, changed the way the lock
    table is: first the table, then the graph is told (C{hold}/C{unhold}).
    """

    def __init__(self, **kw: Any) -> None:
        self.held: Dict[bytes, Client] = {}
        super().__init__(self.held.get, **kw)

    def hold(self, key: bytes, who: Optional[Client]) -> None:
        if who is None:
            self.held.pop(key, None)
        else:
            self.held[key] = who
        super().hold(key, who)

    def unhold(self, key: bytes) -> None:
        self.held.pop(key, None)
        super().unhold(key)


def drain(g: WaitForGraph, now: float = 0.0) -> List[Cycle]:
    found: List[Cycle] = []
    while g.pending:
        found += g.check(now)
    return found


def test_cycle_of_two() -> None:
    g = TableGraph()
    g.hold(b"k1", "x")
    g.hold(b"k2", "y")
    g.wait(b"k2", "x")
    assert drain(g, 2.0) == []
    g.wait(b"k1", "y")
    assert g.cycles == {}  # changes never search: check does
    [cycle] = drain(g, 3.0)
    assert cycle.steps == (("y", b"k1"), ("x", b"k2"))
    assert cycle.since == 3.0
    assert cycle.describe() == "y waits for k1 (held by x) -> x waits for k2 (held by y)"
    assert list(g.cycles.values()) == [cycle] and g.detected == 1


def test_cycle_of_three_closed_by_a_grant() -> None:
    """
    The last edge of the cycle is a hand-over, not a new wait.
    """
    g = TableGraph()
    g.hold(b"a", "x")
    g.hold(b"b", "y")
    g.hold(b"c", "old")
    g.wait(b"b", "x")
    g.wait(b"c", "y")
    g.wait(b"c", "z")
    g.wait(b"a", "z")
    assert drain(g) == []
    # c passes from "old" to z: z holds c, which y waits for.
    g.unwait(b"c", "z")
    g.hold(b"c", "z")
    [cycle] = drain(g, 5.0)
    assert set(cycle.clients) == {"x", "y", "z"}
    assert cycle.steps == (("z", b"a"), ("x", b"b"), ("y", b"c"))


def test_no_false_cycle_after_a_waiter_is_withdrawn() -> None:
    g = TableGraph()
    g.hold(b"k1", "x")
    g.hold(b"k2", "y")
    g.wait(b"k2", "x")
    g.unwait(b"k2", "x")  # x's wait timed out / its connection closed
    g.wait(b"k1", "y")
    assert drain(g) == [] and g.cycles == {}


def test_withdrawn_before_the_check_runs() -> None:
    """
    A wait that closes a cycle and ends before the check runs is no cycle.
    """
    g = TableGraph()
    g.hold(b"k1", "x")
    g.hold(b"k2", "y")
    g.wait(b"k2", "x")
    g.wait(b"k1", "y")
    g.unwait(b"k1", "y")
    assert drain(g) == [] and g.cycles == {}


def test_cycle_forgotten_when_broken_and_reported_again_when_it_reforms() -> None:
    g = TableGraph()
    g.hold(b"k1", "x")
    g.hold(b"k2", "y")
    g.wait(b"k2", "x")
    g.wait(b"k1", "y")
    assert len(drain(g)) == 1
    # Found again from another edge: not a second report.
    g.wait(b"k1", "y")
    assert drain(g) == []
    g.unwait(b"k1", "y")
    assert drain(g) == [] and len(g.cycles) == 1  # y still has one wait for k1
    g.unwait(b"k1", "y")
    assert drain(g) == [] and g.cycles == {}
    g.wait(b"k1", "y")
    assert len(drain(g, 9)) == 1
    g.unhold(b"k2")  # released: y no longer blocks x
    assert drain(g) == [] and g.cycles == {} and g.detected == 2


def test_one_report_per_set_of_clients() -> None:
    """
    Two clients deadlocked through many keys are one deadlock: reported
    once, kept while any of their mutual waits lasts, with its keys
    following the waits that remain.
    """
    g = TableGraph()
    for i in range(100):
        g.hold(b"x%03d" % i, "x")
        g.hold(b"y%03d" % i, "y")
    for i in range(100):
        g.wait(b"y%03d" % i, "x")
        g.wait(b"x%03d" % i, "y")
    [cycle] = drain(g)
    assert set(cycle.clients) == {"x", "y"} and g.detected == 1
    for i in range(99):  # the waits time out one by one, but one is left
        g.unwait(b"y%03d" % i, "x")
        assert drain(g) == []
        assert len(g.cycles) == 1
    [kept] = g.cycles.values()
    assert set(kept.keys) & {b"y099"} and kept.since == cycle.since
    g.unwait(b"y099", "x")
    assert drain(g) == [] and g.cycles == {} and g.detected == 1


def test_self_wait_and_unknown_holders_are_not_cycles() -> None:
    g = TableGraph()
    g.hold(b"k", "x")
    g.wait(b"k", "x")
    g.hold(b"r", None)  # replicated grant: holder unknown
    g.wait(b"r", "x")
    assert drain(g) == [] and g.cycles == {}


def test_clients_are_identities_not_names() -> None:
    """
    Two connections named alike are two clients: no false cycle; a
    connection that renames itself is still the same client.
    """
    class Conn:
        def __init__(self, name: str) -> None:
            self.name = name

    a1, a2, b = Conn("nA"), Conn("nA"), Conn("nB")
    g = TableGraph()
    g.hold(b"k1", a1)
    g.hold(b"k2", b)
    g.wait(b"k2", a1)
    g.wait(b"k1", a2)  # another process that happens to share nA's name...
    g.wait(b"k2", a2)
    assert drain(g) == [] and g.cycles == {}
    b.name = "renamed"  # a rename changes nothing but the display
    g.wait(b"k1", b)
    [cycle] = drain(g)
    assert set(cycle.clients) == {a1, b}
    assert cycle.describe(lambda c: c.name) == (  # type: ignore[attr-defined]
        "renamed waits for k1 (held by nA) -> nA waits for k2 (held by renamed)")


def test_search_is_bounded() -> None:
    """
    A long chain is not searched beyond maxSearch edges: no cycle is
    reported, and the call returns.
    """
    g = TableGraph(maxSearch=50)
    for i in range(200):
        g.hold(b"k%d" % i, f"c{i}")
        g.wait(b"k%d" % (i + 1), f"c{i}")
    g.hold(b"k200", "c200")
    g.wait(b"k0", "c200")
    assert drain(g) == []
    g2 = TableGraph()
    for i in range(200):
        g2.hold(b"k%d" % i, f"c{i}")
        g2.wait(b"k%d" % (i + 1), f"c{i}")
    g2.hold(b"k200", "c200")
    g2.wait(b"k0", "c200")
    [cycle] = drain(g2)
    assert len(cycle.steps) == 201


def test_check_work_is_bounded_per_call() -> None:
    """
    The tester's flood: two clients each hold M keys and queue on all 2M
    keys (their own too).  Changes cost O(1); each check call visits
    about its budget of edges; the one deadlock is reported once.
    """
    m = 4000
    g = TableGraph()
    for i in range(m):
        g.hold(b"a%d" % i, "A")
        g.hold(b"b%d" % i, "B")
    started = time.perf_counter()
    for who in ("A", "B"):
        for i in range(m):
            g.wait(b"a%d" % i, who)
            g.wait(b"b%d" % i, who)
    changes = time.perf_counter() - started
    calls, found, slowest = 0, [], 0.0
    while g.pending:
        started = time.perf_counter()
        found += g.check(0.0, budget=5000)
        slowest = max(slowest, time.perf_counter() - started)
        calls += 1
    assert len(found) == 1 and g.detected == 1
    assert calls < 100, calls
    # Generous bounds (a loaded 2-core machine): each is ~1-5 ms alone.
    assert changes < 2.0 and slowest < 0.5, (changes, slowest)


def test_listing_is_bounded() -> None:
    g = TableGraph(maxCycles=3)
    for i in range(5):
        x, y = f"x{i}", f"y{i}"
        g.hold(b"p%d" % i, x)
        g.hold(b"q%d" % i, y)
        g.wait(b"q%d" % i, x)
        g.wait(b"p%d" % i, y)
    assert len(drain(g)) == 3
    assert len(g.cycles) == 3 and g.unlisted >= 2  # found, not kept


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name


class ConnWaiter(Waiter):
    __slots__ = ("conn",)

    def __init__(self, key: bytes, conn: Conn) -> None:
        super().__init__(key, 30.0)
        self.conn = conn

    def client(self) -> object:
        return self.conn


def test_cycle_found_through_the_lock_tables_holders() -> None:
    """
    The graph keeps no holders: it asks the lock table (C{holderOf}), whose
    slots are reused.  A key that took a released key's slot shows its own
    holder, never the one before.
    """
    table = LockTable(TokenIssuer(lambda: 1))
    g = WaitForGraph(table.clientOf)
    x, y, z = Conn("x"), Conn("y"), Conn("z")

    def acquire(key: bytes, who: Conn) -> Optional[int]:
        grant = table.acquire(ConnWaiter(key, who), 0.0)
        if grant is None:
            g.wait(key, who)
            return None
        g.hold(key, who)
        return grant.token

    old = acquire(b"k0", x)
    acquire(b"k2", y)
    assert old is not None and table.release(b"k0", old, 0.0) == (True, None)
    g.unhold(b"k0")
    acquire(b"k3", z)  # in k0's slot
    assert table._keys[b"k3"] == 0
    acquire(b"k3", y)  # y waits for k3, held by z (not x)
    acquire(b"k2", x)  # x waits for k2, held by y: no cycle with x
    assert drain(g) == [] and g.cycles == {}
    acquire(b"k2", z)  # z waits for k2, held by y, who waits for z
    [cycle] = drain(g, 1.0)
    assert set(cycle.clients) == {y, z}
    assert cycle.describe(lambda c: str(nameOf(c))) == (
        "z waits for k2 (held by y) -> y waits for k3 (held by z)")


# -- client instances (issue 21 item 8) ----------------------------------------


class NamedConn:
    """
    A connection as the server has one: a name that C{I} may change.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"NamedConn({self.name!r})"


def _name(client: Any) -> str:
    return str(getattr(client, "name", client))


US, EU = "inventory/us#0123456789ab", "inventory/eu#fedcba987654"


def test_two_instances_with_two_connections_each_deadlock() -> None:
    """
    Each instance holds on one connection and waits on the other: the
    cycle runs through both of each, and is found and shown by name.
    """
    us1, us2, eu1, eu2 = NamedConn(US), NamedConn(US), NamedConn(EU), NamedConn(EU)
    g = TableGraph()
    g.hold(b"k1", us1)
    g.hold(b"k2", eu1)
    g.wait(b"k2", us2)
    assert drain(g) == []
    g.wait(b"k1", eu2)
    [cycle] = drain(g, 1.0)
    assert sorted(cycle.asDict(_name)["clients"]) == ["inventory/eu", "inventory/us"]
    assert cycle.describe(_name) == ("inventory/eu waits for k1 (held by inventory/us) -> "
                                     "inventory/us waits for k2 (held by inventory/eu)")
    g.unwait(b"k1", eu2)  # the deadlock ends (a wait ran out)
    drain(g)
    assert g.cycles == {}


def test_a_fleet_sharing_a_plain_name_makes_no_false_cycle() -> None:
    """
    50 processes called C{billing} and 50 called C{shipping}: billing
    process i holds a_i and billing process 25+i waits for b_i; shipping
    process i holds b_i and shipping process 25+i waits for a_i.  Joined
    by name, billing and shipping would wait for each other; they are 100
    clients, and the waiting ones hold nothing: no cycle.  The same with
    names that only look like instance names.
    """
    for suffix in ["", "#0123456789AB", "#0123456789a", "0123456789ab", "#0123456789abc"]:
        billing = [NamedConn("billing" + suffix) for _ in range(50)]
        shipping = [NamedConn("shipping" + suffix) for _ in range(50)]
        g = TableGraph()
        for i in range(25):
            g.hold(b"a%d" % i, billing[i])
            g.hold(b"b%d" % i, shipping[i])
        for i in range(25):
            g.wait(b"b%d" % i, billing[25 + i])
            g.wait(b"a%d" % i, shipping[25 + i])
        found = drain(g)
        assert found == [] and g.cycles == {}, (suffix, found)


def test_the_same_instance_waiting_for_itself_is_no_cycle() -> None:
    a1, a2 = NamedConn(US), NamedConn(US)
    g = TableGraph()
    g.hold(b"k", a1)
    g.wait(b"k", a2)
    assert drain(g) == [] and g.cycles == {}


def test_an_unnamed_instance_joins_its_connections() -> None:
    a1, a2 = NamedConn("#0123456789ab"), NamedConn("#0123456789ab")
    b1, b2 = NamedConn("b"), NamedConn("c")
    g = TableGraph()
    g.hold(b"k1", a1)
    g.hold(b"k2", b1)
    g.wait(b"k2", a2)
    g.wait(b"k1", b1)
    [cycle] = drain(g)
    assert sorted(cycle.asDict(_name)["clients"]) == ["#0123456789ab", "b"]
    del b2


def test_a_rename_while_waiting_keeps_the_waits_together() -> None:
    """
    A connection renamed (C{I}) while it waits: its wait ends under the
    client it began under, and nothing is left behind.
    """
    us1, eu1 = NamedConn(US), NamedConn(EU)
    g = TableGraph()
    g.hold(b"k1", eu1)
    g.wait(b"k1", us1)
    us1.name = "other"
    g.unwait(b"k1", us1)
    assert g._waits == {} and g._pinned == {}


# -- shared keys: ALL and ANY waits (issue 22) ---------------------------------

from lockservice.core.waitfor import (  # noqa: E402
    ALL,
    ANY,
    READ,
    WRITE,
    Wait,
    deadlockedClients,
    keyWaits,
)


def waitsOf(*keys: Any) -> list:  # type: ignore[type-arg]
    out = []
    for key, holders, queue, slots in keys:
        out += keyWaits(key, holders, queue, slots)
    return out


def test_exclusive_cycle_is_a_deadlock() -> None:
    w = waitsOf((b"k1", [("a", WRITE)], [("b", WRITE)], 1),
                (b"k2", [("b", WRITE)], [("a", WRITE)], 1))
    assert deadlockedClients(w) == {"a", "b"}


def test_a_writer_waits_for_every_reader() -> None:
    """
    Readers r1 and r2 hold k; writer w holds m and waits for k; r2 waits
    for m: w and r2 are deadlocked (w needs both readers gone); r1 is not.
    Without r2's wait, none is.
    """
    k = (b"k", [("r1", READ), ("r2", READ)], [("w", WRITE)], 1)
    assert deadlockedClients(waitsOf(k, (b"m", [("w", WRITE)], [], 1))) == set()
    assert deadlockedClients(waitsOf(k, (b"m", [("w", WRITE)], [("r2", READ)], 1))) == {"w", "r2"}


def test_a_reader_waits_for_the_writer_ahead_not_the_readers() -> None:
    """
    a (a reader) holds k; queued: writer b, then reader c.  c waits for b
    only (writers never starve); b for a.  a waiting for x, which c holds,
    closes a cycle a -> c -> b -> a; a waiting for y, held by another
    reader queued behind nobody, closes none.
    """
    [(_, bWait), (_, cWait)] = keyWaits(b"k", [("a", READ)], [("b", WRITE), ("c", READ)])
    assert (bWait.how, bWait.blockers) == (ALL, frozenset({"a"}))
    assert (cWait.how, cWait.blockers) == (ALL, frozenset({"b"}))
    k = (b"k", [("a", READ)], [("b", WRITE), ("c", READ)], 1)
    assert deadlockedClients(waitsOf(k, (b"x", [("c", WRITE)], [("a", WRITE)], 1))) == \
        {"a", "b", "c"}
    # d is a reader holding y with a: a reader behind no writer is granted,
    # so d waits for nothing: no deadlock.
    assert deadlockedClients(waitsOf(k, (b"y", [("d", READ)], [("a", WRITE)], 1))) == set()


def test_a_semaphore_waiter_is_deadlocked_only_when_every_holder_is() -> None:
    """
    h1 and h2 hold the 2 slots of s; q waits for a slot and holds t.  h1
    waiting for t is no deadlock (h2 frees a slot, q gets it, then t);
    h2 waiting for t too is one.
    """
    s = (b"s", [("h1", WRITE), ("h2", WRITE)], [("q", WRITE)], 2)
    [(_, qWait)] = keyWaits(*s)
    assert qWait.how == ANY and qWait.blockers == frozenset({"h1", "h2"})
    assert deadlockedClients(waitsOf(s, (b"t", [("q", WRITE)], [("h1", WRITE)], 1))) == set()
    assert deadlockedClients(waitsOf(
        s, (b"t", [("q", WRITE)], [("h1", WRITE), ("h2", WRITE)], 1))) == {"q", "h1", "h2"}


def test_waiting_for_oneself_is_no_deadlock() -> None:
    # A reader that asks to write the key it reads: its lease ends it.
    assert deadlockedClients(keyWaits(b"k", [("a", READ)], [("a", WRITE)])) == set()
    assert deadlockedClients(keyWaits(b"s", [("a", WRITE)], [("a", WRITE)], 3)) == set()
    assert deadlockedClients([("a", Wait(ANY, frozenset({"a"})))]) == set()


def test_any_of_nothing_is_met_and_a_chain_unwinds() -> None:
    # a -> b -> c, c free: nobody deadlocked, however long the chain.
    chain = [(i, Wait(ALL, frozenset({i + 1}))) for i in range(10000)]
    assert deadlockedClients(chain) == set()
    assert deadlockedClients(chain + [(10000, Wait(ALL, frozenset({0})))]) == set(range(10001))


def test_key_waits_cost_stays_linear_in_the_queue() -> None:
    """
    A long queue of readers and writers mixed: the waits' blockers add up
    to O(queue), not O(queue x writers) (each reader waits for the last
    writer ahead, each writer for the run since the one before it).
    """
    queue = [(i, READ if i % 3 else WRITE) for i in range(30000)]
    waits = keyWaits(b"k", [("h1", READ), ("h2", READ)], queue)
    assert sum(len(w.blockers) for _, w in waits) <= 2 * len(queue)
    assert waits[1][1].blockers == frozenset({0})  # reader 1: writer 0 ahead
    assert waits[3][1].blockers == frozenset({0, 1, 2})  # writer 3: the run since 0
    assert waits[0][1].blockers == frozenset({"h1", "h2"})


class SharedTable:
    """
    A table of shared keys for the graph: per key, its slots, holders and
    queue as (client, mode); C{cut} keys say their holders were cut at the
    cap (as a semaphore with more holders than the cap).
    """

    def __init__(self) -> None:
        self.keys: dict = {}  # type: ignore[type-arg]
        self.plain: dict = {}  # type: ignore[type-arg]
        self.cut: set = set()  # type: ignore[type-arg]

    def sharedOf(self, key: bytes, cap: int) -> Any:
        if key not in self.keys:
            return None
        slots, holders, queue = self.keys[key]
        if key in self.cut:
            return slots, holders[:cap], queue[:cap], True
        return slots, holders[:cap], queue[:cap], False

    def graph(self) -> WaitForGraph:
        return WaitForGraph(self.plain.get, sharedOf=self.sharedOf,
                            isShared=lambda key: key in self.keys)


def test_the_graph_finds_a_deadlock_through_every_holder_of_a_semaphore() -> None:
    t = SharedTable()
    t.keys[b"s"] = (2, [("h1", WRITE), ("h2", WRITE)], [("q", WRITE)])
    t.plain[b"t"] = "q"
    g = t.graph()
    g.wait(b"s", "q")
    g.wait(b"t", "h1")
    assert g.check(0.0) == []  # h2 frees a slot
    g.wait(b"t", "h2")
    [cycle] = g.check(1.0)
    assert cycle.shared and cycle.since == 1.0
    assert cycle.asDict()["deadlocked"] == ["h1", "h2", "q"]
    assert g.check(2.0) == [] and g.detected == 1
    # h2's wait ends: the deadlock is gone (checked again, forgotten).
    g.unwait(b"t", "h2")
    assert g.check(3.0) == [] and g.cycles == {}


def test_a_semaphore_whose_holders_were_cut_makes_no_false_deadlock() -> None:
    """
    Past the cap, a semaphore's holders are not all known: its waiters'
    ANY waits are left out (any holder not seen may free a slot).
    """
    t = SharedTable()
    t.keys[b"s"] = (2, [("h1", WRITE), ("h2", WRITE)], [("q", WRITE)])
    t.plain[b"t"] = "q"
    t.cut.add(b"s")
    g = t.graph()
    g.wait(b"s", "q")
    g.wait(b"t", "h1")
    g.wait(b"t", "h2")
    assert g.check(0.0) == [] and g.cycles == {}


def test_a_burst_of_waits_on_a_big_shared_key_reads_it_once_per_check() -> None:
    """
    1,000 readers queue behind a writer on a key 500 readers hold: the
    checks of one call share the key's view (read once), and a client's
    checks through shared keys are noted once while pending.
    """
    t = SharedTable()
    holders = [(f"h{i}", READ) for i in range(500)]
    queue = [("w", WRITE)] + [(f"r{i}", READ) for i in range(1000)]
    t.keys[b"k"] = (1, holders, queue)
    reads = []
    sharedOf = t.sharedOf

    def counted(key: bytes, cap: int) -> Any:
        reads.append(key)
        return sharedOf(key, cap)

    g = WaitForGraph(t.plain.get, sharedOf=counted, isShared=lambda key: key in t.keys)
    for who, _ in queue:
        g.wait(b"k", who)
    g.hold(b"k", "w")  # w's shared check is pending already: only the exclusive one
    assert g.pending == len(queue) + 1
    calls = 0
    while g.pending:
        assert g.check(0.0, budget=100000) == []
        calls += 1
    assert len(reads) == calls < 20  # once per call, not once per check (1,002)
