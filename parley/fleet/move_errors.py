"""What a move or repair raises: the message says why it stopped and what state it left."""

from __future__ import annotations

from parley.schemas.shards import PlacementError


class MoveError(PlacementError):
    """A move that could not be done: the message says why and what state it left."""


class TableChanged(MoveError):
    """A shard's table is not the version the mover read: another writer changed it."""

    def __init__(self, message: str, written: int):
        super().__init__(message)
        self.written = written  # how many shards this write had changed before it was refused
