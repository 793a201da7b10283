"""
lockservice.state: the state file (pure encode/decode), its atomic
writes, the token high-water mark and the saved locks.
"""

from __future__ import annotations

import os
from typing import Any, List

import pytest
from twisted.internet.task import Clock

from lockservice.core.table import EXCLUSIVE, READ, TokenIssuer
from lockservice.server.service import LockService
from lockservice.state import (
    MARK_LEAD,
    ClockWatch,
    DurableTokens,
    NodeState,
    SavedLock,
    State,
    StateDir,
    StateError,
    clockBehind,
    clusterIdentity,
    decode,
    downtime,
    encode,
)

CLUSTER = clusterIdentity(b"0123456789abcdef-secret", ["a:1", "b:2"])


def sample() -> State:
    return State(CLUSTER, "a:1", mark=1796162733994761, term=1796162000000000,
                 saved=1796162133994761,
                 locks=[SavedLock(b"orders/42", 1796162133000001, 1796162163000000,
                                  1796162133000001),
                        SavedLock(b"k \xff", 7, 8, 6, b"r"),
                        SavedLock(b"sem", 9, 10, 8, b"5")])


# -- the format, without I/O ------------------------------------------------------

def test_encode_decode_round_trip() -> None:
    state = sample()
    assert decode(encode(state), CLUSTER, "a:1") == state


def test_a_lone_node_has_no_node_entry() -> None:
    lone = clusterIdentity(b"", [])
    state = State(lone, "", mark=5)
    assert b"node -\n" in encode(state)
    assert decode(encode(state), lone, "") == state


def test_the_identity_changes_with_the_secret_and_with_the_peers() -> None:
    assert clusterIdentity(b"x" * 16, ["a:1", "b:2"]) != clusterIdentity(b"y" * 16, ["a:1", "b:2"])
    assert clusterIdentity(b"x" * 16, ["a:1", "b:2"]) != clusterIdentity(b"x" * 16, ["a:1", "c:2"])
    assert b"secret" not in clusterIdentity(b"secret" * 4, []).encode()


@pytest.mark.parametrize("cut", [1, 10, 40, 120, -70, -8, -1])
def test_every_truncation_is_refused(cut: int) -> None:
    data = encode(sample())
    with pytest.raises(StateError):
        decode(data[:cut], CLUSTER, "a:1")


def test_every_flipped_byte_is_refused() -> None:
    data = encode(sample())
    for i in range(len(data)):
        broken = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
        with pytest.raises(StateError):
            decode(broken, CLUSTER, "a:1")


@pytest.mark.parametrize("cluster, node, message", [
    (clusterIdentity(b"another-secret-0123", ["a:1", "b:2"]), "a:1", "another cluster"),
    (CLUSTER, "b:2", "belongs to node a:1, not b:2"),
])
def test_foreign_state_is_refused(cluster: str, node: str, message: str) -> None:
    with pytest.raises(StateError, match=message):
        decode(encode(sample()), cluster, node)


def test_another_format_version_and_other_files_are_refused() -> None:
    data = encode(sample()).replace(b"lockservice-state 2", b"lockservice-state 3", 1)
    with pytest.raises(StateError, match="another version"):
        decode(data, CLUSTER, "a:1")
    with pytest.raises(StateError, match="not a lockservice state file"):
        decode(b"\x00" * 100, CLUSTER, "a:1")
    with pytest.raises(StateError, match="not a lockservice state file"):
        decode(b"", CLUSTER, "a:1")


