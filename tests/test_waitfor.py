"""
The wait-for graph: deadlock cycles (pure).
"""

from __future__ import annotations

from lockservice.core.waitfor import WaitForGraph


def test_cycle_of_two() -> None:
    g = WaitForGraph()
    assert g.hold(b"k1", "x", 1.0) == []
    assert g.hold(b"k2", "y", 1.0) == []
    assert g.wait(b"k2", "x", 2.0) == []
    [cycle] = g.wait(b"k1", "y", 3.0)
    assert cycle.steps == (("x", b"k2"), ("y", b"k1"))
    assert cycle.since == 3.0
    assert cycle.describe() == "x waits for k2 (held by y) -> y waits for k1 (held by x)"
    assert list(g.cycles.values()) == [cycle] and g.detected == 1


def test_cycle_of_three_closed_by_a_grant() -> None:
    """
    The last edge of the cycle is a hand-over, not a new wait.
    """
    g = WaitForGraph()
    g.hold(b"a", "x", 0)
    g.hold(b"b", "y", 0)
    g.hold(b"c", "old", 0)
    assert g.wait(b"b", "x", 0) == []
    assert g.wait(b"c", "y", 0) == []
    assert g.wait(b"c", "z", 0) == []
    assert g.wait(b"a", "z", 0) == []
    # c passes from "old" to z: z holds c, which y waits for.
    [cycle] = g.hold(b"c", "z", 5.0)
    assert len(cycle.steps) == 3
    assert set(cycle.clients) == {"x", "y", "z"}
    assert cycle.steps == (("x", b"b"), ("y", b"c"), ("z", b"a"))


def test_no_false_cycle_after_a_waiter_is_withdrawn() -> None:
    g = WaitForGraph()
    g.hold(b"k1", "x", 0)
    g.hold(b"k2", "y", 0)
    g.wait(b"k2", "x", 0)
    g.unwait(b"k2", "x")  # x's wait timed out / its connection closed
    assert g.wait(b"k1", "y", 0) == []
    assert g.cycles == {}


def test_cycle_forgotten_when_broken_and_reported_again_when_it_reforms() -> None:
    g = WaitForGraph()
    g.hold(b"k1", "x", 0)
    g.hold(b"k2", "y", 0)
    g.wait(b"k2", "x", 0)
    assert len(g.wait(b"k1", "y", 0)) == 1
    # Found again from another edge: not a second report.
    assert g.wait(b"k1", "y", 0) == []
    g.unwait(b"k1", "y")
    assert len(g.cycles) == 1  # y still has one wait for k1
    g.unwait(b"k1", "y")
    assert g.cycles == {}
    assert len(g.wait(b"k1", "y", 9)) == 1
    g.unhold(b"k2")  # released: y no longer blocks x
    assert g.cycles == {} and g.detected == 2


def test_self_wait_and_unknown_holders_are_not_cycles() -> None:
    g = WaitForGraph()
    g.hold(b"k", "x", 0)
    assert g.wait(b"k", "x", 0) == []
    g.hold(b"r", None, 0)  # replicated grant: holder unknown
    assert g.wait(b"r", "x", 0) == []
    assert g.cycles == {}


def test_search_is_bounded() -> None:
    """
    A long chain is not searched beyond maxSearch edges: no cycle is
    reported, and the call returns.
    """
    g = WaitForGraph(maxSearch=50)
    for i in range(200):
        g.hold(b"k%d" % i, f"c{i}", 0)
        g.wait(b"k%d" % (i + 1), f"c{i}", 0)
    g.hold(b"k200", "c200", 0)
    assert g.wait(b"k0", "c200", 0) == []
    g2 = WaitForGraph()
    for i in range(200):
        g2.hold(b"k%d" % i, f"c{i}", 0)
        g2.wait(b"k%d" % (i + 1), f"c{i}", 0)
    g2.hold(b"k200", "c200", 0)
    [cycle] = g2.wait(b"k0", "c200", 0)
    assert len(cycle.steps) == 201
