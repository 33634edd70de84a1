"""The fleet-wide feed read by a consumer group while a dispatcher is killed -9 mid-transition:
every interrupt and turn event of every session reaches the group once, none twice."""

import signal
import time

import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.events import FEED_EVENT_TYPES
from tests.conftest import Procs, all_events, send, wait_for

pytestmark = pytest.mark.e2e
SEED = "Email bob@example.com: the launch moved to Friday."
GROUP = "dashboards"


def run_seed(r: redis.Redis, client: Client, session: str) -> None:
    send(r, session, {"type": "message.create", "content": SEED})
    raised = wait_for(client, session, lambda e: e["type"] == "interrupt.raised", timeout=30)[-1]
    send(r, session, {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                      "payload": {"approved": True}})
    wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=30)


def read_group(r: redis.Redis) -> list[tuple[str, str, str]]:
    """What a consumer of the group gets: (session, type, event_id) of each entry, acknowledged."""
    got: list[tuple[str, str, str]] = []
    while True:
        reply = r.xreadgroup(GROUP, "reader-1", {"parley:feed": ">"}, count=100, block=300)
        if not reply:
            return got
        for entry_id, fields in reply[0][1]:
            event = orjson.loads(fields[b"event"])
            assert event["type"] == fields[b"type"].decode()
            got.append((fields[b"session"].decode(), fields[b"type"].decode(), fields[b"event_id"].decode()))
            r.xack("parley:feed", GROUP, entry_id)


def expected(client: Client, sessions: list[str]) -> list[tuple[str, str, str]]:
    """The feed-type events of each session's own stream, with their ids."""
    out = []
    for s in sessions:
        for entry_id, event in client.events(s, block_ms=1, until=time.monotonic() + 0.05):
            if event["type"] in FEED_EVENT_TYPES:
                out.append((s, event["type"], entry_id))
    return out


@pytest.mark.parametrize("point", ["before_commit", "after_commit", "after_flush"])
def test_feed_consumer_group_across_a_dispatcher_kill(procs: Procs, r: redis.Redis, client: Client,
                                                      point: str) -> None:
    r.xgroup_create("parley:feed", GROUP, id="0", mkstream=True)
    crashing = procs.dispatcher("examples.seed_app", "--lease-ms", "2000", crash_at=f"{point}:3")
    time.sleep(0.8)  # it holds the lease; the next one stands by
    procs.dispatcher("examples.seed_app", "--lease-ms", "2000")
    procs.worker("examples.seed_app")
    sessions = [f"feed-{n}" for n in range(3)]
    got: list[tuple[str, str, str]] = []
    for s in sessions:
        run_seed(r, client, s)
        got += read_group(r)  # read while things happen, as a notifier does
    assert crashing.wait(5) == -signal.SIGKILL
    procs.forget(crashing)
    got += read_group(r)
    want = expected(client, sessions)
    assert len(want) == 3 * 3  # raised, resumed, turn completed: per session
    assert sorted(got) == sorted(want)  # nothing lost
    assert len(set(got)) == len(got)  # nothing twice
    assert r.xpending("parley:feed", GROUP)["pending"] == 0
    assert all(len([e for e in all_events(client, s) if e["type"] == "interrupt.raised"]) == 1
               for s in sessions)
