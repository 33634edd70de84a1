"""Clients over two shards while a partition moves (docs/operations.md, "Clients over several
shards"), on real redis-servers: a watcher, `show` and `export` follow a session whose partition
moved (the move simulated as it is done: the session's keys copied with DUMP/RESTORE, the
flipped placement written on both shards, the source's keys deleted); a listing shows a session
copied to both shards once; URLs given in the wrong order are refused with a clear error."""

import asyncio
import threading
import time
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.shards import Shards, write_placement
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer
from parley.schemas.keys import partition_of
from parley.schemas.resumes import CloseOutcome, CloseStatus
from parley.schemas.shards import PlacementError
from tests.integration import shard_fixtures
from tests.integration.shard_fixtures import KEYS, N
from tests.integration.test_sessions import core_of, put

# the two shards' fixtures (tests/integration/shard_fixtures.py)
servers = shard_fixtures.servers
shards = shard_fixtures.shards

MESSAGE = {"type": "message.create", "content": "hi"}
#: a bound on the waits below, not an assertion about speed: a watcher that never follows fails
BOUND_S = 30



def session_on(shards: Shards, shard: int) -> str:
    assert shards.placement is not None
    return next(s for s in (f"s-{i:04}" for i in range(200)) if shards.placement.shard_of_session(s) == shard)


def event(n: int) -> dict[str, Any]:
    return {"event": orjson.dumps({"type": "message.created", "n": n}).decode()}


def copy_and_flip(shards: Shards, session: str) -> None:
    """The move's copy and flip: the session's keys DUMPed from shard 0 and RESTOREd on shard 1
    (the events stream with its ids), the flipped placement on both shards."""
    source, target = shards.clients
    for key in KEYS.session_keys(session):
        dumped = source.dump(key)
        if dumped is not None:
            target.restore(key, 0, dumped, replace=True)
    current = Shards(shards.clients, KEYS).refresh()
    assert current is not None
    p = partition_of(session, N)
    flipped = current.freeze(p, 1).flip(p)
    for i, r in enumerate(shards.clients):
        write_placement(r, KEYS, i, flipped)


def clean(shards: Shards, session: str) -> None:
    shards.clients[0].delete(*KEYS.session_keys(session))


def test_a_watcher_follows_the_session_to_its_new_shard(shards: Shards) -> None:
    session = session_on(shards, 0)
    source, target = shards.clients
    first = source.xadd(KEYS.events(session), event(1)).decode()
    client = Client(Shards(shards.clients, KEYS))
    seen: list[tuple[str, dict[str, Any]]] = []
    started = threading.Event()

    def watch() -> None:
        for entry_id, ev in client.events(session, block_ms=100, until=time.monotonic() + BOUND_S):
            seen.append((entry_id, ev))
            started.set()
            if ev["n"] == 2:
                return

    thread = threading.Thread(target=watch)
    thread.start()
    assert started.wait(BOUND_S)
    copy_and_flip(shards, session)
    clean(shards, session)
    second = target.xadd(KEYS.events(session), event(2)).decode()
    thread.join(BOUND_S + 5)
    assert seen == [(first, {"type": "message.created", "n": 1}),
                    (second, {"type": "message.created", "n": 2})]


def test_the_async_watcher_follows_too(shards: Shards, servers: list[RedisServer]) -> None:
    session = session_on(shards, 0)
    source, target = shards.clients
    source.xadd(KEYS.events(session), event(1))

    async def run() -> list[int]:
        clients = [redis.asyncio.Redis.from_url(s.url) for s in servers]
        try:
            client = AsyncClient(clients)
            seen: list[int] = []
            async for _id, ev in client.events(session, block_ms=100, until=time.monotonic() + BOUND_S):
                seen.append(ev["n"])
                if ev["n"] == 1:
                    await asyncio.to_thread(copy_and_flip, shards, session)
                    await asyncio.to_thread(clean, shards, session)
                    target.xadd(KEYS.events(session), event(2))
                if ev["n"] == 2:
                    break
            return seen
        finally:
            for c in clients:
                await c.aclose()

    assert asyncio.run(run()) == [1, 2]


