"""The reader's view of a session: what `parley show --json` prints and `Client.show` returns."""

from typing import Any

from parley.schemas.state import SessionState
from parley.schemas.tree import parking


def public_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A stored message without the engine's bookkeeping (its turn)."""
    return {k: v for k, v in msg.items() if k != "turn"}


def show(state: SessionState) -> dict[str, Any]:
    """The view of a loaded session (docs/protocol.md, "Reading a session")."""
    core = state.core
    assert core is not None
    messages = sorted(state.messages.values(), key=_message_order)
    return {
        "session": core.session,
        "head": core.head,
        "parked": bool(parking(core, state.messages.get, core.head)) if core.head else any(
            i.anchor is None for i in core.interrupts.values()),
        "messages": [public_message(m) for m in messages],
        "interrupts": [{"interrupt_id": i.id, "reason": i.reason, "payload": i.payload,
                        "anchor": i.anchor, "status": "open"} for i in core.interrupts.values()],
        "pending": [{"call_id": w.id, "kind": w.kind, "name": w.name} for w in core.work.values()],
        "children": list(core.children),
        "parent": core.parent["session"] if core.parent else None,
    }


def _message_order(m: dict[str, Any]) -> tuple[int, str]:
    """Engine-minted `msg-N` in N order; ids a producer chose after them, by id."""
    kind, _, n = str(m["id"]).rpartition("-")
    return (int(n) if kind == "msg" and n.isdigit() else 1 << 30, m["id"])