def test_a_well_checksummed_but_bad_body_is_refused() -> None:
    """
    A file with a valid checksum but nonsense in it (a bug, a hand edit):
    refused whole, never half-loaded.
    """
    import hashlib

    def signed(body: bytes) -> bytes:
        return body + b"sha256 " + hashlib.sha256(body).hexdigest().encode() + b"\n"

    good = encode(sample())
    body = good[:good.rfind(b"sha256 ")]
    for old, new, why in [
        (b"locks 3", b"locks 4", "header says 4"),
        (b"mark 1796162733994761", b"mark -1", "bad mark"),
            (b"term ", b"turn ", "bad header"),
        (b"mark 1796162733994761", b"mark 99999999999999999999", "bad mark"),
        (b" r - -\n", b" w - -\n", "bad share"),
        (b"L 6f72", b"L zz72", "bad key"),
        (b" r - -\n", b" r - x\n", "bad lock-delay mark"),
        (b" r - -\n", b" r zz -\n", "bad key or holder"),
        (b"boot - 0", b"boot - x", "bad boot time"),
    ]:
        with pytest.raises(StateError, match=why):
            decode(signed(body.replace(old, new, 1)), CLUSTER, "a:1")


# -- the token mark ------------------------------------------------------------------

def test_durable_tokens_record_a_mark_once_per_lead() -> None:
    now = [1_000_000]
    recorded: List[int] = []

    def record(token: int) -> None:
        recorded.append(token)
        tokens.mark = token + MARK_LEAD

    tokens = DurableTokens(lambda: now[0], 0, 0, record)
    first = tokens.issue()
    assert recorded == [first]
    for _ in range(1000):
        now[0] += 1000  # a grant every millisecond
        tokens.issue()
    assert recorded == [first]  # one second of tokens: no new mark
    now[0] += MARK_LEAD
    tokens.issue()
    assert len(recorded) == 2


def test_durable_tokens_record_before_a_learned_token_passes_the_mark() -> None:
    recorded: List[int] = []
    tokens = DurableTokens(lambda: 0, 0, 100, recorded.append)
    tokens.observe(50)
    assert recorded == [] and tokens.last == 50
    tokens.observe(500)
    assert recorded == [500] and tokens.last == 500


def test_durable_tokens_issue_like_the_plain_issuer() -> None:
    now = [10]
    plain = TokenIssuer(lambda: now[0])
    durable = DurableTokens(lambda: now[0], 0, 2**63, lambda token: None)
    for step in [5, 0, 0, 3, -20, 100]:
        now[0] += step
        assert durable.issue() == plain.issue()


# -- the directory ---------------------------------------------------------------------

def test_write_is_atomic_and_read_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    directory = StateDir(str(tmp_path / "s"), CLUSTER, "a:1")
    assert directory.open() is None
    directory.write(sample())
    assert sorted(os.listdir(tmp_path / "s")) == ["lock", "state"]  # no temporary left
    again = StateDir(str(tmp_path / "s"), CLUSTER, "a:1")
    directory._lock and os.close(directory._lock)  # the first node is gone
    assert again.open() == sample()


def test_a_directory_in_use_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    StateDir(str(tmp_path), CLUSTER, "a:1").open()
    with pytest.raises(StateError, match="in use by another running node"):
        StateDir(str(tmp_path), CLUSTER, "a:1").open()


def test_a_refused_file_is_named_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "state").write_bytes(encode(sample())[:-20])
    with pytest.raises(StateError) as caught:
        StateDir(str(tmp_path), CLUSTER, "a:1").open()
    text = str(caught.value)
    assert "\n" not in text
    assert str(tmp_path / "state") in text and "checksum" in text and "move it away" in text


# -- a node's state: marks, saved locks ------------------------------------------------

def _node(tmp_path, now: List[int], clock: Clock,  # type: ignore[no-untyped-def]
          boot: Any = None):
    """
    A node whose wall clock reads C{now[0]}; its boot clock runs with it
    (one boot) unless C{boot} says otherwise.
    """
    locks = LockService(clock, lambda: now[0])
    if boot is None:
        boot = lambda: ("boot-1", now[0])  # noqa: E731
    state = NodeState(StateDir(str(tmp_path), CLUSTER, "a:1"), lambda: now[0], boot=boot)
    return locks, state


