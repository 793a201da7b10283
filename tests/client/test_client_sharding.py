"""
Several clusters: each key maps to one cluster by rendezvous hashing.
"""

from __future__ import annotations

from collections import Counter

import pytest
from twisted.internet.task import Clock

from lockservice.client import connect
from lockservice.client.api import parseClusters
from lockservice.client.sharding import choose
from tests.support.fakenet import Network, result

KEYS = [f"orders/{i}".encode() for i in range(20000)]


def test_keys_spread_evenly_over_clusters() -> None:
    ids = [b"a:1", b"b:1", b"c:1"]
    counts = Counter(choose(ids, key) for key in KEYS)
    assert set(counts) == {0, 1, 2}
    for n in counts.values():
        assert abs(n - len(KEYS) / 3) < len(KEYS) * 0.03


def test_adding_a_cluster_moves_about_a_quarter_of_keys_and_only_to_it() -> None:
    three = [b"a:1", b"b:1", b"c:1"]
    four = three + [b"d:1"]
    moved = 0
    for key in KEYS:
        before, after = choose(three, key), choose(four, key)
        if before != after:
            moved += 1
            assert after == 3, "a key moved between two old clusters"
    assert abs(moved / len(KEYS) - 0.25) < 0.02


def test_removing_a_cluster_moves_only_its_own_keys() -> None:
    four = [b"a:1", b"b:1", b"c:1", b"d:1"]
    three = [b"a:1", b"c:1", b"d:1"]  # b:1 gone
    for key in KEYS[:5000]:
        before = four[choose(four, key)]
        after = three[choose(three, key)]
        if before != b"b:1":
            assert after == before


def test_mapping_is_stable_and_independent_of_cluster_order() -> None:
    ids = [b"a:1", b"b:1", b"c:1"]
    for key in KEYS[:2000]:
        assert ids[choose(ids, key)] == ids[::-1][choose(ids[::-1], key)]


def test_parse_clusters_forms() -> None:
    assert parseClusters("a:1,b:2;c:3") == ([["a:1", "b:2"], ["c:3"]], None)
    assert parseClusters(["a:1", "b:2"]) == ([["a:1", "b:2"]], None)
    assert parseClusters([["a:1"], ["c:3", "d:4"]]) == ([["a:1"], ["c:3", "d:4"]], None)
    assert parseClusters({"east": ["a:1"], "west": ["c:3"]}) == (
        [["a:1"], ["c:3"]], [b"east", b"west"])


def test_client_sends_each_key_to_its_cluster_and_releases_there() -> None:
    clock = Clock()
    net = Network()
    clusters = [["a:1", "a:2"], ["b:1"], ["c:1", "c:2", "c:3"]]
    client = connect(clock, clusters, endpointFor=net.endpointFor)
    # Connections per client: one per address, two for a one-address cluster.
    assert len(client.slots) == 2 + 2 + 3
    ids = [b"a:1", b"b:1", b"c:1"]
    for i in range(30):
        key = f"k{i}"
        d = client.acquire(key, 30, 0)
        carrier = net.carrier()
        assert carrier.address in clusters[choose(ids, key.encode())]
        assert carrier.sent() == [f"A {key} 30 0".encode()]
        carrier.answer(f"A {key} {i + 1}".encode())
        lock = result(d)
        r = client.release(lock)
        releaser = net.carrier()
        assert releaser.address in clusters[choose(ids, key.encode())]
        assert releaser.sent() == [f"R {key} {i + 1}".encode()]
        releaser.answer(f"R {key} OK".encode())
        assert result(r) is True


def test_when_connected_needs_every_cluster() -> None:
    clock = Clock()
    net = Network()
    net.down["b:1"] = True
    client = connect(clock, [["a:1"], ["b:1"]], endpointFor=net.endpointFor)
    d = client.whenConnected(timeout=5)
    assert not d.called
    net.down["b:1"] = False
    clock.advance(3)
    assert d.called


def test_duplicate_cluster_ids_are_refused() -> None:
    with pytest.raises(ValueError):
        connect(Clock(), [["a:1", "b:1"], ["a:1"]], endpointFor=Network().endpointFor)
