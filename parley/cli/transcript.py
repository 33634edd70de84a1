"""The text form of `parley show`: a session's message tree, open interrupts and pending work."""

from datetime import UTC, datetime
from typing import Any

import orjson


def format_transcript(view: dict[str, Any]) -> str:
    status = view["status"]
    if view.get("closed_at") is not None:
        closed = datetime.fromtimestamp(view["closed_at"] / 1000, tz=UTC).isoformat(timespec="seconds")
        status += f" (at {closed})"
    lines = [f"session {view['session']}  status={status}  head={view['head']}  parked={view['parked']}"]
    children: dict[str | None, list[dict[str, Any]]] = {}
    for m in view["messages"]:
        children.setdefault(m["parent_id"], []).append(m)

    def walk(parent: str | None, depth: int) -> None:
        for m in children.get(parent, []):
            text = m["content"]
            if m.get("tool_calls"):
                text = (text + " " if text else "") + ", ".join(
                    f"{c['name']}({orjson.dumps(c['arguments']).decode()}) [{c['id']}]"
                    for c in m["tool_calls"])
            if m.get("tool_call_id"):
                text = f"[{m['tool_call_id']}{' error' if m.get('error') else ''}] {text}"
            marker = "*" if m["id"] == view["head"] else " "
            lines.append(f"{marker}{'  ' * depth}{m['id']:>7} {m['role']:<9} {text}")
            walk(m["id"], depth + 1)

    walk(None, 0)
    for i in view["interrupts"]:
        lines.append(f"  interrupt {i['interrupt_id']} ({i['reason']}) at {i['anchor']}: "
                     f"{orjson.dumps(i['payload']).decode()}")
    for p in view["pending"]:
        lines.append(f"  pending {p['call_id']} {p['kind']} {p['name'] or ''}")
    return "\n".join(lines)
