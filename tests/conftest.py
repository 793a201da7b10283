"""
Shared fixtures: real twistd nodes on free loopback ports, always cleaned up.
"""

from __future__ import annotations

import ssl
from typing import Callable, Iterator, List, Optional

import pytest

from lockservice.testing.harness import Cluster, Node, freePort

# The test files whose tests measure time or stalls (a reactor turn under
# 0.5 s, no missed heartbeat, the benchmarks, the chaos run's checkers):
# marked `serial`, so tox runs them alone after the rest, which runs on two
# workers (pytest-xdist).  Every other test waits for conditions with
# bounds that hold on a busy machine (a partition's heal within 5 s takes
# about 1 s; its tests mostly sleep through the partition).
SERIAL_FILES = frozenset({
    "test_abuse.py", "test_bench.py", "test_chaos.py", "test_clock.py",
    "test_operator.py", "test_server_process.py", "test_snapshot.py",
    "test_stalls.py", "test_client_sync.py",
})


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # `tox -e py311 -- tests/core/test_core.py` runs both passes on one file: the
    # pass that file has no test in is not a failure.
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.option.markexpr:
        session.exitstatus = pytest.ExitCode.OK


@pytest.fixture
def spawn(tmp_path) -> Iterator[Callable[..., Node]]:  # type: ignore[no-untyped-def]
    """
    Start single nodes: C{spawn(args=[...])}; every one is killed at the end.
    """
    started: List[Node] = []

    def start(port: int = 0, args: List[str] = None, wait: bool = True,
              tls: Optional[ssl.SSLContext] = None) -> Node:
        if args is None:
            args = []
        node = Node(port or freePort(), args=args, logDir=str(tmp_path), tls=tls)
        started.append(node)
        return node.start(wait=wait)

    yield start
    for node in started:
        node.stop()


@pytest.fixture
def cluster(tmp_path) -> Iterator[Callable[..., Cluster]]:  # type: ignore[no-untyped-def]
    made: List[Cluster] = []

    def make(size: int, args: List[str] = None, start: bool = True) -> Cluster:
        if args is None:
            args = []
        c = Cluster(size, args=args, logDir=str(tmp_path))
        made.append(c)
        return c.start() if start else c

    yield make
    for c in made:
        c.stop()
