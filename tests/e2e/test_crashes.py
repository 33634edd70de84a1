"""Crashes and restarts (docs/design.md, Lost work; docs/guarantees.md; I13): kill -9 of workers
and dispatchers, Redis restarted from its AOF.

As deployed: Redis with the shipped redis.conf and users.acl, each process under its login,
inputs written by the producer login through the submit function."""

import time

import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, stop_processes
from tests.conftest import Procs, all_events, of_type, wait_for
from tests.e2e.llm_calls import wait_running

pytestmark = pytest.mark.e2e


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def kill(procs: Procs, proc) -> None:  # type: ignore[no-untyped-def]
    proc.kill()
    proc.wait()
    procs.started = [p for p in procs.started if p[1] is not proc]


@pytest.mark.parametrize(("tool", "expect"), [("slow", "worker_lost"), ("slow_idem", "slept 2")])
def test_worker_killed_during_a_tool_job(procs: Procs, producer_client: Client, r: redis.Redis,
                                         client: Client, tool: str,
                                         expect: str) -> None:
    procs.dispatcher()
    procs.worker("tests.apps.scenarios", "--queues", "decide,llm")
    tools_worker = procs.worker("tests.apps.scenarios", "--queues", "tools")
    producer_client.send("w1", {"type": "message.create", "content": f'call {tool} {{"seconds": 2}}'})
    wait_for(client, "w1", lambda e: e["type"] == "tool.started")
    time.sleep(0.5)
    kill(procs, tools_worker)  # kill -9 mid-job
    procs.worker("tests.apps.scenarios", "--queues", "tools")
    events = wait_for(client, "w1", lambda e: e["type"] == "turn.completed", timeout=30)
    completed = of_type(events, "tool.completed")
    assert len(completed) == 1  # recorded once, never twice
    tool_messages = [e["message"] for e in of_type(events, "message.created")
                     if e["message"]["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [expect]
    assert (completed[0].get("error") == "worker_lost") is (tool == "slow")
    assert r.hlen("parley:running") == 0


def test_worker_killed_during_an_llm_job_is_retried(procs: Procs, producer_client: Client, r: redis.Redis,
                                                    client: Client) -> None:
    procs.dispatcher()
    llm_worker = procs.worker("tests.apps.scenarios", "--queues", "llm")
    procs.worker("tests.apps.scenarios", "--queues", "decide,tools")
    producer_client.send("w2", {"type": "message.create", "content": "[slow-llm] hello"})
    wait_for(client, "w2", lambda e: e["type"] == "llm.started")
    wait_running(r, "w2", "llm-1")  # killed while it runs the call, not before it took it
    kill(procs, llm_worker)
    procs.worker("tests.apps.scenarios", "--queues", "llm")
    events = wait_for(client, "w2", lambda e: e["type"] == "turn.completed", timeout=30)
    replies = [e["message"]["content"] for e in of_type(events, "message.created")
               if e["message"]["role"] == "assistant"]
    assert replies == ["You said: [slow-llm] hello"]
    assert len(of_type(events, "llm.started")) == 1 and len(of_type(events, "llm.completed")) == 1


def test_dispatcher_killed_standby_takes_over_and_nothing_is_lost(procs: Procs, producer_client: Client,
                                                                  r: redis.Redis,
                                                                  client: Client) -> None:
    first = procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    time.sleep(1.0)  # the first holds the lease; the second stands by
    procs.dispatcher("tests.apps.scenarios", "--lease-ms", "2000")
    procs.worker()
    producer_client.send("k1", {"type": "message.create", "content": "email bob: hi"})
    wait_for(client, "k1", lambda e: e["type"] == "interrupt.raised")
    kill(procs, first)
    for n in range(5):  # written while nobody holds the lease: applied in order after takeover
        producer_client.send(f"k{n + 2}", {"type": "message.create", "content": f"m{n}"})
    producer_client.resume("k1", "int-1", {"approved": True})
    events = wait_for(client, "k1", lambda e: e["type"] == "turn.completed", timeout=30)
    assert len(of_type(events, "interrupt.resumed")) == 1
    for n in range(5):
        done = wait_for(client, f"k{n + 2}", lambda e: e["type"] == "turn.completed")
        assert of_type(done, "message.created")[-1]["message"]["content"] == f"You said: m{n}"


@pytest.mark.parametrize("how", ["shutdown", "kill"])
def test_I13_redis_restarted_from_its_aof_keeps_the_pause(procs: Procs, producer_client: Client,
                                                          redis_server: RedisServer,
                                                          client: Client, how: str) -> None:
    procs.dispatcher()
    procs.worker()
    producer_client.send("a1", {"type": "message.create", "content": "email bob: hi"})
    wait_for(client, "a1", lambda e: e["type"] == "interrupt.raised")
    time.sleep(0.3)
    before = client.show("a1")
    redis_server.stop(kill=how == "kill")
    time.sleep(1.0)  # dispatcher and worker lose their connections meanwhile
    redis_server.start()
    assert client.show("a1") == before  # open interrupt, pending call, transcript: all there
    assert [i["interrupt_id"] for i in client.interrupts()] == ["int-1"]
    producer_client.resume("a1", "int-1", {"approved": True})
    events = wait_for(client, "a1", lambda e: e["type"] == "turn.completed", timeout=30)
    assert len(of_type(events, "interrupt.resumed")) == 1
    assert of_type(events, "message.created")[-1]["message"]["content"] == "Done. send_email: sent"
    assert len(of_type(all_events(client, "a1"), "interrupt.raised")) == 1


def test_redis_restarted_while_a_worker_runs_a_job_loses_nothing(procs: Procs, producer_client: Client,
                                                                 redis_server: RedisServer, r: redis.Redis,
                                                                 client: Client) -> None:
    """The worker rides out the outage: its outcome is posted once Redis is back, and it goes on.
    (Killed before the worker took the job, a kill can take the reply of its BLPOP with it: the
    job is then settled `worker_lost`, as docs/guarantees.md says of a job lost there; so the kill
    waits until the job is recorded as running.)"""
    procs.dispatcher()
    worker = procs.worker()
    producer_client.send("a2", {"type": "message.create", "content": 'call slow {"seconds": 2}'})
    wait_for(client, "a2", lambda e: e["type"] == "tool.started")
    wait_running(r, "a2", "call-1")
    redis_server.stop(kill=True)  # mid-job
    time.sleep(1.5)
    redis_server.start()
    events = wait_for(client, "a2", lambda e: e["type"] == "turn.completed", timeout=40)
    assert [e["message"]["content"] for e in of_type(events, "message.created")
            if e["message"]["role"] == "tool"] == ["slept 2"]
    producer_client.send("a2", {"type": "message.create", "content": "still serving?"})
    wait_for(client, "a2", lambda e: e["type"] == "message.created"
             and e["message"]["content"] == "You said: still serving?", timeout=30)
    assert worker.poll() is None


def test_a_dispatcher_stopped_while_redis_is_down_exits_0_without_waiting_for_it(
        procs: Procs, redis_server: RedisServer) -> None:
    """SIGTERM during an outage: the leases and fingerprints are given back with one try each
    (they lapse by themselves), not after redis-py's retries of ~4 s a command, which would
    outlast an orchestrator's grace period and end in a kill (-9) instead of exit 0."""
    dispatcher = procs.dispatcher()
    log = next(path for _kind, proc, path in procs.started if proc is dispatcher)

    def until_logged(text: str) -> None:
        deadline = time.monotonic() + 30
        while not log.exists() or text not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and dispatcher.poll() is None, procs.logs()
            time.sleep(0.05)

    until_logged("started (app")
    redis_server.stop(kill=True)
    until_logged("redis unavailable, retrying")
    code = stop_processes([dispatcher], timeout=5)[0]
    procs.forget(dispatcher)
    assert code == 0, procs.logs()
    assert "redis did not answer on the way out: leases left to lapse" in log.read_text(), procs.logs()
