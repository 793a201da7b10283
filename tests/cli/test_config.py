"""
twistd lockservice --config FILE (TOML), lockservice config check | show,
and the rules for secret files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from lockservice import config
from lockservice.cli.nodetools import tomlValue
from lockservice.tap import Options
from lockservice.testing.harness import freePort, ping, twistdEnvironment, waitFor

ROOT = Path(__file__).resolve().parents[2]
SECRET = "config-test-secret-0123456789abcdef"


def parse(args: List[str]) -> Options:
    options = Options()
    options.parseOptions(args)
    return options


def refused(args: List[str], capsys: Any) -> str:
    with pytest.raises(SystemExit) as e:
        parse(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def files(tmp_path: Path) -> Dict[str, str]:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    return {"secret": str(secret), "dir": str(tmp_path)}


def write(tmp_path: Path, text: str, name: str = "node.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# A value for every option, in the file's form and the command line's form.
EXAMPLES: Dict[str, Any] = {
    "listen": ("tcp:7801:interface=127.0.0.1", "tcp:7801:interface=127.0.0.1"),
    "peers": (["127.0.0.1:7801", "127.0.0.1:7802"], "127.0.0.1:7801,127.0.0.1:7802"),
    "node": ("127.0.0.1:7801", "127.0.0.1:7801"),
    "http": ("tcp:7880:interface=127.0.0.1", "tcp:7880:interface=127.0.0.1"),
    "max-lease": (60, "60"),
    "max-wait": (30.5, "30.5"),
    "max-keys": (1000, "1000"),
    "max-waiters": (50, "50"),
    "max-observers": (40, "40"),
    "lock-delay": (0.25, "0.25"),
    "max-connections": (2000, "2000"),
    "heartbeat": (0.2, "0.2"),
    "peer-timeout": (2, "2"),
    "replication": ("sent", "sent"),
    "warn-hold": (120, "120"),
    "state-dir": ("STATE", "STATE"),
    "log-format": ("json", "json"),
}
# Options that need files or others to be given with them.
NEEDS = {
    "peers": ["--node", "127.0.0.1:7801", "--secret", "SECRET"],
    "node": ["--peers", "127.0.0.1:7801,127.0.0.1:7802", "--secret", "SECRET"],
    "accept-secret": ["--secret", "SECRET"],
}


def test_every_option_is_a_key() -> None:
    """
    The keys are the options of the Options class: an option added there
    is a key of the file at once.
    """
    long = ({str(p[0]) for p in Options.optParameters}
            | {str(f[0]) for f in getattr(Options, "optFlags", [])})
    assert set(config.settings(Options)) == long - {"config"}
    assert set(config.settings(Options)) >= {
        "listen", "http", "peers", "node", "secret", "state-dir", "replication", "lock-delay",
        "max-keys", "max-observers", "tls-cert", "tls-key", "tls-ca", "admin-secret",
        "log-format"}


@pytest.mark.parametrize("name", sorted(config.settings(Options)))
def test_a_key_means_what_its_option_means(name: str, tmp_path: Path, files: Dict) -> None:  # type: ignore[type-arg]
    if name in ("secret", "admin-secret", "accept-secret"):
        fileValue = cliValue = files["secret"]
    elif name.startswith("tls-"):
        from lockservice.testing.certs import TestCA as CA

        ca = CA(tmp_path)
        issued = ca.issue("node")
        both = {"tls-cert": issued.cert, "tls-key": issued.key, "tls-ca": ca.cert}
        extra = [a for k, v in both.items() if k != name for a in (f"--{k}", v)]
        fileValue = cliValue = both[name]
        NEEDS[name] = extra
    else:
        fileValue, cliValue = EXAMPLES[name]
    if fileValue == "STATE":
        fileValue = cliValue = str(tmp_path / "state")
    needs = [files["secret"] if a == "SECRET" else a for a in NEEDS.get(name, [])]
    toml = f"{name} = {tomlValue(fileValue)}\n"
    fromFile = parse(["--config", write(tmp_path, toml)] + needs)
    fromLine = parse([f"--{name}", str(cliValue)] + needs)
    assert fromFile[name] == fromLine[name] and fromFile[name] is not None
    for key in ("listen", "peerList", "self", "secretBytes", "adminSecretBytes",
                "acceptSecretBytes"):
        assert fromFile[key] == fromLine[key]


def test_numbers_as_strings_and_lists_as_comma_strings(tmp_path: Path, files: Dict) -> None:  # type: ignore[type-arg]
    o = parse(["--config", write(tmp_path, f'''
peers = "127.0.0.1:7801, 127.0.0.1:7802"
node = "127.0.0.1:7802"
secret = "{files["secret"]}"
lock-delay = "0.5"
max-keys = "77"
heartbeat = 0.2
''')])
    assert o["peerList"] == ["127.0.0.1:7801", "127.0.0.1:7802"]
    assert o["self"] == "127.0.0.1:7802" and o["listen"] == "tcp:7802:interface=127.0.0.1"
    assert o["lock-delay"] == 0.5 and o["max-keys"] == 77 and o["heartbeat"] == 0.2
    assert o["secretBytes"] == SECRET.encode()


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'max-keys = 5\nlock-delay = 1\nlisten = "tcp:7801"\n')
    o = parse(["--max-keys", "9", "--config", path, "--listen=tcp:7802"])
    assert o["max-keys"] == 9 and o["lock-delay"] == 1.0 and o["listen"] == "tcp:7802"
    # The file's value where the command line says nothing; and a value
    # the command line overrides is checked all the same (the file is bad).
    assert parse(["--config", path])["max-keys"] == 5


@pytest.mark.parametrize("text, key, what", [
    ("max_keys = 5\n", "max_keys", "unknown key (did you mean 'max-keys'?)"),
    ("colour = 'red'\n", "colour", "unknown key (known keys: accept-secret, admin-secret"),
    ("config = 'x.toml'\n", "config", "unknown key"),
    ("[node]\nx = 1\n", "node", "must be a string, not a table"),
    ("max-keys = true\n", "max-keys", "must be a number (or a string), not a boolean"),
    ("max-keys = [1]\n", "max-keys", "must be a number (or a string), not an array"),
    ("max-keys = 'many'\n", "max-keys", "--max-keys must be a whole number >= 1, not 'many'"),
    ("max-keys = 1.5\n", "max-keys", "must be a whole number"),
    ("lock-delay = 61\n", "lock-delay", "--lock-delay"),
    ("listen = 7700\n", "listen", "must be a string, not an integer"),
    ("peers = 5\n", "peers", "must be an array of \"host:port\" strings"),
    ("peers = []\n", "peers", "(an empty one)"),
    ("peers = ['a:1', 2]\n", "peers", "must be an array"),
    ("replication = 'later'\n", "replication", "--replication must be 'ack' or 'sent'"),
    ("log-format = 'xml'\n", "log-format", "--log-format must be 'text' or 'json'"),
    ("listen = 'nonsense'\n", "listen", "is not a usable endpoint"),
    ("heartbeat = 2\n", "heartbeat", "--peer-timeout must be longer than --heartbeat"),
    ("secret = '/nonexistent/secret'\n", "secret", "cannot read --secret"),
    ("peers = ['127.0.0.1:1', '127.0.0.1:2']\nnode = '127.0.0.1:1'\n", "peers",
     "--peers needs --secret"),
    ("max-keys = 2026-01-01\n", "max-keys", "not a date"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(
        tmp_path: Path, capsys: Any, text: str, key: str, what: str) -> None:
    path = write(tmp_path, text)
    err = refused(["--config", path], capsys)
    assert err.startswith(f"twistd lockservice: {path}: key {key!r}: ") and what in err, err


@pytest.mark.parametrize("text, what", [
    ("max-keys = = 5\n", "is not valid TOML: "),
    ("max-keys = 5\nmax-keys = 6\n", "is not valid TOML: "),
    (b"\xff\xfe".decode("latin-1"), "is not"),
])
def test_a_file_that_is_not_toml(tmp_path: Path, capsys: Any, text: str, what: str) -> None:
    path = write(tmp_path, text)
    err = refused(["--config", path], capsys)
    assert err.startswith(f"twistd lockservice: {path}: ") and what in err, err


def test_a_missing_or_unreadable_file(tmp_path: Path, capsys: Any) -> None:
    missing = str(tmp_path / "missing.toml")
    assert "cannot read it: No such file or directory" in refused(["--config", missing], capsys)
    assert "cannot read it: Is a directory" in refused(["--config", str(tmp_path)], capsys)


def test_a_value_from_the_command_line_is_blamed_on_the_command_line(
        tmp_path: Path, capsys: Any) -> None:
    path = write(tmp_path, "max-keys = 5\n")
    err = refused(["--config", path, "--replication", "later"], capsys)
    assert err == "twistd lockservice: --replication must be 'ack' or 'sent' (see --help)\n"


# -- secrets ----------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["secret", "admin-secret"])
@pytest.mark.parametrize("content, mode, what", [
    ("short-secret\n", 0o600, "holds 12 bytes: a secret must be at least 16 bytes"),
    (SECRET, 0o620, "may be written by its group"),
    (SECRET, 0o602, "may be written by others"),
    (SECRET, 0o666, "may be written by its group and others"),
    ("\n", 0o600, "is empty"),
])
def test_a_secret_refused(tmp_path: Path, capsys: Any, option: str, content: str, mode: int,
                          what: str) -> None:
    secret = tmp_path / "s"
    secret.write_text(content)
    secret.chmod(mode)
    for args in ([f"--{option}", str(secret)],
                 ["--config", write(tmp_path, f'{option} = "{secret}"\n')]):
        err = refused(args, capsys)
        assert what in err and str(secret) in err, err


@pytest.mark.parametrize("option", ["secret", "admin-secret"])
def test_a_secret_others_may_read_is_accepted_with_a_warning(
        tmp_path: Path, option: str) -> None:
    secret = tmp_path / "s"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    o = parse([f"--{option}", str(secret)])
    assert o["warnings"] == [f"--{option} {secret} may be read by its group and others: "
                             f"chmod 600 {secret}"]
    secret.chmod(0o600)
    assert parse([f"--{option}", str(secret)])["warnings"] == []


def test_a_readable_secret_is_one_warning_in_the_nodes_log(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o640)
    port = freePort()
    log = tmp_path / "node.log"
    path = write(tmp_path, f'listen = "tcp:{port}:interface=127.0.0.1"\n'
                           f'admin-secret = "{secret}"\n')
    process = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
         "--pidfile=", "-l", str(log), "lockservice", "--config", path],
        env=twistdEnvironment(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL)
    try:
        waitFor(lambda: ping(port), 15, what="node up")
        text = log.read_text()
        assert text.count("may be read by its group") == 1, text
        assert f"--admin-secret {secret} may be read by its group: chmod 600" in text
    finally:
        process.terminate()
        process.wait(10)


# -- real processes: twistd, lockservice config ------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60,
                          env=twistdEnvironment(), stdin=subprocess.DEVNULL)


def twistd(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return run(sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
               "--pidfile=", "lockservice", *args)


def lockservice(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return run(sys.executable, "-c", "import sys; from lockservice.cli import main; "
                                     "sys.exit(main())", *args)


def test_twistd_with_a_bad_file_says_one_line_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "max-keys = 'lots'\n")
    result = twistd("--config", path)
    assert result.returncode == 2
    assert result.stderr == (f"twistd lockservice: {path}: key 'max-keys': --max-keys must "
                             f"be a whole number >= 1, not 'lots'\n")
    missing = twistd("--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nope.toml: cannot read it" in missing.stderr


def test_twistd_runs_from_the_file(tmp_path: Path) -> None:
    port = freePort()
    path = write(tmp_path, f'listen = "tcp:{port}:interface=127.0.0.1"\nmax-keys = 1\n')
    process = subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "-n",
         "--pidfile=", "-l", str(tmp_path / "n.log"), "lockservice", "--config", path],
        env=twistdEnvironment(), stdin=subprocess.DEVNULL)
    try:
        waitFor(lambda: ping(port), 15, what="node up")
        from lockservice.testing.harness import LineClient

        with LineClient(port) as c:
            assert c.ask(b"A a 10 0").startswith(b"A a ")
            assert c.ask(b"A b 10 0") == b"E A b too many keys"
    finally:
        process.terminate()
        process.wait(10)


def test_config_check(tmp_path: Path, files: Dict) -> None:  # type: ignore[type-arg]
    good = write(tmp_path, f'secret = "{files["secret"]}"\nmax-keys = 10\n')
    result = lockservice("config", "check", good)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    bad = write(tmp_path, "max-keys = 0\n", "bad.toml")
    result = lockservice("config", "check", bad)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"lockservice config check: {bad}: key 'max-keys': --max-keys "
                             f"must be a whole number >= 1, not '0'\n")


def test_config_show_prints_paths_never_contents(tmp_path: Path, files: Dict) -> None:  # type: ignore[type-arg]
    path = write(tmp_path, f'''peers = ["127.0.0.1:7801", "127.0.0.1:7802"]
node = "127.0.0.1:7801"
secret = "{files["secret"]}"
admin-secret = "{files["secret"]}"
lock-delay = "0.5"
''')
    result = lockservice("config", "show", path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert SECRET not in out
    assert f'secret = "{files["secret"]}"\n' in out
    assert 'peers = ["127.0.0.1:7801", "127.0.0.1:7802"]\n' in out
    assert 'listen = "tcp:7801:interface=127.0.0.1"' in out
    assert "lock-delay = 0.5\n" in out and "max-keys = 1000000  # default\n" in out
    assert "# http = (not set)" in out
    # What it prints is a configuration file that means the same.
    shown = write(tmp_path, out, "shown.toml")
    assert lockservice("config", "check", shown).returncode == 0


def test_the_example_file_checks(tmp_path: Path) -> None:
    """
    contrib/lockservice.toml, with its files made here.
    """
    from lockservice.testing.certs import TestCA as CA

    ca = CA(tmp_path)
    issued = ca.issue("ls1", hosts=["ls1.example.com"])
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    text = (ROOT / "contrib" / "lockservice.toml").read_text()
    for old, new in (("/etc/lockservice/secret", str(secret)),
                     ("/etc/lockservice/tls/node.pem", issued.cert),
                     ("/etc/lockservice/tls/node.key", issued.key),
                     ("/etc/lockservice/tls/ca.pem", ca.cert),
                     ("/var/lib/lockservice", str(tmp_path / "state"))):
        assert old in text
        text = text.replace(old, new)
    path = write(tmp_path, text)
    result = lockservice("config", "check", path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    o = parse(["--config", path])
    assert o["self"] == "ls1.example.com:7700" and o["log-format"] == "json"
    assert os.path.basename(o["http"]) == "tcp:7780:interface=127.0.0.1"
