"""Producers' own input streams against a real Redis: the registry, reading every producer's
streams, tenants, the pending counts, fairness (docs/operations.md "Producers", docs/design.md
"Consuming streams"), and the `parley producers` commands."""

from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.apply import SESSION_DEPTH
from parley.dispatcher.consume import Dispatcher
from parley.schemas.producers import new_producer
from tests.integration.conftest import KEYS, MakeDispatcher, events, pending_count, send, tick, types
from tests.integration.test_cli_errors import run_parley


def register(r: redis.Redis, name: str, tenant: str | None = None) -> str:
    r.hset(KEYS.producers, name, new_producer(name, tenant).to_json())
    return KEYS.producer_inputs(name)


def reread(d: Dispatcher) -> None:
    """The registry is read every couple of seconds: now, for the test."""
    d.registry.expire()


def message(text: str) -> dict[str, Any]:
    return {"type": "message.create", "content": text}


def test_every_registered_producers_stream_is_read(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    web, crm = register(r, "web"), register(r, "crm", "acme")
    d = make_dispatcher()
    send(r, "s-1", message("from web"), stream=web)
    send(r, "acme/s-2", message("from crm"), stream=crm)
    send(r, "s-3", message("from the engine's stream"))
    tick(d)
    for session in ("s-1", "acme/s-2", "s-3"):
        assert types(r, session)[:2] == ["session.created", "message.created"], session
    # acknowledged and deleted, as on the engine's own stream
    assert r.xlen(web) == r.xlen(crm) == 0
    assert pending_count(r, web) == pending_count(r, crm) == 0
    applied = orjson.loads(r.hget(KEYS.meta("acme/s-2"), "applied"))
    assert list(applied) == [crm]  # the applied marker is per stream


def test_partitioned_producer_streams_are_read_per_partition(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    register(r, "web")
    d = make_dispatcher(partitions=2)
    sessions = [f"s-{i}" for i in range(6)]
    for s in sessions:
        send(r, s, message("hi"), stream=KEYS.producer_inputs("web", _partition(s, 2), 2))
    tick(d)
    assert set(d.leases.owned[0].streams) >= {KEYS.producer_inputs("web", 0, 2)}
    for s in sessions:
        assert "message.created" in types(r, s), s


def _partition(session: str, n: int) -> int:
    from parley.schemas.keys import partition_of

    return partition_of(session, n)


def test_a_producer_added_while_running_is_read_and_its_earlier_entries_too(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    tick(d)
    late = KEYS.producer_inputs("late")
    send(r, "s-early", message("written before it was registered"), stream=late)
    tick(d)
    assert types(r, "s-early") == []  # not registered: not read
    register(r, "late")
    reread(d)
    tick(d)
    assert "message.created" in types(r, "s-early")
    send(r, "s-later", message("after"), stream=late)
    tick(d)
    assert "message.created" in types(r, "s-later")


def test_a_removed_producer_is_read_until_drained_then_dropped(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    web = register(r, "web")
    d = make_dispatcher()
    tick(d)
    assert web in d.leases.owned[0].streams
    send(r, "s-1", message("last words"), stream=web)
    r.hdel(KEYS.producers, "web")
    reread(d)
    tick(d, 1)
    assert "message.created" in types(r, "s-1")
    reread(d)
    tick(d, 1)
    assert web not in d.leases.owned[0].streams


def test_a_scoped_producer_naming_another_tenants_session_is_refused_wrong_tenant(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    crm = register(r, "crm", "acme")
    d = make_dispatcher()
    bad = send(r, "globex/s-1", message("not mine"), stream=crm)
    untenanted = send(r, "s-1", message("no tenant"), stream=crm)
    invalid = send(r, "globex/s-2", {"type": "nonsense"}, stream=crm)
    good = send(r, "acme/s-1", message("mine"), stream=crm)
    tick(d)
    rejected = {f[b"entry"].decode(): f[b"error"].decode() for _id, f in r.xrange(KEYS.rejected)}
    assert rejected[bad].startswith("wrong_tenant: producer crm may write only sessions of tenant acme")
    assert rejected[untenanted].startswith("wrong_tenant")
    assert invalid in rejected
    # nothing at all written into the other tenant's (or no tenant's) session, not even a refusal
    for session in ("globex/s-1", "s-1", "globex/s-2"):
        assert r.exists(KEYS.events(session), KEYS.meta(session)) == 0, session
    assert "message.created" in types(r, "acme/s-1")
    assert r.xlen(crm) == 0 and pending_count(r, crm) == 0
    assert good not in rejected


def test_an_unscoped_producer_may_write_any_tenants_session(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    ops = register(r, "ops")
    d = make_dispatcher()
    send(r, "globex/s-1", message("hi"), stream=ops)
    tick(d)
    assert "message.created" in types(r, "globex/s-1")


def test_the_pending_count_goes_down_once_per_admitted_entry_across_a_crash(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    web = register(r, "web")
    pending = KEYS.pending("web")
    # what the submit function does: count the input, then append it marked admitted
    r.hset(pending, mapping={"s-1": 3, "s-2": 1})
    send(r, "s-1", message("one"), stream=web, admitted="1")
    send(r, "s-1", {"type": "branch.switch", "head": "nowhere"}, stream=web, admitted="1")
    send(r, "s-1", message("not counted"), stream=web)  # appended straight, not admitted
    send(r, "s-2", {"type": "nonsense"}, stream=web, admitted="1")  # rejected: done too
    d1 = make_dispatcher(name="d1")

    def crash(batch: list, **kw: Any) -> None:
        raise RuntimeError("killed between commit and settle")

    monkeypatch.setattr(d1.outbox, "flush_many", crash)
    with pytest.raises(RuntimeError, match="killed between commit and settle"):
        tick(d1, 1)
    # committed, not acknowledged: still pending, still counted (the rejection settled by itself)
    assert "message.created" in types(r, "s-1")
    assert r.hgetall(pending) == {b"s-1": b"3"}

    r.delete(KEYS.lease(0))  # d1 is dead
    d2 = make_dispatcher(name="d2")
    tick(d2)
    assert d2.stats.replays == 3
    assert r.hget(pending, "s-1") == b"1"  # two admitted entries done, once each
    assert r.xlen(web) == 0
    tick(d2)
    assert r.hget(pending, "s-1") == b"1"
    send(r, "s-1", message("last"), stream=web, admitted="1")
    tick(d2)
    assert r.exists(pending) == 0  # the field goes at zero, and the hash with it


def test_a_flooded_session_does_not_hold_up_another_producers_session(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    flood, web = register(r, "flood"), register(r, "web")
    d = make_dispatcher()
    tick(d, 1)  # leases and streams in place
    first = [send(r, "s-flood", {"type": "branch.switch", "head": "nowhere"}, stream=flood)
             for _ in range(300)]
    send(r, "s-other", message("me too"), stream=web)
    waves = d.stats.waves
    tick(d, 1)
    # the other session was served in the first tick, after at most the flood's share of waves
    assert "message.created" in types(r, "s-other")
    assert d.stats.waves - waves <= SESSION_DEPTH + 1
    # the flood goes on, in order, none lost nor applied twice
    ticks = 1
    while r.xlen(flood) and ticks < 200:
        tick(d, 1)
        ticks += 1
    assert r.xlen(flood) == 0 and pending_count(r, flood) == 0
    refused = [e["input"]["entry"] for e in events(r, "s-flood") if e["type"] == "input.refused"]
    assert refused == first
    assert d.backlog == {}


def test_the_same_stream_a_flooded_session_leaves_room_for_the_others(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    web = register(r, "web")
    d = make_dispatcher()
    tick(d, 1)
    first = [send(r, "s-flood", {"type": "branch.switch", "head": "nowhere"}, stream=web)
             for _ in range(50)]
    send(r, "s-other", message("me too"), stream=web)
    waves = d.stats.waves
    tick(d, 1)
    assert "message.created" in types(r, "s-other")
    assert d.stats.waves - waves <= SESSION_DEPTH
    assert len(d.backlog[web]) == 50 - SESSION_DEPTH
    assert pending_count(r, web) == 50 - SESSION_DEPTH  # held back, not acknowledged
    # a dispatcher that dies with a backlog leaves it pending: the next owner applies it, in order
    r.delete(KEYS.lease(0))
    d2 = make_dispatcher(name="d2")
    for _ in range(20):
        tick(d2, 1)
    refused = [e["input"]["entry"] for e in events(r, "s-flood") if e["type"] == "input.refused"]
    assert refused == first
    assert r.xlen(web) == 0


def test_a_stream_holding_back_more_bytes_than_its_bound_is_not_read_further(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """Entries held back count in bytes too (all their fields): a flood of big entries of one
    session stops the reading of its stream at BACKLOG_BYTES, not at 10,000 entries."""
    web = register(r, "web")
    d = make_dispatcher()
    d.BACKLOG_BYTES = 500_000
    tick(d, 1)
    big = {"session": "s-flood", "input": orjson.dumps({"type": "branch.switch", "head": "nowhere"}),
           "pad": b"p" * 50_000}  # a field the dispatcher never reads, held all the same
    first = [r.xadd(web, big).decode() for _ in range(40)]
    tick(d, 1)
    held = d.backlog[web]
    assert len(held) == 40 - SESSION_DEPTH
    assert web not in d.read_streams()  # full in bytes: not read further
    assert sum(h.size for h in held) > d.BACKLOG_BYTES
    later = send(r, "s-later", message("behind the flood"), stream=web)
    tick(d, 1)
    assert later not in [h.entry_id for h in d.backlog[web]]  # not read while the bytes are held
    for _ in range(20):
        tick(d, 1)
    assert "message.created" in types(r, "s-later")
    refused = [e["input"]["entry"] for e in events(r, "s-flood") if e["type"] == "input.refused"]
    assert refused == first and r.xlen(web) == 0


def test_a_dispatcher_whose_lease_changed_hands_rejects_nothing(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """The reject is fenced by the lease like the settle: during a handover only the holder
    rejects an entry, so its pending count goes down once (docs/design.md)."""
    web = register(r, "web")
    d = make_dispatcher()
    tick(d, 1)
    r.hset(KEYS.pending("web"), "s-bad", 1)
    bad = r.xadd(web, {"session": "s-bad", "input": "not json", "admitted": "1"}).decode()
    r.set(KEYS.lease(0), "another-dispatcher:0000", px=10_000)  # taken over; d does not know yet
    tick(d, 1)
    assert r.xlen(KEYS.rejected) == 0 and r.hget(KEYS.pending("web"), "s-bad") == b"1"
    assert [e[0].decode() for e in r.xrange(web)] == [bad]  # left pending for the holder
    assert 0 not in d.leases.owned
    # the holder rejects it, once
    r.delete(KEYS.lease(0))
    d2 = make_dispatcher(name="d2")
    tick(d2, 2)
    assert r.xlen(KEYS.rejected) == 1 and r.hget(KEYS.pending("web"), "s-bad") is None
    assert r.xlen(web) == 0


# ---- the `parley producers` commands ---------------------------------------------------------


def parley(r: redis.Redis, *args: str) -> Any:
    port = r.connection_pool.connection_kwargs["port"]
    return run_parley("--redis-url", f"redis://127.0.0.1:{port}/0", "producers", *args)


def test_producers_add_list_remove(r: redis.Redis) -> None:
    out = parley(r, "add", "web")
    assert out.returncode == 0, out.stderr
    assert "producer web added (any tenant)" in out.stdout
    assert parley(r, "add", "crm", "--tenant", "acme").returncode == 0
    listed = [orjson.loads(line) for line in parley(r, "list", "--json").stdout.splitlines()]
    assert [(p["name"], p["tenant"], p["waiting"]) for p in listed] == [("crm", "acme", 0), ("web", None, 0)]
    assert "web\ttenant=*\twaiting=0" in parley(r, "list").stdout

    send(r, "s-1", message("unread"), stream=KEYS.producer_inputs("web"))
    out = parley(r, "remove", "web")
    assert out.returncode == 1 and "hold 1 entries not yet applied" in out.stderr
    assert r.hexists(KEYS.producers, "web")
    out = parley(r, "remove", "web", "--force")
    assert out.returncode == 0 and "1 entries still to apply" in out.stdout
    assert not r.hexists(KEYS.producers, "web")
    assert parley(r, "remove", "crm").returncode == 0
    out = parley(r, "remove", "crm")
    assert out.returncode == 1 and "no producer crm" in out.stderr


@pytest.mark.parametrize(("args", "error"), [
    (["add", "Web"], "is not a producer name"),
    (["add", "a:b"], "is not a producer name"),
    (["add", "web", "--tenant", "a/b"], "is not a tenant"),
    (["acl", "web", "--tenant", "a*"], "is not a tenant"),
    (["remove", "-x"], "No such option"),
])
def test_bad_producer_arguments_are_usage_errors_and_write_nothing(
        r: redis.Redis, args: list[str], error: str) -> None:
    out = parley(r, *args)
    assert out.returncode == 2 and error in out.stderr, out.stderr
    assert r.exists(KEYS.producers) == 0


def test_an_unusable_registration_is_reported_by_list(r: redis.Redis) -> None:
    r.hset(KEYS.producers, mapping={"web": b"{}", "broken": b"{"})
    out = parley(r, "list")
    assert out.returncode == 0
    assert "web\ttenant=*" in out.stdout and "broken" in out.stderr


def test_producers_acl_prints_the_login_line(r: redis.Redis) -> None:
    out = parley(r, "acl", "web", "--tenant", "acme")
    assert out.returncode == 0
    line = out.stdout.strip()
    assert line.startswith("user parley-producer-web on ") and "%R~parley:{acme/*}:events" in line
    # the line is one Redis accepts
    r.execute_command("ACL", "SETUSER", *line.split()[1:])
    assert r.acl_getuser("parley-producer-web")["enabled"]


def test_the_printed_acl_line_lets_a_producer_write_its_own_streams_only(r: redis.Redis) -> None:
    line = parley(r, "acl", "web", "--tenant", "acme").stdout.strip().replace(">change-me", ">pw")
    r.execute_command("ACL", "SETUSER", *line.split()[1:])
    port = r.connection_pool.connection_kwargs["port"]
    web = redis.Redis(host="127.0.0.1", port=port, username="parley-producer-web", password="pw")
    fields = {"session": "acme/s-1", "input": b"{}"}
    web.xadd("parley:in:web", fields)
    web.xadd("parley:in:web:3", fields)  # its partition streams
    web.hincrby(KEYS.pending("web"), "acme/s-1", 1)
    r.xadd(KEYS.events("acme/s-1"), {"event": b"{}"})
    r.xadd(KEYS.events("globex/s-1"), {"event": b"{}"})
    assert len(web.xrange(KEYS.events("acme/s-1"))) == 1
    # a function called with its own keys runs; with another producer's keys it is refused
    r.function_load("#!lua name=acltest\nredis.register_function('append', function(keys, args) "
                    "return redis.call('XADD', keys[1], '*', 'session', args[1]) end)")
    assert web.fcall("append", 1, "parley:in:web", "acme/s-1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        web.fcall("append", 1, "parley:in:crm", "acme/s-1")
    for attack in (
            lambda: web.xadd("parley:in:crm", fields),  # another producer's stream
            lambda: web.xadd("parley:in:web-x", fields),  # a name that merely starts like its own
            lambda: web.xadd("parley:inputs", fields),  # the engine's stream
            lambda: web.xdel("parley:in:web", "0-1"),
            lambda: web.hincrby(KEYS.pending("crm"), "acme/s-1", -5),
            lambda: web.hset(KEYS.producers, "web", b"{}"),  # cannot re-scope itself
            lambda: web.xrange(KEYS.events("globex/s-1")),  # another tenant's events
            lambda: web.hget(KEYS.meta("globex/s-1"), "ver")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attack()


def test_the_stale_claim_leaves_the_backlog_to_the_ticks_and_finds_what_lies_past_it(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    import time

    web = register(r, "web")
    d = make_dispatcher(lease_ms=300)
    d.STALE_CHECK_S = 0.0
    tick(d, 1)
    first = [send(r, "s-flood", {"type": "branch.switch", "head": "nowhere"}, stream=web)
             for _ in range(40)]
    tick(d, 1)
    assert len(d.backlog[web]) == 40 - SESSION_DEPTH
    send(r, "s-ghost", message("read by a ghost"), stream=web)
    r.xreadgroup(KEYS.GROUP, "ghost", {web: ">"}, count=10)  # a consumer that then vanished
    time.sleep(0.4)  # the backlog and the ghost's entry: both idle longer than a lease
    tick(d, 1)
    assert "message.created" in types(r, "s-ghost")
    for _ in range(10):
        tick(d, 1)
    refused = [e["input"]["entry"] for e in events(r, "s-flood") if e["type"] == "input.refused"]
    assert refused == first  # in order, each once
    assert r.xlen(web) == 0 and pending_count(r, web) == 0


def test_claimed_entries_are_merged_into_the_backlog_in_id_order(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    from parley.dispatcher.apply import Held
    from tests.integration.conftest import INPUTS

    d = make_dispatcher()
    tick(d, 1)
    p = d.leases.owned[0]
    d.backlog[INPUTS] = [Held("5-0", {}, None, "s-1"), Held("7-0", {}, None, "s-1")]
    fields = {b"session": b"s-1", b"input": orjson.dumps(message("hi"))}
    held = d.hold(p, INPUTS, [("3-0", fields), ("9-0", fields)])
    assert [h.entry_id for h in held] == ["3-0", "5-0", "7-0", "9-0"]
    d.backlog[INPUTS] = [Held("5-0", {}, None, "s-1")]
    assert [h.entry_id for h in d.hold(p, INPUTS, [("6-0", fields)])] == ["5-0", "6-0"]
