"""
A real C{twistd -n lockservice} process on a loopback port, driven over TCP.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import List, Optional

import pytest

from lockservice.testing.harness import LineClient, Node, freePort, twistdEnvironment, waitFor
from tests.support.faketime import (
    requireFaketime,
)


def waitQueued(client: LineClient, marker: bytes = b"queued") -> None:
    """
    Return once every request C{client} sent so far has been read by the
    node: it answers a ping in order after them.
    """
    assert client.ask(b"P " + marker, timeout=10) == b"P " + marker


def statusOf(httpPort: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_grant_fifo_handover_and_release_over_tcp(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as a, LineClient(node.port) as b:
        granted = a.ask(b"A orders/42 30 5").split()
        assert granted[:2] == [b"A", b"orders/42"]
        b.send(b"A orders/42 30 5\n")
        # b's acquire is queued before the release: what it gets next is a
        # FIFO hand-over, not a fresh grant.
        waitQueued(b)
        assert a.ask(b"R orders/42 " + granted[2]) == b"R orders/42 OK"
        handed = b.readline(timeout=5).split()
        assert handed[:2] == [b"A", b"orders/42"]
        assert int(handed[2]) > int(granted[2])


def test_wait_timeout_over_tcp(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as a, LineClient(node.port) as b:
        a.ask(b"A k 30 0")
        started = time.monotonic()
        assert b.ask(b"A k 30 0.3", timeout=5) == b"T k"
        assert time.monotonic() - started >= 0.3


def test_kill_9_and_restart_issues_higher_tokens(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as c:
        before = int(c.ask(b"A k 30 0").split()[2])
    node.kill()
    node.start()
    with LineClient(node.port) as c:
        after = int(c.ask(b"A k 30 0").split()[2])
    assert after > before


def test_flood_without_newline_is_cut_and_memory_stays_bounded(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    16 MiB without a newline: the node answers C{E * * line too long},
    closes long before the flood is through, and does not buffer it.
    """
    node = spawn()
    with LineClient(node.port) as warm:  # the node's steady state first
        assert warm.ask(b"P warm") == b"P warm"
    rssBefore = node.rss()
    flood = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    received: List[bytes] = []

    def read() -> None:
        try:
            while True:
                data = flood.recv(4096)
                if not data:
                    break
                received.append(data)
        except OSError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    chunk = b"x" * 65536
    sent = 0
    total = 16 * 1024 * 1024
    try:
        while sent < total:
            flood.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the node closed: EPIPE or a reset
    reader.join(10)
    flood.close()
    assert b"".join(received) == b"E * * line too long\n"
    assert sent < total, "the node read the whole flood instead of closing"
    assert node.rss() - rssBefore < 4 * 1024 * 1024
    with LineClient(node.port) as c:
        assert c.ask(b"P still-here") == b"P still-here"


