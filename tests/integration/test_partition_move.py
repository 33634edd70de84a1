"""Moving a partition between two real redis-servers (parley/fleet/moves.py), without dispatchers
running during the move: the state is made by a real dispatcher driven by hand on shard 0, then
moved; what the target holds is compared with what the source held, and a dispatcher on the
target carries on. Also `repair` after a mover stopped at each step, and the refusals."""

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner

from parley.cli import cli
from parley.client.shards import Shards, read_view, write_placement
from parley.dispatcher.consume import Dispatcher
from parley.fleet.moves import MoveError, Mover
from parley.runtime.procs import RedisServer
from parley.schemas.jobs import job_id
from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import listing_member
from parley.schemas.moves import MoveStep, copied_field, plan_move
from parley.schemas.producers import new_producer
from parley.schemas.results import WorkOutcome
from parley.schemas.shards import Placement, PlacementError
from tests.integration.conftest import taker_signed, tick
from tests.integration.sessions import APP, core_of

K = Keys()
N = 4
P = 1


def named_in(partition: int, count: int, stem: str) -> list[str]:
    out = [f"{stem}{i}" for i in range(200) if partition_of(f"{stem}{i}", N) == partition]
    return out[:count]


A, B = named_in(P, 2, "moved-")  # A parked on an interrupt, B with a model call queued
C = named_in(0, 1, "stays-")[0]  # another partition's session, parked too


