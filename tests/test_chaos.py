"""
A short run of the chaos suite, exactly as a user runs it: real cluster,
real faults, every checker must report 0.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lockservice.testing.harness import twistdEnvironment

pytestmark = pytest.mark.chaos

DURATION = os.environ.get("LOCKSERVICE_CHAOS_DURATION", "60")


def test_short_chaos_run_passes_every_checker() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lockservice.chaos", "--duration", DURATION, "--seed", "7"],
        capture_output=True, timeout=float(DURATION) + 150, env=twistdEnvironment(),
    )
    report = result.stdout.decode()
    assert result.returncode == 0, report + result.stderr.decode()[-3000:]
    assert "RESULT: PASS" in report
    for kind in ["kill9-active", "sigstop-active", "sigint-active", "kill9-client",
                 "proxy-cut", "proxy-stall"]:
        assert kind in report


def test_checkers_count_what_they_should() -> None:
    from lockservice.verify.chaos import (
        Access,
        AcquireRecord,
        Fault,
        History,
        Section,
        checkAbandoned,
        checkAcquires,
        checkFence,
        checkOverlaps,
        checkTokens,
    )

    h = History()
    h.accesses = [Access("k", 5, 1.0, True), Access("k", 9, 2.0, True),
                  Access("k", 7, 3.0, True), Access("k", 6, 4.0, False)]
    assert checkFence(h) == 1
    h.acquires = [
        AcquireRecord("a", "k", 4, 0.0, 1.0, "granted", 100),
        AcquireRecord("b", "k", 4, 2.0, 3.0, "granted", 90),   # later, lower: violation
        AcquireRecord("c", "k", 4, 0.5, 0.9, "granted", 80),   # concurrent with a: fine
        AcquireRecord("d", "k", 4, 4.0, 4.5, "granted", 100),  # reused token
        AcquireRecord("e", "k", 4, 5.0, None, None, None),     # never ended
        AcquireRecord("f", "k", 4, 5.0, 10.5, "timeout", None),  # late
    ]
    assert checkTokens(h) == 3
    assert checkAcquires(h) == (1, 1)
    h.sections = [Section("a", "k", 1, 0.0, 1.0), Section("b", "k", 2, 0.5, 1.5),
                  Section("c", "k", 3, 5.0, 6.0), Section("d", "k", 4, 5.5, 5.7)]
    h.faults = [Fault("kill9-active", 0.2, 2.0), Fault("proxy-cut", 4.0)]
    assert checkOverlaps(h) == (2, 1)
    h.abandoned = [(0.0, 3.0, 3.2), (0.0, 3.0, 3.4), (0.0, 3.0, None)]
    assert checkAbandoned(h) == 2
