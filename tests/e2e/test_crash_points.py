"""kill -9 of a dispatcher at chosen points of a transition (docs/guarantees.md): the session
ends exactly as an undisturbed run does, and the resume is delivered exactly once. kill -9 of a
worker around a finish (docs/design.md, the lean path): every session still ends, once.

As deployed: Redis with the shipped redis.conf and users.acl, each process under its login,
inputs written by the producer login through the submit function."""

import signal
import time
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer
from tests.conftest import Procs, all_events, of_type, wait_for

pytestmark = pytest.mark.e2e
SEED = "Email bob@example.com: the launch moved to Friday."


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def input_streams_left(r: redis.Redis) -> int:
    """Entries still in any input stream (acknowledged entries are deleted)."""
    return sum(int(r.xlen(key)) for key in r.scan_iter("parley:in*") if r.type(key) == b"stream")


def run_seed(producer: Client, client: Client, session: str) -> None:
    producer.send(session, {"type": "message.create", "content": SEED})
    raised = wait_for(client, session, lambda e: e["type"] == "interrupt.raised", timeout=30)[-1]
    producer.resume(session, raised["interrupt_id"], {"approved": True})
    wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=30)


def normalized(client: Client, session: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    time.sleep(0.3)
    # the time, and the stream id of the input an event names: each run sends its own entries
    events = [{k: ({**v, "entry": "<entry>"} if k == "input" else v) for k, v in e.items() if k != "at"}
              for e in all_events(client, session)]
    view = client.show(session)
    assert view is not None
    return events, {k: v for k, v in view.items() if k != "session"}


@pytest.mark.parametrize("point", ["before_commit", "after_commit", "after_flush"])
@pytest.mark.parametrize("nth", [2, 4])
def test_dispatcher_killed_at_a_chosen_point_changes_nothing(procs: Procs, r: redis.Redis, client: Client,
                                                             producer_client: Client, point: str,
                                                             nth: int) -> None:
    crashing = procs.dispatcher("examples.seed_app", "--lease-ms", "2000",
                                crash_at=f"{point}:{nth}")
    time.sleep(0.8)  # it holds the lease; the next one stands by
    procs.dispatcher("examples.seed_app", "--lease-ms", "2000")
    procs.worker("examples.seed_app")
    procs.worker("examples.seed_app")
    run_seed(producer_client, client, "crashed")
    assert crashing.wait(5) == -signal.SIGKILL  # it really died at that point
    procs.forget(crashing)
    run_seed(producer_client, client, "reference")  # the same scenario, undisturbed
    crashed, reference = normalized(client, "crashed"), normalized(client, "reference")
    assert crashed == reference
    assert len(of_type(crashed[0], "interrupt.resumed")) == 1
    assert r.hlen("parley:{crashed}:outbox") == 0 and input_streams_left(r) == 0
    # every job ran and was answered: none is left queued, in flight or running (that a replay
    # enqueues no job twice is tests/integration/test_consume.py's, where no worker takes it)
    time.sleep(0.5)
    assert [r.llen(f"rq:queue:{q}") for q in ("decide", "llm", "tools")] == [0, 0, 0]
    assert r.hlen("parley:inflight") == 0 and r.hlen("parley:running") == 0


@pytest.mark.parametrize("point", ["before_finish", "after_finish"])
def test_worker_killed_around_a_finish_loses_no_session(procs: Procs, r: redis.Redis, client: Client,
                                                        producer_client: Client, point: str) -> None:
    """Killed before posting a job's outcome (the job is recorded as running on it), or right
    after a finish that took the next job (that job is recorded as running on it, not run): a
    dispatcher posts the loss once the worker's heartbeat lapses, the work is retried on the
    worker started afterwards, and every session completes with its resume applied once."""
    procs.dispatcher("examples.seed_app")
    crashing = procs.start("worker", "examples.seed_app", crash_at=f"{point}:3")
    sessions = [f"w-{i}" for i in range(6)]
    for session in sessions:  # at once, so that a finish finds the next job queued
        producer_client.send(session, {"type": "message.create", "content": SEED})
    assert crashing.wait(30) == -signal.SIGKILL  # it really died at that point
    procs.forget(crashing)
    procs.worker("examples.seed_app")
    for session in sessions:
        raised = wait_for(client, session, lambda e: e["type"] == "interrupt.raised", timeout=60)[-1]
        producer_client.resume(session, raised["interrupt_id"], {"approved": True})
    for session in sessions:
        events = wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=60)
        assert len(of_type(events, "interrupt.resumed")) == 1
    assert r.hlen("parley:running") == 0
