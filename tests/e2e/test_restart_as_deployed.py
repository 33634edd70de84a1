"""A Redis restart under the deployment we ship loses no committed transition (docs/guarantees.md;
docs/operations.md, "The default user and the AOF").

Redis with the shipped redis.conf (AOF, `appendfsync always`) and users.acl, a dispatcher and
workers under their logins, inputs from the producer login. Each session's committed
transitions (the `ver` its commits bump) and events are counted before Redis is killed -9 and
after it has replayed its AOF: any difference, or any `== CRITICAL ==` line in Redis's log,
fails the test.

The second case is the control: the same run with the default user the ACL file shipped before
(`off ... -@all`). Redis 7.0.15 (Debian 12's) replays the AOF as the default user and skips every
MULTI/EXEC that user may not run, and each commit script's writes sit in the AOF as one: the
count must come out short, which shows the check can see the loss. Should a Redis that replays
without that re-check be installed, this control fails and the docs' "Redis versions checked"
want updating with it.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from tests.conftest import Procs, all_events, of_type, wait_for
from tests.deployed import SHIPPED_ACL, started_for_producers

pytestmark = pytest.mark.e2e

KEYS = Keys()
SEED = "Email bob@example.com: the launch moved to Friday."
APP = "examples.seed_app"
SHIPPED = "shipped users.acl"
UNREPLAYABLE = "a default user without rights"
OLD_DEFAULT_USER = "user default off resetpass resetkeys resetchannels -@all"


def acl_text(case: str) -> str:
    text = SHIPPED_ACL.read_text()
    if case == SHIPPED:
        return text
    lines = text.splitlines()
    assert lines[0].startswith("user default ")
    return "\n".join([OLD_DEFAULT_USER, *lines[1:]]) + "\n"


@pytest.fixture(params=[SHIPPED, UNREPLAYABLE])
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    server = started_for_producers(tmp_path / "redis", acl_text(request.param))
    yield server
    server.stop(kill=True)


def committed(r: redis.Redis, sessions: list[str]) -> dict[str, tuple[int, int]]:
    """Per session: its committed transitions and its events."""
    return {s: (int(r.hget(KEYS.meta(s), "ver") or 0), int(r.xlen(KEYS.events(s)))) for s in sessions}


def quiet(r: redis.Redis, sessions: list[str], within_s: float = 20) -> dict[str, tuple[int, int]]:
    """The counts once nothing is in flight and they hold still for half a second."""
    deadline = time.monotonic() + within_s
    last = committed(r, sessions)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = committed(r, sessions)
        if now == last and r.hlen(KEYS.inflight) == 0 and r.hlen(KEYS.running) == 0:
            return now
        last = now
    raise AssertionError("the fleet never went quiet")


def test_a_redis_restart_keeps_every_committed_transition(procs: Procs, r: redis.Redis, client: Client,
                                                          producer_client: Client,
                                                          redis_server: RedisServer,
                                                          request: pytest.FixtureRequest) -> None:
    case = request.node.callspec.params["redis_server"]
    procs.dispatcher(APP)
    procs.worker(APP)
    procs.worker(APP)
    sessions = [f"restart-{i}" for i in range(10)]
    for session in sessions:
        producer_client.send(session, {"type": "message.create", "content": SEED})
    raised = {s: wait_for(client, s, lambda e: e["type"] == "interrupt.raised", timeout=30)[-1]
              for s in sessions}
    answered, parked = sessions[:5], sessions[5:]
    for session in answered:
        producer_client.resume(session, raised[session]["interrupt_id"], {"approved": True})
    for session in answered:
        wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=30)
    before = quiet(r, sessions)
    assert all(ver >= 3 for ver, _events in before.values())  # several transitions each

    redis_server.stop(kill=True)
    redis_server.start()  # replays its AOF; the processes reconnect by themselves
    after = committed(r, sessions)
    critical = redis_server.critical_lines()

    if case == UNREPLAYABLE:  # the control: the check sees what the old file lost
        assert after != before and critical, (after, before)
        return
    assert critical == [], critical[:3]
    assert after == before
    for session in parked:  # and the parked sessions still take their answers, once
        producer_client.resume(session, raised[session]["interrupt_id"], {"approved": True})
    for session in parked:
        events = wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=40)
        assert len(of_type(events, "interrupt.resumed")) == 1
    for session in answered:
        assert len(of_type(all_events(client, session), "turn.completed")) == 1