def test_a_close_wait_follows_the_session_to_its_new_shard(shards: Shards) -> None:
    session = session_on(shards, 0)
    source, target = shards.clients
    client = Client(Shards(shards.clients, KEYS), producer="app")
    told: list[CloseOutcome] = []
    thread = threading.Thread(target=lambda: told.append(client.close(session, wait=True, timeout_s=BOUND_S)))
    thread.start()
    stream = KEYS.producer_inputs("app", partition_of(session, N), N)
    deadline = time.monotonic() + BOUND_S
    while not source.xlen(stream) and time.monotonic() < deadline:
        time.sleep(0.02)
    ((entry, _fields),) = source.xrange(stream)
    copy_and_flip(shards, session)
    clean(shards, session)
    closed = {"type": "session.closed", "input": {"entry": entry.decode()}}
    target.xadd(KEYS.events(session), {"event": orjson.dumps(closed).decode()})
    thread.join(BOUND_S + 5)
    assert [o.status for o in told] == [CloseStatus.CLOSED]


def test_show_and_export_find_a_session_that_moved(shards: Shards, servers: list[RedisServer]) -> None:
    session = session_on(shards, 0)
    core = core_of(0).model_copy(update={"session": session})
    shards.clients[0].hset(KEYS.meta(session), mapping={"ver": 1, "core": core.to_json()})
    client = Client(Shards(shards.clients, KEYS))
    assert client.show(session) is not None  # reads the placement before the move
    copy_and_flip(shards, session)
    clean(shards, session)
    view = client.show(session)
    assert view is not None and view["session"] == session
    assert client.export(session).session == session



def test_the_async_show_and_export_find_a_session_that_moved(shards: Shards,
                                                             servers: list[RedisServer]) -> None:
    session = session_on(shards, 0)
    core = core_of(0).model_copy(update={"session": session})
    shards.clients[0].hset(KEYS.meta(session), mapping={"ver": 1, "core": core.to_json()})

    async def run() -> tuple[Any, str]:
        clients = [redis.asyncio.Redis.from_url(s.url) for s in servers]
        try:
            client = AsyncClient(clients)
            assert await client.show(session) is not None  # reads the placement before the move
            copy_and_flip(shards, session)
            clean(shards, session)
            return await client.show(session), (await client.export(session)).session
        finally:
            for c in clients:
                await c.aclose()

    view, exported = asyncio.run(run())
    assert view is not None and view["session"] == session and exported == session


def test_a_session_listed_on_both_shards_mid_move_is_listed_once(shards: Shards) -> None:
    session = session_on(shards, 0)
    core = core_of(0).model_copy(update={"session": session})
    other = core_of(1).model_copy(update={"session": session_on(shards, 1)})
    put(shards.clients[0], Outbox(shards.clients[0], KEYS), core)
    put(shards.clients[1], Outbox(shards.clients[1], KEYS), other)
    client = Client(Shards(shards.clients, KEYS))
    put(shards.clients[1], Outbox(shards.clients[1], KEYS), core)  # the move's copy, before its flip
    assert sorted(row.session for row in client.sessions().items) == sorted([session, other.session])
    copy_and_flip(shards, session)  # flipped, the source not yet cleaned
    assert sorted(row.session for row in client.sessions().items) == sorted([session, other.session])
    assert sorted(row.session for row in client.sessions(limit=1).items) == [min(session, other.session)]


def test_urls_in_the_wrong_order_are_refused_clearly(shards: Shards, servers: list[RedisServer]) -> None:
    backwards = list(reversed(shards.clients))
    session = session_on(shards, 0)
    with pytest.raises(PlacementError, match="URL #0 is shard 1"):
        Client(Shards(backwards, KEYS), producer="app").send(session, MESSAGE)
    with pytest.raises(PlacementError, match="URL #0 is shard 1"):
        Client(backwards).show(session)

    async def run() -> None:
        clients = [redis.asyncio.Redis.from_url(s.url) for s in reversed(servers)]
        try:
            with pytest.raises(PlacementError, match="URL #0 is shard 1"):
                await AsyncClient(clients, producer="app").send(session, MESSAGE)
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(run())
