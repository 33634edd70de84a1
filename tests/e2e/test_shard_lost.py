"""A shard lost while the deployment runs (docs/operations.md, "A shard that does not
answer"): shard 0, the one that held the move lock and the engine key alone before, is killed
-9 and stays down. As deployed: three shards with the shipped redis.conf and users.acl, a
dispatcher and a worker per shard under their shipped logins, inputs through the producer
login, reads through the reader login; the harness's admin runs `parley partitions`.

With shard 0 down, the rest of the deployment goes on: a new client reads the placement from
the majority and routes to shards 1 and 2, a dispatcher of shard 1 restarted from nothing
starts (the placement and the engine key from the majority), `partitions list` answers and a
partition moves from shard 1 to shard 2 under the move lock held on the majority. A session
of shard 0's is refused with the Redis error, not routed elsewhere; a page of the open
interrupts holds the other shards' rows and says shard 0 did not answer. Once shard 0 is back
(from its AOF), `repair` gives it the newest table and its dispatcher serves it again."""

import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from parley.client import Client
from parley.client.shards import read_view
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys, partition_of
from tests.conftest import Procs, wait_for
from tests.deployed import (
    DISPATCHER,
    PRODUCER_NAME,
    WORKER,
    login,
    ready_for_producers,
    urls_as,
)
from tests.e2e.shard_fleet import clients, deployed_servers, parley, placed, urls_env

pytestmark = pytest.mark.e2e

K = Keys()
N = 6  # partition p on shard p mod 3
APP = "examples.seed_app"
EMAIL = "Email bob@example.com: the launch moved to Friday."


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    with deployed_servers(tmp_path, 3) as started:
        yield started


def dispatcher_of(procs: Procs, servers: list[RedisServer], shard: int) -> subprocess.Popen[bytes]:
    return procs.dispatcher(APP, "--shard", str(shard), "--partitions", str(N), "--lease-ms", "2000",
                            "--register-producer", PRODUCER_NAME,
                            env=urls_env(servers, DISPATCHER))


def in_partition(p: int, stem: str) -> str:
    return next(f"{stem}-{i}" for i in itertools.count() if partition_of(f"{stem}-{i}", N) == p)


def finished(producer: Client, reader: Client, session: str) -> None:
    producer.send(session, {"type": "message.create", "content": "hello"}, f"{session}-hello")
    wait_for(reader, session, lambda e: e["type"] == "turn.completed", timeout=60)


def test_the_deployment_goes_on_without_shard_0(servers: list[RedisServer], procs: Procs) -> None:
    for server in servers:
        ready_for_producers(redis.Redis.from_url(server.url),
                            redis.Redis.from_url(server.url_as(login(DISPATCHER))))
    shard_procs = {}
    for shard in range(3):
        shard_procs[shard] = dispatcher_of(procs, servers, shard)
        procs.start("worker", APP, "--shard", str(shard),
                    env=urls_env(servers, WORKER))
    placed(servers, procs.logs)
    producer, reader = clients(servers)
    for p in range(N):  # every shard serves
        finished(producer, reader, in_partition(p, "before"))

    asks = {p: in_partition(p, "asks") for p in (0, 1)}  # an open interrupt on shards 0 and 1
    for session in asks.values():
        producer.send(session, {"type": "message.create", "content": EMAIL}, f"{session}-email")
        wait_for(reader, session, lambda e: e["type"] == "interrupt.raised", timeout=60)

    servers[0].stop(kill=True)  # shard 0 lost
    producer, reader = clients(servers)  # new clients: the placement read from shards 1 and 2
    # the listing goes on without it, and says what it lacks
    page = reader.interrupt_page()
    assert page.unreachable == [0] and [r.session for r in page.items] == [asks[1]]
    listed = parley(servers, "--limit", "10", command="interrupts")
    assert listed.returncode == 0 and asks[1] in listed.stdout and asks[0] not in listed.stdout
    assert "shard(s) [0] did not answer" in listed.stderr, listed.stderr
    as_json = orjson.loads(parley(servers, "--limit", "10", "--json", command="interrupts").stdout)
    assert as_json["unreachable"] == [0] and [r["session"] for r in as_json["items"]] == [asks[1]]
    finished(producer, reader, in_partition(1, "without-0"))
    finished(producer, reader, in_partition(2, "without-0"))
    with pytest.raises(redis.ConnectionError):
        producer.send(in_partition(0, "on-0"), {"type": "session.create"}, "on-0-create")

    # a dispatcher of shard 1 started while shard 0 is down: placement and engine key from the majority
    old = shard_procs[1]
    old.kill()
    old.wait()
    procs.forget(old)
    dispatcher_of(procs, servers, 1)
    finished(producer, reader, in_partition(4, "restarted"))

    listed = parley(servers, "list")
    assert listed.returncode == 0, listed.stderr
    assert "shard(s) [0] do not answer" in listed.stdout and "   1  shard 1  served" in listed.stdout

    moved = parley(servers, "move", "1", "--to", "2", "--drain-timeout", "20")
    assert moved.returncode == 0, moved.stdout + moved.stderr + procs.logs()
    assert "partition 1 moved from shard 1 to shard 2" in moved.stdout and "frozen" in moved.stdout
    later = in_partition(1, "after-move")
    finished(producer, reader, later)
    admin = [redis.Redis.from_url(u) for u in urls_as(servers, None)]
    assert admin[2].exists(K.meta(later)) and not admin[1].exists(K.meta(later))
    assert admin[2].exists(K.meta(in_partition(1, "without-0")))  # the moved partition's session
    newest = read_view(admin[1], K, 1).placement
    assert newest is not None and newest == read_view(admin[2], K, 2).placement and newest.serves(2, 1)

    # shard 0 back from its AOF: repair gives it the newest table; its dispatcher serves again
    servers[0].start()
    admin0 = redis.Redis.from_url(servers[0].url)
    assert read_view(admin0, K, 0).placement != newest  # it missed the move
    repaired = parley(servers, "repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "shard 0: table version" in repaired.stdout, repaired.stdout
    assert read_view(admin0, K, 0).placement == newest
    deadline = time.monotonic() + 60
    while True:  # its dispatcher waited the outage out, and serves its partitions again
        try:
            finished(producer, reader, in_partition(3, "back"))
            break
        except (AssertionError, redis.ConnectionError):
            assert time.monotonic() < deadline, procs.logs()
