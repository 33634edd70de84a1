"""A deployment that grows while it runs (docs/operations.md, "Adding shards and rebalancing"):
two shards under load, a third added with `parley partitions add-shards`, partitions spread
onto it with `parley partitions rebalance` (two moves at once), then shard 0 drained with
`rebalance --drain 0`. As deployed: the shipped redis.conf and users.acl on every shard,
dispatchers and workers under their shipped logins, inputs through the producer login; the
harness's admin runs the `parley partitions` commands (an operator's). Every session finishes
with each input applied once, each move prints its freeze time, and the drained shard is left
holding no session.

Also: the producer given only the first two URLs keeps sending after the third shard joins
(nothing is on it yet), and is refused, saying to give every URL, once a partition is there."""

import itertools
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys, partition_of
from parley.schemas.shards import PlacementError
from tests.conftest import Procs, all_events, wait_for
from tests.deployed import (
    DISPATCHER,
    PRODUCER_NAME,
    WORKER,
    login,
    ready_for_producers,
    urls_as,
)
from tests.e2e.shard_fleet import deployed_servers, parley, placed, producer_of, urls_env

pytestmark = pytest.mark.e2e

K = Keys()
N = 8
APP = "examples.seed_app"


class Sender(threading.Thread):
    """Sends sessions (a create and a message, each with an idempotency key) until stopped."""

    def __init__(self, client: Client, stem: str):
        super().__init__(daemon=True)
        self.client, self.stem = client, stem
        self.sent: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                session = f"{self.stem}-{i}"
                self.client.send(session, {"type": "session.create"}, f"{session}-create")
                self.client.send(session, {"type": "message.create", "content": "hello"}, f"{session}-hello")
                self.sent.append(session)
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def until(self, more: int) -> None:
        target = len(self.sent) + more
        deadline = time.monotonic() + 60
        while len(self.sent) < target and self.error is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def end(self) -> list[str]:
        self.stop.set()
        self.join(60)
        return self.sent


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    with deployed_servers(tmp_path, 3) as started:
        yield started


def start_shard(procs: Procs, servers: list[RedisServer], shard: int) -> None:
    """A dispatcher and a worker of `shard`, given every URL of `servers`, under their logins."""
    procs.dispatcher(APP, "--shard", str(shard), "--partitions", str(N), "--lease-ms", "2000",
                     "--register-producer", PRODUCER_NAME,
                     env=urls_env(servers, DISPATCHER))
    procs.start("worker", APP, "--shard", str(shard), env=urls_env(servers, WORKER))


def freezes(output: str) -> dict[int, float]:
    """partition -> its freeze (seconds), from the lines `rebalance` prints for each move."""
    return {int(p): float(s) for p, s in re.findall(r"partition (\d+) moved .*frozen ([\d.]+) s\)", output)}


def test_shards_added_and_drained_under_load_lose_and_double_nothing(servers: list[RedisServer],
                                                                     procs: Procs) -> None:
    two, three = servers[:2], servers
    for server in three:
        ready_for_producers(redis.Redis.from_url(server.url),
                            redis.Redis.from_url(server.url_as(login(DISPATCHER))))
    admin_shards = Shards([redis.Redis.from_url(u) for u in urls_as(three, None)], K)
    shard2 = admin_shards.clients[2]
    shard2.flushall()  # shard 2 joins empty: what ready_for_producers put there is for later
    for shard in (0, 1):
        start_shard(procs, two, shard)
    placed(two, procs.logs)

    old_client = producer_of(two)
    first = Sender(old_client, "before")
    first.start()
    first.until(10)
    # a non-empty shard is refused, nothing written
    shard2.set("parley:stray", "1")
    refused = parley(three, "add-shards")
    assert refused.returncode == 1 and "shard 2 is not empty" in refused.stderr, refused.stderr
    assert shard2.hget(K.config, "placement") is None
    shard2.delete("parley:stray")

    added = parley(three, "add-shards")
    assert added.returncode == 0, added.stdout + added.stderr
    assert "shards 2-2 added: the deployment has 3 shards" in added.stdout, added.stdout
    assert parley(three, "add-shards").returncode == 1  # nothing more to add
    # the old producer, given two URLs, goes on: nothing is on shard 2 yet
    first.until(10)
    assert first.error is None, repr(first.error)
    ready_for_producers(shard2, redis.Redis.from_url(three[2].url_as(login(DISPATCHER))))
    start_shard(procs, three, 2)
    deadline = time.monotonic() + 40
    while not shard2.hexists(K.producers, PRODUCER_NAME):
        assert time.monotonic() < deadline, procs.logs()
        time.sleep(0.1)
    before = first.end()
    assert first.error is None, repr(first.error)

    client = producer_of(three)
    second = Sender(client, "during")
    second.start()
    second.until(10)
    planned = parley(three, "rebalance", "--dry-run")
    assert planned.returncode == 0 and "0: 4 -> 3, 1: 4 -> 3, 2: 0 -> 2" in planned.stdout, planned.stdout
    assert admin_shards.refresh() is not None and admin_shards.placement.partitions_of(2) == []

    spread = parley(three, "rebalance", "--yes", "--parallel", "2", "--drain-timeout", "30")
    assert spread.returncode == 0, spread.stdout + spread.stderr + procs.logs()
    moved = freezes(spread.stdout)
    assert sorted(moved) == [6, 7] and all(s < 60 for s in moved.values()), spread.stdout
    assert "rebalanced: 2 partition(s) moved" in spread.stdout
    # the producer left with two URLs cannot reach shard 2: it says what to do
    late = next(f"late-{i}" for i in itertools.count() if partition_of(f"late-{i}", N) == 6)
    with pytest.raises(PlacementError, match="give every shard's URL"):
        old_client.send(late, {"type": "session.create"}, f"{late}-create")
    second.until(10)

    drained = parley(three, "rebalance", "--drain", "0", "--yes", "--parallel", "3", "--drain-timeout", "30")
    assert drained.returncode == 0, drained.stdout + drained.stderr + procs.logs()
    assert sorted(freezes(drained.stdout)) == [0, 2, 4], drained.stdout
    assert "rebalanced: 3 partition(s) moved" in drained.stdout
    second.until(10)
    during = second.end()
    assert second.error is None, repr(second.error)
    assert parley(three, "rebalance", "--drain", "0", "--yes").stdout.strip().endswith("nothing to move")

    placement = admin_shards.refresh()
    assert placement is not None and not placement.moving
    assert placement.partitions_of(0) == [] and len(placement.partitions_of(1)) == 4 \
        and len(placement.partitions_of(2)) == 4
    reader = Client(admin_shards)
    for session in before + during:
        wait_for(reader, session, lambda e: e["type"] == "turn.completed", timeout=60)
    for session in before + during:
        events = all_events(reader, session)
        kinds = [e["type"] for e in events]
        users = [e for e in events if e["type"] == "message.created" and e["message"]["role"] == "user"]
        assert len(users) == 1 and kinds.count("turn.completed") == 1, (session, kinds)
        assert "input.refused" not in kinds, (session, events)
    moved_sessions = [s for s in before + during if partition_of(s, N) in (0, 2, 4, 6, 7)]
    assert moved_sessions
    for session in before + during:
        on = placement.shard_of_session(session)
        held = [bool(c.exists(K.meta(session))) for c in admin_shards.clients]
        assert held == [i == on for i in range(3)], session
    # the drained shard holds no session and no partition list
    assert not list(admin_shards.clients[0].scan_iter(match=f"{K.prefix}:{{*", count=1000))
    assert not list(admin_shards.clients[0].scan_iter(match=f"{K.prefix}:partition:*", count=1000))
