"""
docs/operations.md's guide, run: every fenced C{shell} block, in order, on
three stand-in hosts (each a network namespace of its own on one bridge,
with overlays on /etc, /usr, /var, /opt and /root so that nothing is
written to this machine, and its own host name) and a workstation
directory.

Blocks tagged C{shell-systemd} need a running systemd, which a test
machine has not: the test plays systemd's part for the commands they hold
(C{systemctl start|stop|restart|enable --now lockservice}), from the unit
the guide installed: it runs the unit's ExecStart under a NOTIFY_SOCKET
and waits for READY=1 (as C{systemctl start} does for C{Type=notify}),
and stops with SIGTERM, waiting for STOPPING=1 and the exit.  Blocks
tagged C{shell-install} install the package, which this environment has
already: the test mounts it at /opt/lockservice.  The test also stands in
for the copies the guide asks the reader to make from the workstation to
each node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from lockservice.testing.notify import NotifyListener

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
HOSTS = ("ls1", "ls2", "ls3")
CI = os.environ.get("CI") == "true"

SHELL_KINDS = ("shell", "shell-systemd", "shell-install")
FENCE = re.compile(r"^```([^\s`]*)[ \t]*([^\s`]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass
class Block:
    kind: str
    host: Optional[str]
    text: str
    line: int


def blocks() -> List[Block]:
    text = DOC.read_text()
    found = []
    for match in FENCE.finditer(text):
        found.append(Block(match.group(1), match.group(2) or None, match.group(3),
                           text[:match.start()].count("\n") + 1))
    return found


def test_every_command_block_is_run_or_marked() -> None:
    """
    No command block escapes the test: C{sh}, C{bash} or C{console}
    blocks are not allowed, systemd's commands are in C{shell-systemd}
    blocks only and those hold nothing else, and every block names a
    known host or none.
    """
    found = blocks()
    assert sum(b.kind == "shell" for b in found) >= 15
    for block in found:
        where = f"docs/operations.md:{block.line}"
        assert block.kind not in ("", "sh", "bash", "console", "shell-session"), where
        if block.kind not in SHELL_KINDS:
            assert block.host is None, where
            continue
        assert block.host in (None, "workstation") + HOSTS, where
        commands = [line for line in block.text.splitlines()
                    if line.strip() and not line.startswith((" ", "\t"))]
        for line in commands:
            first = line.split()[0]
            if block.kind == "shell-systemd":
                assert first in ("systemctl", "journalctl"), where
            elif block.kind == "shell-install":
                assert "pip" in first or first == "python3", where
            else:
                assert first not in ("systemctl", "journalctl"), where


def test_the_guide_says_rules_not_history() -> None:
    text = DOC.read_text()
    for word in ("SPEC", "§", "issue 2", "OPS-", "Real session", "ticket"):
        assert word not in text, word
    assert not re.search(r"\b(19|20)\d\d-\d\d-\d\d\b.*(run|tested|measured)", text)


# -- the run ------------------------------------------------------------------------------


def _need(condition: bool, why: str) -> None:
    if not condition:
        if CI:
            pytest.fail(why)
        pytest.skip(why)


class Host:
    """
    One stand-in host: a network namespace of the lab, and a mount and
    UTS namespace held open by a sleeping process, entered by nsenter.
    """

    def __init__(self, name: str, netns: str, hosts: str, work: Path) -> None:
        self.name = name
        self.fqdn = f"{name}.example.com"
        self.work = work
        work.mkdir(parents=True)
        overlays = []
        for directory in ("/etc", "/usr", "/var", "/opt", "/root"):
            slug = directory.strip("/")
            upper, scratch = work / f"{slug}.upper", work / f"{slug}.work"
            upper.mkdir()
            scratch.mkdir()
            overlays.append(f"mount -t overlay overlay -o lowerdir={directory},"
                            f"upperdir={upper},workdir={scratch} {directory}")
        pidFile = work / "pid"
        setup = "\n".join([
            "set -e",
            "mount --make-rprivate /",
            *overlays,
            f"mkdir -p /opt/lockservice && mount --bind {shlex.quote(sys.prefix)} "
            "/opt/lockservice",
            f"cat >> /etc/hosts <<'EOF'\n{hosts}EOF",
            f"hostname {self.fqdn}",
            "rm -f /usr/local/bin/twistd /usr/local/bin/lockservice",
            f"echo $$ > {pidFile}",
            "exec sleep 100000",
        ])
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--fork",
             "sh", "-c", setup], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not (pidFile.exists() and pidFile.read_text().strip()):
            if self.holder.poll() is not None or time.monotonic() > deadline:
                out = self.holder.stdout.read().decode() if self.holder.stdout else ""
                raise RuntimeError(f"host {name} did not come up: {out}")
            time.sleep(0.05)
        self.pid = pidFile.read_text().strip()
        self.node: Optional[subprocess.Popen] = None  # type: ignore[type-arg]

    def enter(self, cwd: str = "/") -> List[str]:
        return ["nsenter", "--target", self.pid, "--mount", "--uts", "--net", f"--wd={cwd}",
                "--"]

    def run(self, script: str, check: bool = True) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8"}
        # From the source checkout (the guide's contrib/ paths).
        result = subprocess.run(self.enter(str(ROOT)) + ["bash", "-euo", "pipefail", "-c", script],
                                cwd=str(ROOT), env=env, capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"on {self.name}, exit {result.returncode}:\n{script}\n"
                                 f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}")
        return result

    def close(self) -> None:
        if self.node is not None and self.node.poll() is None:
            self.node.kill()
            self.node.wait(10)
        self.holder.kill()
        self.holder.wait(10)


class Systemd:
    """
    systemd's part for one unit on the stand-in hosts.
    """

    def __init__(self, hosts: Dict[str, Host], listener: NotifyListener, logs: Path) -> None:
        self.hosts = hosts
        self.listener = listener
        self.logs = logs

    def unit(self, host: Host) -> Dict[str, str]:
        text = host.run("cat /etc/systemd/system/lockservice.service").stdout
        settings: Dict[str, str] = {}
        for line in text.splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                settings.setdefault(key.strip(), value.strip())
        return settings

    def start(self, host: Host) -> None:
        if host.node is not None and host.node.poll() is None:
            return
        unit = self.unit(host)
        assert unit["Type"] == "notify" and unit["User"] == "lockservice"
        # StateDirectory= and ConfigurationDirectory=: made for the user.
        host.run(f"install -d -m {unit.get('StateDirectoryMode', '0755')} -o lockservice "
                 f"-g lockservice /var/lib/{unit['StateDirectory']}")
        config = shlex.split(unit["ExecStart"])[-1]
        # The node runs as root here (this Python may live where the user
        # cannot read): check instead that the user can read its files.
        files = host.run(
            f"grep -E '^(secret|accept-secret|tls-cert|tls-key|tls-ca) = ' {config} "
            f"| cut -d'\"' -f2").stdout
        for path in [config, *files.split()]:
            host.run(f"runuser -u lockservice -- test -r {shlex.quote(path)}")
        host.run("runuser -u lockservice -- test -w /var/lib/lockservice")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "NOTIFY_SOCKET": self.listener.address,
               "WATCHDOG_USEC": str(int(unit["WatchdogSec"]) * 1_000_000)}
        out = open(self.logs / f"{host.name}.journal", "ab")
        host.node = subprocess.Popen(
            host.enter() + ["sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh",
                            *shlex.split(unit["ExecStart"])],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd="/")
        out.close()
        pid = host.node.pid
        deadline = time.monotonic() + 30
        while True:
            if host.node.poll() is not None:
                raise AssertionError(f"{host.name} exited at start:\n" + self.journal(host))
            try:
                self.listener.waitFor(lambda m: m.pid == pid and m.has("READY=1"), 0.5)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{host.name}: no READY=1:\n" + self.journal(host)) from None

    def stop(self, host: Host) -> None:
        node = host.node
        if node is None or node.poll() is not None:
            return
        node.send_signal(signal.SIGTERM)
        self.listener.waitFor(lambda m: m.pid == node.pid and m.has("STOPPING=1"), 5)
        node.wait(int(self.unit(host)["TimeoutStopSec"]))
        host.node = None

    def journal(self, host: Host) -> str:
        path = self.logs / f"{host.name}.journal"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def play(self, block: Block) -> None:
        targets = [block.host] if block.host else list(HOSTS)
        for name in targets:
            host = self.hosts[name]
            for line in block.text.splitlines():
                words = shlex.split(line)
                if not words or words[0] == "journalctl":
                    continue
                assert words[0] == "systemctl", line
                action = [w for w in words[1:] if not w.startswith("-")]
                if action[0] == "daemon-reload":
                    continue
                assert action[-1] == "lockservice", line
                if action[0] in ("start", "enable"):
                    assert action[0] == "start" or "--now" in words, line
                    self.start(host)
                elif action[0] == "stop":
                    self.stop(host)
                elif action[0] == "restart":
                    self.stop(host)
                    self.start(host)
                elif action[0] == "status":
                    assert host.node is not None and host.node.poll() is None
                else:
                    raise AssertionError(f"no stand-in for {line!r}")


@pytest.fixture
def lab() -> Iterator:  # type: ignore[type-arg]
    from lockservice.testing import netns

    for tool in ("ip", "nsenter", "unshare", "runuser", "openssl", "curl",
                 "systemd-sysusers", "systemd-tmpfiles"):
        _need(shutil.which(tool) is not None, f"{tool} is missing")
    why = netns.unavailable()
    _need(why is None, str(why))
    with netns.Lab(3) as made:
        yield made


def test_the_guide_runs(tmp_path: Path, lab) -> None:  # type: ignore[no-untyped-def]
    names = "".join(f"{lab.address(i)} {h}.example.com {h}\n" for i, h in enumerate(HOSTS))
    workstation = tmp_path / "workstation"
    workstation.mkdir()
    setupDir = workstation / "lockservice-setup"
    hosts: Dict[str, Host] = {}
    notify = tmp_path / "notify"
    notify.mkdir()
    notify.chmod(0o755)
    listener = NotifyListener(str(notify))
    systemd = Systemd(hosts, listener, tmp_path)
    configured = False
    held: Optional[str] = None
    client = ("--addr ls1.example.com:7700,ls2.example.com:7700 --tls-ca "
              "/etc/lockservice/tls/ca.pem --tls-cert /etc/lockservice/tls/node.pem "
              "--tls-key /etc/lockservice/tls/node.key")
    try:
        for i, name in enumerate(HOSTS):
            hosts[name] = Host(name, lab.namespaces[i], names, tmp_path / name)
        for block in blocks():
            if block.kind == "shell-install":
                continue  # the package is this environment's, at /opt/lockservice
            if block.kind == "shell-systemd":
                systemd.play(block)
                if held is None and all(h.node is not None for h in hosts.values()):
                    # A lock that every later step (rotations, restarts, the
                    # full stop) must keep, with its token.
                    held = hosts["ls2"].run(
                        f"lockservice acquire demo/held --lease 3600 {client}").stdout.strip()
                continue
            if block.kind != "shell":
                continue
            if block.host == "workstation":
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", block.text], cwd=str(workstation),
                    env={**os.environ, "HOME": str(workstation)}, capture_output=True,
                    text=True, timeout=120, stdin=subprocess.DEVNULL)
                assert result.returncode == 0, (block.line, result.stdout, result.stderr)
                continue
            for name in [block.host] if block.host else list(HOSTS):
                host = hosts[name]
                if setupDir.exists():
                    # The reader's copy to the node (scp, ...).
                    files = [setupDir / f for f in ("secret", "ca.pem", f"{name}.pem",
                                                    f"{name}.key") if (setupDir / f).exists()]
                    host.run("mkdir -p /root/lockservice-setup && cp "
                             + " ".join(shlex.quote(str(f)) for f in files)
                             + " /root/lockservice-setup/")
                try:
                    host.run(block.text)
                except AssertionError as e:
                    raise AssertionError(f"docs/operations.md:{block.line}: {e}\n"
                                         + systemd.journal(host)) from None
            if block.host is None and "lockservice.toml <<EOF" in block.text:
                configured = True
        assert configured
        # What the guide built: three nodes, one active, every one ready,
        # all logging JSON to the journal.
        for name, host in hosts.items():
            assert host.node is not None and host.node.poll() is None, name
            ready = host.run("curl -fsS --retry 10 --retry-delay 1 --retry-all-errors "
                             "http://127.0.0.1:7780/ready").stdout
            assert '"ready":true' in ready, (name, ready)
            journal = (tmp_path / f"{name}.journal").read_text().splitlines()
            assert journal and all(line.startswith('{"time":') for line in journal), journal[:3]
        roles = sorted(host.run("curl -fsS http://127.0.0.1:7780/status | python3 -c "
                                "'import json,sys; print(json.load(sys.stdin)[\"role\"])'")
                       .stdout.strip() for host in hosts.values())
        assert roles == ["active", "standby", "standby"]
        assert held is not None and held.isdigit()
        answer = hosts["ls1"].run(
            f"lockservice release demo/held {held} {client}", check=False)
        assert answer.stdout.strip() == "OK", (answer.stdout, answer.stderr)
        events = {json.loads(line)["event"] for host in HOSTS
                  for line in (tmp_path / f"{host}.journal").read_text().splitlines()}
        assert {"promoted", "took_over", "handed_off", "synchronised",
                "peer_lost"} <= events, events
    finally:
        for host in hosts.values():
            host.close()
        listener.close()
