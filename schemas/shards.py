"""Shards: where each partition lives when a deployment spans several Redis primaries.

Pure (no I/O): the placement table and the rules every process applies to it. The shell that
reads and writes it on each shard is parley/client/shards.py; docs/operations.md ("Shards") is the
user's account.

A deployment names S Redis primaries, in order (`--redis-url` repeated, or
`PARLEY_REDIS_URLS`): shard 0, 1, ... S-1. Sessions hash to N partitions (schemas/keys.py
`partition_of`, by the session's *root* id, so a sub-agent `S:sub-1` lands with `S`), and the
placement table says which shard holds each partition: every key of a partition and of its
sessions lives there. The table is written in `<prefix>:config` of every shard (field
`placement`, JSON, plus one `route:<p>` field per partition that the submit function reads
cheaply), beside the shard's own index (field `shard`). A process checks at start that every
shard holds the same table, that the table names as many shards as it was given URLs, and
that shard i says it is shard i (URLs given in another order would mix deployments).

A partition being moved (`parley partitions move`) is in `moving`: no shard serves it (its
dispatchers give its lease back, its sweeps skip its sessions, the submit function refuses
its inputs with the retryable code `moved`) until the move flips the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from parley.schemas.keys import partition_of

#: the partition count a deployment of several shards gets unless told otherwise: room to grow
#: to 16 shards without re-partitioning (a deployment of one Redis keeps 1; docs/operations.md)
DEFAULT_SHARDED_PARTITIONS = 16
MAX_SHARDS = 64

#: `<prefix>:config` fields: the table (JSON), this shard's index, one route per partition
PLACEMENT_FIELD = "placement"
SHARD_FIELD = "shard"
ROUTE_FIELD_PREFIX = "route:"
#: a route's value while its partition moves: `moving:<to>`
MOVING_ROUTE_PREFIX = "moving:"

#: the most partitions a deployment may have (`--partitions`, `parley partitions resize`)
MAX_PARTITIONS = 1024


def check_resize(now: int, to: int) -> None:
    """PlacementError unless `to` partitions is a multiple of `now`, larger, and allowed: only
    then does every session keep its shard (see `Placement.resized`)."""
    if not now < to <= MAX_PARTITIONS:
        raise PlacementError(f"a deployment of {now} partitions can be resized to more, at most "
                             f"{MAX_PARTITIONS}: not {to}")
    if to % now:
        raise PlacementError(f"{to} is not a multiple of {now}: resize to k x {now} partitions (every "
                             "session then stays on its shard)")


def route_field(partition: int) -> str:
    return f"{ROUTE_FIELD_PREFIX}{partition}"


class PlacementError(ValueError):
    """A placement that cannot be used (a table that does not fit its counts, a move to nowhere),
    or processes and shards that disagree about it: the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Placement:
    """partition -> shard, for `partitions` partitions over `shards` shards.

    `version` grows by one with every change (a move's freeze and its flip), so readers that
    meet two tables take the newer; `moving` maps each partition being moved to its target."""

    partitions: int
    shards: int
    table: tuple[int, ...]
    version: int = 1
    moving: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= MAX_SHARDS:
            raise PlacementError(f"a deployment has 1-{MAX_SHARDS} shards, not {self.shards}")
        if self.partitions < self.shards:
            raise PlacementError(f"{self.partitions} partitions cannot spread over {self.shards} "
                                 "shards: give at least one partition per shard (--partitions)")
        if len(self.table) != self.partitions:
            raise PlacementError(f"the table has {len(self.table)} entries for {self.partitions} partitions")
        if any(not 0 <= s < self.shards for s in self.table):
            raise PlacementError(f"the table names a shard outside 0-{self.shards - 1}")
        for p, to in self.moving.items():
            if not 0 <= p < self.partitions or not 0 <= to < self.shards:
                raise PlacementError(f"a move of partition {p} to shard {to} is outside the table")

    # ---- making ----------------------------------------------------------------------------
    @classmethod
    def default(cls, partitions: int, shards: int) -> Placement:
        """partition p on shard p mod S."""
        return cls(partitions, shards, tuple(p % shards for p in range(partitions)))

    @classmethod
    def all_on_first(cls, partitions: int, shards: int) -> Placement:
        """Every partition on shard 0: a deployment of one Redis given more shards, whose data is
        all on its first; `parley partitions move` spreads it."""
        return cls(partitions, shards, (0,) * partitions)

    def freeze(self, partition: int, to: int) -> Placement:
        """The table while `partition` moves to shard `to`."""
        self._check_partition(partition)
        if not 0 <= to < self.shards:
            raise PlacementError(f"there is no shard {to}: shards are 0-{self.shards - 1}")
        if partition in self.moving:
            raise PlacementError(f"partition {partition} is already moving to shard {self.moving[partition]}")
        if self.table[partition] == to:
            raise PlacementError(f"partition {partition} is already on shard {to}")
        return replace(self, version=self.version + 1, moving={**self.moving, partition: to})

    def flip(self, partition: int) -> Placement:
        """The table once `partition`'s move is done: it is on its target, served again."""
        if partition not in self.moving:
            raise PlacementError(f"partition {partition} is not moving")
        table = list(self.table)
        table[partition] = self.moving[partition]
        moving = {p: t for p, t in self.moving.items() if p != partition}
        return replace(self, version=self.version + 1, table=tuple(table), moving=moving)

    def grow(self, added: int) -> Placement:
        """The table once `added` empty shards join: shards S..S+added-1, holding no partition
        until one is moved there (`parley partitions rebalance`), so every route stays valid and
        a client given only the first S URLs still reaches every session."""
        if added < 1:
            raise PlacementError(f"add at least one shard, not {added}")
        if self.moving:
            raise PlacementError(f"partition(s) {sorted(self.moving)} are being moved: let the move end, "
                                 "or run `parley partitions repair`, before adding shards")
        if self.shards + added > MAX_SHARDS:
            raise PlacementError(f"a deployment has at most {MAX_SHARDS} shards: {self.shards} + {added} "
                                 "is more")
        if self.shards + added > self.partitions:
            raise PlacementError(f"{self.partitions} partitions cannot spread over {self.shards + added} "
                                 "shards: a deployment has at most one shard per partition")
        return replace(self, version=self.version + 1, shards=self.shards + added)

    def resized(self, partitions: int) -> Placement:
        """The table at `partitions` = k x N partitions (`parley partitions resize`): partition
        p' on the shard of p' mod N. A session's new partition, crc32 mod kN, is congruent to its
        old one mod N, so every session stays on its shard: nothing moves but the count."""
        check_resize(self.partitions, partitions)
        if self.moving:
            raise PlacementError(f"partition(s) {sorted(self.moving)} are being moved: let the move end, "
                                 "or run `parley partitions repair`, before resizing")
        table = tuple(self.table[p % self.partitions] for p in range(partitions))
        return replace(self, version=self.version + 1, partitions=partitions, table=table)

    def highest_shard_used(self) -> int:
        """The highest shard index any partition is on or moving to: a client needs the URLs
        up to it to reach every session."""
        return max([*self.table, *self.moving.values()])

    def unfreeze(self, partition: int) -> Placement:
        """A move given up before its flip: the partition is served where it was."""
        if partition not in self.moving:
            raise PlacementError(f"partition {partition} is not moving")
        moving = {p: t for p, t in self.moving.items() if p != partition}
        return replace(self, version=self.version + 1, moving=moving)

    # ---- reading ---------------------------------------------------------------------------
    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise PlacementError(f"there is no partition {partition}: partitions are 0-{self.partitions - 1}")

    def shard_of(self, partition: int) -> int:
        """Where the partition's keys are (its source while it moves)."""
        return self.table[partition]

    def shard_of_session(self, session: str) -> int:
        return self.table[partition_of(session, self.partitions)]

    def serves(self, shard: int, partition: int) -> bool:
        """True if `shard`'s processes work on `partition` now: placed there and not moving."""
        return self.table[partition] == shard and partition not in self.moving

    def partitions_of(self, shard: int) -> list[int]:
        """The partitions `shard` serves now."""
        return [p for p in range(self.partitions) if self.serves(shard, p)]

    def route(self, partition: int) -> str:
        """The `route:<p>` value the submit function reads: the shard's index, or `moving:<to>`."""
        to = self.moving.get(partition)
        return f"{MOVING_ROUTE_PREFIX}{to}" if to is not None else str(self.table[partition])

    def config_fields(self, shard: int) -> dict[str, str]:
        """What `<prefix>:config` of shard `shard` holds of the placement (one HSET)."""
        fields = {PLACEMENT_FIELD: self.to_json(), SHARD_FIELD: str(shard),
                  "partitions": str(self.partitions)}
        fields.update({route_field(p): self.route(p) for p in range(self.partitions)})
        return fields

    # ---- the stored form ---------------------------------------------------------------------
    def to_json(self) -> str:
        return orjson.dumps({"version": self.version, "partitions": self.partitions, "shards": self.shards,
                             "table": list(self.table),
                             "moving": {str(p): t for p, t in sorted(self.moving.items())}}).decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> Placement:
        try:
            data: Any = orjson.loads(raw)
            return cls(partitions=int(data["partitions"]), shards=int(data["shards"]),
                       table=tuple(int(s) for s in data["table"]), version=int(data["version"]),
                       moving={int(p): int(t) for p, t in data.get("moving", {}).items()})
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlacementError):
                raise
            raise PlacementError(f"the stored placement does not read: {exc}") from None


