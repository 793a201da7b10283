"""
The lockservice command-line tool against a real node.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from lockservice.testing.harness import LineClient, freePort, twistdEnvironment, waitFor


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(
        [sys.executable, "-m", "lockservice.cli", *args],
        capture_output=True, timeout=timeout, env=twistdEnvironment(),
    )


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


def test_run_ctrl_c_passes_to_command_and_releases(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockservice.cli", "run", "ctrl-c", "--addr", node.address,
         "--", "sleep", "60"],
        env=twistdEnvironment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        def held() -> bool:
            with LineClient(node.port) as c:
                answer = c.ask(b"A ctrl-c 30 0.05")
                if answer.startswith(b"A "):
                    c.ask(b"R ctrl-c " + answer.split()[2])
                    return False
                return True
        waitFor(held, 20, what="lock held by run")
        time.sleep(0.3)  # let the child start
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 128 + signal.SIGINT
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


def test_bad_arguments_exit_2() -> None:
    assert cli("acquire", "k", "--lease", "abc").returncode == 2
    assert cli("release", "k", "notatoken").returncode == 2
    assert cli("run", "k").returncode == 2
    assert cli("frobnicate").returncode == 2


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
