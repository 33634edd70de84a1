"""Adding shards (`Placement.grow`) and the rebalance planner (schemas/rebalance.py): pure
rules, no Redis."""

import random

import pytest

from parley.schemas.rebalance import RebalancePlan, Transfer, held_by_shard, plan_rebalance, spread
from parley.schemas.shards import Placement, PlacementError, ShardView, newest_placement_of


def applied(placement: Placement, plan: RebalancePlan) -> tuple[int, ...]:
    """Each partition's shard once every move of `plan` is done: the table the plan's `after`
    counts, worked out apart from the planner, to check it."""
    table = list(placement.table)
    for t in plan.transfers:
        if table[t.partition] != t.source:
            raise PlacementError(f"partition {t.partition} is on shard {table[t.partition]}, "
                                 f"not {t.source}: the plan is of another table")
        table[t.partition] = t.target
    return tuple(table)


# ---- adding shards ---------------------------------------------------------------------------


def test_grow_adds_empty_shards_and_keeps_every_route() -> None:
    before = Placement.default(8, 2)
    after = before.grow(2)
    assert (after.shards, after.version, after.table) == (4, before.version + 1, before.table)
    assert after.partitions_of(2) == [] and after.partitions_of(3) == []
    assert [after.route(p) for p in range(8)] == [before.route(p) for p in range(8)]


