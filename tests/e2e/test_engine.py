"""The normal flow of a session, driven as an outside producer would: XADD inputs, read events."""

import orjson
import pytest
import redis

from parley.client import Client
from tests.conftest import Procs, of_type, wait_for

pytestmark = pytest.mark.e2e


def xadd(r: redis.Redis, session: str, value: dict, **extra: str) -> str:
    return r.xadd("parley:inputs", {"session": session, "input": orjson.dumps(value), **extra}).decode()


def test_message_llm_parallel_tools_llm_turn_completed(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    procs.worker()
    xadd(r, "s-1", {"type": "message.create",
                    "content": 'call add {"a": 1, "b": 2}\ncall add {"a": 3, "b": 4}'})
    events = wait_for(client, "s-1", lambda e: e["type"] == "turn.completed")
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["session.created", "message.created"]
    reply = of_type(events, "message.created")[1]["message"]
    assert [c["id"] for c in reply["tool_calls"]] == ["call-1", "call-2"]  # model ids rewritten
    assert reply["parent_id"] == "msg-1"
    completed = of_type(events, "tool.completed")
    assert sorted(e["call_id"] for e in completed) == ["call-1", "call-2"]
    assert len(of_type(events, "llm.started")) == 2  # one after both tools settled, not two
    view = client.show("s-1")
    assert view is not None
    contents = [m["content"] for m in view["messages"]]
    assert sorted(contents[2:4]) == ["3", "7"]
    assert contents[-1].startswith("Done.") and "add: 3" in contents[-1] and "add: 7" in contents[-1]
    # tool messages hang on the turn's own line: a chain, never a fork
    for parent, child in zip(view["messages"], view["messages"][1:], strict=False):
        assert child["parent_id"] == parent["id"]
    assert view["head"] == view["messages"][-1]["id"] and view["pending"] == []
    assert events[-1] == {**events[-1], "type": "turn.completed", "head": view["head"]}


def test_bad_entries_are_rejected_kept_and_reported(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    r.xadd("parley:inputs", {"session": "s-2", "input": b"{not json"})
    r.xadd("parley:inputs", {"session": "s-2", "input": orjson.dumps({"type": "nope"})})
    r.xadd("parley:inputs", {"input": orjson.dumps({"type": "message.create", "content": "x"})})
    r.xadd("parley:inputs", {"session": "bad id!", "input": b"{}"})
    r.xadd("parley:inputs", {"session": "s-2", "input": orjson.dumps(
        {"type": "message.create", "content": "x" * 1_100_000})})  # over the 1 MiB default
    r.xadd("parley:inputs", {"session": "s-2", "input": orjson.dumps({"type": "message.create"})})
    xadd(r, "s-2", {"type": "message.create", "content": "hello"})
    events = wait_for(client, "s-2", lambda e: e["type"] == "turn.completed")
    refused = of_type(events, "input.refused")
    assert [e["code"] for e in refused] == ["invalid_input"] * 2 + ["too_large", "invalid_input"]
    assert refused[0]["input"]["type"] is None and "not valid JSON" in refused[0]["message"]
    assert refused[1]["input"]["type"] == "nope"
    assert "over the limit" in refused[2]["message"]
    assert "content" in refused[3]["message"]
    rejected = r.xrange("parley:inputs:rejected")
    assert len(rejected) == 6
    assert all(b"error" in fields and b"entry" in fields for _id, fields in rejected)
    assert of_type(events, "message.created")[-1]["message"]["content"] == "You said: hello"
    assert r.xlen("parley:inputs") == 0  # acknowledged entries are trimmed


def test_tool_error_and_failed_decisions_keep_the_session_going(procs: Procs, r: redis.Redis,
                                                                client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    xadd(r, "s-3", {"type": "message.create", "content": "call boom {}"})
    events = wait_for(client, "s-3", lambda e: e["type"] == "turn.completed")
    done = of_type(events, "tool.completed")[0]
    assert done["error"].startswith("RuntimeError: boom")
    assert of_type(events, "message.created")[-1]["message"]["content"] == "Done. boom (error): " \
        "RuntimeError: boom"
    xadd(r, "s-3", {"type": "message.create", "content": "[decide-raises]"})
    events = wait_for(client, "s-3", lambda e: e["type"] == "decision.failed")
    assert "decide blew up" in events[-1]["error"]
    xadd(r, "s-3", {"type": "message.create", "content": "[decide-invalid]", "parent_id": None})
    wait_for(client, "s-3",
             lambda e: e["type"] == "decision.failed" and "no call to settle" in e["error"])
    xadd(r, "s-3", {"type": "message.create", "content": "still here"})
    events = wait_for(client, "s-3", lambda e: e["type"] == "message.created"
                      and e["message"]["content"] == "You said: still here")


def test_refusals_idempotency_and_branch_switch(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    xadd(r, "s-4", {"type": "session.create", "metadata": {"user": "u1"}}, id="k1")
    xadd(r, "s-4", {"type": "session.create"}, id="k1")
    xadd(r, "s-4", {"type": "session.create"})
    xadd(r, "s-4", {"type": "message.create", "content": "[slow-llm] hi", "message_id": "m-a"})
    xadd(r, "s-4", {"type": "message.create", "content": "too soon"})  # parent = tip of a running turn
    xadd(r, "s-4", {"type": "message.create", "content": "x", "parent_id": "nope"})
    xadd(r, "s-4", {"type": "message.create", "content": "x", "parent_id": None, "message_id": "m-a"})
    xadd(r, "s-4", {"type": "branch.switch", "head": "nope"})
    events = wait_for(client, "s-4", lambda e: e["type"] == "turn.completed")
    assert events[0]["metadata"] == {"user": "u1"}
    assert [e["code"] for e in of_type(events, "input.ignored")] == ["duplicate", "session_exists"]
    assert [e["code"] for e in of_type(events, "input.refused")] == [
        "turn_in_progress", "unknown_parent", "duplicate_message_id", "unknown_message"]
    xadd(r, "s-4", {"type": "message.create", "content": "edit", "parent_id": None})
    wait_for(client, "s-4", lambda e: e["type"] == "turn.completed" and e["head"] != "msg-1")
    xadd(r, "s-4", {"type": "branch.switch", "head": "msg-1"})
    events = wait_for(client, "s-4", lambda e: e["type"] == "branch.switched")
    assert events[-1]["parked"] is False
    view = client.show("s-4")
    assert view is not None and view["head"] == "msg-1"
