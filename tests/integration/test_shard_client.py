"""The clients over several shards (docs/operations.md, "Shards"), on real redis-servers with
the submit function loaded: each session's input lands on its placed shard only, a send refused
`moved` waits for the move and follows it (or gives up with `SubmitUnavailable`), and a sharded
client never writes inputs by plain XADD."""

import asyncio
import threading
from typing import Any

import pytest
import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.client.producer import SubmitUnavailable
from parley.client.shards import Shards, write_placement
from parley.runtime.procs import RedisServer
from parley.schemas.keys import partition_of
from tests.integration import shard_fixtures
from tests.integration.shard_fixtures import KEYS, N

# the two shards' fixtures (tests/integration/shard_fixtures.py)
servers = shard_fixtures.servers
shards = shard_fixtures.shards

MESSAGE = {"type": "message.create", "content": "hi"}



def entries(r: redis.Redis, session: str) -> list[Any]:
    stream = KEYS.producer_inputs("app", partition_of(session, N), N)
    return [f for _id, f in r.xrange(stream) if f[b"session"] == session.encode()]


def sessions_on(shards: Shards, shard: int, count: int) -> list[str]:
    assert shards.placement is not None
    placed = [s for s in (f"s-{i}" for i in range(200)) if shards.placement.shard_of_session(s) == shard]
    return placed[:count]


def test_each_session_goes_to_its_placed_shard_only(shards: Shards) -> None:
    client = Client(shards, producer="app")
    assert client.redis is shards.clients[0]
    for shard in (0, 1):
        for session in [*sessions_on(shards, shard, 3), f"{sessions_on(shards, shard, 1)[0]}:sub-1"]:
            client.send(session, MESSAGE)
            assert len(entries(shards.clients[shard], session)) == 1
            assert entries(shards.clients[1 - shard], session) == []


def test_a_client_given_the_shards_clients_builds_its_shards(shards: Shards) -> None:
    client = Client(shards.clients, producer="app")
    (session,) = sessions_on(shards, 1, 1)
    client.send(session, MESSAGE)
    assert len(entries(shards.clients[1], session)) == 1


def test_a_sharded_client_without_a_producer_refuses_to_send_but_reads(shards: Shards) -> None:
    client = Client(shards)
    with pytest.raises(ValueError, match="submit function"):
        client.send("s-1", MESSAGE)
    assert client.show("s-1") is None
    assert client.interrupts() == [] and client.sessions().items == []


def freeze(shards: Shards, session: str) -> int:
    """Mark the session's partition as moving to the other shard, on both shards."""
    assert shards.placement is not None
    p = partition_of(session, N)
    moving = shards.placement.freeze(p, 1 - shards.placement.shard_of(p))
    for i, r in enumerate(shards.clients):
        write_placement(r, KEYS, i, moving)
    return p


def test_a_send_refused_moved_waits_for_the_flip_and_goes_to_the_new_shard(shards: Shards) -> None:
    (session,) = sessions_on(shards, 0, 1)
    client = Client(Shards(shards.clients, KEYS), producer="app")
    client.send(session, MESSAGE)  # reads the placement before the move
    p = freeze(shards, session)
    sent: list[str] = []
    thread = threading.Thread(target=lambda: sent.append(client.send(session, MESSAGE)))
    thread.start()
    refreshed = Shards(shards.clients, KEYS)
    moving = refreshed.refresh()
    assert moving is not None and p in moving.moving
    flipped = moving.flip(p)
    for i, r in enumerate(shards.clients):
        write_placement(r, KEYS, i, flipped)
    thread.join(timeout=60)
    assert not thread.is_alive() and len(sent) == 1
    # the first send is on shard 0; the one sent during the move went to shard 1, once flipped
    assert len(entries(shards.clients[0], session)) == 1
    assert len(entries(shards.clients[1], session)) == 1
    assert client.shards.index_of_session(session) == 1


def test_a_move_that_outlasts_the_bound_is_submit_unavailable_and_writes_nothing(shards: Shards) -> None:
    (session,) = sessions_on(shards, 1, 1)
    freeze(shards, session)
    client = Client(shards.clients, producer="app", moved_timeout_s=0.3)
    with pytest.raises(SubmitUnavailable, match="moved"):
        client.send(session, MESSAGE)
    assert entries(shards.clients[0], session) == [] and entries(shards.clients[1], session) == []


def test_the_async_client_routes_and_waits_out_moved_too(shards: Shards, servers: list[RedisServer]) -> None:
    (on_0,) = sessions_on(shards, 0, 1)
    (on_1,) = sessions_on(shards, 1, 1)

    async def run() -> None:
        clients = [redis.asyncio.Redis.from_url(s.url) for s in servers]
        try:
            client = AsyncClient(clients, producer="app", moved_timeout_s=0.3)
            await client.send(on_0, MESSAGE)
            await client.send(on_1, MESSAGE)
            with pytest.raises(ValueError, match="submit function"):
                await AsyncClient(clients).send(on_0, MESSAGE)
            freeze(shards, on_1)
            await client.refresh()
            with pytest.raises(SubmitUnavailable):
                await client.send(on_1, MESSAGE)
            assert (await client.sessions()).items == [] and await client.interrupts() == []
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(run())
    assert len(entries(shards.clients[0], on_0)) == 1 and entries(shards.clients[1], on_0) == []
    assert len(entries(shards.clients[1], on_1)) == 1 and entries(shards.clients[0], on_1) == []


class _MeetingPipeline:
    """A pipeline whose first `execute` waits until every shard's first read has begun: only
    reads made at the same time can all get past it."""

    def __init__(self, pipe: Any, meeting: threading.Barrier, met: list[str]):
        self._pipe, self._meeting, self._met = pipe, meeting, met

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def execute(self) -> Any:
        if not self._met:
            self._meeting.wait(timeout=10)  # BrokenBarrierError when the shards are read in turn
        self._met.append(threading.current_thread().name)
        return self._pipe.execute()


def test_a_listing_reads_every_shard_at_once(shards: Shards) -> None:
    """One page over S shards costs one shard's round trips of wall time: each shard's read
    runs beside the others (a barrier the reads must all reach before any goes on)."""
    meeting = threading.Barrier(len(shards.clients))
    client = Client(shards.clients)
    for r in client.shards.clients:
        met: list[str] = []
        original = r.pipeline

        def meeting_pipeline(*args: Any, _original: Any = original, _met: list[str] = met,
                             **kwargs: Any) -> Any:
            return _MeetingPipeline(_original(*args, **kwargs), meeting, _met)

        r.pipeline = meeting_pipeline  # type: ignore[method-assign]
    page = client.interrupt_page(InterruptFilter(), limit=10)
    assert page.items == [] and page.cursor is None
    assert not meeting.broken
    # and once more: the threads are kept for the next listing
    assert client.interrupts(InterruptFilter()) == []


def test_the_shards_of_a_new_deployment_are_indexed_from_the_start(servers: list[RedisServer]) -> None:
    """Shards no dispatcher served before the first placement hold no session that could be
    missing from its partition's list: they are marked indexed with it (moves then read the
    lists, not a scan of the shard); a Redis that was served before (one Redis of an older
    release, made shard 0 of several) is not, until `parley partitions index`."""
    from parley.schemas.moves import INDEXED_FIELD

    clients = [redis.Redis.from_url(s.url) for s in servers]
    clients[0].hset(KEYS.config, "partitions", str(N))  # served before, alone
    Shards(clients, KEYS).check(N, create=True)
    assert [r.hget(KEYS.config, INDEXED_FIELD) for r in clients] == [None, b"1"]
