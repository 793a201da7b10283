"""
A rolling upgrade for real: a 3-node cluster of an earlier release (the
commit named in tests/upgrade-from.txt: the first that negotiates the peer
protocol) upgraded one node at a time to this tree, under a steady load of
lockers.  No answered change is lost and every key's fencing tokens rise
throughout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path
from typing import Dict

import pytest

from lockservice.testing.harness import Cluster, Node, probeRole, waitFor
from tests.support.lockers import Lockers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


# lockservice 0.1.0: it speaks peer protocol 2 only.
RELEASE_0_1_0 = "f342c32"


def earlierRelease(into: Path, commit: str = "") -> Path:
    """
    The source tree of C{commit} (by default the one named in
    upgrade-from.txt), extracted from this repository's history.
    """
    commit = commit or (ROOT / "tests" / "upgrade-from.txt").read_text().split()[0]
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.fail(f"cannot read commit {commit} from the repository's history: {e}")
    tree = into / f"earlier-{commit[:12]}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def earlierEnvironment(tree: Path) -> "tuple[Dict[str, str], str]":
    """
    The environment and working directory of a node that runs C{tree}
    (both come before the installed lockservice in its sys.path).
    """
    path = [str(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(path)}, str(tree)


def runsTree(node: Node, tree: Path) -> bool:
    """
    Whether C{node}'s process, with its environment and working
    directory, imports lockservice from C{tree}.
    """
    out = subprocess.run(
        [sys.executable, "-c", "import lockservice; print(lockservice.__file__)"],
        capture_output=True, text=True, cwd=node.cwd, env={**os.environ, **node.env},
        timeout=60)
    return out.stdout.strip().startswith(str(tree))


def test_a_cluster_upgraded_one_node_at_a_time_under_load_loses_nothing(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    earlier = earlierRelease(tmp_path)
    c = Cluster(3, logDir=str(tmp_path))
    for node in c.nodes:
        node.env, node.cwd = earlierEnvironment(earlier)
    c.start()
    lockers = None
    try:
        waitFor(lambda: [probeRole(n.port) for n in c.nodes]
                == ["active", "M " + c.nodes[0].address, "M " + c.nodes[0].address],
                30, what="the earlier release's cluster settled")
        for node in c.nodes:  # they do run the earlier tree
            assert runsTree(node, earlier)
        lockers = Lockers(",".join(c.addresses()), "upgrade").start()
        waitFor(lambda: lockers.grants >= 50, 30, what="lockers running")

        def upgrade(node: Node) -> None:
            before = lockers.grants
            node.signal(signal.SIGTERM)
            assert node.process is not None and node.process.wait(20) in (0, -signal.SIGTERM)
            node.env, node.cwd = {}, None  # this tree
            node.start(wait=True, timeout=30)
            waitFor(lambda: lockers.grants >= before + 50, 60,
                    what=f"lockers served after {node.name}'s upgrade")

        for node in reversed(c.nodes):  # the lowest priority first; the active last
            upgrade(node)
        waitFor(lambda: probeRole(c.nodes[0].port) == "active", 30,
                what="node0 active again, on this tree")
    finally:
        if lockers is not None:
            lockers.finish()
        c.stop()
    print(f"{lockers.grants} grants and {lockers.released} releases answered during the "
          f"upgrade; lost {len(lockers.lost)}, tokens fallen {len(lockers.fallen)}")
    assert lockers.lost == [], lockers.lost[:5]
    assert lockers.fallen == [], lockers.fallen[:5]
    assert lockers.grants > 200


def test_a_peer_of_0_1_0_is_refused_and_reported_not_joined(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    A node of lockservice 0.1.0 (peer protocol 2 only) beside one of this
    tree: no link comes up, and this tree's node says why on /status
    (incompatible_peers) and once in its log, and runs alone.
    """
    import json
    import urllib.request

    from lockservice.testing.harness import freePort

    old = earlierRelease(tmp_path, RELEASE_0_1_0)
    c = Cluster(2, logDir=str(tmp_path))
    http = freePort()
    c.nodes[0].args += ["--http", f"tcp:{http}:interface=127.0.0.1"]
    c.nodes[1].env, c.nodes[1].cwd = earlierEnvironment(old)
    c.start()
    try:
        def incompatible() -> object:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=10) as r:
                return json.loads(r.read())["incompatible_peers"]

        assert waitFor(incompatible, 20, what="the 0.1.0 peer reported") == [
            c.nodes[1].address]
        time.sleep(1)
        log = Path(c.nodes[0].logPath()).read_text()
        assert log.count("speaks no peer protocol version of this node") == 1, log[-2000:]
    finally:
        c.stop()
