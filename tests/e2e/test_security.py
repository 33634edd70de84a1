"""Fail closed (docs/protocol.md, Signing; `resumable_by` in Actions): signed inputs, who may
resume, replays and forgeries."""

import json
import time
from pathlib import Path

import orjson
import pytest
import redis

from parley.client import Client
from parley.dispatcher.store import Store
from parley.schemas.keys import Keys
from parley.schemas.signing import signed_fields
from tests.conftest import Procs, all_events, eventually, of_type, wait_for

pytestmark = pytest.mark.e2e
KEYS = {"alice": "alice-secret", "bob": "bob-secret"}


def decides(r: redis.Redis, session: str) -> int:
    state, _ = Store(r, Keys()).load(session)
    assert state.core is not None
    return state.core.seq.get("dec", 0)


def test_forged_replayed_and_unpermitted_resumes_are_refused(procs: Procs, r: redis.Redis, client: Client,
                                                              tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    procs.dispatcher("tests.apps.scenarios", "--keys-file", str(keys_file), "--require-signing")
    procs.worker()
    client.send("sec", {"type": "message.create", "content": "email bob: [guarded] hi"},
                principal="alice", key=KEYS["alice"])
    raised = wait_for(client, "sec", lambda e: e["type"] == "interrupt.raised")[-1]
    time.sleep(0.3)
    before = decides(r, "sec")
    resume = {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
              "payload": {"approved": True}}
    raw = orjson.dumps(resume)
    # unsigned, forged (wrong key), stale (older than 24 h), and an unknown principal
    client.send("sec", resume, "r-unsigned")
    client.send("sec", resume, "r-forged", principal="alice", key="not-alice-secret")
    stale = {"session": "sec", "input": raw, "id": "r-stale",
             **signed_fields(KEYS["alice"], "alice", "sec", "r-stale", raw, now_ms=int(time.time() * 1000)
                             - 25 * 3600 * 1000)}
    r.xadd("parley:inputs", stale)  # type: ignore[arg-type]
    client.send("sec", resume, "r-mallory", principal="mallory", key="whatever")
    # bob signs correctly but is not in resumable_by; then his exact entry is replayed,
    # and replayed again under a new id (the signature covers the id)
    bob = {"session": "sec", "input": raw, "id": "r-bob",
           **signed_fields(KEYS["bob"], "bob", "sec", "r-bob", raw)}
    r.xadd("parley:inputs", bob)  # type: ignore[arg-type]
    r.xadd("parley:inputs", bob)  # type: ignore[arg-type]
    r.xadd("parley:inputs", {**bob, "id": "r-bob-2"})  # type: ignore[arg-type]
    eventually(lambda: len(of_type(all_events(client, "sec"), "input.refused")) >= 6)
    time.sleep(0.3)
    events = all_events(client, "sec")
    refused = [(e["code"], e["message"].split(":")[0]) for e in of_type(events, "input.refused")]
    assert [code for code, _ in refused] == ["unauthorized"] * 4 + ["forbidden", "unauthorized"]
    assert [e["code"] for e in of_type(events, "input.ignored")] == ["duplicate"]
    assert of_type(events, "interrupt.resumed") == []
    assert decides(r, "sec") == before  # decide never ran for any of them
    assert [i["interrupt_id"] for i in client.interrupts()] == [raised["interrupt_id"]]
    assert all("secret" not in str(e) for e in events)  # keys never reach events
    # the right principal's resume is delivered and names who answered
    client.send("sec", resume, "r-alice", principal="alice", key=KEYS["alice"])
    events = wait_for(client, "sec", lambda e: e["type"] == "turn.completed")
    resumed = of_type(events, "interrupt.resumed")
    assert len(resumed) == 1 and resumed[0]["principal"] == "alice" and resumed[0]["delivered"] is True


def test_resumable_by_with_signing_off_refuses_every_unsigned_resume(procs: Procs, r: redis.Redis,
                                                                     client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    client.send("sec2", {"type": "message.create", "content": "email bob: [guarded] hi"})
    raised = wait_for(client, "sec2", lambda e: e["type"] == "interrupt.raised")[-1]
    client.send("sec2", {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                         "payload": {"approved": True}}, "claims-alice")
    r.xadd("parley:inputs", {"session": "sec2", "principal": "alice", "input": orjson.dumps(
        {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"]})})
    eventually(lambda: len(of_type(all_events(client, "sec2"), "input.refused")) >= 2)
    events = all_events(client, "sec2")
    assert [e["code"] for e in of_type(events, "input.refused")] == ["forbidden"] * 2
    assert of_type(events, "interrupt.resumed") == []
