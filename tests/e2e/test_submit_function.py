"""The submit function with real processes: a `parley dispatcher` loads it at start, and loads
it again into a Redis that comes back without it (started empty); producers meanwhile get
`SubmitUnavailable`, never a lost or half-written input (docs/protocol.md, "Producers and the
submit function")."""

from pathlib import Path

import pytest
import redis

from parley.client import Client
from parley.client.producer import SubmitUnavailable
from parley.dispatcher.functions import LIBRARY
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually

pytestmark = pytest.mark.e2e

KEYS = Keys()
MESSAGE = {"type": "message.create", "content": "hi"}


def loaded(r: redis.Redis) -> bool:
    try:
        return bool(r.function_list(library=LIBRARY))
    except redis.ConnectionError:
        return False


def test_a_dispatcher_loads_the_function_at_start_and_into_a_redis_restarted_empty(
        procs: Procs, redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> None:
    app = Client(r, producer="app")
    with pytest.raises(SubmitUnavailable):
        app.send("s-1", MESSAGE)
    assert not r.exists(KEYS.producer_inputs("app"), KEYS.pending("app"))
    procs.dispatcher()
    eventually(lambda: loaded(r), timeout=30)
    app.send("s-1", MESSAGE)

    # the same port, a new empty data directory: a Redis that lost its functions (and data)
    redis_server.stop(kill=True)
    redis_server.directory = tmp_path / "redis-empty"
    redis_server.start()
    eventually(lambda: loaded(r), timeout=30)  # the dispatcher noticed the outage and reloaded
    app.send("s-2", MESSAGE)
    assert r.xlen(KEYS.producer_inputs("app")) == 1
