# -*- test-case-name: tests.cli.test_cli -*-
"""
The C{lockservice} command.

    lockservice status [URL]
    lockservice acquire KEY [--lease S] [--wait S] [--read | --slots N] [connection options]
    lockservice release KEY TOKEN [connection options]
    lockservice release --force KEY --reason TEXT [--http URL] --admin-secret FILE
    lockservice run KEY [--lease S] [--wait S] [--read | --slots N] [--grace S]
                    [connection options] -- CMD ARGS...
    lockservice watch KEY [--json] [connection options]
    lockservice elect ELECTION VALUE [--lease S] [--wait S] [--grace S]
                      [connection options] -- CMD ARGS...
    lockservice shell [HOST:PORT] [--tls-ca FILE ...]
    lockservice events [KEY] [--follow] [--http URL]
    lockservice bench ...            (see python -m lockservice.bench --help)
    lockservice config check FILE | config show FILE
    lockservice state inspect DIR [--json] | state backup DIR FILE
    lockservice state restore FILE DIR [--force] [--config FILE]
    lockservice state adopt DIR --config FILE

Connection options: C{--addr host:port,...} (C{;} between clusters),
C{--cluster host:port,...} (repeated: one per cluster), C{--name NAME},
C{--tls-ca FILE [--tls-cert FILE --tls-key FILE]}.

Exit status: see L{EXIT_STATUSES} (and docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional

from lockservice.cli.coordination import electCommand, watchCommand
from lockservice.cli.errors import EX_OK, EX_USAGE, CommandError, fail
from lockservice.cli.httpcommands import (
    eventsCommand,
    fetchStatus,
    forceReleaseCommand,
    formatStatus,
)
from lockservice.cli.lockcommands import (
    acquireCommand,
    clientTLS,
    clustersOf,
    releaseCommand,
    runCommand,
    shellCommand,
)
from lockservice.cli.nodetools import configCommand, stateCommand
from lockservice.cli.parsing import parser


def _restoreSIGINT() -> None:
    """
    Make Ctrl+C work even when SIGINT was inherited as ignored (a command
    started with C{&} from a script): Python, and Twisted after it, leave
    an ignored SIGINT ignored, and C{events --follow} or a long wait would
    then never stop on it.  (The node does the same, see L{lockservice.tap}.)
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _restoreSIGINT()
    if argv[:1] == ["bench"]:
        from lockservice import bench

        return bench.main(argv[1:])
    if not argv:
        parser().print_help()
        return EX_USAGE
    command: List[str] = []
    if "--" in argv and {"run", "elect"} & set(argv[:argv.index("--")]):
        # Everything after "--" belongs to CMD, options included.
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return _dispatch(args, command)
    except CommandError as e:
        return fail(str(e), e.status)
    except BrokenPipeError:
        # Output piped into a reader that stopped (| head): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EX_OK


def _dispatch(args: argparse.Namespace, command: List[str]) -> int:
    name = args.command_name
    if name is None:
        parser().print_help()
        return EX_USAGE
    if name == "status":
        data = fetchStatus(args.url)
        print(json.dumps(data, indent=2) if args.json else formatStatus(data))
        return EX_OK
    if name == "events":
        return eventsCommand(args)
    if name == "config":
        return configCommand(args)
    if name == "state":
        return stateCommand(args)
    if name == "release":
        if args.force:
            if args.token is not None:
                raise CommandError("release --force takes a KEY, not a token", EX_USAGE)
            return forceReleaseCommand(args)
        if args.token is None:
            raise CommandError("release needs KEY TOKEN (or --force KEY --reason TEXT)",
                               EX_USAGE)
    if name in ("run", "elect"):
        args.command = args.command + command
        if not args.command:
            raise CommandError(f"{name} needs a command after --", EX_USAGE)
    if name == "elect":
        from lockservice.client.arguments import INSTANCE_HEX
        from lockservice.client.election import campaignName

        try:
            campaignName(args.value, "0" * INSTANCE_HEX)
        except ValueError as e:
            raise CommandError(str(e), EX_USAGE) from None
    if name == "shell" and args.target:
        args.addr = args.target
    # Validate what can be validated before starting a reactor.
    clustersOf(args)
    clientTLS(args)
    return _react({"acquire": acquireCommand, "release": releaseCommand,
                   "run": runCommand, "shell": shellCommand, "watch": watchCommand,
                   "elect": electCommand}[name], args)


def _installReactor(name: Optional[str]) -> None:
    if not name:
        return
    from twisted.application.reactors import NoSuchReactor, installReactor

    try:
        installReactor(name)
    except NoSuchReactor:
        raise CommandError(f"no such reactor: {name!r} (try asyncio, epoll, poll, select)",
                           EX_USAGE) from None


def _react(handler: Any, args: argparse.Namespace) -> int:
    _installReactor(args.reactor)
    from twisted.internet.defer import Deferred
    from twisted.internet.task import react

    result: Dict[str, int] = {}

    async def body(reactor: Any) -> None:
        try:
            result["status"] = await handler(reactor, args)
        except CommandError as e:
            result["status"] = fail(str(e), e.status)

    try:
        react(lambda reactor: Deferred.fromCoroutine(body(reactor)))
    except SystemExit:
        pass
    return result.get("status", 1)
