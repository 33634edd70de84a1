"""Rebalancing: which partitions to move where so that every shard holds its share.

Pure (no I/O): `parley partitions rebalance` shows the plan this returns and then has the
mover (parley/fleet/moves.py) carry it out, several moves at once. Two uses:

- **even**: after shards were added (`Placement.grow`), or partitions moved by hand, every
  shard is brought to N // S or N // S + 1 partitions;
- **drain**: shards named to be emptied (before their removal) give every partition away, and
  the others are evened out among themselves.

The plan moves as few partitions as that takes: each shard's share is fixed first (the shards
holding the most keep the larger shares), then only a shard's surplus moves, its
highest-numbered partitions, each to the shard that lacks the most (the lowest index on a tie),
so the same table always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from parley.schemas.shards import Placement, PlacementError


@dataclass(frozen=True, slots=True)
class Transfer:
    """One move of the plan: `partition` from shard `source` to shard `target`."""

    partition: int
    source: int
    target: int


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """The moves, in the order they are started, and the partitions per shard before and after
    (index: shard)."""

    transfers: tuple[Transfer, ...]
    before: tuple[int, ...]
    after: tuple[int, ...]
    drained: frozenset[int]

    @property
    def empty(self) -> bool:
        return not self.transfers


def held_by_shard(placement: Placement) -> list[list[int]]:
    """Each shard's partitions, ascending (index: shard)."""
    held: list[list[int]] = [[] for _ in range(placement.shards)]
    for p, s in enumerate(placement.table):
        held[s].append(p)
    return held


def plan_rebalance(placement: Placement, drain: Iterable[int] = ()) -> RebalancePlan:
    """The fewest moves that leave every shard not in `drain` with its share of the partitions
    and every shard in `drain` with none. PlacementError when no plan can be made: a partition
    is being moved (let it end, or repair), a drained shard does not exist, or every shard
    would be drained."""
    if placement.moving:
        raise PlacementError(f"partition(s) {sorted(placement.moving)} are being moved: let the move end, "
                             "or run `parley partitions repair`, before rebalancing")
    drained = frozenset(drain)
    outside = sorted(s for s in drained if not 0 <= s < placement.shards)
    if outside:
        raise PlacementError(f"there is no shard {outside[0]}: shards are 0-{placement.shards - 1}")
    keep = [s for s in range(placement.shards) if s not in drained]
    if not keep:
        raise PlacementError("every shard would be drained: keep at least one")
    held = held_by_shard(placement)
    base, extra = divmod(placement.partitions, len(keep))
    # the larger shares go to the shards that hold the most now: fewer partitions move
    by_size = sorted(keep, key=lambda s: (-len(held[s]), s))
    share = {s: base + (1 if i < extra else 0) for i, s in enumerate(by_size)}
    giving: list[tuple[int, int]] = [(p, s) for s in sorted(drained) for p in held[s]]
    giving += [(p, s) for s in keep for p in held[s][share[s]:]]
    lacking = {s: share[s] - len(held[s]) for s in keep if len(held[s]) < share[s]}
    transfers: list[Transfer] = []
    for p, source in sorted(giving):
        target = max(lacking, key=lambda s: (lacking[s], -s))
        transfers.append(Transfer(p, source, target))
        lacking[target] -= 1
        if lacking[target] == 0:
            del lacking[target]
    after = [len(h) for h in held]
    for t in transfers:
        after[t.source] -= 1
        after[t.target] += 1
    return RebalancePlan(tuple(spread(transfers)), tuple(len(h) for h in held), tuple(after), drained)


def spread(transfers: list[Transfer]) -> list[Transfer]:
    """The moves reordered so that the ones started together mostly have different sources and
    targets: round robin over the sources, each source's in partition order. Moves at once on
    one pair of shards would share that pair's cores and links for nothing."""
    by_source: dict[int, list[Transfer]] = {}
    for t in transfers:
        by_source.setdefault(t.source, []).append(t)
    queues = [by_source[s] for s in sorted(by_source)]
    out: list[Transfer] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out

