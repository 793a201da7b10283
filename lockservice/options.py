# -*- test-case-name: tests.process.test_tap -*-
"""
C{twistd lockservice}'s options: the command line (and C{--config FILE}),
checked before anything starts; a bad value is one line and exit 2.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, Dict, List, NoReturn, Optional

from twisted.internet.endpoints import serverFromString
from twisted.python import usage

from lockservice.core.wire import checkSeconds
from lockservice.server.observing import DEFAULT_MAX_OBSERVERS
from lockservice.server.protocol import DEFAULT_MAX_CONNECTIONS
from lockservice.server.service import DEFAULT_MAX_KEYS, DEFAULT_MAX_WAITERS
from lockservice.tls import NodeTLS

if TYPE_CHECKING:
    pass


DEFAULT_PORT = 7700


MIN_SECRET_BYTES = 16  # --secret, after surrounding whitespace is stripped


def _seconds(name: str, positive: bool = True):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            return checkSeconds(text, f"--{name}", positive=positive)
        except ValueError as e:
            raise usage.UsageError(str(e)) from None

    return parse


def _count(name: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise usage.UsageError(f"--{name} must be a whole number >= 1, not {text!r}")
        return int(text)

    return parse


# The longest --lock-delay: a grant's place may stay taken a minute at most.
MAX_LOCK_DELAY = 60.0


def _lockDelay(text: str) -> float:
    try:
        return checkSeconds(text, "--lock-delay", positive=False, maximum=MAX_LOCK_DELAY)
    except ValueError as e:
        raise usage.UsageError(str(e)) from None


def parseAddress(text: str) -> tuple[str, int]:
    """
    Split C{host:port}; the port must be 1-65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise usage.UsageError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run a lockservice node. Alone it is a single lock server; with "
        "--peers it is one node of a priority-ordered cluster."
    )

    optParameters: List[List[object]] = [
        # No short options: twistd's own (-n, -l, -p, ...) would be
        # mistaken for ours, or ours for twistd's.
        ["listen", None, None,
         "Client/peer endpoint (default: the --node entry's port, or tcp:7700); "
         "an ssl:... string makes it TLS."],
        ["peers", None, None,
         "Comma-separated host:port of every node, highest priority first."],
        ["node", None, None, "This node's entry in --peers (inferred when unambiguous)."],
        ["secret", None, None, "File holding the shared secret peers must prove."],
        ["accept-secret", None, None,
         "File holding another secret peers may prove, besides --secret: to rotate the "
         "secret one node at a time (docs/operations.md)."],
        ["http", None, None, "Endpoint for the HTTP status/metrics server (off by default)."],
        ["tls-cert", None, None,
         "PEM certificate (chain) of this node: the client port and peer links speak TLS."],
        ["tls-key", None, None, "PEM private key of --tls-cert."],
        ["tls-ca", None, None,
         "PEM CA certificate(s): clients and peers must present a certificate it signed "
         "(mutual TLS); peers verify each other's."],
        ["max-lease", None, 86400.0, "Largest lease a client may ask for, seconds.",
         _seconds("max-lease")],
        ["max-wait", None, 86400.0, "Largest wait a client may ask for, seconds.",
         _seconds("max-wait")],
        ["max-keys", None, DEFAULT_MAX_KEYS,
         "Most keys held (or queued for) at once; more: E A <key> too many keys.",
         _count("max-keys")],
        ["max-waiters", None, DEFAULT_MAX_WAITERS,
         "Most acquires queued on one key; more: E A <key> too many waiters.",
         _count("max-waiters")],
        ["max-observers", None, DEFAULT_MAX_OBSERVERS,
         "Most observers (O) waiting on one key; more: E O <key> too many observers.",
         _count("max-observers")],
        ["lock-delay", None, 0.0,
         "Seconds an expired grant keeps its place in its key, so that a holder that "
         "was only paused notices it lost the lock before anyone else starts (0 to "
         "60; 0, the default: off).", _lockDelay],
        ["max-connections", None, DEFAULT_MAX_CONNECTIONS,
         "Most client connections open at once (peers not counted; lowered to fit "
         "the file descriptor limit); more: E * * too many connections.",
         _count("max-connections")],
        ["heartbeat", None, 0.1, "Seconds between heartbeats to peers.", _seconds("heartbeat")],
        ["peer-timeout", None, 1.0,
         "Seconds of silence after which a peer counts as dead.", _seconds("peer-timeout")],
        ["replication", None, "ack",
         "What a client's answer waits for: 'ack' (every synchronised standby "
         "acknowledged receiving the change) or 'sent' (the change left this host's "
         "socket buffers)."],
        ["warn-hold", None, None,
         "Log (once), count and flag on the status page every grant held longer than "
         "this many seconds (off by default).", _seconds("warn-hold")],
        ["admin-secret", None, None,
         "File holding the bearer token for the HTTP force-release "
         "(POST /locks/KEY/release); without it force-release is off."],
        ["state-dir", None, None,
         "Directory where the node keeps its token high-water mark and, after a "
         "graceful stop with nobody to hand them to, its held locks (off by default)."],
        ["log-format", None, "text",
         "'text' (twistd's lines, the default) or 'json' (one JSON object per line, "
         "for log shippers)."],
        ["config", None, None,
         "TOML file of settings: each option above by its name without the dashes "
         "(max-keys = 1000); the command line wins over the file."],
    ]

    # What the error lines start with (`lockservice config check` says its own).
    prog = "twistd lockservice"

    def opt_version(self) -> None:
        """
        Print lockservice's version and exit.
        """
        import lockservice
        import twisted

        sys.stdout.write(f"lockservice {lockservice.__version__} "
                         f"(Twisted {twisted.__version__})\n")
        raise SystemExit(0)

    def parseOptions(self, options: Optional[List[str]] = None) -> None:
        # Report a bad option ourselves and exit non-zero: twistd before
        # 24.x printed the message but exited 0.
        from lockservice import config

        if options is None:
            options = sys.argv[1:]
        path = config.configPath(options)
        onCommandLine = config.givenOnCommandLine(options)
        self.configFile = path
        self.fromFile: Dict[str, str] = {}
        try:
            if path is not None:
                # The file's settings go first: an option repeated on the
                # command line comes later and wins.
                fileArgs, self.fromFile = config.arguments(path, type(self))
                self._checkFileValues(path)
                options = fileArgs + list(options)
            super().parseOptions(options)
        except config.ConfigError as e:
            self.fail(e.line())
        except usage.UsageError as e:
            key = config.blame(str(e), self.fromFile, onCommandLine)
            if path is not None and key is not None:
                self.fail(config.ConfigError(path, key, str(e)).line())
            self.fail(f"{e} (see --help)")

    def fail(self, line: str) -> NoReturn:
        """
        End the process: one line on stderr, exit status 2.
        """
        sys.stderr.write(f"{self.prog}: {line}\n")
        raise SystemExit(2)

    def _checkFileValues(self, path: str) -> None:
        """
        Each value of the file on its own, through its option's own parser,
        so that a bad one is blamed on the file even when the command line
        gives that option too.
        """
        from lockservice import config

        coercers: Dict[str, Callable[[str], object]] = {
            str(p[0]): p[4] for p in self.optParameters if len(p) > 4 and callable(p[4])}
        for key, text in self.fromFile.items():
            if key in coercers:
                try:
                    coercers[key](text)
                except (usage.UsageError, ValueError) as e:
                    raise config.ConfigError(path, key, str(e)) from None

    def postOptions(self) -> None:
        self["peerList"] = []
        self["self"] = None
        if self["peers"]:
            self._resolvePeers()
        elif self["node"]:
            raise usage.UsageError("--node needs --peers")
        if self["listen"] is None:
            if self["self"] is not None:
                host, port = parseAddress(self["self"])
                # Colons of an IPv6 address must be escaped in an endpoint string.
                interface = host.replace(":", "\\:")
                self["listen"] = f"tcp:{port}:interface={interface}"
            else:
                self["listen"] = f"tcp:{DEFAULT_PORT}"
        if self["peer-timeout"] <= self["heartbeat"]:
            raise usage.UsageError("--peer-timeout must be longer than --heartbeat")
        if self["replication"] not in ("ack", "sent"):
            raise usage.UsageError("--replication must be 'ack' or 'sent'")
        if self["log-format"] not in ("text", "json"):
            raise usage.UsageError(
                f"--log-format must be 'text' or 'json', not {self['log-format']!r}")
        if self["peers"] and self["secret"] is None:
            raise usage.UsageError(
                "--peers needs --secret FILE: peers must prove a shared secret"
            )
        if self["accept-secret"] is not None and self["secret"] is None:
            raise usage.UsageError("--accept-secret needs --secret FILE (the secret this node "
                                   "proves)")
        _checkEndpoint("listen", self["listen"])
        if self["http"]:
            _checkEndpoint("http", self["http"])
        self._resolveTLS()
        # Lines to log once logging has begun (see makeService).
        self["warnings"] = []
        self["secretBytes"] = b""
        if self["secret"] is not None:
            self["secretBytes"] = self._secret("--secret", self["secret"])
        self["acceptSecretBytes"] = []
        if self["accept-secret"] is not None:
            self["acceptSecretBytes"] = [self._secret("--accept-secret", self["accept-secret"])]
        self["adminSecretBytes"] = None
        if self["admin-secret"] is not None:
            self["adminSecretBytes"] = self._secret("--admin-secret", self["admin-secret"])

    def _secret(self, option: str, path: str) -> bytes:
        """
        Read a secret file (see L{lockservice.config.checkSecretFile}).
        """
        from lockservice.config import checkSecretFile

        try:
            secret, warning = checkSecretFile(option, path, MIN_SECRET_BYTES)
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
        if warning is not None:
            self["warnings"].append(warning)
        return secret

    def _resolveTLS(self) -> None:
        """
        Load the TLS files now, so a bad one is a usage error (one line).
        """
        from lockservice.tls import TLSError

        cert, key, ca = self["tls-cert"], self["tls-key"], self["tls-ca"]
        listenTLS = self["listen"].split(":", 1)[0].lower() == "ssl"
        self["tls"] = None
        if (cert is None) != (key is None):
            raise usage.UsageError("--tls-cert and --tls-key go together")
        if cert is None:
            if ca is not None:
                raise usage.UsageError("--tls-ca needs --tls-cert and --tls-key")
            if listenTLS:
                # Twisted serves the ssl: string; peer links are encrypted
                # too, without verification (see docs/operations.md).
                self["tls"] = NodeTLS(None)
            return
        if listenTLS:
            raise usage.UsageError(
                "give either --listen ssl:... or --tls-cert/--tls-key, not both")
        try:
            self["tls"] = NodeTLS.fromFiles(cert, key, ca)
        except TLSError as e:
            raise usage.UsageError(str(e)) from None

    def _resolvePeers(self) -> None:
        peers = [p.strip() for p in self["peers"].split(",")]
        for peer in peers:
            parseAddress(peer)
        if len(set(peers)) != len(peers):
            raise usage.UsageError("--peers lists the same node twice")
        self["peerList"] = peers
        if self["node"]:
            if self["node"] not in peers:
                raise usage.UsageError(f"--node {self['node']} is not in --peers")
            self["self"] = self["node"]
            return
        matches = peers
        if self["listen"] is not None:
            listenPort = endpointPort(self["listen"])
            matches = [p for p in peers if parseAddress(p)[1] == listenPort]
        if len(matches) > 1:
            # Several hosts: keep the entries whose address is this machine's.
            matches = [p for p in matches if _isLocalHost(parseAddress(p)[0])]
        if len(matches) != 1:
            raise usage.UsageError("cannot tell which --peers entry is this node: give --node")
        self["self"] = matches[0]


def _isLocalHost(host: str) -> bool:
    """
    True when C{host} names an address of this machine (it can be bound).
    """
    import socket

    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, 0, type=socket.SOCK_STREAM
        ):
            with socket.socket(family, kind, proto) as s:
                s.bind(address)
                return True
    except OSError:
        return False
    return False


def oneLine(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _checkEndpoint(name: str, description: str) -> None:
    """
    Parse a server endpoint string now, so a bad one is a usage error.
    (Parsing binds nothing; an ssl: string reads its certificate files.)
    """
    from twisted.internet import reactor

    try:
        serverFromString(reactor, description)
    except Exception as e:
        raise usage.UsageError(
            f"--{name} {description!r} is not a usable endpoint: {oneLine(e)}") from None

def endpointPort(description: str) -> Optional[int]:
    for part in description.split(":")[1:]:
        if part.isdigit():
            return int(part)
        if part.startswith("port="):
            return int(part[5:]) if part[5:].isdigit() else None
    return None
