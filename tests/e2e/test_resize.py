"""A deployment given more partitions (docs/operations.md, "More partitions"): two shards as
deployed (the shipped redis.conf and users.acl, processes under their shipped logins, inputs
through the producer login), 4 partitions, sessions parked on an interrupt and finished; then
every process stopped, `parley partitions resize --to 8` (the harness's admin, an operator's
login), every process started again. The parked sessions resume and finish where they were
(no session changed shard), new sessions use all 8 partitions, and a producer left running
from before is refused `moved` on its old partition's stream, reads the count again and gets
each input applied once. While anything runs, or for a count that is not
a multiple, the resize is refused and changes nothing."""

import itertools
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from parley.client.shards import Shards, read_view
from parley.runtime.procs import RedisServer, stop_processes
from parley.schemas.keys import Keys, partition_of
from tests.conftest import Procs, all_events, wait_for
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
APP = "examples.seed_app"
EMAIL = "Email bob@example.com: the launch moved to Friday."


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    with deployed_servers(tmp_path, 2) as started:
        yield started


def start_fleet(procs: Procs, servers: list[RedisServer],
                *dispatcher_args: str) -> list[subprocess.Popen[bytes]]:
    started = []
    for shard in (0, 1):
        started.append(procs.dispatcher(APP, "--shard", str(shard), "--lease-ms", "2000",
                                        "--register-producer", PRODUCER_NAME, *dispatcher_args,
                                        env=urls_env(servers, DISPATCHER)))
        started.append(procs.start("worker", APP, "--shard", str(shard), env=urls_env(servers, WORKER)))
    return started


def named(stem: str, count: int, where: Callable[[str], bool]) -> list[str]:
    return list(itertools.islice((f"{stem}-{i}" for i in itertools.count() if where(f"{stem}-{i}")), count))


def test_a_stopped_deployment_resized_to_more_partitions_loses_and_doubles_nothing(
        servers: list[RedisServer], procs: Procs) -> None:
    for server in servers:
        ready_for_producers(redis.Redis.from_url(server.url),
                            redis.Redis.from_url(server.url_as(login(DISPATCHER))))
    fleet = start_fleet(procs, servers, "--partitions", "4")
    placed(servers, procs.logs)
    producer, reader = clients(servers)
    # parked sessions whose partition changes (crc32 mod 8 >= 4) and some whose does not
    parked = (named("parked", 4, lambda s: partition_of(s, 8) >= 4)
              + named("kept", 2, lambda s: partition_of(s, 8) < 4))
    for s in parked:
        producer.send(s, {"type": "message.create", "content": EMAIL}, f"{s}-email")
    for s in parked:
        wait_for(reader, s, lambda e: e["type"] == "interrupt.raised", timeout=60)
    admin = [redis.Redis.from_url(u) for u in urls_as(servers, None)]
    home = {s: next(i for i, c in enumerate(admin) if c.exists(K.meta(s))) for s in parked}
    stale, _ = clients(servers)  # a producer from before the resize: it keeps the count 4
    for p in (0, 1):  # it has read the count of both shards (p mod 2)
        [warm] = named(f"warm{p}", 1, lambda s, p=p: partition_of(s, 4) == p)
        stale.send(warm, {"type": "message.create", "content": "hello"}, f"{warm}-hello")
        wait_for(reader, warm, lambda e: e["type"] == "turn.completed", timeout=60)

    running = parley(servers, "resize", "--to", "8")
    assert running.returncode == 1 and "not stopped" in running.stderr and "dispatcher(s)" in running.stderr
    assert [c.hget(K.config, "partitions") for c in admin] == [b"4", b"4"]

    assert stop_processes(fleet, timeout=30) == [0] * 4
    for proc in fleet:
        procs.forget(proc)
    odd = parley(servers, "resize", "--to", "6")
    assert odd.returncode == 1 and "not a multiple of 4" in odd.stderr
    done = parley(servers, "resize", "--to", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resized from 4 to 8 partitions" in done.stdout
    for i, c in enumerate(admin):
        table = read_view(c, K, i).placement
        assert table is not None and table.partitions == 8 and c.hget(K.config, "partitions") == b"8"
        assert all(table.shard_of(p) == table.shard_of(p % 4) for p in range(8))
    for s in parked:  # on the shard it was, listed under its new partition
        assert admin[home[s]].exists(K.meta(s))
        assert admin[home[s]].zscore(K.partition_sessions(partition_of(s, 8)), s) is not None
    again = parley(servers, "resize", "--to", "8")  # once more: nothing left to list anew
    assert again.returncode == 0 and ": 0 session(s) listed" in again.stdout, again.stdout

    fleet = start_fleet(procs, servers)
    producer, reader = clients(servers)
    for s in parked:
        producer.resume(s, "int-1", {"approved": True}, idempotency_key=f"{s}-yes")
    fresh = named("fresh", 4, lambda s: partition_of(s, 8) >= 4)
    for s in fresh:
        producer.send(s, {"type": "message.create", "content": "hello"}, f"{s}-hello")
    late = named("late", 2, lambda s: partition_of(s, 8) != partition_of(s, 4))
    for s in late:  # refused `moved` on its old partition's stream: the count read again, sent once
        stale.send(s, {"type": "message.create", "content": "hello"}, f"{s}-hello")
    for s in parked + fresh + late:
        wait_for(reader, s, lambda e: e["type"] == "turn.completed", timeout=60)
    for s in parked + fresh + late:
        kinds = [e["type"] for e in all_events(reader, s)]
        assert kinds.count("turn.completed") == 1 and "input.refused" not in kinds, (s, kinds)
        users = [e for e in all_events(reader, s)
                 if e["type"] == "message.created" and e["message"]["role"] == "user"]
        assert len(users) == 1, (s, kinds)
    on = Shards(admin, K)
    placement = on.refresh()
    assert placement is not None
    for s in fresh + late:
        shard = admin[placement.shard_of_session(s)]
        assert shard.zscore(K.partition_sessions(partition_of(s, 8)), s) is not None
    logs = "".join(log.read_text() for kind, _proc, log in procs.started if kind == "dispatcher")
    assert "moved to its own" not in logs  # none went astray: the submit function refused them
    assert stop_processes(fleet, timeout=30) == [0] * 4  # before the servers' teardown stops Redis
    for proc in fleet:
        procs.forget(proc)
