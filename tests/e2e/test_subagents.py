"""Sub-agents (docs/protocol.md, Tools: `fn.agent`): tools backed by child sessions with their
own interrupts."""

import orjson
import pytest
import redis

from parley.client import Client
from tests.conftest import Procs, eventually, of_type, send, wait_for

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
