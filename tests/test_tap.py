"""
Command-line options of twistd lockservice (no process started).
"""

from __future__ import annotations

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
    path.write_text("s3cret\n")
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
    secret.write_text("  hunter2\n")
    assert parse(["--secret", str(secret)])["secretBytes"] == b"hunter2"


def test_ipv6_node_entry_gives_escaped_listen_endpoint(secret) -> None:  # type: ignore[no-untyped-def]
    o = parse(["--peers", "[::1]:7701,[::1]:7702", "--node", "[::1]:7702"] + secret)
    assert o["listen"] == "tcp:7702:interface=\\:\\:1"
