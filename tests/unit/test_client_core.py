"""The clients' core (parley/client/core.py), driven without Redis: the requests each operation's
steps make (which shard, which command), and what they do with the replies — the routing, a
send's moved-retry, the wait for a resume's outcome, the follow of a moved session. `Client` and
`AsyncClient` only carry these requests out."""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from redis.exceptions import ResponseError

from parley.client.core import Command, Core, Each, Op, Request, Round, Sleep
from parley.client.producer import SubmitRefused, SubmitUnavailable
from parley.schemas.keys import Keys, partition_of
from parley.schemas.resumes import ResumeStatus
from parley.schemas.shards import Placement, PlacementError

KEYS = Keys("parley")
MESSAGE = {"type": "message.create", "content": "hi"}
N = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def clients(n: int, socket_timeout: float | None = 2.0) -> list[Any]:
    """Stand-ins for redis-py clients: the core only reads their socket timeout."""
    return [SimpleNamespace(connection=SimpleNamespace(socket_timeout=socket_timeout)) for _ in range(n)]


def run(op: Op[Any], answer: Callable[[Request], Any], asked: list[Request] | None = None) -> Any:
    """Drive `op` as a runner does, `answer` replying to each request; every request kept."""
    asked = asked if asked is not None else []
    try:
        request = next(op)
        while True:
            asked.append(request)
            if isinstance(request, Each):
                reply: Any = [run(o, answer, asked) for o in request.ops]
            else:
                reply = answer(request)
            request = op.send(reply)
    except StopIteration as done:
        return done.value


def names(asked: list[Request]) -> list[tuple[int, str]]:
    return [(r.shard, r.call.name) for r in asked if isinstance(r, Command)]


def on_shard(placement: Placement, shard: int) -> str:
    return next(s for s in (f"s-{i}" for i in range(100)) if placement.shard_of_session(s) == shard)


class Shards:
    """Two shards' answers: the placement they hold (`table`), and an `fcall` / `xread` reply
    per shard; a Sleep advances the clock (and may run `on_sleep`)."""

    def __init__(self, table: Placement, clock: Clock):
        self.table, self.clock = table, clock
        self.fcall: Callable[[int], Any] = lambda shard: b"1-0"
        self.xread: Callable[[int], Any] = lambda shard: None
        self.on_sleep: Callable[[], None] = lambda: None

    def __call__(self, r: Request) -> Any:
        if isinstance(r, Sleep):
            self.clock.now += r.seconds
            self.on_sleep()
            return None
        if isinstance(r, Round):
            return [[None] if c.name == "hmget" else {} for c in r.calls]
        assert isinstance(r, Command)
        name = r.call.name
        if name == "hmget":
            return [self.table.to_json().encode(), str(r.shard).encode(), str(N).encode()]
        if name == "hget":
            return str(N).encode()
        if name == "xread":
            self.clock.now += r.call.kwargs["block"] / 1000
            return self.xread(r.shard)
        return self.fcall(r.shard)


# ---- one Redis --------------------------------------------------------------------------------------

def test_without_a_producer_a_send_is_an_xadd_to_the_partitions_stream_and_n_is_read_once() -> None:
    core = Core(KEYS, clients(1))
    asked: list[Request] = []
    replies = {"hget": b"4", "xadd": b"7-0"}

    def answer(r: Request) -> Any:
        assert isinstance(r, Command)
        return replies[r.call.name]

    assert run(core.send("s-1", MESSAGE), answer, asked) == "7-0"
    assert run(core.send("s-2", MESSAGE), answer, asked) == "7-0"
    assert names(asked) == [(0, "hget"), (0, "xadd"), (0, "xadd")]
    stream = asked[1].call.args[0]
    assert stream == KEYS.inputs_of("s-1", 4)


def test_an_unpublished_partition_count_is_one_and_asked_again_next_time() -> None:
    core = Core(KEYS, clients(1))
    asked: list[Request] = []
    assert run(core.partitions(), lambda r: None, asked) == 1
    assert run(core.partitions(), lambda r: b"3", asked) == 3
    assert run(core.partitions(), lambda r: pytest.fail("read once published"), asked) == 3
    assert len(asked) == 2


def test_a_refusal_is_submit_refused_and_another_error_is_raised_as_redis_gave_it() -> None:
    core = Core(KEYS, clients(1), producer="app")
    refused = ResponseError("PARLEY rate_limited 100 inputs of session s-1 are pending")
    with pytest.raises(SubmitRefused) as err:
        run(core.send("s-1", MESSAGE), lambda r: b"1" if r.call.name == "hget" else refused)
    assert err.value.code == "rate_limited"
    noperm = ResponseError("NOPERM this user has no permissions to run the 'fcall' command")
    with pytest.raises(ResponseError, match="NOPERM") as raised:
        run(core.send("s-1", MESSAGE), lambda r: noperm)
    assert raised.value is noperm


