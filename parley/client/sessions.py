"""The list of sessions (`parley sessions`, `Client.sessions`): by status, metadata and age, paged.

The dispatcher keeps, with every transition that changes them (schemas/listing.py, the
`Listing` effect), one sorted set per listing status (active, parked, closed) and one per
indexed metadata pair, all of score 0 with members `created_at (15 digits) US session`: byte
order is creation order. A page is one range read (ZRANGE BYLEX after the cursor) of the
driving set — or of the status sets merged, by creation time — and one read of the rows'
records: O(log n + page), whatever the number of sessions. An age is a range of the members'
time prefix. Filters the driving set does not cover are checked on each row, within a bounded
scan (`SCAN_FACTOR` x the page), as the inbox does (parley/client/inbox.py).
"""

from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from parley.client.fanout import ShardPart, merge_parts, session_owner
from parley.client.inbox import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    SCAN_FACTOR,
    decode_token,
    encode_token,
    merge,
    texts,
)
from parley.client.producer import Call, Steps
from parley.schemas.keys import Keys
from parley.schemas.listing import (
    SEP,
    TIME_DIGITS,
    ListingStatus,
    listing_status,
    metadata_pairs,
    metadata_value,
    session_of_member,
)
from parley.schemas.shards import Placement
from parley.schemas.state import Core

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "SessionFilter", "SessionPage", "SessionRow", "merged_after",
           "merged_page", "page_steps", "shard_page_steps"]


class SessionRow(BaseModel):
    """One session, as the list shows it (docs/operations.md, "The list of sessions")."""

    session: str
    status: ListingStatus
    #: Unix ms of its creation
    created_at: int
    #: Unix ms of its close (closed sessions, when the dispatcher recorded it)
    closed_at: int | None = None
    #: the session's metadata as it was created (the whole object, indexed or not)
    metadata: dict[str, Any] | None = None
    #: how many of its interrupts are open
    open_interrupts: int = 0
    #: the parent session, when this one is a sub-agent's child
    parent: str | None = None

    @classmethod
    def of(cls, core: Core) -> "SessionRow":
        return cls(session=core.session, status=listing_status(core), created_at=core.created_at,
                   closed_at=core.closed_at, metadata=core.metadata, open_interrupts=len(core.interrupts),
                   parent=core.parent.get("session") if core.parent else None)


class SessionPage(BaseModel):
    items: list[SessionRow]
    #: pass it back for the next page; null: nothing more. A page may hold fewer rows than
    #: asked (even none) with a cursor when combined filters stopped its scan.
    cursor: str | None = None
    #: with several shards, those that did not answer: the page is of the others' rows
    unreachable: list[int] = []


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """Which sessions a listing keeps. Build it with `SessionFilter.of`, which checks its values."""

    #: the listing statuses kept, in a fixed order (all three when none was asked for)
    statuses: tuple[ListingStatus, ...] = tuple(ListingStatus)
    #: metadata pairs a session must have, as indexed text (schemas/listing.py `metadata_value`)
    metadata: tuple[tuple[str, str], ...] = ()
    #: Unix ms, both exclusive: only sessions created after / before
    created_after: int | None = None
    created_before: int | None = None
    #: newest first (the default is oldest first)
    newest_first: bool = False

    @classmethod
    def of(cls, status: str | Iterable[str] | None = None, metadata: Mapping[str, Any] | None = None,
           created_after: int | None = None, created_before: int | None = None,
           newest_first: bool = False) -> "SessionFilter":
        """The filter, or ValueError saying which value is wrong."""
        return cls(statuses=statuses_of(status), metadata=pairs_of(metadata),
                   created_after=_time(created_after, "created_after"),
                   created_before=_time(created_before, "created_before"), newest_first=newest_first)

    def matches(self, core: Core) -> bool:
        """Whether a session's record, read after its member, still passes every filter (its
        status may have changed between the two reads)."""
        if listing_status(core) not in self.statuses:
            return False
        if self.created_after is not None and core.created_at <= self.created_after:
            return False
        if self.created_before is not None and core.created_at >= self.created_before:
            return False
        return not self.metadata or set(self.metadata) <= set(metadata_pairs(core.metadata))

    def fingerprint(self) -> list[Any]:
        """What a cursor must be used with: the filters that choose the driving set and the
        order (the ages are not in it: `--older-than` is recomputed from now on every page)."""
        return [[s.value for s in self.statuses], [list(p) for p in self.metadata], self.newest_first]


