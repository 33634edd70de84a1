"""MCP servers' tools as an app's tools, end to end under the shipped deployment (redis.conf with
its AOF, users.acl, every process under its own login, inputs from the producer login).

The app (tests/apps/mcp_app.py) names tests/mcp_server.py, a stdio server written with the
`mcp` SDK. The worker's model requests carry the server's tools with its own schemas; a call
returns the server's result into the transcript; the server's elicitation parks the branch
with its requestedSchema as the question's response_schema, a resume answers it, and the
answer reaches the server (which writes what it received to a file outside the engine). A
call past its time limit, a server that dies mid-call and one that cannot start fail clearly.
"""

import json
import os
from pathlib import Path

import pytest

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.resumes import ResumeStatus
from tests.conftest import ROOT, Procs, all_events, eventually, of_type, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

APP = "tests.apps.mcp_app"


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def turn(client: Client, producer: Client, session: str, content: str, turns: int) -> list[dict]:
    """Send a user message and return the session's events once `turns` turns completed."""
    producer.send(session, {"type": "message.create", "content": content})
    wait_for(client, session, lambda e: e["type"] == "turn.completed"
             and len(of_type(all_events(client, session), "turn.completed")) >= turns, timeout=60)
    return all_events(client, session)


def tool_messages(events: list[dict]) -> list[dict]:
    return [e["message"] for e in of_type(events, "message.created") if e["message"]["role"] == "tool"]


def test_a_servers_tools_are_listed_called_and_its_elicitation_parks_the_branch_until_answered(
        procs: Procs, client: Client, producer_client: Client, tmp_path: Path) -> None:
    received, schemas = tmp_path / "server.log", tmp_path / "tools.json"
    env = {"PARLEY_TEST_MCP_LOG": str(received), "PARLEY_TEST_MCP_TOOLS": str(schemas)}
    procs.dispatcher(APP, env=env)
    procs.start("worker", APP, env=env)

    events = turn(client, producer_client, "m-1", 'call t_add {"a": 2, "b": 3}', 1)
    offered = {t["name"]: t for t in json.loads(schemas.read_text())}  # what the worker's model was told
    assert set(offered) == {"lookup", "t_add", "t_weather", "t_transfer", "t_refuse", "t_crash", "slow_sleep"}
    assert offered["t_add"]["description"] == "Add two numbers."
    assert offered["t_add"]["parameters"]["properties"] == {"a": {"title": "A", "type": "integer"},
                                                           "b": {"title": "B", "type": "integer"}}
    assert offered["t_add"]["parameters"]["required"] == ["a", "b"]  # the server's inputSchema, as it sent it
    assert [m["content"] for m in tool_messages(events)] == ['{"result":"5"}']
    assert received.read_text() == "add 2 3\n"

    producer_client.send("m-1", {"type": "message.create", "content": 'call t_transfer {"amount": 5}'})
    raised = wait_for(client, "m-1", lambda e: e["type"] == "interrupt.raised", timeout=60)[-1]
    assert (raised["reason"], raised["call_id"]) == ("elicitation", "call-2")
    assert raised["payload"] == {"message": "Which account should 5 EUR come from?", "server": "t",
                                 "tool": "t_transfer"}
    eventually(lambda: len(client.interrupts()) == 1)  # the index is written just after the event
    [listed] = client.interrupts()  # as the inbox and `parley interrupts` list it
    assert (listed["session"], listed["interrupt_id"]) == ("m-1", raised["interrupt_id"])
    assert listed["response_schema"] == {  # the server's requestedSchema
        "type": "object", "title": "Account", "required": ["account"],
        "properties": {"account": {"title": "Account", "type": "string"},
                       "note": {"default": "", "title": "Note", "type": "string"}}}
    view = client.show("m-1")
    assert view is not None and view["parked"] is True
    assert received.read_text() == "add 2 3\ntransfer 5\n"  # the call was abandoned at its question

    wrong = producer_client.resume("m-1", raised["interrupt_id"], {"note": "no account"}, wait=True,
                                   timeout_s=30)
    assert (wrong.status, wrong.code) == (ResumeStatus.REFUSED, "invalid_resume")
    right = producer_client.resume("m-1", raised["interrupt_id"], {"account": "savings", "note": "rent"},
                                   wait=True, timeout_s=30)
    assert right.status == ResumeStatus.DELIVERED
    wait_for(client, "m-1", lambda e: e["type"] == "turn.completed"
             and len(of_type(all_events(client, "m-1"), "turn.completed")) >= 2, timeout=60)
    events = all_events(client, "m-1")

    # the server's tool ran again from its start, and this time received the answer
    assert received.read_text().splitlines()[1:] == [
        "transfer 5", "transfer 5", 'received {"account": "savings", "note": "rent"}']
    assert [m["content"] for m in tool_messages(events)][1:] == ['{"result":"moved 5 from savings"}']
    [settled] = [e for e in of_type(events, "tool.completed") if e["call_id"] == "call-2"]
    assert "error" not in settled
    assert [e["call_id"] for e in of_type(events, "interrupt.resumed")] == ["call-2"]


