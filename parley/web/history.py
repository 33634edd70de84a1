"""The inbox's history (pure): the questions that ended, who answered them, when and how, read
from the audit events the engine already writes (docs/inbox.md, "History").

Two readings, each bounded per page:

- **One session** (`/history?session=S`): the session's own events stream
  (`parley:{S}:events`), newest first, `SESSION_EVENTS` events a page. Its `interrupt.resumed`
  and `interrupt.cancelled` events are the rows; each carries the question it ends (`reason`,
  and the question's payload as `request`), so a row needs nothing older than itself. The
  `interrupt.raised` events in the same page only add when the question was asked.
- **One approver** (`/history?principal=P`): every shard's feed (`parley:feed`), which holds
  the same events for every session and is capped (about 100,000 entries a shard). There is no
  index of answers by principal, and the inbox's Redis login may only read, so nothing is
  written to make one: each page reads at most `FEED_SCAN` of a shard's feed entries, newest
  first, and keeps the `interrupt.resumed` events signed by P. The shards' parts are merged
  newest first by the feed's own stream ids (parley/client/fanout.py, the list's merge); the
  cursor of the next page is one position in that order, applied to every shard.

The routes (parley/web/routes/history.py) do the reading; everything here takes the replies
and returns typed rows.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError

from parley.client.fanout import ShardPart, merge_parts
from parley.schemas.events import InterruptCancelled, InterruptRaised, InterruptResumed
from parley.schemas.ids import is_session_id
from parley.web.conversation import pretty_json
from parley.web.followup import event_json
from parley.web.live.replies import stream_id, text_of
from parley.web.query import QueryError

#: a session id (up to 256 characters, docs/protocol.md "Ids") or a principal at most
MAX_QUERY = 256
#: a session's events read for one page of its history (a stream keeps about 10,000)
SESSION_EVENTS = 2_000
#: a principal's answers on one page
PAGE_ROWS = 50
#: one shard's feed entries read for one page of a principal's history at most
FEED_SCAN = 5_000
#: feed entries asked for in one XREVRANGE
FEED_CHUNK = 500



@dataclass(frozen=True, slots=True)
class Bounds:
    """How much one page of history reads (the constants above; tests make them small)."""

    session_events: int = SESSION_EVENTS
    page_rows: int = PAGE_ROWS
    feed_scan: int = FEED_SCAN
    feed_chunk: int = FEED_CHUNK


_SESSION_CURSOR = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_FEED_CURSOR = re.compile(r"^(\d{1,20})-(\d{1,20})-(\d{1,4})$")


class Ending(StrEnum):
    """How a question ended (the row's `data-ending`)."""

    #: resumed by an `interrupt.resume` (signed: `principal` says by whom)
    ANSWERED = "answered"
    #: its deadline passed: resumed with its `default`
    DEADLINE = "deadline"
    #: it will never be answered: its session closed, or its call was settled without it
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One question that ended."""

    session: str
    interrupt_id: str
    #: the question's reason (None only in events older than the release that reported it)
    reason: str | None
    #: the question's payload (what it asked)
    request: Any
    ending: Ending
    #: when it ended (Unix ms, the dispatcher's clock)
    ended_at: int
    #: who answered: the verified signer (None: an unsigned resume, a deadline, a cancel)
    principal: str | None = None
    #: the answer (the deadline's `default` for DEADLINE; None when CANCELLED)
    answer: Any = None
    #: whether the answer reached `decide` at once (False: its branch was not the active one)
    delivered: bool | None = None
    #: CANCELLED: why (the session's close reason, or `call_settled`)
    why: str | None = None
    #: when it was asked, when its `interrupt.raised` was among the events read
    raised_at: int | None = None
    #: where the ending event sorts in what was read (`position_key`): the merge order
    position: str = ""

    @property
    def message(self) -> str | None:
        """The question's `message`, when its payload has one (what a person reads first)."""
        if isinstance(self.request, Mapping) and isinstance(self.request.get("message"), str):
            return str(self.request["message"])
        return None

    @property
    def request_json(self) -> str:
        return pretty_json(self.request)

    @property
    def answer_json(self) -> str:
        return pretty_json(self.answer)

    @property
    def ended_iso(self) -> str:
        return iso(self.ended_at)

    @property
    def ended_text(self) -> str:
        return clock(self.ended_at)


def iso(ms: int) -> str:
    """A time for `<time datetime=...>`: ISO 8601, UTC."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def clock(ms: int) -> str:
    """A time for a person, in UTC (the server does not know the reader's zone): `2026-07-28 14:03:05 UTC`."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- the query -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedPosition:
    """A position in the merged feeds of every shard, newest first: a feed entry's id and its
    shard. Entries of two shards may share an id (two Redis clocks), so the shard breaks ties."""

    ms: int
    seq: int
    shard: int

    @classmethod
    def of(cls, entry_id: str, shard: int) -> "FeedPosition":
        ms, seq = stream_id(entry_id)
        return cls(ms, seq, shard)

    @classmethod
    def parse(cls, text: str) -> "FeedPosition":
        match = _FEED_CURSOR.fullmatch(text)
        if match is None:
            raise QueryError("before must be a position of this page's Older link")
        return cls(int(match[1]), int(match[2]), int(match[3]))

    @property
    def stream_id(self) -> str:
        return f"{self.ms}-{self.seq}"

    @property
    def text(self) -> str:
        """The position as the `before` of the next page's URL."""
        return f"{self.ms}-{self.seq}-{self.shard}"

    @property
    def key(self) -> str:
        """A text whose byte order is this order (ids' numbers zero-padded: `9-0` < `10-0`)."""
        return position_key(self.ms, self.seq, self.shard)


def position_key(ms: int, seq: int, shard: int = 0) -> str:
    return f"{ms:020d}-{seq:020d}-{shard:04d}"


def _principal(value: str) -> str:
    if not value.isprintable() or value != value.strip():
        raise QueryError("principal has no control characters, and no spaces at either end")
    return value


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """`/history`'s query string: a session, a principal, or both (that session's answers by
    that principal), and where the page starts (`before`: the Older link's position)."""

    session: str | None = None
    principal: str | None = None
    before: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> "HistoryQuery":
        session, principal = params.get("session") or None, params.get("principal") or None
        before = params.get("before") or None
        for name, value in (("session", session), ("principal", principal), ("before", before)):
            if value is not None and len(value) > MAX_QUERY:
                raise QueryError(f"{name} is at most {MAX_QUERY} characters")
        if session is None and principal is None:
            raise QueryError("name a session (/history?session=S) or a person (/history?principal=P)")
        if session is not None and not is_session_id(session, producer=False):
            raise QueryError("session is not a session id (1-256 characters of A-Z a-z 0-9 . _ : / -)")
        if principal is not None:
            _principal(principal)
        if before is not None:
            if session is not None and _SESSION_CURSOR.fullmatch(before) is None:
                raise QueryError("before must be an event id of this page's Older link")
            if session is None:
                FeedPosition.parse(before)
        return cls(session, principal, before)

    @property
    def by_session(self) -> bool:
        return self.session is not None

    def older(self, before: str) -> str:
        """The URL of the page after this one, starting after `before`."""
        params = {k: v for k, v in (("session", self.session), ("principal", self.principal)) if v}
        return "/history?" + urlencode({**params, "before": before})


# --- events into rows ------------------------------------------------------------------------


def known(model: type[BaseModel], event: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `event` that `model` has: the event models refuse fields they do not know
    (the engine must write none), but a reader of history must go on reading the events of a
    newer release that adds one."""
    return {name: value for name, value in event.items() if name in model.model_fields}


def ending_of(session: str, event: Mapping[str, Any], position: str = "") -> HistoryRow | None:
    """The row of an event that ends a question (`interrupt.resumed`, `interrupt.cancelled`);
    None for any other event, and for one that does not read as its model (it is counted as
    unreadable by the callers, never shown half)."""
    kind = event.get("type")
    try:
        if kind == "interrupt.resumed":
            resumed = InterruptResumed.model_validate(known(InterruptResumed, event), strict=True)
            return HistoryRow(session, resumed.interrupt_id, resumed.reason, resumed.request,
                              Ending.DEADLINE if resumed.timed_out else Ending.ANSWERED, resumed.at,
                              principal=resumed.principal, answer=resumed.payload,
                              delivered=resumed.delivered, position=position)
        if kind == "interrupt.cancelled":
            cancelled = InterruptCancelled.model_validate(known(InterruptCancelled, event), strict=True)
            return HistoryRow(session, cancelled.interrupt_id, cancelled.reason, cancelled.request,
                              Ending.CANCELLED, cancelled.at, why=cancelled.why, position=position)
    except ValidationError:
        return None
    return None


def is_ending(event: Mapping[str, Any]) -> bool:
    return event.get("type") in ("interrupt.resumed", "interrupt.cancelled")


def stream_entries(reply: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """An XRANGE / XREVRANGE reply of a session's events as (id, event; None when the entry
    holds no JSON object)."""
    entries: list[tuple[str, dict[str, Any] | None]] = []
    for entry_id, fields in reply or []:
        named = {text_of(k): v for k, v in (fields or {}).items()}
        entries.append((text_of(entry_id), event_json(named.get("event"))))
    return entries


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """What `/history` shows: its rows, newest first, and what it could not show."""

    rows: tuple[HistoryRow, ...]
    #: the `before` of the next (older) page; None: nothing older was left unread
    older: str | None = None
    #: ending events that could not be read (shown as a count, never as a half row)
    unreadable: int = 0
    #: a session's: the oldest event read is not its first one (its stream was trimmed)
    trimmed: bool = False
    #: an approver's: the feeds are complete from then on (Unix ms; None: every feed is empty)
    feed_since: int | None = None
    #: entries read to make the page
    read: int = 0

    @property
    def feed_since_iso(self) -> str | None:
        return None if self.feed_since is None else iso(self.feed_since)

    @property
    def feed_since_text(self) -> str | None:
        return None if self.feed_since is None else clock(self.feed_since)


def session_history(session: str, entries: Sequence[tuple[str, dict[str, Any] | None]],
                    limit: int = SESSION_EVENTS, principal: str | None = None) -> HistoryPage:
    """One page of a session's history from its events read newest first, `limit` of them and
    one more when there are more (so the page knows whether to offer older ones). `principal`:
    only the answers it gave."""
    more = len(entries) > limit
    shown = list(entries[:limit])
    rows: list[HistoryRow] = []
    unreadable = 0
    asked: dict[str, int] = {}
    # oldest first, so that each ending meets the latest raise of its id before it (an app may
    # name its own interrupt ids, and ask again under one that ended)
    for entry_id, event in reversed(shown):
        if event is None:
            continue
        if event.get("type") == "interrupt.raised":
            try:
                raised = InterruptRaised.model_validate(known(InterruptRaised, event), strict=True)
            except ValidationError:
                continue
            asked[raised.interrupt_id] = raised.at
            continue
        if not is_ending(event):
            continue
        ms, seq = stream_id(entry_id)
        row = ending_of(session, event, position_key(ms, seq))
        if row is None:
            unreadable += 1
            continue
        raised_at = asked.pop(row.interrupt_id, None)
        if principal is None or row.principal == principal:
            rows.append(replace(row, raised_at=raised_at))
    rows.reverse()
    oldest = shown[-1][1] if shown else None
    trimmed = not more and bool(shown) and (oldest is None or oldest.get("type") != "session.created")
    return HistoryPage(tuple(rows), older=shown[-1][0] if more and shown else None, unreadable=unreadable,
                       trimmed=trimmed, read=len(shown))


# --- a principal's answers across the shards' feeds ----------------------------------------


@dataclass
class FeedScan:
    """One shard's part of a page of `principal`'s answers, read newest first from `before`
    (None: the newest entry), without I/O: `request()` says what to read next (the XREVRANGE
    `max` and `count`; None: done), `take()` is given its reply.

    It stops at `limit` answers (more would not be shown), at `budget` entries read (the
    page's bound), or at the start of the shard's feed."""

    principal: str
    shard: int
    before: FeedPosition | None = None
    limit: int = PAGE_ROWS
    budget: int = FEED_SCAN
    chunk: int = FEED_CHUNK
    rows: list[HistoryRow] = field(default_factory=list)
    scanned: int = 0
    unreadable: int = 0
    #: the key of the last entry read (where a next page would go on)
    last: str | None = None
    #: the feed's start was reached (nothing older is left on this shard)
    start_reached: bool = False
    _next_max: str | None = None

    def __post_init__(self) -> None:
        # The first read includes `before`'s own id: an entry of this shard with the same id
        # but a lower shard number sorts after the position (and `take` drops the others).
        self._next_max = "+" if self.before is None else self.before.stream_id

    @property
    def done(self) -> bool:
        return self.start_reached or len(self.rows) >= self.limit or self.scanned >= self.budget

    def request(self) -> tuple[str, int] | None:
        if self.done or self._next_max is None:
            return None
        return self._next_max, min(self.chunk, self.budget - self.scanned)

    def take(self, reply: Sequence[tuple[Any, Any]]) -> None:
        asked = self.request()
        assert asked is not None, "take() after the scan is done"
        entries = list(reply or [])
        for raw_id, fields in entries:
            entry_id = text_of(raw_id)
            position = FeedPosition.of(entry_id, self.shard)
            self._next_max = "(" + entry_id
            if self.before is not None and position.key >= self.before.key:
                continue  # the page before this one showed it (or left it to this page's top)
            self.scanned += 1
            self.last = position.key
            row = self._row_of(position, fields)
            if row is not None:
                self.rows.append(row)
                if len(self.rows) >= self.limit:
                    return
            if self.scanned >= self.budget:
                return
        if len(entries) < asked[1]:
            self.start_reached = True

    def _row_of(self, position: FeedPosition, fields: Any) -> HistoryRow | None:
        named = {text_of(k): v for k, v in (fields or {}).items()}
        # the entry's `type` says what it is without parsing its event: most are not answers
        if text_of(named.get("type", b"")) != "interrupt.resumed":
            return None
        event = event_json(named.get("event"))
        row = None if event is None else ending_of(text_of(named.get("session", b"")), event, position.key)
        if row is None or not row.session:
            self.unreadable += 1
            return None
        return row if row.principal == self.principal and row.ending is Ending.ANSWERED else None

    def part(self) -> ShardPart[HistoryRow]:
        """This shard's rows and how far it was read (None: to the feed's start), for
        `principal_history`."""
        return ShardPart(list(self.rows), None if self.start_reached else self.last)


def principal_history(scans: Iterable[FeedScan], firsts: Sequence[Any] = (), limit: int = PAGE_ROWS
                      ) -> HistoryPage:
    """One page of a principal's answers: the shards' scans merged newest first. Rows are taken
    only down to where every shard has been read (a shard whose scan stopped early has not been
    read past its position); the next page goes on from there, or from the last row taken.
    `firsts`: the id of each shard's oldest feed entry (None: an empty feed), for how far back
    the feeds reach."""
    scans = list(scans)
    rows, after = merge_parts([s.part() for s in scans], key=lambda row: row.position, limit=limit,
                              reverse=True)
    # Every shard's feed is complete from its oldest entry on; together, from the youngest of
    # those: before it, a shard's answers may be trimmed already.
    starts = [stream_id(first)[0] for first in firsts if first is not None]
    return HistoryPage(tuple(rows), older=None if after is None else _position_of_key(after).text,
                       unreadable=sum(s.unreadable for s in scans),
                       feed_since=max(starts) if starts else None, read=sum(s.scanned for s in scans))


def _position_of_key(key: str) -> FeedPosition:
    ms, seq, shard = key.split("-")
    return FeedPosition(int(ms), int(seq), int(shard))