@pytest.mark.parametrize(("placement", "added", "says"), [
    (Placement.default(8, 2), 0, "at least one"),
    (Placement.default(4, 2), 3, "at most one shard per partition"),
    (Placement.default(128, 60), 5, "at most 64 shards"),
    (Placement.default(8, 2).freeze(1, 0), 1, "being moved"),
])
def test_grow_refuses_what_cannot_be(placement: Placement, added: int, says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        placement.grow(added)


def _view(i: int, p: Placement) -> ShardView:
    return ShardView(index=i, placement=p, shard=i, partitions=p.partitions, has_data=True)


def test_a_client_with_the_old_urls_keeps_routing_until_a_partition_moves_to_a_new_shard() -> None:
    grown = Placement.default(8, 2).grow(2)
    assert newest_placement_of([_view(0, grown), _view(1, grown)]) == grown
    moving = grown.freeze(3, 2)
    with pytest.raises(PlacementError, match="give every shard's URL"):
        newest_placement_of([_view(0, moving), _view(1, moving)])
    with pytest.raises(PlacementError, match="give every shard's URL"):
        newest_placement_of([_view(0, moving.flip(3)), _view(1, moving.flip(3))])
    # more URLs than shards is still refused
    two = Placement.default(8, 2)
    with pytest.raises(PlacementError, match="give every shard's URL"):
        newest_placement_of([_view(0, two), _view(1, two), _view(2, two)])


# ---- the plan --------------------------------------------------------------------------------


def test_after_adding_shards_each_gets_its_share_and_only_surplus_moves() -> None:
    grown = Placement.default(16, 2).grow(2)  # 8 + 8 + 0 + 0
    plan = plan_rebalance(grown)
    assert plan.before == (8, 8, 0, 0) and plan.after == (4, 4, 4, 4)
    assert len(plan.transfers) == 8
    # the highest-numbered partitions of each source move
    assert sorted(t.partition for t in plan.transfers if t.source == 0) == [8, 10, 12, 14]
    assert all(t.target in (2, 3) for t in plan.transfers)
    assert held_by_shard(Placement(16, 4, applied(grown, plan)))[2] != []


def test_a_balanced_table_gives_an_empty_plan() -> None:
    plan = plan_rebalance(Placement.default(10, 3))  # 4 + 3 + 3
    assert plan.empty and plan.after == plan.before == (4, 3, 3)


def test_draining_a_shard_gives_its_partitions_to_the_others_evenly() -> None:
    plan = plan_rebalance(Placement.default(12, 4), drain=[1])
    assert plan.drained == frozenset({1})
    assert plan.after == (4, 0, 4, 4)
    assert {t.source for t in plan.transfers} == {1} and len(plan.transfers) == 3


def test_larger_shares_go_to_the_shards_holding_most() -> None:
    # 5 + 2 over two shards: shares 4 and 3, so one partition moves, not two
    placement = Placement(7, 2, (0, 0, 0, 0, 0, 1, 1))
    plan = plan_rebalance(placement)
    assert plan.transfers == (Transfer(4, 0, 1),) and plan.after == (4, 3)


@pytest.mark.parametrize(("placement", "drain", "says"), [
    (Placement.default(8, 2).freeze(1, 0), (), "being moved"),
    (Placement.default(8, 2), (2,), "there is no shard 2"),
    (Placement.default(8, 2), (0, 1), "every shard would be drained"),
])
def test_no_plan_for_what_cannot_be(placement: Placement, drain: tuple[int, ...], says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        plan_rebalance(placement, drain)


def test_spread_starts_moves_of_different_sources_together() -> None:
    moves = [Transfer(0, 0, 2), Transfer(1, 0, 2), Transfer(2, 1, 3), Transfer(3, 1, 3)]
    assert [t.source for t in spread(moves)] == [0, 1, 0, 1]


def test_applied_refuses_a_plan_of_another_table() -> None:
    plan = plan_rebalance(Placement.default(8, 2).grow(1))
    with pytest.raises(PlacementError, match="another table"):
        applied(Placement.all_on_first(8, 3), plan)


@pytest.mark.parametrize("seed", range(40))
def test_every_plan_is_even_minimal_and_deterministic(seed: int) -> None:
    rng = random.Random(seed)
    shards = rng.randint(1, 12)
    partitions = rng.randint(shards, 80)
    placement = Placement(partitions, shards, tuple(rng.randrange(shards) for _ in range(partitions)))
    drain = set(rng.sample(range(shards), rng.randint(0, shards - 1)))
    plan = plan_rebalance(placement, drain)
    assert plan == plan_rebalance(placement, drain)
    kept = [plan.after[s] for s in range(shards) if s not in drain]
    assert max(kept) - min(kept) <= 1 and sum(kept) == partitions
    assert all(plan.after[s] == 0 for s in drain)
    # each partition moves at most once, and only off a drained shard or out of a surplus
    assert len({t.partition for t in plan.transfers}) == len(plan.transfers)
    surplus = sum(max(0, plan.before[s] - plan.after[s]) for s in range(shards))
    assert len(plan.transfers) == surplus
    table = applied(placement, plan)
    assert [table.count(s) for s in range(shards)] == list(plan.after)


# ---- more partitions (resize) ------------------------------------------------------------------


def test_a_resized_table_keeps_every_session_on_its_shard() -> None:
    from parley.schemas.keys import partition_of

    before = Placement(4, 3, (0, 1, 2, 2), version=7)
    after = before.resized(12)
    assert (after.partitions, after.shards, after.version) == (12, 3, 8)
    for i in range(500):
        s = f"s-{i}"
        assert after.shard_of_session(s) == before.shard_of_session(s)
        assert partition_of(s, 12) % 4 == partition_of(s, 4)


@pytest.mark.parametrize(("now", "to", "says"), [
    (4, 6, "not a multiple of 4"),
    (4, 4, "can be resized to more"),
    (4, 2, "can be resized to more"),
    (512, 2048, "at most 1024"),
])
def test_a_resize_to_what_cannot_keep_sessions_in_place_is_refused(now: int, to: int, says: str) -> None:
    from parley.schemas.shards import check_resize

    with pytest.raises(PlacementError, match=says):
        check_resize(now, to)


def test_a_table_being_moved_is_not_resized() -> None:
    with pytest.raises(PlacementError, match="being moved"):
        Placement.default(4, 2).freeze(1, 0).resized(8)


def test_a_partitioned_streams_name_for_another_partition() -> None:
    from parley.schemas.keys import stream_of_partition

    assert stream_of_partition("parley:in:app:3", 7) == "parley:in:app:7"
    assert stream_of_partition("parley:inputs:0", 12) == "parley:inputs:12"
    with pytest.raises(ValueError, match="not a partitioned stream"):
        stream_of_partition("parley:inputs", 1)
