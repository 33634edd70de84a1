"""A wait for an outcome longer than the Redis client's socket timeout (redis-py's default is
5 s) is several blocking reads, never a TimeoutError that would pass for Redis being down."""

import asyncio
import time

import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.follow import socket_timeout_of, within_socket_timeout
from parley.runtime.procs import RedisServer
from parley.schemas.resumes import ResumeStatus


def test_a_block_stays_well_within_the_socket_timeout() -> None:
    assert within_socket_timeout(10_000, 5.0) == 4_000
    assert within_socket_timeout(10_000, 1.0) == 500
    assert within_socket_timeout(300, 5.0) == 300
    assert within_socket_timeout(10_000, None) == 10_000
    assert socket_timeout_of(redis.Redis()) == 5.0
    assert socket_timeout_of(redis.Redis(socket_timeout=2)) == 2


def test_a_long_wait_with_no_dispatcher_ends_as_a_timeout_not_an_error(redis_server: RedisServer) -> None:
    client = Client(redis.Redis.from_url(redis_server.url, socket_timeout=1.0))
    started = time.monotonic()
    outcome = client.resume("s-long", "int-1", {"approved": True}, wait=True, timeout_s=2.5)
    assert outcome.status is ResumeStatus.TIMEOUT and time.monotonic() - started >= 2.4

    async def wait_async() -> ResumeStatus:
        aclient = AsyncClient(redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=1.0))
        try:
            return (await aclient.resume("s-long", "int-1", {"approved": True}, wait=True,
                                         timeout_s=2.5)).status
        finally:
            await aclient.redis.aclose()

    assert asyncio.run(wait_async()) is ResumeStatus.TIMEOUT