@dataclass(frozen=True, slots=True)
class ShardView:
    """What one shard's `<prefix>:config` says (None: the field is absent)."""

    index: int  # its position in the URLs this process was given
    placement: Placement | None
    shard: int | None  # the index the shard recorded at first start
    partitions: int | None  # the deployment's N (`partitions` field), if published
    has_data: bool = False  # the shard already serves a deployment (a published `partitions`)


def majority(shards: int) -> int:
    """How many of `shards` make a majority: any two majorities share a shard, so a table
    written on a majority is seen by a read of any majority."""
    return shards // 2 + 1


class ShardsDown(PlacementError):
    """Fewer shards answer than a majority: the placement cannot be known."""


def check_quorum(views: Sequence[ShardView], total: int) -> None:
    """ShardsDown unless a majority of the `total` shards answered (`views` are theirs)."""
    if len(views) < majority(total):
        down = sorted(set(range(total)) - {v.index for v in views})
        raise ShardsDown(f"only {len(views)} of {total} shards answer (shard(s) {down} do not): the "
                         f"placement is read from a majority, {majority(total)}")


def check_order(views: Sequence[ShardView]) -> None:
    """PlacementError when a shard recorded another index than its URL's position: the URLs are
    in another order than at first start (every call would go to the wrong shard)."""
    for v in views:
        if v.shard is not None and v.shard != v.index:
            raise PlacementError(f"URL #{v.index} is shard {v.shard} of this deployment: give the URLs in "
                                 "the order they were first given (shard 0 first)")


