# -*- test-case-name: tests.cli.test_cli -*-
"""
The command line: C{lockservice COMMAND ...} and the checks of its
arguments (one line and exit status 2 for a bad one).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from lockservice.cli.errors import EX_LOST, EX_USAGE, EXIT_STATUSES
from lockservice.cli.httpcommands import DEFAULT_STATUS_URL
from lockservice.cli.lockcommands import DEFAULT_ADDR, DEFAULT_GRACE


def seconds(text: str) -> float:
    from lockservice.core.wire import checkSeconds

    try:
        return checkSeconds(text, "seconds", positive=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positiveSeconds(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text!r}")
    return value


def _token(text: str) -> int:
    if not text.isdigit() or not text.isascii() or int(text) >= 2**64:
        raise argparse.ArgumentTypeError(f"not a token: {text!r}")
    return int(text)


def _slots(text: str) -> Optional[int]:
    """
    C{--slots N}: the semaphore's slot count, 1-65535; 1 is the exclusive
    lock, so it gives C{None} (no share field on the wire).
    """
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of slots from 1 to 65535, not {text!r}")
    return None if int(text) == 1 else int(text)


def _sequence(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"not an event sequence number: {text!r}")
    return int(text)


def keyArgument(text: str) -> str:
    from lockservice.core.wire import isValidKey

    if not isValidKey(text.encode("utf-8", "surrogateescape")):
        raise argparse.ArgumentTypeError(
            f"invalid key {text!r}: 1-250 bytes of UTF-8, no spaces or control characters")
    return text


class _Parser(argparse.ArgumentParser):
    """
    argparse, with errors as one line (plus the usage) and exit status 2.
    """

    def error(self, message: str) -> Any:
        print(f"lockservice: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EX_USAGE)


def _epilog() -> str:
    lines = ["exit statuses:"]
    lines += [f"  {code:>3}  {meaning}" for code, meaning in sorted(EXIT_STATUSES.items())]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    from lockservice import __version__

    p = _Parser(prog="lockservice", description="lockservice command-line client",
                epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lockservice {__version__}")
    p.add_argument("--reactor", metavar="NAME", default=os.environ.get("LOCKSERVICE_REACTOR"),
                   help="Twisted reactor to run on, e.g. asyncio (default: Twisted's "
                        "default; or $LOCKSERVICE_REACTOR)")
    sub = p.add_subparsers(dest="command_name", metavar="COMMAND", parser_class=_Parser)

    st = sub.add_parser("status", help="show a node's (and its cluster's) status")
    st.add_argument("url", nargs="?", default=DEFAULT_STATUS_URL,
                    help=f"the node's --http address (default $LOCKSERVICE_URL or "
                         f"{DEFAULT_STATUS_URL})")
    st.add_argument("--json", action="store_true", help="print the raw JSON")

    def connection(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--addr", default=DEFAULT_ADDR,
                        help=f"node addresses host:port,... ; ';' between clusters "
                             f"(default $LOCKSERVICE_ADDR or {DEFAULT_ADDR})")
        sp.add_argument("--cluster", action="append", metavar="HOST:PORT,...",
                        help="one cluster's addresses; repeat for several clusters "
                             "(keys are spread over them by rendezvous hashing)")
        sp.add_argument("--name", type=keyArgument, default=None,
                        help="name of this client on the node (default host:pid:lockservice-cli)")
        sp.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, verifying the "
                        "node's certificate against this CA (PEM)")
        sp.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM), for "
                        "nodes that require one")
        sp.add_argument("--tls-key", metavar="FILE", help="the client certificate's key (PEM)")

    def lockArgs(sp: argparse.ArgumentParser, leaseDefault: float) -> None:
        sp.add_argument("key", type=keyArgument)
        sp.add_argument("--lease", type=positiveSeconds, default=leaseDefault,
                        help=f"lease in seconds (default {leaseDefault:g})")
        sp.add_argument("--wait", type=seconds, default=0,
                        help="seconds to wait for the lock (default 0: no limit)")
        kind = sp.add_mutually_exclusive_group()
        kind.add_argument("--read", dest="share", action="store_const", const="r",
                          help="a read lock: shared with other readers, exclusive of "
                               "writers (a plain acquire is the writer)")
        kind.add_argument("--slots", dest="share", type=_slots, metavar="N",
                          help="a semaphore of N slots (2-65535): at most N holders at "
                               "once; 1 is the plain exclusive lock")
        connection(sp)

    ac = sub.add_parser("acquire", help="acquire KEY and print its fencing token")
    lockArgs(ac, 30)

    rl = sub.add_parser(
        "release", help="release KEY held with TOKEN (or --force it over HTTP)",
        description="release KEY TOKEN: give a lock back.  release --force KEY --reason "
                    "TEXT: an operator takes KEY from its holder (the next waiter gets it "
                    "with a new token), through the node's --http endpoint and admin secret.")
    rl.add_argument("key", type=keyArgument)
    rl.add_argument("token", type=_token, nargs="?")
    rl.add_argument("--force", action="store_true",
                    help="force-release KEY whoever holds it (needs --reason, "
                         "--admin-secret; uses --http)")
    rl.add_argument("--reason", help="why (recorded in the node's events)")
    rl.add_argument("--http", default=DEFAULT_STATUS_URL,
                    help=f"the node's HTTP endpoint for --force (default $LOCKSERVICE_URL "
                         f"or {DEFAULT_STATUS_URL})")
    rl.add_argument("--admin-secret", metavar="FILE", help="file holding the admin secret")
    rl.add_argument("--json", action="store_true", help="--force: print the raw JSON answer")
    connection(rl)

    rn = sub.add_parser(
        "run", help="run a command while holding KEY (renewed while it runs)",
        description="Acquire KEY, run CMD with LOCKSERVICE_KEY and LOCKSERVICE_TOKEN set, "
                    "renew the lock every third of --lease while CMD runs, release it when "
                    "CMD ends and exit with CMD's status.  If the lock is lost, CMD gets "
                    f"SIGTERM (SIGKILL after --grace) and the exit status is {EX_LOST}.")
    lockArgs(rn, 60)
    rn.add_argument("--grace", type=seconds, default=DEFAULT_GRACE,
                    help=f"seconds between SIGTERM and SIGKILL when the lock is lost "
                         f"(default {DEFAULT_GRACE:g})")
    rn.add_argument("command", nargs="*", help="-- CMD ARGS... (after a literal --)")

    wt = sub.add_parser(
        "watch", help="print who holds KEY now, then each change (Ctrl+C ends)",
        description="Print KEY's state now (its newest live grant's token and holder name, "
                    "or free), then one line at each change: grant, release, expiry, "
                    "hand-over, force-release.  Follows failovers.  Ctrl+C exits 0.")
    wt.add_argument("key", type=keyArgument)
    wt.add_argument("--json", action="store_true",
                    help="one JSON object per line: time, key, token (0: free), holder")
    connection(wt)

    el = sub.add_parser(
        "elect", help="run a command while this process leads ELECTION",
        description="Campaign in ELECTION with VALUE; once this process leads, run CMD with "
                    "LOCKSERVICE_ELECTION, LOCKSERVICE_VALUE and LOCKSERVICE_TOKEN (the "
                    "leadership's fencing token) set, and resign when CMD ends, exiting with "
                    "CMD's status.  If the leadership is lost, CMD gets SIGTERM (SIGKILL "
                    f"after --grace) and the exit status is {EX_LOST}.")
    el.add_argument("election", type=keyArgument)
    el.add_argument("value", help="what this candidate is (its name, address...): shown "
                                  "to everyone as the leader's value")
    el.add_argument("--lease", type=positiveSeconds, default=10.0,
                    help="the leadership's lease in seconds, renewed every third "
                         "(default 10)")
    el.add_argument("--wait", type=seconds, default=0,
                    help="seconds to wait for the leadership (default 0: no limit)")
    el.add_argument("--grace", type=seconds, default=DEFAULT_GRACE,
                    help=f"seconds between SIGTERM and SIGKILL when the leadership is lost "
                         f"(default {DEFAULT_GRACE:g})")
    el.add_argument("command", nargs="*", help="-- CMD ARGS... (after a literal --)")
    connection(el)

    sh = sub.add_parser("shell", help="type requests to a node and see its answers",
                        description="An interactive line session with one node (plain TCP "
                                    "or TLS): type A/R/N/P/I requests, see the answers.")
    sh.add_argument("target", nargs="?", metavar="HOST:PORT",
                    help=f"the node (default $LOCKSERVICE_ADDR or {DEFAULT_ADDR})")
    connection(sh)

    ev = sub.add_parser("events", help="show a node's recent lock events")
    ev.add_argument("key", nargs="?", type=keyArgument, help="only this key's events")
    ev.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    ev.add_argument("--since", type=_sequence, default=0, help="only events after this seq")
    ev.add_argument("--http", default=DEFAULT_STATUS_URL,
                    help=f"the node's HTTP endpoint (default $LOCKSERVICE_URL or "
                         f"{DEFAULT_STATUS_URL})")
    ev.add_argument("--interval", type=positiveSeconds, default=1.0,
                    help="seconds between polls with --follow (default 1)")
    ev.add_argument("--json", action="store_true", help="one JSON object per line")

    sub.add_parser("bench", help="load generator (python -m lockservice.bench --help)",
                   add_help=False)

    cf = sub.add_parser("config", help="check or show a node's TOML configuration file",
                        description="The node's --config FILE (TOML), read and checked "
                                    "exactly as twistd lockservice --config FILE does, "
                                    "nothing started.")
    cfSub = cf.add_subparsers(dest="config_command", metavar="ACTION", parser_class=_Parser)
    cfSub.required = True
    cc = cfSub.add_parser("check", help="exit 0 and print nothing if FILE is good; else "
                                        "one line and exit 2")
    cc.add_argument("file", metavar="FILE")
    cs = cfSub.add_parser("show", help="print the effective settings of FILE (the file's "
                                       "values and every default; paths, never contents)")
    cs.add_argument("file", metavar="FILE")

    sd = sub.add_parser("state", help="inspect, back up or restore a node's --state-dir",
                        description="Tools for the directory of --state-dir DIR.")
    sdSub = sd.add_subparsers(dest="state_command", metavar="ACTION", parser_class=_Parser)
    sdSub.required = True
    si = sdSub.add_parser("inspect", help="what DIR holds: format, node, token mark, the "
                                          "saved locks and their remaining leases as of now")
    si.add_argument("directory", metavar="DIR")
    si.add_argument("--json", action="store_true", help="print JSON")
    sb = sdSub.add_parser("backup", help="copy DIR's state file to FILE, checked (safe while "
                                         "the node runs)")
    sb.add_argument("directory", metavar="DIR")
    sb.add_argument("file", metavar="FILE")
    sr = sdSub.add_parser("restore", help="put backup FILE in DIR for the next start (DIR's "
                                          "node must be stopped)")
    sr.add_argument("file", metavar="FILE")
    sr.add_argument("directory", metavar="DIR")
    sr.add_argument("--force", action="store_true", help="replace a state file already in DIR")
    sr.add_argument("--config", metavar="TOML",
                    help="the node's configuration file: refuse a backup of another "
                         "node or cluster")
    sa = sdSub.add_parser("adopt", help="make DIR's state file the node's of --config "
                                        "(after its secret or peer list changed; DIR's "
                                        "node must be stopped)")
    sa.add_argument("directory", metavar="DIR")
    sa.add_argument("--config", metavar="TOML", required=True,
                    help="the node's configuration file (its secret, peers and node)")
    return p
