"""Shards on real redis-servers: a dispatcher or worker of one shard refuses to start when the
shards disagree with its URLs; a dispatcher of one shard leases and sweeps only what its shard
serves, and gives a lease back once a move freezes its partition; the submit function
refuses `moved` for a partition this shard does not serve (schemas/shards.py)."""

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.client.shards import Shards, write_placement
from parley.dispatcher.functions import Functions
from parley.runtime.procs import RedisServer, parley_command
from parley.schemas.keys import Keys, partition_of
from parley.schemas.shards import Placement
from tests.forkserver import run_parley
from tests.integration.conftest import MakeDispatcher

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    started = [RedisServer(tmp_path / f"shard{i}").start() for i in range(3)]
    yield started
    for s in started:
        s.stop(kill=True)


@pytest.fixture
def conns(servers: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    out = [redis.Redis.from_url(s.url) for s in servers]
    yield out
    for c in out:
        c.close()


def place(conns: list[redis.Redis], placement: Placement) -> None:
    for i, c in enumerate(conns):
        write_placement(c, KEYS, i, placement)


def session_in(partition: int, partitions: int, tag: str = "s") -> str:
    """A session id whose partition is `partition`."""
    return next(s for n in range(10_000) if partition_of(s := f"{tag}{n}", partitions) == partition)


def run(urls: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    flags = [a for u in urls for a in ("--redis-url", u)]
    return run_parley([*flags, *args], text=True, timeout=60, cwd=ROOT)


# ---- refusing to start ----------------------------------------------------------------------


def start(urls: list[str], kind: str, shard: int) -> "subprocess.Popen[str]":
    args = [x for u in urls for x in ("--redis-url", u)]
    command = parley_command(*args, kind, "--app", "tests.apps.scenarios", "--shard", str(shard))
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def refused(proc: "subprocess.Popen[str]", says: str) -> None:
    """A one-line refusal, exit 1 (the check waits out its settling time first)."""
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and says in err and "Traceback" not in err, err


def test_a_dispatcher_and_a_worker_refuse_urls_in_another_order(
        servers: list[RedisServer], conns: list[redis.Redis]) -> None:
    a, b = servers[0].url, servers[1].url
    place(conns[:2], Placement.default(4, 2))
    dispatcher, worker = start([b, a], "dispatcher", 0), start([b, a], "worker", 1)
    refused(dispatcher, "URL #0 is shard 1 of this deployment: give the URLs in the order")
    refused(worker, "URL #0 is shard 1 of this deployment")


def test_a_dispatcher_refuses_a_missing_url_then_different_tables(
        servers: list[RedisServer], conns: list[redis.Redis]) -> None:
    a, b, c = (s.url for s in servers)
    p = Placement.default(6, 3)
    place(conns, p)
    refused(start([a, b], "dispatcher", 0), "the deployment has 3 shards and this process was given 2 URLs")
    write_placement(conns[1], KEYS, 1, p.freeze(1, 0))  # a move stopped half way
    refused(start([a, b, c], "dispatcher", 2), "shards 0 and 1 hold different placements")


@pytest.mark.parametrize("kind", ["dispatcher", "worker"])
def test_one_url_of_a_shard_of_several_is_refused(servers: list[RedisServer], conns: list[redis.Redis],
                                                 kind: str) -> None:
    """A pod left on a single old URL would lease all of the shard's partitions, ignore moves
    and sweep frozen partitions: it refuses to start, naming what to give instead."""
    place(conns[:2], Placement.default(4, 2))
    for i in (0, 1):
        done = run([servers[i].url], kind, "--app", "tests.apps.scenarios")
        assert done.returncode == 1, done.stderr
        assert (f"this Redis is shard {i} of a deployment of 2 shards: give every shard's URL, in order, "
                f"and --shard {i}") in done.stderr
        assert "Traceback" not in done.stderr


def test_a_worker_stopped_while_it_waits_for_the_first_placement_exits_0(
        servers: list[RedisServer]) -> None:
    """A worker may start before any dispatcher has written the placement; it waits for one.
    SIGTERM then (an orchestrator stopping a pod still starting) is a normal stop: exit 0,
    not the signal's default kill, which reads as a crash."""
    worker = start([servers[0].url, servers[1].url], "worker", 0)
    assert worker.stderr is not None
    said = ""
    deadline = time.monotonic() + 30
    while "no placement yet: waiting for a dispatcher to write it" not in said:
        assert time.monotonic() < deadline and worker.poll() is None, said
        said += worker.stderr.readline()
    worker.send_signal(signal.SIGTERM)
    _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0 and "Traceback" not in err, (worker.returncode, said + err)


def test_a_shard_beyond_the_urls_is_a_usage_error(servers: list[RedisServer]) -> None:
    urls = [servers[0].url, servers[1].url]
    done = run(urls, "dispatcher", "--app", "tests.apps.scenarios", "--shard", "2")
    assert done.returncode == 2 and "--shard 2: there are 2 Redis URLs" in done.stderr


def test_without_shard_a_child_per_shard_runs_and_a_failed_child_fails_the_command(
        servers: list[RedisServer]) -> None:
    """Both children load the app, and fail: the command says so (exit 1), not 0."""
    urls = [servers[0].url, servers[1].url]
    done = run(urls, "dispatcher", "--app", "tests.apps.no_such_app")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("tests.apps.no_such_app") >= 2, done.stderr  # one line per child


def test_the_first_dispatcher_writes_the_placement_on_every_shard(conns: list[redis.Redis]) -> None:
    shards = Shards(conns[:2], KEYS)
    placement = shards.check(16, create=True)
    assert placement == Placement.default(16, 2)
    for i, c in enumerate(conns[:2]):
        assert c.hget(KEYS.config, "shard") == str(i).encode()
        assert c.hget(KEYS.config, "route:3") == b"1"
    assert Shards(conns[:2], KEYS).check(create=False) == placement


# ---- leases ---------------------------------------------------------------------------------


def test_a_dispatcher_of_a_shard_leases_only_what_it_serves_and_gives_back_a_frozen_one(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    p = Placement.default(4, 2)
    write_placement(r, KEYS, 1, p)  # this Redis is shard 1 of 2
    d = make_dispatcher(partitions=4, shard=1)
    d.leases.maintain()
    assert sorted(d.leases.owned) == [1, 3]
    assert r.get(KEYS.lease(0)) is None and r.get(KEYS.lease(2)) is None
    frozen = p.freeze(3, 0)
    write_placement(r, KEYS, 1, frozen)
    d.leases.maintain()  # the next tick: given back at once, not a third of a lease later
    assert sorted(d.leases.owned) == [1] and r.get(KEYS.lease(3)) is None
    write_placement(r, KEYS, 1, frozen.flip(3))
    d.leases.maintain()
    assert sorted(d.leases.owned) == [1]
    arriving = frozen.flip(3).freeze(2, 1).flip(2)  # partition 2 moves here
    write_placement(r, KEYS, 1, arriving)
    d.leases.maintain()
    assert sorted(d.leases.owned) == [1, 2]


def test_a_shard_without_a_readable_placement_serves_nothing(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher(partitions=4, shard=0)
    d.leases.maintain()
    assert d.leases.owned == {}
    r.hset(KEYS.config, "placement", "not json")
    d.leases.maintain()
    assert d.leases.owned == {} and not d.leases.serves_session("anything")
    write_placement(r, KEYS, 0, Placement.default(4, 2))
    d.leases.maintain()
    assert sorted(d.leases.owned) == [0, 2]


def test_the_fair_share_is_the_shards_partitions_over_its_live_dispatchers(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    write_placement(r, KEYS, 0, Placement.default(8, 2))  # shard 0 serves 0, 2, 4, 6
    first, second = make_dispatcher(partitions=8, shard=0), make_dispatcher(partitions=8, shard=0)
    first.leases.maintain()
    second.leases.maintain()  # now two are live: a share of 2 each
    first.leases.maintained_at = 0.0
    first.leases.maintain()
    second.leases.maintained_at = 0.0
    second.leases.maintain()
    assert len(first.leases.owned) == 2 and len(second.leases.owned) == 2
    assert sorted([*first.leases.owned, *second.leases.owned]) == [0, 2, 4, 6]


def test_an_unsharded_dispatcher_reads_no_placement(r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    r.hset(KEYS.config, "placement", "not json")  # ignored: there is no shard
    d = make_dispatcher(partitions=2)
    d.leases.maintain()
    assert sorted(d.leases.owned) == [0, 1] and d.leases.serves_session("x")


# ---- sweeps ---------------------------------------------------------------------------------


def test_sweeps_skip_sessions_of_a_moving_partition_without_starving_the_rest(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """More due deadlines of a frozen partition than a step reads, ahead of one served: the
    served one fires, the others stay for the partition's next owner."""
    write_placement(r, KEYS, 0, Placement.default(4, 2).freeze(2, 1))
    d = make_dispatcher(partitions=4, shard=0)
    d.leases.maintain()
    moving, served = session_in(2, 4, "m"), session_in(0, 4, "k")
    r.zadd(KEYS.deadlines, {f"{moving}\x1fi{n}": n for n in range(250)})
    r.zadd(KEYS.deadlines, {f"{served}\x1fmine": 1000})
    d.sweeps.fire_deadlines()
    assert r.zcard(KEYS.deadlines) == 250 and r.zscore(KEYS.deadlines, f"{served}\x1fmine") is None
    assert r.xlen(KEYS.results_of(served, 4)) == 1
    assert r.xlen(KEYS.results_of(moving, 4)) == 0
    # the expiring and idle sets are read the same way
    r.zadd(KEYS.expiring, {session_in(2, 4, f"e{n}-"): n for n in range(3)})
    r.zadd(KEYS.expiring, {served: 10})
    assert d.sweeps.due_expiring(int(time.time() * 1000)) == [served]


def test_the_lost_work_sweep_leaves_a_moving_partitions_jobs(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    write_placement(r, KEYS, 0, Placement.default(4, 2).freeze(2, 1))
    d = make_dispatcher(partitions=4, shard=0)
    d.leases.maintain()
    moving, served = session_in(2, 4, "m"), session_in(0, 4, "k")

    def record(session: str) -> bytes:
        rec: dict[str, Any] = {"session": session, "work": "w1", "attempt": 1, "kind": "llm",
                               "worker": "gone", "reply_to": KEYS.results_of(session, 4), "at": 0}
        return orjson.dumps(rec)

    r.hset(KEYS.running, mapping={"job-m": record(moving), "job-k": record(served)})
    d.sweeps.find_lost_work()
    assert r.hexists(KEYS.running, "job-m") and not r.hexists(KEYS.running, "job-k")
    assert r.xlen(KEYS.results_of(served, 4)) == 1 and r.xlen(KEYS.results_of(moving, 4)) == 0


# ---- the submit function --------------------------------------------------------------------


def submit(r: redis.Redis, partition: int, session: str) -> Any:
    fields = ["session", session, "input", orjson.dumps({"type": "message.create", "content": "hi"})]
    return r.fcall("parley_submit", 2, KEYS.producer_inputs("app", partition, 4), KEYS.pending("app"),
                   "parley", "app", *fields)


def test_the_submit_function_refuses_moved_until_the_flip(conns: list[redis.Redis]) -> None:
    zero, one = conns[0], conns[1]
    for c in (zero, one):
        Functions(c).ensure()
    p = Placement.default(4, 2)
    assert submit(zero, 2, session_in(2, 4))  # no placement yet: one Redis, no check
    frozen = p.freeze(2, 1)
    place([zero, one], frozen)
    with pytest.raises(redis.ResponseError, match=r"^PARLEY moved partition 2 is moving to shard 1$"):
        submit(zero, 2, session_in(2, 4))
    with pytest.raises(redis.ResponseError, match=r"^PARLEY moved partition 2 is moving to shard 1$"):
        submit(one, 2, session_in(2, 4))
    with pytest.raises(redis.ResponseError, match=r"^PARLEY moved partition 1 is on shard 1$"):
        submit(zero, 1, session_in(1, 4))
    before = zero.xlen(KEYS.producer_inputs("app", 2, 4))
    assert submit(zero, 0, session_in(0, 4))  # a partition shard 0 serves
    assert submit(one, 3, session_in(3, 4))
    place([zero, one], frozen.flip(2))
    assert submit(one, 2, session_in(2, 4))  # on its new shard
    with pytest.raises(redis.ResponseError, match=r"^PARLEY moved partition 2 is on shard 1$"):
        submit(zero, 2, session_in(2, 4))
    assert zero.xlen(KEYS.producer_inputs("app", 2, 4)) == before  # refusals wrote nothing


def test_a_stale_dispatchers_sweeps_write_nothing_for_a_partition_frozen_since(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """The move froze partition 2 in the stored table after this dispatcher last read it: its
    in-memory placement still serves 2, so its sweeps pick 2's sessions; each script checks the
    stored route itself and writes nothing (the move's copy may already be taken)."""
    write_placement(r, KEYS, 0, Placement.default(4, 2))
    d = make_dispatcher(partitions=4, shard=0)
    d.leases.maintain()
    moving = session_in(2, 4, "m")
    assert d.leases.serves_session(moving)
    write_placement(r, KEYS, 0, Placement.default(4, 2).freeze(2, 1))  # not read by d yet
    results, inputs = KEYS.results_of(moving, 4), KEYS.inputs_of(moving, 4)
    r.zadd(KEYS.deadlines, {f"{moving}\x1fi1": 1})
    rec = orjson.dumps({"session": moving, "work": "w1", "attempt": 1, "kind": "llm", "worker": "gone",
                        "reply_to": results, "at": 0})
    r.hset(KEYS.running, "job-r", rec)
    r.hset(KEYS.inflight, mapping={"job-r": rec, "job-u": rec})
    r.zadd(KEYS.idle, {moving: 5})
    r.zadd(KEYS.expiring, {moving: 5})
    r.hset(KEYS.meta(moving), "ver", "3")

    d.sweeps.fire_deadlines()
    d.sweeps.find_lost_work()
    d.sweeps._post_unclaimed([(b"job-u", rec, orjson.loads(rec))], KEYS.inflight_order("llm"))
    d.sweeps.close_idle_sessions()
    assert d.sweeps.expire([(moving, "3", None)]) == 0

    # (the streams exist: the lease made their consumer groups)
    assert r.xlen(results) == 0 and r.xlen(inputs) == 0
    assert r.zcard(KEYS.deadlines) == 1 and r.zscore(KEYS.idle, moving) == 5
    assert r.hexists(KEYS.running, "job-r") and r.hlen(KEYS.inflight) == 2
    assert r.zscore(KEYS.expiring, moving) == 5 and r.hget(KEYS.meta(moving), "ver") == b"3"


def test_sweep_scripts_act_for_a_partition_their_shard_serves(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    """The same calls on a served partition do write (the check is on the route, not a refusal)."""
    write_placement(r, KEYS, 0, Placement.default(4, 2))
    d = make_dispatcher(partitions=4, shard=0)
    d.leases.maintain()
    served = session_in(2, 4, "k")
    results = KEYS.results_of(served, 4)
    r.zadd(KEYS.deadlines, {f"{served}\x1fi1": 1})
    r.zadd(KEYS.expiring, {served: 5})
    r.hset(KEYS.meta(served), "ver", "3")
    d.sweeps.fire_deadlines()
    assert r.xlen(results) == 1 and r.zcard(KEYS.deadlines) == 0
    assert d.sweeps.expire([(served, "3", None)]) == 1 and not r.exists(KEYS.meta(served))
