"""The changes the inbox follows in the feed, and which page wants which (pure).

`interrupt.raised` is a `Change` of kind `raised`; `interrupt.resumed` (answered here or
elsewhere, or its deadline passed) and `interrupt.cancelled` are `gone`; RESET tells a page it
missed changes (it reloads). `shown_by` spares the lookup of a raised row a page's filters drop
anyway; `since_of` reads the page's render time from its event stream's URL."""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from parley.client.feed import FeedEntry, FeedEntryError
from parley.client.inbox import InterruptFilter
from parley.web.live.replies import stream_id

RAISED_TYPE = "interrupt.raised"
GONE_TYPES = frozenset({"interrupt.resumed", "interrupt.cancelled"})


class ChangeKind(StrEnum):
    RAISED = "raised"
    GONE = "gone"
    #: the subscriber missed changes: reload the page
    RESET = "reset"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    session: str = ""
    interrupt_id: str = ""
    #: the feed's event, whole (empty for RESET)
    event: dict[str, Any] | None = None
    #: the feed entry's time (the ms of its id; 0 for RESET)
    at_ms: int = 0

    @property
    def timed_out(self) -> bool:
        """A GONE change because the interrupt's deadline passed (not answered by anyone)."""
        return bool(self.event and self.event.get("timed_out") is True)

    @property
    def type(self) -> str:
        """The feed event's type (`interrupt.resumed`, ...); empty for RESET."""
        return str(self.event.get("type", "")) if self.event else ""


RESET = Change(ChangeKind.RESET)


def change_of(entry: FeedEntry) -> Change | None:
    """The change a feed entry makes to the inbox: None for the types it does not follow
    (`turn.completed`); FeedEntryError for an interrupt event without an interrupt id."""
    if entry.type == RAISED_TYPE:
        kind = ChangeKind.RAISED
    elif entry.type in GONE_TYPES:
        kind = ChangeKind.GONE
    else:
        return None
    interrupt_id = entry.event.get("interrupt_id")
    if not isinstance(interrupt_id, str) or not interrupt_id:
        raise FeedEntryError(f"feed entry {entry.entry_id} ({entry.type}): no interrupt_id")
    if not entry.session:
        raise FeedEntryError(f"feed entry {entry.entry_id} ({entry.type}): no session")
    try:
        at_ms = stream_id(entry.entry_id)[0]
    except ValueError:
        raise FeedEntryError(f"feed entry {entry.entry_id!r} ({entry.type}): not a stream id") from None
    return Change(kind, entry.session, interrupt_id, entry.event, at_ms)


def shown_by(where: InterruptFilter, change: Change) -> bool:
    """Whether a page's filters may show a raised row, by what the feed's event tells (reason,
    session): False spares the lookup of a row the page drops anyway."""
    if where.session_prefix is not None and not change.session.startswith(where.session_prefix):
        return False
    reason = change.event.get("reason") if change.event else None
    return where.reason is None or not isinstance(reason, str) or reason == where.reason


def since_of(value: str | None) -> int | None:
    """The `since` of an event stream's URL (the page's render time, Unix ms): None when not
    given; ValueError when not a whole number of ms."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 15:
        raise ValueError(f"since must be a time in Unix ms, not {value[:40]!r}")
    return int(value)
