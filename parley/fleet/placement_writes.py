"""Writing the placement table on every shard, each only over the version the writer read.

A move or repair writes version v+1 of the table from the v it read, shard by shard in its
plan's order (write_placement.lua compares the stored version and writes in one call), and
stops at the first shard that holds another version, or once the move lock is lost: two
writers of v+1 never overwrite each other (parley/fleet/move_lock.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parley.client.shards import Shards
from parley.dispatcher.store import load_script
from parley.fleet.move_errors import TableChanged
from parley.schemas.moves import MovePlan
from parley.schemas.shards import Placement


class PlacementWriter:
    """Writes placement tables on the shards `shards` names; `lock_lost` says whether the move
    lock the writer holds has been lost (nothing more is written then)."""

    def __init__(self, shards: Shards, lock_lost: Callable[[], bool]):
        self.shards = shards
        self.keys = shards.keys
        self.lock_lost = lock_lost
        self._write = [load_script(r, "write_placement") for r in shards.clients]

    def everywhere(self, plan: MovePlan, placement: Placement) -> None:
        """`placement` on every shard in the plan's order, each only over the version before it."""
        for n, s in enumerate(plan.write_order()):
            self.write(s, placement, placement.version - 1, written=n)
        self.shards.placement = placement

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
