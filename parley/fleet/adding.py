"""Adding shards to a running deployment: `parley partitions add-shards`.

The command is given every shard's URL, in order, then the new shards' URLs after them. The
new shards must be empty (no Parley key under the prefix). The grown table
(`Placement.grow`: the same partitions on the same shards, more shards, version + 1) is
written on the old shards first, then on the new ones, each only over the version read, under
the move lock (taken on a majority of the old shards and of every URL), so no move runs
meanwhile. Nothing moves: the new shards hold no partition until `parley partitions rebalance`
(or `move`) gives them some, so the running processes go on as they were (each
dispatcher reads only its own shard's table; clients with the old URLs still reach every
session until a partition moves to a new shard).

A command stopped half way (a shard unreachable, Ctrl-C) leaves some shards with the grown
table and the old ones with the old: the same command, run again, finishes it; `repair`
writes the newest table everywhere too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley.client.shards import read_view
from parley.fleet.move_errors import MoveError
from parley.fleet.move_lock import LockHeld, MoveLock
from parley.schemas.moves import INDEXED_FIELD
from parley.schemas.shards import PlacementError, check_order

if TYPE_CHECKING:
    from parley.fleet.moves import Mover


@dataclass(frozen=True, slots=True)
class Added:
    """What `add_shards` did: the shards' count before and after, the table's new version."""

    before: int
    after: int
    version: int


def add_shards(mover: Mover) -> Added:
    """The shards given after the deployment's own joined to it (see the module's docstring).
    MoveError, nothing written, when: no shard holds a table yet; no URL was added; the old
    shards disagree (a move stopped half way: repair); a new shard is not empty."""
    # The lock on a majority of the deployment's own shards (those holding a table) and of every
    # URL given: counted over every URL alone, the new (empty) shards could make a majority while
    # another mover, given the old URLs, holds it on the old ones; counted over the old ones
    # alone, a mover given every URL could take its majority on the new ones.
    shards = mover.shards
    own = [i for i, r in enumerate(shards.clients) if read_view(r, mover.keys, i).placement is not None]
    lock = MoveLock(shards.clients, mover.keys.partitions_lock,
                    groups=[own or [0], list(range(len(shards.clients)))])
    try:
        mover.lock = lock.__enter__()
    except LockHeld as exc:
        raise MoveError(str(exc)) from None
    try:
        return _add(mover)
    finally:
        lock.__exit__(None, None, None)
        mover.lock = None


def _add(mover: Mover) -> Added:
    shards, keys = mover.shards, mover.keys
    views = [read_view(r, keys, i) for i, r in enumerate(shards.clients)]
    try:
        check_order(views)
    except PlacementError as exc:
        raise MoveError(str(exc)) from None
    tables = [v.placement for v in views if v.placement is not None]
    if not tables:
        raise MoveError("the shards hold no placement yet: start a dispatcher first (it writes the "
                        "first one)")
    newest = max(tables, key=lambda p: p.version)
    unfinished = [v.index for v in views if v.placement is None or v.placement.shards < newest.shards]
    if newest.shards == len(views) and not unfinished:
        if any(v.placement != newest for v in views):
            raise MoveError("the shards hold different tables: a move stopped half way; run "
                            "`parley partitions repair` first")
        raise MoveError(f"the deployment has {newest.shards} shards and as many URLs were given: give "
                        "every shard's URL, in order, then the new shards' URLs after them")
    if newest.shards == len(views):
        grown = newest  # a run stopped half way: the shards without the grown table get it
        older = [v.placement.shards for v in views
                 if v.placement is not None and v.placement.shards < grown.shards]
        before = older[0] if older else min(unfinished)
    else:
        if len(views) < newest.shards:
            raise MoveError(f"the deployment has {newest.shards} shards and {len(views)} URLs were given: "
                            "give every shard's URL, in order, then the new shards' URLs after them")
        if any(v.placement != newest for v in views[:newest.shards]):
            raise MoveError(f"the shards hold different tables (the newest is version {newest.version}): "
                            "a move stopped half way; run `parley partitions repair` first")
        try:
            grown = newest.grow(len(views) - newest.shards)
        except PlacementError as exc:
            raise MoveError(str(exc)) from None
        before = newest.shards
    for v in views:
        if v.placement is not None and v.placement != grown and v.placement.version != grown.version - 1:
            raise MoveError(f"shard {v.index} holds table version {v.placement.version}, neither the grown "
                            f"one ({grown.version}) nor the one before: run `parley partitions repair` first")
    new = [v for v in views if v.placement is None]
    for v in new:
        _check_empty(mover, v.index)
    # The old shards first (from the last to shard 0), then the new: once an old shard holds
    # the grown table, a mover given the old URLs finds more shards than URLs and refuses, and
    # one given every URL finds a new shard without a table and refuses, so nothing writes a
    # table of the same version meanwhile; running this again finishes it.
    for v in [*reversed([v for v in views if v.placement is not None]), *new]:
        if v.placement == grown:
            continue
        if v.placement is None:
            # empty: every session it will hold is in its partition's list from its first commit
            shards.clients[v.index].hsetnx(keys.config, INDEXED_FIELD, "1")
        mover.tables.write(v.index, grown, None if v.placement is None else v.placement.version)
    shards.placement = grown
    return Added(before, grown.shards, grown.version)


def _check_empty(mover: Mover, index: int) -> None:
    """A shard to add holds no key of this deployment's prefix (another deployment's data, or
    keys left by a test, would be served as this one's)."""
    r = mover.shards.clients[index]
    def ours(key: Any) -> bool:
        # what a run of this command stopped half way leaves on a new shard: its config with
        # only the `indexed` mark
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name == mover.keys.config:
            return {f.decode() if isinstance(f, bytes) else f for f in r.hkeys(name)} <= {INDEXED_FIELD}
        return name == mover.keys.partitions_lock

    found = next((k for k in r.scan_iter(match=f"{mover.keys.prefix}:*", count=1000) if not ours(k)), None)
    if found is not None:
        raise MoveError(f"shard {index} is not empty (it holds keys under `{mover.keys.prefix}:`): a shard "
                        "joins a deployment empty; nothing was written to it")
