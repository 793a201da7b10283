"""
systemd: the notification protocol (READY, STATUS, STOPPING, WATCHDOG)
from real nodes started by the unit's own ExecStart line under a real
NOTIFY_SOCKET, the same rules on a deterministic clock, and the unit file
checked by systemd-analyze.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from twisted.internet.task import Clock

from lockservice.systemd import (
    Notifier,
    SystemdService,
    describe,
    notifyAddress,
    watchdogInterval,
)
from lockservice.testing.harness import LineClient, freePorts, ping
from lockservice.testing.notify import Message, NotifyListener

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "systemd" / "lockservice.service"
CI = os.environ.get("CI") == "true"


# -- the rules, on a deterministic clock ----------------------------------------


class FakeNotifier:
    def __init__(self) -> None:
        self.sent: List[List[str]] = []

    def send(self, *assignments: str) -> bool:
        self.sent.append(list(assignments))
        return True

    def close(self) -> None:
        pass


class FakeLocks:
    role = "syncing"
    activeAddress: Optional[bytes] = None


class FakeView:
    def __init__(self, alive: bool) -> None:
        self.alive = alive


class FakeCluster:
    term = 7
    clockSuspect = None

    def __init__(self) -> None:
        self.views = {1: FakeView(True), 2: FakeView(False)}


def test_notify_socket_addresses() -> None:
    assert notifyAddress({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert notifyAddress({"NOTIFY_SOCKET": "@abstract"}) == "\0abstract"
    assert notifyAddress({}) is None
    assert notifyAddress({"NOTIFY_SOCKET": "vsock:2:1"}) is None


def test_watchdog_interval_is_half_and_only_for_this_process() -> None:
    assert watchdogInterval({"WATCHDOG_USEC": "10000000"}, 42) == 5.0
    assert watchdogInterval({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "42"}, 42) == 5.0
    assert watchdogInterval({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "43"}, 42) is None
    assert watchdogInterval({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdogInterval({}, 42) is None


def test_ready_once_when_the_node_does_its_job_and_status_at_every_role() -> None:
    clock, notifier, locks, cluster = Clock(), FakeNotifier(), FakeLocks(), FakeCluster()
    clock.callWhenRunning = lambda f, *a: f(*a)  # type: ignore[attr-defined]
    service = SystemdService(clock, notifier, locks, cluster)  # type: ignore[arg-type]
    service.startService()
    assert notifier.sent == [["STATUS=syncing: looking for the active"]]
    locks.activeAddress = b"a:1"
    service.roleChanged("standby")
    assert notifier.sent[-1] == ["READY=1", "STATUS=standby: in sync with the active a:1"]
    locks.role, locks.activeAddress = "active", b"me:1"
    service.roleChanged("active")
    service.roleChanged("active")  # no change: nothing sent
    assert notifier.sent[-1] == ["STATUS=active (term 7): serving; 1 of 2 peers reachable"]
    assert sum("READY=1" in m for m in notifier.sent) == 1
    service.stoppingNow()
    assert notifier.sent[-1] == ["STOPPING=1", "STATUS=stopping"]
    service.roleChanged("handing-off")
    assert notifier.sent[-1][0].startswith("STATUS=stopping; handing-off")
    assert sum("READY=1" in m for m in notifier.sent) == 1


def test_no_ready_while_syncing_or_stopping() -> None:
    clock, notifier, locks = Clock(), FakeNotifier(), FakeLocks()
    clock.callWhenRunning = lambda f, *a: f(*a)  # type: ignore[attr-defined]
    service = SystemdService(clock, notifier, locks, FakeCluster())  # type: ignore[arg-type]
    service.startService()
    service.roleChanged("handing-off")
    service.stoppingNow()
    service.roleChanged("active")
    assert not any("READY=1" in m for m in notifier.sent), notifier.sent


def test_watchdog_pings_come_from_the_reactor_every_half_period() -> None:
    clock, notifier, locks = Clock(), FakeNotifier(), FakeLocks()
    locks.role = "active"
    clock.callWhenRunning = lambda f, *a: f(*a)  # type: ignore[attr-defined]
    service = SystemdService(clock, notifier, locks, None, watchdog=5.0)  # type: ignore[arg-type]
    service.startService()
    pings = lambda: sum(m == ["WATCHDOG=1"] for m in notifier.sent)  # noqa: E731
    assert pings() == 1
    clock.advance(4.9)
    assert pings() == 1
    clock.advance(0.1)
    assert pings() == 2
    for _ in range(10):
        clock.advance(5)
    assert pings() == 12
    # A reactor that stalls for a minute sends one ping when it runs again,
    # not the missed ones.
    clock.advance(60)
    assert pings() == 13
    service.stopService()
    clock.advance(50)
    assert pings() == 13
    assert describe("active", None, None) == "active (single node): serving"


def test_a_send_never_blocks_and_a_missing_socket_is_no_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    notifier = Notifier(str(tmp_path / "nobody-listens"))
    assert notifier.send("READY=1") is False
    listener = NotifyListener()
    try:
        notifier = Notifier(notifyAddress({"NOTIFY_SOCKET": listener.address}) or "")
        assert notifier.send("READY=1", "STATUS=a\nb") is True
        message = listener.waitFor(lambda m: True, 5)
        assert message.assignments == ["READY=1", "STATUS=a b"] and message.pid == os.getpid()
    finally:
        listener.close()


# -- the unit file ---------------------------------------------------------------


def _unitValue(name: str) -> str:
    for line in UNIT.read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name}= not in {UNIT}")


def _analyze() -> Optional[str]:
    found = shutil.which("systemd-analyze")
    if found is None:
        if CI:
            pytest.fail("systemd-analyze is missing (Debian package systemd)")
        pytest.skip("systemd-analyze is missing (Debian package systemd)")
    return found


def test_unit_settings() -> None:
    assert _unitValue("Type") == "notify" and _unitValue("NotifyAccess") == "main"
    assert _unitValue("ExecStart") == (
        "/usr/local/bin/twistd -n --pidfile= lockservice --config "
        "/etc/lockservice/lockservice.toml")
    assert int(_unitValue("LimitNOFILE")) >= 10000 + 1000
    # A graceful stop ends within 10 s of the signal.
    assert int(_unitValue("TimeoutStopSec")) > 10
    assert _unitValue("Restart") == "on-failure" and _unitValue("User") == "lockservice"
    assert _unitValue("DynamicUser") == "no" and _unitValue("WatchdogSec")
    for setting in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                    "PrivateTmp=yes", "PrivateDevices=yes", "ProtectKernelTunables=yes",
                    "ProtectControlGroups=yes", "CapabilityBoundingSet=\n",
                    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
                    "SystemCallArchitectures=native", "StateDirectory=lockservice",
                    "ConfigurationDirectory=lockservice"):
        assert setting in UNIT.read_text(), setting


def test_systemd_analyze_verify_prints_nothing_for_a_copy_of_the_unit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    verify checks that ExecStart's program exists: a copy of the unit whose
    ExecStart names this environment's twistd.
    """
    analyze = _analyze()
    unit = tmp_path / "lockservice.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/twistd", _twistd()))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_systemd_analyze_verify_prints_nothing_for_the_shipped_unit() -> None:
    """
    The shipped file itself, unchanged: /usr/local/bin/twistd must exist
    for verify, so where it does not (a test machine), a private mount
    namespace overlays /usr/local/bin with a stub there, which nothing
    outside the namespace sees (needs root; --root= does not work: verify
    then looks for the default target inside the root).
    """
    analyze = _analyze()
    if os.path.exists("/usr/local/bin/twistd"):
        command = [analyze, "verify", str(UNIT)]
    else:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            if CI:
                pytest.fail("needs root and unshare to put a stub at /usr/local/bin/twistd")
            pytest.skip("needs root and unshare to put a stub at /usr/local/bin/twistd")
        script = (
            'set -e; u=$(mktemp -d); w=$(mktemp -d); '
            'mount -t overlay overlay -o "lowerdir=/usr/local/bin,upperdir=$u,workdir=$w" '
            '/usr/local/bin; printf "#!/bin/sh\\n" > /usr/local/bin/twistd; '
            'chmod 755 /usr/local/bin/twistd; exec "$0" verify "$1"')
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                   analyze, str(UNIT)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    assert not os.path.exists("/usr/local/bin/twistd") or "--root" in command


