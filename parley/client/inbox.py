"""The listing of open interrupts across sessions (`parley interrupts`, `Client.interrupts`).

The index (dispatcher/lua/index_add.lua) keeps, besides the details of each open interrupt,
secondary sorted sets whose members sort by what a listing walks: by raise time (all, per
reason, per principal that may answer, and "anyone may answer"), and by session id. A page is
one range read of one of them (ZRANGE BYLEX after the cursor, or BYLEX REV before it for newest
first) and one HMGET of the rows: O(log n + page), whatever the number of open interrupts.
Filters the driving set does not cover are checked on the rows it yields, within a bounded scan
(`SCAN_FACTOR` x the page).
"""

import base64
import binascii
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from pydantic import BaseModel, field_validator
from redis import Redis

from parley.client.fanout import ShardPart, merge_parts, own_rows, session_owner
from parley.client.producer import Call, Steps, run_steps
from parley.schemas.keys import Keys
from parley.schemas.shards import Placement

SEP = "\x1f"
#: raise times are written as 15 digits, so byte order is time order (Unix ms until year 33658)
TIME_DIGITS = 15
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000
#: a page scans at most this many times its size when filters combine; then it stops short,
#: with a cursor to go on from
SCAN_FACTOR = 10


class OpenInterrupt(BaseModel):
    """One open interrupt, as an inbox shows it (docs/protocol.md)."""

    session: str
    interrupt_id: str
    reason: str
    #: the interrupt's own payload: what it asks
    request: Any = None
    anchor: str | None = None
    raised_at: int
    #: Unix ms of its deadline (its timeout); the deadline resumes it with `default`
    expires_at: int | None = None
    default: Any = None
    #: the principals that may resume it; null: anyone
    resumable_by: list[str] | None = None
    response_schema: dict[str, Any] | None = None
    #: the session's metadata when the interrupt was raised (a snapshot)
    metadata: dict[str, Any] | None = None
    parent: str | None = None

    @field_validator("resumable_by", mode="before")
    @classmethod
    def _empty_list(cls, value: Any) -> Any:
        # Redis's cjson writes an empty list as {} (the rebuild rewrites older rows with it):
        # an empty object here is the empty list, nobody may answer
        return [] if value == {} else value

    @classmethod
    def from_details(cls, raw: bytes | str) -> "OpenInterrupt":
        """A row of the index's details hash; fields a row lacks (an older dispatcher's whose
        session record was gone at the rebuild) read as null."""
        return cls.model_validate_json(raw)


class InterruptPage(BaseModel):
    items: list[OpenInterrupt]
    #: pass it back for the next page; null: nothing more. A page may hold fewer rows than
    #: asked (even none) with a cursor when combined filters stopped its scan.
    cursor: str | None = None
    #: with several shards, those that did not answer: the page is of the others' rows
    unreachable: list[int] = []


@dataclass(frozen=True, slots=True)
class InterruptFilter:
    reason: str | None = None
    session_prefix: str | None = None
    #: Unix ms: only interrupts raised before it (`--older-than` is now minus that)
    raised_before: int | None = None
    #: only interrupts this principal may resume (its own, and those anyone may)
    principal: str | None = None
    #: newest first: by raise time descending, or by session id descending with a session prefix
    #: (the default is oldest first)
    newest_first: bool = False
    #: words that must each appear, in any case, in the interrupt's reason, its session id or its
    #: payload (`request`, as JSON text); checked on the rows the driving set yields
    text: str | None = None

    def matches(self, row: OpenInterrupt) -> bool:
        return ((self.reason is None or row.reason == self.reason)
                and (self.session_prefix is None or row.session.startswith(self.session_prefix))
                and (self.raised_before is None or row.raised_at < self.raised_before)
                and (self.principal is None or self.may_answer(row.resumable_by))
                and (self.text is None or text_matches(self.text, row)))

    def may_answer(self, resumable_by: list[str] | None) -> bool:
        return resumable_by is None or self.principal in resumable_by

    def fingerprint(self) -> list[str | bool | None]:
        """What a cursor must be used with: the filters that choose the driving set, and the
        order (a position means "after" in one and "before" in the other). `raised_before` is
        not in it: `--older-than` is recomputed from now on every page."""
        return [self.reason, self.session_prefix, self.principal, self.newest_first, self.text]


def search_words(text: str) -> list[str]:
    """The words of a search, case-folded: every one must be found (an empty search finds all)."""
    return text.casefold().split()


