"""Admission limits and bad input against a real Redis (docs/protocol.md, "Limits", "Rejected
entries", and inputs naming a session that does not exist): what the dispatcher refuses as it
applies, the counts it publishes for the submit function, and the garbage bad input must not
leave behind."""

import logging
import time
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.core import AdmissionLimits
from parley.dispatcher.limits_config import publish_limits
from parley.dispatcher.rejected import COPY_BYTES, rejected_copy
from parley.schemas.signing import Keyring, signed_fields
from tests.integration.conftest import (
    INPUTS,
    KEYS,
    MakeDispatcher,
    events,
    post_outcome,
    send,
    tick,
    types,
)


def session_keys(r: redis.Redis) -> list[bytes]:
    """Every key of any session (they all carry the `{S}` hash tag), counted with SCAN."""
    return list(r.scan_iter(match="parley:{*}:*", count=1000))


def drain(r: redis.Redis, d: Any, stream: str = INPUTS) -> None:
    while r.xlen(stream):
        tick(d, 1)
    tick(d, 1)


def refusal(r: redis.Redis, session: str) -> dict[str, Any]:
    [refused] = [e for e in events(r, session) if e["type"] == "input.refused"]
    return refused


# ---- the counts the submit function reads -------------------------------------------------------


def test_the_commit_writes_the_message_and_branch_counts_to_the_meta_hash(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    send(r, "s-1", {"type": "message.create", "content": "hi", "message_id": "a"})
    tick(d)
    assert r.hmget(KEYS.meta("s-1"), "n_msgs", "n_branches") == [b"1", b"1"]
    post_outcome(r, session="s-1", work="llm-1", attempt=1, kind="llm", ok=True, value={"content": "yo"})
    tick(d)
    assert r.hmget(KEYS.meta("s-1"), "n_msgs", "n_branches") == [b"2", b"1"]
    send(r, "s-1", {"type": "message.create", "content": "edit", "parent_id": "a"})  # a fork
    tick(d)
    assert r.hmget(KEYS.meta("s-1"), "n_msgs", "n_branches") == [b"3", b"2"]


# ---- limits checked as the dispatcher applies ----------------------------------------------------


def test_a_message_over_the_sessions_limits_is_refused_session_full_when_applied(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(admission=AdmissionLimits(messages=2, branches=1))
    send(r, "s-f", {"type": "message.create", "content": "hi"})
    tick(d)
    send(r, "s-f", {"type": "message.create", "content": "a new root", "parent_id": None})
    tick(d)
    assert refusal(r, "s-f")["code"] == "session_full"
    assert r.hget(KEYS.meta("s-f"), "n_msgs") == b"1"


def test_an_input_over_the_size_limit_is_refused_too_large_and_kept_cut(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(admission=AdmissionLimits(input_bytes=10_000))
    big = orjson.dumps({"type": "message.create", "content": "x" * 20_000})
    entry = r.xadd(INPUTS, {"session": "s-big", "input": big, "id": "k-1"}).decode()
    send(r, "s-ok", {"type": "message.create", "content": "x" * 9_000})
    tick(d)
    no = refusal(r, "s-big")
    assert no["code"] == "too_large" and no["input"]["entry"] == entry
    assert f"{len(big)} bytes, over the limit of 10000" in no["message"]
    [(_id, copy)] = r.xrange(KEYS.rejected)
    expected = rejected_copy({b"session": b"s-big", b"input": big, b"id": b"k-1"}, "", "", "")
    assert copy[b"input"] == expected[b"input"] and copy[b"input_bytes"] == str(len(big)).encode()
    assert copy[b"entry"] == entry.encode()
    assert "message.created" in types(r, "s-ok")  # within the limit: applied


def test_an_entry_whose_other_fields_are_big_is_refused_too_large(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """Every field counts (docs/protocol.md, "Limits"): the input limit and 4 KiB for the rest."""
    d = make_dispatcher(admission=AdmissionLimits(input_bytes=10_000))
    small = orjson.dumps({"type": "message.create", "content": "hi"})
    entry = r.xadd(INPUTS, {"session": "s-pad", "input": small, "pad": b"p" * 20_000}).decode()
    send(r, "s-ok", {"type": "message.create", "content": "x" * 9_000}, pad="p" * 4_000)
    tick(d)
    no = refusal(r, "s-pad")
    assert no["code"] == "too_large" and no["input"]["entry"] == entry
    assert "over the limit of 14096 (the input limit and 4096 bytes for the other fields)" in no["message"]
    assert "message.created" in types(r, "s-ok")  # within both: applied


def test_twenty_entries_of_5_mb_keep_only_their_first_kib_in_the_rejected_stream(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    huge = b"{" + b" " * (5 * 1024 * 1024)
    for i in range(20):
        r.xadd(INPUTS, {"session": f"s-{i}", "input": huge})
    drain(r, d)
    assert r.xlen(KEYS.rejected) == 20
    assert all(f[b"input_bytes"] == str(len(huge)).encode() and len(f[b"input"]) < COPY_BYTES
               for _id, f in r.xrange(KEYS.rejected))
    assert r.memory_usage(KEYS.rejected) < 20 * 8 * 1024  # ~4 KiB each, not 100 MB


# ---- no garbage from inputs naming no session ----------------------------------------------------


def write_ghost_resumes(r: redis.Redis, n: int) -> None:
    """n resumes, each naming a session that does not exist (`ghost-<i>`), written at once."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(INPUTS, {"session": f"ghost-{i}", "id": f"k-{i}", "input": orjson.dumps(
            {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": True})})
    pipe.execute()


def test_ten_thousand_resumes_naming_no_session_leave_no_key_after_the_ttl(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(batch=1000, unknown_session_ttl_ms=3000)
    write_ghost_resumes(r, 10_000)
    drain(r, d)
    # The answer is readable for the TTL: a client waiting on its resume sees it.
    [ignored] = events(r, "ghost-9999")
    assert (ignored["type"], ignored["code"]) == ("input.ignored", "unknown_interrupt")
    assert 0 < r.pttl(KEYS.meta("ghost-9999")) <= 3000
    assert 0 < r.pttl(KEYS.idempotency_keys("ghost-9999")) <= 3000
    time.sleep(3.1)
    assert session_keys(r) == []


def test_ten_thousand_unsigned_entries_under_required_signing_leave_no_key_after_the_ttl(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(batch=1000, unknown_session_ttl_ms=3000, keyring=Keyring({"alice": "k"}, True))
    write_ghost_resumes(r, 10_000)
    drain(r, d)
    assert refusal(r, "ghost-9999")["code"] == "unauthorized"
    assert 0 < r.pttl(KEYS.events("ghost-9999")) <= 3000
    time.sleep(3.1)
    assert session_keys(r) == []
    assert r.xlen(KEYS.rejected) == 10_000  # copies, capped in count and bytes


def test_a_session_created_under_such_an_id_keeps_its_keys(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(unknown_session_ttl_ms=60_000)
    send(r, "s-late", {"type": "interrupt.resume", "interrupt_id": "int-1"}, id="r-1")
    tick(d)
    assert r.pttl(KEYS.events("s-late")) > 0 and r.pttl(KEYS.meta("s-late")) > 0
    send(r, "s-late", {"type": "message.create", "content": "now it exists"}, id="m-1")
    tick(d)
    for key in (KEYS.meta("s-late"), KEYS.events("s-late"), KEYS.idempotency_keys("s-late"),
                KEYS.messages("s-late")):
        assert r.pttl(key) == -1, key  # kept for good, the early refusal's event included
    assert types(r, "s-late")[:2] == ["input.ignored", "session.created"]


def test_a_session_created_after_a_rejected_entry_keeps_its_keys(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(unknown_session_ttl_ms=60_000, keyring=Keyring({"alice": "k"}, True))
    send(r, "s-rej", {"type": "message.create", "content": "unsigned"}, id="u-1")
    tick(d)
    assert refusal(r, "s-rej")["code"] == "unauthorized" and r.pttl(KEYS.events("s-rej")) > 0
    raw = orjson.dumps({"type": "message.create", "content": "signed"})
    r.xadd(INPUTS, {"session": "s-rej", "input": raw, "id": "m-1",
                    **signed_fields("k", "alice", "s-rej", "m-1", raw)})
    tick(d)
    assert "session.created" in types(r, "s-rej")
    assert r.pttl(KEYS.events("s-rej")) == -1 and r.pttl(KEYS.meta("s-rej")) == -1


def test_a_rejection_on_an_existing_session_sets_no_ttl(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(unknown_session_ttl_ms=1000)
    send(r, "s-x", {"type": "message.create", "content": "hi"})
    tick(d)
    r.xadd(INPUTS, {"session": "s-x", "input": b"not json", "id": "bad-1"})
    send(r, "s-x", {"type": "tool.result", "call_id": "call-9", "result": 1})  # ignored
    tick(d)
    assert refusal(r, "s-x")["code"] == "invalid_input"
    assert [r.pttl(k) for k in (KEYS.meta("s-x"), KEYS.events("s-x"), KEYS.idempotency_keys("s-x"))] \
        == [-1, -1, -1]


# ---- the limits published for the submit function -------------------------------------------------


def test_each_dispatcher_publishes_its_limits_and_the_last_started_wins_logged(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    publish_limits(r, KEYS, AdmissionLimits())
    assert r.hmget(KEYS.config, "limit_input_bytes", "limit_pending", "limit_messages",
                   "limit_branches") == [b"1048576", b"100", b"10000", b"1000"]
    with caplog.at_level(logging.WARNING, logger="parley.dispatcher"):
        publish_limits(r, KEYS, AdmissionLimits())  # the same values: nothing to say
        assert not caplog.records
        publish_limits(r, KEYS, AdmissionLimits(messages=50))
    assert r.hget(KEYS.config, "limit_messages") == b"50"
    [warning] = caplog.records
    assert "last dispatcher started wins" in warning.getMessage()
    assert warning.kv == {"limit_messages": "10000 -> 50"}  # type: ignore[attr-defined]