def test_the_submit_is_one_fcall_asking_for_the_error_reply_as_a_value() -> None:
    core = Core(KEYS, clients(1), producer="app")
    asked: list[Request] = []
    assert run(core.send("s-1", MESSAGE), lambda r: b"1" if r.call.name == "hget" else b"9-0",
               asked) == "9-0"
    fcall = asked[-1]
    assert isinstance(fcall, Command) and fcall.refusable and fcall.call.args[0] == "parley_submit"


def test_a_resume_waited_for_reads_after_the_last_id_before_the_send_within_the_socket_timeout() -> None:
    clock = Clock()
    core = Core(KEYS, clients(1, socket_timeout=2.0), producer="app", clock=clock)
    told = {"type": "input.ignored", "at": 2, "code": "already_resumed",
            "input": {"entry": "5-0", "type": "interrupt.resume"}}
    asked: list[Request] = []

    def answer(r: Request) -> Any:
        assert isinstance(r, Command)
        return {"xrevrange": [(b"3-0", {})], "hget": b"1", "fcall": b"5-0",
                "xread": [[b"k", [(b"6-0", {b"event": orjson.dumps(told)})]]]}[r.call.name]

    outcome = run(core.resume("s-1", "int-1", None, None, None, None, True, 10.0), answer, asked)
    assert outcome.status is ResumeStatus.IGNORED and outcome.entry == "5-0"
    assert names(asked) == [(0, "xrevrange"), (0, "hget"), (0, "fcall"), (0, "xread")]
    xread = asked[-1]
    assert isinstance(xread, Command)
    assert xread.call.args == ({KEYS.events("s-1"): "3-0"},)
    assert xread.call.kwargs["block"] == 1000  # 2 s socket timeout: half of it left over


def test_a_wait_without_an_outcome_times_out_after_its_time() -> None:
    clock = Clock()
    core = Core(KEYS, clients(1, socket_timeout=None), clock=clock)

    def answer(r: Request) -> Any:
        assert isinstance(r, Command)
        if r.call.name == "xread":
            clock.now += r.call.kwargs["block"] / 1000
        return {"xrevrange": [], "hget": None, "xadd": b"5-0", "xread": None}[r.call.name]

    outcome = run(core.close("s-1", None, None, None, None, True, 1.5), answer)
    assert outcome.status == "timeout" and clock.now == pytest.approx(101.5)


# ---- several shards ---------------------------------------------------------------------------------

def test_a_sharded_client_reads_the_placement_once_then_routes_by_it() -> None:
    clock = Clock()
    table = Placement.default(N, 2)
    shards = Shards(table, clock)
    core = Core(KEYS, clients(2), producer="app", clock=clock)
    asked: list[Request] = []
    for session in (on_shard(table, 1), on_shard(table, 0)):
        run(core.send(session, MESSAGE), shards, asked)
    assert names(asked) == [(0, "hmget"), (1, "hmget"), (1, "hget"), (1, "fcall"), (0, "hget"), (0, "fcall")]
    assert core.placed.placement == table


def test_a_sharded_client_without_a_producer_refuses_before_asking_anything() -> None:
    core = Core(KEYS, clients(2))
    with pytest.raises(ValueError, match="submit function"):
        run(core.send("s-1", MESSAGE), lambda r: pytest.fail("nothing is asked"))


def test_shards_without_a_placement_are_a_placement_error() -> None:
    core = Core(KEYS, clients(2))
    with pytest.raises(PlacementError, match="start a dispatcher"):
        run(core.shard_of("s-1"), lambda r: [None, None, None])


def test_a_send_refused_moved_sleeps_reads_the_placement_again_and_submits_to_the_new_shard() -> None:
    clock = Clock()
    before = Placement.default(N, 2)
    session = on_shard(before, 0)
    p = partition_of(session, N)
    shards = Shards(before, clock)
    shards.fcall = lambda shard: b"8-0" if shard == 1 else ResponseError(f"PARLEY moved partition {p}")

    def flip() -> None:
        shards.table = before.freeze(p, 1).flip(p)

    shards.on_sleep = flip
    core = Core(KEYS, clients(2), producer="app", clock=clock)
    asked: list[Request] = []
    assert run(core.send(session, MESSAGE), shards, asked) == "8-0"
    fcalls = [r.shard for r in asked if isinstance(r, Command) and r.call.name == "fcall"]
    assert fcalls == [0, 1]
    assert any(isinstance(r, Sleep) for r in asked)
    assert core.placed.placement == shards.table


def test_a_move_that_outlasts_the_bound_gives_up_with_submit_unavailable() -> None:
    clock = Clock()
    table = Placement.default(N, 2)
    shards = Shards(table, clock)
    shards.fcall = lambda shard: ResponseError("PARLEY moved partition is moving")
    core = Core(KEYS, clients(2), producer="app", moved_timeout_s=2.0, clock=clock)
    asked: list[Request] = []
    with pytest.raises(SubmitUnavailable, match="moved"):
        run(core.send(on_shard(table, 1), MESSAGE), shards, asked)
    assert clock.now == pytest.approx(102.0)
    sleeps = [r.seconds for r in asked if isinstance(r, Sleep)]
    assert len(sleeps) > 2 and all(s <= 1.0 for s in sleeps)


