"""Readers across sessions over several shards: one page of each shard, merged into one page.

Pure (no I/O): `Client` and `AsyncClient` read one page of every shard from the same position
and hand the pages here. A listing's rows sort the same way on every shard (the members of
the index and of the list of sessions are `time SEP session ...`, or `session SEP ...`, byte
order is listing order), so a merged page is the first rows of the union in that order, and
its cursor is one position in that order, applied to every shard on the next page.

Why rows are kept only from their session's shard: a partition move copies its sessions' keys
(their interrupts' and listing members among them) to the target shard, flips the placement,
then deletes the source's copy. Between the copy and the delete both shards list those rows;
the placement names the one copy to show (the source until the flip, the target after).

Why the cursor is not simply the last row taken: a shard whose page stopped short (combined
filters ended its bounded scan) has only been read up to its own position, and its rows past
it are unknown. The merged page may then take rows only up to the smallest such position, or
it would skip that shard's rows between the two; the next page goes on from there.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from parley.schemas.shards import Placement

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ShardPart(Generic[T]):
    """One shard's page: its rows in listing order, and how far it read (None: to the end)."""

    items: list[T]
    after: str | None


def merge_parts(parts: Sequence[ShardPart[T]], key: Callable[[T], str], limit: int,
                reverse: bool = False, owner: Callable[[T], int] | None = None) -> tuple[list[T], str | None]:
    """The merged page's rows (at most `limit`) and the position its next page starts after
    (None: every shard is read to its end). `key` is a row's member in the listing's order;
    `reverse`: the listing runs from the greatest member down (newest first). `owner`: the
    shard a row's session is placed on; a row of `parts[i]` is kept only if that is shard i
    (parts are the shards' pages in the deployment's order)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    parts = [ShardPart(own_rows(p.items, i, owner), p.after) for i, p in enumerate(parts)]

    def before_or_at(a: str, b: str) -> bool:  # a comes no later than b in the listing's order
        return a >= b if reverse else a <= b

    stops = [p.after for p in parts if p.after is not None]
    # how far every shard has been read: the earliest of the positions of those not at their end
    bound = (max(stops) if reverse else min(stops)) if stops else None
    rows = sorted((row for p in parts for row in p.items), key=key, reverse=reverse)
    if bound is not None:
        rows = [row for row in rows if before_or_at(key(row), bound)]
    if len(rows) > limit:
        return rows[:limit], key(rows[limit - 1])
    # every row read up to `bound` is taken: the next page starts after it
    return rows, bound


def own_rows(rows: Iterable[T], shard: int, owner: Callable[[T], int] | None) -> list[T]:
    """The rows of shard `shard` whose session is placed there (every row when `owner` is None:
    one Redis, or no placement read)."""
    return list(rows) if owner is None else [row for row in rows if owner(row) == shard]


def session_owner(placement: Placement | None, session_of: Callable[[T], str]) -> Callable[[T], int] | None:
    """`owner` for `merge_parts` from the client's placement (None without one)."""
    if placement is None:
        return None
    return lambda row: placement.shard_of_session(session_of(row))
