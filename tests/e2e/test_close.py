"""Closing a session on real processes (docs/protocol.md, `session.close`): whatever it is doing
(a model call, a tool, an open interrupt with a deadline, a sub-agent), nothing of it is applied
after the close, and later inputs are refused or ignored `session_closed`."""

import os
import subprocess
import time
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.schemas.jobs import job_id
from parley.schemas.resumes import CloseStatus
from tests.conftest import ROOT, Procs, all_events, eventually, of_type, send, wait_for
from tests.e2e.llm_calls import llm_call_ended, start_llm_worker, wait_running
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

#: what shows work applied to a session: none may follow its `session.closed`
APPLIED = {"message.created", "llm.started", "llm.completed", "llm.failed", "tool.started", "tool.completed",
           "tool.deferred", "turn.completed", "interrupt.raised", "interrupt.resumed", "decision.held",
           "decision.released", "decision.failed", "branch.switched", "session.created"}


def after_close(client: Client, session: str) -> list[dict[str, Any]]:
    """The session's events after its (one) session.closed."""
    events = all_events(client, session)
    [at] = [i for i, e in enumerate(events) if e["type"] == "session.closed"]
    return events[at + 1:]


def applied_after_close(client: Client, session: str) -> list[str]:
    return [e["type"] for e in after_close(client, session) if e["type"] in APPLIED]


def parley(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_REDIS_URL": url}
    return run_parley([*args], text=True,
                          env=env, timeout=60, check=False)


def test_a_close_during_a_model_call_stops_it_and_its_reply_is_never_applied(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    port = start_llm_worker(procs)
    procs.worker("tests.apps.scenarios", "--queues", "decide,tools")
    send(r, "c1", {"type": "message.create", "content": "[slow-llm] think hard"})
    wait_for(client, "c1", lambda e: e["type"] == "llm.started")
    wait_running(r, "c1", "llm-1")
    outcome = client.close("c1", "runaway", wait=True)
    assert outcome.status is CloseStatus.CLOSED, outcome.describe()
    assert outcome.event is not None and outcome.event["reason"] == "runaway"
    assert "principal" not in outcome.event  # unsigned: no principal written
    # the worker stops the voided call (its model would take 3 s): waited for by its outcome
    eventually(lambda: llm_call_ended(port), timeout=15)
    assert not r.hexists("parley:running", job_id("c1", "llm-1", 1))
    time.sleep(3.2)  # past the time the model would have taken
    assert applied_after_close(client, "c1") == []
    view = client.show("c1")
    assert view is not None and [m["role"] for m in view["messages"]] == ["user"] and view["pending"] == []
    entry = send(r, "c1", {"type": "message.create", "content": "hello again"})
    refused = wait_for(client, "c1", lambda e: e["type"] == "input.refused")[-1]
    assert (refused["input"]["entry"], refused["code"]) == (entry, "session_closed")


def test_a_close_during_a_running_tool_records_its_result_late_and_never_applies_it(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "c2", {"type": "message.create", "content": 'call slow {"seconds": 2}'})
    wait_for(client, "c2", lambda e: e["type"] == "tool.started")
    time.sleep(0.3)  # taken by the worker: it runs on
    assert client.close("c2", wait=True).status is CloseStatus.CLOSED
    late = wait_for(client, "c2", lambda e: e["type"] == "tool.late", timeout=15)[-1]
    assert (late["call_id"], late["name"], late["result"]) == ("call-1", "slow", "slept 2")
    assert applied_after_close(client, "c2") == []
    view = client.show("c2")
    assert view is not None and "tool" not in [m["role"] for m in view["messages"]]
    eventually(lambda: r.hlen("parley:inflight") == 0 and r.hlen("parley:running") == 0)
    send(r, "c2", {"type": "tool.result", "call_id": "call-1", "result": "from outside"})
    assert wait_for(client, "c2", lambda e: e["type"] == "input.refused")[-1]["code"] == "session_closed"


def test_a_close_cancels_an_open_interrupt_its_deadline_never_fires_and_a_resume_is_ignored(
        procs: Procs, r: redis.Redis, client: Client, redis_server: Any) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "c3", {"type": "message.create", "content": "email bob: [deadline-3s] hi"})
    raised = wait_for(client, "c3", lambda e: e["type"] == "interrupt.raised")[-1]
    eventually(lambda: r.zcard("parley:deadlines") == 1 and len(client.interrupts()) == 1)  # the flush
    out = parley(redis_server.url, "close", "c3", "--reason", "nobody will answer", "--wait")
    assert (out.returncode, out.stdout.split(" (")[0]) == (0, "closed"), out.stderr
    cancelled = of_type(all_events(client, "c3"), "interrupt.cancelled")
    assert [(e["interrupt_id"], e["why"]) for e in cancelled] == \
        [(raised["interrupt_id"], "nobody will answer")]
    eventually(lambda: r.zcard("parley:deadlines") == 0 and client.interrupts() == [])
    time.sleep(3.5)  # past the deadline: it never fires
    assert applied_after_close(client, "c3") == []
    out = parley(redis_server.url, "resume", "c3", raised["interrupt_id"], '{"approved": true}', "--wait")
    assert (out.returncode, out.stdout.split(" (")[0]) == (5, "ignored session_closed"), out.stdout
    out = parley(redis_server.url, "close", "c3", "--wait")  # closed already
    assert (out.returncode, out.stdout.split(" (")[0]) == (5, "ignored session_closed"), out.stdout
    out = parley(redis_server.url, "close", "no-such-session", "--wait")
    assert (out.returncode, out.stdout.split(" (")[0]) == (5, "ignored unknown_session"), out.stdout
    assert client.show("no-such-session") is None


def test_closing_a_parent_closes_its_child_sub_agent(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("tests.apps.agents")
    procs.worker("tests.apps.agents")
    send(r, "c4", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    child = wait_for(client, "c4", lambda e: e["type"] == "tool.started")[-1]["child_session"]
    raised = wait_for(client, child, lambda e: e["type"] == "interrupt.raised")[-1]
    assert client.close("c4", "stop all", wait=True).status is CloseStatus.CLOSED
    closed = wait_for(client, child, lambda e: e["type"] == "session.closed")[-1]
    assert closed["reason"] == "abandoned" and "input" not in closed  # the engine closed it
    assert [e["interrupt_id"] for e in of_type(all_events(client, child), "interrupt.cancelled")] == \
        [raised["interrupt_id"]]
    eventually(lambda: client.interrupts() == [] and r.zcard("parley:deadlines") == 0)
    assert applied_after_close(client, "c4") == [] and applied_after_close(client, child) == []


def test_closing_a_child_sub_agent_fails_its_parents_call_at_once(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("tests.apps.agents")
    procs.worker("tests.apps.agents")
    send(r, "c5", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    child = wait_for(client, "c5", lambda e: e["type"] == "tool.started")[-1]["child_session"]
    wait_for(client, child, lambda e: e["type"] == "interrupt.raised")
    assert client.close(child, "not needed", wait=True).status is CloseStatus.CLOSED
    events = wait_for(client, "c5", lambda e: e["type"] == "turn.completed", timeout=30)
    completed = of_type(events, "tool.completed")[0]
    assert (completed["name"], completed["error"]) == ("research", "subagent_closed")
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        "Done. research (error): subagent_closed"
    eventually(lambda: client.interrupts() == [] and r.zcard("parley:deadlines") == 0)
    assert applied_after_close(client, child) == []
