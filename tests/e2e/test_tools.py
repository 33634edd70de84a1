"""Tools in practice: deferred tools settled from outside, and time limits (docs/protocol.md,
Tools; the decide and model-call limits in Triggers and Model calls)."""

import pytest
import redis

from parley.client import Client
from tests.conftest import Procs, of_type, send, wait_for

pytestmark = pytest.mark.e2e


def test_I6_deferred_call_settled_while_the_branch_is_parked_by_another_interrupt(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "t1", {"type": "message.create",
                   "content": 'call later {"what": "approval"}\ncall send_email {"to": "bob", "body": "hi"}'})
    events = wait_for(client, "t1", lambda e: e["type"] == "interrupt.raised")
    deferred = of_type(events, "tool.deferred")[0]
    assert deferred == {**deferred, "call_id": "call-1", "name": "later", "arguments": {"what": "approval"}}
    send(r, "t1", {"type": "tool.result", "call_id": "call-1", "result": {"ok": True}})
    events = wait_for(client, "t1", lambda e: e["type"] == "decision.held")
    tool_msg = [e["message"] for e in of_type(events, "message.created") if e["message"]["role"] == "tool"]
    assert tool_msg[0]["content"] == '{"ok":true}' and tool_msg[0]["tool_call_id"] == "call-1"
    send(r, "t1", {"type": "tool.result", "call_id": "call-1", "result": "again"})
    send(r, "t1", {"type": "tool.result", "call_id": "call-9", "error": "x"})
    events = wait_for(client, "t1", lambda e: e["type"] == "input.ignored" and e["code"] == "unknown_call")
    assert [e["code"] for e in of_type(events, "input.ignored")] == ["already_settled", "unknown_call"]
    send(r, "t1", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    events = wait_for(client, "t1", lambda e: e["type"] == "turn.completed")
    assert len(of_type(events, "llm.started")) == 2
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        'Done. later: {"ok":true}; send_email: sent'


@pytest.mark.parametrize("deferred_first", [True, False])
def test_deferred_and_ordinary_calls_settle_in_either_order(procs: Procs, r: redis.Redis, client: Client,
                                                             deferred_first: bool) -> None:
    procs.dispatcher()
    procs.worker()
    send(r, "t2", {"type": "message.create", "content": 'call later {"what": "x"}\ncall slow {"seconds": 1}'})
    wait_for(client, "t2", lambda e: e["type"] == "tool.deferred")
    if not deferred_first:
        wait_for(client, "t2", lambda e: e["type"] == "tool.completed")
    send(r, "t2", {"type": "tool.result", "call_id": "call-1", "error": "rejected by the reviewer"})
    events = wait_for(client, "t2", lambda e: e["type"] == "turn.completed")
    completed = [e["call_id"] for e in of_type(events, "tool.completed")]
    assert completed == (["call-1", "call-2"] if deferred_first else ["call-2", "call-1"])
    assert len(of_type(events, "llm.started")) == 2  # one model call once both settled
    final = of_type(events, "message.created")[-1]["message"]["content"]
    assert "later (error): rejected by the reviewer" in final and "slow: slept 1" in final


def test_time_limits_fail_each_kind_of_job_and_the_turn_goes_on(procs: Procs, r: redis.Redis,
                                                                client: Client) -> None:
    procs.dispatcher("tests.apps.scenarios", "--decide-timeout", "1", "--llm-timeout", "1")
    procs.worker()
    send(r, "t3", {"type": "message.create", "content": 'call slow_limited {"seconds": 3}'})
    events = wait_for(client, "t3", lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "tool.completed")[0]["error"] == "timeout"  # fn.timeout_s = 1
    send(r, "t3", {"type": "message.create", "content": "[slow-decide] hi"})
    events = wait_for(client, "t3", lambda e: e["type"] == "decision.failed", timeout=30)
    assert events[-1]["error"] == "timeout" and events[-1]["trigger"]["type"] == "message.created"
    wait_for(client, "t3", lambda e: e["type"] == "turn.completed" and e["head"] == "msg-5")
    send(r, "t3", {"type": "message.create", "content": "[slow-llm] hi"})
    events = wait_for(client, "t3", lambda e: e["type"] == "llm.failed", timeout=30)
    assert events[-1]["error"] == "timeout"
    events = wait_for(client, "t3", lambda e: e["type"] == "turn.completed" and e["head"] == "msg-6")
