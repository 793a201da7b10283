"""
C{lockservice watch} and C{lockservice elect} against real nodes: real
processes, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import List

from lockservice.testing.harness import LineClient, freePort, twistdEnvironment, waitFor


def start(*args: str) -> subprocess.Popen:  # type: ignore[type-arg]
    return subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=twistdEnvironment(),
        start_new_session=True)


class Lines:
    """
    The lines a process writes on stdout, read as they come.
    """

    def __init__(self, process: subprocess.Popen) -> None:  # type: ignore[type-arg]
        self.lines: List[str] = []
        assert process.stdout is not None
        stdout = process.stdout

        def read() -> None:
            for raw in stdout:
                self.lines.append(raw.decode().rstrip("\n"))

        threading.Thread(target=read, daemon=True).start()

    def wait(self, count: int, what: str) -> List[str]:
        waitFor(lambda: len(self.lines) >= count, 30, what=f"{what}: {self.lines}")
        return self.lines


def test_watch_prints_the_holder_and_each_change_and_ctrl_c_exits_0(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    watcher = start("watch", "jobs/nightly", "--json", "--addr", node.address)
    out = Lines(watcher)
    try:
        first = json.loads(out.wait(1, "the state now")[0])
        assert (first["key"], first["token"], first["holder"]) == ("jobs/nightly", 0, None)
        with LineClient(node.port) as holder:
            holder.ask(b"I worker-7")
            token = int(holder.ask(b"A jobs/nightly 30 0").split()[2])
            granted = json.loads(out.wait(2, "the grant")[1])
            assert (granted["token"], granted["holder"]) == (token, "worker-7")
            assert holder.ask(b"R jobs/nightly %d" % token).endswith(b"OK")
        released = json.loads(out.wait(3, "the release")[2])
        assert released["token"] == 0
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(15) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert len(out.lines) == 3, out.lines


def test_watch_plain_lines_name_the_holder(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as holder:
        holder.ask(b"I billing")
        token = holder.ask(b"A orders/42 30 0").split()[2].decode()
        watcher = start("watch", "orders/42", "--addr", node.address)
        out = Lines(watcher)
        try:
            line = out.wait(1, "the state now")[0]
            assert line.endswith(f" orders/42 token={token} holder=billing"), line
            watcher.send_signal(signal.SIGTERM)
            assert watcher.wait(15) == 0
        finally:
            if watcher.poll() is None:
                watcher.kill()


def test_watch_of_an_invalid_key_is_one_line_and_exit_2() -> None:
    got = subprocess.run([sys.executable, "-m", "lockservice.cli", "watch", "bad key"],
                         capture_output=True, timeout=60, env=twistdEnvironment())
    assert got.returncode == 2
    assert got.stderr.count(b"\n") == 1 and b"invalid key" in got.stderr


def test_elect_runs_the_command_while_leading_and_exits_with_its_status(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    seen = tmp_path / "seen"
    script = (f'echo "$LOCKSERVICE_ELECTION $LOCKSERVICE_VALUE $LOCKSERVICE_TOKEN" > {seen}; '
              f'exit 3')
    got = subprocess.run(
        [sys.executable, "-m", "lockservice.cli", "elect", "reports", "host-a",
         "--addr", node.address, "--", "sh", "-c", script],
        capture_output=True, timeout=60, env=twistdEnvironment())
    assert got.returncode == 3, got.stderr
    election, value, token = seen.read_text().split()
    assert (election, value) == ("reports", "host-a") and int(token) > 0
    # It resigned: the election is free again.
    with LineClient(node.port) as c:
        assert c.ask(b"O reports ? 0") == b"O reports 0 -"


def test_a_second_candidate_leads_when_the_first_ends(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    gate = tmp_path / "gate"
    first = start("elect", "cron", "a", "--addr", node.address, "--",
                  "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo a done")
    with LineClient(node.port) as c:
        waitFor(lambda: c.ask(b"O cron ? 0").split()[3].startswith(b"a#"), 30,
                what="the first candidate leads")
    second = start("elect", "cron", "b", "--addr", node.address, "--", "echo", "b ran")
    try:
        time.sleep(0.5)
        assert second.poll() is None, "the second candidate ran while the first led"
        gate.touch()
        assert first.wait(30) == 0
        assert second.wait(30) == 0
        assert second.stdout is not None and second.stdout.read() == b"b ran\n"
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()


def test_losing_the_leadership_stops_the_command_and_exits_74(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    admin = tmp_path / "admin"
    admin.write_text("admin-secret-of-the-test\n")
    http = freePort()
    node = spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1", "--admin-secret", str(admin)])
    child = tmp_path / "child"
    leader = start("elect", "billing", "a", "--lease", "3", "--grace", "1", "--addr", node.address,
                   "--", "sh", "-c", f"sleep 300 & echo $! > {child}; wait")
    try:
        waitFor(child.exists, 30, what="the command runs")
        waitFor(lambda: child.read_text().strip().isdigit(), 10, what="the child's pid")
        pid = int(child.read_text())
        forced = subprocess.run(
            [sys.executable, "-m", "lockservice.cli", "release", "--force", "billing",
             "--reason", "test", "--http", f"http://127.0.0.1:{http}", "--admin-secret",
             str(admin)], capture_output=True, timeout=60, env=twistdEnvironment())
        assert forced.returncode == 0, forced.stderr
        assert leader.wait(30) == 74
        assert leader.stderr is not None and b"stopping sh" in leader.stderr.read()
        waitFor(lambda: not _alive(pid), 10, what="the command's process group is gone")
    finally:
        if leader.poll() is None:
            leader.kill()


def test_ctrl_c_before_leading_withdraws_the_campaign(spawn) -> None:  # type: ignore[no-untyped-def]
    http = freePort()
    node = spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1"])
    with LineClient(node.port) as c:
        c.ask(b"A queue 30 0")  # the election is held: the candidate waits
        candidate = start("elect", "queue", "x", "--addr", node.address, "--", "true")
        try:
            waitFor(lambda: _waiters(http, "queue") == 1, 30, what="the campaign waits")
            candidate.send_signal(signal.SIGINT)
            assert candidate.wait(15) == 130
            waitFor(lambda: _waiters(http, "queue") == 0, 10, what="the campaign withdrawn")
        finally:
            if candidate.poll() is None:
                candidate.kill()


def test_elect_with_a_bad_value_is_one_line_and_exit_2() -> None:
    got = subprocess.run([sys.executable, "-m", "lockservice.cli", "elect", "e", "a b", "--",
                          "true"], capture_output=True, timeout=60, env=twistdEnvironment())
    assert got.returncode == 2
    assert got.stderr.count(b"\n") == 1 and b"campaign value" in got.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _waiters(httpPort: int, key: str) -> int:
    url = f"http://127.0.0.1:{httpPort}/locks/" + urllib.parse.quote(key, safe="")
    with urllib.request.urlopen(url, timeout=10) as answer:
        return int(json.loads(answer.read()).get("queue_length", 0) or 0)
