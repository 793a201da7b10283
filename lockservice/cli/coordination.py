# -*- test-case-name: tests.cli.test_cli_coordination -*-
"""
C{lockservice watch KEY}: who holds a key now, then each change, one line
each.  C{lockservice elect ELECTION VALUE -- CMD ...}: run a command while
this process leads an election (the election recipe of docs/elections.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any, Dict

from lockservice.cli.errors import (
    EX_OK,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    CommandError,
)
from lockservice.cli.lockcommands import connected, runWhileHeld

# The exit status of a command interrupted (Ctrl+C) before it started
# its work: 128 + SIGINT, as a shell reports it.
EX_INTERRUPTED = 128 + signal.SIGINT


def describeState(key: str, token: int, holder: Any, asJSON: bool) -> str:
    """
    One line for a key's state: its newest live grant's token and holder
    name, or free (token 0).
    """
    now = time.time()
    if asJSON:
        return json.dumps({"time": round(now, 3), "key": key, "token": token,
                           "holder": holder})
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    if not token:
        return f"{when} {key} free"
    return f"{when} {key} token={token} holder={holder or '-'}"


async def watchCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    Print the key's state now and at each change (grant, release, expiry,
    hand-over, force-release), following failovers, until Ctrl+C (exit 0).
    """
    from twisted.internet.defer import Deferred

    from lockservice.client.errors import LockRejected
    from lockservice.client.observing import Observed, Watch

    client = await connected(reactor, args)
    finished: "Deferred[int]" = Deferred()

    def finish(status: int) -> None:
        if not finished.called:
            finished.callback(status)

    def told(state: Observed) -> None:
        try:
            print(describeState(args.key, state.token, state.holder, args.json), flush=True)
        except BrokenPipeError:  # | head: the reader has what it wanted
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            finish(EX_OK)

    def failed(error: Exception) -> None:
        if isinstance(error, LockRejected):
            print(f"lockservice: rejected: {error.message}", file=sys.stderr, flush=True)
            finish(EX_USAGE)
        else:
            print(f"lockservice: {error}; watching again", file=sys.stderr, flush=True)

    watch = Watch(lambda token, wait: client.observe(args.key, token, wait), told,
                  reactor, failed).start()
    previous = {s: signal.signal(s, lambda *a: reactor.callFromThread(finish, EX_OK))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return await finished
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        watch.stop()
        await client.close()


async def electCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    Campaign with VALUE; once this process leads, run CMD with
    LOCKSERVICE_ELECTION, LOCKSERVICE_VALUE and LOCKSERVICE_TOKEN (the
    leadership's fencing token) set; resign when CMD ends and exit with its
    status.  If the leadership is lost, CMD's process group is stopped and
    the status is 74.  Ctrl+C before this process leads withdraws the
    campaign.
    """
    from twisted.internet.defer import CancelledError

    from lockservice.client.errors import LockRejected, LockTimeout, NoConnection

    client = await connected(reactor, args)
    try:
        campaign = client.campaign(args.election, args.value, args.lease, args.wait)
        previous = {s: signal.signal(s, lambda *a: reactor.callFromThread(campaign.cancel))
                    for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            leadership = await campaign
        except CancelledError:
            print("lockservice: interrupted before leading; campaign withdrawn",
                  file=sys.stderr)
            return EX_INTERRUPTED
        except LockTimeout:
            raise CommandError(f"not leading {args.election!r} within {args.wait:g} s",
                               EX_TEMPFAIL) from None
        except LockRejected as e:
            raise CommandError(f"rejected: {e.message}", EX_USAGE) from None
        except NoConnection as e:
            raise CommandError(str(e), EX_UNAVAILABLE) from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        env: Dict[str, str] = dict(os.environ, LOCKSERVICE_ELECTION=args.election,
                                   LOCKSERVICE_VALUE=args.value,
                                   LOCKSERVICE_TOKEN=str(leadership.token))
        return await runWhileHeld(reactor, args.command, env, leadership.lost,
                                  leadership.resign, args.grace, "the leadership")
    finally:
        await client.close()
