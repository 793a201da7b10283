"""
The lockservice command run as a process.
"""

from __future__ import annotations

import subprocess
import sys

from lockservice.testing.harness import twistdEnvironment


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(
        [sys.executable, "-m", "lockservice.cli", *args],
        capture_output=True, timeout=timeout, env=twistdEnvironment(),
    )
