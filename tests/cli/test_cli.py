"""
The lockservice command-line tool against a real node.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from lockservice.testing.harness import LineClient, freePort, twistdEnvironment, waitFor
from tests.support.cli import cli


def test_acquire_prints_token_and_release_says_ok_then_stale(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    got = cli("acquire", "cli/key", "--lease", "30", "--wait", "5", "--addr", node.address)
    assert got.returncode == 0, got.stderr
    token = got.stdout.decode().strip()
    assert token.isdigit()
    released = cli("release", "cli/key", token, "--addr", node.address)
    assert (released.returncode, released.stdout) == (0, b"OK\n")
    again = cli("release", "cli/key", token, "--addr", node.address)
    assert (again.returncode, again.stdout) == (1, b"STALE\n")


def test_acquire_timeout_exits_75(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as c:
        c.ask(b"A busy 30 0")
        got = cli("acquire", "busy", "--wait", "0.3", "--addr", node.address)
    assert got.returncode == 75
    assert b"no grant" in got.stderr


def test_run_holds_lock_exports_env_and_exits_with_command_status(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    script = (
        "import os, socket, sys;"
        "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
        "s.sendall(b'A ' + os.environ['LOCKSERVICE_KEY'].encode() + b' 30 0.2\\n');"
        "print(os.environ['LOCKSERVICE_KEY'], os.environ['LOCKSERVICE_TOKEN'], s.recv(100));"
        "sys.exit(7)"
    )
    got = cli("run", "job/nightly", "--addr", node.address, "--",
              sys.executable, "-c", script, str(node.port))
    assert got.returncode == 7, got.stderr
    key, token, answer = got.stdout.decode().split(" ", 2)
    assert key == "job/nightly" and token.isdigit()
    assert "T job/nightly" in answer  # the lock was held while CMD ran
    # ... and released when it ended.
    with LineClient(node.port) as c:
        assert c.ask(b"A job/nightly 30 1").startswith(b"A job/nightly ")


def test_run_exits_75_when_wait_runs_out(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as c:
        c.ask(b"A taken 30 0")
        got = cli("run", "taken", "--wait", "0.3", "--addr", node.address, "--", "true")
    assert got.returncode == 75


def test_run_ctrl_c_passes_to_command_and_releases(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    started = tmp_path / "started"
    child = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", "run", "ctrl-c", "--addr", node.address,
         "--", sys.executable, "-c", child],
        env=twistdEnvironment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        # The child runs only once the lock is held, and its signal
        # handlers are Python's default (KeyboardInterrupt) once it runs.
        waitFor(started.exists, 30, what="child started")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) in (1, 128 + signal.SIGINT)  # Python's KeyboardInterrupt exit
        with LineClient(node.port) as c:
            assert c.ask(b"A ctrl-c 30 1").startswith(b"A ctrl-c ")
    finally:
        proc.kill()


def test_unreachable_server_is_a_one_line_error() -> None:
    got = cli("acquire", "k", "--addr", f"127.0.0.1:{freePort()}")
    assert got.returncode == 69
    assert got.stderr.decode().count("\n") == 1
    assert got.stderr.startswith(b"lockservice: cannot reach")
    status = cli("status", f"http://127.0.0.1:{freePort()}")
    assert status.returncode == 69 and status.stderr.startswith(b"lockservice: cannot reach")


def test_bad_arguments_exit_2_with_one_line() -> None:
    for args in [("acquire", "k", "--lease", "abc"), ("release", "k", "notatoken"),
                 ("run", "k"), ("frobnicate",), ("acquire", "bad key"),
                 ("acquire", "k", "--addr", "nohost"), ("release", "k"),
                 ("acquire", "k", "--tls-ca", "/nonexistent/ca.pem"),
                 ("acquire", "k", "--tls-cert", "c.pem")]:
        got = cli(*args)
        assert got.returncode == 2, (args, got)
        assert got.stdout == b"", args
        assert got.stderr.startswith(b"lockservice: "), (args, got.stderr)
        assert got.stderr.count(b"\n") == 1, (args, got.stderr)


def test_no_arguments_prints_help_and_exits_2() -> None:
    got = cli()
    assert got.returncode == 2
    assert got.stdout.startswith(b"usage: lockservice")
    for command in (b"acquire", b"release", b"run", b"shell", b"events", b"status"):
        assert command in got.stdout
    assert b"exit statuses" in got.stdout


def test_version() -> None:
    from lockservice import __version__

    got = cli("--version")
    assert (got.returncode, got.stdout) == (0, f"lockservice {__version__}\n".encode())


def test_shell_sends_typed_lines_and_prints_answers(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    got = subprocess.run(
        [sys.executable, "-m", "lockservice.cli", "shell", node.address],
        input=b"P hello\nA shell/k 30 0\nbogus\n\nA shell/k 30 0\n",
        capture_output=True, timeout=60, env=twistdEnvironment(),
    )
    assert got.returncode == 0, got.stderr
    lines = got.stdout.decode().splitlines()
    assert "P hello" in lines
    granted = [line for line in lines if line.startswith("A shell/k ")]
    assert len(granted) == 1 and granted[0].split()[2].isdigit()
    assert any(line.startswith("E ") for line in lines)
    # The second acquire queued behind the first; end of input withdrew it,
    # so the key is free again as soon as the first grant is released.
    with LineClient(node.port) as c:
        assert c.ask(b"R shell/k " + granted[0].split()[2].encode()) == b"R shell/k OK"
        assert c.ask(b"A shell/k 30 1").startswith(b"A shell/k ")


def test_shell_to_nowhere_is_a_one_line_error() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "lockservice.cli", "shell", f"127.0.0.1:{freePort()}"],
        input=b"", capture_output=True, timeout=60, env=twistdEnvironment(),
    )
    assert got.returncode == 69
    assert got.stderr.startswith(b"lockservice: cannot reach") and got.stderr.count(b"\n") == 1


def test_status_table(spawn) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    with LineClient(node.port) as c:
        c.ask(b"A s 30 0")
    got = cli("status", f"127.0.0.1:{httpPort}")
    assert got.returncode == 0, got.stderr
    out = got.stdout.decode()
    assert "role         active" in out
    assert "held keys    1" in out


def _runLocked(node, key: str, tmp_path, extra: list, child: str):  # type: ignore[no-untyped-def]
    """
    Start C{lockservice run KEY ... -- python -c CHILD}; the child writes
    its token to a file first.  Returns (process, token file).
    """
    tokenFile = tmp_path / f"{key.replace('/', '_')}.token"
    script = (f"import os, pathlib, signal, time; "
              f"pathlib.Path({str(tokenFile)!r}).write_text(os.environ['LOCKSERVICE_TOKEN']); "
              + child)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", "run", key, "--addr", node.address,
         *extra, "--", sys.executable, "-c", script],
        env=twistdEnvironment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    waitFor(lambda: tokenFile.exists() and tokenFile.read_text(), 30, what="child started")
    return proc, tokenFile


def test_run_renews_the_lock_while_the_command_runs(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    done = tmp_path / "done"
    proc, tokenFile = _runLocked(node, "run/renewed", tmp_path, ["--lease", "2"],
                                 f"time.sleep(5); pathlib.Path({str(done)!r}).touch()")
    try:
        token = tokenFile.read_text().encode()
        # Well past the 2 s lease, the key stays held until the child is
        # done (it writes "done" before it exits, so before run releases).
        with LineClient(node.port) as c:
            while True:
                answer = c.ask(b"A run/renewed 30 0.2")
                if answer.startswith(b"A "):
                    assert done.exists(), "the key was free while the command ran"
                    c.ask(b"R run/renewed " + answer.split()[2])
                    break
                assert answer == b"T run/renewed", answer
        assert proc.wait(30) == 0, proc.stderr.read()  # type: ignore[union-attr]
        with LineClient(node.port) as c:
            assert c.ask(b"R run/renewed " + token) == b"R run/renewed STALE"  # released
    finally:
        proc.kill()


def test_run_stops_the_command_when_the_lock_is_lost(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    proc, tokenFile = _runLocked(node, "run/lost", tmp_path, ["--lease", "3"],
                                 "time.sleep(60)")
    try:
        with LineClient(node.port) as c:
            # Someone else frees the key: the next renewal answers STALE.
            token = tokenFile.read_text().encode()
            assert c.ask(b"R run/lost " + token) == b"R run/lost OK"
        status = proc.wait(30)
        stderr = proc.stderr.read().decode()  # type: ignore[union-attr]
        assert status == 74, stderr
        assert stderr.count("\n") == 1 and "lost the lock" in stderr and "STALE" in stderr
    finally:
        proc.kill()


def test_run_kills_a_command_that_ignores_sigterm_after_the_grace(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    proc, tokenFile = _runLocked(
        node, "run/stubborn", tmp_path, ["--lease", "3", "--grace", "1"],
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)")
    try:
        with LineClient(node.port) as c:
            token = tokenFile.read_text().encode()
            assert c.ask(b"R run/stubborn " + token) == b"R run/stubborn OK"
        assert proc.wait(30) == 74
    finally:
        proc.kill()


def test_cli_runs_under_the_asyncio_reactor(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    got = cli("--reactor", "asyncio", "run", "asyncio/run", "--lease", "2", "--addr",
              node.address, "--", sys.executable, "-c",
              "import os, time; time.sleep(4); print(os.environ['LOCKSERVICE_TOKEN'])")
    assert got.returncode == 0, got.stderr
    token = got.stdout.strip()
    assert token.isdigit()
    with LineClient(node.port) as c:
        # Renewed past its 2 s lease while the command ran (a lost lock
        # would have made run exit 74), released after.
        assert c.ask(b"R asyncio/run " + token) == b"R asyncio/run STALE"
    acquired = cli("--reactor", "asyncio", "acquire", "asyncio/k", "--addr", node.address)
    assert acquired.returncode == 0, acquired.stderr
    assert cli("--reactor", "asyncio", "release", "asyncio/k", acquired.stdout.decode().strip(),
               "--addr", node.address).stdout == b"OK\n"


def test_events_and_force_release_against_a_real_node(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    secret = tmp_path / "admin-secret"
    secret.write_text("s3cret-admin-token\n")
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1",
                       "--admin-secret", str(secret)])
    http = f"http://127.0.0.1:{httpPort}"
    holder = LineClient(node.port)
    waiter = LineClient(node.port)
    try:
        holder.ask(b"I billing-worker-1")
        oldToken = holder.ask(b"A payroll 30 0").split()[2]
        waiter.ask(b"I billing-worker-2")
        waiter.send(b"A payroll 30 0\n")
        wrong = tmp_path / "wrong"
        wrong.write_text("nope")
        refused = cli("release", "--force", "payroll", "--reason", "stuck", "--http", http,
                      "--admin-secret", str(wrong))
        assert refused.returncode == 77 and b"wrong admin secret" in refused.stderr
        noReason = cli("release", "--force", "payroll", "--http", http,
                       "--admin-secret", str(secret))
        assert noReason.returncode == 2
        # The waiter must be queued before the force-release hands it over.
        waitFor(lambda: b'"waiters": 1' in cli("status", http, "--json").stdout, 20,
                what="waiter queued")
        forced = cli("release", "--force", "payroll", "--reason", "job stuck since Monday",
                     "--http", http, "--admin-secret", str(secret))
        assert forced.returncode == 0, forced.stderr
        out = forced.stdout.decode()
        assert out.startswith(f"released payroll (token {oldToken.decode()}); handed to the "
                              "next waiter with token ")
        assert out.endswith("; reason: job stuck since Monday\n")
        newToken = waiter.readline().split()[2]
        assert int(newToken) > int(oldToken) and newToken.decode() in out
        # The old holder is fenced: its release is STALE now.
        assert holder.ask(b"R payroll " + oldToken) == b"R payroll STALE"
        missing = cli("release", "--force", "nothing-here", "--reason", "x", "--http", http,
                      "--admin-secret", str(secret))
        assert missing.returncode == 1 and b"not held" in missing.stderr

        events = cli("events", "payroll", "--http", http)
        assert events.returncode == 0, events.stderr
        lines = events.stdout.decode().splitlines()
        types = [line.split()[2] for line in lines]
        assert types[:2] == ["grant", "force-release"], lines
        assert f"token={oldToken.decode()}" in lines[0] and "who=billing-worker-1" in lines[0]
        assert "job stuck since Monday" in lines[1]
        assert any(t == "grant" and "who=billing-worker-2" in line
                   for t, line in zip(types, lines, strict=True))
        raw = cli("events", "--json", "--http", http, "--since", "0")
        parsed = [json.loads(line) for line in raw.stdout.decode().splitlines()]
        assert {e["type"] for e in parsed} >= {"grant", "force-release"}
        assert all(e["key"] == "payroll" for e in parsed if e["key"] is not None)
    finally:
        holder.close()
        waiter.close()


def _ignoreSIGINT() -> None:
    # What a shell does to a command it starts with `&` from a script.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["default", "inherited ignored"])
def test_events_follow_prints_new_events_as_they_come(spawn, sigint) -> None:  # type: ignore[no-untyped-def]
    """
    Ctrl+C (SIGINT) ends --follow with status 0, also when it was started
    in the background from a script (issue 21 item 7: SIGINT inherited as
    ignored must be restored, or the follower never stops).
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", "events", "--follow", "--interval", "0.2",
         "follow/k", "--http", f"http://127.0.0.1:{httpPort}"],
        env=twistdEnvironment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_ignoreSIGINT if sigint != "default" else None)
    try:
        with LineClient(node.port) as c:
            c.ask(b"I follower")
            token = c.ask(b"A follow/k 30 0").split()[2]
            c.ask(b"A other/k 30 0")
            c.ask(b"R follow/k " + token)
        assert proc.stdout is not None
        # A watchdog: if the events never come, kill the follower so that
        # readline returns instead of hanging the test.
        watchdog = threading.Timer(30, proc.kill)
        watchdog.start()
        first = proc.stdout.readline().decode()
        second = proc.stdout.readline().decode()
        watchdog.cancel()
        assert " grant " in first and "follow/k" in first and "who=follower" in first
        assert " release " in second and "follow/k" in second
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(20) == 0
        finally:
            proc.kill()


