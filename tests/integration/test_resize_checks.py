"""What keeps a deployment from being resized (parley/fleet/resizing.py `busy`), each reason
on its own, on a real redis-server; and a resize of one Redis, lists and count."""

import time
from pathlib import Path

import pytest
import redis

from parley.client.shards import Shards
from parley.fleet.move_errors import MoveError
from parley.fleet.resizing import busy, resize
from parley.schemas.keys import Keys, partition_of

K = Keys()


def test_a_quiet_shard_has_nothing_in_the_way(r: redis.Redis) -> None:
    r.hset(K.config, "partitions", 2)
    assert busy(r, K, 2) == []


def test_each_thing_still_running_is_named(r: redis.Redis) -> None:
    r.hset(K.producers, "app", "{}")
    r.zadd(K.dispatchers, {"d-1": int(time.time() * 1000)})
    r.set(K.lease(1), "d-1")
    r.sadd("rq:workers", "rq:worker:w-1")
    r.set("rq:worker:w-1", "alive")
    r.hset(K.inflight, "job-1", "{}")
    r.rpush("rq:queue:llm", "job-2")
    r.xadd(K.producer_inputs("app", 1, 2), {"session": "s"})
    r.xadd(K.results(0, 2), {"outcome": "{}"})
    found = "\n".join(busy(r, K, 2))
    for says in ("dispatcher(s) d-1", "1 partition lease(s) held", "1 RQ worker(s) alive",
                 "2 job(s) queued, in flight or running", "2 entr(ies) not yet applied in 2 stream(s)",
                 "parley:in:app:1 (1)"):
        assert says in found, found


def test_one_redis_resized_lists_its_sessions_anew(r: redis.Redis) -> None:
    r.hset(K.config, mapping={"partitions": 1, "partition_sessions": 1})
    sessions = [f"s-{i}" for i in range(40)]
    r.zadd(K.partition_sessions(0), dict.fromkeys(sessions, 0))
    r.xgroup_create(K.inputs(0, 1), K.GROUP, id="0", mkstream=True)  # an empty stream of one partition
    done = resize(Shards([r], K), 4)
    assert (done.before, done.after, done.version) == (1, 4, None)
    assert done.relisted == sum(1 for s in sessions if partition_of(s, 4) != 0)
    assert r.hget(K.config, "partitions") == b"4"
    for s in sessions:
        assert r.zscore(K.partition_sessions(partition_of(s, 4)), s) is not None
    assert sum(r.zcard(K.partition_sessions(p)) for p in range(4)) == 40
    assert not r.exists(K.inputs(0, 1))  # one partition's unsuffixed stream, empty, is gone
    assert not r.exists(K.partitions_lock)


def test_a_resize_stopped_between_shards_is_finished_by_the_next(r: redis.Redis, tmp_path: Path) -> None:
    from parley.client.shards import read_view, write_placement
    from parley.runtime.procs import RedisServer
    from parley.schemas.shards import Placement

    other = RedisServer(tmp_path / "redis-1").start()
    try:
        r1 = redis.Redis.from_url(other.url)
        before = Placement.default(4, 2)
        for i, c in enumerate((r, r1)):
            write_placement(c, K, i, before)
            c.hset(K.config, "partition_sessions", 1)
        after = before.resized(8)
        write_placement(r1, K, 1, after)  # written on shard 1, not yet on shard 0
        done = resize(Shards([r, r1], K), 8)
        assert (done.before, done.after, done.version) == (4, 8, after.version)
        assert read_view(r, K, 0).placement == after == read_view(r1, K, 1).placement
        with pytest.raises(MoveError, match="run the resize that stopped half way again"):
            write_placement(r1, K, 1, before.resized(12))
            resize(Shards([r, r1], K), 16)
        # a dispatcher started meanwhile: the finish is refused like the resize
        write_placement(r1, K, 1, before.resized(8).resized(16))
        r.set(K.lease(2), "d-1", px=60_000)
        with pytest.raises(MoveError, match="cannot be finished"):
            resize(Shards([r, r1], K), 16)
        r1.close()
    finally:
        other.stop(kill=True)


def test_an_input_that_reached_a_one_partition_stream_late_goes_to_its_partition(r: redis.Redis) -> None:
    from parley.fleet.resizing import unsuffixed

    r.hset(K.producers, "app", "{}")
    r.xadd(K.producer_inputs("app", 0, 1), {"session": "late-1", "input": "{}"})
    r.xadd(K.inputs(0, 1), {"session": "late-2", "input": "{}"})
    unsuffixed(r, K, 4)
    assert not r.exists(K.producer_inputs("app", 0, 1)) and not r.exists(K.inputs(0, 1))
    assert r.xlen(K.producer_inputs("app", partition_of("late-1", 4), 4)) == 1
    assert r.xlen(K.inputs(partition_of("late-2", 4), 4)) == 1
