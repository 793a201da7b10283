"""
A standby (re)joins a node holding many keys: the snapshot is streamed in
chunks, heartbeats keep flowing both ways (no false failover), and the
standby ends with every key (issue 15).  The 1M-key figures are in
docs/cluster.md; this test uses fewer keys and a generous bound.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from lockservice.testing.bulk import holdMany
from lockservice.testing.harness import LineClient, probeRole, waitFor

pytestmark = pytest.mark.slow

KEYS = int(os.environ.get("LOCKSERVICE_SNAPSHOT_KEYS", "200000"))
PEER_TIMEOUT = 1.0


def test_standby_joins_a_big_table_without_missing_heartbeats(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(2, start=False)
    node0, node1 = c.nodes
    node0.start()
    waitFor(lambda: probeRole(node0.port) == "active", 20, what="node0 active alone")
    assert holdMany(node0.port, KEYS) == KEYS
    started = time.monotonic()
    node1.start()
    line = waitFor(lambda: re.search(r"synchronised from .* \((\d+) held keys\) in ([\d.]+) s "
                                     r"\(longest silence from it meanwhile: (\d+) ms\)",
                                     node1.tail(400)), 60, what="node1 synchronised")
    elapsed = time.monotonic() - started
    keys, seconds, silence = int(line.group(1)), float(line.group(2)), int(line.group(3))
    sent = waitFor(lambda: re.search(r"snapshot of \d+ held keys sent to .* "
                                     r"\(longest silence from it meanwhile: (\d+) ms\)",
                                     node0.tail(400)), 30, what="node0 sent the snapshot")
    print(f"{keys} keys: synchronised in {seconds:.2f} s ({elapsed:.2f} s from start), "
          f"longest silence seen by the standby {silence} ms, by the active {sent.group(1)} ms")
    assert keys == KEYS
    assert silence < PEER_TIMEOUT * 1000 / 2
    assert int(sent.group(1)) < PEER_TIMEOUT * 1000 / 2
    assert elapsed < 45
    for node in (node0, node1):
        assert "lost peer" not in node.tail(400), node.name
    # And the standby's state is the active's: it fails over with the keys.
    node0.kill()
    waitFor(lambda: probeRole(node1.port) == "active", 10, what="node1 active")
    with LineClient(node1.port) as conn:
        assert conn.ask(b"A bulk/%d 30 0.2" % (KEYS - 1)) == b"T bulk/%d" % (KEYS - 1)
