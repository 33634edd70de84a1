"""Retention, archive and idle expiry against a real Redis, the dispatcher driven by hand
(docs/operations.md, "Retention and archive"): a closed session is archived, then every key
of it and every entry naming it is deleted once its retention ends; an open session idle too
long is closed, never one waiting on an interrupt with a deadline."""

import time
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import AppInfo, Lifecycle
from parley.runtime import metrics
from parley.schemas.listing import listing_entries
from parley.schemas.state import Core
from tests.integration.conftest import KEYS, NO_DECIDE, MakeDispatcher, post_outcome, send, tick, types

FAR = 1e12  # a sweep's last check this far in the monotonic future: not due until the test says


def hold_sweeps(d: Dispatcher) -> None:
    """Only the sweeps a test calls itself run (a tick runs whichever is due)."""
    d.sweeps.expire_checked = d.sweeps.idle_checked = FAR


def idle_sweep(d: Dispatcher) -> None:
    d.sweeps.idle_checked = 0.0
    d.sweeps.close_idle_sessions()


def expire_sweep(d: Dispatcher) -> None:
    d.sweeps.expire_checked = 0.0
    d.sweeps.expire_sessions()


def all_keys(r: redis.Redis) -> set[str]:
    return {k.decode() for k in r.scan_iter(match="*", count=1000)}


def core_of(r: redis.Redis, session: str) -> Core:
    return Core.model_validate_json(r.hget(KEYS.meta(session), "core") or b"")


def run_to_the_end(r: redis.Redis, d: Dispatcher, session: str, metadata: dict[str, Any]) -> None:
    """A session created with metadata, a message, its model call answered: its turn over."""
    send(r, session, {"type": "session.create", "metadata": metadata}, id=f"create-{session}")
    send(r, session, {"type": "message.create", "content": "hi"}, id=f"hi-{session}")
    tick(d)
    post_outcome(r, session=session, work="llm-1", attempt=1, kind="llm", ok=True,
                 value={"content": "hello", "tool_calls": []})
    tick(d)
    assert types(r, session)[-1] == "turn.completed"


def list_session(r: redis.Redis, session: str) -> set[tuple[str, str]]:
    """The listing entries of the closed session as the list of sessions keeps them (written
    here the way its effects would): what expiry must take away."""
    entries = listing_entries(KEYS, core_of(r, session))
    for zset, member in entries:
        r.zadd(zset, {member: 0})
    return entries


def close_idle(r: redis.Redis, d: Dispatcher, sessions: list[str]) -> None:
    """The idle sweep's closes written and applied (the sessions' idle time is 1 ms)."""
    time.sleep(0.01)
    while r.zcard(KEYS.idle):  # LIFECYCLE_BATCH closes a step
        idle_sweep(d)
        tick(d)
    for s in sessions:
        assert core_of(r, s).status == "closed", types(r, s)


@pytest.fixture
def retiring(make_dispatcher: MakeDispatcher) -> Dispatcher:
    """A dispatcher whose sessions go idle after 1 ms and expire right at their close."""
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1))
    hold_sweeps(d)
    return d


def test_closed_sessions_expire_and_leave_no_key_behind(r: redis.Redis, retiring: Dispatcher) -> None:
    d = retiring
    before = all_keys(r)
    sessions = [f"done-{i}" for i in range(5)]
    listed: dict[str, set[tuple[str, str]]] = {}
    for s in sessions:
        run_to_the_end(r, d, s, {"team": "blue", "n": int(s[-1])})
    assert r.zcard(KEYS.idle) == len(sessions)
    close_idle(r, d, sessions)
    for s in sessions:
        listed[s] = list_session(r, s)
        assert types(r, s)[-1] == "session.closed"
        # its used idempotency keys (two of the producer's, the engine's close) are among its
        # own keys, deleted with it
        assert r.zcard(KEYS.idempotency_keys(s)) == 3
    assert r.zcard(KEYS.expiring) == len(sessions) and r.zcard(KEYS.idle) == 0
    expired = metrics.SESSIONS_EXPIRED._value.get()
    expire_sweep(d)
    assert metrics.SESSIONS_EXPIRED._value.get() - expired == len(sessions)
    left = all_keys(r)
    assert not [k for k in left if any(f"{{{s}}}" in k for s in sessions)]
    for s in sessions:
        for zset, member in listed[s]:
            assert r.zscore(zset, member) is None
    # what remains is the fleet's own bookkeeping, the archive, and no set left empty (the model
    # jobs no worker ran here stay queued, with their in-flight records: RQ's and the queues')
    left = {k for k in left if not k.startswith(("rq:", KEYS.inflight))}
    assert left - before <= {KEYS.archive, KEYS.feed, KEYS.inputs(), KEYS.results(), KEYS.stats,
                             KEYS.dispatchers, KEYS.config, KEYS.engine_key, KEYS.lease(0)}, left - before
    assert not r.exists(KEYS.expiring) and not r.exists(KEYS.idle)
    assert not r.exists(KEYS.sessions_of_status("closed"), KEYS.sessions_of_metadata("team", "blue"))


