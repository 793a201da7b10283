"""
Shared fixtures: real twistd nodes on free loopback ports, always cleaned up.
"""

from __future__ import annotations

import ssl
from typing import Callable, Iterator, List, Optional

import pytest

from lockservice.testing.harness import Cluster, Node, freePort


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