@pytest.fixture
def second(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-1").start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def r1(second: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(second.url)
    yield client
    client.close()


def dispatcher(r: redis.Redis) -> Dispatcher:
    r.hset(K.config, "partitions", N)
    d = Dispatcher(r, K, APP, block_ms=5)
    d.leases.partitions = N
    return d


def send(r: redis.Redis, session: str, value: dict[str, Any]) -> None:
    r.xadd(K.inputs_of(session, N), {"session": session, "input": orjson.dumps(value)})


def post(r: redis.Redis, **fields: Any) -> None:
    """An outcome posted as a worker posts it: its job off the queue and out of the records."""
    job = job_id(fields["session"], fields["work"], fields["attempt"])
    r.lrem(f"rq:queue:{fields['kind']}", 0, job)
    r.hdel(K.inflight, job)
    r.xadd(K.results_of(fields["session"], N), taker_signed(r, WorkOutcome(**fields)))


def llm_work(r: redis.Redis, session: str) -> str:
    [call] = [w.id for w in core_of(r, session).work.values() if w.kind == "llm"]
    return call


def park(r: redis.Redis, d: Dispatcher, session: str) -> None:
    """A session whose model asked for a tool, and whose decide raised an interrupt on it (with a
    deadline: the index, its listing sets, the deadlines and the parked gauge all hold it)."""
    send(r, session, {"type": "session.create", "metadata": {"team": "red"}})
    send(r, session, {"type": "message.create", "content": "Email bob"})
    tick(d)
    post(r, session=session, work=llm_work(r, session), attempt=1, kind="llm", ok=True,
         value={"content": "", "tool_calls": [{"id": "m-1", "name": "send_email", "arguments": {}}]})
    tick(d)
    deciding = core_of(r, session).deciding
    assert deciding is not None
    post(r, session=session, work=deciding.work, attempt=deciding.attempt, kind="decide", ok=True,
         value={"actions": [{"type": "interrupt", "reason": "confirm", "payload": {},
                             "timeout_s": 3600, "default": {"approved": False}}]})
    tick(d)
    assert core_of(r, session).interrupts


def build(r0: redis.Redis, r1: redis.Redis) -> Dispatcher:
    """A, C parked and B's model call queued, on shard 0, which holds every partition; then the
    dispatcher gives its leases back (as a shard's dispatchers do when their partition freezes)."""
    d = dispatcher(r0)
    park(r0, d, A)
    park(r0, d, C)
    send(r0, B, {"type": "session.create"})
    send(r0, B, {"type": "message.create", "content": "hello"})
    tick(d)
    placement = Placement.all_on_first(N, 2)
    write_placement(r1, K, 1, placement)
    write_placement(r0, K, 0, placement)
    d.leases.release_all()
    return d


def shards(*clients: redis.Redis) -> Shards:
    s = Shards(list(clients), K)
    s.check()
    return s


def contents(r: redis.Redis, keys: list[str]) -> dict[str, Any]:
    """Each key's type and value, and whether it expires (DUMP's bytes may order a hash otherwise)."""
    read = {"hash": r.hgetall, "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
            "stream": r.xrange, "string": r.get, "list": lambda k: r.lrange(k, 0, -1), "none": r.exists}
    return {k: (kind, read[kind](k), int(r.pttl(k)) > 0)  # type: ignore[operator]
            for k in keys for kind in [r.type(k).decode()]}  # type: ignore[union-attr]


def members(r: redis.Redis, session: str) -> set[str]:
    """Every shard-wide set or hash naming the session."""
    found = set()
    for key in r.scan_iter(count=1000):
        name = key.decode()
        kind = r.type(name).decode()
        if kind == "zset":
            items = [m.decode() for m in r.zrange(name, 0, -1)]
        elif kind == "hash" and "{" not in name:
            items = [f.decode() for f in r.hkeys(name)]
        else:
            continue
        if any(session in item.split("\x1f") for item in items):
            found.add(name)
    return found


def stat(r: redis.Redis, field: str) -> int:
    return int(r.hget(K.stats, field) or 0)


def test_a_move_copies_every_key_and_member_of_the_partition_and_cleans_the_source(
        r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    own = [k for s in (A, B) for k in K.session_keys(s) if r.exists(k)]
    before = contents(r, own)
    a_members, c_members = members(r, A), members(r, C)
    assert {K.interrupt_index, K.deadlines, K.interrupts_by_time, K.sessions_of_status("parked"),
            K.sessions_of_metadata("team", "red"), K.interrupt_anchors} <= a_members
    [b_job] = [j.decode() for j, rec in r.hgetall(K.inflight).items() if orjson.loads(rec)["session"] == B]
    assert r.exists(K.job_token(b_job))
    assert stat(r, "parked") == 2
    inputs_group = r.xinfo_groups(K.inputs(P, N))

    steps: list[MoveStep] = []
    report = Mover(shards(r, r1), lambda step, _text: steps.append(step)).move(P, 1, drain_timeout_s=0.3)

    assert steps == list(MoveStep)
    assert (report.sessions, report.drained_lost) == (2, 1)
    # every key of the partition's sessions, byte for byte; none left on the source
    assert contents(r1, own) == before
    assert not any(r.exists(k) for k in own)
    # the members, on the target only; the other partition's session untouched
    assert members(r1, A) == a_members and not members(r, A)
    assert members(r, C) == c_members and not members(r1, C)
    assert r1.zscore(K.sessions_of_status("parked"), listing_member(core_of(r1, A).created_at, A)) == 0
    # the parked gauge follows its anchors
    assert (stat(r, "parked"), stat(r1, "parked")) == (1, 1)
    # the streams travel with their group (its last delivered id and pending entries)
    assert r1.xinfo_groups(K.inputs(P, N)) == inputs_group and not r.exists(K.inputs(P, N))
    # B's queued model call, still there at the drain's timeout: off the source's queue, and lost
    assert b_job.encode() not in r.lrange("rq:queue:llm", 0, -1) and not r.hexists(K.inflight, b_job)
    assert not r.exists(K.job_token(b_job))  # and its token, which no take will read now
    [lost] = [orjson.loads(f[b"outcome"]) for _i, f in r1.xrange(K.results(P, N))
              if orjson.loads(f[b"outcome"]).get("lost")]
    assert (lost["session"], lost["error"]) == (B, "worker_lost")
    # the table flipped everywhere; the mover's lease and mark are gone
    for i, client in enumerate((r, r1)):
        placement = read_view(client, K, i).placement
        assert placement is not None and placement.serves(1, P) and not placement.moving
        assert client.hget(K.config, f"route:{P}") == b"1"
    assert not r.exists(K.lease(P)) and not r1.hexists(K.config, copied_field(P))

    # the target's dispatcher carries on: B's lost call retried, A's interrupt resumed
    d1 = dispatcher(r1)
    tick(d1)
    assert core_of(r1, B).work[llm_work(r1, B)].attempt == 2
    [interrupt] = core_of(r1, A).interrupts
    send(r1, A, {"type": "interrupt.resume", "interrupt_id": interrupt, "payload": {"approved": True}})
    tick(d1)
    assert not core_of(r1, A).interrupts and not r1.exists(K.interrupt_index)
    assert stat(r1, "parked") == 0


def test_the_drain_waits_for_jobs_that_finish(r: redis.Redis, r1: redis.Redis) -> None:
    """B's model call answered while the move drains: no loss is posted, its outcome travels."""
    build(r, r1)
    [raw] = [rec for j, rec in r.hgetall(K.inflight).items() if orjson.loads(rec)["session"] == B]
    seen: list[MoveStep] = []

    def say(step: MoveStep, _text: str) -> None:
        seen.append(step)
        if step is MoveStep.FENCE:  # a worker answers, as it does, while the mover waits
            rec = orjson.loads(raw)
            post(r, session=B, work=rec["work"], attempt=rec["attempt"], kind="llm", ok=True,
                 value={"content": "hi"})

    report = Mover(shards(r, r1), say).move(P, 1, drain_timeout_s=30)
    assert report.drained_lost == 0
    outcomes = [orjson.loads(f[b"outcome"]) for _i, f in r1.xrange(K.results(P, N))]
    assert [o["session"] for o in outcomes if o.get("value") == {"content": "hi"}] == [B]
    assert not any(o.get("lost") for o in outcomes)


def test_a_move_waits_for_the_lease_and_is_undone_when_it_is_not_given_back(
        r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    r.set(K.lease(P), "old-dispatcher:1", px=60_000)  # a dispatcher that does not know shards
    with pytest.raises(MoveError, match="still holds partition 1's lease"):
        Mover(shards(r, r1)).move(P, 1, fence_timeout_s=0.3)
    placement = shards(r, r1).check()
    assert placement is not None and placement.serves(0, P) and placement.version == 3
    assert r.exists(K.meta(A)) and not r1.exists(K.meta(A))


def test_a_move_on_one_redis_or_to_where_it_is_is_refused(r: redis.Redis, r1: redis.Redis) -> None:
    with pytest.raises(MoveError, match="one Redis"):
        Mover(Shards([r], K))
    build(r, r1)
    with pytest.raises(PlacementError, match="already on shard 0"):
        Mover(shards(r, r1)).move(P, 0)


def stopped_after(r: redis.Redis, r1: redis.Redis, last: MoveStep) -> Mover:
    """A mover that did the steps up to `last` and died."""
    mover = Mover(shards(r, r1))
    placement = mover.shards.placement
    assert placement is not None
    plan = plan_move(placement, P, 1)
    mover.write_everywhere(plan, plan.frozen)
    token = mover.fence(plan, 1)
    mover.drain(plan, 0.1)
    if last in (MoveStep.COPY, MoveStep.FLIP):
        mover.copy(plan)
    if last is MoveStep.FLIP:
        mover.write_everywhere(plan, plan.flipped)
    assert r.get(K.lease(P)) == token.encode()
    return Mover(shards(r, r1))


@pytest.mark.parametrize("last", [MoveStep.DRAIN, MoveStep.COPY, MoveStep.FLIP])
def test_repair_finishes_a_copied_move_and_undoes_any_other(r: redis.Redis, r1: redis.Redis,
                                                            last: MoveStep) -> None:
    build(r, r1)
    mover = stopped_after(r, r1, last)
    if last is MoveStep.DRAIN:  # a partial copy on the target, without the mark
        r1.restore(K.meta(A), 0, r.dump(K.meta(A)))  # type: ignore[arg-type]
    [step] = mover.repair()
    finished = last is not MoveStep.DRAIN
    assert step.action == {MoveStep.DRAIN: "unfreeze", MoveStep.COPY: "flip", MoveStep.FLIP: "clean"}[last]
    placement = shards(r, r1).check()
    assert placement is not None and not placement.moving
    home, away = (r1, r) if finished else (r, r1)
    assert placement.serves(1 if finished else 0, P)
    assert home.exists(K.meta(A)) and home.exists(K.inputs(P, N)) and K.interrupt_index in members(home, A)
    assert not away.exists(K.meta(A)) and not away.exists(K.inputs(P, N)) and not members(away, A)
    assert (stat(home, "parked"), stat(away, "parked")) == ((1, 1) if finished else (2, 0))
    assert not r.exists(K.lease(P)) and not r1.hexists(K.config, copied_field(P))
    assert mover.repair() == []


@pytest.mark.parametrize("indexed_target", [True, False])
def test_a_copy_stopped_half_way_is_undone_whole_by_repair(r: redis.Redis, r1: redis.Redis,
                                                           indexed_target: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The mover dies after restoring P's keys on the target, before its members and mark: the
    repair undoes it (unfreeze, clean the target) and leaves nothing of P there, whether the
    target reads P's list (written before the keys) or is scanned."""
    from parley.fleet.copying import Copier
    from parley.schemas.moves import INDEXED_FIELD

    build(r, r1)
    if indexed_target:
        r1.hset(K.config, INDEXED_FIELD, "1")
    mover = Mover(shards(r, r1))
    placement = mover.shards.placement
    assert placement is not None
    plan = plan_move(placement, P, 1)
    mover.write_everywhere(plan, plan.frozen)
    mover.fence(plan, 1)
    mover.drain(plan, 0.1)

    def died(*_args: Any) -> None:
        raise KeyboardInterrupt  # the mover's process ends here

    monkeypatch.setattr(Copier, "add_members", died)
    with pytest.raises(KeyboardInterrupt):
        mover.copy(plan)
    assert r1.exists(K.meta(A))  # a partial copy: keys restored, no members, no mark
    monkeypatch.undo()
    [step] = Mover(shards(r, r1)).repair()
    assert step.action == "unfreeze"
    assert not any(r1.exists(k) for s in (A, B) for k in K.session_keys(s))
    assert not r1.exists(K.partition_sessions(P)) and not members(r1, A)
    assert r.exists(K.meta(A)) and members(r, A)  # the source serves it again, whole


def test_repair_writes_a_table_written_on_some_shards_only_everywhere(
        r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    placement = shards(r, r1).check()
    assert placement is not None
    write_placement(r1, K, 1, placement.freeze(P, 1))  # the mover died after its first write
    [step] = Mover(Shards([r, r1], K)).repair()
    assert step.action == "unfreeze"
    after = shards(r, r1).check()
    assert after is not None and after.serves(0, P) and after.version == placement.version + 2


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_the_cli_lists_moves_and_repairs(r: redis.Redis, r1: redis.Redis, redis_server: RedisServer,
                                         second: RedisServer) -> None:
    urls = ["--redis-url", redis_server.url, "--redis-url", second.url]
    out = run("--redis-url", redis_server.url, "partitions", "list")
    assert out.exit_code == 0 and "one Redis" in out.output
    build(r, r1)
    out = run(*urls, "partitions", "list")
    assert out.exit_code == 0, out.output
    assert "placement version 1: 4 partitions over 2 shards" in out.output
    assert "   1  shard 0  served" in out.output
    out = run(*urls, "partitions", "move", "1", "--to", "1", "--drain-timeout", "0.2")
    assert out.exit_code == 0, out.output
    assert "partition 1 moved from shard 0 to shard 1" in out.output and "clean:" in out.output
    # the freeze is timed and reported, at the flip and in the summary
    flip = r"flip: partition 1 is on shard 1 \(table version \d+; frozen \d+\.\d{3} s\)"
    assert re.search(flip, out.output), out.output
    assert re.search(r"moved from shard 0 to shard 1 \(\d+ sessions, \d+ keys, \d+ members; frozen "
                     r"\d+\.\d{3} s\)", out.output), out.output
    assert "   1  shard 1  served" in run(*urls, "partitions", "list").output
    out = run(*urls, "partitions", "move", "1", "--to", "5")
    assert out.exit_code == 1 and "there is no shard 5" in out.output
    assert "nothing to repair" in run(*urls, "partitions", "repair").output
    out = run(*urls[:2], "partitions", "repair")
    assert out.exit_code == 1 and "one Redis" in out.output


def test_shards_share_the_engine_key_and_a_move_between_different_keys_is_refused(
        r: redis.Redis, r1: redis.Redis) -> None:
    from parley.dispatcher.engine_key import share_engine_key

    assert share_engine_key([r, r1], K, 1) is True  # made on shard 0, copied to shard 1
    assert r.get(K.engine_key) is not None and r1.get(K.engine_key) == r.get(K.engine_key)
    r1.set(K.engine_key, "another")  # a shard that made its own before it joined
    assert share_engine_key([r, r1], K, 1) is False and r1.get(K.engine_key) == b"another"
    build(r, r1)
    before = read_view(r, K, 0).placement
    with pytest.raises(MoveError, match="different engine keys"):
        Mover(shards(r, r1)).move(P, 1)
    # refused before the freeze: nothing changed on either shard
    assert read_view(r, K, 0).placement == before == read_view(r1, K, 1).placement


# ---- one mover at a time; the table written by compare-and-set -----------------------------


def test_a_move_or_repair_while_another_holds_the_move_lock_is_refused(
        r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    r.set(K.partitions_lock, "other-host:4242:ab12", px=60_000)  # another mover, running
    before = shards(r, r1).check()
    for attempt in (lambda m: m.move(P, 1, drain_timeout_s=0.1, fence_timeout_s=0.5), lambda m: m.repair()):
        with pytest.raises(MoveError, match=r"other-host:4242:ab12") as refused:
            attempt(Mover(Shards([r, r1], K)))
        assert K.partitions_lock in str(refused.value)  # how to clear a stale one
    assert shards(r, r1).check() == before
    assert r.get(K.partitions_lock) == b"other-host:4242:ab12"  # not taken, not released


def test_a_move_releases_its_lock_whether_it_succeeds_or_fails(r: redis.Redis, r1: redis.Redis) -> None:
    d = build(r, r1)
    mover = Mover(Shards([r, r1], K))
    with pytest.raises(PlacementError):
        mover.move(P, 0)  # already there: refused before anything is written
    assert not r.exists(K.partitions_lock)
    mover.move(P, 1, drain_timeout_s=0.1)
    assert not r.exists(K.partitions_lock)
    del d


def test_a_table_changed_since_the_mover_read_it_is_not_overwritten(r: redis.Redis, r1: redis.Redis) -> None:
    """Two writers of version v+1 (a lock broken by hand, say): the second is refused on every
    shard, so no shard loses the other's change (last write wins would drop a freeze)."""
    build(r, r1)
    placement = shards(r, r1).check()
    assert placement is not None
    mover = Mover(Shards([r, r1], K))
    plan = plan_move(placement, P, 1)
    other = placement.freeze(2, 1)  # another move's freeze, written first
    write_placement(r1, K, 1, other)
    write_placement(r, K, 0, other)
    with pytest.raises(MoveError, match="another move or repair"):
        mover.write_everywhere(plan, plan.frozen)
    assert shards(r, r1).check() == other


def test_a_key_that_expires_while_it_is_copied_is_not_copied_without_its_ttl(
        r: redis.Redis, r1: redis.Redis) -> None:
    """DUMP and PTTL read apart: a key expiring between them came back persistent (RESTORE 0)."""
    build(r, r1)
    key = K.meta(A)
    r.pexpire(key, 60_000)
    real_dump = r.dump

    def dump_then_expire(name: Any) -> Any:  # the key's TTL runs out right after its DUMP
        out = real_dump(name)
        if name == key:
            r.delete(name)
        return out

    r.dump = dump_then_expire  # type: ignore[method-assign]
    Mover(Shards([r, r1], K)).move(P, 1, drain_timeout_s=0.1)
    assert r1.pttl(key) != -1  # copied with its TTL, or not at all: never persistent


def test_an_error_mid_move_says_the_partition_is_left_frozen_and_how_to_repair(
        r: redis.Redis, r1: redis.Redis, redis_server: RedisServer, second: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    build(r, r1)

    def broken(*_a: Any) -> Any:
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(Mover, "copy", broken)
    out = run("--redis-url", redis_server.url, "--redis-url", second.url,
              "partitions", "move", str(P), "--to", "1", "--drain-timeout", "0.1")
    assert out.exit_code == 1
    assert re.search(rf"partition {P} is left frozen \(moving to 1, frozen for [\d.]+ s so far\): "
                     r"run `parley partitions repair`", out.output), out.output
    assert "Connection closed by server." in out.output
    assert not r.exists(K.partitions_lock)
    monkeypatch.undo()
    assert run("--redis-url", redis_server.url, "--redis-url", second.url,
               "partitions", "repair").exit_code == 0
    after = shards(r, r1).check()
    assert after is not None and after.serves(0, P)


def test_ctrl_c_mid_move_says_the_partition_is_left_frozen(r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)

    def interrupted(step: MoveStep, _text: str) -> None:
        if step is MoveStep.FENCE:
            raise KeyboardInterrupt

    with pytest.raises(MoveError, match=rf"partition {P} is left frozen "
                                        r"\(moving to 1, frozen for [\d.]+ s so far\): run "
                                        r"`parley partitions repair`"):
        Mover(Shards([r, r1], K), interrupted).move(P, 1, drain_timeout_s=0.1)
    assert not r.exists(K.partitions_lock)


def test_a_mover_whose_lock_renewal_failed_writes_no_more_tables(r: redis.Redis, r1: redis.Redis) -> None:
    from parley.fleet.move_lock import MoveLock

    build(r, r1)
    placement = shards(r, r1).check()
    assert placement is not None
    lock = MoveLock(r, K.partitions_lock, renew_every_s=0.01)
    mover = Mover(Shards([r, r1], K))
    with lock:
        mover.lock = lock
        r.set(K.partitions_lock, "someone-else")  # our lock expired and another took it
        while not lock.lost:
            time.sleep(0.01)
        plan = plan_move(placement, P, 1)
        with pytest.raises(MoveError, match="move lock"):
            mover.write_everywhere(plan, plan.frozen)
    assert shards(r, r1).check() == placement
    assert r.get(K.partitions_lock) == b"someone-else"  # not ours: left alone


# ---- producers and the session list over every shard ----------------------------------------


def test_producers_are_added_listed_and_removed_on_every_shard(
        r: redis.Redis, r1: redis.Redis, redis_server: RedisServer, second: RedisServer) -> None:
    urls = ["--redis-url", redis_server.url, "--redis-url", second.url]
    out = run(*urls, "producers", "add", "web", "--tenant", "acme")
    assert out.exit_code == 0, out.output
    assert r.hexists(K.producers, "web") and r1.hexists(K.producers, "web")
    r1.hdel(K.producers, "web")
    r1.hset(K.producers, "batch", new_producer("batch", None).to_json())
    out = CliRunner().invoke(cli, [*urls, "producers", "list"], catch_exceptions=False)
    assert out.exit_code == 0
    assert "web\ttenant=acme" in out.stdout and "batch\ttenant=*" in out.stdout
    assert "producer web is registered on shard(s) 0 only" in out.stderr
    assert "producer batch is registered on shard(s) 1 only" in out.stderr
    assert run(*urls, "producers", "remove", "batch").exit_code == 0
    assert not r1.hexists(K.producers, "batch")
    assert "no producer batch" in run(*urls, "producers", "remove", "batch").output


def test_a_move_copies_the_registration_of_a_producer_whose_streams_it_moves(
        r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    r.hset(K.producers, "web", new_producer("web", None).to_json())
    r.xadd(K.producer_inputs("web", P, N), {"session": A, "input": b"{}"})
    Mover(Shards([r, r1], K)).move(P, 1, drain_timeout_s=0.1)
    assert r1.hget(K.producers, "web") == r.hget(K.producers, "web")
    assert r1.xlen(K.producer_inputs("web", P, N)) == 1


def test_sessions_rebuild_lists_the_sessions_of_every_shard(
        r: redis.Redis, r1: redis.Redis, redis_server: RedisServer, second: RedisServer) -> None:
    build(r, r1)
    Mover(Shards([r, r1], K)).move(P, 1, drain_timeout_s=0.1)  # A and B on shard 1, C on 0
    lists = [K.sessions_of_status(s) for s in ("active", "parked", "closed")]
    r.delete(*lists)
    r1.delete(*lists)
    out = run("--redis-url", redis_server.url, "--redis-url", second.url, "sessions", "--rebuild")
    assert out.exit_code == 0, out.output
    assert "listed 3 of 3 sessions" in out.output
    assert sum(int(r1.zcard(k)) for k in lists) == 2 and sum(int(r.zcard(k)) for k in lists) == 1


# ---- several moves at once (rebalance) --------------------------------------------------------


def test_moves_at_once_each_flip_over_the_table_as_it_is_then(r: redis.Redis, r1: redis.Redis) -> None:
    """Two moves at once: each freeze and flip is made from the table as it is when it is
    written, so both land, and every shard ends holding the same table (version 1 + 4)."""
    build(r, r1)
    results = Mover(shards(r, r1)).move_many([(P, 1), (2, 1)], parallel=2, drain_timeout_s=0.3)
    assert all(not isinstance(x, Exception) for x in results), results
    views = [read_view(c, K, i).placement for i, c in enumerate((r, r1))]
    assert views[0] == views[1] and views[0] is not None
    assert views[0].version == 5 and views[0].serves(1, P) and views[0].serves(1, 2) and not views[0].moving
    assert r1.exists(K.meta(A)) and not r.exists(K.meta(A))


def test_after_a_move_fails_no_other_starts(r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    r.set(K.lease(P), "old-dispatcher:1", px=60_000)  # the first move's fence times out
    results = Mover(shards(r, r1)).move_many([(P, 1), (2, 1), (3, 1)], parallel=1, fence_timeout_s=0.3)
    assert [type(x) for x in results] == [MoveError] * 3
    assert "still holds partition 1's lease" in str(results[0])
    assert all("not started" in str(x) for x in results[1:])
    placement = shards(r, r1).check()
    assert placement is not None and not placement.moving
    assert placement.partitions_of(1) == []  # nothing moved, the failed one unfrozen


def test_moves_at_once_are_checked_before_any_starts(r: redis.Redis, r1: redis.Redis) -> None:
    build(r, r1)
    mover = Mover(shards(r, r1))
    with pytest.raises(MoveError, match="named twice"):
        mover.move_many([(P, 1), (P, 1)])
    with pytest.raises(MoveError, match="already on shard 0: no move was started"):
        mover.move_many([(2, 1), (3, 0)])
    with pytest.raises(MoveError, match="at least 1"):
        mover.move_many([(2, 1)], parallel=0)
    placement = shards(r, r1).check()
    assert placement is not None and placement.version == 1 and not placement.moving


def test_a_table_write_stopped_half_way_stops_every_later_one(r: redis.Redis, r1: redis.Redis,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards holding two versions: a later change over either would leave two different tables
    of one version, so none is written; the moves say to repair, and repair mends it."""
    build(r, r1)
    mover = Mover(shards(r, r1))
    write = mover.tables.write
    calls = {"n": 0}

    def failing_second_write(shard: int, placement: Placement, expected: int | None,
                             written: int = 0) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the first move's freeze: written on the target, not the source
            raise redis.ConnectionError("shard 0 went away")
        write(shard, placement, expected, written)

    monkeypatch.setattr(mover.tables, "write", failing_second_write)
    results = mover.move_many([(P, 1), (2, 1)], parallel=1)
    assert "left frozen" in str(results[0]) and "repair" in str(results[0])
    assert "not started" in str(results[1])
    mover2 = Mover(Shards([r, r1], K))
    steps = mover2.repair()
    assert [s.partition for s in steps] == [P]
    placement = shards(r, r1).check()
    assert placement is not None and not placement.moving and placement.serves(0, P)


def test_the_half_written_guard_refuses_a_change_from_another_move(r: redis.Redis, r1: redis.Redis,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    build(r, r1)
    mover = Mover(shards(r, r1))
    mover._half_written = True  # as after a write that stopped half way
    results = mover.move_many([(2, 1)])
    assert isinstance(results[0], MoveError) and "stopped half way" in str(results[0])
    placement = shards(r, r1).check()
    assert placement is not None and placement.version == 1  # nothing was written


# ---- adding shards ------------------------------------------------------------------------------


def test_add_shards_writes_the_grown_table_and_refuses_what_it_cannot(r: redis.Redis, r1: redis.Redis,
                                                                      tmp_path: Path) -> None:
    from parley.fleet.adding import add_shards

    third = RedisServer(tmp_path / "redis-2").start()
    try:
        r2 = redis.Redis.from_url(third.url)
        build(r, r1)
        with pytest.raises(MoveError, match="as many URLs were given"):
            add_shards(Mover(Shards([r, r1], K)))
        r2.set("parley:leftover", "1")
        with pytest.raises(MoveError, match="shard 2 is not empty"):
            add_shards(Mover(Shards([r, r1, r2], K)))
        assert r2.hget(K.config, "placement") is None and r.hget(K.config, "placement") is not None
        r2.delete("parley:leftover")
        added = add_shards(Mover(Shards([r, r1, r2], K)))
        assert (added.before, added.after, added.version) == (2, 3, 2)
        tables = [read_view(c, K, i) for i, c in enumerate((r, r1, r2))]
        assert all(v.placement == tables[0].placement for v in tables)
        assert tables[2].shard == 2 and r2.hget(K.config, "partition_sessions") == b"1"
        assert tables[0].placement is not None and tables[0].placement.partitions_of(2) == []
        # a run stopped half way (the old shards not written yet) is finished by running it again
        grown = tables[0].placement
        r3s = RedisServer(tmp_path / "redis-3").start()
        try:
            r3 = redis.Redis.from_url(r3s.url)
            more = grown.grow(1)
            write_placement(r3, K, 3, more)
            again = add_shards(Mover(Shards([r, r1, r2, r3], K)))
            assert (again.before, again.after, again.version) == (3, 4, more.version)
            assert all(read_view(c, K, i).placement == more for i, c in enumerate((r, r1, r2, r3)))
            r3.close()
        finally:
            r3s.stop(kill=True)
        r2.close()
    finally:
        third.stop(kill=True)


def test_the_move_lock_is_held_on_a_majority_and_a_shard_down_does_not_stop_it(
        r: redis.Redis, r1: redis.Redis) -> None:
    from parley.fleet.move_lock import LockHeld, MoveLock
    from parley.runtime.procs import free_port

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry_on_error=[], retry=None)
    with MoveLock([r, r1, down], K.partitions_lock) as lock:
        assert r.get(K.partitions_lock) == lock.token.encode() == r1.get(K.partitions_lock)
        with pytest.raises(LockHeld, match="holds parley:partitions:lock"):
            MoveLock([r, r1, down], K.partitions_lock).__enter__()
    assert not r.exists(K.partitions_lock) and not r1.exists(K.partitions_lock)
    # one of three answering is not a majority: refused, and what it took given back
    with pytest.raises(LockHeld, match="needs a majority of the shards, 2 of 3"):
        MoveLock([r, down, down], K.partitions_lock).__enter__()
    assert not r.exists(K.partitions_lock)
    # another holds it on one of the two that answer: refused, naming it, and ours given back
    r1.set(K.partitions_lock, "someone:1")
    with pytest.raises(LockHeld, match="someone:1"):
        MoveLock([r, r1, down], K.partitions_lock).__enter__()
    assert r1.get(K.partitions_lock) == b"someone:1" and not r.exists(K.partitions_lock)


def test_the_drain_reads_the_shards_job_records_whole_once_then_only_the_partitions(
        r: redis.Redis) -> None:
    """Issue 35: the drain's polls cost P's jobs, not the shard's. With 2,000 jobs of other
    partitions in flight and P's job finishing after a few polls, both hashes are read whole
    once (one MULTI), then only P's job is looked up (HMGET)."""
    from parley.fleet.draining import drain

    others = {f"job-{i}": orjson.dumps({"session": C, "kind": "llm", "work": f"w{i}", "attempt": 1})
              for i in range(2000)}
    r.hset(K.inflight, mapping=others)
    r.hset(K.running, "job-of-a", orjson.dumps({"session": A, "kind": "llm", "work": "w", "attempt": 1}))
    pipe_calls: list[str] = []
    real_pipeline = r.pipeline

    def pipeline(transaction: bool = True) -> Any:
        p = real_pipeline(transaction=transaction)
        real_exec = p.execute

        def execute(*a: Any, **k: Any) -> Any:
            pipe_calls.extend(str(c[0][0]).upper() for c in p.command_stack)
            if pipe_calls.count("HMGET") >= 6:  # a few polls on: its outcome posted, it leaves
                r.hdel(K.running, "job-of-a")
            return real_exec(*a, **k)

        p.execute = execute  # type: ignore[method-assign]
        return p

    r.pipeline = pipeline  # type: ignore[method-assign]
    assert drain(r, K, P, N, timeout_s=10, poll_s=0.01) == 0
    assert pipe_calls.count("HGETALL") == 2  # one MULTI reading both hashes, once
    assert pipe_calls.count("HMGET") >= 6 and set(pipe_calls) <= {"HGETALL", "HMGET"}
    assert r.hlen(K.inflight) == 2000  # the other partitions' jobs untouched


def test_add_shards_takes_the_lock_on_the_old_shards_and_finishes_a_stopped_run(
        r: redis.Redis, r1: redis.Redis, tmp_path: Path) -> None:
    """Review of issue 35: the new, empty shards must not make the lock's majority (two old, two
    new: another mover holding it on the old shards would run at once); and a run stopped half way
    (the old shards written, a new one holding only its `indexed` mark) is finished by the next."""
    from parley.fleet.adding import add_shards

    extra = [RedisServer(tmp_path / f"redis-new-{i}").start() for i in range(2)]  # N = 4: 4 shards at most
    try:
        new = [redis.Redis.from_url(s.url) for s in extra]
        build(r, r1)
        # another mover holds it on one of the two old shards: over all four, shard 0 and the
        # two new ones would make a majority (3); over the old ones, one of two is not
        r1.set(K.partitions_lock, "another:1")
        with pytest.raises(MoveError, match="another:1"):
            add_shards(Mover(Shards([r, r1, *new], K)))
        assert all(c.hget(K.config, "placement") is None for c in new)
        assert not r.exists(K.partitions_lock)  # what it took, given back
        r1.delete(K.partitions_lock)
        # stopped half way: the old shards hold the grown table, a new one only its mark
        placement = shards(r, r1).check()
        assert placement is not None
        grown = placement.grow(2)
        write_placement(r1, K, 1, grown)
        write_placement(r, K, 0, grown)
        new[0].hset(K.config, "partition_sessions", "1")
        done = add_shards(Mover(Shards([r, r1, *new], K)))
        assert done.after == 4 and done.version == grown.version
        assert all(read_view(c, K, i).placement == grown for i, c in enumerate([r, r1, *new]))
    finally:
        for s in extra:
            s.stop(kill=True)


def test_a_lock_kept_on_fewer_than_a_majority_for_too_long_is_lost(r: redis.Redis,
                                                                   second: RedisServer) -> None:
    """Review of issue 35: a mover cut off from most shards past the lock's expiry must stop
    writing tables (another may hold the lock on the majority by then)."""
    from parley.fleet.move_lock import MoveLock
    from parley.runtime.procs import free_port

    r1 = redis.Redis.from_url(second.url, socket_connect_timeout=0.2, retry=None)
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=None)
    with MoveLock([r, r1, down], K.partitions_lock, lock_ms=1000, renew_every_s=0.05) as lock:
        time.sleep(0.3)
        assert not lock.lost  # renewed on two of three
        second.stop(kill=True)  # now one of three answers
        deadline = time.monotonic() + 15
        while not lock.lost:
            assert time.monotonic() < deadline, "the lock was never marked lost"
            time.sleep(0.05)
