"""
A real C{twistd -n lockservice} process on a loopback port, driven over TCP.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from lockservice.testing.harness import LineClient, Node, freePort, twistdEnvironment

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def test_grant_fifo_handover_and_release_over_tcp(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as a, LineClient(node.port) as b:
        granted = a.ask(b"A orders/42 30 5").split()
        assert granted[:2] == [b"A", b"orders/42"]
        b.send(b"A orders/42 30 5\n")
        time.sleep(0.1)
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
    node = spawn()
    rssBefore = node.rss()
    flood = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    chunk = b"x" * 65536
    sent = 0
    answer = b""
    try:
        while sent < 10 * 1024 * 1024:
            flood.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        while True:
            data = flood.recv(4096)
            if not data:
                break
            answer += data
    except (TimeoutError, ConnectionResetError):
        pass
    flood.close()
    assert answer in (b"E * * line too long\n", b"")
    assert node.rss() - rssBefore < 16 * 1024 * 1024
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-lease", "abc"], b"--max-lease must be a number"),
        (["--max-wait", "-1"], b"--max-wait must be a number of seconds"),
        (["--listen", "nonsense:1"], b""),
        (["--peers", "a:1,b:2"], b"give --node"),
        (["--peers", "127.0.0.1:1,127.0.0.1:1"], b"same node twice"),
        (["--secret", "/nonexistent/file"], b"cannot read --secret"),
    ],
)
def test_bad_options_exit_non_zero_with_a_message(args, message) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
         "-n", "--pidfile=", "lockservice"] + args,
        env=twistdEnvironment(), capture_output=True, timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_port_in_use_exits_non_zero(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    second = Node(node.port, logDir=node.logDir, name="second")
    second.start(wait=False)
    assert second.process is not None
    assert second.process.wait(60) != 0


@pytest.mark.skipif(not os.path.exists(FAKETIME_LIB), reason="needs Debian's faketime")
def test_wall_clock_steps_neither_shorten_nor_lengthen_a_lease(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    The node runs under libfaketime with the wall clock steered from a file
    (the monotonic clock left real).  A lease of 2 s must run out after 2 s
    of real time whatever the wall clock does meanwhile.
    """
    control = tmp_path / "faketime"
    control.write_text("+0\n")
    env = twistdEnvironment()
    env.update(
        LD_PRELOAD=FAKETIME_LIB,
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


def test_half_close_like_nc_still_gets_the_wait_answer(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    with LineClient(node.port) as holder:
        holder.ask(b"A k 30 0")
        waiter = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        waiter.sendall(b"A k 30 0.3\n")
        waiter.shutdown(socket.SHUT_WR)
        assert waiter.recv(100) == b"T k\n"
        assert waiter.recv(100) == b""  # closed after the last answer
        waiter.close()


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