def statuses_of(status: str | Iterable[str] | None) -> tuple[ListingStatus, ...]:
    if status is None:
        return tuple(ListingStatus)
    asked = [status] if isinstance(status, str) else list(status)
    known = {s.value for s in ListingStatus}
    unknown = [s for s in asked if s not in known]
    if unknown or not asked:
        raise ValueError(f"unknown session status {(unknown or asked)!r}: use one or more of "
                         f"{', '.join(sorted(known))}")
    return tuple(s for s in ListingStatus if s.value in asked)


def pairs_of(metadata: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The metadata pairs asked for, as the list indexes them; ValueError for a pair no session
    can be listed under (a value that is not a string, integer or boolean, or too long)."""
    out: list[tuple[str, str]] = []
    for key, value in sorted((metadata or {}).items()):
        text = metadata_value(value)
        pair = metadata_pairs({key: value})
        if text is None or not pair:
            raise ValueError(f"metadata {key!r}={value!r} is not indexed: only top-level string, "
                             "integer and boolean values are (keys up to 64 characters, values up "
                             "to 128), so no session is listed under it")
        out.append(pair[0])
    return tuple(out)


def _time(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**TIME_DIGITS:
        raise ValueError(f"{name} must be Unix ms (an integer from 0), not {value!r}")
    return value


# ---- planning: which sets drive, which range of them --------------------------------------------

#: the driving sets: the status sets (merged), or the set of metadata pair number n
STATUS_DRIVER = "status"


def driver_sets(keys: Keys, flt: SessionFilter, driver: str) -> tuple[str, ...]:
    if driver == STATUS_DRIVER:
        return tuple(keys.sessions_of_status(s) for s in flt.statuses)
    key, value = flt.metadata[int(driver)]
    return (keys.sessions_of_metadata(key, value),)


def bounds(flt: SessionFilter, after: str | None) -> tuple[str, str]:
    """ZRANGE BYLEX bounds (min, max) of the members past the cursor within the ages asked."""
    low = "-" if flt.created_after is None else "[" + f"{flt.created_after + 1:0{TIME_DIGITS}d}"
    high = "+" if flt.created_before is None else "(" + f"{flt.created_before:0{TIME_DIGITS}d}"
    if after is not None:
        if flt.newest_first:
            high = "(" + after
        else:
            low = "(" + after
    return low, high


def range_call(name: str, flt: SessionFilter, after: str | None, limit: int) -> Call:
    low, high = bounds(flt, after)
    if flt.newest_first:  # REV: from the max down
        return Call("zrange", (name, high, low), {"bylex": True, "desc": True, "offset": 0, "num": limit})
    return Call("zrange", (name, low, high), {"bylex": True, "offset": 0, "num": limit})


def choose_driver(flt: SessionFilter, cards: list[int]) -> str:
    """The smallest of the metadata pairs' sets and the status sets together (`cards`: their
    sizes, in that order: one per pair, then one per status)."""
    if not flt.metadata:
        return STATUS_DRIVER
    by_pair = cards[:len(flt.metadata)]
    smallest = min(range(len(by_pair)), key=by_pair.__getitem__)
    if len(flt.statuses) < len(ListingStatus) and sum(cards[len(flt.metadata):]) < by_pair[smallest]:
        return STATUS_DRIVER
    return str(smallest)


def _first_driver(keys: Keys, flt: SessionFilter) -> Generator[list[Call], list[Any], str]:
    if not flt.metadata:
        return STATUS_DRIVER
    names = [keys.sessions_of_metadata(k, v) for k, v in flt.metadata]
    names += [keys.sessions_of_status(s) for s in flt.statuses]
    cards = yield [Call("zcard", (name,)) for name in names]
    return choose_driver(flt, [int(c) for c in cards])


# ---- cursors ------------------------------------------------------------------------------------

def encode_cursor(driver: str, after: str, flt: SessionFilter) -> str:
    return encode_token({"d": driver, "a": after, "f": flt.fingerprint()})


def decode_cursor(text: str, flt: SessionFilter) -> tuple[str, str]:
    """(driver, member after which the next page starts); ValueError for a cursor that is not
    one, or that belongs to a listing with other filters."""
    value = decode_token(text)
    try:
        driver, after, fingerprint = str(value["d"]), str(value["a"]), value["f"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"invalid cursor {text[:40]!r}: pass back a cursor a listing returned") from err
    if fingerprint != flt.fingerprint():
        raise ValueError("the cursor belongs to a listing with other filters (status, metadata, order): "
                         "use the same filters for every page")
    if (driver != STATUS_DRIVER and not (driver.isdigit() and int(driver) < len(flt.metadata))) \
            or SEP not in after:
        raise ValueError(f"invalid cursor {text[:40]!r}: pass back a cursor a listing returned")
    return driver, after


# ---- the read -----------------------------------------------------------------------------------

def page_steps(keys: Keys, flt: SessionFilter, limit: int = DEFAULT_LIMIT,
               cursor: str | None = None) -> Steps:
    """One page, as round trips for a client to run: range reads of the driving sets after the
    cursor, then the rows' records. Pure, so the sync and the async client share it."""
    _check_limit(limit)
    if cursor is not None:
        driver, after = decode_cursor(cursor, flt)
    else:
        driver, after = (yield from _first_driver(keys, flt)), None
    page: SessionPage = yield from _walk(keys, flt, limit, driver, after)
    return page


