"""
The chaos suite: a short run exactly as a user runs it (real cluster,
real faults, every checker must report 0), and the checkers themselves,
each fed a history that must pass and one that must fail.  Only the run
is marked C{chaos}: C{-m "not chaos"} still runs the checkers' tests.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

import pytest

from lockservice.testing import netns
from lockservice.testing.harness import twistdEnvironment
from lockservice.verify.history import (
    Access,
    AcquireRecord,
    Fault,
    FencedResource,
    History,
    Section,
    checkAbandoned,
    checkAbandonedWaiters,
    checkAcquires,
    checkFence,
    checkOverlaps,
    checkTokens,
)

DURATION = os.environ.get("LOCKSERVICE_CHAOS_DURATION", "90")


@pytest.mark.chaos
def test_short_chaos_run_passes_every_checker() -> None:
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "lockservice-chaos-*")))
    result = subprocess.run(
        [sys.executable, "-m", "lockservice.chaos", "--duration", DURATION, "--seed", "7"],
        capture_output=True, timeout=float(DURATION) + 240, env=twistdEnvironment(),
    )
    report = result.stdout.decode()
    assert result.returncode == 0, report + result.stderr.decode()[-3000:]
    assert "RESULT: PASS" in report
    kinds = ["kill9-active", "sigstop-active", "sigint-active", "kill9-client",
             "proxy-cut", "proxy-stall"]
    if netns.unavailable() is None:
        kinds += ["peer-cut", "client-cut", "asym-cut", "peer-reset", "oneway-kill"]
    else:
        assert "network faults skipped:" in report
    for kind in kinds:
        assert kind in report
    # A passing run leaves nothing behind in /tmp.
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "lockservice-chaos-*")))
    assert after <= before


def test_fence_checker_judges_what_the_resource_accepted() -> None:
    h = History()
    h.accesses = [Access("k", 5, 1.0, True), Access("k", 5, 1.5, True),
                  Access("k", 9, 2.0, True), Access("k", 6, 4.0, False)]
    assert checkFence(h) == 0
    # A lower token accepted after a higher one.
    h.accesses.append(Access("k", 7, 3.0, True))
    assert checkFence(h) >= 1
    # Keys are judged apart.
    h.accesses = [Access("k", 5, 1.0, True), Access("j", 1, 2.0, True),
                  Access("k", 9, 2.5, True), Access("j", 2, 3.0, True)]
    assert checkFence(h) == 0


def test_fence_checker_catches_a_broken_guard() -> None:
    """
    A resource whose guard admits everything (a broken fence): the checker
    must see the late writer that the guard let in.
    """
    h = History()
    resource = FencedResource(h)

    class Gullible:
        def admit(self, key: str, token: int) -> None:
            pass

    resource.guard = Gullible()  # type: ignore[assignment]
    resource.write("k", 10)  # holder A enters
    resource.write("k", 11)  # B was granted after A's lease ran out
    resource.write("k", 10)  # A, late, writes again: must be refused
    assert checkFence(h) >= 1
    # The real guard refuses that write, and the checker agrees.
    h = History()
    resource = FencedResource(h)
    for token in (10, 11, 10):
        resource.write("k", token)
    assert [a.accepted for a in h.accesses] == [True, True, False]
    assert checkFence(h) == 0


def test_overlap_of_accepted_sections_is_a_fence_violation() -> None:
    h = History()
    h.accesses = [Access("k", 5, 1.0, True), Access("k", 6, 2.0, True),
                  Access("k", 6, 2.5, True)]
    assert checkFence(h) == 0
    h.accesses.append(Access("k", 5, 2.2, True))  # A's second write inside B's section
    assert checkFence(h) >= 1


def test_token_checker() -> None:
    h = History()
    h.acquires = [
        AcquireRecord("a", "k", 4, 0.0, 1.0, "granted", 100),
        AcquireRecord("c", "k", 4, 0.5, 0.9, "granted", 80),   # concurrent with a: fine
        AcquireRecord("b", "k", 4, 2.0, 3.0, "granted", 190),
    ]
    assert checkTokens(h) == 0
    h.acquires += [
        AcquireRecord("d", "k", 4, 4.0, 4.5, "granted", 150),  # later, lower
        AcquireRecord("e", "k", 4, 5.0, 5.5, "granted", 190),  # reused token
    ]
    assert checkTokens(h) == 3


def test_acquire_checker() -> None:
    h = History()
    h.acquires = [AcquireRecord("a", "k", 4, 0.0, 1.0, "granted", 1),
                  AcquireRecord("f", "k", 4, 5.0, 9.9, "timeout", None)]
    assert checkAcquires(h) == (0, 0)
    h.acquires += [AcquireRecord("e", "k", 4, 5.0, None, None, None),   # never ended
                   AcquireRecord("f", "k", 4, 5.0, 10.5, "timeout", None)]  # late
    assert checkAcquires(h) == (1, 1)


def test_overlap_checker() -> None:
    h = History()
    h.sections = [Section("a", "k", 1, 0.0, 1.0), Section("b", "k", 2, 1.0, 1.5)]
    assert checkOverlaps(h) == (0, 0)
    h.sections += [Section("c", "k", 3, 5.0, 6.0), Section("d", "k", 4, 5.5, 5.7),
                   Section("e", "j", 5, 0.5, 0.6), Section("f", "j", 6, 0.55, 0.9)]
    h.faults = [Fault("kill9-active", 0.2, 2.0), Fault("proxy-cut", 4.0)]
    assert checkOverlaps(h) == (2, 1)


def test_abandoned_checkers() -> None:
    h = History()
    h.abandoned = [(0.0, 3.0, 3.2)]
    h.abandonedWaiters = [(10.0, 10.05)]
    assert checkAbandoned(h) == 0 and checkAbandonedWaiters(h) == 0
    h.abandoned += [(0.0, 3.0, 3.4), (0.0, 3.0, None)]
    h.abandonedWaiters += [(10.0, 13.0), (10.0, None)]
    assert checkAbandoned(h) == 2 and checkAbandonedWaiters(h) == 2
