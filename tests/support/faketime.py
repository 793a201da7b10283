"""
libfaketime for the tests that step a node's clock.
"""

from __future__ import annotations

import glob
import os
import subprocess
from typing import Optional

import pytest


def requireFaketime() -> str:
    """
    The library, or skip, except in CI where a missing libfaketime fails.
    """
    if FAKETIME_LIB is None:
        if os.environ.get("CI") == "true":
            pytest.fail("libfaketime is missing (apt-get install faketime); CI must run "
                        "the wall-clock-step test")
        pytest.skip("needs libfaketime (apt-get install faketime)")
    return FAKETIME_LIB



def findLibfaketime() -> Optional[str]:
    """
    libfaketime wherever it is installed (Debian multiarch, RPM, /usr/local,
    or C{$LOCKSERVICE_FAKETIME_LIB}).
    """
    explicit = os.environ.get("LOCKSERVICE_FAKETIME_LIB")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    patterns = [
        "/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
        "/usr/lib64/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/libfaketime.so.1", "/usr/lib*/libfaketime.so.1",
    ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        if "libfaketime.so.1" in line and "=>" in line:
            return line.split("=>")[1].strip()
    return None


FAKETIME_LIB = findLibfaketime()
