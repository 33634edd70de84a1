"""The placement table (schemas/shards.py), the Sentinel URL reader (parley/client/shards.py) and the
per-shard command lines (parley/cli/per_shard.py): pure rules, no Redis."""

import pytest

from parley.cli.per_shard import await_placement, child_args
from parley.client.shards import SentinelAddress, parse_sentinel_url
from parley.schemas.ids import root_session
from parley.schemas.keys import partition_of
from parley.schemas.shards import (
    DEFAULT_SHARDED_PARTITIONS,
    Placement,
    PlacementError,
    ShardView,
    agreed_placement,
    initial_placement,
    newest_placement_of,
)

# ---- making a table -------------------------------------------------------------------------


def test_default_puts_partition_p_on_shard_p_mod_s() -> None:
    p = Placement.default(6, 4)
    assert p.table == (0, 1, 2, 3, 0, 1)
    assert p.version == 1 and p.moving == {}
    assert DEFAULT_SHARDED_PARTITIONS == 16


def test_all_on_first_puts_every_partition_on_shard_0() -> None:
    p = Placement.all_on_first(4, 3)
    assert p.table == (0, 0, 0, 0)
    assert p.partitions_of(0) == [0, 1, 2, 3] and p.partitions_of(1) == [] and p.partitions_of(2) == []


