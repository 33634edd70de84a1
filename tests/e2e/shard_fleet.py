"""What the e2e tests of a deployment of several shards, as deployed, share
(test_rebalance.py, test_resize.py, test_shard_lost.py): private redis-servers with the shipped
redis.conf and users.acl, the URLs under a shipped login, `parley` commands as an operator runs
them (the harness's admin), and the producer's and reader's clients over every shard."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from parley.schemas.shards import Placement
from tests import forkserver
from tests.conftest import ROOT
from tests.deployed import PRODUCER, PRODUCER_NAME, READER, deployed_redis, urls_as


@contextlib.contextmanager
def deployed_servers(directory: Path, count: int) -> Iterator[list[RedisServer]]:
    """`count` shards, started as deployed; killed at the end. A test names its servers
    fixture before `procs`, so pytest stops the processes first: a dispatcher stopped after its
    Redis went away has nothing to give its leases back to."""
    started = [deployed_redis(directory / f"shard{i}").start() for i in range(count)]
    try:
        yield started
    finally:
        for s in started:
            s.stop(kill=True)


def urls_env(servers: list[RedisServer], user: str) -> dict[str, str]:
    """The environment a process of the fleet is started with: every URL, under its login."""
    return {"PARLEY_REDIS_URLS": " ".join(urls_as(servers, user))}


def parley(servers: list[RedisServer], *args: str,
           command: str = "partitions") -> subprocess.CompletedProcess[str]:
    """`parley --redis-url ... COMMAND ARGS` as an operator runs it (the harness's admin login)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    flags = [a for url in urls_as(servers, None) for a in ("--redis-url", url)]
    return forkserver.run_parley([*flags, command, *args], env, text=True, timeout=240)


def producer_of(servers: list[RedisServer]) -> Client:
    """Producer `app` over every shard, under the shipped producer login."""
    return Client(Shards([redis.Redis.from_url(u) for u in urls_as(servers, PRODUCER)], Keys()),
                  producer=PRODUCER_NAME)


def clients(servers: list[RedisServer]) -> tuple[Client, Client]:
    """The producer's client and the reader's (the shipped reader login), over every shard."""
    reader = Client(Shards([redis.Redis.from_url(u) for u in urls_as(servers, READER)], Keys()))
    return producer_of(servers), reader


def placed(servers: list[RedisServer], logs: Callable[[], str], timeout: float = 40) -> Placement:
    """The placement, once the first dispatcher has written it on the shards, and once every
    shard's worker beats. A producer sending before the placement is there is refused
    (PlacementError: "start a dispatcher first"), and a worker still starting when a test
    changes the table (adding shards) would check its URLs against the new one and refuse to
    start; so a test waits here after starting its fleet. `logs` says why when it times out."""
    shards = Shards([redis.Redis.from_url(u) for u in urls_as(servers, None)], Keys())
    heartbeats = Keys().worker_alive("*")
    deadline = time.monotonic() + timeout
    while (placement := shards.refresh()) is None or not all(
            next(iter(c.scan_iter(match=heartbeats, count=1000)), None) for c in shards.clients):
        assert time.monotonic() < deadline, f"the fleet not up after {timeout:g} s\n{logs()}"
        time.sleep(0.1)
    return placement