def test_the_archive_entry_holds_the_whole_session(r: redis.Redis, retiring: Dispatcher) -> None:
    d = retiring
    run_to_the_end(r, d, "arch", {"team": "red"})
    close_idle(r, d, ["arch"])
    [(_id, fields)] = r.xrange(KEYS.archive)
    assert fields[b"session"] == b"arch"
    closed_at = core_of(r, "arch").closed_at
    assert int(fields[b"closed_at"]) == closed_at
    doc = orjson.loads(fields[b"document"])
    assert doc["session"] == "arch" and doc["core"]["status"] == "closed"
    assert doc["core"]["metadata"] == {"team": "red"} and doc["core"]["closed_at"] == closed_at
    assert sorted((m["role"], m["content"]) for m in doc["messages"]) == [
        ("assistant", "hello"), ("user", "hi")]
    stream = [(i.decode(), orjson.loads(f[b"event"])) for i, f in r.xrange(KEYS.events("arch"))]
    assert [(e["id"], e["event"]) for e in doc["events"]] == stream
    assert doc["events"][-1]["event"]["type"] == "session.closed"
    expire_sweep(d)
    assert r.xlen(KEYS.archive) == 1  # the archive outlives the session


def test_without_the_archive_nothing_is_written_and_sessions_still_expire(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1), archive_maxlen=0)
    hold_sweeps(d)
    run_to_the_end(r, d, "quiet", {})
    close_idle(r, d, ["quiet"])
    assert not r.exists(KEYS.archive)
    expire_sweep(d)
    assert not r.exists(*KEYS.session_keys("quiet"))


def test_the_archive_is_capped_near_archive_maxlen(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1), archive_maxlen=5)
    hold_sweeps(d)
    sessions = [f"cap-{i}" for i in range(300)]
    for s in sessions:
        send(r, s, {"type": "session.create"})
    tick(d)
    close_idle(r, d, sessions)
    assert 5 <= r.xlen(KEYS.archive) < 300  # approximate trim (MAXLEN ~): whole nodes


def test_a_session_is_kept_until_its_retention_ends(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=3_600_000, idle_timeout_ms=1))
    hold_sweeps(d)
    run_to_the_end(r, d, "kept", {})
    close_idle(r, d, ["kept"])
    until = r.zscore(KEYS.expiring, "kept")
    assert until == core_of(r, "kept").closed_at + 3_600_000  # type: ignore[operator]
    expire_sweep(d)
    assert r.exists(KEYS.meta("kept")) and r.zscore(KEYS.expiring, "kept") == until


def test_a_session_that_moved_on_since_it_was_read_is_retried_not_half_deleted(
        r: redis.Redis, retiring: Dispatcher) -> None:
    d = retiring
    run_to_the_end(r, d, "busy", {"team": "blue"})
    close_idle(r, d, ["busy"])
    listed = list_session(r, "busy")
    read = d.sweeps.read_sessions(d.sweeps.due_expiring(int(time.time() * 1000)))
    assert [s for s, _v, _c in read] == ["busy"]
    # between the read and the delete, a late input reaches the closed session (refused)
    send(r, "busy", {"type": "branch.switch", "head": "msg-1"})
    tick(d)
    assert types(r, "busy")[-1] == "input.refused"
    assert d.sweeps.expire(read) == 0
    assert all(r.exists(k) for k in (KEYS.meta("busy"), KEYS.messages("busy"), KEYS.events("busy")))
    assert all(r.zscore(z, m) is not None for z, m in listed) and r.zscore(KEYS.expiring, "busy")
    # the next step reads it again and deletes it whole
    expire_sweep(d)
    assert not r.exists(*KEYS.session_keys("busy"))
    assert all(r.zscore(z, m) is None for z, m in listed) and not r.exists(KEYS.expiring)


