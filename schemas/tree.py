"""A session's message tree: its shape, and queries over it and its open interrupts. Pure: no I/O.

The dispatcher's core decides with them (is this branch parked? is this tip under that
interrupt's anchor?) and `parley show` reports with them, so both read the tree one way.

The SHAPE is the tree without its bodies: for each message, in creation order, its id, its
parent (None: a root) and its turn (the client message that started it). A transition needs
nothing else of most messages, so the dispatcher keeps the shape in the session's meta hash,
beside the core, and never reads the messages hash (docs/design.md, "Storage"). It is stored in
chunks of `CHUNK` messages, fields `tree:0`, `tree:1`, ... of the meta hash, each a flat JSON
list `[id, parent, turn, id, parent, turn, ...]` where parent and turn are POSITIONS in that
creation order (-1: none): a commit rewrites only the chunks its new messages fall in (almost
always the last one), so what it writes does not grow with the session, and a walk to the root
is list indexing, with no map of the whole tree built first.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

from parley.schemas.state import Core

#: Finds a message's parent by the message's id (None: a root, or no such message).
ParentOf = Callable[[str], str | None]
#: Walks from a message to its root: the message, its parent, ... (nothing: no such message).
Ancestors = Callable[[str | None], Iterator[str]]

#: messages per stored chunk: a commit's write of the shape is at most this many entries
CHUNK = 128
#: the meta hash fields of the shape: `tree:<k>`, k = 0, 1, ...
FIELD_PREFIX = "tree:"
#: entries per message in the flat list: id, parent, turn
WIDTH = 3


def field(k: int) -> str:
    return f"{FIELD_PREFIX}{k}"


class Shape:
    """The tree's shape, as the flat list it is stored as (parsed by one `orjson.loads` per chunk):
    what a transition asks of it costs a scan of that list at most, never a map built from it.

    Ids are the only strings of the list (parents and turns are positions), so a message's
    position is where its id first appears: `list.index`, a scan in C.

    `stored`: how many of its messages the meta hash already holds (None: none of it is stored,
    a session from before the shape was kept: the commit writes it whole)."""

    __slots__ = ("_parents", "flat", "stored")

    def __init__(self, flat: list[str | int] | None = None, stored: int | None = None):
        self.flat: list[str | int] = flat if flat is not None else []
        self.stored = stored
        # positions that are some message's parent, gathered on the first `has_child`
        self._parents: set[int] | None = None

    # ---- building -------------------------------------------------------------------------------

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> "Shape | None":
        """The shape from the meta hash's fields (None when it holds none: an older session)."""
        first = fields.get(field(0).encode())
        if first is None:
            return None
        flat: list[str | int] = orjson.loads(first)
        k = 1
        while (chunk := fields.get(field(k).encode())) is not None:
            flat.extend(orjson.loads(chunk))
            k += 1
        return cls(flat, stored=len(flat) // WIDTH)

    @classmethod
    def from_messages(cls, messages: Iterable[dict[str, Any]]) -> "Shape":
        """The shape of stored messages given in creation order, parents first (a session stored
        before the shape was kept, read once whole): nothing of it is stored yet."""
        shape = cls(stored=None)
        at: dict[str, int] = {}
        for m in messages:
            parent, turn = m.get("parent_id"), m.get("turn")
            at[m["id"]] = len(at)
            shape.flat += (m["id"], at.get(parent, -1) if parent is not None else -1,
                           at.get(turn, -1) if turn is not None else -1)
        return shape

    def add(self, mid: str, parent: str | None, turn: str | None) -> None:
        """A new message (its parent and its turn already in the shape, or None)."""
        p = self.position(parent) if parent is not None else None
        # a client's message starts its own turn
        t = len(self) if turn == mid else self.position(turn) if turn is not None else None
        self.flat += (mid, -1 if p is None else p, -1 if t is None else t)
        if self._parents is not None and p is not None:
            self._parents.add(p)

    # ---- what is stored -----------------------------------------------------------------------

    def dirty_fields(self) -> dict[str, bytes]:
        """The meta hash fields to write for the messages added since it was stored: the chunks
        they fall in, whole (a session not yet stored: all of it, `tree:0` even when empty, so
        its next load finds the shape)."""
        n = len(self)
        if self.stored is None:
            first = 0
        elif n == self.stored:
            return {}
        else:
            first = self.stored // CHUNK
        last = max(first, (n - 1) // CHUNK)
        size = CHUNK * WIDTH
        return {field(k): orjson.dumps(self.flat[k * size:(k + 1) * size]) for k in range(first, last + 1)}

    # ---- queries --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.flat) // WIDTH

    def ids(self) -> list[str]:
        return self.flat[0::WIDTH]  # type: ignore[return-value]

    def position(self, mid: str) -> int | None:
        """The message's place in creation order (None: no such message)."""
        try:
            return self.flat.index(mid) // WIDTH
        except ValueError:
            return None

    def has(self, mid: str) -> bool:
        return self.position(mid) is not None

    def _id_at(self, pos: Any) -> str | None:
        return self.flat[pos * WIDTH] if pos >= 0 else None

    def parent_of(self, mid: str) -> str | None:
        pos = self.position(mid)
        return None if pos is None else self._id_at(self.flat[pos * WIDTH + 1])

    def turn_of(self, mid: str) -> str | None:
        pos = self.position(mid)
        return None if pos is None else self._id_at(self.flat[pos * WIDTH + 2])

    def ancestors(self, mid: str | None) -> Iterator[str]:
        """mid, its parent, ... the root: one scan to find mid, then list indexing (O(depth))."""
        pos = self.position(mid) if mid is not None else None
        while pos is not None and pos >= 0:
            yield self.flat[pos * WIDTH]  # type: ignore[misc]
            pos = self.flat[pos * WIDTH + 1]  # type: ignore[assignment]

    def has_child(self, mid: str) -> bool:
        pos = self.position(mid)
        if pos is None:
            return False
        if self._parents is None:
            self._parents = set(self.flat[1::WIDTH])  # type: ignore[arg-type]
        return pos in self._parents

    def branches(self) -> int:
        """Leaves of the tree: messages that are no message's parent."""
        return len(self) - len({p for p in self.flat[1::WIDTH] if p >= 0})  # type: ignore[operator]


def ancestors(parent_of: ParentOf, mid: str | None) -> Iterator[str]:
    """mid, its parent, ... the root: O(depth)."""
    while mid is not None:
        yield mid
        mid = parent_of(mid)


def parking(core: Core, walk: Ancestors, head: str | None) -> list[str]:
    """Ids of the open interrupts that park `head` (I2: a global interrupt parks every head;
    an anchored one parks the heads at or below its anchor)."""
    ids = [i.id for i in core.interrupts.values() if i.anchor is None]
    anchored: dict[str, list[str]] = {}
    for i in core.interrupts.values():
        if i.anchor is not None:
            anchored.setdefault(i.anchor, []).append(i.id)
    if anchored and head is not None:
        for mid in walk(head):
            ids.extend(anchored.get(mid, ()))
    return ids


def in_region(walk: Ancestors, tip: str, anchor: str | None) -> bool:
    """Whether `tip` lies in the region an interrupt anchored at `anchor` parks."""
    return anchor is None or anchor in walk(tip)