def searched_text(row: OpenInterrupt) -> str:
    """What a search looks in, case-folded, one piece a line: the reason, the session id, and
    the payload's keys and values (as written, not as JSON: a word with a quote in it is found,
    and `{` or `:` finds nothing that only JSON's punctuation holds)."""
    return "\n".join((row.reason, row.session, *payload_texts(row.request))).casefold()


def payload_texts(value: Any) -> list[str]:
    """Every key and scalar value of a JSON value, in order (without recursion: a payload may
    nest deeper than Python's stack)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                stack.append(inner)
                stack.append(_Key(str(key)))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, _Key):
            out.append(item.text)
        elif isinstance(item, bool):
            out.append("true" if item else "false")
        elif item is not None:
            out.append(str(item))
    return out


@dataclass(frozen=True, slots=True)
class _Key:
    """A payload's key on `payload_texts`' stack (told apart from a string value there)."""

    text: str


def text_matches(text: str, row: OpenInterrupt) -> bool:
    haystack = searched_text(row)
    return all(word in haystack for word in search_words(text))


class Driver(StrEnum):
    """The secondary set a listing walks."""

    TIME = "time"
    REASON = "reason"
    PRINCIPAL = "principal"  # the principal's set merged with "anyone"
    SESSION = "session"


# ---- members (index_lib.lua builds the same) --------------------------------------------------

def time_member(raised_at: int, session: str, interrupt_id: str) -> str:
    return f"{raised_at:0{TIME_DIGITS}d}{SEP}{session}{SEP}{interrupt_id}"


def index_member_of(member: str, driver: Driver) -> str:
    """The details hash's member (`session SEP interrupt_id`) of a secondary set's member."""
    first, second, third = member.split(SEP, 2)
    if driver is Driver.SESSION:  # session SEP time SEP id
        return f"{first}{SEP}{third}"
    return f"{second}{SEP}{third}"  # time SEP session SEP id


def one_interrupt_steps(keys: Keys, session: str, interrupt_id: str) -> Steps:
    """One open interrupt's row (None: not open, or no such interrupt): one HMGET of the index's
    details, on the session's shard."""
    (raw,) = (yield [Call("hmget", (keys.interrupt_info, [f"{session}{SEP}{interrupt_id}"]))])[0]
    return None if raw is None else OpenInterrupt.from_details(raw)


# ---- cursors ------------------------------------------------------------------------------------

def encode_token(value: Any) -> str:
    """A cursor's text: its JSON, base64url without padding (shared with parley/client/sessions.py)."""
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


def decode_token(text: str) -> Any:
    """The JSON of a cursor's text; ValueError, saying what to pass, when it is not one."""
    try:
        return orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, TypeError) as err:
        raise ValueError(f"invalid cursor {text[:40]!r}: pass back a cursor a listing returned") from err