def test_a_second_sweep_is_a_no_op(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    lifecycle = Lifecycle(retention_ms=0, idle_timeout_ms=1)
    d1, d2 = make_dispatcher(name="d1", lifecycle=lifecycle), make_dispatcher(name="d2", lifecycle=lifecycle)
    hold_sweeps(d1)
    hold_sweeps(d2)
    run_to_the_end(r, d1, "once", {})
    close_idle(r, d1, ["once"])
    read_by_d2 = d2.sweeps.read_sessions(d2.sweeps.due_expiring(int(time.time() * 1000)))
    expired = metrics.SESSIONS_EXPIRED._value.get()
    expire_sweep(d1)
    assert metrics.SESSIONS_EXPIRED._value.get() - expired == 1
    keys = all_keys(r)
    assert d2.sweeps.expire(read_by_d2) == 0  # d2 read it before d1 deleted it: nothing to do
    expire_sweep(d2)
    expire_sweep(d1)
    assert metrics.SESSIONS_EXPIRED._value.get() - expired == 1 and all_keys(r) == keys


# ---- idle expiry --------------------------------------------------------------------------------


WAITS = AppInfo(has_decide=True, decide_on=frozenset({"session.created"}), tools=NO_DECIDE.tools)


def raise_global_interrupt(r: redis.Redis, d: Dispatcher, session: str, **interrupt: Any) -> None:
    send(r, session, {"type": "session.create"})
    tick(d)
    post_outcome(r, session=session, work="dec-1", attempt=1, kind="decide", ok=True,
                 value={"actions": [{"type": "interrupt", "reason": "wait", **interrupt}]})
    tick(d)
    assert types(r, session)[-1] == "interrupt.raised"


def test_idle_expiry_closes_an_idle_session_never_one_waiting_on_a_deadline(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(WAITS, lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1))
    hold_sweeps(d)
    raise_global_interrupt(r, d, "deadline", timeout_s=3600)
    raise_global_interrupt(r, d, "no-deadline")  # waits for a human with no deadline: idle
    assert r.zscore(KEYS.idle, "deadline") is None and r.zscore(KEYS.idle, "no-deadline")
    time.sleep(0.01)
    closes = metrics.IDLE_CLOSES._value.get()
    idle_sweep(d)
    assert metrics.IDLE_CLOSES._value.get() - closes == 1
    tick(d)
    assert types(r, "no-deadline")[-2:] == ["interrupt.cancelled", "session.closed"]
    assert r.zcard(KEYS.interrupt_index) == 1  # the cancelled one left the index
    assert core_of(r, "deadline").status == "open" and types(r, "deadline")[-1] == "interrupt.raised"
    expire_sweep(d)
    assert not r.exists(*KEYS.session_keys("no-deadline")) and r.exists(KEYS.meta("deadline"))


def test_a_session_active_after_the_idle_close_was_written_ignores_it(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=200))
    hold_sweeps(d)
    send(r, "lively", {"type": "session.create"})
    tick(d)
    time.sleep(0.25)
    idle_sweep(d)  # the close is written ...
    send(r, "lively", {"type": "message.create", "content": "still here"})  # ... but not first
    idle_sweep(d)  # written once: the member left the idle set with it
    stream = KEYS.inputs()
    closes = [f for _i, f in r.xrange(stream) if b"session.close" in f[b"input"]]
    assert len(closes) == 1 and closes[0][b"principal"] == b"parley.engine"
    # the closes are applied in stream order: the close first (still idle: closed) -- so
    # write the message before it instead, as a session busy at the last moment would be
    r.delete(stream)
    r.xgroup_create(stream, KEYS.GROUP, id="0", mkstream=True)
    send(r, "lively", {"type": "message.create", "content": "still here"})
    r.xadd(stream, closes[0])
    tick(d)
    assert [e for e in types(r, "lively") if e.startswith("input.")] == ["input.ignored"]
    assert core_of(r, "lively").status == "open"
    # not idle: the message's model call is in flight (no worker runs here), which keeps it awake
    assert r.zscore(KEYS.idle, "lively") is None and core_of(r, "lively").work


def test_expiry_works_after_redis_lost_its_scripts(r: redis.Redis, retiring: Dispatcher) -> None:
    d = retiring
    run_to_the_end(r, d, "flushed", {})
    close_idle(r, d, ["flushed"])
    r.script_flush()  # a restarted Redis: the expiry script must be loaded again
    expire_sweep(d)
    assert not r.exists(*KEYS.session_keys("flushed"))


def test_what_arrives_after_expiry_leaves_only_keys_that_expire(r: redis.Redis,
                                                                make_dispatcher: MakeDispatcher) -> None:
    """A late tool result, a second close, a tool.result, a resume, a message refused by a bad
    signature: all of them name a session that expired. Each is answered on the session's
    events for a short while (a client waiting sees it), and no key of it stays for good."""
    d = make_dispatcher(lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1), unknown_session_ttl_ms=60_000)
    hold_sweeps(d)
    run_to_the_end(r, d, "gone", {"team": "blue"})
    close_idle(r, d, ["gone"])
    expire_sweep(d)
    assert not [k for k in all_keys(r) if "{gone}" in k]
    post_outcome(r, session="gone", work="call-1", attempt=1, kind="tool", ok=True, value="late")
    send(r, "gone", {"type": "session.close"})
    send(r, "gone", {"type": "tool.result", "call_id": "call-1", "result": 1}, id="k-1")
    send(r, "gone", {"type": "interrupt.resume", "interrupt_id": "int-1"}, id="k-2")
    send(r, "gone", {"type": "branch.switch", "head": "msg-1"}, sig="forged", principal="x", ts="1", id="k-3")
    tick(d)
    keys = [k for k in all_keys(r) if "{gone}" in k]
    assert keys, "the refusals and ignores are readable for a while"
    assert all(0 < r.pttl(k) <= 60_000 for k in keys), {k: r.pttl(k) for k in keys}
    assert {e for e in types(r, "gone")} >= {"input.ignored", "input.refused"}