def test_line_too_long_answer_arrives_before_close(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as c:
        c.send(b"x" * 5000)
        assert c.readline(timeout=5) == b"E * * line too long"
        assert c.sock.recv(10) == b""


def test_bad_lines_keep_the_connection_usable(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as c:
        assert c.ask(b"A k 1e3 0").startswith(b"E A k ")
        assert c.ask(b"\xff\xfe").startswith(b"E * * ")
        assert c.ask(b"P ok") == b"P ok"


def test_max_lease_option_is_enforced(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn(args=["--max-lease", "10", "--max-wait", "5"])
    with LineClient(node.port) as c:
        assert c.ask(b"A k 11 0").startswith(b"E A k bad lease")
        assert c.ask(b"A k 10 6").startswith(b"E A k bad wait")
        assert c.ask(b"A k 10 5").startswith(b"A k ")


def twistd(args: List[str], cwd: Optional[str] = None) -> "subprocess.CompletedProcess[bytes]":
    return subprocess.run(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
         "-n", "--pidfile=", "lockservice"] + args,
        env=twistdEnvironment(), capture_output=True, timeout=60, cwd=cwd,
    )


def assertOneLineError(result: "subprocess.CompletedProcess[bytes]", message: str) -> None:
    assert result.returncode != 0
    assert b"Traceback" not in result.stdout + result.stderr, result.stderr.decode()
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, result.stderr.decode()
    assert lines[0].startswith("twistd lockservice: ") and message in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-lease", "abc"], "--max-lease must be a number"),
        (["--max-wait", "-1"], "--max-wait must be a number of seconds"),
        (["--listen", "nonsense:1"], "--listen 'nonsense:1' is not a usable endpoint"),
        (["--listen", "garbage"], "Unknown endpoint type: 'garbage'"),
        (["--listen", "tcp:notaport"], "--listen 'tcp:notaport' is not a usable endpoint"),
        (["--http", "garbage"], "--http 'garbage' is not a usable endpoint"),
        (["--http", "tcp:notaport"], "--http 'tcp:notaport' is not a usable endpoint"),
        (["--listen", "ssl:7799:privateKey=/nonexistent.key"], "No such file"),
        (["--peers", "a:1,b:2", "--secret", "/etc/hostname"], "give --node"),
        (["--peers", "127.0.0.1:1,127.0.0.1:1"], "same node twice"),
        (["--secret", "/nonexistent/file"], "cannot read --secret"),
        (["--secret", "/"], "cannot read --secret /: Is a directory"),
        (["--tls-cert", "/", "--tls-key", "/"], "cannot read certificate /: Is a directory"),
        (["--node", "a:1"], "--node needs --peers"),
        (["-n", "a:1"], "option -n not recognized"),
        (["-l", "tcp:7700"], "option -l not recognized"),
        (["--bogus"], "option --bogus not recognized"),
    ],
)
def test_bad_options_exit_non_zero_with_one_line(args, message) -> None:  # type: ignore[no-untyped-def]
    result = twistd(args)
    assert result.returncode == 2
    assertOneLineError(result, message)


@pytest.mark.parametrize("which", ["--listen", "--http"])
def test_port_in_use_is_one_line_and_a_non_zero_exit(spawn, which) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    busy = f"tcp:{node.port}:interface=127.0.0.1"
    args = ["--listen", busy] if which == "--listen" else [
        "--listen", f"tcp:{freePort()}:interface=127.0.0.1", "--http", busy]
    result = twistd(args)
    assertOneLineError(result, f"Couldn't listen on 127.0.0.1:{node.port}")
    assert "Address already in use" in result.stderr.decode()


def test_version_is_lockservice_s() -> None:
    import lockservice

    result = twistd(["--version"])
    assert result.returncode == 0
    assert result.stdout.decode().startswith(f"lockservice {lockservice.__version__} ")


def test_no_short_option_clashes_with_twistd_s() -> None:
    """
    Options placed after C{lockservice} are the plugin's: none of them may
    look like one of twistd's (C{-n}, C{-l}, ...).
    """
    from twisted.scripts.twistd import ServerOptions

    from lockservice.tap import Options

    def shorts(options: object) -> set:
        # usage.Options gathers every short option into a getopt string.
        return set(options.shortOpt.replace(":", ""))

    ours, twistds = shorts(Options()), shorts(ServerOptions())
    assert "n" in twistds and "l" in twistds
    assert not ours & twistds


