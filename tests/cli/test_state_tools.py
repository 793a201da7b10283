"""
lockservice state inspect | backup | restore: on files made here, and
with real nodes (a backup taken while a node runs, a restore that a fresh
node serves).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from lockservice import statetools
from lockservice.state import (
    FILENAME,
    LOCKNAME,
    SavedLock,
    State,
    StateDir,
    clusterIdentity,
    encode,
)
from lockservice.testing.harness import LineClient, Node, freePort, twistdEnvironment

LONE = clusterIdentity(b"", [])
NOW = 1_800_000_000_000_000  # wall-clock microseconds


def lockservice(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(
        [sys.executable, "-c", "import sys; from lockservice.cli import main; sys.exit(main())",
         *args], capture_output=True, text=True, timeout=60, env=twistdEnvironment(),
        stdin=subprocess.DEVNULL)


def saved(directory: Path, locks: int = 2, node: str = "") -> bytes:
    state = State(LONE if not node else "c" * 32, node, mark=NOW + 600_000_000, term=5,
                  saved=NOW, boot=("boot-a", 1_000_000_000))
    for i in range(locks):
        state.locks.append(SavedLock(f"k{i}".encode(), NOW - 10 + i, NOW + (i + 1) * 30_000_000,
                                     NOW - 5_000_000, b"1" if i == 0 else b"r",
                                     b"worker-%d" % i if i == 0 else None, delayed=i == 1))
    directory.mkdir(parents=True, exist_ok=True)
    StateDir(str(directory), state.cluster, node).write(state)
    return encode(state)


def test_inspect_shows_what_the_directory_holds_as_of_now(tmp_path: Path) -> None:
    saved(tmp_path / "d")
    # Ten seconds later, same boot.
    info = statetools.inspect(str(tmp_path / "d"), NOW + 10_000_000,
                              ("boot-a", 1_010_000_000))
    assert info["format"] == 2 and info["checksum"] == "ok" and info["error"] is None
    assert info["running"] is False and info["node"] is None and info["cluster"] == LONE
    assert info["token_mark"] == NOW + 600_000_000 and info["term"] == 5
    first, second = info["locks"]
    assert first == {"key": "k0", "token": NOW - 10, "share": "1", "holder": "worker-0",
                     "lock_delay": False, "granted": statetools.isoMicros(NOW - 5_000_000),
                     "deadline": statetools.isoMicros(NOW + 30_000_000),
                     "remaining_seconds": 20.0}
    assert second["share"] == "r" and second["lock_delay"] is True
    assert second["remaining_seconds"] == 50.0 and second["holder"] is None
    # After a reboot with the clock behind the save, every lease ran out.
    later = statetools.inspect(str(tmp_path / "d"), NOW - 1, ("boot-b", 5))
    assert [lock["remaining_seconds"] for lock in later["locks"]] == [None, None]
    text = statetools.formatInspection(info)
    assert "checksum     ok" in text and "k0" in text and "worker-0" in text
    assert "20.0 s" in text and "no node runs on it" in text


def test_inspect_cli_json_and_a_corrupt_file(tmp_path: Path) -> None:
    saved(tmp_path / "d")
    result = lockservice("state", "inspect", "--json", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["locks"]) == 2
    path = tmp_path / "d" / FILENAME
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))
    result = lockservice("state", "inspect", str(tmp_path / "d"))
    assert result.returncode == 1
    assert "checksum     mismatch" in result.stdout and "refused" in result.stdout
    empty = lockservice("state", "inspect", str(tmp_path / "none"))
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1


def test_backup_and_restore_byte_for_byte(tmp_path: Path) -> None:
    data = saved(tmp_path / "d")
    result = lockservice("state", "backup", str(tmp_path / "d"), str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "b").read_bytes() == data
    assert oct((tmp_path / "b").stat().st_mode & 0o777) == "0o600"
    result = lockservice("state", "restore", str(tmp_path / "b"), str(tmp_path / "new"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "new" / FILENAME).read_bytes() == data
    assert (tmp_path / "new" / LOCKNAME).exists()
    # A state file there already: only with --force.
    again = lockservice("state", "restore", str(tmp_path / "b"), str(tmp_path / "new"))
    assert again.returncode == 2 and "already holds a state file" in again.stderr
    forced = lockservice("state", "restore", "--force", str(tmp_path / "b"),
                         str(tmp_path / "new"))
    assert forced.returncode == 0, forced.stderr


@pytest.mark.parametrize("mangle, what", [
    (lambda d: d[:30] + bytes([d[30] ^ 0x20]) + d[31:], "checksum mismatch"),
    (lambda d: d[:-20], "checksum mismatch"),
    (lambda d: d.replace(b"lockservice-state 2", b"lockservice-state 9"),
     "not a state file of a format this version reads"),
    (lambda d: b"hello\n", "not a state file of a format"),
])
def test_restore_refuses_a_bad_backup(tmp_path: Path, mangle: Any, what: str) -> None:
    data = saved(tmp_path / "d")
    (tmp_path / "b").write_bytes(mangle(data))
    result = lockservice("state", "restore", str(tmp_path / "b"), str(tmp_path / "new"))
    assert result.returncode == 1 and what in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "new" / FILENAME).exists()


def test_restore_reads_format_1(tmp_path: Path) -> None:
    import hashlib

    body = (b"lockservice-state 1\ncluster %s\nnode -\nmark 5\nterm 0\nsaved 0\nlocks 0\n"
            % LONE.encode())
    (tmp_path / "b").write_bytes(body + b"sha256 " + hashlib.sha256(body).hexdigest().encode()
                                 + b"\n")
    assert statetools.restore(str(tmp_path / "b"), str(tmp_path / "new"))["token_mark"] == 5


def test_restore_checks_the_node_of_a_config(tmp_path: Path) -> None:
    saved(tmp_path / "d")
    secret = tmp_path / "secret"
    secret.write_text("state-tools-secret-0123456789abcdef")
    secret.chmod(0o600)
    config = tmp_path / "node.toml"
    config.write_text(f'peers = ["127.0.0.1:7801", "127.0.0.1:7802"]\n'
                      f'node = "127.0.0.1:7801"\nsecret = "{secret}"\n')
    result = lockservice("state", "restore", "--config", str(config),
                         str(tmp_path / "d" / FILENAME), str(tmp_path / "new"))
    assert result.returncode == 1 and "belongs to another cluster" in result.stderr


def lone(tmp_path: Path, state: Path, name: str) -> Node:
    return Node(freePort(), args=["--state-dir", str(state)], logDir=str(tmp_path), name=name)


def test_backup_of_a_running_node_restored_into_a_fresh_node(tmp_path: Path) -> None:
    first = lone(tmp_path, tmp_path / "first", "first")
    second = lone(tmp_path, tmp_path / "second", "second")
    try:
        first.start()
        with LineClient(first.port) as c:
            assert c.ask(b"I worker-1").startswith(b"I ")
            tokens: List[int] = []
            for key in (b"a", b"b"):
                tokens.append(int(c.ask(b"A " + key + b" 120 5").split()[2]))
            tokens.append(int(c.ask(b"A r 120 5 r").split()[2]))
            # A backup while it runs: consistent, and it says it runs.
            info = lockservice("state", "inspect", "--json", str(tmp_path / "first"))
            assert json.loads(info.stdout)["running"] is True
            during = lockservice("state", "backup", str(tmp_path / "first"),
                                 str(tmp_path / "running.bak"))
            assert during.returncode == 0, during.stderr
            # A restore into its directory is refused while it runs.
            refused = lockservice("state", "restore", "--force", str(tmp_path / "running.bak"),
                                  str(tmp_path / "first"))
            assert refused.returncode == 1
            assert "in use by a running node" in refused.stderr
        first.signal(signal.SIGTERM)  # graceful: it saves the held locks
        assert first.process is not None and first.process.wait(15) == -signal.SIGTERM
        result = lockservice("state", "backup", str(tmp_path / "first"), str(tmp_path / "b"))
        assert result.returncode == 0, result.stderr
        mark = statetools.inspect(str(tmp_path / "first"))["token_mark"]
        assert mark >= max(tokens)
        # A corrupted copy of the backup is refused.
        data = bytearray((tmp_path / "b").read_bytes())
        data[len(data) // 2] ^= 0x04
        (tmp_path / "corrupt").write_bytes(bytes(data))
        bad = lockservice("state", "restore", str(tmp_path / "corrupt"), str(tmp_path / "second"))
        assert bad.returncode == 1 and "checksum mismatch" in bad.stderr
        restored = lockservice("state", "restore", str(tmp_path / "b"), str(tmp_path / "second"))
        assert restored.returncode == 0, restored.stderr
        shown = statetools.inspect(str(tmp_path / "second"))
        assert sorted(lock["key"] for lock in shown["locks"]) == ["a", "b", "r"]
        assert {lock["holder"] for lock in shown["locks"]} == {"worker-1"}
        # The fresh node serves the saved grants, and issues tokens above
        # the saved mark.
        second.start()
        with LineClient(second.port) as c:
            assert c.ask(b"A a 10 0.2") == b"T a"  # still held: the wait times out
            assert c.ask(b"R b %d" % tokens[1]) == b"R b OK"
            token = int(c.ask(b"A b 10 5").split()[2])
            assert token > mark >= max(tokens)
            assert c.ask(b"R a %d" % tokens[0]) == b"R a OK"
    finally:
        first.stop()
        second.stop()
    assert os.path.exists(tmp_path / "second" / FILENAME)


def test_adopt_rewrites_the_owner_after_a_secret_change(tmp_path: Path) -> None:
    import fcntl

    from lockservice.state import decode

    saved(tmp_path / "d", node="127.0.0.1:7801")
    secret = tmp_path / "secret"
    secret.write_text("state-tools-secret-0123456789abcdef")
    secret.chmod(0o600)
    config = tmp_path / "node.toml"
    config.write_text(f'peers = ["127.0.0.1:7801", "127.0.0.1:7802"]\n'
                      f'node = "127.0.0.1:7801"\nsecret = "{secret}"\n')
    new = clusterIdentity(secret.read_bytes().strip(), ["127.0.0.1:7801", "127.0.0.1:7802"])
    path = tmp_path / "d" / FILENAME
    with pytest.raises(Exception, match="another cluster"):
        decode(path.read_bytes(), new, "127.0.0.1:7801")
    # Not while a node holds the directory.
    fd = os.open(tmp_path / "d" / LOCKNAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    busy = lockservice("state", "adopt", str(tmp_path / "d"), "--config", str(config))
    os.close(fd)
    assert busy.returncode == 1 and "in use by a running node" in busy.stderr
    result = lockservice("state", "adopt", str(tmp_path / "d"), "--config", str(config))
    assert result.returncode == 0, result.stderr
    state = decode(path.read_bytes(), new, "127.0.0.1:7801")
    assert len(state.locks) == 2 and state.mark == NOW + 600_000_000