# -- real nodes under the unit's ExecStart -----------------------------------------


def _twistd() -> str:
    return os.path.join(os.path.dirname(sys.executable), "twistd")


def execStart(config: Path) -> List[str]:
    """
    The unit's ExecStart, with this environment's twistd and C{config}.
    """
    argv = shlex.split(_unitValue("ExecStart"))
    assert argv[0] == "/usr/local/bin/twistd" and argv[-1] == "/etc/lockservice/lockservice.toml"
    return [_twistd()] + argv[1:-1] + [str(config)]


class Started:
    def __init__(self, process: subprocess.Popen, out: Path) -> None:  # type: ignore[type-arg]
        self.process = process
        self.out = out

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.out.read_text(errors="replace")


@pytest.fixture
def units(tmp_path) -> Iterator:  # type: ignore[no-untyped-def, type-arg]
    started: List[Started] = []

    def start(config: Path, listener: NotifyListener, watchdogUsec: int = 1_000_000) -> Started:
        out = config.with_suffix(".out")
        env = dict(os.environ, NOTIFY_SOCKET=listener.address, WATCHDOG_USEC=str(watchdogUsec))
        # As systemd sets it: WATCHDOG_PID names the main process itself
        # (the shell execs twistd, which keeps its pid).
        command = ["sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh",
                   *execStart(config)]
        with open(out, "wb") as f:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=f,
                                       stderr=subprocess.STDOUT, cwd=str(tmp_path))
        unit = Started(process, out)
        started.append(unit)
        return unit

    yield start
    for unit in started:
        if unit.process.poll() is None:
            unit.process.kill()
            unit.process.wait(10)


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.write_text("systemd-test-secret-0123456789abcdef\n")
    secret.chmod(0o600)
    return secret