def agreed_placement(views: Sequence[ShardView], total: int | None = None) -> Placement | None:
    """The one placement every shard that answered holds, checked against the URLs this process
    was given (`total` of them; `views` are the shards that answered, every one by default);
    None when no shard holds one yet (a fresh deployment: see `initial_placement`).

    Raises PlacementError, saying what disagrees, when: fewer than a majority answered; a shard
    recorded another index (the URLs are in another order than at first start); the shards hold
    different tables (a move was interrupted between shards: `parley partitions repair`); the
    table names another number of shards than there are URLs; some shards hold a table and
    others none; no shard holds one and some do not answer (a deployment's first table is
    written on every shard)."""
    total = len(views) if total is None else total
    check_quorum(views, total)
    check_order(views)
    held = [v for v in views if v.placement is not None]
    if not held:
        if len(views) < total:
            down = sorted(set(range(total)) - {v.index for v in views})
            raise ShardsDown(f"shard(s) {down} do not answer and no other holds a placement: a new "
                             "deployment's first start needs every shard")
        return None
    if len(held) != len(views):
        missing = [v.index for v in views if v.placement is None]
        raise PlacementError(f"shard(s) {missing} hold no placement while others do: a shard was added "
                             "or emptied; see docs/operations.md, \"Shards\"")
    first = held[0].placement
    assert first is not None
    for v in held[1:]:
        if v.placement is not None and v.placement != first:
            raise PlacementError(f"shards 0 and {v.index} hold different placements (versions "
                                 f"{first.version} and {v.placement.version}): a move stopped half "
                                 "way; run `parley partitions repair`")
    if first.shards != total:
        raise PlacementError(f"the deployment has {first.shards} shards and this process was given "
                             f"{total} URLs: give every shard's URL, in order")
    return first


def newest_placement_of(views: Sequence[ShardView], total: int | None = None) -> Placement | None:
    """What a client routes by: the newest table any shard holds (a move writes them one after
    another, so two may differ for a moment: not an error for a reader), once the URLs are
    checked against the shards (PlacementError for URLs in another order, or too few or many:
    every call would otherwise be refused `moved`, or go to a shard that is not the session's).
    `views` may be those of a majority of the `total` shards (the others not answering): a
    table is written on a majority at least, so the newest is among them."""
    total = len(views) if total is None else total
    check_quorum(views, total)
    check_order(views)
    held = [v.placement for v in views if v.placement is not None]
    if not held:
        return None
    newest = max(held, key=lambda p: p.version)
    # Fewer URLs than shards is fine while no partition is on the ones missing: shards just
    # added (`parley partitions add-shards`) hold nothing until a partition moves there, so the
    # clients of a growing deployment keep working until they are given the new URLs.
    if newest.shards < total or newest.highest_shard_used() >= total:
        raise PlacementError(f"the deployment has {newest.shards} shards and this client was given "
                             f"{total} URLs: give every shard's URL, in order")
    return newest


def initial_placement(views: Sequence[ShardView], partitions: int) -> Placement:
    """The placement a fresh multi-shard deployment starts with: p mod S; or, when shard 0
    already serves a deployment of one Redis (its data is all there), every partition on shard
    0 until moved. `partitions` is the deployment's published N when it has one."""
    shards = len(views)
    n = views[0].partitions or partitions
    others = [v.index for v in views[1:] if v.has_data]
    if others:
        raise PlacementError(f"shard(s) {others} already hold a deployment without a placement: "
                             "shards other than the first must start empty")
    if views[0].has_data:
        return Placement.all_on_first(n, shards)
    return Placement.default(n, shards)
