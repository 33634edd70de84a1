"""A tenant's session end to end (docs/operations.md, "Tenants"): an id with `/` runs like any
other through real dispatcher and worker processes, its sub-agent's child is `acme/...:sub-1`,
and the command line shows it and lists it by the tenant's prefix."""

import os

import orjson
import pytest
import redis

from parley.client import Client
from tests.conftest import Procs, eventually, of_type, send, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e
APP = "tests.apps.agents"
PARENT = "acme/p1"


def cli(procs: Procs, *args: str) -> str:
    done = run_parley([*args], env={**os.environ, **procs.env(APP)},
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_tenants_session_with_a_sub_agent_runs_and_is_listed_by_its_prefix(procs: Procs, r: redis.Redis,
                                                                              client: Client) -> None:
    procs.dispatcher(APP)
    procs.worker(APP)
    send(r, "acme2/other", {"type": "session.create"})  # a tenant whose name starts alike
    send(r, PARENT, {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    started = wait_for(client, PARENT, lambda e: e["type"] == "tool.started")[-1]
    child = started["child_session"]
    assert child == "acme/p1:sub-1"
    raised = wait_for(client, child, lambda e: e["type"] == "interrupt.raised")[-1]
    eventually(lambda: [(i["session"], i["parent"]) for i in client.interrupts()] == [(child, PARENT)])

    listed = orjson.loads(cli(procs, "interrupts", "--json", "--session-prefix", "acme/"))
    assert [(i["session"], i["interrupt_id"]) for i in listed] == [(child, raised["interrupt_id"])]
    assert orjson.loads(cli(procs, "interrupts", "--json", "--session-prefix", "acme2/")) == []
    shown = orjson.loads(cli(procs, "show", PARENT, "--json"))
    assert shown["session"] == PARENT and shown["children"] == [child]
    sessions = orjson.loads(cli(procs, "sessions", "--json"))
    assert {row["session"] for row in sessions["items"]} == {PARENT, child, "acme2/other"}
    paged, cursor = [], None  # one at a time: the cursors carry ids with `/`
    while True:
        page = orjson.loads(cli(procs, "sessions", "--json", "--limit", "1",
                                *(["--cursor", cursor] if cursor else [])))
        paged += [row["session"] for row in page["items"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert paged == [row["session"] for row in sessions["items"]]

    cli(procs, "resume", child, raised["interrupt_id"], '{"approved": true}')
    events = wait_for(client, PARENT, lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        "Done. research: Done. publish: published otters"
    exported = orjson.loads(cli(procs, "export", child))
    assert exported["session"] == child
