"""List the sessions an older release created (`parley sessions --rebuild`, once after upgrading).

Sessions created before the list of sessions existed are in none of its sets until their next
listing move (an interrupt raised or answered, a close). This walks every session's record
with SCAN, a batch at a time (Redis is never blocked for longer than one batch), computes its
entries with the same pure rule the dispatcher uses (schemas/listing.py), and adds them with a
script that first checks the record is still the version read (list_session.lua): a session a
transition changes meanwhile is read again, so a stale status is never listed. Running it
twice, or while dispatchers run, is safe: ZADD of the same member changes nothing.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import Redis

from parley.dispatcher.store import load_script
from parley.schemas.keys import Keys
from parley.schemas.listing import listed
from parley.schemas.state import Core

#: records read per SCAN step
DEFAULT_BATCH = 500
#: how many times a session a transition keeps changing is read again before it is left to
#: its own next Listing effect (it is listed by then: it is being transitioned)
MAX_RETRIES = 5


@dataclass(slots=True)
class RebuildReport:
    #: session records found
    scanned: int = 0
    #: sessions whose entries were written (already listed ones included: ZADD is idempotent)
    listed: int = 0
    #: sessions that changed under every retry (their own transitions list them)
    busy: int = 0


def rebuild(redis: Redis, keys: Keys, batch: int = DEFAULT_BATCH,
            progress: Callable[[RebuildReport], None] | None = None) -> RebuildReport:
    script = load_script(redis, "list_session")
    report = RebuildReport()
    cursor: Any = 0
    pattern = keys.meta("*")
    while True:
        cursor, names = redis.scan(cursor, match=pattern, count=batch)
        sessions = [_session_of(keys, n) for n in names]
        report.scanned += len(sessions)
        todo = [s for s in sessions if s is not None]
        for _ in range(MAX_RETRIES):
            if not todo:
                break
            todo = _list_batch(redis, keys, script, todo, report)
        report.busy += len(todo)
        if progress is not None:
            progress(report)
        if int(cursor) == 0:
            return report


def _session_of(keys: Keys, name: bytes | str) -> str | None:
    text = name.decode() if isinstance(name, bytes) else name
    head, _, rest = keys.meta("\x00").partition("\x00")
    if not (text.startswith(head) and text.endswith(rest)) or len(text) <= len(head) + len(rest):
        return None
    return text[len(head):len(text) - len(rest)]


def _list_batch(redis: Redis, keys: Keys, script: Any, sessions: list[str],
                report: RebuildReport) -> list[str]:
    """List a batch of sessions; returns those whose record changed between read and write."""
    read = redis.pipeline(transaction=False)
    for s in sessions:
        read.hmget(keys.meta(s), "ver", "core")
    records = read.execute()
    write = redis.pipeline(transaction=False)
    sent: list[str] = []
    for s, (ver, raw) in zip(sessions, records, strict=True):
        if not raw or ver is None:
            continue  # gone since the SCAN (or not a session's record)
        where = listed(Core.model_validate_json(raw))
        assert where is not None
        names = sorted(name for name, _member in where.entries(keys))
        script(keys=[keys.meta(s), *names], args=[ver, where.member], client=write)
        sent.append(s)
    if not sent:
        return []
    done = write.execute()
    report.listed += sum(1 for rc in done if int(rc) == 1)
    return [s for s, rc in zip(sent, done, strict=True) if int(rc) == 0]
