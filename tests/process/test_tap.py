"""
Command-line options of twistd lockservice (no process started).
"""

from __future__ import annotations

import sys
from typing import List

import pytest

from lockservice.tap import Options


def parse(args: List[str]) -> Options:
    options = Options()
    options.parseOptions(args)
    return options


@pytest.fixture
def secret(tmp_path) -> List[str]:  # type: ignore[no-untyped-def]
    path = tmp_path / "secret"
    path.write_text("a-secret-long-enough-for-peers\n")
    return ["--secret", str(path)]


def test_defaults() -> None:
    o = parse([])
    assert o["listen"] == "tcp:7700"
    assert o["max-lease"] == 86400.0 and o["max-wait"] == 86400.0
    assert o["heartbeat"] == 0.1 and o["peer-timeout"] == 1.0
    assert o["peerList"] == [] and o["secretBytes"] == b""


def test_node_entry_gives_listen_endpoint(secret) -> None:  # type: ignore[no-untyped-def]
    o = parse(["--peers", "127.0.0.1:7701,127.0.0.1:7702", "--node", "127.0.0.1:7702"] + secret)
    assert o["self"] == "127.0.0.1:7702"
    assert o["listen"] == "tcp:7702:interface=127.0.0.1"


def test_node_inferred_from_listen_port(secret) -> None:  # type: ignore[no-untyped-def]
    o = parse(["--peers", "127.0.0.1:7701,127.0.0.1:7702", "--listen", "tcp:7701"] + secret)
    assert o["self"] == "127.0.0.1:7701"


def test_node_inferred_from_local_address(secret) -> None:  # type: ignore[no-untyped-def]
    # 192.0.2.1 (TEST-NET-1) is never an address of this machine.
    o = parse(["--peers", "192.0.2.1:7700,127.0.0.1:7700"] + secret)
    assert o["self"] == "127.0.0.1:7700"


@pytest.mark.parametrize("args, message", [
    (["--peers", "127.0.0.1:1,127.0.0.1:2"], "give --node"),
    (["--peers", "a:1,b:2", "--node", "c:3"], "is not in --peers"),
    (["--node", "a:1"], "--node needs --peers"),
    (["--peers", "nonsense"], "is not host:port"),
    (["--peers", "127.0.0.1:1,127.0.0.1:2", "--node", "127.0.0.1:1"], "--peers needs --secret"),
    (["--heartbeat", "2", "--peer-timeout", "1"], "must be longer than --heartbeat"),
    (["--max-lease", "0"], "--max-lease must be a number of seconds > 0"),
    (["--max-wait", "inf"], "--max-wait must be a number of seconds"),
])
def test_bad_options_exit_2_with_one_line(capsys, args, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        parse(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_secret_file_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "s"
    secret.write_text("  hunter2-hunter2-hunter2\n")
    assert parse(["--secret", str(secret)])["secretBytes"] == b"hunter2-hunter2-hunter2"


@pytest.mark.parametrize("content", ["s3cret", " 15-bytes-secret \n", "x" * 15])
def test_short_secret_is_refused_in_one_line(tmp_path, capsys, content) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 21 item 13: the docs say long and random; under 16 bytes (after
    the surrounding whitespace is stripped) is refused, exit 2.
    """
    secret = tmp_path / "s"
    secret.write_text(content)
    with pytest.raises(SystemExit) as e:
        parse(["--secret", str(secret)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at least 16 bytes" in err and str(secret) in err, err
    secret.write_text("x" * 16)
    assert parse(["--secret", str(secret)])["secretBytes"] == b"x" * 16


def test_ipv6_node_entry_gives_escaped_listen_endpoint(secret) -> None:  # type: ignore[no-untyped-def]
    o = parse(["--peers", "[::1]:7701,[::1]:7702", "--node", "[::1]:7702"] + secret)
    assert o["listen"] == "tcp:7702:interface=\\:\\:1"


def test_make_service_runs_leases_and_waits_on_the_monotonic_clock(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """
    The node built by makeService must not follow the wall clock: here the
    reactor's clock is a wall clock that jumps a day ahead (NTP, an
    operator, a VM resume).  Neither a 10 s lease nor a 5 s wait may end.
    """
    import twisted.internet
    from twisted.internet.testing import MemoryReactorClock, StringTransport

    from lockservice.server.protocol import LockFactory
    from lockservice.server.service import LockService
    from lockservice.tap import makeService

    wall = MemoryReactorClock()
    wall.advance(1_800_000_000)  # reactor.seconds() is this "wall clock"
    monkeypatch.setattr(twisted.internet, "reactor", wall, raising=False)
    root = makeService(parse(["--listen", "tcp:0:interface=127.0.0.1"]))
    [locks] = [s for s in root if isinstance(s, LockService)]  # type: ignore[attr-defined]
    factory = LockFactory(locks)
    holder, waiter = factory.buildProtocol(None), factory.buildProtocol(None)
    for proto in (holder, waiter):
        proto.makeConnection(StringTransport())
    holder.dataReceived(b"A k 10 0\n")
    waiter.dataReceived(b"A k 10 5\n")
    token = locks.table.holder(b"k").token  # type: ignore[union-attr]
    wall.advance(86400)
    holder_ = locks.table.holder(b"k")
    assert holder_ is not None and holder_.token == token, "a wall-clock step ended a lease"
    assert locks.table.queueLength(b"k") == 1, "a wall-clock step ended a wait"
    assert locks.stats.expirations == 0 and locks.stats.timeouts == 0


def test_make_service_fixes_mallocs_mmap_threshold(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """
    The node turns off glibc's moving mmap threshold (a held key costs
    about 24 bytes less RSS, docs/performance.md); on glibc it takes.
    """
    import platform

    import twisted.internet
    from twisted.internet.testing import MemoryReactorClock

    from lockservice import tap
    from lockservice.startup import fixMallocThreshold as fix

    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert fix() is True
    calls: List[int] = []
    monkeypatch.setattr(tap, "fixMallocThreshold", lambda: calls.append(1) or True)
    monkeypatch.setattr(twisted.internet, "reactor", MemoryReactorClock(), raising=False)
    tap.makeService(parse(["--listen", "tcp:0:interface=127.0.0.1"]))
    assert calls == [1]