def _mutualTLSNode(spawn, tmp_path):  # type: ignore[no-untyped-def]
    import ssl

    from lockservice.testing.certs import TestCA

    ca = TestCA(tmp_path)
    server = ca.issue("node")
    client = ca.issue("cli-client")
    ready = ssl.create_default_context(cafile=ca.cert)
    ready.load_cert_chain(client.cert, client.key)
    node = spawn(args=["--tls-cert", server.cert, "--tls-key", server.key,
                       "--tls-ca", ca.cert], tls=ready)
    return node, ca, client


def test_acquire_release_run_and_shell_over_mutual_tls(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node, ca, client = _mutualTLSNode(spawn, tmp_path)
    tls = ["--tls-ca", ca.cert, "--tls-cert", client.cert, "--tls-key", client.key]
    got = cli("acquire", "tls/k", "--addr", node.address, *tls)
    assert got.returncode == 0, got.stderr
    token = got.stdout.decode().strip()
    released = cli("release", "tls/k", token, "--addr", node.address, *tls)
    assert (released.returncode, released.stdout) == (0, b"OK\n")
    ran = cli("run", "tls/run", "--lease", "2", "--addr", node.address, *tls, "--",
              sys.executable, "-c", "import time; time.sleep(2.5)")
    assert ran.returncode == 0, ran.stderr
    shell = subprocess.run(
        [sys.executable, "-m", "lockservice.cli", "shell", node.address, *tls],
        input=b"P over-tls\nA tls/shell 30 0\n", capture_output=True, timeout=60,
        env=twistdEnvironment())
    assert shell.returncode == 0, shell.stderr
    lines = shell.stdout.decode().splitlines()
    assert lines[0] == "P over-tls" and lines[1].startswith("A tls/shell ")


def test_tls_refusals_are_one_line_and_exit_69(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from lockservice.testing.certs import TestCA

    node, ca, client = _mutualTLSNode(spawn, tmp_path)
    (tmp_path / "other").mkdir()
    other = TestCA(tmp_path / "other", name="other CA")
    cases = {
        "no client certificate": ["--tls-ca", ca.cert],
        "unknown CA": ["--tls-ca", other.cert, "--tls-cert", client.cert,
                       "--tls-key", client.key],
    }
    for case, tls in cases.items():
        for command in (["acquire", "tls/x"], ["shell"]):
            got = subprocess.run(
                [sys.executable, "-m", "lockservice.cli", *command, "--addr", node.address,
                 *tls], input=b"P x\n", capture_output=True, timeout=60,
                env=twistdEnvironment())
            assert got.returncode == 69, (case, command, got)
            assert got.stderr.count(b"\n") == 1, (case, command, got.stderr)
            assert b"TLS" in got.stderr, (case, command, got.stderr)


def test_cli_names_itself_unless_told(spawn) -> None:  # type: ignore[no-untyped-def]
    import socket
    import urllib.request

    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])

    def holder(key: str) -> str:
        url = f"http://127.0.0.1:{httpPort}/locks?key={key}"
        with urllib.request.urlopen(url, timeout=10) as response:
            shown = str(json.loads(response.read())["holder"])
        # The client library adds `#<12 hex>` (its instance) to its name;
        # a display may show it or not.
        return re.sub(r"#[0-9a-f]{12}$", "", shown)

    assert cli("acquire", "named/default", "--addr", node.address).returncode == 0
    host, pid, tool = holder("named/default").split(":")
    assert host == socket.gethostname() and pid.isdigit() and tool == "lockservice-cli"
    assert cli("acquire", "named/told", "--name", "nightly-report",
               "--addr", node.address).returncode == 0
    assert holder("named/told") == "nightly-report"


