# -*- test-case-name: tests.cli.test_cli -*-
"""
C{lockservice config check|show} and C{lockservice state ...}: tools for a
node's configuration file and state directory, nothing started.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lockservice.cli.errors import EX_OK, fail
from lockservice.config import settings


def parseFile(path: str, prog: str) -> Any:
    """
    The node's options as C{twistd lockservice --config path} would have
    them, nothing started; a bad file ends the process (one line, exit 2).
    """
    from lockservice.tap import Options

    options = Options()
    options.prog = prog
    options.parseOptions(["--config", path])
    return options


def tomlValue(value: Any) -> str:
    """
    C{value} written as TOML.
    """
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(tomlValue(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def show(path: str) -> str:
    """
    The effective settings of the file C{path}: every key, the file's
    value or the default, as TOML (file paths only: a secret's content is
    never shown).
    """
    options = parseFile(path, "lockservice config show")
    lines = [f"# effective settings of {path}: its own values, and the defaults "
             f"(marked) of the others"]
    for warning in options.get("warnings", []):
        lines.append(f"# warning: {warning}")
    for name, setting in settings(type(options)).items():
        value = options[name]
        if name == "peers" and value:
            value = options["peerList"]
        mark = "" if name in options.fromFile else "  # default"
        if name == "listen" and name not in options.fromFile:
            mark = "  # default (from node, or tcp:7700)"
        if setting.kind == "flag" and not value:
            value = False
        if value is None:
            lines.append(f"# {name} = (not set){'' if mark else '  # set empty'}")
        else:
            lines.append(f"{name} = {tomlValue(value)}{mark}")
    return "\n".join(lines)


def configCommand(args: argparse.Namespace) -> int:
    """
    C{lockservice config check FILE} and C{config show FILE}.
    """
    try:
        if args.config_command == "check":
            parseFile(args.file, "lockservice config check")
            return EX_OK
        print(show(args.file))
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
            from lockservice.state import clusterIdentity

            options = parseFile(args.config, f"lockservice state {args.state_command}")
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
