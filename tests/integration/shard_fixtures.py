"""Two real redis-servers as the shards of a deployment of 16 partitions, the submit function
loaded on each and the first placement written: the fixtures of the sharded client tests
(import `servers` and `shards` into a test module to use them)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.client.shards import Shards
from parley.dispatcher.functions import Functions
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys

KEYS = Keys()
N = 16


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    started = [RedisServer(tmp_path / f"redis-{i}").start() for i in range(2)]
    yield started
    for server in started:
        server.stop(kill=True)


@pytest.fixture
def shards(servers: list[RedisServer]) -> Shards:
    """Two shards with the submit function loaded and the first placement written (p mod 2)."""
    clients = [redis.Redis.from_url(s.url) for s in servers]
    for r in clients:
        Functions(r).ensure()
    placed = Shards(clients, KEYS)
    placed.check(N, create=True)
    return placed