def test_cli_spreads_keys_over_clusters(spawn) -> None:  # type: ignore[no-untyped-def]
    from lockservice.client.sharding import choose

    a, b = spawn(), spawn()
    ids = [a.address.encode(), b.address.encode()]
    # Three keys served by each cluster (the ports, so the ids, vary).
    candidates = [f"shard/{i}" for i in range(200)]
    keys = ([k for k in candidates if choose(ids, k.encode()) == 0][:3]
            + [k for k in candidates if choose(ids, k.encode()) == 1][:3])
    for i, key in enumerate(keys):
        # Both spellings: --cluster repeated, and ';' between clusters.
        where = (["--cluster", a.address, "--cluster", b.address] if i % 2
                 else ["--addr", f"{a.address};{b.address}"])
        got = cli("acquire", key, *where)
        assert got.returncode == 0, got.stderr
        owner, other = (a, b) if choose(ids, key.encode()) == 0 else (b, a)
        with LineClient(owner.port) as c:
            assert c.ask(f"A {key} 30 0.1".encode()) == f"T {key}".encode()
        with LineClient(other.port) as c:
            assert c.ask(f"A {key} 30 0.1".encode()).startswith(f"A {key} ".encode())


def _processesRunning(argv: list) -> list:
    """
    Pids of live (not zombie) processes whose command line is exactly C{argv}.
    """
    import os

    wanted = "\0".join(argv) + "\0"
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline == wanted and state != "Z":
            found.append(int(pid))
    return found


