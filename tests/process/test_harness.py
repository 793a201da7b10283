"""
The test harness's own promises: a port it picks for a node cannot be taken
by another test process before the node binds it.
"""

from __future__ import annotations

import socket

import pytest

from lockservice.testing import harness


def test_ports_are_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    An outgoing connection of the other pytest-xdist worker is given a port
    of the ephemeral range; a node port chosen there could be taken before
    the node binds it (CI saw a node exit with "Address already in use").
    """
    low = harness._ephemeralLow()
    for worker in ("", "gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        for port in harness.freePorts(20):
            assert port < low


def test_two_workers_never_share_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        chosen[worker] = set(harness.freePorts(900))
    assert not chosen["gw0"] & chosen["gw1"]


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    following = harness.freePort() + 1
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", following))
        busy.listen()
        assert harness.freePort() == following + 1
