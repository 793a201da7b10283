"""
The bounded event ring (pure).
"""

from __future__ import annotations

from lockservice.core.events import GRANT, RELEASE, EventRing


def test_since_returns_newer_events_oldest_first() -> None:
    ring = EventRing(capacity=100)
    for i in range(5):
        ring.add(1000.0 + i, GRANT, b"k%d" % (i % 2), 10 + i, "w", None)
    events, nxt = ring.since(2)
    assert [e.seq for e in events] == [3, 4, 5] and nxt == 5
    assert events[0].asDict() == {"seq": 3, "time": 1002.0, "type": "grant", "key": "k0",
                                  "token": 12, "who": "w", "detail": None}
    assert ring.since(5) == ([], 5)
    keyed, nxt = ring.since(0, key=b"k1")
    assert [e.seq for e in keyed] == [2, 4] and nxt == 5


def test_ring_is_bounded_and_sequence_keeps_rising() -> None:
    ring = EventRing(capacity=10)
    for i in range(25):
        ring.add(float(i), RELEASE, b"k", i)
    assert len(ring) == 10
    events, nxt = ring.since(0)
    assert [e.seq for e in events] == list(range(16, 26)) and nxt == 25
    events, _ = ring.since(20)
    assert [e.seq for e in events] == [21, 22, 23, 24, 25]


def test_limit_and_next() -> None:
    ring = EventRing(capacity=100)
    for i in range(10):
        ring.add(float(i), GRANT, b"k", i)
    events, nxt = ring.since(0, limit=4)
    assert [e.seq for e in events] == [1, 2, 3, 4] and nxt == 4
    events, nxt = ring.since(nxt, limit=4)
    assert [e.seq for e in events] == [5, 6, 7, 8] and nxt == 8


def test_since_ahead_of_this_process() -> None:
    """
    A reader that followed an earlier process of this node asks beyond
    the newest event: it is told where this process stands.
    """
    ring = EventRing()
    ring.add(1.0, GRANT, b"k", 1)
    assert ring.since(500) == ([], 1)
    assert ring.since(-3)[1] == 1


def test_a_reader_that_fell_behind_is_told() -> None:
    """
    C{since} older than the ring: the events in between are gone, and
    L{EventRing.missed} says how many (0 when nothing was lost).
    """
    ring = EventRing(capacity=10)
    assert ring.oldest == 1 and ring.missed(0) == 0
    for i in range(25):
        ring.add(float(i), RELEASE, b"k", i)
    assert ring.oldest == 16
    assert ring.missed(3) == 12  # events 4..15 were dropped
    assert ring.missed(15) == 0 and ring.missed(20) == 0 and ring.missed(99) == 0
    assert ring.missed(0) == 15
    events, _ = ring.since(3)
    assert events[0].seq == 16