def test_run_stops_the_commands_grandchildren_when_the_lock_is_lost(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 21 item 6: the docs' own C{sh -c '...; sleep 60'} must leave no
    C{sleep} working without the lock after exit 74 (the shell forks it,
    so signalling only the direct child orphans it).
    """
    import os

    node = spawn()
    sleeper = ["sleep", f"60.{os.getpid()}"]  # a command line no one else runs
    tokenFile = tmp_path / "token"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", "run", "run/group", "--lease", "3",
         "--grace", "2", "--addr", node.address, "--", "sh", "-c",
         f"echo $LOCKSERVICE_TOKEN > {tokenFile}; {' '.join(sleeper)}"],
        env=twistdEnvironment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        waitFor(lambda: tokenFile.exists() and tokenFile.read_text().strip()
                and _processesRunning(sleeper), 30, what="the grandchild runs")
        with LineClient(node.port) as c:
            token = tokenFile.read_text().strip().encode()
            assert c.ask(b"R run/group " + token) == b"R run/group OK"
        assert proc.wait(30) == 74, proc.stderr.read()  # type: ignore[union-attr]
        # Gone by the time run exits: nothing of CMD works on without the lock.
        assert _processesRunning(sleeper) == []
    finally:
        proc.kill()
        for pid in _processesRunning(sleeper):
            os.kill(pid, signal.SIGKILL)


def test_run_stops_what_the_command_left_behind_before_releasing(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    A command that ends but leaves a background process in its group: run
    stops that process (SIGTERM to the group) before it releases the key.
    """
    import os

    node = spawn()
    sleeper = ["sleep", f"61.{os.getpid()}"]
    got = cli("run", "run/leftover", "--grace", "2", "--addr", node.address, "--",
              "sh", "-c", f"{' '.join(sleeper)} >/dev/null 2>&1 & exit 3")
    try:
        assert got.returncode == 3, got.stderr
        assert _processesRunning(sleeper) == []
    finally:
        for pid in _processesRunning(sleeper):
            os.kill(pid, signal.SIGKILL)


def test_run_at_a_terminal_lets_the_command_read_it(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    At a terminal, CMD's own group is made the foreground one while it runs:
    a background group reading the terminal would be stopped (SIGTTIN) and
    hold the key forever.  Afterwards the terminal is run's again.
    """
    import os
    import pty
    import select
    import time

    node = spawn()
    script = ("import sys; line = input('your name? '); print('hello', line);"
              "sys.exit(5)")
    pid, master = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        try:
            os.execve(sys.executable, [sys.executable, "-m", "lockservice.cli", "run",
                                       "tty/k", "--addr", node.address, "--",
                                       sys.executable, "-c", script], twistdEnvironment())
        finally:
            os._exit(127)
    out = b""
    try:
        def readUntil(text: bytes, seconds: float) -> None:
            nonlocal out
            deadline = time.monotonic() + seconds
            while text not in out:
                assert time.monotonic() < deadline, out
                ready, _, _ = select.select([master], [], [], 0.5)
                if ready:
                    try:
                        out += os.read(master, 1000)
                    except OSError:  # EIO: the terminal's last user is gone
                        break
        readUntil(b"your name? ", 30)
        os.write(master, b"world\n")
        readUntil(b"hello world", 30)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 5, out
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
    with LineClient(node.port) as c:
        assert c.ask(b"A tty/k 30 1").startswith(b"A tty/k ")  # released


def _oneLine(got: subprocess.CompletedProcess, status: int, *words: str) -> str:  # type: ignore[type-arg]
    err = got.stderr.decode()
    assert got.returncode == status, (got.returncode, err)
    assert err.startswith("lockservice: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


def test_http_commands_pointed_at_the_lock_port_say_so_in_one_line(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 21 item 9: the lock port given where the --http one belongs (an
    easy mistake: 7700 vs 7780) is one line, not http.client's traceback.
    """
    node = spawn()
    secret = tmp_path / "admin"
    secret.write_text("correct horse battery staple\n")
    lockPort = f"http://127.0.0.1:{node.port}"
    for args in (["status", lockPort], ["status", f"127.0.0.1:{node.port}"],
                 ["events", "--http", lockPort], ["events", "--follow", "--http", lockPort],
                 ["release", "--force", "k", "--reason", "x", "--admin-secret", str(secret),
                  "--http", lockPort]):
        _oneLine(cli(*args), 69, f"{lockPort} is not an HTTP endpoint (is it the lock port?)")


def test_lock_commands_pointed_at_the_http_port_say_so_in_one_line(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    The reverse mistake: an acquire sent to the --http port waited forever.
    """
    httpPort = freePort()
    spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    where = f"127.0.0.1:{httpPort}"
    for args in (["acquire", "k"], ["run", "k", "--", "true"]):
        _oneLine(cli(*args[:2], "--addr", where, *args[2:], timeout=30), 69,
                 f"{where} does not answer the lock protocol (is it the HTTP port?)")


def test_wrong_urls_and_answers_are_one_line_errors(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    httpPort = freePort()
    spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    base = f"http://127.0.0.1:{httpPort}"
    for url in ("http://[::1", "ftp://example.com", "http://", "http://a b"):
        for args in (["status", url], ["events", "--http", url]):
            _oneLine(cli(*args), 2, "is not an http:// or https:// URL")
    # An HTTP endpoint that answers JSON, but not a node's status or events.
    _oneLine(cli("status", f"{base}/locks"), 69, "did not answer as a lockservice node does")
    _oneLine(cli("events", "--http", f"{base}/x"), 69, "404")
    _oneLine(cli("events", "--since", "-5", "--http", base), 2, "--since")
    twoLines = tmp_path / "two-lines"
    twoLines.write_text("first\nsecond\n")
    _oneLine(cli("release", "--force", "k", "--reason", "x", "--admin-secret", str(twoLines),
                 "--http", base), 2, "on one line")
    _oneLine(cli("run", "k", "--addr", "127.0.0.1:1", "--", "true"), 69, "cannot reach")


def test_read_and_slots_are_parsed_into_the_clients_share() -> None:
    """
    Issue 22: --read is share="r", --slots N is share=N, --slots 1 (and
    neither) the exclusive lock, share=None (no fifth field on the wire).
    """
    from lockservice.cli import parser

    for command in (["acquire", "k"], ["run", "k", "--grace", "1"]):
        def share(*extra: str, command: list = command) -> object:
            return parser().parse_args([*command, *extra]).share

        assert share() is None
        assert share("--read") == "r"
        assert share("--slots", "4") == 4
        assert share("--slots", "65535") == 65535
        assert share("--slots", "2") == 2
        assert share("--slots", "1") is None


def test_bad_read_and_slots_exit_2_with_one_line() -> None:
    for extra, word in [(["--slots", "0"], "--slots"), (["--slots", "65536"], "--slots"),
                        (["--slots", "x"], "--slots"), (["--slots", "+2"], "--slots"),
                        (["--slots", "-3"], "--slots"), (["--slots", "²"], "--slots"),
                        (["--slots", ""], "--slots"),
                        (["--read", "--slots", "4"], "not allowed with"),
                        (["--slots", "4", "--read"], "not allowed with")]:
        for command in (["acquire", "k"], ["run", "k"]):
            args = [*command, *extra] + (["--", "true"] if command[0] == "run" else [])
            _oneLine(cli(*args), 2, word)


def test_slots_1_is_the_exclusive_lock(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    got = cli("acquire", "slots/one", "--slots", "1", "--addr", node.address)
    assert got.returncode == 0, got.stderr
    with LineClient(node.port) as c:
        assert c.ask(b"A slots/one 30 0.1") == b"T slots/one"  # held exclusively
        assert c.ask(b"R slots/one " + got.stdout.strip()) == b"R slots/one OK"


def test_acquire_read_twice_holds_two_readers_and_keeps_the_writer_out(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 22 (CLI): `acquire --read` takes a read lock; two readers hold
    the key at once, a writer waits, and each reader releases its own token.
    """
    node = spawn()
    tokens = []
    for _ in range(2):
        got = cli("acquire", "doc", "--read", "--wait", "5", "--addr", node.address)
        assert got.returncode == 0, got.stderr
        tokens.append(got.stdout.decode().strip())
    assert all(t.isdigit() for t in tokens) and tokens[0] != tokens[1]
    with LineClient(node.port) as c:
        assert c.ask(b"A doc 30 0.2") == b"T doc"  # the writer does not fit beside them
    for token in tokens:
        released = cli("release", "doc", token, "--addr", node.address)
        assert (released.returncode, released.stdout) == (0, b"OK\n")
    with LineClient(node.port) as c:
        assert c.ask(b"A doc 30 0.2").startswith(b"A doc ")


def test_run_slots_lets_n_commands_run_at_once_and_no_more(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 22 (CLI): `lockservice run --slots 2 backups -- CMD`: two run at
    once, a third finds no free slot (exit 75), and both slots are released
    when the commands end.
    """
    node = spawn()
    gate = tmp_path / "gate"
    script = ("import os, sys, time\n"
              "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n")
    command = [sys.executable, "-c", script, str(gate)]
    runs = [subprocess.Popen([sys.executable, "-m", "lockservice.cli", "run", "backups",
                              "--slots", "2", "--addr", node.address, "--", *command],
                             env=twistdEnvironment(), stderr=subprocess.PIPE)
            for _ in range(2)]
    try:
        with LineClient(node.port) as c:
            def bothSlotsHeld() -> bool:
                # A probe that finds a slot free gives it back at once: held
                # for its lease, it would keep a run waiting (30 s).
                answer = c.ask(b"A backups 30 0.1 2")
                if answer.startswith(b"A backups "):
                    c.ask(b"R backups " + answer.split()[2])
                return answer == b"T backups"

            waitFor(bothSlotsHeld, 30, what="both slots held by the two runs")
            assert c.ask(b"A backups 30 0.1 3").startswith(b"E A backups")  # its kind is 2 slots
        third = cli("run", "backups", "--slots", "2", "--wait", "0.5", "--addr", node.address,
                    "--", sys.executable, "-c", "print('ran')")
        assert third.returncode == 75, third.stderr
        assert b"ran" not in third.stdout
        gate.write_text("")
        assert [run.wait(30) for run in runs] == [0, 0]
    finally:
        gate.write_text("")
        for run in runs:
            if run.poll() is None:
                run.kill()
            run.wait()
    with LineClient(node.port) as c:
        first = c.ask(b"A backups 30 0.2 2")
        second = c.ask(b"A backups 30 0.2 2")
    assert first.startswith(b"A backups ") and second.startswith(b"A backups ")
