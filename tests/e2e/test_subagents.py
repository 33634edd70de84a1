"""Sub-agents (docs/protocol.md, Tools: `fn.agent`): tools backed by child sessions with their
own interrupts."""

import json
from pathlib import Path

import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.signing import ENGINE_PRINCIPAL, signed_fields
from tests.conftest import Procs, all_events, eventually, of_type, send, wait_for

pytestmark = pytest.mark.e2e
APP = "tests.apps.agents"


def test_child_interrupt_answered_by_a_human_then_the_parent_finishes(procs: Procs, r: redis.Redis,
                                                                      client: Client) -> None:
    procs.dispatcher(APP)
    procs.worker(APP)
    send(r, "p1", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    started = wait_for(client, "p1", lambda e: e["type"] == "tool.started")[-1]
    child = started["child_session"]
    assert child == "p1:sub-1" and started["name"] == "research"
    raised = wait_for(client, child, lambda e: e["type"] == "interrupt.raised")[-1]
    first = of_type(wait_for(client, child, lambda e: e["type"] == "message.created"), "message.created")[0]
    assert first["message"]["role"] == "user"
    assert orjson.loads(first["message"]["content"]) == {"topic": "otters"}
    eventually(lambda: [(i["session"], i["parent"]) for i in client.interrupts()] == [(child, "p1")])
    view = client.show("p1")
    assert view is not None and view["parked"] is False and view["children"] == [child]  # the child only
    send(r, child, {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                    "payload": {"approved": True}})
    events = wait_for(client, "p1", lambda e: e["type"] == "turn.completed", timeout=30)
    tool = [e["message"] for e in of_type(events, "message.created") if e["message"]["role"] == "tool"]
    assert tool[0]["content"] == "Done. publish: published otters"  # the child's final reply
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        "Done. research: Done. publish: published otters"


def test_parent_parked_while_its_child_runs_holds_the_follow_on_until_resumed(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher(APP)
    procs.worker(APP)
    procs.worker(APP)
    send(r, "p2", {"type": "message.create", "content":
                   'call research {"topic": "slow otters"}\ncall send_email {"to": "bob", "body": "hi"}'})
    wait_for(client, "p2", lambda e: e["type"] == "interrupt.raised")
    events = wait_for(client, "p2", lambda e: e["type"] == "decision.held", timeout=30)  # I6
    done = of_type(events, "tool.completed")[0]
    assert done["call_id"] == "call-1" and "error" not in done
    send(r, "p2", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    events = wait_for(client, "p2", lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "decision.released")[0]["trigger"]["call_id"] == "call-1"
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        "Done. research: Done. slow_read: read; send_email: sent"


def test_children_of_children_and_a_failing_child(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher(APP)
    procs.worker(APP)
    send(r, "p3", {"type": "message.create", "content": 'call research {"topic": "deep"}'})
    events = wait_for(client, "p3", lambda e: e["type"] == "turn.completed", timeout=30)
    wait_for(client, "p3:sub-1:sub-1", lambda e: e["type"] == "turn.completed")
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        'Done. research: Done. dig: dug {"depth":1}'
    view = client.show("p3:sub-1")
    assert view is not None and view["children"] == ["p3:sub-1:sub-1"] and view["parent"] == "p3"
    send(r, "p3", {"type": "message.create", "content": 'call research {"topic": "fail"}'})
    events = wait_for(client, "p3", lambda e: e["type"] == "turn.completed" and e["head"] == "msg-8",
                      timeout=30)
    assert of_type(events, "tool.completed")[-1]["error"] == "subagent_failed"


KEYS = {"alice": "alice-secret"}


def test_sub_agents_run_under_required_signing(procs: Procs, r: redis.Redis, client: Client,
                                               tmp_path: Path) -> None:
    # The dispatcher's own inputs to a child (its creation and first message) take a trusted
    # path: under --require-signing they are not refused `unauthorized`, so the parent's
    # turn ends, through a child of a child too.
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    procs.dispatcher(APP, "--keys-file", str(keys_file), "--require-signing")
    procs.worker(APP)
    client.send("sig1", {"type": "message.create", "content": 'call research {"topic": "deep"}'},
                principal="alice", key=KEYS["alice"])
    events = wait_for(client, "sig1", lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        'Done. research: Done. dig: dug {"depth":1}'
    for child in ("sig1:sub-1", "sig1:sub-1:sub-1"):
        assert of_type(all_events(client, child), "input.refused") == []
    # a producer cannot take the trusted path: an entry claiming the engine's principal with
    # a signature of its own making is refused before it touches the session
    forged = orjson.dumps({"type": "session.create"})
    r.xadd("parley:inputs", {"session": "sig1:sub-9", "input": forged, "id": "f-1",  # type: ignore[arg-type]
                             **signed_fields("guessed", ENGINE_PRINCIPAL, "sig1:sub-9", "f-1", forged)})
    refusal = wait_for(client, "sig1:sub-9", lambda e: e["type"] == "input.refused")[-1]
    assert refusal["code"] == "unauthorized"
    assert client.show("sig1:sub-9") is None


def test_a_producer_cannot_take_a_child_id_so_the_spawn_gets_its_own_session(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher(APP)
    procs.worker(APP)
    # ids ending in `:sub-<n>` are the engine's: a producer may neither create one nor start
    # a turn in it, so the parent's first child cannot land in a conversation made up front
    # ... and it cannot use up the idempotency key of the engine's spawn either (its id is
    # derived from the engine's key: this one is the fixed id it once had)
    send(r, "p4:sub-1", {"type": "session.create", "metadata": {"mine": True}}, id="parley-spawn")
    send(r, "p4:sub-1", {"type": "message.create", "content": "hello"})
    refused = wait_for(client, "p4:sub-1", lambda e: len(of_type([e], "input.refused")) > 0)
    eventually(lambda: len(of_type(all_events(client, "p4:sub-1"), "input.refused")) == 2)
    assert [e["code"] for e in of_type(all_events(client, "p4:sub-1"), "input.refused")] == \
        ["engine_only", "engine_only"]
    assert of_type(refused, "session.created") == [] and client.show("p4:sub-1") is None
    send(r, "p4", {"type": "message.create", "content": 'call research {"topic": "deep"}'})
    events = wait_for(client, "p4", lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        'Done. research: Done. dig: dug {"depth":1}'
    child = of_type(all_events(client, "p4:sub-1"), "message.created")[0]["message"]
    assert orjson.loads(child["content"]) == {"topic": "deep"}


def test_a_child_that_never_ends_times_out_and_is_closed(procs: Procs, r: redis.Redis,
                                                         client: Client) -> None:
    procs.dispatcher(APP, "--subagent-timeout", "1.5")
    procs.worker(APP)
    send(r, "p5", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    raised = wait_for(client, "p5:sub-1", lambda e: e["type"] == "interrupt.raised")[-1]  # nobody answers
    # A producer may answer a child's interrupts; one that names the id the engine's close once
    # had (fixed, so it could be used up first) does not keep the child from being closed.
    send(r, "p5:sub-1", {"type": "interrupt.resume", "interrupt_id": "int-nope", "payload": {}},
         id="parley-close")
    events = wait_for(client, "p5", lambda e: e["type"] == "turn.completed", timeout=30)
    completed = of_type(events, "tool.completed")[0]
    assert (completed["name"], completed["error"]) == ("research", "timeout")
    assert of_type(events, "message.created")[-1]["message"]["content"] == "Done. research (error): timeout"
    closed = wait_for(client, "p5:sub-1", lambda e: e["type"] == "session.closed")[-1]
    assert closed["reason"] == "timeout"
    # its open question is cancelled: in its events and on the fleet-wide feed
    cancelled = of_type(all_events(client, "p5:sub-1"), "interrupt.cancelled")
    assert [(e["interrupt_id"], e["why"]) for e in cancelled] == [(raised["interrupt_id"], "timeout")]
    feed = [(f[b"session"], f[b"type"]) for _id, f in r.xrange("parley:feed")]
    assert (b"p5:sub-1", b"interrupt.cancelled") in feed
    eventually(lambda: client.interrupts() == [] and r.zcard("parley:deadlines") == 0)
    # a closed child takes no more inputs (its question was cancelled: an answer is ignored),
    # and runs nothing more
    entry = send(r, "p5:sub-1", {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                                 "payload": {"approved": True}})
    ignored = wait_for(client, "p5:sub-1", lambda e: e["type"] == "input.ignored"
                       and e["input"]["entry"] == entry)[-1]
    assert ignored["code"] == "session_closed"
    assert of_type(all_events(client, "p5"), "tool.completed") == [completed]