def test_a_follower_reads_the_placement_again_after_an_empty_read_and_goes_on_from_the_same_id() -> None:
    clock = Clock()
    before = Placement.default(N, 2)
    session = on_shard(before, 0)
    p = partition_of(session, N)
    shards = Shards(before.freeze(p, 1).flip(p), clock)  # moved since the client read `before`
    core = Core(KEYS, clients(2), clock=clock)
    core.placed.placement = before
    follow = run(core.follow(session, "4-0", 500, None), shards)
    asked: list[Request] = []
    assert run(follow.read(), shards, asked) is None and follow.shard == 1
    assert names(asked) == [(0, "xread"), (0, "hmget"), (1, "hmget")]
    event = {"type": "message.created", "n": 1}
    shards.xread = lambda shard: [[b"k", [(b"5-0", {b"event": orjson.dumps(event)})]]]
    asked.clear()
    assert list(follow.take(run(follow.read(), shards, asked))) == [("5-0", event)]
    assert names(asked) == [(1, "xread")] and follow.last == "5-0"
    assert asked[0].call.args == ({KEYS.events(session): "4-0"},)
    assert follow.going()


def test_an_idle_follower_reads_the_placement_at_most_every_second() -> None:
    clock = Clock()
    table = Placement.default(N, 2)
    core = Core(KEYS, clients(2), clock=clock)
    core.placed.placement = table
    follow = run(core.follow(on_shard(table, 0), "0-0", 250, clock.now + 2.5), Shards(table, clock))
    asked: list[Request] = []
    while follow.going():
        run(follow.read(), Shards(table, clock), asked)
    reads = [r for r in asked if isinstance(r, Command) and r.call.name == "xread"]
    # empty reads end at 100.25, 100.5, ... 102.5 s: the placement read after those at 100.25, 101.25, 102.25
    placement_reads = [r for r in asked if isinstance(r, Command) and r.call.name == "hmget"]
    assert len(reads) == 10 and len(placement_reads) == 6


def test_a_session_not_found_is_looked_for_again_where_the_placement_now_puts_it() -> None:
    clock = Clock()
    before = Placement.default(N, 2)
    session = on_shard(before, 0)
    p = partition_of(session, N)
    core = Core(KEYS, clients(2), clock=clock)
    core.placed.placement = before
    asked: list[Request] = []
    assert run(core.show(session), Shards(before.freeze(p, 1).flip(p), clock), asked) is None
    assert [r.shard for r in asked if isinstance(r, Round)] == [0, 1]
    asked.clear()
    assert run(core.show(session), Shards(core.placed.placement, clock), asked) is None  # not moved
    assert [r.shard for r in asked if isinstance(r, Round)] == [1]  # the flipped table was kept


def test_a_merged_listing_reads_every_shard_then_the_placement_it_keeps_rows_by() -> None:
    clock = Clock()
    table = Placement.default(N, 2)
    core = Core(KEYS, clients(2), clock=clock)
    asked: list[Request] = []
    page = run(core.sessions(None, None, None, None), Shards(table, clock), asked)
    assert page.items == []
    assert isinstance(asked[0], Each) and len(asked[0].ops) == 2
    assert names(asked)[-2:] == [(0, "hmget"), (1, "hmget")]


def test_a_follower_with_deltas_reads_both_streams_in_one_xread_and_yields_them_in_order() -> None:
    clock = Clock()
    core = Core(KEYS, clients(1), clock=clock)
    follow = run(core.follow("s-1", "4-0", 500, None, deltas=True), lambda r: None)
    event = {"type": "message.created", "message": {"content": "Hello"}}
    piece = {b"call": b"llm-1", b"attempt": b"1", b"seq": b"1", b"text": b"Hel"}
    reply = [[KEYS.events("s-1").encode(), [(b"9-0", {b"event": orjson.dumps(event)})]],
             [KEYS.deltas("s-1").encode(), [(b"5-0", piece), (b"6-0", {b"junk": b"1"})]]]
    asked: list[Request] = []
    taken = list(follow.take(run(follow.read(), lambda r: reply, asked)))
    [xread] = asked
    assert isinstance(xread, Command)
    # both streams from the same point in time: their ids are Redis's clock
    assert xread.call.args == ({KEYS.events("s-1"): "4-0", KEYS.deltas("s-1"): "4-0"},)
    delta = {"type": "llm.delta", "call_id": "llm-1", "attempt": 1, "seq": 1, "text": "Hel"}
    assert taken == [("5-0", delta), ("9-0", event)]  # the entry that is no delta is skipped
    assert (follow.last, follow.last_delta) == ("9-0", "6-0")
