"""Writing the placement table on every shard, each only over the version the writer read.

A move or repair writes version v+1 of the table from the v it read, shard by shard in its
plan's order (write_placement.lua compares the stored version and writes in one call), and
stops at the first shard that holds another version, or once the move lock is lost: two
writers of v+1 never overwrite each other (parley/fleet/move_lock.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from parley.client.shards import Shards
from parley.dispatcher.store import load_script
from parley.fleet.move_errors import TableChanged
from parley.schemas.moves import MovePlan
from parley.schemas.shards import PLACEMENT_FIELD, Placement, majority

#: a shard passed over is not tried again for this long (each try of a shard that is down waits
#: out redis-py's retries, seconds, inside some partition's freeze)
RETRY_PASSED_AFTER_S = 30.0


class PlacementWriter:
    """Writes placement tables on the shards `shards` names; `lock_lost` says whether the move
    lock the writer holds has been lost (nothing more is written then)."""

    def __init__(self, shards: Shards, lock_lost: Callable[[], bool]):
        self.shards = shards
        self.keys = shards.keys
        self.lock_lost = lock_lost
        self._write = [load_script(r, "write_placement") for r in shards.clients]
        #: shards a table of this writer passed over (not answering): they hold an older one
        self.behind: set[int] = set()
        self.passed_at: dict[int, float] = {}

    def expected_on(self, shard: int, expected: int) -> int | None:
        """The version to write over on `shard`: `expected`, or for a shard this writer passed
        over, the older one it holds (it missed only this writer's tables: the move lock)."""
        if shard not in self.behind:
            return expected
        raw: Any = self.shards.clients[shard].hget(self.keys.config, PLACEMENT_FIELD)
        if raw is None:
            return None
        held = Placement.from_json(raw).version
        return held if held <= expected else expected

    def everywhere(self, plan: MovePlan, placement: Placement) -> list[int]:
        """`placement` on every shard in the plan's order, each only over the version before it.
        A shard that does not answer, other than the move's source and target, is passed over
        while a majority takes the table (a majority's read sees it: schemas/shards.py); `repair`
        writes the newest table on it once it is back. Returns the shards passed over."""
        written, skipped = 0, []
        for s in plan.write_order():
            if s in self.behind and s not in (plan.source, plan.target) \
                    and time.monotonic() - self.passed_at.get(s, 0.0) < RETRY_PASSED_AFTER_S:
                skipped.append(s)  # just found down: trying again would add redis-py's retries
                continue
            try:
                self.write(s, placement, self.expected_on(s, placement.version - 1), written=written)
                self.behind.discard(s)
            except (redis.ConnectionError, redis.TimeoutError):
                self.behind.add(s)
                self.passed_at[s] = time.monotonic()
                if s in (plan.source, plan.target):
                    raise
                skipped.append(s)
                continue
            written += 1
        if written < majority(len(self.shards.clients)):
            raise TableChanged(f"only {written} of {len(self.shards.clients)} shards took table version "
                               f"{placement.version} (shards {skipped} do not answer): a majority must",
                               written)
        self.shards.placement = placement
        return skipped

    def write(self, shard: int, placement: Placement, expected: int | None, written: int = 0) -> None:
        """`placement` on `shard` if the version stored there is `expected` (None: no table)."""
        if self.lock_lost():
            raise TableChanged(f"the move lock ({self.keys.partitions_lock}) was lost: another move "
                               "or repair may be running; nothing more was written", written)
        fields = placement.config_fields(shard)
        reply: Any = self._write[shard](keys=[self.keys.config],
                                        args=["" if expected is None else expected,
                                              *(v for pair in fields.items() for v in pair)])
        if int(reply[0]) != 1:
            raise TableChanged(f"shard {shard}'s placement is at version {int(reply[1])}, not {expected}: "
                               "another move or repair changed it since it was read; nothing more "
                               "was written", written)
