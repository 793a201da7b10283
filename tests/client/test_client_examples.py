"""
The examples of docs/client.md run against a real node, as a user would
run them (subprocesses: no reactor of this test process involved).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from lockservice.testing.harness import LineClient, twistdEnvironment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=120, env=twistdEnvironment())


def test_cron_script_fences_its_write_and_skips_when_the_lock_is_held(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    db = str(tmp_path / "report.db")
    out = run("cron_fenced.py", node.address, db)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("written: built under token ")
    token = int(out.stdout.split()[-1])
    row = sqlite3.connect(db).execute("SELECT value, last_token FROM report").fetchone()
    assert row == (f"built under token {token}", token)
    # Another run while someone holds the lock: it skips, and writes nothing.
    with LineClient(node.port) as c:
        assert c.ask(b"A reports/nightly 30 0").startswith(b"A reports/nightly ")
        out = run("cron_fenced.py", node.address, db)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "another run holds the lock: skipping this run"
    assert sqlite3.connect(db).execute("SELECT last_token FROM report").fetchone() == (token,)


def test_asyncio_example(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    out = run("aio_fenced.py", node.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "counter = 50 (expected 50)"


def test_threads_example(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    out = run("sync_threads.py", node.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "counter = 80 (expected 80)"
