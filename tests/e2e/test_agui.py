"""The AG-UI endpoint end to end, as deployed: Redis with the shipped redis.conf and users.acl,
the dispatcher, the worker and `parley agui` as processes under their shipped logins (the
endpoint under the producer's), a model that streams (tests/sse_server.py, which keeps what it
was asked), and every event the endpoint writes validated by the AG-UI SDK's models.

A turn streams its reply as text message events before the run ends; a tool only the desk
may approve ends the run with an AG-UI interrupt outcome naming the call; a resume that does
not match the question's schema is refused and changes nothing; the right one, signed as the
endpoint's principal, runs the tool, and the run streams the rest of the turn."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, free_port
from parley.schemas.keys import Keys
from tests.agui.served import Endpoint, drive, wait_serving
from tests.conftest import Procs, all_events, of_type
from tests.deployed import login
from tests.sse_server import Stream, StreamServer, stream_server

pytestmark = pytest.mark.e2e

APP = "tests.apps.agui_app"
DESK_KEY = "desk-signing-key-0123456789"
PAY = {"id": "m-call-1", "name": "pay", "arguments": {"to": "acme", "amount": "120 EUR"}}


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


@pytest.fixture
def model_server() -> Iterator[StreamServer]:
    with stream_server() as server:
        yield server


@pytest.fixture
def endpoint(procs: Procs, redis_server: RedisServer, r: redis.Redis, model_server: StreamServer,
             tmp_path: Path) -> Endpoint:
    r.hset(Keys().producers, "agui", orjson.dumps({"tenant": None}))  # the operator registers it
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"desk": DESK_KEY, "mallory": "mallory-signing-key-0123"}))
    procs.dispatcher(APP, "--keys-file", str(keys))
    procs.start("worker", APP, env={"PARLEY_LLM_BASE_URL": model_server.base_url})
    port = free_port()
    procs.start("agui", APP, "--port", str(port), "--token", "t0ken",
                env={"PARLEY_REDIS_URL": redis_server.url_as(login("parley-agui")), "PARLEY_PRODUCER": "agui",
                     "PARLEY_PRINCIPAL": "desk", "PARLEY_SIGNING_KEY": DESK_KEY})
    url = f"http://127.0.0.1:{port}/"
    wait_serving(url)
    return Endpoint(url, token="t0ken")


def run_input(thread: str, run: str, messages: list[dict[str, Any]], state: Any = None,
              resume: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"threadId": thread, "runId": run, "messages": messages, "tools": [],
                            "context": [], "forwardedProps": {}, "state": state if state is not None else {}}
    if resume is not None:
        body["resume"] = resume
    return body


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_a_turn_streams_an_approval_ends_the_run_and_the_signed_resume_runs_the_tool(
        endpoint: Endpoint, model_server: StreamServer, client: Client, r: redis.Redis) -> None:
    model_server.reply(Stream(["Paying ", "acme ", "now."], delay_s=0.02, tool_calls=[PAY]),
                       Stream(["Paid ", "120 EUR ", "to acme."], delay_s=0.02))
    user = {"id": "u-1", "role": "user", "content": "Pay acme's invoice of 120 EUR"}

    first = endpoint.run(run_input("ag-1", "run-1", [user]))
    assert types(first)[0] == "RUN_STARTED" and types(first)[-1] == "RUN_FINISHED"
    pieces = [e["delta"] for e in first if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(pieces) == "Paying acme now." and len(pieces) >= 2  # streamed, not one block
    start = next(e for e in first if e["type"] == "TOOL_CALL_START")
    assert (start["toolCallName"], start["toolCallId"]) == ("pay", "call-1")
    assert json.loads("".join(e["delta"] for e in first if e["type"] == "TOOL_CALL_ARGS")) == PAY["arguments"]
    outcome = first[-1]["outcome"]
    assert outcome["type"] == "interrupt"
    [asked] = outcome["interrupts"]
    assert (asked["reason"], asked["toolCallId"]) == ("approval", "call-1")
    assert asked["message"] == "Pay this invoice?"
    assert asked["responseSchema"]["required"] == ["approved"]
    assert asked["metadata"]["parley"]["resumableBy"] == ["desk"]
    state = next(e for e in first if e["type"] == "STATE_SNAPSHOT")["snapshot"]
    assert state["parley"]["session"] == "ag-1"
    assert not of_type(all_events(client, "ag-1"), "tool.started")  # nothing ran unapproved

    wrong = endpoint.run(run_input("ag-1", "run-2", [user], state,
                                   resume=[{"interruptId": asked["id"], "status": "resolved",
                                            "payload": {"approved": "yes"}}]))
    assert types(wrong) == ["RUN_STARTED", "RUN_ERROR"]
    assert wrong[-1]["code"] == "invalid_resume" and "$.approved" in wrong[-1]["message"]
    assert not of_type(all_events(client, "ag-1"), "interrupt.resumed")  # nothing was sent

    second = endpoint.run(run_input("ag-1", "run-3", [user], state,
                                    resume=[{"interruptId": asked["id"], "status": "resolved",
                                             "payload": {"approved": True}}]))
    assert second[-1] == {"type": "RUN_FINISHED", "threadId": "ag-1", "runId": "run-3",
                          "outcome": {"type": "success"}}
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    assert (result["toolCallId"], result["content"]) == ("call-1", "paid 120 EUR to acme")
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Paid 120 EUR to acme."
    events = all_events(client, "ag-1")
    [resumed] = of_type(events, "interrupt.resumed")
    assert resumed["principal"] == "desk"  # signed as the endpoint's principal
    [started] = of_type(events, "tool.started")
    assert started["approval"]["principal"] == "desk"
    assert len(model_server.received) == 2
    assert denied(r) == []  # the endpoint's login was refused nothing it needed


def denied(r: redis.Redis) -> list[Any]:
    return [entry for entry in r.acl_log() if entry.get("username") == "parley-agui"]


def test_a_run_without_the_token_is_refused_and_a_bad_thread_id_is_a_run_error(endpoint: Endpoint) -> None:
    import httpx

    body = run_input("ag-2", "run-1", [{"id": "u-1", "role": "user", "content": "hi"}])
    assert httpx.post(endpoint.url, json=body, timeout=10).status_code == 401
    assert httpx.post(endpoint.url, content=b"{}", headers={"Authorization": "Bearer t0ken",
                                                            "Content-Type": "application/json"},
                      timeout=10).status_code == 422
    bad = endpoint.run(run_input("no spaces allowed", "run-1", [{"id": "u-1", "role": "user",
                                                                 "content": "hi"}]))
    assert types(bad) == ["RUN_STARTED", "RUN_ERROR"] and bad[-1]["code"] == "invalid_thread"


def test_the_real_agui_client_streams_a_turn_is_refused_a_wrong_answer_and_resumes_with_the_right_one(
        endpoint: Endpoint, model_server: StreamServer, client: Client) -> None:
    """@ag-ui/client's HttpAgent (npm, pinned in tests/agui/js), as a front end runs it."""
    model_server.reply(Stream(["Paying ", "acme ", "now."], delay_s=0.02, tool_calls=[PAY]),
                       Stream(["Paid ", "120 EUR ", "to acme."], delay_s=0.02))
    seen = drive(endpoint.url, "t0ken", "ag-js")
    first, wrong, right = seen["first"], seen["wrong"], seen["right"]

    assert first["error"] is None and "thrown" not in first, first
    assert first["text"] == "Paying acme now." and first["outcome"] == "interrupt"
    [pending] = first["pending"]
    assert (pending["reason"], pending["toolCallId"]) == ("approval", "call-1")
    reply = next(m for m in first["messages"] if m["role"] == "assistant")
    assert reply["toolCalls"][0]["name"] == "pay"
    assert json.loads(reply["toolCalls"][0]["arguments"]) == PAY["arguments"]
    assert first["state"]["parley"]["session"] == "ag-js"  # kept by the client, sent back

    assert wrong["error"]["code"] == "invalid_resume", wrong  # the client saw the refusal

    assert right["error"] is None and "thrown" not in right, right
    assert right["outcome"] == "success" and right["pending"] == []
    tool = next(m for m in right["messages"] if m["role"] == "tool")
    assert (tool["toolCallId"], tool["content"]) == ("call-1", "paid 120 EUR to acme")
    assert right["messages"][-1]["content"] == "Paid 120 EUR to acme."
    events = all_events(client, "ag-js")
    [resumed] = of_type(events, "interrupt.resumed")  # the wrong answer was never sent
    assert (resumed["payload"], resumed["principal"]) == ({"approved": True}, "desk")
    assert of_type(events, "tool.started")[0]["approval"]["principal"] == "desk"
