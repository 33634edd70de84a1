"""The reader's view of a session: what `parley show --json` prints and `Client.show` returns."""

from operator import itemgetter
from typing import Any

from parley.schemas.listing import listing_status
from parley.schemas.state import SessionState
from parley.schemas.tree import ParentOf, ancestors, parking

#: A stored message's own bookkeeping: its turn, its place in creation order.
INTERNAL_FIELDS = frozenset({"turn", "order"})


def public_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A stored message without the engine's bookkeeping (a copy, then two pops: a third of the
    time of a filtered comprehension, which `parley show` paid per message)."""
    out = dict(msg)
    for name in INTERNAL_FIELDS:
        out.pop(name, None)
    return out


def show(state: SessionState) -> dict[str, Any]:
    """The view of a loaded session (docs/protocol.md, "Reading a session")."""
    core = state.core
    assert core is not None
    messages = creation_order(state.messages)
    return {
        "session": core.session,
        # open with no interrupt waiting (active), open with one (parked), or closed: the
        # session's place in the list of sessions (schemas/listing.py)
        "status": listing_status(core).value,
        "closed_at": core.closed_at,
        "head": core.head,
        "parked": bool(parking(core, lambda mid: ancestors(_parent_in(state), mid), core.head))
        if core.head else any(i.anchor is None for i in core.interrupts.values()),
        "messages": [public_message(m) for m in messages],
        "interrupts": [{"interrupt_id": i.id, "reason": i.reason, "payload": i.payload,
                        "anchor": i.anchor, "status": "open"} for i in core.interrupts.values()],
        "pending": [{"call_id": w.id, "kind": w.kind, "name": w.name} for w in core.work.values()],
        "children": list(core.children),
        "parent": core.parent["session"] if core.parent else None,
    }


def _parent_in(state: SessionState) -> ParentOf:
    return lambda mid: (state.messages.get(mid) or {}).get("parent_id")


def creation_order(messages: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the order they were created: by their `order`, and always a parent before
    its children."""
    values = list(messages.values())
    if all("order" in m for m in values):
        # a parent is always created before its children: the order alone puts it first
        return sorted(values, key=itemgetter("order"))
    out: list[dict[str, Any]] = []
    placed: set[str] = set()
    # children met before their parent (only possible for messages stored without `order`)
    waiting: dict[str, list[dict[str, Any]]] = {}
    for m in sorted(messages.values(), key=_created):
        parent = m.get("parent_id")
        if parent is not None and parent in messages and parent not in placed:
            waiting.setdefault(parent, []).append(m)
            continue
        stack = [m]
        while stack:
            item = stack.pop()
            out.append(item)
            placed.add(item["id"])
            stack.extend(reversed(waiting.pop(item["id"], [])))
    return out


def _created(m: dict[str, Any]) -> tuple[int, int, str]:
    """A message's place in creation order. Messages stored before they carried `order` were all
    created before any that has one; among them, minted `msg-N` go by N, chosen ids after them."""
    if "order" in m:
        return (1, m["order"], "")
    kind, _, n = str(m["id"]).rpartition("-")
    return (0, int(n) if kind == "msg" and n.isdigit() else 1 << 30, m["id"])
