# -*- test-case-name: tests.process.test_logs -*-
"""
Where and how the node's log goes under twistd.

twistd chooses the log observer itself (C{-l FILE}, C{-n} for standard
output, C{--syslog}, C{--logger}), unless the application offers one as
its L{ILogObserver} component: the node offers one (see
L{lockservice.tap.NodeService.setServiceParent}) so that it can

  - write C{--log-format json}: one JSON object per line, flat, with the
    keys log shippers expect (L{jsonRecord});
  - reopen C{-l FILE} on SIGHUP, after logrotate (or an operator) moved it
    away: the node writes to the new file from then on, with no copy and
    truncation (L{LogTarget.reopen}).

The file is never rotated by size (twistd's own file starts a new one
every megabyte, which an external rotation cannot follow); SIGUSR1 still
rotates it on demand, as under plain twistd.  With C{--syslog} or
C{--logger} twistd's choice stands and the format option has no effect.
"""

from __future__ import annotations

import datetime
import json
import math
import signal
import sys
from typing import IO, Any, Callable, Dict, Optional

from twisted.logger import ILogObserver, LogLevel, formatEvent, textFileLogObserver
from twisted.python.logfile import LogFile
from zope.interface import implementer

# An event as twisted.logger hands it to an observer.
LogEvent = Dict[str, Any]

# Keys of a record that come from the event's envelope, not its fields.
RESERVED = ("time", "level", "namespace", "event", "message")
# What the legacy twisted.python.log bridge puts in an event besides its
# format: already in the message, or in the envelope.
_LEGACY = frozenset({"message", "format", "isError", "failure", "why", "time", "system"})
# A field's text is cut beyond this many characters (a line stays a line a
# shipper accepts).
MAX_FIELD = 4096