@dataclass(frozen=True, slots=True)
class Cursor:
    driver: Driver
    after: str
    fingerprint: list[str | bool | None]

    def encode(self) -> str:
        return encode_token({"d": self.driver.value, "a": self.after, "f": self.fingerprint})

    @classmethod
    def decode(cls, text: str, flt: InterruptFilter) -> "Cursor":
        value = decode_token(text)
        try:
            cursor = cls(Driver(value["d"]), str(value["a"]), list(value["f"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"invalid cursor {text[:40]!r}: pass back a cursor a listing returned") from err
        if len(cursor.fingerprint) == 3:  # made before newest first existed: oldest first
            cursor = cls(cursor.driver, cursor.after, [*cursor.fingerprint, False])
        if len(cursor.fingerprint) == 4:  # made before search existed: no search
            cursor = cls(cursor.driver, cursor.after, [*cursor.fingerprint, None])
        if cursor.fingerprint != flt.fingerprint():
            raise ValueError("the cursor belongs to a listing with another filter or order "
                             "(reason, session prefix, principal, newest first, search): use the same filter "
                             "and order for every page")
        return cursor


# ---- planning: which set drives, which range of it --------------------------------------------

@dataclass(frozen=True, slots=True)
class Plan:
    driver: Driver
    keys: tuple[str, ...]  # one set, or the two merged for a principal
    low: str  # ZRANGE BYLEX bounds: min and max, whatever the order
    high: str
    #: read from `high` down (ZRANGE ... BYLEX REV): newest first
    reverse: bool = False

    def range_calls(self, limit: int) -> list[Call]:
        """The first `limit` members of each set within the bounds, in the listing's order."""
        if self.reverse:  # REV takes the max first
            return [Call("zrange", (k, self.high, self.low), {"bylex": True, "desc": True, "offset": 0,
                                                             "num": limit}) for k in self.keys]
        return [Call("zrange", (k, self.low, self.high), {"bylex": True, "offset": 0, "num": limit})
                for k in self.keys]


def choose_driver(flt: InterruptFilter, reason_count: int, principal_count: int) -> Driver:
    """The session prefix when given (it bounds the range itself); else the smaller of the
    reason's set and the principal's (with "anyone"); else all by raise time."""
    if flt.session_prefix is not None:
        return Driver.SESSION
    if flt.reason is not None and (flt.principal is None or reason_count <= principal_count):
        return Driver.REASON
    if flt.principal is not None:
        return Driver.PRINCIPAL
    return Driver.TIME


def plan(keys: Keys, flt: InterruptFilter, driver: Driver, after: str | None) -> Plan:
    """The driving sets and the bounds of the members past `after` (the cursor's member, never
    itself included): above it oldest first, below it newest first."""
    low, high = "-", "+"
    if driver is Driver.SESSION:
        sets: tuple[str, ...] = (keys.interrupts_by_session,)
        if prefix := flt.session_prefix or "":
            # session ids are ASCII: \xff sorts after every id that starts with the prefix
            low, high = "[" + prefix, "[" + prefix + "\xff"
    else:
        match driver:
            case Driver.REASON:
                sets = (keys.interrupts_of_reason(flt.reason or ""),)
            case Driver.PRINCIPAL:
                sets = (keys.interrupts_of_principal(flt.principal or ""), keys.interrupts_for_anyone)
            case _:
                sets = (keys.interrupts_by_time,)
        if flt.raised_before is not None:
            high = "(" + f"{flt.raised_before:0{TIME_DIGITS}d}"
    # the cursor's member, excluded, bounds the side the listing runs towards, unless the bound
    # there is already tighter: `raised_before` moves between pages (`--older-than` is counted
    # from each page's now), and a cursor from elsewhere must not widen the prefix's range
    if after is not None:
        if not flt.newest_first and (low == "-" or after >= low[1:]):
            low = "(" + after
        elif flt.newest_first and (high == "+" or after < high[1:]):
            high = "(" + after
    return Plan(driver, sets, low, high, flt.newest_first)


def merge(batches: Sequence[Sequence[str]], n: int, reverse: bool = False) -> tuple[list[str], bool]:
    """The first `n` members of sorted batches, each the first `n` of its set after the cursor
    (in descending order with `reverse`); and whether every set is exhausted past them."""
    union = sorted(set().union(*batches), reverse=reverse)
    merged = union[:n]
    return merged, all(len(b) < n for b in batches) and len(merged) == len(union)


def texts(values: Iterable[Any]) -> list[str]:
    """Redis replies (bytes or text) as text."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


# ---- the read -----------------------------------------------------------------------------------

def read_page(redis: Redis, keys: Keys, flt: InterruptFilter, limit: int = DEFAULT_LIMIT,
              cursor: str | None = None) -> InterruptPage:
    """One page, read on a synchronous Redis (the async client drives `page_steps` itself)."""
    page: InterruptPage = run_steps(redis, page_steps(keys, flt, limit, cursor))
    return page


def page_steps(keys: Keys, flt: InterruptFilter, limit: int = DEFAULT_LIMIT,
               cursor: str | None = None) -> Steps:
    """One page, as round trips for a client to run: range reads of the driving set after the
    cursor, and the rows' details. Pure, so the sync and the async client share it."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be 1-{MAX_LIMIT}, not {limit}")
    if cursor is not None:
        at = Cursor.decode(cursor, flt)
        driver, after = at.driver, at.after
    else:
        driver, after = (yield from _first_driver(keys, flt)), None
    page: InterruptPage = yield from _walk(keys, flt, limit, driver, after)
    return page


def _walk(keys: Keys, flt: InterruptFilter, limit: int, driver: Driver, after: str | None) -> Steps:
    items: list[OpenInterrupt] = []
    scanned = 0
    while True:
        # a whole page's worth each time, not what is missing: when filters combine, a
        # shrinking batch would take ever more round trips for the last rows
        p = plan(keys, flt, driver, after)
        ranges = yield p.range_calls(limit)
        members, exhausted = merge([texts(batch) for batch in ranges], limit, reverse=flt.newest_first)
        details: Any = (yield [Call("hmget", (keys.interrupt_info,
                                              [index_member_of(m, driver) for m in members]))])[0] \
            if members else []
        for n, (member, raw) in enumerate(zip(members, details, strict=True), 1):
            after = member
            if raw is not None:  # resumed between the two reads
                row = OpenInterrupt.from_details(raw)
                if flt.matches(row):
                    items.append(row)
            if len(items) == limit:
                exhausted = exhausted and n == len(members)
                break
        scanned += len(members)
        if exhausted:
            return InterruptPage(items=items)
        if len(items) == limit or scanned >= limit * SCAN_FACTOR:
            assert after is not None
            return InterruptPage(items=items, cursor=Cursor(driver, after, flt.fingerprint()).encode())


# ---- several shards (parley/client/fanout.py) ----------------------------------------------------------

def order_driver(flt: InterruptFilter) -> Driver:
    """The order a merged listing runs in: by session id with a session prefix, else by raise
    time (the reason's and the principal's sets share the by-time members, so each shard may
    walk whichever of them is smallest there); descending with `newest_first`."""
    return Driver.SESSION if flt.session_prefix is not None else Driver.TIME


def row_key(flt: InterruptFilter) -> Callable[[OpenInterrupt], str]:
    """A row's member in the merged listing's order (index_lib.lua builds the same)."""
    if order_driver(flt) is Driver.SESSION:
        return lambda r: f"{r.session}{SEP}{r.raised_at:0{TIME_DIGITS}d}{SEP}{r.interrupt_id}"
    return lambda r: time_member(r.raised_at, r.session, r.interrupt_id)


def merged_after(flt: InterruptFilter, cursor: str | None) -> str | None:
    """Where every shard's part of a merged page starts: after the cursor's member."""
    return None if cursor is None else Cursor.decode(cursor, flt).after


def shard_page_steps(keys: Keys, flt: InterruptFilter, limit: int, after: str | None) -> Steps:
    """One shard's part of a merged page: its own driving set (the smallest there), from the
    merged position `after`; its cursor says how far it read."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be 1-{MAX_LIMIT}, not {limit}")
    driver = yield from _first_driver(keys, flt)
    page: InterruptPage = yield from _walk(keys, flt, limit, driver, after)
    return page


def merged_page(flt: InterruptFilter, limit: int, pages: Sequence[InterruptPage],
                placement: Placement | None = None) -> InterruptPage:
    """One page of the listing over every shard, from each shard's page read from the same
    position (`shard_page_steps`), in the deployment's order; with `placement`, a row is kept
    only from its session's shard (a move lists it on two for a moment)."""
    parts = [ShardPart(p.items, merged_after(flt, p.cursor)) for p in pages]
    owner = session_owner(placement, _session_of_row)
    items, after = merge_parts(parts, row_key(flt), limit, reverse=flt.newest_first, owner=owner)
    cursor = None if after is None else Cursor(order_driver(flt), after, flt.fingerprint()).encode()
    return InterruptPage(items=items, cursor=cursor)


def _session_of_row(row: OpenInterrupt) -> str:
    return row.session


def _session_of_json(row: dict[str, Any]) -> str:
    return str(row["session"])


def merged_rows(flt: InterruptFilter, shards_rows: Sequence[Iterable[dict[str, Any]]],
                placement: Placement | None = None) -> list[dict[str, Any]]:
    """Every shard's rows (`every_row_steps`, in the deployment's order) as one listing, in its
    order; with `placement`, each row from its session's shard only (see `merged_page`)."""
    key = row_key(flt)
    owner = session_owner(placement, _session_of_json)
    rows = [row for i, part in enumerate(shards_rows) for row in own_rows(part, i, owner)]
    return sorted(rows, key=lambda row: key(OpenInterrupt.model_validate(row)), reverse=flt.newest_first)


def _first_driver(keys: Keys, flt: InterruptFilter) -> Generator[list[Call], list[Any], Driver]:
    if flt.session_prefix is None and flt.reason is not None and flt.principal is not None:
        by_reason, by_principal, by_anyone = yield [
            Call("zcard", (keys.interrupts_of_reason(flt.reason),)),
            Call("zcard", (keys.interrupts_of_principal(flt.principal),)),
            Call("zcard", (keys.interrupts_for_anyone,)),
        ]
        return choose_driver(flt, int(by_reason), int(by_principal) + int(by_anyone))
    return choose_driver(flt, 0, 0)


def every_row_steps(keys: Keys, flt: InterruptFilter) -> Steps:
    """Every open interrupt that `flt` keeps, as JSON rows, page by page."""
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page: InterruptPage = yield from page_steps(keys, flt, MAX_LIMIT, cursor)
        rows += [row.model_dump() for row in page.items]
        if page.cursor is None:
            return rows
        cursor = page.cursor
