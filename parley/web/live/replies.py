"""What the feed's Redis replies say (pure): stream ids in the stream's order, the entries of
an XREAD reply, and whether entries not read yet were lost (from XINFO STREAM)."""

from typing import Any

#: a stream id before every real one: where a feed that does not exist yet is read from
STREAM_START = "0-0"


def text_of(value: Any) -> str:
    """A reply's bytes (or anything else) as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def stream_id(value: Any) -> tuple[int, int]:
    """A stream entry id (`<ms>-<seq>`) as a pair that compares in the stream's order."""
    ms, _, seq = text_of(value).partition("-")
    return int(ms), int(seq or 0)


def entries_of(reply: Any) -> list[tuple[Any, Any]]:
    """The entries of an XREAD reply (RESP2: `[[stream, entries]]`; RESP3, depending on
    redis-py's version: `{stream: entries}` or `{stream: [entries]}`)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    found: list[tuple[Any, Any]] = []
    for _stream, entries in pairs:
        if entries and entries[0] and not isinstance(entries[0][0], bytes | str):
            entries = entries[0]  # wrapped once more
        found.extend(entries)
    return found


def why_lost(position: str, info: dict[Any, Any] | None) -> str | None:
    """Why entries after `position` may be gone from the feed (None: nothing lost), by the
    feed's XINFO STREAM (None: there is no feed)."""
    at = stream_id(position)
    if info is None:
        return "the feed is gone" if at > (0, 0) else None
    info = {text_of(k): v for k, v in info.items()}
    if stream_id(info.get("last-generated-id", STREAM_START)) < at:
        return "the feed is younger than the last entry read (the shard lost its data)"
    if stream_id(info.get("max-deleted-entry-id", STREAM_START)) > at:
        return "entries not yet read were deleted"
    # Trimming moves the feed's first entry on (Redis 7 records it; before, the oldest entry
    # left tells). Past ours, entries after ours may be gone too: unless the hub was exactly
    # at the trimmed end, it fell a whole feed (about 100,000 entries) behind, so a reset is
    # what the pages need either way.
    if int(info.get("length", 1)) == 0 and stream_id(info.get("last-generated-id", STREAM_START)) > at:
        return "entries not yet read were trimmed (the feed is empty)"
    added = info.get("entries-added")  # Redis 7
    if at == (0, 0) and added is not None and int(added) > int(info.get("length", 0)):
        # read from the start (the feed was empty), and some of what was added is not there
        return "entries not yet read were trimmed"
    first = info.get("recorded-first-entry-id")
    if first is None and info.get("first-entry"):
        first = info["first-entry"][0]
    if first is not None and at > (0, 0) and stream_id(first) > at:
        return "entries not yet read may have been trimmed"
    return None
