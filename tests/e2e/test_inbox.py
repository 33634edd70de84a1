"""The inbox listing end to end: a dispatcher and a worker running the seed app, sessions made
with metadata, their questions listed with `parley interrupts` (filtered, paged) and answered."""

import json

import pytest
import redis

from parley.client import Client
from tests.conftest import Procs, eventually, send, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."


def listing(url: str, *args: str) -> object:
    out = run_parley(["--redis-url", url, "interrupts", "--json", *args], text=True, check=True)
    return json.loads(out.stdout)


def test_an_inbox_pages_the_questions_with_what_they_ask_and_whose_session(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    sessions = ["team-a-1", "team-a-2", "team-b-1"]
    for s in sessions:
        send(r, s, {"type": "session.create", "metadata": {"team": s[5]}})
        send(r, s, {"type": "message.create", "content": SEED})
    for s in sessions:
        wait_for(client, s, lambda e: e["type"] == "interrupt.raised")
    eventually(lambda: len(client.interrupts()) == 3)

    first = listing(procs.url, "--session-prefix", "team-a-", "--limit", "1")
    assert isinstance(first, dict) and [row["session"] for row in first["items"]] == ["team-a-1"]
    (row,) = first["items"]
    assert (row["reason"], row["request"], row["metadata"], row["resumable_by"]) == (
        "confirm", {"message": "Send the email?"}, {"team": "a"}, None)
    second = listing(procs.url, "--session-prefix", "team-a-", "--limit", "1", "--cursor", first["cursor"])
    assert isinstance(second, dict) and [row["session"] for row in second["items"]] == ["team-a-2"]
    # the seed app's questions name nobody: any principal may answer them
    everyone = listing(procs.url, "--principal", "alice", "--reason", "confirm")
    assert isinstance(everyone, list) and sorted(row["session"] for row in everyone) == sessions

    for s in sessions:
        send(r, s, {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    for s in sessions:
        wait_for(client, s, lambda e: e["type"] == "turn.completed")
    eventually(lambda: listing(procs.url) == [])
    eventually(lambda: [k for k in r.scan_iter(match="parley:interrupts*")] == [])
