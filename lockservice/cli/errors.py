# -*- test-case-name: tests.cli.test_cli -*-
"""
The exit statuses of the C{lockservice} command, and the error that ends
a command with one line and one of them.
"""

from __future__ import annotations

import sys

EX_OK = 0


EX_STALE = 1  # release answered STALE; release --force: the key was not held


EX_USAGE = 2


EX_NOT_ACTIVE = 3  # release --force sent to a standby (HTTP 409)


EX_UNAVAILABLE = 69


EX_LOST = 74


EX_TEMPFAIL = 75


EX_NOPERM = 77


EXIT_STATUSES = {
    EX_OK: "success (for run: CMD's own status is returned instead)",
    EX_STALE: "release answered STALE; release --force: the key was not held",
    EX_USAGE: "bad arguments (help printed when there are none), or the server "
              "rejected the request (E)",
    EX_NOT_ACTIVE: "release --force: that node is a standby (HTTP 409); "
                   "send it to the active's HTTP endpoint",
    EX_UNAVAILABLE: "no node (or HTTP endpoint) reachable, or it does not speak what "
                    "was expected (the lock port given for --http, or the reverse)",
    EX_LOST: "run, elect: the lock (the leadership) was lost while CMD ran; CMD was stopped",
    EX_TEMPFAIL: "the wait ran out without a grant (acquire, run, elect)",
    126: "run: CMD was found but could not be run",
    127: "run: CMD was not found",
    EX_NOPERM: "release --force refused: wrong admin secret, or none configured",
}


class CommandError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def fail(message: str, status: int) -> int:
    print(f"lockservice: {message}", file=sys.stderr)
    return status
