"""The list of sessions (`parley sessions`): which sorted sets a session is listed in.

Pure: a session's listing entries are a function of its core alone, so the dispatcher keeps
the sets by the difference between a transition's core before and after (an outbox effect),
and expiry removes exactly what the core says was added. Members are
`created_at (15 digits) US session`, all at score 0: byte order is creation order, and a page
is one ZRANGE BYLEX after a cursor, O(log n + page).
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from parley.schemas.codes import SessionStatus
from parley.schemas.keys import Keys
from parley.schemas.state import Core

SEP = "\x1f"
TIME_DIGITS = 15
#: metadata pairs indexed per session: top-level keys with a string, integer or boolean value,
#: at most this many (in key order), key and value each at most the given length
MAX_INDEXED_PAIRS = 16
MAX_INDEXED_KEY_CHARS = 64
MAX_INDEXED_VALUE_CHARS = 128


class ListingStatus(StrEnum):
    """A session's status in the list of sessions."""

    #: open, and no interrupt is waiting for an answer
    ACTIVE = "active"
    #: open, with at least one open interrupt
    PARKED = "parked"
    #: closed: takes no more inputs; deleted when its retention ends
    CLOSED = "closed"


def listing_status(core: Core) -> ListingStatus:
    if core.status == SessionStatus.CLOSED:
        return ListingStatus.CLOSED
    return ListingStatus.PARKED if core.interrupts else ListingStatus.ACTIVE


def listing_member(created_at: int, session: str) -> str:
    return f"{created_at:0{TIME_DIGITS}d}{SEP}{session}"


def session_of_member(member: str) -> str:
    return member.split(SEP, 1)[1]


def metadata_value(value: Any) -> str | None:
    """The indexed text of a metadata value, or None when the value is not indexed: a string
    is itself, an integer its digits, a boolean `true`/`false`. A listing matches text, so the
    string "1" and the integer 1 are listed under the same pair (what `--meta KEY=VALUE`, typed
    as text, expects)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and SEP not in value:
        return value
    return None


def metadata_pairs(metadata: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The (key, value) pairs a session is listed under: top-level scalars, bounded."""
    out: list[tuple[str, str]] = []
    for key in sorted(metadata or {}):
        text = metadata_value((metadata or {})[key])
        if text is None or SEP in key or len(key) > MAX_INDEXED_KEY_CHARS \
                or len(text) > MAX_INDEXED_VALUE_CHARS:
            continue
        out.append((key, text))
        if len(out) == MAX_INDEXED_PAIRS:
            break
    return out


@dataclass(frozen=True, slots=True)
class Listed:
    """Where a session is listed, without key names: its status set and its metadata pairs'
    sets, all with the member of its creation time and id. The pure core compares it before
    and after a transition (turns.finish); the shell turns it into keys (`entries`)."""

    session: str
    created_at: int
    status: ListingStatus
    metadata: tuple[tuple[str, str], ...]

    @property
    def member(self) -> str:
        return listing_member(self.created_at, self.session)

    def entries(self, keys: Keys) -> set[tuple[str, str]]:
        """The (sorted set, member) pairs of this listing."""
        out = {(keys.sessions_of_status(self.status), self.member)}
        out.update((keys.sessions_of_metadata(k, v), self.member) for k, v in self.metadata)
        return out


def listed(core: Core | None) -> Listed | None:
    """Where the session is listed (None before it exists)."""
    if core is None:
        return None
    return Listed(core.session, core.created_at, listing_status(core), tuple(metadata_pairs(core.metadata)))


def listing_entries(keys: Keys, core: Core | None) -> set[tuple[str, str]]:
    """The (sorted set, member) pairs the session is listed under (none before it exists)."""
    where = listed(core)
    return set() if where is None else where.entries(keys)
