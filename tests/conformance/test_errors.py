"""
Bad arguments (one line on stderr, exit 2), malformed commands
(bad_command) and commands the client refuses before sending (invalid).
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import driver_command
from .driver import run_briefly
from .util import err, ok, token_of

BAD_ARGUMENTS = {
    "nothing": [],
    "no-addrs": ["--name", "x"],
    "unknown-flag": ["--addrs", "127.0.0.1:1", "--bogus", "1"],
    "addrs-without-value": ["--addrs"],
    "addr-without-port": ["--addrs", "127.0.0.1"],
    "addr-bad-port": ["--addrs", "127.0.0.1:notaport"],
    "cert-without-key": ["--addrs", "127.0.0.1:1", "--tls-ca", "/dev/null",
                         "--tls-cert", "/dev/null"],
    "cert-without-ca": ["--addrs", "127.0.0.1:1", "--tls-cert", "/dev/null",
                        "--tls-key", "/dev/null"],
    "missing-ca-file": ["--addrs", "127.0.0.1:1", "--tls-ca", "/nonexistent/ca.pem"],
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_one_stderr_line_exit_2(kind, case, tmp_path):
    done = run_briefly(driver_command(kind), BAD_ARGUMENTS[case], timeout=15)
    assert done.returncode == 2, (f"{case}: exit {done.returncode}, stderr: "
                                  f"{done.stderr.decode(errors='replace')[-800:]}")
    lines = done.stderr.decode(errors="replace").strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"{case}: one line on stderr, got {lines}"
    assert done.stdout == b"", f"{case}: nothing on stdout, got {done.stdout[:300]!r}"


def _bad(d, line, ident=None, code="bad_command"):
    """
    Send a raw line; the one result must be C{code} with id C{ident}.
    """
    before = len(d.all_lines())
    d.send_raw(line)
    got = d.wait_line(lambda o: "event" not in o, 10, f"the result of {line!r}", start=before)
    assert json.dumps(got.obj.get("id", "MISSING")) == json.dumps(ident), \
        f"{line!r}: id must be {ident!r}, got {got.obj}"
    err(got.obj, code)
    assert isinstance(got.obj.get("message"), str), got.obj
    return got.obj


def test_bad_command(kind, lone, start_driver, key):
    k = key()
    d = start_driver(lone.address)
    # Unreadable: id null.
    _bad(d, "this is not json")
    _bad(d, '{"id": 1, "op": "acquire", ')
    _bad(d, "[1, 2, 3]")
    _bad(d, '"a string"')
    _bad(d, '{"op": "leader", "election": "e"}')  # no id
    # Readable id, malformed command: the id is echoed.
    _bad(d, json.dumps({"id": 11, "op": "frobnicate"}), 11)
    _bad(d, json.dumps({"id": "x12"}), "x12")  # no op
    missing = [
        {"op": "acquire", "lease": 30, "wait": 5},
        {"op": "acquire", "key": k, "wait": 5},
        {"op": "acquire", "key": k, "lease": 30},
        {"op": "release", "key": k},
        {"op": "release", "token": "1"},
        {"op": "renew", "key": k, "token": "1"},
        {"op": "renew", "key": k, "lease": 30},
        {"op": "observe", "key": k, "token": "0"},
        {"op": "observe", "token": "0", "wait": 1},
        {"op": "campaign", "election": k, "lease": 5},
        {"op": "campaign", "value": "v", "lease": 5},
        {"op": "leader"},
        {"op": "resign"},
        {"op": "cancel"},
    ]
    for n, command in enumerate(missing):
        _bad(d, json.dumps({"id": 100 + n, **command}), 100 + n)
    _bad(d, json.dumps({"id": 151, "op": 7}), 151)
    # Nothing reached the node, and the driver goes on.
    assert lone.holders(k) == [] and lone.waiters(k) == 0
    t = token_of(d.call("acquire", key=k, lease=30, wait=5))
    ok(d.call("release", key=k, token=t))


def test_invalid_is_refused_before_sending(kind, lone, start_driver, key):
    k = key()
    d = start_driver(lone.address)
    long_key = "é" * 126  # 252 bytes
    cases = [
        {"op": "acquire", "key": "", "lease": 30, "wait": 5},
        {"op": "acquire", "key": "a b", "lease": 30, "wait": 5},
        {"op": "acquire", "key": "ctl\u0001", "lease": 30, "wait": 5},
        {"op": "acquire", "key": "c1\u0085", "lease": 30, "wait": 5},
        {"op": "acquire", "key": "del\u007f", "lease": 30, "wait": 5},
        {"op": "acquire", "key": "x" * 251, "lease": 30, "wait": 5},
        {"op": "acquire", "key": long_key, "lease": 30, "wait": 5},
        {"op": "acquire", "key": k, "lease": 0, "wait": 5},
        {"op": "acquire", "key": k, "lease": -1, "wait": 5},
        {"op": "acquire", "key": k, "lease": 30, "wait": -1},
        {"op": "acquire", "key": k, "lease": 30, "wait": 5, "share": "w"},
        {"op": "acquire", "key": k, "lease": 30, "wait": 5, "share": 0},
        {"op": "acquire", "key": k, "lease": 30, "wait": 5, "share": -2},
        {"op": "acquire", "key": k, "lease": 30, "wait": 5, "share": 65536},
        {"op": "acquire", "key": k, "lease": 30, "wait": 5, "share": "R"},
        {"op": "release", "key": "a b", "token": "1"},
        {"op": "release", "key": k, "token": "abc"},
        {"op": "release", "key": k, "token": "-1"},
        {"op": "release", "key": k, "token": "18446744073709551616"},
        {"op": "renew", "key": k, "token": "1", "lease": 0},
        {"op": "renew", "key": "", "token": "1", "lease": 5},
        {"op": "observe", "key": "a b", "token": "0", "wait": 1},
        {"op": "observe", "key": k, "token": "0", "wait": -1},
        {"op": "campaign", "election": "a b", "value": "v", "lease": 5},
        {"op": "campaign", "election": k, "value": "v", "lease": 0},
        {"op": "leader", "election": "a b"},
    ]
    for n, command in enumerate(cases):
        ident = 200 + n
        started = time.monotonic()
        r = _bad(d, json.dumps({"id": ident, **command}), ident, code="invalid")
        assert time.monotonic() - started < 3, f"{command}: invalid at once, not after trying: {r}"
    assert lone.holders(k) == [] and lone.waiters(k) == 0
    # Boundaries that are valid: a 250-byte key, share 1 and 65535, token 2^64-1.
    edge = key("edge")[-60:]
    edge += "x" * ((250 - len(edge.encode())) % 2)
    edge += "é" * ((250 - len(edge.encode())) // 2)
    assert len(edge.encode()) == 250
    t = token_of(d.call("acquire", key=edge, lease=30, wait=5))
    ok(d.call("release", key=edge, token=t))
    err(d.call("release", key=k, token="18446744073709551615"), "stale")
    err(d.call("release", key=k, token="007"), "stale")
    t = token_of(d.call("acquire", key=k, lease=30, wait=5, share=65535))
    assert lone.lock(k)["slots"] == 65535
    ok(d.call("release", key=k, token=t))
    t = token_of(d.call("acquire", key=k, lease=30, wait=5, share=1))
    assert lone.lock(k)["kind"] == "exclusive"
    ok(d.call("release", key=k, token=t))