@pytest.mark.parametrize(("partitions", "shards", "table", "moving", "says"), [
    (4, 0, (), {}, "1-64 shards"),
    (4, 65, (), {}, "1-64 shards"),
    (1, 2, (0,), {}, "cannot spread"),
    (3, 2, (0, 1), {}, "2 entries for 3"),
    (2, 2, (0, 2), {}, "outside 0-1"),
    (2, 2, (0, 1), {2: 0}, "outside the table"),
    (2, 2, (0, 1), {0: 5}, "outside the table"),
])
def test_a_table_that_does_not_fit_its_counts_is_refused(partitions: int, shards: int, table: tuple[int, ...],
                                                         moving: dict[int, int], says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        Placement(partitions, shards, table, moving=moving)


# ---- a move: freeze, flip, unfreeze ------------------------------------------------------------


def test_freeze_marks_the_partition_moving_and_nobody_serves_it() -> None:
    p = Placement.default(4, 2).freeze(2, 1)
    assert p.version == 2 and p.moving == {2: 1}
    assert p.shard_of(2) == 0  # its keys are still on its source
    assert not p.serves(0, 2) and not p.serves(1, 2)
    assert p.partitions_of(0) == [0] and p.partitions_of(1) == [1, 3]
    assert p.route(2) == "moving:1" and p.route(0) == "0" and p.route(1) == "1"


def test_flip_puts_the_partition_on_its_target_and_serves_it_there() -> None:
    p = Placement.default(4, 2).freeze(2, 1).flip(2)
    assert p.version == 3 and p.moving == {} and p.table == (0, 1, 1, 1)
    assert p.serves(1, 2) and not p.serves(0, 2) and p.route(2) == "1"


def test_unfreeze_gives_up_the_move_and_serves_it_where_it_was() -> None:
    p = Placement.default(4, 2).freeze(2, 1).unfreeze(2)
    assert p.version == 3 and p.moving == {} and p.table == (0, 1, 0, 1) and p.serves(0, 2)


@pytest.mark.parametrize(("move", "says"), [
    (lambda p: p.freeze(9, 1), "no partition 9"),
    (lambda p: p.freeze(-1, 1), "no partition -1"),
    (lambda p: p.freeze(0, 2), "no shard 2"),
    (lambda p: p.freeze(0, 0), "already on shard 0"),
    (lambda p: p.freeze(0, 1).freeze(0, 1), "already moving to shard 1"),
    (lambda p: p.flip(0), "not moving"),
    (lambda p: p.unfreeze(0), "not moving"),
])
def test_a_move_that_cannot_be_is_refused(move: object, says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        move(Placement.default(4, 2))  # type: ignore[operator]


# ---- reading: sessions, routes, config fields, the stored form -------------------------------


def test_a_sub_agent_is_on_its_root_sessions_shard() -> None:
    p = Placement.default(16, 3)
    for s in ("alpha", "beta", "t1/gamma", "delta"):
        child, grandchild = f"{s}:sub-1", f"{s}:sub-1:sub-2"
        assert root_session(grandchild) == s
        assert partition_of(child, 16) == partition_of(s, 16) == partition_of(grandchild, 16)
        assert p.shard_of_session(child) == p.shard_of_session(s) == p.shard_of_session(grandchild)


def test_config_fields_hold_the_table_the_shard_and_a_route_per_partition() -> None:
    p = Placement.default(4, 2).freeze(1, 0)
    fields = p.config_fields(1)
    assert fields["shard"] == "1" and fields["partitions"] == "4"
    assert [fields[f"route:{n}"] for n in range(4)] == ["0", "moving:0", "0", "1"]
    assert Placement.from_json(fields["placement"]) == p


def test_the_stored_form_round_trips_and_a_bad_one_is_a_placement_error() -> None:
    p = Placement.default(8, 3).freeze(5, 0)
    assert Placement.from_json(p.to_json().encode()) == p
    for raw in ("not json", "{}", '{"partitions": 2, "shards": 2, "table": [0], "version": 1}',
                '{"partitions": "x", "shards": 2, "table": [0, 1], "version": 1}'):
        with pytest.raises(PlacementError):
            Placement.from_json(raw)


# ---- agreeing on a placement at start ---------------------------------------------------------


def view(i: int, placement: Placement | None, shard: int | None = None, partitions: int | None = None,
         has_data: bool = False) -> ShardView:
    return ShardView(index=i, placement=placement, shard=i if shard is None and placement else shard,
                     partitions=partitions, has_data=has_data)


def test_agreed_placement_is_the_one_table_every_shard_holds() -> None:
    p = Placement.default(4, 2)
    assert agreed_placement([view(0, p), view(1, p)]) == p


def test_agreed_placement_is_none_on_a_fresh_deployment() -> None:
    assert agreed_placement([view(0, None), view(1, None)]) is None


def test_agreed_placement_refuses_urls_in_another_order() -> None:
    p = Placement.default(4, 2)
    with pytest.raises(PlacementError, match="URL #0 is shard 1"):
        agreed_placement([view(0, p, shard=1), view(1, p, shard=0)])


def test_a_clients_placement_is_the_newest_a_shard_holds() -> None:
    old = Placement.default(4, 2)
    new = old.freeze(1, 0)  # a move writes the shards one after another: not an error for a client
    assert newest_placement_of([view(0, new), view(1, old)]) == new
    assert newest_placement_of([view(0, None), view(1, None)]) is None


def test_a_client_refuses_urls_in_another_order_or_of_another_count() -> None:
    p = Placement.default(4, 2)
    with pytest.raises(PlacementError, match="URL #0 is shard 1"):
        newest_placement_of([view(0, p, shard=1), view(1, p, shard=0)])
    with pytest.raises(PlacementError, match="2 shards and this client was given 3 URLs"):
        newest_placement_of([view(0, p), view(1, p), view(2, None)])


def test_agreed_placement_refuses_some_shards_without_a_table() -> None:
    with pytest.raises(PlacementError, match=r"shard\(s\) \[1\] hold no placement"):
        agreed_placement([view(0, Placement.default(4, 2)), view(1, None)])


def test_agreed_placement_refuses_different_tables() -> None:
    p = Placement.default(4, 2)
    with pytest.raises(PlacementError, match=r"different placements.*partitions repair"):
        agreed_placement([view(0, p), view(1, p.freeze(0, 1))])


def test_agreed_placement_refuses_a_missing_url() -> None:
    p = Placement.default(6, 3)
    with pytest.raises(PlacementError, match="3 shards and this process was given 2 URLs"):
        agreed_placement([view(0, p), view(1, p)])


def test_initial_placement_of_fresh_shards_is_p_mod_s() -> None:
    assert initial_placement([view(0, None), view(1, None)], 4) == Placement.default(4, 2)


def test_initial_placement_keeps_the_published_partition_count_of_shard_0() -> None:
    got = initial_placement([view(0, None, partitions=8, has_data=True), view(1, None)], 16)
    assert got == Placement.all_on_first(8, 2)


def test_initial_placement_refuses_data_on_a_shard_other_than_the_first() -> None:
    with pytest.raises(PlacementError, match=r"shard\(s\) \[1\] already hold a deployment"):
        initial_placement([view(0, None), view(1, None, partitions=4, has_data=True)], 4)


# ---- Sentinel URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("redis+sentinel://h1:26379/mymaster", SentinelAddress((("h1", 26379),), "mymaster")),
    ("redis+sentinel://h1:26379,h2:26380/svc/3", SentinelAddress((("h1", 26379), ("h2", 26380)), "svc", 3)),
    ("redis+sentinel://bob:s%40cret@h:1/svc", SentinelAddress((("h", 1),), "svc", 0, "bob", "s@cret")),
    ("redis+sentinel://:pw@h:1/svc", SentinelAddress((("h", 1),), "svc", 0, None, "pw")),
    ("redis+sentinel://[::1]:26379/svc", SentinelAddress((("::1", 26379),), "svc")),
])
def test_a_sentinel_url_reads(url: str, expected: SentinelAddress) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(("url", "says"), [
    ("redis://h:1/0", "not a redis\\+sentinel"),
    ("redis+sentinel://h/svc", "host:port"),
    ("redis+sentinel://h:x/svc", "host:port"),
    ("redis+sentinel://h:1,/svc", "host:port"),
    ("redis+sentinel://h:1", "the path is"),
    ("redis+sentinel://h:1/", "the path is"),
    ("redis+sentinel://h:1/svc/db", "the path is"),
    ("redis+sentinel://h:1/svc/0/x", "the path is"),
])
def test_a_bad_sentinel_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