def isoTime(seconds: float) -> str:
    """
    C{seconds} since the epoch as ISO 8601 UTC with microseconds and a C{Z}.
    """
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def jsonable(value: Any, depth: int = 0) -> Any:
    """
    C{value} as JSON can hold it: text for what JSON has no type for.
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value if len(value) <= MAX_FIELD else value[:MAX_FIELD] + "..."
    if isinstance(value, (bytes, bytearray)):
        return jsonable(bytes(value).decode("utf-8", "replace"), depth)
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in list(value)[:100]]
    if depth < 3 and isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in list(value.items())[:100]}
    try:
        text = str(value)
    except Exception:
        text = object.__repr__(value)
    return jsonable(text, depth)


def jsonRecord(event: LogEvent) -> Dict[str, Any]:
    """
    One log event as a flat record: C{time} (ISO 8601 UTC), C{level},
    C{namespace}, C{event} (the event's name, its C{event} field, or
    null), C{message} (the formatted text, with the traceback of a
    failure), then the event's own fields.  A field named like one of the
    envelope's keys is kept with a C{_} after its name.
    """
    level = event.get("log_level")
    if not isinstance(level, type(LogLevel.info)):
        level = LogLevel.error if event.get("isError") else LogLevel.info
    message = formatEvent(event)
    failure = event.get("log_failure")
    record: Dict[str, Any] = {
        "time": isoTime(event.get("log_time") or 0.0),
        "level": level.name,
        "namespace": event.get("log_namespace") or "-",
        "event": jsonable(event.get("event")),
        "message": message,
    }
    if failure is not None:
        try:
            record["traceback"] = failure.getTraceback()
        except Exception:
            record["traceback"] = repr(failure)
        record["error"] = jsonable(getattr(failure, "value", None))
    system = event.get("log_system")
    if system not in (None, "-"):
        record["system"] = jsonable(system)
    legacy = "log_legacy" in event or event.get("log_namespace") == "log_legacy"
    for key, value in event.items():
        if key.startswith("log_") or key == "event" or (legacy and key in _LEGACY):
            continue
        name = key if key not in record else key + "_"
        record[name] = jsonable(value)
    return record


def jsonLine(event: LogEvent) -> str:
    """
    One event as one line of JSON (no newline inside: JSON escapes them).
    """
    return json.dumps(jsonRecord(event), ensure_ascii=False, separators=(",", ":"),
                      default=str) + "\n"


@implementer(ILogObserver)
class JSONLinesObserver:
    """
    Writes each event as one line of JSON to a file, flushed at once.
    """

    def __init__(self, out: Callable[[], IO[str]]) -> None:
        """
        @param out: gives the file to write to now (it may be reopened).
        """
        self._out = out

    def __call__(self, event: LogEvent) -> None:
        try:
            line = jsonLine(event)
        except Exception as e:  # an event that cannot be read still leaves a line
            line = json.dumps({"time": isoTime(event.get("log_time") or 0.0),
                               "level": "error", "namespace": "lockservice.logs",
                               "event": "log_event_unreadable", "message": repr(e)}) + "\n"
        out = self._out()
        out.write(line)
        out.flush()


class LogTarget:
    """
    The node's log file (or standard output) and the observer writing to it.

    @ivar file: the L{LogFile} of C{-l FILE}, or None (standard output).
    @ivar observer: the L{ILogObserver} to offer twistd.
    """

    def __init__(self, logFormat: str, path: Optional[str],
                 stdout: Optional[IO[str]] = None) -> None:
        self.file: Optional[LogFile] = None
        self._stdout = stdout if stdout is not None else sys.stdout
        if path is not None:
            # rotateLength None: never rotated by size (see the module's
            # docstring); logrotate moves it and sends SIGHUP.
            self.file = LogFile.fromFullPath(path, rotateLength=None)
        out: IO[str] = self.file if self.file is not None else self._stdout  # type: ignore[assignment]
        if logFormat == "json":
            self.observer: ILogObserver = JSONLinesObserver(lambda: out)
        else:
            # What twistd itself would write.  (LogFile.reopen() opens the
            # file again inside the same object.)
            self.observer = textFileLogObserver(out)

    def reopen(self) -> None:
        """
        Reopen the log file by its name (a new file if it was moved away).
        """
        if self.file is not None:
            self.file.reopen()

    def rotate(self) -> None:
        """
        Rotate the file as twistd does on SIGUSR1 (C{FILE.1}, C{FILE.2}, ...).
        """
        if self.file is not None:
            self.file.rotate()


def targetFor(twistdOptions: Any, logFormat: str) -> Optional[LogTarget]:
    """
    The log target that twistd's own options ask for, or None when twistd
    must choose (C{--syslog}, C{--logger}, or C{-l -} of a daemon, which
    twistd refuses itself).

    @param twistdOptions: twistd's L{ServerOptions} (the plugin options'
        C{parent}), or None when not run by twistd.
    """
    if twistdOptions is None:
        return None
    get = getattr(twistdOptions, "get", None)
    if get is None:
        return None
    if get("syslog") or get("logger"):
        return None
    path, nodaemon = get("logfile"), bool(get("nodaemon"))
    if path == "-":
        if not nodaemon:
            return None
        path = None
    elif not path:
        path = None if nodaemon else "twistd.log"
    return LogTarget(logFormat, path)


def handleSignals(reactor: Any, target: Optional[LogTarget]) -> None:
    """
    SIGHUP reopens the log file (and never ends the node, as it would by
    default); SIGUSR1 rotates it as under plain twistd.  Run from the
    reactor, not inside the signal handler.
    """
    from twisted.logger import Logger

    log = Logger(namespace="lockservice.logs")

    def reopen() -> None:
        if target is not None and target.file is not None:
            target.reopen()
            log.info("reopened the log file {path} (SIGHUP)", path=target.file.path,
                     event="log_reopened")
        else:
            log.info("SIGHUP: no log file to reopen", event="log_reopened")

    def onHangUp(signum: int, frame: Any) -> None:
        reactor.callFromThread(reopen)

    signal.signal(signal.SIGHUP, onHangUp)
    if target is not None and target.file is not None:
        def onUser1(signum: int, frame: Any) -> None:
            reactor.callFromThread(target.rotate)

        signal.signal(signal.SIGUSR1, onUser1)
