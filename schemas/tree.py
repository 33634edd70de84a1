"""Queries over a session's message tree and its open interrupts. Pure: no I/O, no mutation.

The dispatcher's core decides with them (is this branch parked? is this tip under that
interrupt's anchor?) and `parley show` reports with them, so both read the tree one way."""

from collections.abc import Callable, Iterator
from typing import Any

from parley.schemas.state import Core

#: Finds a message by id (None when there is no such message).
MessageLookup = Callable[[str], dict[str, Any] | None]


def ancestors(lookup: MessageLookup, mid: str | None) -> Iterator[str]:
    """mid, its parent, ... the root: O(depth)."""
    while mid is not None:
        yield mid
        m = lookup(mid)
        mid = m.get("parent_id") if m else None


def parking(core: Core, lookup: MessageLookup, head: str | None) -> list[str]:
    """Ids of the open interrupts that park `head` (I2: a global interrupt parks every head;
    an anchored one parks the heads at or below its anchor)."""
    ids = [i.id for i in core.interrupts.values() if i.anchor is None]
    anchored: dict[str, list[str]] = {}
    for i in core.interrupts.values():
        if i.anchor is not None:
            anchored.setdefault(i.anchor, []).append(i.id)
    if anchored and head is not None:
        for mid in ancestors(lookup, head):
            ids.extend(anchored.get(mid, ()))
    return ids


def in_region(lookup: MessageLookup, tip: str, anchor: str | None) -> bool:
    """Whether `tip` lies in the region an interrupt anchored at `anchor` parks."""
    return anchor is None or anchor in ancestors(lookup, tip)
