"""An entry of the fleet-wide feed (`parley:feed`), as the commit script writes it: what every
reader of the feed parses, the webhook notifier (parley/fleet/notify.py) and the inbox page's
live updates (parley/web/live/) alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


class FeedEntryError(ValueError):
    """A feed entry that cannot be forwarded as it is (not written by the commit script)."""


@dataclass(frozen=True, slots=True)
class FeedEntry:
    """One entry of the feed: which session, which event, and the event whole."""

    entry_id: str
    session: str
    type: str
    event_id: str
    event: dict[str, Any]

    def body(self) -> bytes:
        """The JSON document POSTed for this entry."""
        return orjson.dumps({"id": self.entry_id, "session": self.session, "type": self.type,
                             "event_id": self.event_id, "event": self.event})


def text(value: Any) -> str:
    """A reply value as text (bytes decoded, anything else as `str`)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_entry(entry_id: Any, fields: dict[Any, Any]) -> FeedEntry:
    """The feed entry of a stream reply, or FeedEntryError saying what is wrong with it."""
    named = {text(k): v for k, v in fields.items()}
    missing = [f for f in ("session", "type", "event_id", "event") if f not in named]
    if missing:
        raise FeedEntryError(f"feed entry {text(entry_id)} lacks {', '.join(missing)}")
    try:
        event = orjson.loads(named["event"])
    except orjson.JSONDecodeError as exc:
        raise FeedEntryError(f"feed entry {text(entry_id)}: event is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise FeedEntryError(f"feed entry {text(entry_id)}: event is not a JSON object")
    return FeedEntry(text(entry_id), text(named["session"]), text(named["type"]),
                     text(named["event_id"]), event)
