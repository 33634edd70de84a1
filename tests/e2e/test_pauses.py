"""System pauses end to end: budget stops (I3, I4, I6a) and interrupt deadlines."""

import time

import pytest
import redis

from parley.client import Client
from parley.schemas.jobs import job_id
from tests.conftest import Procs, all_events, eventually, of_type, send, wait_for
from tests.e2e.llm_calls import OK, STOPPED, llm_call_ended, start_llm_worker, wait_running
from tests.e2e.test_metrics import scrape

pytestmark = pytest.mark.e2e


def test_I3_I4_budget_stop_voids_an_llm_call_in_flight_and_resumes_with_a_higher_limit(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    port = start_llm_worker(procs)
    procs.worker("tests.apps.scenarios", "--queues", "decide,tools")
    send(r, "b1", {"type": "session.create", "budget": {"llm_calls": 1}})
    send(r, "b1", {"type": "message.create", "content": "[slow-llm] first"})
    wait_for(client, "b1", lambda e: e["type"] == "llm.started")
    wait_running(r, "b1", "llm-1")  # the budget stop below voids a call the worker runs
    send(r, "b1", {"type": "message.create", "content": "second", "parent_id": None})
    events = wait_for(client, "b1", lambda e: e["type"] == "llm.voided")
    raised = of_type(events, "interrupt.raised")[-1]
    assert raised["reason"] == "budget" and "anchor" not in raised  # global
    assert raised["payload"] == {"used": {"llm_calls": 1, "tool_calls": 0, "tokens": 0},
                                 "limit": {"llm_calls": 1, "tool_calls": None, "tokens": None},
                                 "exceeded": "llm_calls"}
    assert events[-1]["call_id"] == "llm-1"
    # the worker stops the voided call (its model would take 3 s) and posts nothing
    eventually(lambda: llm_call_ended(port), timeout=15)
    assert not r.hexists("parley:running", job_id("b1", "llm-1", 1))
    assert scrape(port)[STOPPED] == 1
    send(r, "b1", {"type": "message.create", "content": "third", "parent_id": None})
    refused = wait_for(client, "b1", lambda e: e["type"] == "input.refused")[-1]
    assert refused["code"] == "branch_parked" and refused["interrupt_ids"] == [raised["interrupt_id"]]
    time.sleep(3.2)  # past the time llm-1 would have taken: no reply of it, ever
    assert scrape(port).get(OK, 0) == 0
    send(r, "b1", {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                   "payload": {"budget": {"llm_calls": 5}}})
    events = wait_for(client, "b1", lambda e: e["type"] == "turn.completed")
    assert events[-1]["head"] != "msg-1" and of_type(events, "interrupt.resumed")[0]["delivered"] is True
    assert "llm-1" not in [e["call_id"] for e in of_type(events, "llm.completed")]
    send(r, "b1", {"type": "branch.switch", "head": "msg-1"})  # the first branch goes on when active
    events = wait_for(client, "b1", lambda e: e["type"] == "turn.completed" and e["head"] != "msg-1"
                      and e["head"] != events[-1]["head"])
    view = client.show("b1")
    assert view is not None
    replies = sorted(m["content"] for m in view["messages"] if m["role"] == "assistant")
    assert replies == ["You said: [slow-llm] first", "You said: second"]


def test_I3_I6a_token_budget_voids_a_decide_in_flight(procs: Procs, r: redis.Redis,
                                                      client: Client) -> None:
    procs.dispatcher()
    procs.worker("tests.apps.scenarios", "--queues", "llm")
    procs.worker("tests.apps.scenarios", "--queues", "decide,tools")
    send(r, "b2", {"type": "session.create", "budget": {"tokens": 4}})
    send(r, "b2", {"type": "message.create", "content": "[llm-1s] one two three"})
    wait_for(client, "b2", lambda e: e["type"] == "llm.started")
    send(r, "b2", {"type": "message.create", "content": "[slow-decide] other", "parent_id": None})
    events = wait_for(client, "b2", lambda e: e["type"] == "interrupt.raised")
    assert events[-1]["payload"]["exceeded"] == "tokens" and "anchor" not in events[-1]
    events = wait_for(client, "b2", lambda e: e["type"] == "decision.held"
                      and e["trigger"].get("message_id") == "msg-2")  # I6a: the decide in flight
    reply = [m for m in of_type(events, "message.created") if m["message"]["role"] == "assistant"]
    assert [m["message"]["content"] for m in reply] == ["You said: [llm-1s] one two three"]  # reply stays
    # A voided decide is not stopped (docs/design.md): it finishes on its worker, and its
    # decision is dropped.
    time.sleep(3.2)
    assert of_type(all_events(client, "b2"), "llm.started") == of_type(events, "llm.started")
    iid = of_type(events, "interrupt.raised")[-1]["interrupt_id"]
    send(r, "b2", {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"budget": {"tokens": 1000}}})
    events = wait_for(client, "b2", lambda e: e["type"] == "turn.completed" and e["head"] != "msg-1"
                      and e["head"] != "msg-3")
    released = of_type(events, "decision.released")
    assert any(e["trigger"].get("message_id") == "msg-2" for e in released)


def test_deadline_passing_while_dispatchers_are_down_fires_after_restart(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    dispatcher = procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    procs.worker()
    send(r, "d1", {"type": "message.create", "content": "email bob: [deadline] hi"})
    raised = wait_for(client, "d1", lambda e: e["type"] == "interrupt.raised")[-1]
    time.sleep(0.2)
    dispatcher.kill()  # kill -9: nothing runs while the deadline passes
    dispatcher.wait()
    procs.started = [p for p in procs.started if p[1] is not dispatcher]
    time.sleep(1.5)
    assert of_type(all_events(client, "d1"), "interrupt.resumed") == []
    procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    events = wait_for(client, "d1", lambda e: e["type"] == "turn.completed")
    resumed = of_type(events, "interrupt.resumed")
    assert len(resumed) == 1 and resumed[0]["interrupt_id"] == raised["interrupt_id"]
    assert resumed[0]["timed_out"] is True and resumed[0]["payload"] == {"approved": False}
    tool = [m["message"] for m in of_type(events, "message.created") if m["message"]["role"] == "tool"]
    assert tool[0]["content"] == "declined"


def test_deadline_and_human_resume_at_the_same_moment_deliver_once(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    dispatcher = procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    procs.worker()
    send(r, "d2", {"type": "message.create", "content": "email bob: [deadline] hi"})
    raised = wait_for(client, "d2", lambda e: e["type"] == "interrupt.raised")[-1]
    time.sleep(0.2)
    dispatcher.kill()
    dispatcher.wait()
    procs.started = [p for p in procs.started if p[1] is not dispatcher]
    time.sleep(1.2)  # the deadline is due, and a human answers too: both wait for a dispatcher
    send(r, "d2", {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                   "payload": {"approved": True}})
    procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    wait_for(client, "d2", lambda e: e["type"] == "turn.completed")
    time.sleep(0.5)
    events = all_events(client, "d2")
    resumed = of_type(events, "interrupt.resumed")
    assert len(resumed) == 1 and resumed[0]["delivered"] is True
    ignored = of_type(events, "input.ignored")
    if resumed[0]["timed_out"]:
        assert [e["code"] for e in ignored] == ["already_resumed"]  # the human came second
    else:
        assert ignored == [] and resumed[0]["payload"] == {"approved": True}
    assert r.zcard("parley:deadlines") == 0