# ---- one process per shard ---------------------------------------------------------------------


def test_a_child_gets_its_shard_and_its_own_metrics_port() -> None:
    argv = ["--redis-url", "redis://a", "--redis-url", "redis://b", "dispatcher", "--metrics-port",
            "9100", "--lease-ms", "2000"]
    assert child_args(argv, 1, 9100) == ["--redis-url", "redis://a", "--redis-url", "redis://b",
                                         "dispatcher", "--lease-ms", "2000", "--shard", "1",
                                         "--metrics-port", "9101"]
    assert child_args(["worker", "--metrics-port=9100"], 2, 9100) == [
        "worker", "--shard", "2", "--metrics-port", "9102"]
    assert child_args(["worker", "--burst"], 0, None) == ["worker", "--burst", "--shard", "0"]


def test_a_worker_waits_for_the_first_placement() -> None:
    p = Placement.default(4, 2)
    answers = iter([None, None, p])
    naps: list[float] = []
    assert await_placement(lambda: next(answers), 60, sleep=naps.append) == p
    assert len(naps) == 2


def test_a_worker_refuses_when_no_placement_comes() -> None:
    with pytest.raises(PlacementError, match=r"no shard holds a placement.*start a dispatcher"):
        await_placement(lambda: None, 0, sleep=lambda _s: None)


def test_a_worker_refuses_shards_that_disagree_at_once() -> None:
    def check() -> Placement | None:
        raise PlacementError("URL #0 is shard 1")

    with pytest.raises(PlacementError, match="URL #0 is shard 1"):
        await_placement(check, 60, sleep=lambda _s: pytest.fail("must not wait"))


# ---- a majority of the shards (a shard that does not answer) -----------------------------------


def test_a_majority_is_more_than_half() -> None:
    from parley.schemas.shards import majority

    assert [majority(n) for n in (1, 2, 3, 4, 5, 16, 20)] == [1, 2, 2, 3, 3, 9, 11]


def test_the_placement_is_read_from_a_majority_and_not_from_fewer() -> None:
    from parley.schemas.shards import ShardsDown

    p = Placement.default(6, 3)
    views = [ShardView(index=i, placement=p, shard=i, partitions=6, has_data=True) for i in (1, 2)]
    assert agreed_placement(views, total=3) == p
    assert newest_placement_of(views, total=3) == p
    with pytest.raises(ShardsDown, match=r"only 1 of 3 shards answer \(shard\(s\) \[0, 2\] do not\)"):
        newest_placement_of(views[:1], total=3)
    with pytest.raises(ShardsDown):
        agreed_placement(views[:1], total=3)
    # four shards: two answering are not a majority
    p4 = Placement.default(8, 4)
    four = [ShardView(index=i, placement=p4, shard=i, partitions=8, has_data=True) for i in (0, 1)]
    with pytest.raises(ShardsDown, match="a majority, 3"):
        agreed_placement(four, total=4)


def test_a_first_table_needs_every_shard() -> None:
    from parley.schemas.shards import ShardsDown

    fresh = [ShardView(index=i, placement=None, shard=None, partitions=None) for i in (0, 1)]
    assert agreed_placement(fresh, total=2) is None
    with pytest.raises(ShardsDown, match="first start needs every shard"):
        agreed_placement(fresh, total=3)
