"""An input found on another partition's stream (dispatcher/consume.py, `forward_strays`): a
hand-made XADD, or a producer with the partition count from before a resize that bypassed the
submit function. The dispatcher moves it to its own partition's stream, once, and the
session's partition applies it; it is never applied by the partition whose stream it was on."""

import logging

import orjson
import pytest
import redis

from parley.schemas.keys import Keys, partition_of
from tests.integration.conftest import MakeDispatcher, tick

K = Keys()
N = 4
MESSAGE = {"type": "message.create", "content": "hello"}


def session_in(p: int) -> str:
    return next(f"stray-{i}" for i in range(500) if partition_of(f"stray-{i}", N) == p)


def test_an_input_on_another_partitions_stream_is_moved_there_and_applied_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher, caplog: pytest.LogCaptureFixture) -> None:
    r.hset(K.config, "partitions", N)
    d = make_dispatcher(partitions=N)
    tick(d, 2)  # leases of every partition, its groups made
    session = session_in(3)
    r.xadd(K.inputs(1, N), {"session": session, "input": orjson.dumps(MESSAGE)})  # partition 1's stream
    with caplog.at_level(logging.WARNING, logger="parley.dispatcher"):
        tick(d, 4)
    moved = [rec for rec in caplog.records if "moved to its own" in rec.getMessage()]
    assert len(moved) == 1 and getattr(moved[0], "kv", {}).get("to") == K.inputs(3, N)
    assert r.xlen(K.inputs(1, N)) == 0 and r.xpending(K.inputs(1, N), K.GROUP)["pending"] == 0
    events = [orjson.loads(f[b"event"]) for _i, f in r.xrange(K.events(session))]
    users = [e for e in events if e["type"] == "message.created" and e["message"]["role"] == "user"]
    assert len(users) == 1, events
    assert r.zscore(K.partition_sessions(3), session) is not None  # listed in its own partition
    assert r.zscore(K.partition_sessions(1), session) is None


def test_only_the_one_that_acknowledges_it_moves_it(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """A stalled dispatcher and the partition's new owner may both read the entry: the move is
    made by whichever acknowledges it; the other adds nothing."""
    r.hset(K.config, "partitions", N)
    d = make_dispatcher(partitions=N)
    tick(d, 2)
    session = session_in(2)
    stream = K.inputs(0, N)
    entry_id = r.xadd(stream, {"session": session, "input": orjson.dumps(MESSAGE)})
    r.xreadgroup(K.GROUP, "someone", {stream: ">"})
    fields = [b"session", session.encode(), b"input", orjson.dumps(MESSAGE)]
    assert d._forward(keys=[stream, K.inputs(2, N)], args=[K.GROUP, entry_id, *fields]) == 1
    assert d._forward(keys=[stream, K.inputs(2, N)], args=[K.GROUP, entry_id, *fields]) == 0
    assert r.xlen(K.inputs(2, N)) == 1 and r.xlen(stream) == 0
