"""dispatcher.consume against a real Redis: apply, enqueue, replay, reclaim, reject, leases.

docs/design.md, Consuming streams (dispatchers, partitions, acknowledged entries deleted);
docs/protocol.md, Writing inputs and Rejected entries (inputs, bad entries, idempotency keys);
docs/guarantees.md (each input exactly once, in order; each result recorded once).
"""

import time
import zlib
from typing import Any

import orjson
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.cli.appinfo import app_info
from parley.client import Client
from parley.dispatcher.apply import Batch
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import AppInfo
from parley.dispatcher.entries import Prepared
from parley.dispatcher.leases import get_partitions
from parley.schemas.jobs import job_id
from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import listing_member
from parley.schemas.signing import Keyring, signed_fields
from parley.workers.app import load_app
from tests.integration.conftest import (
    INPUTS,
    KEYS,
    RESULTS,
    MakeDispatcher,
    events,
    pending_count,
    post_outcome,
    queue_ids,
    send,
    tick,
    types,
)

SCENARIOS = app_info(load_app("tests.apps.scenarios"))


def fetch(r: redis.Redis, jid: str) -> Job:
    return Job.fetch(jid, connection=r, serializer=JSONSerializer)


# ---- one input, applied once -------------------------------------------------------------------


def test_message_create_emits_events_and_enqueues_one_llm_job(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    entry = send(r, "s-1", {"type": "message.create", "content": "hello"})
    tick(d)

    evs = events(r, "s-1")
    assert [e["type"] for e in evs] == ["session.created", "message.created", "llm.started"]
    assert evs[1]["message"] == {"id": "msg-1", "parent_id": None, "role": "user", "content": "hello"}
    assert (evs[2]["call_id"], evs[2]["head"]) == ("llm-1", "msg-1")
    assert all(isinstance(e["at"], int) and e["at"] > 1_600_000_000_000 for e in evs)

    jid = job_id("s-1", "llm-1", 1)
    assert queue_ids(r, "llm") == [jid]
    assert queue_ids(r, "decide") == [] and queue_ids(r, "tools") == []
    job = fetch(r, jid)
    assert job.id == jid and jid.startswith("parley-")
    assert job.func_name == "parley.workers.jobs.run_llm"
    assert job.origin == "llm"
    assert job.timeout == 120
    assert job.args == [{"session": "s-1", "work": "llm-1", "attempt": 1, "reply_to": RESULTS, "app": None,
                         "chain": ["msg-1"], "request": {}}]  # the branch by its ids: the worker reads them
    # the job hash holds JSON (zlib-compressed by RQ), never pickle
    raw = zlib.decompress(r.hget(f"rq:job:{jid}", "data"))
    assert orjson.loads(raw)[0] == "parley.workers.jobs.run_llm"

    assert r.hlen(KEYS.outbox("s-1")) == 0  # flushed
    meta = r.hgetall(KEYS.meta("s-1"))
    assert meta[b"ver"] == b"1"
    assert orjson.loads(meta[b"applied"]) == {INPUTS: entry}
    assert d.stats.applied == 1 and d.stats.replays == 0
    assert d.stats.counts[("trigger", "message.created")] == 1

    tick(d)  # nothing new: nothing changes
    assert len(events(r, "s-1")) == 3
    assert queue_ids(r, "llm") == [jid]
    assert d.stats.applied == 1


def test_with_decide_one_decide_job_in_flight_per_session(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(app=SCENARIOS)
    send(r, "s-2", {"type": "message.create", "content": "hi"})
    tick(d)
    assert types(r, "s-2") == ["session.created", "message.created"]
    # two triggers fired (session.created, message.created); only the first is being decided
    jid = job_id("s-2", "dec-1", 1)
    assert queue_ids(r, "decide") == [jid]
    assert queue_ids(r, "llm") == []
    job = fetch(r, jid)
    assert job.func_name == "parley.workers.jobs.run_decide"
    payload = job.args[0]
    assert payload["trigger"] == {"type": "session.created", "session": "s-2", "head": None,
                                  "budget": None, "metadata": None}
    assert payload["proposed"] == {"actions": []}
    assert (payload["work"], payload["attempt"], payload["reply_to"]) == ("dec-1", 1, RESULTS)

    # its outcome (posted like a worker would) is applied and the next trigger is decided
    post_outcome(r, session="s-2", work="dec-1", attempt=1, kind="decide", ok=True,
                 value={"actions": []})
    tick(d)
    assert queue_ids(r, "decide") == [jid, job_id("s-2", "dec-2", 1)]
    assert fetch(r, job_id("s-2", "dec-2", 1)).args[0]["trigger"]["type"] == "message.created"
    assert r.xlen(RESULTS) == 0


def test_work_outcomes_from_the_results_stream_are_recorded_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """docs/guarantees.md: a result of work is recorded exactly once; a late duplicate changes
    nothing."""
    d = make_dispatcher()
    send(r, "s-3", {"type": "message.create", "content": "look it up"})
    tick(d)
    post_outcome(r, session="s-3", work="llm-1", attempt=1, kind="llm", ok=True,
                 value={"content": "", "tool_calls": [{"id": "x7", "name": "lookup",
                                                        "arguments": {"q": "a"}}]})
    tick(d)
    assert types(r, "s-3")[3:] == ["message.created", "llm.completed", "tool.started"]
    reply = events(r, "s-3")[3]["message"]
    assert reply["tool_calls"] == [{"id": "call-1", "name": "lookup", "arguments": {"q": "a"}}]
    tid = job_id("s-3", "call-1", 1)
    assert queue_ids(r, "tools") == [tid]
    job = fetch(r, tid)
    assert job.func_name == "parley.workers.jobs.run_tool"
    assert job.args[0] == {"session": "s-3", "work": "call-1", "attempt": 1, "reply_to": RESULTS, "app": None,
                           "name": "lookup", "arguments": {"q": "a"}}
    assert r.xlen(RESULTS) == 0 and pending_count(r, RESULTS) == 0

    tool_result = {"session": "s-3", "work": "call-1", "attempt": 1, "kind": "tool", "ok": True,
                   "value": "found a"}
    post_outcome(r, **tool_result)
    tick(d)
    after_first = types(r, "s-3")
    assert after_first[6:] == ["message.created", "tool.completed", "llm.started"]
    assert queue_ids(r, "llm") == [job_id("s-3", "llm-1", 1), job_id("s-3", "llm-2", 1)]

    post_outcome(r, **tool_result)  # the same result again (a retried job, say)
    tick(d)
    assert types(r, "s-3") == after_first
    assert d.stats.dropped == 1
    assert len(queue_ids(r, "llm")) == 2
    assert r.xlen(RESULTS) == 0


def test_inputs_of_one_session_apply_in_append_order(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(batch=4)
    for i in range(15):
        send(r, "s-4", {"type": "message.create", "content": f"m{i}", "parent_id": None})
    tick(d, 6)
    created = [e["message"] for e in events(r, "s-4") if e["type"] == "message.created"]
    assert [(m["id"], m["content"]) for m in created] == [(f"msg-{i + 1}", f"m{i}") for i in range(15)]
    assert d.stats.applied == 15
    assert r.xlen(INPUTS) == 0


# ---- exactly once across crashes -----------------------------------------------------------------


def apply_entry(d: Dispatcher, entry_id: str, fields: dict[Any, Any]) -> Batch:
    """One input entry through the dispatcher's apply path, outside any tick: applied (or
    rejected), its effects left in the returned batch, nothing settled."""
    batch = Batch()
    d.apply_entries(d.leases.owned[0], INPUTS, [(entry_id, fields)], batch)
    return batch


def flush(d: Dispatcher, batch: Batch) -> None:
    """What a settle does first: flush the effects the batch's commits left."""
    d.outbox.flush_many(batch.effects)


def test_applying_the_same_entry_twice_is_a_noop(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    d.leases.maintain()
    entry = send(r, "s-5", {"type": "message.create", "content": "once"})
    fields = r.xrange(INPUTS)[0][1]
    flush(d, apply_entry(d, entry, fields))
    before = events(r, "s-5")
    assert [e["type"] for e in before] == ["session.created", "message.created", "llm.started"]

    flush(d, apply_entry(d, entry, fields))
    assert events(r, "s-5") == before
    assert queue_ids(r, "llm") == [job_id("s-5", "llm-1", 1)]
    assert (d.stats.applied, d.stats.replays) == (1, 1)
    assert r.hget(KEYS.meta("s-5"), "ver") == b"1"

    # an older entry of the same stream is a replay too (the marker is the last applied id)
    ms, _, seq = entry.partition("-")
    apply_entry(d, f"{int(ms) - 1}-{seq}", fields)
    assert d.stats.replays == 2
    assert events(r, "s-5") == before


def test_crash_after_commit_before_flush_is_replayed_and_flushed_exactly_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d1 = make_dispatcher(name="d1")

    def crash(batch: list, **kw: Any) -> None:
        raise RuntimeError("killed between commit and flush")

    monkeypatch.setattr(d1.outbox, "flush_many", crash)
    send(r, "s-6", {"type": "message.create", "content": "crash me"})
    with pytest.raises(RuntimeError, match="killed between commit and flush"):
        tick(d1)
    # committed (events, version, and the job: the commit enqueues it), not flushed (the
    # listing is still in the outbox), not acknowledged
    committed = events(r, "s-6")
    assert [e["type"] for e in committed] == ["session.created", "message.created", "llm.started"]
    assert r.hget(KEYS.meta("s-6"), "ver") == b"1"
    assert queue_ids(r, "llm") == [job_id("s-6", "llm-1", 1)]
    assert r.hexists(KEYS.inflight, job_id("s-6", "llm-1", 1))
    # the session's listing (created, active): not done yet
    assert [fx.op for fx in d1.store.pending_effects("s-6")] == ["listing"]
    assert r.zcard(KEYS.sessions_of_status("active")) == 0
    assert pending_count(r, INPUTS) == 1

    r.delete(KEYS.lease(0))  # d1 is dead: its lease lapses
    d2 = make_dispatcher(name="d2")
    tick(d2)
    assert d2.stats.replays == 1 and d2.stats.applied == 0
    assert events(r, "s-6") == committed  # no duplicate events
    assert queue_ids(r, "llm") == [job_id("s-6", "llm-1", 1)]  # the job, once: the replay adds none
    assert fetch(r, job_id("s-6", "llm-1", 1)).func_name == "parley.workers.jobs.run_llm"
    assert r.hlen(KEYS.outbox("s-6")) == 0
    created = orjson.loads(r.hget(KEYS.meta("s-6"), "core"))["created_at"]
    assert r.zrange(KEYS.sessions_of_status("active"), 0, -1) == [listing_member(created, "s-6").encode()]
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0
    assert r.hget(KEYS.meta("s-6"), "ver") == b"1"

    # a further replay finds nothing left to flush
    applied = orjson.loads(r.hget(KEYS.meta("s-6"), "applied"))[INPUTS]
    replay = Prepared(applied, {}, "s-6", None,
                      lambda state, ctx: pytest.fail("a replay must not compute a transition"))
    d2.applier.apply(d2.leases.owned[0], INPUTS, [replay], Batch())
    assert d2.stats.replays == 2
    assert queue_ids(r, "llm") == [job_id("s-6", "llm-1", 1)]


def test_outbox_written_before_typed_effects_is_flushed_as_it_was_meant(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade over a crash: the outbox still holds an enqueue in the form stored before
    effects were typed (RQ queue, function and job id, the job's identity in its payload), left
    there by an older dispatcher, which enqueued jobs in the settle rather than in the commit."""
    d1 = make_dispatcher(name="d1")
    monkeypatch.setattr(d1.outbox, "flush_many", lambda batch, **kw: pytest.fail("crashed"))
    send(r, "s-old", {"type": "message.create", "content": "from before"})
    with pytest.raises(pytest.fail.Exception):
        tick(d1)
    jid = job_id("s-old", "llm-1", 1)
    made = fetch(r, jid)  # this dispatcher's commit enqueued it; an older one would not have
    [args] = made.args
    r.delete(Job.key_for(jid))
    r.lrem("rq:queue:llm", 0, jid)
    r.hdel(KEYS.inflight, jid)
    r.zrem(KEYS.inflight_order("llm"), jid)
    r.hset(KEYS.outbox("s-old"), 1000, orjson.dumps({
        "seq": 1000, "op": "enqueue", "queue": "llm", "func": "parley.workers.jobs.run_llm",
        "job_id": jid, "timeout": made.timeout, "payload": args}))

    r.delete(KEYS.lease(0))
    tick(make_dispatcher(name="d2"))
    assert queue_ids(r, "llm") == [jid]
    job = fetch(r, jid)
    assert job.func_name == "parley.workers.jobs.run_llm" and job.args == [args] and job.timeout == 120
    assert r.hexists(KEYS.inflight, jid) and r.zscore(KEYS.inflight_order("llm"), jid) == 1
    assert r.hlen(KEYS.outbox("s-old")) == 0


def test_entries_left_pending_by_a_dead_consumer_are_claimed_in_order(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    first = send(r, "s-7", {"type": "session.create", "metadata": {"n": 1}})
    second = send(r, "s-7", {"type": "session.create", "metadata": {"n": 2}})
    r.xgroup_create(INPUTS, Keys.GROUP, id="0")
    got = r.xreadgroup(Keys.GROUP, "dead-consumer", {INPUTS: ">"}, count=2)
    assert [e[0].decode() for e in got[0][1]] == [first, second]  # read, never acknowledged
    third = send(r, "s-7", {"type": "message.create", "content": "after"})
    assert pending_count(r, INPUTS) == 2

    d = make_dispatcher(name="heir")
    tick(d)
    evs = events(r, "s-7")
    assert [e["type"] for e in evs] == ["session.created", "input.ignored", "message.created",
                                        "llm.started"]
    assert evs[0]["metadata"] == {"n": 1}  # the older pending entry first
    assert evs[1]["code"] == "session_exists" and evs[1]["input"]["entry"] == second
    assert orjson.loads(r.hget(KEYS.meta("s-7"), "applied")) == {INPUTS: third}
    assert d.stats.applied == 3 and d.stats.replays == 0
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0
    consumers = {c["name"].decode(): c["pending"] for c in r.xinfo_consumers(INPUTS, Keys.GROUP)}
    assert consumers.get("dead-consumer", 0) == 0


def test_acknowledged_entries_are_deleted_from_both_streams(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    for i in range(5):
        send(r, f"s-8-{i}", {"type": "session.create"})
    tick(d)
    assert r.xlen(INPUTS) == 0
    assert pending_count(r, INPUTS) == 0
    post_outcome(r, session="s-8-0", work="llm-9", attempt=1, kind="llm", ok=True, value={})
    tick(d)
    assert d.stats.dropped == 1  # unknown work: dropped, yet acknowledged and trimmed
    assert r.xlen(RESULTS) == 0 and pending_count(r, RESULTS) == 0
    group = r.xinfo_groups(INPUTS)[0]
    assert group["name"] == Keys.GROUP.encode() and group["pending"] == 0


# ---- bad entries ------------------------------------------------------------------------------


def test_bad_entries_are_dead_lettered_reported_and_acknowledged(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    bad_json = r.xadd(INPUTS, {"session": "s-9", "input": b"{not json"}).decode()
    unknown = send(r, "s-9", {"type": "nope", "call_id": "call-3"})
    no_session = r.xadd(INPUTS, {"input": orjson.dumps({"type": "session.create"})}).decode()
    spoof = r.xadd(INPUTS, {"session": "s-9", "input": orjson.dumps({"type": "message.create"}),
                            "error": "forged", "source": "elsewhere", "entry": "0-1"}).decode()
    good = send(r, "s-9", {"type": "message.create", "content": "still fine"})
    tick(d)

    rejected = [(i.decode(), {k.decode(): v.decode() for k, v in f.items()})
                for i, f in r.xrange(KEYS.rejected)]
    assert KEYS.rejected == "parley:inputs:rejected"
    assert [f["entry"] for _i, f in rejected] == [bad_json, unknown, no_session, spoof]
    assert all(f["source"] == INPUTS for _i, f in rejected)
    by_entry = {f["entry"]: f for _i, f in rejected}
    assert "not valid JSON" in by_entry[bad_json]["error"]
    assert by_entry[bad_json]["input"] == "{not json" and by_entry[bad_json]["session"] == "s-9"
    assert "unknown input type 'nope'" in by_entry[unknown]["error"]
    assert "no `session` field" in by_entry[no_session]["error"]
    assert "content" in by_entry[spoof]["error"]  # its own error, not the forged one
    assert by_entry[spoof]["error"] != "forged"

    evs = events(r, "s-9")
    refused = [e for e in evs if e["type"] == "input.refused"]
    assert [e["code"] for e in refused] == ["invalid_input"] * 3
    assert [e["input"]["entry"] for e in refused] == [bad_json, unknown, spoof]
    assert refused[0]["input"]["type"] is None
    assert refused[1]["input"] == {"entry": unknown, "type": "nope", "call_id": "call-3"}
    assert refused[2]["input"]["type"] == "message.create"
    assert "not valid JSON" in refused[0]["message"]
    # a bad entry blocks nothing after it
    assert [e["type"] for e in evs if e["type"] != "input.refused"] == [
        "session.created", "message.created", "llm.started"]
    assert orjson.loads(r.hget(KEYS.meta("s-9"), "applied")) == {INPUTS: good}
    assert d.stats.rejected == 4 and d.stats.applied == 1
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_bad_work_outcome_is_dead_lettered_from_the_results_stream(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    entry = r.xadd(RESULTS, {"outcome": b'{"session": "s-10", "kind": "bogus"}'}).decode()
    tick(d)
    [(_rid, fields)] = r.xrange(KEYS.rejected)
    assert fields[b"source"] == RESULTS.encode() and fields[b"entry"] == entry.encode()
    assert b"invalid work outcome" in fields[b"error"]
    assert r.xlen(RESULTS) == 0 and pending_count(r, RESULTS) == 0
    assert d.stats.rejected == 1


# ---- idempotency keys -------------------------------------------------------------------------


def test_same_session_and_id_is_ignored_as_duplicate(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    send(r, "s-11", {"type": "message.create", "content": "one", "parent_id": None}, id="req-1")
    dup = send(r, "s-11", {"type": "message.create", "content": "two", "parent_id": None}, id="req-1")
    send(r, "s-12", {"type": "message.create", "content": "other session"}, id="req-1")
    send(r, "s-11", {"type": "message.create", "content": "three", "parent_id": None}, id="req-2")
    tick(d)
    evs = events(r, "s-11")
    contents = [e["message"]["content"] for e in evs if e["type"] == "message.created"]
    assert contents == ["one", "three"]
    ignored = [e for e in evs if e["type"] == "input.ignored"]
    assert len(ignored) == 1
    assert ignored[0]["code"] == "duplicate"
    assert ignored[0]["input"] == {"entry": dup, "type": "message.create"}
    assert "message.created" in types(r, "s-12")  # keys are per session
    until = r.zscore(KEYS.idempotency_keys("s-11"), "req-1")
    assert until is not None and 0 < until - time.time() * 1000 <= 24 * 3600 * 1000


def test_idempotency_key_is_used_even_when_the_input_was_refused(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """docs/protocol.md, Writing inputs: an entry's idempotency key counts as used whatever
    became of the entry."""
    d = make_dispatcher()
    send(r, "s-13", {"type": "session.create"})
    send(r, "s-13", {"type": "message.create", "content": "x", "parent_id": "msg-404"}, id="k")
    send(r, "s-13", {"type": "message.create", "content": "y", "parent_id": None}, id="k")
    tick(d)
    evs = events(r, "s-13")
    assert [(e["type"], e.get("code")) for e in evs] == [
        ("session.created", None), ("input.refused", "unknown_parent"), ("input.ignored", "duplicate")]
    until = r.zscore(KEYS.idempotency_keys("s-13"), "k")
    assert until is not None and 0 < until - time.time() * 1000 <= 24 * 3600 * 1000


def test_keys_that_are_not_utf8_are_refused_and_never_merge(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """docs/protocol.md, Ids and limits: `key-\\xff` and `key-\\xfe` used to be read as the one
    key `key-\\ufffd`, so the second input was ignored as a duplicate of the first."""
    d = make_dispatcher()
    send(r, "s-bin", {"type": "message.create", "content": "one", "parent_id": None}, id=b"key-\xff")
    send(r, "s-bin", {"type": "message.create", "content": "two", "parent_id": None}, id=b"key-\xfe")
    send(r, "s-bin", {"type": "message.create", "content": "three", "parent_id": None}, id="key-\ufffd")
    tick(d)
    evs = events(r, "s-bin")
    refused = [(e["code"], e["message"]) for e in evs if e["type"] == "input.refused"]
    assert refused == [("invalid_input", "`id` is not valid UTF-8")] * 2
    assert [e["message"]["content"] for e in evs if e["type"] == "message.created"] == ["three"]
    assert not any(e["type"] == "input.ignored" for e in evs)
    assert r.xlen(KEYS.rejected) == 2


def test_an_unsigned_entry_uses_up_no_key_even_when_it_is_malformed(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """docs/protocol.md, Signing: with signing required, an unsigned entry naming id K (bad
    JSON, or an unknown type) used to be rejected `invalid_input` first and use K up, so the
    genuine signed entry with id K that followed was ignored as `duplicate`."""
    secret = "s3cret"
    d = make_dispatcher(keyring=Keyring({"alice": secret}, required=True))
    r.xadd(INPUTS, {"session": "s-sig", "input": b"{bad json", "id": "K"})
    send(r, "s-sig", {"type": "no.such.type", "message_id": "m-1"}, id="K2")
    for key in ("K", "K2"):
        raw = orjson.dumps({"type": "message.create", "content": f"signed {key}", "parent_id": None})
        r.xadd(INPUTS, {"session": "s-sig", "input": raw, "id": key,
                        **signed_fields(secret, "alice", "s-sig", key, raw)})
    tick(d)
    evs = events(r, "s-sig")
    assert [(e["type"], e.get("code")) for e in evs if e["type"].startswith("input.")] == [
        ("input.refused", "unauthorized"), ("input.refused", "unauthorized")]
    # what could be read of the unsigned entry still names it
    assert evs[1]["input"]["type"] == "no.such.type" and evs[1]["input"]["message_id"] == "m-1"
    assert [e["message"]["content"] for e in evs if e["type"] == "message.created"] == [
        "signed K", "signed K2"]
    assert r.zscore(KEYS.idempotency_keys("s-sig"), "K") and r.zscore(KEYS.idempotency_keys("s-sig"), "K2")


def test_a_decision_with_an_integer_beyond_64_bits_fails_and_the_partition_goes_on(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """docs/protocol.md, Ids and limits: a worker's outcome holding an integer JSON cannot carry
    exactly (here an interrupt's payload) used to make the commit raise on every retry."""
    d = make_dispatcher(app=AppInfo(has_decide=True, decide_on=frozenset({"session.created"})))
    send(r, "s-wide", {"type": "session.create"})
    tick(d)
    post_outcome(r, session="s-wide", work="dec-1", attempt=1, kind="decide", ok=True,
                 value={"actions": [{"type": "interrupt", "reason": "r",
                                     "payload": {"n": [1, 2**64]}}]})
    send(r, "s-next", {"type": "message.create", "content": "after"})
    tick(d)
    failed = [e for e in events(r, "s-wide") if e["type"] == "decision.failed"]
    assert [e["error"] for e in failed] == [
        "the outcome has an integer beyond 64 bits at value.actions[0].payload.n[1]"]
    assert "interrupt.raised" not in types(r, "s-wide")
    assert "message.created" in types(r, "s-next")
    assert r.xlen(RESULTS) == 0 and pending_count(r, RESULTS) == 0


# ---- leases and partitions ---------------------------------------------------------------------


def test_only_one_dispatcher_holds_a_partition_and_a_second_takes_over(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d1 = make_dispatcher(name="d1")
    d2 = make_dispatcher(name="d2")
    d1.leases.maintain()
    d2.leases.maintain()
    assert list(d1.leases.owned) == [0] and d2.leases.owned == {}
    assert r.get(KEYS.lease(0)).decode() == d1.leases.owned[0].token
    assert d1.leases.owned[0].token.startswith("d1:")
    pttl = r.pttl(KEYS.lease(0))
    assert 0 < pttl <= 10_000

    send(r, "s-14", {"type": "session.create"})
    tick(d2, 2)  # a standby reads nothing
    assert r.xlen(INPUTS) == 1 and events(r, "s-14") == []

    r.delete(KEYS.lease(0))  # d1's lease is gone (expired)
    d2.leases.maintain()
    assert list(d2.leases.owned) == [0]
    # d1 has not noticed yet: it reads the entry but its commit is fenced off
    tick(d1, 1)
    assert d1.stats.applied == 0 and d1.leases.owned == {}
    assert events(r, "s-14") == []
    assert pending_count(r, INPUTS) == 1  # left for the new owner

    tick(d2)
    assert types(r, "s-14") == ["session.created"]
    assert d2.stats.applied == 1
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_an_expired_lease_is_taken_over_and_the_old_holder_lets_go(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d1 = make_dispatcher(name="d1", lease_ms=300)
    d2 = make_dispatcher(name="d2", lease_ms=300)
    d1.leases.maintain()
    d2.leases.maintain()
    assert list(d1.leases.owned) == [0] and d2.leases.owned == {}
    time.sleep(0.4)  # d1 stalls past its lease
    assert r.exists(KEYS.lease(0)) == 0
    d2.leases.maintain()
    assert list(d2.leases.owned) == [0]
    d1.leases.maintain()  # its renewal fails: the token is no longer its own
    assert d1.leases.owned == {}
    assert r.get(KEYS.lease(0)).decode() == d2.leases.owned[0].token


def test_a_held_lease_is_renewed(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(lease_ms=10_000)
    d.leases.maintain()
    d.leases.maintain()  # fresh: not renewed yet
    r.pexpire(KEYS.lease(0), 1000)  # as if 9 s had passed...
    d.leases.owned[0].renewed_at -= 9  # ...since the last renewal
    assert not d.leases.fresh(d.leases.owned[0])
    d.leases.maintain()
    assert r.pttl(KEYS.lease(0)) > 9000
    assert d.leases.fresh(d.leases.owned[0])
    assert list(d.leases.owned) == [0]
    d.leases.release_all()
    assert r.exists(KEYS.lease(0)) == 0 and d.leases.owned == {}


def test_release_does_not_delete_another_holders_lease(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    d.leases.maintain()
    r.set(KEYS.lease(0), "someone-else")
    d.leases.release_all()
    assert r.get(KEYS.lease(0)) == b"someone-else"


def test_partitioned_streams_are_read_and_results_routed_per_partition(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    r.hset(KEYS.config, "partitions", 2)
    assert get_partitions(r, KEYS, default=1) == 2
    sessions = {partition_of(f"p-{i}", 2): f"p-{i}" for i in range(20)}
    assert set(sessions) == {0, 1}
    c = Client(r)
    for n, s in sessions.items():
        assert c.stream_for(s) == f"parley:inputs:{n}"
        c.send(s, {"type": "message.create", "content": f"to {n}"})
    d = make_dispatcher(partitions=2)
    tick(d)
    assert sorted(d.leases.owned) == [0, 1]
    for n, s in sessions.items():
        assert types(r, s) == ["session.created", "message.created", "llm.started"]
        assert fetch(r, job_id(s, "llm-1", 1)).args[0]["reply_to"] == f"parley:results:{n}"
        assert r.xlen(f"parley:inputs:{n}") == 0
    assert r.exists(INPUTS) == 0  # nothing written to the unpartitioned stream

    # a second dispatcher finds both partitions taken
    other = make_dispatcher(name="other", partitions=2)
    other.leases.maintain()
    assert other.leases.owned == {}


def test_first_dispatcher_publishes_its_partition_count(r: redis.Redis) -> None:
    assert get_partitions(r, KEYS, default=3) == 3
    assert get_partitions(r, KEYS, default=5) == 3  # the published N wins
    assert r.hget(KEYS.config, "partitions") == b"3"


def test_version_conflict_is_retried_and_commits_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_dispatcher()
    real_commit = d.store.commit
    calls = []

    def racing_commit(session, version, tr, lease_key, token, partitions):  # type: ignore[no-untyped-def]
        calls.append(version)
        if len(calls) == 1:  # another writer committed in between load and commit
            r.hincrby(KEYS.meta(session), "ver", 1)
        return real_commit(session, version, tr, lease_key, token, partitions)

    monkeypatch.setattr(d.store, "commit", racing_commit)
    send(r, "s-15", {"type": "message.create", "content": "race"})
    tick(d)
    assert calls == ["0", "1"]
    assert d.stats.conflicts == 1 and d.stats.applied == 1
    assert types(r, "s-15") == ["session.created", "message.created", "llm.started"]
    assert queue_ids(r, "llm") == [job_id("s-15", "llm-1", 1)]
    assert r.hget(KEYS.meta("s-15"), "ver") == b"2"


def test_dispatcher_without_partitions_owns_nothing(r: redis.Redis) -> None:
    d = Dispatcher(r, KEYS, AppInfo(), block_ms=1)
    assert d.leases.partitions == 0  # set by run() from parley:config
    d.leases.maintain()
    assert d.leases.owned == {}


# ---- lost work (docs/design.md, Lost work): a job a dead worker held is retried or settled worker_lost ---


def plant_running(r: redis.Redis, session: str, work: str, kind: str, worker: str,
                  attempt: int = 1) -> str:
    """What a worker records when it starts a job (workers.jobs._claim)."""
    jid = job_id(session, work, attempt)
    r.hset(KEYS.running, jid, orjson.dumps({"worker": worker, "session": session, "work": work,
                                            "attempt": attempt, "kind": kind, "reply_to": RESULTS}))
    return jid


def test_llm_job_of_a_dead_worker_is_posted_lost_once_and_retried(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(name="d1")
    standby = make_dispatcher(name="d2")
    send(r, "s-16", {"type": "message.create", "content": "hello"})
    tick(d)
    jid = plant_running(r, "s-16", "llm-1", "llm", worker="w-dead")  # no heartbeat key: dead
    d.sweeps.lost_checked = standby.sweeps.lost_checked = 0.0
    d.sweeps.find_lost_work()
    standby.sweeps.find_lost_work()  # every dispatcher sweeps; the loss is posted once
    [(_id, fields)] = r.xrange(RESULTS)
    lost = orjson.loads(fields[b"outcome"])
    assert lost == {**lost, "session": "s-16", "work": "llm-1", "attempt": 1, "kind": "llm",
                    "ok": False, "error": "worker_lost", "lost": True}
    assert r.hexists(KEYS.running, jid) == 0

    before = types(r, "s-16")
    tick(d)
    assert types(r, "s-16") == before  # retried quietly: no llm.failed, no second llm.started
    assert queue_ids(r, "llm") == [jid, job_id("s-16", "llm-1", 2)]
    retry = fetch(r, job_id("s-16", "llm-1", 2))
    assert retry.args[0]["attempt"] == 2 and retry.args[0]["work"] == "llm-1"
    assert r.xlen(RESULTS) == 0

    # the first attempt's result arriving late is dropped
    post_outcome(r, session="s-16", work="llm-1", attempt=1, kind="llm", ok=True,
                 value={"content": "late", "tool_calls": []})
    tick(d)
    assert types(r, "s-16") == before
    assert d.stats.dropped == 1


def test_tool_job_of_a_dead_worker_is_settled_worker_lost(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    send(r, "s-17", {"type": "message.create", "content": "go"})
    tick(d)
    post_outcome(r, session="s-17", work="llm-1", attempt=1, kind="llm", ok=True,
                 value={"content": "", "tool_calls": [{"id": "a", "name": "lookup", "arguments": {}}]})
    tick(d)
    plant_running(r, "s-17", "call-1", "tool", worker="w-gone")
    d.sweeps.lost_checked = 0.0
    tick(d)
    tick(d)
    completed = [e for e in events(r, "s-17") if e["type"] == "tool.completed"]
    assert len(completed) == 1
    assert (completed[0]["call_id"], completed[0]["error"]) == ("call-1", "worker_lost")
    assert queue_ids(r, "tools") == [job_id("s-17", "call-1", 1)]  # not run again
    assert r.hlen(KEYS.running) == 0


def test_a_job_of_a_live_worker_is_left_alone(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    jid = plant_running(r, "s-18", "llm-1", "llm", worker="w-alive")
    r.set(KEYS.worker_alive("w-alive"), 1, px=5000)
    d.sweeps.lost_checked = 0.0
    d.sweeps.find_lost_work()
    assert r.hexists(KEYS.running, jid) == 1
    assert r.exists(RESULTS) == 0


def test_a_rejected_entry_uses_up_its_idempotency_key(r: redis.Redis,
                                                      make_dispatcher: MakeDispatcher) -> None:
    """docs/protocol.md, Writing inputs: an entry's idempotency key counts as used whatever
    became of the entry."""
    d = make_dispatcher()
    r.xadd(INPUTS, {"session": "s-idem", "input": b"{bad json", "id": "k"})
    send(r, "s-idem", {"type": "message.create", "content": "hi"}, id="k")
    tick(d)
    assert types(r, "s-idem") == ["input.refused", "input.ignored"]
    assert events(r, "s-idem")[1]["code"] == "duplicate"


def test_a_planted_running_record_cannot_aim_the_lost_work_post_elsewhere(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """A worker may write parley:running; a record naming another stream is ignored."""
    d = make_dispatcher()
    d.leases.partitions = 1
    r.hset(KEYS.running, "planted", orjson.dumps({
        "worker": "ghost", "session": "victim", "work": "llm-1", "attempt": 1, "kind": "llm",
        "reply_to": KEYS.events("victim")}))
    d.sweeps.lost_checked = 0.0
    d.sweeps.find_lost_work()
    assert r.xlen(KEYS.events("victim")) == 0


def test_two_dispatchers_share_the_partitions(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """Each live dispatcher takes about N / live partitions; a dead one's share is taken over."""
    a = make_dispatcher(name="a", partitions=4, lease_ms=2000)
    a.leases.partitions = 4
    a.leases.maintain()
    assert sorted(a.leases.owned) == [0, 1, 2, 3]  # alone: everything
    b = make_dispatcher(name="b", partitions=4, lease_ms=2000)
    b.leases.partitions = 4
    b.leases.maintain()  # registers; nothing free yet
    a.leases.maintained_at = 0.0
    a.leases.maintain()  # sees two live dispatchers: gives two back
    b.leases.maintain()
    assert sorted(a.leases.owned) == [0, 1] and sorted(b.leases.owned) == [2, 3]
    a.leases.release_all()  # a stops: b takes everything at its next look
    b.leases.maintained_at = 0.0
    b.leases.maintain()
    assert sorted(b.leases.owned) == [0, 1, 2, 3]


def test_a_bad_entry_with_a_non_utf8_field_name_is_rejected_and_the_partition_goes_on(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """Found by the fuzz run: this used to crash the dispatcher on every retry."""
    d = make_dispatcher()
    bad = r.xadd(INPUTS, {b"session": b"s-u", b"input": b"not json", b"\xff": b"x"}).decode()
    send(r, "s-u", {"type": "message.create", "content": "after"})
    tick(d)
    (_rid, fields), = r.xrange(KEYS.rejected)
    assert fields[b"entry"] == bad.encode() and fields[b"\xff"] == b"x"
    assert "message.created" in types(r, "s-u")


def apply_input_fails_for(monkeypatch: pytest.MonkeyPatch, session: str) -> None:
    """A machine bug that shows only for one session: applying its inputs raises."""
    import parley.dispatcher.entries as entries

    real = entries.apply_input

    def buggy(state, entry, entry_id, ctx, **kw):  # type: ignore[no-untyped-def]
        if entry.session == session:
            raise RuntimeError("a bug")
        return real(state, entry, entry_id, ctx, **kw)

    monkeypatch.setattr(entries, "apply_input", buggy)


def test_an_unexpected_error_moves_the_entry_aside_instead_of_stopping_the_partition(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_dispatcher()
    apply_input_fails_for(monkeypatch, "s-bug")
    send(r, "s-bug", {"type": "message.create", "content": "x"})
    send(r, "s-ok", {"type": "message.create", "content": "y"})
    tick(d)
    (_rid, fields), = r.xrange(KEYS.rejected)
    assert b"internal error: RuntimeError: a bug" in fields[b"error"]
    assert "message.created" in types(r, "s-ok") and r.xlen(INPUTS) == 0


def test_a_job_dequeued_by_a_worker_that_died_before_starting_it_is_retried(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """The window between RQ's dequeue and the job's running record (found by the chaos run)."""
    d = make_dispatcher()
    send(r, "s-gap", {"type": "message.create", "content": "hi"})
    send(r, "s-wait", {"type": "message.create", "content": "hi"})
    tick(d)
    first, waiting = queue_ids(r, "llm")
    assert r.hexists(KEYS.inflight, first)
    r.lrem("rq:queue:llm", 0, first)  # a worker popped it, then died before its first line
    for job in (first, waiting):  # both enqueued long ago
        rec = orjson.loads(r.hget(KEYS.inflight, job))
        r.hset(KEYS.inflight, job, orjson.dumps({**rec, "at": 0}))
    d.sweeps.unclaimed_checked = 0.0
    d.sweeps.find_unclaimed_work()
    d.sweeps.unclaimed_checked = 0.0
    d.sweeps.find_unclaimed_work()  # posted once, not twice
    assert r.hexists(KEYS.inflight, waiting) and not r.hexists(KEYS.inflight, first)
    assert r.exists(f"rq:job:{first}") == 0  # RQ's own cleanup cannot run it after all
    tick(d)
    assert queue_ids(r, "llm") == [waiting, job_id("s-gap", "llm-1", 2)]  # retried, attempt 2
    assert d.stats.counts.get(("work_retried", "llm")) == 1


# ---- waves: a batch is applied a wave of distinct sessions at a time -----------------------------


def message(content: str) -> dict[str, Any]:
    return {"type": "message.create", "content": content, "parent_id": None}


# (session, input or raw bytes, idempotency key): three sessions interleaved, a refused entry
# and idempotency keys used again across waves
MIXED: list[tuple[str, Any, str | None]] = [
    ("w-a", message("a0"), "ka0"),
    ("w-b", message("b0"), None),
    ("w-a", message("a1"), "dup"),
    ("w-b", b"{not json", "kb"),  # refused; its key counts as used (docs/protocol.md, Writing inputs)
    ("w-c", {"type": "session.create"}, None),
    ("w-a", message("a2"), "dup"),  # a duplicate of a1, which a previous wave committed
    ("w-b", message("b1"), "kb"),  # a duplicate of the refused entry
    ("w-c", message("c0"), None),
    ("w-a", message("a3"), None),
]


def send_all(r: redis.Redis, script: list[tuple[str, Any, str | None]]) -> list[str]:
    ids = []
    for session, value, key in script:
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        extra = {"id": key} if key else {}
        ids.append(r.xadd(INPUTS, {"session": session, "input": raw, **extra}).decode())
    return ids


def outcome_of_run(r: redis.Redis, ids: list[str], sessions: list[str]) -> dict[str, Any]:
    """What a run left, with entry ids replaced by their position and times dropped."""
    names = {entry: f"#{i}" for i, entry in enumerate(ids)}

    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items() if k not in ("at", "created_at")}
        if isinstance(v, list):
            return [norm(x) for x in v]
        return names.get(v, v) if isinstance(v, str) else v

    client = Client(r)
    return {
        "events": {s: norm(events(r, s)) for s in sessions},
        "views": {s: client.show(s) for s in sessions},
        "jobs": {q: sorted(queue_ids(r, q)) for q in ("llm", "decide", "tools")},
        "rejected": [names[f[b"entry"].decode()] for _i, f in r.xrange(KEYS.rejected)],
        "outboxes": [r.hlen(KEYS.outbox(s)) for s in sessions],
        "versions": [r.hget(KEYS.meta(s), "ver") for s in sessions],
        "left": (r.xlen(INPUTS), pending_count(r, INPUTS)),
    }


def test_a_batch_is_applied_in_waves_with_the_result_of_one_entry_at_a_time(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = ["w-a", "w-b", "w-c"]
    one = make_dispatcher(name="one-at-a-time", batch=1)
    ids = send_all(r, MIXED)
    tick(one, 12)
    reference = outcome_of_run(r, ids, sessions)
    assert one.stats.waves == 8 and one.stats.rejected == 1

    r.flushall()
    d = make_dispatcher(name="waves", batch=100)
    loads: list[list[str]] = []
    commits: list[list[str]] = []
    real_load_many, real_commit_many = d.store.load_many, d.store.commit_many

    def load_many(wanted):  # type: ignore[no-untyped-def]
        loads.append([s for s, _key in wanted])
        return real_load_many(wanted)

    def commit_many(batch, lease_key, token, partitions):  # type: ignore[no-untyped-def]
        commits.append([s for s, _v, _tr in batch])
        return real_commit_many(batch, lease_key, token, partitions)

    monkeypatch.setattr(d.store, "load_many", load_many)
    monkeypatch.setattr(d.store, "commit_many", commit_many)
    ids = send_all(r, MIXED)
    evalsha_before = r.info("commandstats")["cmdstat_evalsha"]["calls"]
    d.leases.maintain()
    d.process(d.leases.owned[0], INPUTS, r.xreadgroup(Keys.GROUP, d.name, {INPUTS: ">"}, count=100)[0][1])
    # the refused entry of w-b first applies what precedes it (2 waves), then 2 more waves
    assert loads == commits == [["w-a", "w-b"], ["w-a"], ["w-c", "w-a", "w-b"], ["w-c", "w-a"]]
    assert d.stats.waves == 4 and d.stats.applied == 8 and d.stats.rejected == 1
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] - evalsha_before == 8
    assert outcome_of_run(r, ids, sessions) == reference

    got = reference["events"]
    created = [e["message"]["content"] for e in got["w-a"] if e["type"] == "message.created"]
    assert created == ["a0", "a1", "a3"]
    assert [(e["type"], e.get("code")) for e in got["w-b"] if e["type"].startswith("input.")] == [
        ("input.refused", "invalid_input"), ("input.ignored", "duplicate")]
    assert [e["type"] for e in got["w-b"]].index("input.refused") == 3  # after b0's three events
    assert reference["left"] == (0, 0) and reference["outboxes"] == [0, 0, 0]


def test_a_version_conflict_inside_a_wave_is_retried_alone_in_order(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_dispatcher()
    real_commit_many = d.store.commit_many
    raced: list[str] = []

    def racing_commit_many(batch, lease_key, token, partitions):  # type: ignore[no-untyped-def]
        if not raced:  # another writer commits to c-b between the wave's load and its commit
            raced.append("c-b")
            r.hincrby(KEYS.meta("c-b"), "ver", 1)
        return real_commit_many(batch, lease_key, token, partitions)

    monkeypatch.setattr(d.store, "commit_many", racing_commit_many)
    for session, content in [("c-a", "a0"), ("c-b", "b0"), ("c-c", "c0"), ("c-b", "b1"), ("c-a", "a1")]:
        send(r, session, message(content))
    tick(d)
    assert raced == ["c-b"]
    assert d.stats.conflicts == 1 and d.stats.applied == 5 and d.stats.waves == 2
    for session, contents in [("c-a", ["a0", "a1"]), ("c-b", ["b0", "b1"]), ("c-c", ["c0"])]:
        created = [e["message"]["content"] for e in events(r, session) if e["type"] == "message.created"]
        assert created == contents
        assert r.hlen(KEYS.outbox(session)) == 0
    assert r.hget(KEYS.meta("c-b"), "ver") == b"3"  # the foreign bump, then b0 and b1
    assert r.hget(KEYS.meta("c-a"), "ver") == b"2"
    assert sorted(queue_ids(r, "llm")) == sorted(job_id(s, f"llm-{n}", 1) for s, n in [
        ("c-a", 1), ("c-a", 2), ("c-b", 1), ("c-b", 2), ("c-c", 1)])
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_lease_lost_in_the_middle_of_a_wave_leaves_the_rest_to_the_next_owner(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d1 = make_dispatcher(name="d1")
    real_commit_many = d1.store.commit_many

    def commit_then_lose(batch, lease_key, token, partitions):  # type: ignore[no-untyped-def]
        # the first commit lands, then another dispatcher takes the lease, fencing the others
        first = real_commit_many(batch[:1], lease_key, token, partitions)
        r.set(lease_key, "d2:taken")
        return first + real_commit_many(batch[1:], lease_key, token, partitions)

    monkeypatch.setattr(d1.store, "commit_many", commit_then_lose)
    entries = {s: send(r, s, message(f"{s} hello")) for s in ("l-a", "l-b", "l-c")}
    send(r, "l-a", message("l-a again"))
    tick(d1, 1)
    assert d1.leases.owned == {} and d1.stats.applied == 1
    # l-a's first entry is committed (with its job: the commit enqueues it), but d1 no longer
    # holds the partition: the settle is fenced, so nothing is flushed or acknowledged (the next
    # owner's replay flushes the listing, once)
    assert types(r, "l-a") == ["session.created", "message.created", "llm.started"]
    assert queue_ids(r, "llm") == [job_id("l-a", "llm-1", 1)] and r.hlen(KEYS.outbox("l-a")) == 1
    assert events(r, "l-b") == [] and events(r, "l-c") == []
    pending = r.xpending_range(INPUTS, Keys.GROUP, "-", "+", 10)
    assert sorted(p["message_id"].decode() for p in pending) == sorted(
        [entries["l-a"], entries["l-b"], entries["l-c"], r.xrange(INPUTS)[-1][0].decode()])

    r.delete(KEYS.lease(0))  # the lease lapses; a new owner claims what was left
    d2 = make_dispatcher(name="d2")
    tick(d2)
    assert d2.stats.applied == 3 and d2.stats.replays == 1
    for s in ("l-a", "l-b", "l-c"):
        assert r.hlen(KEYS.outbox(s)) == 0
    assert [e["message"]["content"] for e in events(r, "l-a") if e["type"] == "message.created"] == [
        "l-a hello", "l-a again"]
    assert types(r, "l-b") == ["session.created", "message.created", "llm.started"]
    assert len(queue_ids(r, "llm")) == len(set(queue_ids(r, "llm"))) == 4
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_a_poison_entry_in_a_wave_does_not_block_the_others(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_dispatcher()
    apply_input_fails_for(monkeypatch, "p-bug")
    bad = [send(r, "p-bug", message("x"))]
    send(r, "p-ok", message("y"))
    bad.append(send(r, "p-bug", message("x again")))
    send(r, "p-ok", message("y again"))
    send(r, "p-other", message("z"))
    tick(d)
    assert d.stats.waves == 2 and d.stats.applied == 3 and d.stats.rejected == 2
    rejected = r.xrange(KEYS.rejected)
    assert [f[b"entry"].decode() for _i, f in rejected] == bad
    assert all(b"internal error: RuntimeError: a bug" in f[b"error"] for _i, f in rejected)
    assert r.exists(KEYS.meta("p-bug")) == 0  # nothing committed for it
    assert [e["code"] for e in events(r, "p-bug")] == ["invalid_input", "invalid_input"]
    assert [e["message"]["content"] for e in events(r, "p-ok") if e["type"] == "message.created"] == [
        "y", "y again"]
    assert "message.created" in types(r, "p-other")
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_replays_of_one_session_in_a_batch_flush_its_outbox_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two entries of a session committed, then a crash before the flush: the next owner replays
    both in one batch; each replay finds the whole outbox, yet every effect is done once, and the
    jobs (enqueued by the commits) are not enqueued again."""
    d1 = make_dispatcher(name="d1")

    def crash(batch: list, **kw: Any) -> None:
        raise RuntimeError("killed between commit and flush")

    monkeypatch.setattr(d1.outbox, "flush_many", crash)
    send(r, "r-1", message("one"))
    send(r, "r-1", message("two"))
    with pytest.raises(RuntimeError, match="killed between commit and flush"):
        tick(d1)
    # two jobs, enqueued by the commits; the listing of the session the first message created
    # is left in the outbox
    jobs = [job_id("r-1", "llm-1", 1), job_id("r-1", "llm-2", 1)]
    assert r.hlen(KEYS.outbox("r-1")) == 1 and queue_ids(r, "llm") == jobs

    r.delete(KEYS.lease(0))
    d2 = make_dispatcher(name="d2")
    tick(d2)
    assert d2.stats.replays == 2 and d2.stats.applied == 0
    assert queue_ids(r, "llm") == [job_id("r-1", "llm-1", 1), job_id("r-1", "llm-2", 1)]
    assert r.hlen(KEYS.outbox("r-1")) == 0 and r.hlen(KEYS.inflight) == 2
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


# ---- settle: flush, acknowledgement and the next read in one MULTI ---------------------------


def test_a_tick_acknowledges_and_reads_the_next_entries_in_one_round_trip(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(batch=2)
    d.leases.maintain()
    for i in range(4):
        send(r, f"pf-{i}", message("hi"))
    execs = r.info("commandstats").get("cmdstat_exec", {}).get("calls", 0)
    ahead = d.tick()
    # the first two are applied, flushed and acknowledged; the next two were read by the same
    # MULTI: delivered to this consumer (pending), not yet applied
    assert d.stats.applied == 2 and r.xlen(INPUTS) == 2 and pending_count(r, INPUTS) == 2
    assert ahead and sum(len(entries) for _s, entries in ahead) == 2
    assert r.info("commandstats")["cmdstat_exec"]["calls"] - execs == 1
    d.tick(ahead)
    assert d.stats.applied == 4 and r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0
    assert all("llm.started" in types(r, f"pf-{i}") for i in range(4))
    assert len(queue_ids(r, "llm")) == 4


def test_entries_read_ahead_by_a_dispatcher_that_dies_are_applied_by_the_next_owner(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d1 = make_dispatcher(name="d1", batch=1)
    d1.leases.maintain()
    send(r, "pf-a", message("one"))
    send(r, "pf-b", message("two"))
    ahead = d1.tick()
    assert ahead and pending_count(r, INPUTS) == 1  # pf-b: read ahead, then d1 dies
    r.delete(KEYS.lease(0))
    d2 = make_dispatcher(name="d2")
    tick(d2)
    assert "llm.started" in types(r, "pf-b") and "llm.started" in types(r, "pf-a")
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0
    assert queue_ids(r, "llm") == [job_id("pf-a", "llm-1", 1), job_id("pf-b", "llm-1", 1)]


def test_a_dispatcher_stalled_past_its_lease_settles_nothing(
        r: redis.Redis, make_dispatcher: MakeDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commits, then stalls past its lease; B takes the partition over and replays what A
    committed. A's settle is fenced: it flushes, acknowledges and reads nothing (else the job
    would be enqueued twice, and entries read ahead by A would be stranded in A's pending list)."""
    a = make_dispatcher(name="A", lease_ms=400)
    b = make_dispatcher(name="B", lease_ms=400)
    a.leases.maintain()
    stalled: list[str] = []
    real_commit_many = a.store.commit_many

    def commit_then_stall(batch, lease_key, token, partitions):  # type: ignore[no-untyped-def]
        rcs = real_commit_many(batch, lease_key, token, partitions)
        if not stalled:
            time.sleep(0.5)  # past A's lease
            tick(b, 1)  # B takes partition 0 and replays A's committed entry
            stalled.append(send(r, "st-2", message("second")))
        return rcs

    monkeypatch.setattr(a.store, "commit_many", commit_then_stall)
    send(r, "st-1", message("first"))
    ahead = a.tick()
    assert a.leases.owned == {} and not ahead
    tick(b, 3)
    assert "llm.started" in types(r, "st-1") and "llm.started" in types(r, "st-2")
    assert sorted(queue_ids(r, "llm")) == sorted([job_id("st-1", "llm-1", 1), job_id("st-2", "llm-1", 1)])
    assert r.hlen(KEYS.outbox("st-1")) == 0
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0


def test_entries_left_pending_by_another_consumer_are_claimed_by_the_owner(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(name="owner", lease_ms=300)
    d.STALE_CHECK_S = 0.0
    tick(d, 1)  # holds the partition, recovered
    send(r, "sp-1", message("read by a ghost"))
    r.xreadgroup(Keys.GROUP, "ghost", {INPUTS: ">"}, count=10)  # a consumer that then vanished
    assert pending_count(r, INPUTS) == 1
    tick(d, 1)
    assert "llm.started" not in types(r, "sp-1")  # not idle long enough yet: maybe still worked on
    time.sleep(0.4)
    tick(d, 2)
    assert "llm.started" in types(r, "sp-1")
    assert r.xlen(INPUTS) == 0 and pending_count(r, INPUTS) == 0
