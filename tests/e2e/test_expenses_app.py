"""The example app examples/expenses_app.py run as a user runs it: a dispatcher and a worker as
real processes under their shipped logins, on Redis as shipped (redis.conf with its AOF,
users.acl), every input written by the producer login.

One session goes through each way the app asks: finance's review (a decide `Interrupt`), the
receipt the tool asks for from its own code (`interrupt()`; the worker and the dispatcher are
killed -9 while it waits), the engine's approval of `reimburse`, and the async tool."""

import pytest

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.resumes import ResumeStatus
from tests.conftest import Procs, all_events, of_type, wait_for

pytestmark = pytest.mark.e2e

APP = "examples.expenses_app"


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def raised_after(client: Client, session: str, seen: set[str]) -> dict:
    """The next question raised in the session that is not one of `seen` (and remember it)."""
    event = wait_for(client, session, lambda e: e["type"] == "interrupt.raised"
                     and e["interrupt_id"] not in seen, timeout=30)[-1]
    seen.add(event["interrupt_id"])
    return event


def completed(client: Client, session: str, turns: int) -> list[dict]:
    """Every event of the session once `turns` turns have completed."""
    wait_for(client, session, lambda e: e["type"] == "turn.completed"
             and len(of_type(all_events(client, session), "turn.completed")) >= turns, timeout=30)
    return all_events(client, session)


def test_an_expense_is_reviewed_asks_for_its_receipt_through_a_crash_and_is_reimbursed_once_approved(
        procs: Procs, client: Client, producer_client: Client) -> None:
    dispatcher, worker = procs.dispatcher(APP), procs.worker(APP)
    seen: set[str] = set()

    producer_client.send("e-1", {"type": "message.create", "content": "expense 900 flight to Lisbon"})
    review = raised_after(client, "e-1", seen)
    assert (review["reason"], review["payload"]["purpose"]) == ("review", "flight to Lisbon")
    refused = producer_client.resume("e-1", review["interrupt_id"], {"approved": "yes"},
                                     wait=True, timeout_s=30)
    assert (refused.status, refused.code) == (ResumeStatus.REFUSED, "invalid_resume")  # its response_schema
    producer_client.resume("e-1", review["interrupt_id"], {"approved": True})

    receipt = raised_after(client, "e-1", seen)  # the reviewed call ran, and its code asked
    assert (receipt["reason"], receipt["call_id"]) == ("receipt", "call-1")
    for proc in (dispatcher, worker):  # the question is held by nothing but Redis now
        proc.kill()
        proc.wait()
        procs.forget(proc)
    procs.dispatcher(APP)
    procs.worker(APP)
    delivered = producer_client.resume("e-1", receipt["interrupt_id"], {"receipt": "R-2"},
                                       wait=True, timeout_s=30)
    assert delivered.status == ResumeStatus.DELIVERED
    completed(client, "e-1", 1)

    producer_client.send("e-1", {"type": "message.create", "content": "reimburse 900"})
    approval = raised_after(client, "e-1", seen)
    assert approval["reason"] == "approval"  # the engine's question: its payload names the call
    assert {k: approval["payload"][k] for k in ("call_id", "tool", "arguments")} == \
        {"call_id": "call-2", "tool": "reimburse", "arguments": {"amount": "900"}}
    producer_client.resume("e-1", approval["interrupt_id"], {"approved": True})
    completed(client, "e-1", 2)

    producer_client.send("e-1", {"type": "message.create", "content": "limit for taxi"})
    events = completed(client, "e-1", 3)
    tool_messages = [e["message"]["content"] for e in of_type(events, "message.created")
                     if e["message"]["role"] == "tool"]
    assert tool_messages == ["filed 900 EUR for flight to Lisbon with receipt R-2", "reimbursed 900 EUR",
                             "80.0"]
    assert [e["call_id"] for e in of_type(events, "tool.completed") if "error" not in e] == \
        ["call-1", "call-2", "call-3"]
    assert not of_type(events, "decision.failed") and not of_type(events, "llm.failed")
