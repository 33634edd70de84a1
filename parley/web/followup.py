"""What the page shows once an answer is delivered (pure): the answer as sent, and what the
session did next, one line per event, read from the session's events after the answer's
`interrupt.resumed`."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from parley.web.forms import APPROVE, DECLINE

#: the session's events after the answer that the page shows at most
MAX_NEXT_EVENTS = 8
#: a message's text in a line at most (the transcript shows it whole)
MAX_TEXT = 160


@dataclass(frozen=True)
class NextEvent:
    #: the event's type (`tool.started`, ...), for the page's markup
    type: str
    #: one line for a person
    text: str


def answer_summary(payload: Any) -> str:
    """The answer as the person gave it: Approved / Declined for the two buttons, else its JSON."""
    if payload == APPROVE:
        return "Approved"
    if payload == DECLINE:
        return "Declined"
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def describe(event: Mapping[str, Any]) -> str | None:
    """One line for an event of the session, or None for one a person need not see here."""
    kind = event.get("type")
    match kind:
        case "message.created":
            found = event.get("message")
            message: Mapping[str, Any] = found if isinstance(found, dict) else {}
            role = message.get("role")
            content = message.get("content") if isinstance(message.get("content"), str) else ""
            calls = message.get("tool_calls") or []
            if role == "assistant" and calls and not content:
                names = ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))
                return f"The model asks for {names}"
            who = {"assistant": "The model replied", "tool": "Tool result", "user": "Message",
                   "system": "System message"}.get(str(role), "Message")
            return f"{who}: {_short(content)}" if content else who
        case "tool.started":
            return f"Tool {event.get('name')} started"
        case "tool.deferred":
            return f"Tool {event.get('name')} waits for its result"
        case "tool.completed":
            if event.get("error"):
                return f"Tool {event.get('name')} failed: {_short(str(event.get('error')))}"
            return f"Tool {event.get('name')} finished"
        case "llm.started":
            return "The model was asked"
        case "llm.failed":
            return f"The model call failed: {_short(str(event.get('error')))}"
        case "interrupt.raised":
            return f"A new question: {event.get('reason')}"
        case "interrupt.resumed":
            return f"Question {event.get('reason')} answered"
        case "decision.failed":
            return f"The app's decision failed: {_short(str(event.get('error')))}"
        case "turn.completed":
            return "The turn is complete"
        case "session.closed":
            return "The session was closed"
        case "input.refused":
            return f"An input was refused ({event.get('code')})"
    return None


def next_events(after_answer: Sequence[Mapping[str, Any]]) -> list[NextEvent]:
    """The lines of the events that followed the answer, in order, at most MAX_NEXT_EVENTS."""
    lines: list[NextEvent] = []
    for event in after_answer:
        text = describe(event)
        if text is not None:
            lines.append(NextEvent(str(event.get("type")), text))
        if len(lines) == MAX_NEXT_EVENTS:
            break
    return lines


def event_of(fields: Any) -> dict[str, Any] | None:
    """The event of a session's events entry (its `event` field holds the JSON); None when it
    holds none that can be read."""
    raw = fields.get(b"event", fields.get("event")) if isinstance(fields, dict) else None
    return event_json(raw)


def event_json(raw: Any) -> dict[str, Any] | None:
    """The JSON object of an entry's `event` field (None: missing, or not an object)."""
    if raw is None:
        return None
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def events_after(entries: Sequence[tuple[str, Mapping[str, Any]]], resume_entry: str) -> \
        tuple[str, list[Mapping[str, Any]]] | None:
    """Of a session's events (id, event), oldest first: the id of the `interrupt.resumed` of the
    resume `resume_entry` and the events after it; None when it is not among them."""
    for n, (event_id, event) in enumerate(entries):
        ref = event.get("input")
        if (event.get("type") == "interrupt.resumed" and isinstance(ref, dict)
                and ref.get("entry") == resume_entry):
            return event_id, [e for _, e in entries[n + 1:]]
    return None
