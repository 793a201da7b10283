"""
The shared secret rotated one node at a time, under load, with no outage:
every node first accepts the new secret (--accept-secret), then proves it
(--secret new, still accepting the old), then drops the old one.  Real
processes, each restart a SIGTERM (a handoff when it is the active) and a
start with --state-dir, so the held locks and the token mark stay.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import List

import pytest

from lockservice.testing.harness import Cluster, Node, probeRole, waitFor
from tests.support.lockers import Lockers

pytestmark = pytest.mark.slow


def secretFile(where: Path, name: str, text: str) -> str:
    path = where / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def test_the_secret_rotates_one_node_at_a_time_under_load_with_no_outage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    old = secretFile(tmp_path, "old", "the-old-secret-of-this-cluster")
    new = secretFile(tmp_path, "new", "the-new-secret-of-this-cluster")
    c = Cluster(3, logDir=str(tmp_path))
    for i, node in enumerate(c.nodes):
        node.args = [*node.args, "--secret", old, "--state-dir", str(tmp_path / f"state{i}")]
    c.start()
    lockers = None
    try:
        waitFor(lambda: [probeRole(n.port) for n in c.nodes]
                == ["active", "M " + c.nodes[0].address, "M " + c.nodes[0].address],
                30, what="the cluster settled")
        lockers = Lockers(",".join(c.addresses()), "rotation").start()
        waitFor(lambda: lockers.grants >= 50, 30, what="lockers running")
        watching = threading.Event()

        def watch() -> None:
            # Two nodes serving as active at once would be the split brain a
            # rotation done wrong makes (two nodes of the new secret that no
            # longer hear the old active).
            while not watching.is_set():
                roles = [probeRole(n.port, timeout=1) for n in c.nodes]
                if roles.count("active") > 1:
                    splits.append(roles)
                time.sleep(0.05)

        splits: List[List[object]] = []
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def restart(node: Node, secrets: List[str]) -> None:
            before = lockers.grants
            node.signal(signal.SIGTERM)
            assert node.process is not None and node.process.wait(20) in (0, -signal.SIGTERM)
            args = list(node.args)
            i = args.index("--secret")
            del args[i:i + 2]
            if "--accept-secret" in args:
                i = args.index("--accept-secret")
                del args[i:i + 2]
            args += ["--secret", secrets[0]]
            if len(secrets) > 1:
                args += ["--accept-secret", secrets[1]]
            node.args = args
            node.start(wait=True, timeout=30)
            waitFor(lambda: lockers.grants >= before + 30, 60,
                    what=f"lockers served after {node.name}'s restart")

        for step in ([old, new], [new, old], [new]):
            for node in reversed(c.nodes):  # the active last
                restart(node, step)
        waitFor(lambda: [probeRole(n.port) for n in c.nodes]
                == ["active", "M " + c.nodes[0].address, "M " + c.nodes[0].address],
                30, what="one active and two standbys on the new secret alone")
        watching.set()
        watcher.join(10)
        assert splits == [], splits[:3]
        for node in c.nodes:
            log = Path(node.logPath()).read_text()
            assert "does not share our --secret" not in log, (node.name, log[-3000:])
    finally:
        if lockers is not None:
            lockers.finish()
        c.stop()
    print(f"{lockers.grants} grants and {lockers.released} releases answered during the "
          f"rotation; lost {len(lockers.lost)}, tokens fallen {len(lockers.fallen)}")
    assert lockers.lost == [], lockers.lost[:5]
    assert lockers.fallen == [], lockers.fallen[:5]