def test_downtime_within_one_boot_ignores_the_wall_clock() -> None:
    # Same boot: the boot clock says 4 s, whatever the wall clock did.
    assert downtime(100_000_000, ("b", 50_000_000), 100_000_000 - 3600_000_000,
                    ("b", 54_000_000)) == 4_000_000
    # Another boot: the wall clock, when it is not behind the save.
    assert downtime(100_000_000, ("b", 50_000_000), 107_000_000, ("c", 1)) == 7_000_000
    # Another boot and a wall clock behind the save: unknown.
    assert downtime(100_000_000, ("b", 50_000_000), 99_000_000, ("c", 1)) is None
    assert downtime(100_000_000, None, 99_000_000, None) is None


def test_a_lease_that_ran_out_while_down_stays_expired_after_a_wall_clock_step(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Granted 3 s, down 4 s, started with the wall clock an hour behind: on
    the same boot the boot clock says 4 s went by, so the lease is gone
    (the wall clock alone would have brought it back).
    """
    now, booted = [5_000_000_000_000], [1_000_000_000]
    boot = lambda: ("boot-1", booted[0])  # noqa: E731
    locks, state = _node(tmp_path, now, Clock(), boot)
    state.start(locks)
    locks.installHolder(b"k", 11, 3.0)
    locks.installHolder(b"long", 12, 60.0)
    assert state.stopped(locks, keepLocks=True) == 2
    os.close(state.directory._lock)  # type: ignore[arg-type]
    booted[0] += 4_000_000
    now[0] -= 3600 * 1_000_000
    locks, state = _node(tmp_path, now, Clock(), boot)
    assert state.start(locks) == (1, 1)
    assert locks.table.tokenOf(b"k") is None
    assert locks.table.expiresAt(b"long") == pytest.approx(56.0)


def test_after_a_reboot_with_the_wall_clock_behind_every_saved_lease_is_expired(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [5_000_000_000_000]
    locks, state = _node(tmp_path, now, Clock(), lambda: ("boot-1", 7))
    state.start(locks)
    locks.installHolder(b"long", 12, 600.0)
    assert state.stopped(locks, keepLocks=True) == 1
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] -= 10 * 1_000_000
    locks, state = _node(tmp_path, now, Clock(), lambda: ("boot-2", 3))
    assert state.start(locks) == (0, 1)
    assert len(locks.table) == 0


def test_holder_names_and_lock_delay_places_survive_a_restart(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [5_000_000_000_000]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    locks.installHolder(b"named", 11, 30.0, name=b"billing#1")
    locks.installHolder(b"delayed", 12, 8.0, name=b"x", delayed=True)
    assert state.stopped(locks, keepLocks=True) == 2
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] += 2_000_000
    locks, state = _node(tmp_path, now, Clock())
    assert state.start(locks) == (2, 0)
    assert locks.table.newest(b"named") == (11, b"billing#1")
    assert locks.table.newest(b"delayed") == (0, None)  # a place, not a grant
    assert locks.table.delayedUntil(b"delayed") == pytest.approx(6.0)


def test_a_format_1_file_of_the_previous_version_is_read() -> None:
    import hashlib

    body = (b"lockservice-state 1\ncluster " + CLUSTER.encode() + b"\nnode a:1\nmark 5\n"
            b"term 0\nsaved 100\nlocks 1\nL 6b 7 200 50 r\n")
    data = body + b"sha256 " + hashlib.sha256(body).hexdigest().encode() + b"\n"
    state = decode(data, CLUSTER, "a:1")
    assert state.boot is None and state.saved == 100
    assert state.locks == [SavedLock(b"k", 7, 200, 50, b"r")]


def test_tokens_rise_across_a_restart_with_the_clock_behind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [1796162733994761]
    clock = Clock()
    locks, state = _node(tmp_path, now, clock)
    state.start(locks)
    before = locks.table.tokens.issue()
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] -= 600 * 1_000_000  # restarted with the clock ten minutes behind
    locks, state = _node(tmp_path, now, clock)
    state.start(locks)
    after = locks.table.tokens.issue()
    assert after > before


def test_a_write_failure_is_logged_once_and_retried_later(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [1_000_000_000]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    writes: List[State] = []

    def failing(_: State) -> None:
        writes.append(_)
        raise OSError(28, "No space left on device")

    state.directory.write = failing  # type: ignore[method-assign]
    now[0] += 2 * MARK_LEAD
    for _ in range(100):
        locks.table.tokens.issue()
    assert len(writes) == 1  # not one write per grant


def test_saved_locks_keep_their_wall_clock_deadline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [1_000_000_000_000]
    clock = Clock()
    locks, state = _node(tmp_path, now, clock)
    state.start(locks)
    locks.installHolder(b"long", 11, 30.0)
    locks.installHolder(b"short", 12, 5.0)
    assert state.stopped(locks, keepLocks=True) == 2
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] += 10 * 1_000_000  # down for ten seconds
    clock = Clock()
    locks, state = _node(tmp_path, now, clock)
    assert state.start(locks) == (1, 1)
    assert locks.table.tokenOf(b"long") == 11 and locks.table.tokenOf(b"short") is None
    assert locks.table.expiresAt(b"long") == pytest.approx(20.0)
    # The table left the file at this start: a crash now brings nothing back.
    os.close(state.directory._lock)  # type: ignore[arg-type]
    locks, state = _node(tmp_path, now, Clock())
    assert state.start(locks) == (0, 0)


def test_a_clock_behind_does_not_lengthen_a_saved_lease(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [1_000_000_000_000]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    locks.installHolder(b"k", 11, 30.0)
    state.stopped(locks, keepLocks=True)
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] -= 600 * 1_000_000
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    assert locks.table.expiresAt(b"k") == pytest.approx(30.0)


# -- a clock behind the tokens (without --state-dir) ------------------------------------

def test_clock_behind_warns_only_well_behind_and_never_with_a_mark() -> None:
    tokens = TokenIssuer(lambda: 0)
    tokens.observe(100_000_000)
    assert clockBehind(tokens, 96_000_000) is None
    warning = clockBehind(tokens, 40_000_000)
    assert warning is not None and "60 s behind" in warning and "--state-dir" in warning
    durable = DurableTokens(lambda: 0, 100_000_000, 0, lambda token: None)
    assert clockBehind(durable, 40_000_000) is None


def test_clock_watch_logs_once_each_way() -> None:
    from twisted.logger import globalLogPublisher

    seen: List[str] = []

    def observer(event: dict) -> None:
        if event.get("log_namespace", "").startswith("lockservice.state"):
            seen.append(event.get("why") or event["log_format"])

    clock = Clock()
    now = [1000 * 1_000_000]
    tokens = TokenIssuer(lambda: now[0])
    watch = ClockWatch(clock, lambda: tokens, lambda: now[0])
    globalLogPublisher.addObserver(observer)
    try:
        watch.startService()
        tokens.observe(now[0] + 600 * 1_000_000)  # a peer ten minutes ahead
        for _ in range(5):
            clock.advance(watch.interval)
        assert len(seen) == 1 and "600 s behind" in seen[0]
        assert watch.warning == seen[0]
        now[0] += 700 * 1_000_000
        for _ in range(5):
            clock.advance(watch.interval)
        assert len(seen) == 2 and watch.warning is None
        watch.stopService()
        assert not clock.getDelayedCalls()
    finally:
        globalLogPublisher.removeObserver(observer)


def test_status_shows_one_clock_warning() -> None:
    """
    /status has one C{clock_warning}: the cluster's suspicion of its own
    clock (a peer far ahead) when there is one, else a clock behind the
    tokens.
    """
    import time
    from types import SimpleNamespace

    from lockservice.server.webpages import status

    locks = LockService(Clock(), lambda: 0)
    assert status(locks, None)["clock_warning"] is None
    locks.observeToken(time.time_ns() // 1000 + 60 * 1_000_000)
    assert "60 s behind" in status(locks, None)["clock_warning"]
    cluster = SimpleNamespace(myEntry=b"a:1", peers=[b"a:1"], term=0, views={}, lastHeard={},
                              activeAddress=lambda: None, clockSuspect="a peer is 2.0 h ahead")
    assert status(locks, cluster)["clock_warning"] == "a peer is 2.0 h ahead"  # type: ignore[arg-type]


def test_a_crash_loop_moves_tokens_ahead_by_about_a_second_per_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    A node that crashes right after each first grant (systemd restarting
    it): its tokens must not run ten minutes further ahead of the clock at
    every restart, or six restarts would put them beyond the hour its
    peers accept.
    """
    now = [1796162733994761]
    first = None
    for _ in range(20):
        locks, state = _node(tmp_path, now, Clock())
        state.start(locks)
        token = locks.table.tokens.issue()
        first = first or token
        os.close(state.directory._lock)  # type: ignore[arg-type]  (kill -9)
        now[0] += 1000
    assert token - now[0] < MARK_LEAD + 21 * 1_000_000


def test_a_graceful_stop_records_the_exact_highest_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    now = [1796162733994761]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    before = locks.table.tokens.issue()
    assert state.stopped(locks, keepLocks=False) == 0
    os.close(state.directory._lock)  # type: ignore[arg-type]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    assert locks.table.tokens.last == before  # not ten minutes ahead
    assert locks.table.tokens.issue() > before


def test_shared_grants_survive_a_restart_with_their_share(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """
    Issue 24: the saved table keeps every reader's and every semaphore
    slot's grant, each with its own token and deadline, and its kind.
    """
    now = [1_000_000_000_000]
    locks, state = _node(tmp_path, now, Clock())
    state.start(locks)
    locks.installHolder(b"doc", 11, 30.0, share=READ)
    locks.installHolder(b"doc", 12, 20.0, share=READ)
    locks.installHolder(b"pool", 13, 30.0, share=3)
    locks.installHolder(b"pool", 14, 5.0, share=3)
    locks.installHolder(b"solo", 15, 30.0)
    assert state.stopped(locks, keepLocks=True) == 5
    os.close(state.directory._lock)  # type: ignore[arg-type]
    now[0] += 10 * 1_000_000  # down for ten seconds: pool's 14 ran out
    locks, state = _node(tmp_path, now, Clock())
    assert state.start(locks) == (4, 1)
    grants = sorted(locks.table.everyGrant(), key=lambda g: g[1])
    assert [(key, token, share) for key, token, _, _, share, _, _ in grants] == [
        (b"doc", 11, READ), (b"doc", 12, READ), (b"pool", 13, 3), (b"solo", 15, EXCLUSIVE)]
    assert [expires for _, _, _, expires, *_ in grants] == pytest.approx([20.0, 10.0, 20.0, 20.0])


def test_a_file_of_the_secret_being_rotated_out_is_read_and_rewritten_under_the_new(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    peers = ["a:1", "b:2"]
    old = clusterIdentity(b"old-secret-0123456789", peers)
    new = clusterIdentity(b"new-secret-0123456789", peers)
    (tmp_path / "state").write_bytes(encode(State(old, "a:1", mark=77)))
    with pytest.raises(StateError, match="another cluster"):
        decode((tmp_path / "state").read_bytes(), new, "a:1")
    directory = StateDir(str(tmp_path), new, "a:1", [old])
    state = directory.open()
    assert state is not None and state.mark == 77 and state.cluster == new
    directory.write(state)
    assert decode((tmp_path / "state").read_bytes(), new, "a:1").mark == 77
