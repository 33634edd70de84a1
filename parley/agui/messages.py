"""A session's conversation as AG-UI messages (pure): what a MESSAGES_SNAPSHOT holds.

The snapshot is the active line of the session's tree, from its root to the active head, as
`Client.show` gives it: user messages, assistant messages (with their tool calls, ids
`call-N`) and tool messages, under their Parley ids.
"""

from typing import Any

import orjson
from ag_ui.core import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage, UserMessage


def active_line(view: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages from the root to the active head, oldest first."""
    by_id = {m["id"]: m for m in view.get("messages") or []}
    line: list[dict[str, Any]] = []
    current = by_id.get(view.get("head"))
    while current is not None and len(line) <= len(by_id):  # a loop in the tree ends the walk
        line.append(current)
        current = by_id.get(current.get("parent_id"))
    line.reverse()
    return line


def agui_message(message: dict[str, Any]) -> Message | None:
    """One Parley message in AG-UI's shape (None for a role AG-UI has no message for)."""
    role, content = message.get("role"), str(message.get("content") or "")
    if role == "user":
        return UserMessage(id=message["id"], content=content)
    if role == "tool":
        return ToolMessage(id=message["id"], content=content, tool_call_id=str(message.get("tool_call_id")),
                           error=content if message.get("error") else None)
    if role == "assistant":
        calls = [ToolCall(id=call["id"], function=FunctionCall(
                     name=call["name"], arguments=orjson.dumps(call.get("arguments") or {}).decode()))
                 for call in message.get("tool_calls") or []]
        return AssistantMessage(id=message["id"], content=content or None, tool_calls=calls or None)
    return None


def snapshot_messages(view: dict[str, Any]) -> list[Message]:
    return [m for m in map(agui_message, active_line(view)) if m is not None]
