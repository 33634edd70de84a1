"""A key prefix other than `parley`, with colons in it, end to end: real dispatcher and worker
processes started with PARLEY_PREFIX, and a prefix that cannot work refused when a process starts."""

import os

import pytest
import redis

from parley.client import Client
from tests.conftest import ROOT, Procs, eventually, of_type, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

PREFIX = "acme:parley"
SEED = "Email bob@example.com: the launch moved to Friday."


def test_seed_scenario_runs_under_a_prefix_with_colons(procs: Procs, r: redis.Redis) -> None:
    env = {"PARLEY_PREFIX": PREFIX}
    procs.dispatcher("examples.seed_app", env=env)
    procs.start("worker", "examples.seed_app", env=env)
    client = Client(r, PREFIX)
    client.send("seed", {"type": "message.create", "content": SEED})
    raised = wait_for(client, "seed", lambda e: e["type"] in ("interrupt.raised", "llm.failed"))[-1]
    assert raised["type"] == "interrupt.raised" and raised["reason"] == "confirm"
    client.send("seed", {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                         "payload": {"approved": True}})
    events = wait_for(client, "seed", lambda e: e["type"] == "turn.completed")
    replies = [e["message"]["content"] for e in of_type(events, "message.created")
               if e["message"]["role"] == "assistant" and e["message"]["content"]]
    assert replies == ["Done. send_email: sent"]
    assert of_type(events, "llm.failed") == []
    # every key is under the prefix; nothing was written under the default one
    eventually(lambda: r.hlen(f"{PREFIX}:running") == 0 and r.hlen(f"{PREFIX}:inflight") == 0)
    assert r.keys("parley:*") == []
    assert r.exists(f"{PREFIX}:{{seed}}:events") == 1
    assert r.exists(f"{PREFIX}:inputs:rejected") == 0


def test_a_sub_agent_runs_under_a_prefix_with_colons(procs: Procs, r: redis.Redis) -> None:
    env = {"PARLEY_PREFIX": PREFIX}
    procs.dispatcher("tests.apps.agents", env=env)
    procs.start("worker", "tests.apps.agents", env=env)
    client = Client(r, PREFIX)
    client.send("p1", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    child = wait_for(client, "p1", lambda e: e["type"] == "tool.started")[-1]["child_session"]
    raised = wait_for(client, child, lambda e: e["type"] == "interrupt.raised")[-1]
    client.send(child, {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                        "payload": {"approved": True}})
    events = wait_for(client, "p1", lambda e: e["type"] == "turn.completed", timeout=30)
    assert of_type(events, "message.created")[-1]["message"]["content"] == \
        "Done. research: Done. publish: published otters"
    assert r.keys("parley:*") == []


@pytest.mark.parametrize("command", [["dispatcher", "--app", "examples.seed_app"],
                                     ["worker", "--app", "examples.seed_app"],
                                     ["send", "s-1", "hi"]])
def test_a_prefix_that_cannot_work_stops_every_process_at_start(command: list[str]) -> None:
    # (which prefixes cannot work: tests/unit/test_keys.py) No Redis is running at this URL:
    # the prefix must be refused before any connection is tried.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_PREFIX": "acme:{tenant}",
           "PARLEY_REDIS_URL": "redis://127.0.0.1:9/0"}
    done = run_parley([*command], env=env, timeout=60)
    assert done.returncode == 2, done.stderr.decode()
    stderr = done.stderr.decode()
    assert "Invalid value for '--prefix': invalid key prefix 'acme:{tenant}'" in stderr
    assert "letters, digits" in stderr and "Traceback" not in stderr


def test_the_client_refuses_a_prefix_that_cannot_work(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match=r"invalid key prefix 'acme:\{tenant\}'"):
        Client(r, "acme:{tenant}")
