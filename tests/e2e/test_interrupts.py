"""Durable interrupts end to end (the interrupt rules, docs/rules.md), with real dispatcher and
worker processes."""

import json
import time

import orjson
import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from parley.client import Client
from parley.schemas.jobs import job_id
from tests.conftest import Procs, all_events, eventually, of_type, send, wait_for
from tests.e2e.llm_calls import OK, STOPPED, llm_call_ended, start_llm_worker, wait_running
from tests.e2e.test_metrics import scrape
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."


def resume(r: redis.Redis, session: str, iid: str, payload: object) -> None:
    send(r, session, {"type": "interrupt.resume", "interrupt_id": iid, "payload": payload})


@pytest.mark.parametrize(("approved", "tool_message", "final"), [
    (True, "sent", "Done. send_email: sent"),
    (False, "declined", "Done. send_email (error): declined"),
])
def test_seed_scenario(procs: Procs, r: redis.Redis, client: Client, approved: bool, tool_message: str,
                       final: str) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    send(r, "seed", {"type": "message.create", "content": SEED})
    raised = wait_for(client, "seed", lambda e: e["type"] == "interrupt.raised")[-1]
    assert raised["reason"] == "confirm" and raised["payload"] == {"message": "Send the email?"}
    assert raised["anchor"] == "msg-2" and raised["interrupt_id"] == "int-1"
    view = client.show("seed")
    assert view is not None and view["parked"] is True
    assert view["pending"] == [{"call_id": "call-1", "kind": "tool", "name": "send_email"}]
    # the index is updated by the outbox flush right after the commit that emitted the event
    eventually(lambda: [(i["session"], i["interrupt_id"]) for i in client.interrupts()]
               == [("seed", "int-1")])
    resume(r, "seed", "int-1", {"approved": approved})
    events = wait_for(client, "seed", lambda e: e["type"] == "turn.completed")
    resumed = of_type(events, "interrupt.resumed")
    assert len(resumed) == 1 and resumed[0]["delivered"] is True and resumed[0]["timed_out"] is False
    messages = [e["message"] for e in of_type(events, "message.created")]
    assert messages[2]["role"] == "tool" and messages[2]["content"] == tool_message
    assert messages[2]["tool_call_id"] == "call-1" and bool(messages[2].get("error")) is not approved
    assert messages[3]["content"] == final
    eventually(lambda: client.interrupts() == [])


def test_I4_llm_call_in_flight_is_voided_stopped_and_its_reply_never_appears(procs: Procs, r: redis.Redis,
                                                                             client: Client) -> None:
    procs.dispatcher()
    port = start_llm_worker(procs)
    procs.worker("tests.apps.scenarios", "--queues", "decide")
    send(r, "i4", {"type": "message.create", "content": "[parallel] [slow-llm] hi"})
    # `lookup` completing parks the branch: its worker starts once the model call runs, so the
    # park voids a call in flight (not one still queued, which is merely taken off its queue)
    wait_running(r, "i4", "llm-1")
    procs.worker("tests.apps.scenarios", "--queues", "tools")
    events = wait_for(client, "i4", lambda e: e["type"] == "llm.voided")
    assert events[-1] == {**events[-1], "call_id": "llm-1", "interrupt_id": "int-1"}
    raised = of_type(events, "interrupt.raised")[0]
    assert raised["reason"] == "review"
    # The worker stops the voided call (its model would take 3 s) and posts nothing.
    eventually(lambda: llm_call_ended(port), timeout=15)
    assert not r.hexists("parley:running", job_id("i4", "llm-1", 1))
    assert scrape(port)[STOPPED] == 1
    time.sleep(3.5)  # past the time the call would have taken: no reply of it, ever
    assert [e["type"] for e in all_events(client, "i4")][-1] == "llm.voided"
    assert scrape(port).get(OK, 0) == 0
    resume(r, "i4", "int-1", {"ok": True})
    events = wait_for(client, "i4", lambda e: e["type"] == "turn.completed")
    completed = of_type(events, "llm.completed")
    assert [e["call_id"] for e in completed] == ["llm-2"]  # llm-1's reply was never recorded
    assistant = [m["message"] for m in of_type(events, "message.created")
                 if m["message"]["role"] == "assistant" and m["message"]["content"]]
    assert [m["content"] for m in assistant] == ["Done. lookup: found x"]