def test_wall_clock_steps_neither_shorten_nor_lengthen_a_lease(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    The node runs under libfaketime with the wall clock steered from a file
    (the monotonic clock left real).  A lease of 2 s must run out after 2 s
    of real time whatever the wall clock does meanwhile.
    """
    library = requireFaketime()
    control = tmp_path / "faketime"
    control.write_text("+0\n")
    env = twistdEnvironment()
    env.update(
        LD_PRELOAD=library,
        FAKETIME_TIMESTAMP_FILE=str(control),
        FAKETIME_NO_CACHE="1",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    node = Node(freePort(), logDir=str(tmp_path))
    node.process = subprocess.Popen(node.command(), env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
    try:
        node.waitReady()
        with LineClient(node.port) as holder, LineClient(node.port) as waiter:
            holder.ask(b"A k 2 0")
            waiter.send(b"A k 2 0\n")
            granted = time.monotonic()
            control.write_text("+1d\n")  # wall clock one day ahead
            with pytest.raises(socket.timeout):
                waiter.readline(timeout=1.0)
            control.write_text("-1d\n")  # and now a day behind
            line = waiter.readline(timeout=5.0)
            elapsed = time.monotonic() - granted
            assert line.startswith(b"A k ")
            assert 1.8 <= elapsed < 4.0
    finally:
        node.stop()


def test_half_close_like_nc_gets_the_answers_decided_at_once(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    C{printf 'A k 30 0\\nP x\\n' | nc host port}: the answers decided at
    once arrive, then the node closes.
    """
    node = spawn()
    with LineClient(node.port) as holder:
        holder.ask(b"A busy 30 0")
        c = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        c.sendall(b"A k 30 0\nA busy 30 0\nP x\n")
        c.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            data = c.recv(4096)
            if not data:
                break
            received += data
        c.close()
        lines = received.split(b"\n")
        assert lines[0].startswith(b"A k ") and lines[1:] == [b"P x", b""]


def _queueBehind(node, how: str, tmp_path) -> object:  # type: ignore[no-untyped-def]
    """
    Queue an acquire of C{k} from a client that then goes away by C{how}.
    """
    if how == "kill -9":
        script = tmp_path / "waiter.py"
        script.write_text(
            "import socket, sys, time\n"
            f"s = socket.create_connection(('127.0.0.1', {node.port}))\n"
            "s.sendall(b'A k 30 0\\nP queued\\n')\n"
            "buf = b''\n"
            "while b'P queued' not in buf:\n"
            "    buf += s.recv(100)\n"
            "print('queued', flush=True)\n"
            "time.sleep(600)\n"
        )
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"queued\n"
        return proc
    client = LineClient(node.port)
    client.send(b"A k 30 0\n")
    waitQueued(client)
    return client


@pytest.mark.parametrize("how", ["close", "shutdown(SHUT_WR)", "kill -9"])
def test_a_waiter_that_goes_away_is_withdrawn_at_once(spawn, tmp_path, how) -> None:  # type: ignore[no-untyped-def]
    """
    A queued waiter whose client closes its socket, shuts down its sending
    side, or is killed never gets the lock: the next live waiter does, at
    the release (not a lease later).
    """
    httpPort = freePort()
    node = spawn(args=["--http", f"tcp:{httpPort}:interface=127.0.0.1"])
    with LineClient(node.port) as holder, LineClient(node.port) as live:
        granted = holder.ask(b"A k 30 0").split()[2]
        gone = _queueBehind(node, how, tmp_path)
        live.send(b"A k 30 0\n")
        waitQueued(live)
        assert statusOf(httpPort)["waiters"] == 2
        if how == "kill -9":
            gone.kill()  # type: ignore[attr-defined]
            gone.wait(10)  # type: ignore[attr-defined]
        elif how == "close":
            gone.close()  # type: ignore[attr-defined]
        else:
            gone.sock.shutdown(socket.SHUT_WR)  # type: ignore[attr-defined]
        waitFor(lambda: statusOf(httpPort)["waiters"] == 1, timeout=10,
                what="the gone waiter withdrawn")
        assert holder.ask(b"R k " + granted) == b"R k OK"
        assert live.readline(timeout=5).startswith(b"A k ")
        if how == "shutdown(SHUT_WR)":
            # Its socket is still open for reading: it got nothing, then EOF.
            gone.sock.settimeout(10)  # type: ignore[attr-defined]
            assert gone.sock.recv(100) == b""  # type: ignore[attr-defined]
            gone.close()  # type: ignore[attr-defined]


def test_sigint_stops_a_node_started_with_sigint_ignored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    A script that starts a node with `&` leaves SIGINT ignored in it; the
    graceful stop must still work.
    """
    import signal

    node = Node(freePort(), logDir=str(tmp_path))
    node.process = subprocess.Popen(
        node.command(), env=twistdEnvironment(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        node.waitReady()
        node.process.send_signal(signal.SIGINT)
        assert node.process.wait(15) in (0, -signal.SIGINT)
    finally:
        node.stop()