def _status(http: int) -> Dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_lone_node_under_the_unit(tmp_path, units) -> None:  # type: ignore[no-untyped-def]
    port, http = freePorts(2)
    config = tmp_path / "lockservice.toml"
    config.write_text(f'listen = "tcp:{port}:interface=127.0.0.1"\n'
                      f'http = "tcp:{http}:interface=127.0.0.1"\n'
                      f'state-dir = "{tmp_path / "state"}"\nlog-format = "json"\n')
    listener = NotifyListener()  # abstract: @name
    try:
        unit = units(config, listener)
        ready = listener.waitFor(lambda m: m.has("READY=1"), 20, "READY=1")
        # Sent by the main process (NotifyAccess=main), once it listens.
        assert ready.pid == unit.pid
        assert ready.status() == "active (single node): serving"
        assert ping(port)
        # The role watch rides on the service's activity observers: every
        # kind of call it gets is answered (none counts as an internal error).
        with LineClient(port) as a, LineClient(port) as b:
            token = a.ask(b"A k 30 0").split()[2]
            b.send(b"A k 30 5\n")
            assert a.ask(b"N k " + token + b" 30") == b"N k OK"
            assert a.ask(b"R k " + token) == b"R k OK"
            assert b.readline().startswith(b"A k ")
            assert b.ask(b"A w 30 0.1").startswith(b"A w ")
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
            assert b"lockservice_internal_errors_total 0.0" in r.read()
        pings = [m for m in listener.messages if m.assignments == ["WATCHDOG=1"]]
        while len(pings) < 5:
            message = listener.waitFor(lambda m: m.assignments == ["WATCHDOG=1"]
                                       and m not in pings, 5, "WATCHDOG=1")
            pings.append(message)
        assert all(m.pid == unit.pid for m in pings)
        gaps = [b.at - a.at for a, b in zip(pings[1:], pings[2:], strict=False)]
        # Half of WATCHDOG_USEC (1 s), on a busy machine.
        assert 0.3 < sum(gaps) / len(gaps) < 0.8, gaps
        signalled = time.monotonic()
        unit.process.send_signal(signal.SIGTERM)
        stopping = listener.waitFor(lambda m: m.has("STOPPING=1"), 5, "STOPPING=1")
        assert stopping.pid == unit.pid and stopping.at - signalled < 2
        assert unit.process.wait(10) == -signal.SIGTERM
        # The unit logs to standard output (the journal), here as JSON.
        lines = [json.loads(line) for line in unit.log().splitlines() if line.strip()]
        assert any(line["message"].startswith("LockFactory starting") for line in lines)
    finally:
        listener.close()