def test_a_call_past_its_time_limit_or_whose_server_dies_is_a_tool_error(
        procs: Procs, client: Client, producer_client: Client, tmp_path: Path) -> None:
    received, started = tmp_path / "server.log", tmp_path / "server.pids"
    env = {"PARLEY_TEST_MCP_LOG": str(received), "PARLEY_TEST_MCP_PIDS": str(started)}
    procs.dispatcher(APP, env=env)
    procs.start("worker", APP, env=env)

    events = turn(client, producer_client, "m-2", 'call slow_sleep {"seconds": 60}', 1)
    [timed_out] = of_type(events, "tool.completed")
    assert timed_out["error"] == "timeout"  # the server's timeout_s=5, as for any tool
    # the servers this call started (the worker's; the dispatcher lists tools at its start),
    # each stopped with the call, whether or not the call had reached its tool (a loaded box
    # may spend the time limit starting the server)
    pids = [int(line) for line in started.read_text().split()]
    assert pids, "no MCP server was started"
    assert all(line.startswith("sleep ") for line in (received.read_text().splitlines()
                                                        if received.exists() else []))
    for pid in pids:
        eventually(lambda pid=pid: not alive(pid), timeout=10)

    events = turn(client, producer_client, "m-2", "call t_crash", 2)
    crashed = next(e for e in of_type(events, "tool.completed") if e["call_id"] == "call-2")
    assert crashed["error"].startswith("McpServerError: MCP server 't' (stdio: ")
    assert crashed["error"].endswith("tool 'crash': MCPError: Connection closed")

    events = turn(client, producer_client, "m-2", 'call t_refuse {"why": "closed today"}', 3)
    refused = next(e for e in of_type(events, "tool.completed") if e["call_id"] == "call-3")
    assert refused["error"] == ("McpToolError: MCP server 't', tool 'refuse': Error executing tool refuse: "
                                "refused: closed today")


def test_a_server_that_cannot_start_stops_the_app_from_loading_with_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PARLEY_REDIS_URL": "redis://127.0.0.1:1"}
    for args in (["app", "check", "--app", "tests.apps.mcp_broken_app"],
                 ["dispatcher", "--app", "tests.apps.mcp_broken_app"]):
        done = run_parley(args, env, timeout=60, cwd=tmp_path)
        out = done.stdout.decode() + done.stderr.decode()
        assert done.returncode != 0, out
        assert "Traceback" not in out
        assert ("app 'tests.apps.mcp_broken_app': MCP server 'gone' (stdio: /nonexistent/mcp-server "
                "--serve): cannot list its tools: FileNotFoundError") in out


def alive(pid: int) -> bool:
    """A process of that id runs (not a zombie: a child reaped late is gone for this test)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
