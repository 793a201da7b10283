# -*- test-case-name: tests.test_cli -*-
"""
C{lockservice config check|show} and C{lockservice state ...}: tools for a
node's configuration file and state directory, nothing started.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from lockservice.cli.errors import EX_OK, fail


def configCommand(args: argparse.Namespace) -> int:
    """
    C{lockservice config check FILE} and C{config show FILE}.
    """
    from lockservice import config

    try:
        if args.config_command == "check":
            config.parseFile(args.file, "lockservice config check")
            return EX_OK
        print(config.show(args.file))
    except SystemExit as e:  # the one line is written
        return int(e.code or 0)
    return EX_OK


def stateCommand(args: argparse.Namespace) -> int:
    """
    C{lockservice state inspect | backup | restore}.
    """
    from lockservice import statetools

    try:
        if args.state_command == "inspect":
            info = statetools.inspect(args.directory)
            print(json.dumps(info, indent=2) if args.json
                  else statetools.formatInspection(info))
            return EX_OK if info.get("error") is None else statetools.EX_FAILED
        if args.state_command == "backup":
            done = statetools.backup(args.directory, args.file)
            print(f"backed up {args.directory} to {done['file']} (token mark "
                  f"{done['token_mark']}, {done['saved_locks']} saved locks)")
            return EX_OK
        identity = None
        if args.config:
            from lockservice import config
            from lockservice.state import clusterIdentity

            options = config.parseFile(args.config, f"lockservice state {args.state_command}")
            identity = (clusterIdentity(options["secretBytes"], options["peerList"]),
                        options["self"] or "")
        if args.state_command == "adopt":
            assert identity is not None
            done = statetools.adopt(args.directory, *identity)
            print(f"{done['file']} now belongs to "
                  f"{done['node'] or 'this lone node'} of the configuration "
                  f"({'changed' if done['changed'] else 'it did already'}; token mark "
                  f"{done['token_mark']}, {done['saved_locks']} saved locks)")
            return EX_OK
        done = statetools.restore(args.file, args.directory, force=args.force,
                                  identity=identity)
        print(f"restored {args.file} to {done['file']} (token mark {done['token_mark']}, "
              f"{done['saved_locks']} saved locks): start the node")
        return EX_OK
    except statetools.ToolError as e:
        return fail(str(e), e.status)
    except SystemExit as e:
        return int(e.code or 0)
