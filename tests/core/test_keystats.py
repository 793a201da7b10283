"""
The streaming sketch, the per-key statistics and the per-second series
(pure: no clock, no I/O).
"""

from __future__ import annotations

import math
import random

import pytest

from lockservice.core.series import Series
from lockservice.core.sketch import KeyStats, Sketch


def exactQuantile(values: list, q: float) -> float:  # type: ignore[type-arg]
    ordered = sorted(values)  # nearest rank
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sketch_quantiles_within_seven_percent(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(0, 2) for _ in range(20000)]
    sketch = Sketch()
    for v in values:
        sketch.add(v)
    assert sketch.count == 20000
    assert sketch.mean == pytest.approx(sum(values) / len(values))
    for q in (0.5, 0.9, 0.99):
        assert sketch.quantile(q) == pytest.approx(exactQuantile(values, q), rel=0.075)
    assert sketch.high == max(values)


def test_sketch_memory_is_bounded() -> None:
    """
    Values spread over 14 orders of magnitude (from below the floor to
    beyond the ceiling) still use BUCKETS counters, and every quantile
    stays accurate within the range.
    """
    sketch = Sketch()
    values = [10 ** (i / 1000) * 1e-7 for i in range(17000)]
    for v in values:
        sketch.add(v)
    assert sketch.counts is not None and len(sketch.counts) == Sketch.BUCKETS
    assert sum(sketch.counts) + sketch.zeros == sketch.count == len(values)
    for q in (0.2, 0.5, 0.9):  # (the top 9%: beyond the ceiling)
        assert sketch.quantile(q) == pytest.approx(exactQuantile(values, q), rel=0.075)
    assert sketch.quantile(0.99) == sketch.quantile(1.0) == max(values)


def test_sketch_holds_of_tens_of_microseconds_are_not_reported_as_zero() -> None:
    """
    A lock held for 20-80 microseconds (a fast critical section on a quiet
    node) keeps its quantiles within the sketch's ~7%, down to the
    summary's display resolution (one microsecond): they are not lumped
    into one bucket reported as 0.
    """
    rng = random.Random(4)
    values = [rng.uniform(20e-6, 80e-6) for _ in range(5000)]
    sketch = Sketch()
    for v in values:
        sketch.add(v)
    for q in (0.01, 0.5, 0.99):
        assert sketch.quantile(q) == pytest.approx(exactQuantile(values, q), rel=0.075)
    summary = sketch.summary()
    assert summary["p50"] == pytest.approx(exactQuantile(values, 0.5), rel=0.075)
    assert summary["p50"] > 0  # type: ignore[operator]
    # Exact zeros (a grant that never waited) still read back as zero.
    sketch.add(0.0)
    assert sketch.quantile(0.0) == 0.0


def test_sketch_small_and_empty() -> None:
    sketch = Sketch()
    assert sketch.quantile(0.99) is None and sketch.mean is None
    assert sketch.summary() == {"count": 0, "mean": None, "p50": None, "p99": None,
                                "max": None}
    sketch.add(0.0)
    sketch.add(2.0)
    assert sketch.quantile(0.0) == 0.0
    assert sketch.quantile(1.0) == pytest.approx(2.0, rel=0.075)
    assert sketch.mean == 1.0


def test_keystats_counts() -> None:
    stats = KeyStats()
    stats.queued(b"k")
    stats.granted(b"k", 0.0)
    stats.granted(b"k", 2.5)
    stats.dropped(b"k", 1.0, expired=False)
    stats.dropped(b"k", 30.0, expired=True)
    stats.timedOut(b"k", 5.0)
    record = stats.get(b"k")
    assert record is not None
    data = record.asDict()
    assert (data["grants"], data["releases"], data["expiries"], data["timeouts"],
            data["queued"]) == (2, 1, 1, 1, 1)
    assert data["hold_seconds"]["count"] == 2  # type: ignore[index]
    assert data["hold_seconds"]["mean"] == 15.5  # type: ignore[index]
    assert data["wait_seconds"]["count"] == 3  # type: ignore[index]


def test_keystats_keeps_the_busiest_keys_in_bounded_memory() -> None:
    stats = KeyStats(capacity=100)
    for round_ in range(50):
        for hot in range(10):
            stats.granted(b"hot%d" % hot, 0.0)
        for cold in range(100):
            stats.granted(b"cold-%d-%d" % (round_, cold), 0.0)
        assert len(stats) <= 125
    top = [key for key, _ in stats.top(10)]
    assert sorted(top) == sorted(b"hot%d" % i for i in range(10))
    assert stats.get(b"hot3").grants == 50  # type: ignore[union-attr]
    assert stats.evicted > 4000


@pytest.mark.parametrize("newKeys", [30, 60, 100, 120, 250, 1000])
def test_keys_busier_now_displace_keys_as_little_used_before_them(newKeys: int) -> None:
    """
    A full table of keys used once does not keep out new keys used as
    often, nor then more (found from outside: 1,000 keys used once kept
    keys used ten times each out of the statistics for good).
    """
    stats = KeyStats(capacity=100)
    for old in range(100):
        stats.granted(b"old-%d" % old, 0.0)
        stats.dropped(b"old-%d" % old, 0.001, False)
    for _ in range(10):
        # Pipelined: every acquire, then every release (a new key is
        # counted once before it is counted twice).
        for new in range(newKeys):
            stats.granted(b"new-%d" % new, 0.0)
        for new in range(newKeys):
            stats.dropped(b"new-%d" % new, 0.001, False)
    top = [key for key, _ in stats.top(100)]
    assert all(key.startswith(b"new-") for key in top[:min(newKeys, 100)])
    if newKeys <= 100:  # all of them fit: each counted from its first use, or its second
        assert all(stats.get(b"new-%d" % new).grants >= 9  # type: ignore[union-attr]
                   for new in range(newKeys))


def test_series_per_second() -> None:
    series = Series(span=60)
    series.granted(100.2)
    series.granted(100.9)
    series.queued(100.5)
    series.held(101.1, 2.0)
    series.held(101.7, 4.0)
    last = series.last(103.0, 3)
    assert [s["ago"] for s in last] == [3, 2, 1]
    assert last[0]["grants"] == 2 and last[0]["waits"] == 1
    assert last[1]["holds"] == 2 and last[1]["hold_mean"] == 3.0 and last[1]["hold_max"] == 4.0
    assert last[2]["grants"] == 0
    # A minute later the slots are reused, not summed.
    series.granted(160.5)
    assert series.last(161.0, 1)[0]["grants"] == 1
    assert all(s["grants"] == 0 for s in series.last(161.0, 59)[:-1])
