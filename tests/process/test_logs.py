"""
--log-format json, SIGHUP reopening the log file, and the named events of
role changes, peer losses, refused handshakes and failed state saves.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from twisted.logger import Logger, LogLevel, globalLogPublisher
from twisted.python.failure import Failure

from lockservice.logs import LogTarget, jsonLine, jsonRecord, targetFor
from lockservice.testing.harness import Node, freePort, ping, twistdEnvironment, waitFor


def capture(emit: Any) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        emit()
    finally:
        globalLogPublisher.removeObserver(events.append)
    return events


def test_a_record_is_flat_with_what_shippers_expect() -> None:
    [event] = capture(lambda: Logger(namespace="lockservice.test").warn(
        "lost peer {peer}", peer="127.0.0.1:7701", event="peer_lost"))
    record = jsonRecord(event)
    assert list(record)[:5] == ["time", "level", "namespace", "event", "message"]
    assert record["level"] == "warn" and record["namespace"] == "lockservice.test"
    assert record["event"] == "peer_lost" and record["message"] == "lost peer 127.0.0.1:7701"
    assert record["peer"] == "127.0.0.1:7701"
    assert record["time"].endswith("Z") and record["time"][10] == "T"
    assert not any(key.startswith("log_") for key in record)
    line = jsonLine(event)
    assert line.endswith("\n") and line.count("\n") == 1 and json.loads(line) == record


def test_values_json_has_no_type_for_become_text() -> None:
    [event] = capture(lambda: Logger().info(
        "x {key!r}", key=b"k\xff", n=float("inf"), obj=object(), nested={"a": [b"b", (1, 2)]},
        time="a field named like the envelope", message="and another"))
    record = jsonRecord(event)
    assert record["key"] == "k\ufffd" and record["n"] == "inf"
    assert record["obj"].startswith("<object object")
    assert record["nested"] == {"a": ["b", [1, 2]]}
    assert record["time_"] == "a field named like the envelope"
    assert record["message_"] == "and another" and record["message"] == "x b'k\\xff'"


def test_a_failure_carries_its_traceback() -> None:
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        failure = Failure()
    [event] = capture(lambda: Logger().failure("it broke", failure, event="oops"))
    record = jsonRecord(event)
    assert record["level"] == "critical" and "ZeroDivisionError" in record["traceback"]
    assert record["message"] == "it broke" and record["event"] == "oops"


def test_legacy_events_are_records_too() -> None:
    from twisted.python import log

    events = capture(lambda: log.msg("Site starting on 7780"))
    record = jsonRecord(events[-1])
    assert record["message"] == "Site starting on 7780" and record["level"] == "info"
    assert "isError" not in record and "format" not in record


def test_the_target_follows_twistds_options(tmp_path: Path) -> None:
    assert targetFor(None, "json") is None
    assert targetFor({"syslog": True}, "json") is None
    assert targetFor({"logger": "x.y"}, "json") is None
    assert targetFor({"logfile": "-", "nodaemon": False}, "json") is None
    stdout = targetFor({"logfile": None, "nodaemon": True}, "json")
    assert stdout is not None and stdout.file is None
    target = targetFor({"logfile": str(tmp_path / "n.log"), "nodaemon": True}, "text")
    assert target is not None and target.file is not None
    target.observer(capture(lambda: Logger().info("hello {x}", x=1))[0])
    assert "hello 1" in (tmp_path / "n.log").read_text()


def test_a_text_target_writes_twistds_lines() -> None:
    out = io.StringIO()
    target = LogTarget("text", None, stdout=out)
    target.observer(capture(lambda: Logger().info("hello {x}", x=1))[0])
    assert out.getvalue().endswith(" hello 1\n")


def test_a_json_target_reopens_its_file(tmp_path: Path) -> None:
    path = tmp_path / "n.log"
    target = LogTarget("json", str(path))
    log = Logger()
    target.observer(capture(lambda: log.info("one"))[0])
    os.rename(path, tmp_path / "n.log.1")
    target.observer(capture(lambda: log.info("two"))[0])
    target.reopen()
    target.observer(capture(lambda: log.info("three"))[0])
    old = [json.loads(line)["message"] for line in (tmp_path / "n.log.1").read_text().splitlines()]
    new = [json.loads(line)["message"] for line in path.read_text().splitlines()]
    assert (old, new) == (["one", "two"], ["three"])


# -- a real node -------------------------------------------------------------------------


def records(path: Path) -> List[Dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def test_a_real_node_logs_json_and_reopens_its_file_on_sighup(tmp_path: Path) -> None:
    port = freePort()
    log = tmp_path / "node.log"
    process = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
         "--pidfile=", "-l", str(log), "lockservice", "--listen",
         f"tcp:{port}:interface=127.0.0.1", "--log-format", "json"],
        env=twistdEnvironment(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        waitFor(lambda: ping(port), 15, what="node up")
        first = records(log)
        assert any(r["message"].startswith("LockFactory starting") for r in first)
        assert all(set(r) >= {"time", "level", "namespace", "event", "message"} for r in first)
        # logrotate's way: move the file away, then SIGHUP.
        os.rename(log, tmp_path / "node.log.1")
        process.send_signal(signal.SIGHUP)
        waitFor(lambda: any(r["event"] == "log_reopened" for r in records(log)), 10,
                what="a new log file")
        assert process.poll() is None, "SIGHUP ended the node"
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == -signal.SIGTERM
        after = records(log)
        assert any("shutting down" in r["message"] for r in after)
        assert not any("shutting down" in r["message"]
                       for r in records(tmp_path / "node.log.1"))
        assert process.stderr is not None and process.stderr.read() == b""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_sighup_without_a_file_does_not_end_the_node(tmp_path: Path, fmt: str) -> None:
    port = freePort()
    process = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
         "--pidfile=", "lockservice", "--listen", f"tcp:{port}:interface=127.0.0.1",
         "--log-format", fmt],
        env=twistdEnvironment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    try:
        waitFor(lambda: ping(port), 15, what="node up")
        process.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert process.poll() is None and ping(port)
        process.terminate()
        out = process.communicate(timeout=10)[0].decode()
        if fmt == "json":
            messages = [json.loads(line)["message"] for line in out.splitlines()]
            assert "SIGHUP: no log file to reopen" in messages
        else:
            assert "SIGHUP: no log file to reopen" in out and not out.startswith("{")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_cluster_events_have_names_and_fields(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """
    A three-node cluster in JSON: promotion, synchronisation, the loss of
    a peer, a handoff, and a handshake refused for a wrong secret are
    events with names and fields, not only text.
    """
    c = cluster(3, args=["--log-format", "json"], start=False)
    c.start()
    waitFor(lambda: any(r["event"] == "promoted" for r in records(Path(c.nodes[0].logPath()))),
            15, what="a promotion")
    waitFor(lambda: any(r["event"] == "synchronised"
                        for r in records(Path(c.nodes[2].logPath()))), 15, what="a sync")
    # A stranger with another secret knocks on node 0.
    wrong = tmp_path / "wrong"
    wrong.write_text("another-secret-entirely-0123456789\n")
    strangerPort = freePort()
    stranger = Node(strangerPort, peers=[c.ports[0], strangerPort],
                    args=["--secret", str(wrong), "--log-format", "json"],
                    logDir=str(tmp_path), name="stranger")
    c.nodes[1].kill()
    try:
        stranger.start(wait=False)
        log0 = Path(c.nodes[0].logPath())
        waitFor(lambda: any(r["event"] == "peer_lost" for r in records(log0)), 15,
                what="a lost peer")
        names = ("handshake_refused", "handshake_failed", "peer_secret_mismatch")
        waitFor(lambda: any(r["event"] in names for r in records(log0)), 15,
                what="a refused handshake")
        c.nodes[0].interrupt()
        byEvent: Dict[str, Dict[str, Any]] = {}
        for r in records(log0):
            byEvent.setdefault(r["event"], r)
        assert byEvent["promoted"]["term"] > 0 and "keys" in byEvent["promoted"]
        assert byEvent["peer_lost"]["peer"] == c.nodes[1].address
        assert byEvent["peer_up"]["peer"] in (c.nodes[1].address, c.nodes[2].address)
        assert byEvent["handed_off"]["peer"] == c.nodes[2].address
        refused = [r for r in records(log0) if r["event"] in names]
        assert refused[0]["why"] and refused[0]["source"].startswith("127.0.0.1")
        log2 = records(Path(c.nodes[2].logPath()))
        assert any(r["event"] == "took_over" and r["peer"] == c.nodes[0].address
                   for r in log2)
        assert {r["level"] for r in records(log0)} <= {"debug", "info", "warn", "error",
                                                       "critical"}
    finally:
        stranger.stop()


def test_a_failed_state_save_is_a_named_event(tmp_path: Path) -> None:
    from tests.support.protocol import Node as ProtocolNode
    from tests.support.state import brokenState

    node = ProtocolNode()
    state, _ = brokenState(node, tmp_path)
    events = capture(lambda: node.connect().ask(b"A k 30 0"))
    [failed] = [e for e in events if e.get("event") == "state_save_failed"]
    assert failed["log_level"] == LogLevel.error
    assert jsonRecord(failed)["why"] == "No space left on device"
    assert jsonRecord(failed)["file"] == state.directory.file
