"""The conversation leading to an interrupt, as the inbox shows it (pure).

A session is a tree of messages (edits and branches); the person answering needs the one path
that led to the question: from the root down to the interrupt's anchor (for a global
interrupt, which has no anchor, down to the session's head). Each step keeps what a reader
needs: who spoke, what was said, the tool calls an assistant asked for (name and arguments)
and which call a tool message answers.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

#: the messages shown at most (the nearest to the question); older ones are counted
MAX_SHOWN = 200


@dataclass(frozen=True)
class ShownCall:
    call_id: str
    name: str
    #: the arguments as indented JSON
    arguments: str


@dataclass(frozen=True)
class ShownMessage:
    message_id: str
    role: str
    content: str
    tool_calls: tuple[ShownCall, ...] = ()
    #: a tool message: the call it answers
    answers_call: str | None = None


@dataclass(frozen=True)
class Conversation:
    messages: tuple[ShownMessage, ...]
    #: messages of the path before the first shown (cut to `MAX_SHOWN`)
    earlier: int = 0


def pretty_json(value: Any) -> str:
    """`value` as indented JSON (keys in their order), for a person to read."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def path_to(messages: Sequence[Mapping[str, Any]], tip: str | None,
            max_shown: int = MAX_SHOWN) -> Conversation:
    """The messages from the root to `tip` (a message id; None or unknown: nothing), root first.
    A parent pointer that loops or names a missing message ends the walk: a damaged record
    shows what it can."""
    by_id = {str(m.get("id")): m for m in messages}
    path: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    current = tip
    while current is not None and current in by_id and current not in seen:
        seen.add(current)
        message = by_id[current]
        path.append(message)
        parent = message.get("parent_id")
        current = None if parent is None else str(parent)
    path.reverse()
    earlier = max(0, len(path) - max_shown)
    return Conversation(tuple(shown(m) for m in path[earlier:]), earlier)


def shown(message: Mapping[str, Any]) -> ShownMessage:
    content = message.get("content")
    calls = message.get("tool_calls") or []
    return ShownMessage(
        message_id=str(message.get("id")),
        role=str(message.get("role") or "?"),
        content=content if isinstance(content, str) else ("" if content is None else pretty_json(content)),
        tool_calls=tuple(ShownCall(str(c.get("id", "")), str(c.get("name", "?")),
                                   pretty_json(c.get("arguments"))) for c in calls if isinstance(c, Mapping)),
        answers_call=None if message.get("tool_call_id") is None else str(message["tool_call_id"]),
    )
