"""`parley.interrupt()` inside a tool, end to end under the shipped deployment (redis.conf with
its AOF, users.acl, every process under its own login, inputs from the producer login).

A tool asks twice; between its questions every process is killed -9 and Redis itself is killed
and restarted from its AOF: the question lives only in the session's state. Each answer runs the
tool again from its start (a file outside Redis counts the runs), and the call settles once
with what the last run returned."""

from pathlib import Path

import pytest

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.resumes import ResumeStatus
from tests.conftest import Procs, all_events, of_type, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def test_a_tool_asks_twice_through_restarts_and_runs_on_with_both_answers(
        procs: Procs, client: Client, producer_client: Client, redis_server: RedisServer,
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"  # evidence kept outside the system under test
    dispatcher, worker = procs.dispatcher(), procs.worker()
    producer_client.send("ask", {"type": "message.create",
                                 "content": f'call transfer {{"amount": 5, "log": "{runs}"}}'})
    raised = wait_for(client, "ask", lambda e: e["type"] == "interrupt.raised", timeout=30)[-1]
    assert (raised["reason"], raised["call_id"]) == ("which_account", "call-1")
    assert raised["payload"] == {"amount": 5}
    view = client.show("ask")
    assert view is not None and view["parked"] is True

    for proc in (dispatcher, worker):  # nothing but Redis holds the question now
        proc.kill()
        proc.wait()
        procs.forget(proc)
    redis_server.stop(kill=True)
    redis_server.start()
    procs.dispatcher()
    procs.worker()

    wrong = producer_client.resume("ask", raised["interrupt_id"], "cash", wait=True, timeout_s=30)
    assert (wrong.status, wrong.code) == (ResumeStatus.REFUSED, "invalid_resume")  # its response_schema
    right = producer_client.resume("ask", raised["interrupt_id"], "savings", wait=True, timeout_s=30)
    assert right.status == ResumeStatus.DELIVERED
    confirm = wait_for(client, "ask", lambda e: e["type"] == "interrupt.raised"
                       and e["interrupt_id"] != raised["interrupt_id"], timeout=30)[-1]
    assert (confirm["reason"], confirm["call_id"]) == ("confirm", "call-1")
    assert confirm["payload"] == {"account": "savings", "amount": 5}
    producer_client.resume("ask", confirm["interrupt_id"], True)
    events = wait_for(client, "ask", lambda e: e["type"] == "turn.completed", timeout=30)

    [settled] = of_type(events, "tool.completed")
    assert settled["call_id"] == "call-1" and "error" not in settled
    tool_messages = [e["message"] for e in of_type(all_events(client, "ask"), "message.created")
                     if e["message"]["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["moved 5 from savings"]
    resumed = of_type(events, "interrupt.resumed")
    assert [e["call_id"] for e in resumed] == ["call-1", "call-1"]
    assert runs.read_text() == "run\n" * 3  # once per question, and once with both answers