def test_I6_I10_tool_finishing_while_parked_is_recorded_and_its_follow_on_held(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker("tests.apps.scenarios", "--queues", "tools")
    procs.worker("tests.apps.scenarios", "--queues", "decide,llm")
    send(r, "i6", {"type": "message.create",
                   "content": 'call slow {"seconds": 1.5}\ncall send_email {"to": "bob", "body": "hi"}'})
    wait_for(client, "i6", lambda e: e["type"] == "interrupt.raised")
    events = wait_for(client, "i6", lambda e: e["type"] == "decision.held")
    tool_msg = [e for e in of_type(events, "message.created") if e["message"]["role"] == "tool"]
    assert [m["message"]["content"] for m in tool_msg] == ["slept 1.5"]  # I6: recorded at once
    assert events[-1]["trigger"] == {"type": "tool.completed", "call_id": "call-1"}
    time.sleep(0.5)
    assert of_type(all_events(client, "i6"), "llm.started") == of_type(events, "llm.started")
    resume(r, "i6", "int-1", {"approved": True})
    events = wait_for(client, "i6", lambda e: e["type"] == "turn.completed")
    kinds = [e["type"] for e in events]
    assert kinds.index("decision.held") < kinds.index("interrupt.resumed") < kinds.index(
        "decision.released")
    released = [e["trigger"]["call_id"] for e in of_type(events, "decision.released")]
    assert released == ["call-1", "call-2"]  # I10: in the order held
    assert len(of_type(events, "llm.started")) == 2  # one before the pause, one after: never two
    assert events[-2]["type"] == "llm.completed"


def test_I7_I8_I9_I10_edit_switch_back_and_resume_off_branch(procs: Procs, r: redis.Redis,
                                                           client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "i7", {"type": "message.create", "content": "email bob: hi"})
    wait_for(client, "i7", lambda e: e["type"] == "interrupt.raised")
    send(r, "i7", {"type": "message.create", "content": "never mind", "parent_id": None})  # I7
    events = wait_for(client, "i7", lambda e: e["type"] == "turn.completed")
    new_head = events[-1]["head"]
    assert new_head == "msg-4"
    send(r, "i7", {"type": "branch.switch", "head": "msg-2"})  # I8
    events = wait_for(client, "i7", lambda e: e["type"] == "branch.switched")
    assert events[-1] == {**events[-1], "head": "msg-2", "parked": True, "interrupt_ids": ["int-1"]}
    send(r, "i7", {"type": "message.create", "content": "more"})  # I5 under the parked head
    events = wait_for(client, "i7", lambda e: e["type"] == "input.refused")
    assert events[-1]["code"] == "branch_parked" and events[-1]["interrupt_ids"] == ["int-1"]
    send(r, "i7", {"type": "branch.switch", "head": new_head})
    resume(r, "i7", "int-1", {"approved": True})  # I9: its turn is not active
    events = wait_for(client, "i7", lambda e: e["type"] == "interrupt.resumed")
    assert events[-1]["delivered"] is False
    events = wait_for(client, "i7", lambda e: e["type"] == "decision.held")
    assert events[-1]["trigger"] == {"type": "tool.execute", "call_id": "call-1"}
    send(r, "i7", {"type": "branch.switch", "head": "msg-2"})  # I10: released at the switch
    events = wait_for(client, "i7", lambda e: e["type"] == "interrupt.raised"
                      and e["interrupt_id"] == "int-2")
    assert of_type(events, "branch.switched")[-1]["parked"] is False
    assert of_type(events, "decision.released")[-1]["trigger"]["call_id"] == "call-1"
    resume(r, "i7", "int-2", {"approved": True})
    events = wait_for(client, "i7", lambda e: e["type"] == "turn.completed" and e["head"] != new_head)
    view = client.show("i7")
    assert view is not None and view["messages"][-1]["content"] == "Done. send_email: sent"


def test_I11_same_resume_twice_in_one_pipeline_delivers_once(procs: Procs, r: redis.Redis,
                                                             client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "i11", {"type": "message.create", "content": SEED})
    wait_for(client, "i11", lambda e: e["type"] == "interrupt.raised")
    pipe = r.pipeline()
    for _ in range(2):
        pipe.xadd("parley:inputs", {"session": "i11", "input": orjson.dumps(
            {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})})
    pipe.execute()
    send(r, "i11", {"type": "interrupt.resume", "interrupt_id": "int-9"})
    events = wait_for(client, "i11", lambda e: e["type"] == "turn.completed")
    time.sleep(0.3)
    events = all_events(client, "i11")
    assert len(of_type(events, "interrupt.resumed")) == 1
    assert [e["code"] for e in of_type(events, "input.ignored")] == ["already_resumed", "unknown_interrupt"]
    assert len([m for m in of_type(events, "message.created") if m["message"]["role"] == "tool"]) == 1


def work_of(r: redis.Redis, session: str) -> list[tuple[str, str]]:
    """Every job of `session` Parley knows of: running on a worker (`parley:running`), enqueued
    and not answered (`parley:inflight`), or waiting in an RQ queue (by its job's payload).
    Workers take Parley's jobs on the lean path, which writes none of RQ's registries."""
    found = [(where, job.decode()) for where, key in (("running", "parley:running"),
                                                      ("inflight", "parley:inflight"))
             for job, raw in r.hgetall(key).items() if orjson.loads(raw)["session"] == session]
    for queue in ("decide", "llm", "tools"):
        for job in Queue(queue, connection=r, serializer=JSONSerializer).get_jobs():
            if job.args[0]["session"] == session:
                found.append((queue, job.id))
    return found


def test_I12_a_parked_session_has_nothing_queued_or_running(procs: Procs, r: redis.Redis,
                                                            client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    # the check sees work when there is some: a tool running on the worker, then nothing
    send(r, "i12-busy", {"type": "message.create", "content": 'call slow {"seconds": 2}'})
    eventually(lambda: [where for where, _job in work_of(r, "i12-busy")] == ["running", "inflight"])
    wait_for(client, "i12-busy", lambda e: e["type"] == "turn.completed")
    eventually(lambda: work_of(r, "i12-busy") == [])
    send(r, "i12", {"type": "message.create", "content": SEED})
    wait_for(client, "i12", lambda e: e["type"] == "interrupt.raised")
    time.sleep(0.5)  # let the worker finish the decide job that raised it
    assert work_of(r, "i12") == []
    assert r.hlen("parley:{i12}:outbox") == 0
    out = run_parley(["--redis-url", procs.url, "interrupts", "--json"], text=True, check=True)
    assert [row["interrupt_id"] for row in json.loads(out.stdout)] == ["int-1"]