def _walk(keys: Keys, flt: SessionFilter, limit: int, driver: str, after: str | None) -> Steps:
    names = driver_sets(keys, flt, driver)
    items: list[SessionRow] = []
    scanned = 0
    while True:
        ranges = yield [range_call(name, flt, after, limit) for name in names]
        members, exhausted = merge([texts(batch) for batch in ranges], limit, reverse=flt.newest_first)
        records: list[Any] = (yield [Call("hmget", (keys.meta(session_of_member(m)), "core"))
                                     for m in members]) if members else []
        for n, (member, (raw,)) in enumerate(zip(members, records, strict=True), 1):
            after = member
            core = _core(raw, member)
            if core is not None and flt.matches(core):
                items.append(SessionRow.of(core))
            if len(items) == limit:
                exhausted = exhausted and n == len(members)
                break
        scanned += len(members)
        if exhausted:
            return SessionPage(items=items)
        if len(items) == limit or scanned >= limit * SCAN_FACTOR:
            assert after is not None
            return SessionPage(items=items, cursor=encode_cursor(driver, after, flt))


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be 1-{MAX_LIMIT}, not {limit!r}")


# ---- several shards (parley/client/fanout.py) ----------------------------------------------------------

def row_key(row: SessionRow) -> str:
    """A row's member in the list's order (schemas/listing.py builds the same)."""
    return f"{row.created_at:0{TIME_DIGITS}d}{SEP}{row.session}"


def merged_after(flt: SessionFilter, cursor: str | None) -> str | None:
    """Where every shard's part of a merged page starts: after the cursor's member."""
    return None if cursor is None else decode_cursor(cursor, flt)[1]


def shard_page_steps(keys: Keys, flt: SessionFilter, limit: int, after: str | None) -> Steps:
    """One shard's part of a merged page: its own driving sets (the smallest there), from the
    merged position `after`; its cursor says how far it read."""
    _check_limit(limit)
    driver = yield from _first_driver(keys, flt)
    page: SessionPage = yield from _walk(keys, flt, limit, driver, after)
    return page


def _session_of_row(row: SessionRow) -> str:
    return row.session


def merged_page(flt: SessionFilter, limit: int, pages: Sequence[SessionPage],
                placement: Placement | None = None) -> SessionPage:
    """One page of the list over every shard, from each shard's page read from the same
    position (`shard_page_steps`), in the deployment's order; with `placement`, a row is kept
    only from its session's shard (a move lists it on two for a moment)."""
    parts = [ShardPart(p.items, merged_after(flt, p.cursor)) for p in pages]
    owner = session_owner(placement, _session_of_row)
    items, after = merge_parts(parts, row_key, limit, reverse=flt.newest_first, owner=owner)
    # the merged cursor names the status sets: any driver's members read the same
    cursor = None if after is None else encode_cursor(STATUS_DRIVER, after, flt)
    return SessionPage(items=items, cursor=cursor)


def _core(raw: bytes | None, member: str) -> Core | None:
    """The session's record, or None when it is gone (expired between the two reads) or is a
    later session of the same id than the member names."""
    if not raw:
        return None
    core = Core.model_validate_json(raw)
    created, _, session = member.partition(SEP)
    return core if (core.session, core.created_at) == (session, int(created)) else None
