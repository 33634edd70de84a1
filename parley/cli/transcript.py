"""The text form of `parley show`: a session's message tree, open interrupts and pending work.

The tree is walked from its roots, depth first, in creation order. A message's only child
continues its line of the conversation at the same indentation; where the tree forks, each
child's subtree is indented one step more. So a long branch stays flush left (its lines do not
grow with its length), and the walk is a loop, not a recursion (a 3,000-message branch is
3,000 levels deep).
"""

from datetime import UTC, datetime
from typing import Any

import orjson


def _text(m: dict[str, Any]) -> tuple[str, str, str]:
    """What follows a message's id and role: (before its content, its content, after it), so
    that the content itself is copied once, by the final join."""
    before = f"[{m['tool_call_id']}{' error' if m.get('error') else ''}] " if m.get("tool_call_id") else ""
    after = ""
    failure = m.get("exception")
    if isinstance(failure, dict):
        # what the app's code raised: its type, message and where (the innermost app frame)
        frames = failure.get("frames") or []
        where = f" at {frames[-1]}" if frames else ""
        after = f"  ({failure.get('type')}: {failure.get('message')}{where})"
    if m.get("tool_calls"):
        after = (" " if m["content"] else "") + ", ".join(
            f"{c['name']}({orjson.dumps(c['arguments']).decode()}) [{c['id']}]"
            for c in m["tool_calls"])
    return before, m["content"], after


def format_transcript(view: dict[str, Any]) -> str:
    status = view["status"]
    if view.get("closed_at") is not None:
        closed = datetime.fromtimestamp(view["closed_at"] / 1000, tz=UTC).isoformat(timespec="seconds")
        status += f" (at {closed})"
    # the text of each message goes in as it is (one copy of it, by the final join: a message
    # may be kilobytes)
    lines = [f"session {view['session']}  status={status}  head={view['head']}  parked={view['parked']}"]
    children: dict[str | None, list[dict[str, Any]]] = {}
    for m in view["messages"]:
        children.setdefault(m["parent_id"], []).append(m)
    head = view["head"]
    # (message, depth), the next one to print on top
    stack: list[tuple[dict[str, Any], int]] = []

    def push(parent: str | None, depth: int) -> None:
        under = children.get(parent, [])
        step = 1 if len(under) > 1 and parent is not None else 0
        stack.extend((m, depth + step) for m in reversed(under))

    push(None, 0)
    while stack:
        m, depth = stack.pop()
        marker = "*" if m["id"] == head else " "
        before, content, after = _text(m)
        lines.append(f"\n{marker}{'  ' * depth}{m['id']:>7} {m['role']:<9} {before}")
        lines.append(content)
        if after:
            lines.append(after)
        push(m["id"], depth)
    for i in view["interrupts"]:
        lines.append(f"\n  interrupt {i['interrupt_id']} ({i['reason']}) at {i['anchor']}: "
                     f"{orjson.dumps(i['payload']).decode()}")
    for p in view["pending"]:
        lines.append(f"\n  pending {p['call_id']} {p['kind']} {p['name'] or ''}")
    return "".join(lines)
