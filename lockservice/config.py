# -*- test-case-name: tests.cli.test_config -*-
"""
C{twistd lockservice --config FILE}: the node's settings in a TOML file.

Every command-line option of the plugin is a key of the file, by the same
name without the dashes (C{listen}, C{peers}, C{max-keys}, ...).  The list
of keys is read off the options class itself, so an option added there is a
key of the file at once.  A value is written in TOML's own types or as a
string in the option's command-line grammar:

  - an option with a unit (seconds, a count) takes a TOML number or a
    string (C{lock-delay = 0.5}, C{lock-delay = "0.5"});
  - C{peers} takes an array of C{host:port} strings or one comma-separated
    string;
  - a flag takes a boolean;
  - everything else takes a string.

The file is turned into the command-line arguments it stands for, put in
front of the real ones: an option given on the command line comes later
and so wins.  A file that cannot be read, is not TOML, or has an unknown
key or a value of the wrong type is refused with L{ConfigError}, whose
message is one line naming the file and the key.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Options of the command line that are not settings: the file itself, and
# the actions that print something and exit.
NOT_SETTINGS = frozenset({"config", "help", "version"})
# Options whose value is a list, written comma-separated on the command line.
LIST_OPTIONS = frozenset({"peers"})


class ConfigError(Exception):
    """
    The configuration file cannot be used.

    @ivar path: the file.
    @ivar key: the key concerned, or None (the file as a whole).
    @ivar reason: what is wrong, one line.
    """

    def __init__(self, path: str, key: Optional[str], reason: str) -> None:
        self.path = path
        self.key = key
        self.reason = " ".join(reason.split())
        super().__init__(self.line())

    def line(self) -> str:
        where = f"{self.path}: " + (f"key {self.key!r}: " if self.key is not None else "")
        return where + self.reason


class Setting:
    """
    One option of the command line as a key of the file.

    @ivar name: the option's long name (the key).
    @ivar kind: C{"flag"}, C{"list"}, C{"number"} (it has a coercer: a
        TOML number is accepted too) or C{"string"}.
    @ivar default: the option's default value.
    @ivar doc: its help text.
    """

    def __init__(self, name: str, kind: str, default: Any, doc: str) -> None:
        self.name = name
        self.kind = kind
        self.default = default
        self.doc = doc


def settings(options: Any) -> Dict[str, Setting]:
    """
    The keys a configuration file may hold: every long option of the
    L{twisted.python.usage.Options} subclass (or instance) C{options},
    less L{NOT_SETTINGS}.
    """
    found: Dict[str, Setting] = {}
    for entry in getattr(options, "optParameters", []):
        name = str(entry[0])
        default = entry[2] if len(entry) > 2 else None
        doc = str(entry[3]) if len(entry) > 3 else ""
        coerce = entry[4] if len(entry) > 4 else None
        if name in LIST_OPTIONS:
            kind = "list"
        elif coerce is not None:
            kind = "number"
        else:
            kind = "string"
        found[name] = Setting(name, kind, default, doc)
    for entry in getattr(options, "optFlags", []):
        name = str(entry[0])
        found[name] = Setting(name, "flag", False, str(entry[2]) if len(entry) > 2 else "")
    for name in NOT_SETTINGS:
        found.pop(name, None)
    return found


def _typeName(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # dates and times


def _argument(path: str, setting: Setting, value: Any) -> Optional[str]:
    """
    The command-line text of C{value} for C{setting} (None: a flag left
    off).

    @raise ConfigError: C{value} is of a type the option does not take.
    """
    name = setting.name
    if setting.kind == "flag":
        if not isinstance(value, bool):
            raise ConfigError(path, name, f"must be true or false, not {_typeName(value)}")
        return "" if value else None
    if setting.kind == "list":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if any("," in v for v in value):
                raise ConfigError(path, name, "an entry of the array holds a comma")
            return ",".join(value)
        raise ConfigError(path, name, "must be an array of \"host:port\" strings or one "
                                      f"comma-separated string, not {_typeName(value)}"
                          + (" (an empty one)" if value == [] else ""))
    if setting.kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(path, name, f"must be a number (or a string), not "
                                          f"{_typeName(value)}")
        return value if isinstance(value, str) else repr(value)
    if not isinstance(value, str):
        raise ConfigError(path, name, f"must be a string, not {_typeName(value)}")
    return value


def read(path: str) -> Dict[str, Any]:
    """
    The TOML table in file C{path}.

    @raise ConfigError: the file cannot be read or is not TOML.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(path, None, f"cannot read it: {e.strerror or e}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(path, None, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"is not valid TOML: {e}") from None


def arguments(path: str, options: Any) -> Tuple[List[str], Dict[str, str]]:
    """
    The command-line arguments that the file C{path} stands for.

    @param options: the L{twisted.python.usage.Options} subclass whose
        options are the file's keys.
    @return: the arguments, and by key the text of each value given.
    @raise ConfigError: the file cannot be read, is not TOML, or has an
        unknown key or a value of a type its option does not take.
    """
    table = read(path)
    known = settings(options)
    argv: List[str] = []
    given: Dict[str, str] = {}
    for key, value in table.items():
        setting = known.get(key)
        if setting is None:
            raise ConfigError(path, key, "unknown key" + _suggestion(key, known))
        text = _argument(path, setting, value)
        if text is None:
            continue
        given[key] = text
        argv += [f"--{key}"] if setting.kind == "flag" else [f"--{key}={text}"]
    return argv, given


def _suggestion(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key.replace("_", "-").lower(), sorted(known), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known keys: {', '.join(sorted(known))})"


def configPath(argv: Sequence[str]) -> Optional[str]:
    """
    The value of the last C{--config FILE} (or C{--config=FILE}) in C{argv}.
    """
    found = None
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--config="):
            found = arg[len("--config="):]
    return found


def givenOnCommandLine(argv: Sequence[str]) -> set[str]:
    """
    The long options that C{argv} names.
    """
    names = set()
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("--") and len(arg) > 2:
            names.add(arg[2:].split("=", 1)[0])
    return names


def blame(message: str, fromFile: Iterable[str], onCommandLine: Iterable[str]) -> Optional[str]:
    """
    Which key of the file a usage error is about: the first option that
    C{message} names (C{--name}) whose value came from the file and not
    from the command line; None when there is none.
    """
    candidates = set(fromFile) - set(onCommandLine)
    best: Optional[Tuple[int, str]] = None
    for key in candidates:
        where = _mention(message, key)
        if where >= 0 and (best is None or where < best[0]):
            best = (where, key)
    return best[1] if best is not None else None


def _mention(message: str, key: str) -> int:
    needle = f"--{key}"
    start = 0
    while True:
        at = message.find(needle, start)
        if at < 0:
            return -1
        end = at + len(needle)
        if end == len(message) or not (message[end].isalnum() or message[end] == "-"):
            return at
        start = end


# -- secrets -------------------------------------------------------------------


def checkSecretFile(option: str, path: str, minimum: int) -> Tuple[bytes, Optional[str]]:
    """
    Read a secret file: its content without surrounding whitespace, and a
    warning to log (or None).

    A secret shorter than C{minimum} bytes, or in a file that group or
    others may write (anyone who can write it can make the node trust
    them), is refused; a file that group or others may read is accepted
    with a warning (whoever reads it can join the cluster).

    @raise ValueError: one line saying why the secret is refused.
    """
    import stat

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ValueError(f"cannot read {option} {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"cannot read {option} {path}: Is a directory")
        with os.fdopen(os.dup(fd), "rb") as f:
            secret = f.read().strip()
    except OSError as e:
        raise ValueError(f"cannot read {option} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if not secret:
        raise ValueError(f"{option} {path} is empty")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"{option} {path} may be written by {_who(mode, stat.S_IWGRP, stat.S_IWOTH)}: "
            f"whoever can change the secret can join; chmod 600 {path}")
    if len(secret) < minimum:
        # A short secret can be guessed offline from one recorded
        # handshake (docs/cluster.md, "Peer authentication").
        raise ValueError(
            f"{option} {path} holds {len(secret)} bytes: a secret must be at least "
            f"{minimum} bytes, long and random (head -c 32 /dev/urandom | base64 > FILE)")
    warning = None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warning = (f"{option} {path} may be read by "
                   f"{_who(mode, stat.S_IRGRP, stat.S_IROTH)}: chmod 600 {path}")
    return secret, warning


def _who(mode: int, group: int, others: int) -> str:
    return " and ".join(w for w, bit in (("its group", group), ("others", others))
                        if mode & bit)