def test_three_nodes_under_the_unit(tmp_path, units) -> None:  # type: ignore[no-untyped-def]
    ports, https = freePorts(3), freePorts(3)
    secret = _secret(tmp_path)
    peers = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
    configs = []
    for i, (port, http) in enumerate(zip(ports, https, strict=True)):
        config = tmp_path / f"node{i}.toml"
        config.write_text(f"peers = [{peers}]\nnode = \"127.0.0.1:{port}\"\n"
                          f'secret = "{secret}"\nhttp = "tcp:{http}:interface=127.0.0.1"\n'
                          f'state-dir = "{tmp_path / f"state{i}"}"\n')
        configs.append(config)
    directory = tmp_path / "notify"
    directory.mkdir()
    listener = NotifyListener(str(directory))  # a path
    try:
        # The two lower-priority nodes first: node1 finds no active and
        # promotes; node2 follows it.
        node1, node2 = units(configs[1], listener), units(configs[2], listener)

        def readyOf(unit: Started) -> Message:
            return listener.waitFor(lambda m: m.pid == unit.pid and m.has("READY=1"), 20,
                                    f"READY=1 from {unit.pid}")

        assert readyOf(node1).status().startswith("active")  # type: ignore[union-attr]
        assert readyOf(node2).status() == f"standby: in sync with the active 127.0.0.1:{ports[1]}"
        with LineClient(ports[1]) as c:
            for key in (b"a", b"b", b"c"):
                assert c.ask(b"A " + key + b" 60 0").startswith(b"A " + key)
        # node0 starts while node1 holds the state: READY only once synced.
        node0 = units(configs[0], listener)
        ready0 = readyOf(node0)
        before = [m for m in listener.fromPid(node0.pid) if m.at < ready0.at and m.status()]
        assert before and all(m.status().startswith("syncing")  # type: ignore[union-attr]
                              for m in before), [m.assignments for m in before]
        assert ready0.status().startswith(("standby: in sync", "active"))  # type: ignore[union-attr]
        assert _status(https[0])["held_keys"] == 3
        # It takes over from node1 by handoff (it has the highest priority).
        listener.waitFor(lambda m: m.pid == node0.pid and (m.status() or "").startswith("active"),
                         20, "node0 active")
        # Every node pings the watchdog (WATCHDOG_PID is its own pid).
        for unit in (node0, node1, node2):
            listener.waitFor(lambda m, unit=unit: m.pid == unit.pid and m.at > ready0.at
                             and m.assignments == ["WATCHDOG=1"], 5, "WATCHDOG=1")
        # A graceful stop of the active: STOPPING=1 first, then the handoff
        # (node1 active again).
        node0.process.send_signal(signal.SIGTERM)
        took = listener.waitFor(lambda m: m.pid == node1.pid and m.at > ready0.at
                                and (m.status() or "").startswith("active"), 15,
                                "node1 active after the handoff")
        stopping0 = listener.waitFor(lambda m: m.pid == node0.pid and m.has("STOPPING=1"), 1)
        assert stopping0.at < took.at
        assert listener.messages.index(stopping0) < listener.messages.index(took)
        assert node0.process.wait(10) == -signal.SIGTERM
        # A standby (SIGINT) and the last node (SIGTERM) say STOPPING=1 too.
        node2.process.send_signal(signal.SIGINT)
        listener.waitFor(lambda m: m.pid == node2.pid and m.has("STOPPING=1"), 5)
        assert node2.process.wait(10) == -signal.SIGINT
        node1.process.send_signal(signal.SIGTERM)
        listener.waitFor(lambda m: m.pid == node1.pid and m.has("STOPPING=1"), 5)
        assert node1.process.wait(10) == -signal.SIGTERM
        for unit in (node0, node1, node2):
            assert sum(m.has("READY=1") for m in listener.fromPid(unit.pid)) == 1
    finally:
        listener.close()
