"""Where a parked session's bytes go (scenario 3, issue 36's first step): every key of one
parked seed session by MEMORY USAGE, its meta hash field by field, and its share of every
shard-wide structure (the open-interrupt index and its listing sets, deadlines, the list of
sessions and its per-status sets, the feed, the partition's list), each structure's MEMORY
USAGE divided by the sessions parked; set against `used_memory`'s growth per session, the rest
being what no key accounts for (the main dictionary's entries and Redis's own overhead)."""

from typing import Any

import redis

from parley.fleet.copying import text
from parley.schemas.keys import Keys
from parley.schemas.moves import shared_sets


def usage(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def bytes_table(r: redis.Redis, keys: Keys, session: str, parked: int,
                per_session_growth: int) -> dict[str, Any]:
    """The table for one parked `session` of `parked` alike, and `used_memory`'s growth per
    session (`per_session_growth`) to set it against."""
    own = {key.rsplit(":", 1)[-1]: usage(r, key) for key in keys.session_keys(session) if r.exists(key)}
    raw: Any = r.hgetall(keys.meta(session))
    meta_fields = {text(f): len(v) for f, v in sorted((raw or {}).items(), key=lambda kv: -len(kv[1]))}
    shared: dict[str, int] = {}
    for s in shared_sets(keys):
        names = [text(k) for k in r.scan_iter(match=s.name, count=1000)] if s.pattern else [s.name]
        total = sum(usage(r, n) for n in names if r.exists(n))
        if total:
            label = s.name.replace(keys.prefix + ":", "")
            shared[label] = round(total / parked)
    for label, name in (("feed", keys.feed), ("partition list", keys.partition_sessions(0))):
        if r.exists(name):
            shared[label] = round(usage(r, name) / parked)
    accounted = sum(own.values()) + sum(shared.values())
    return {"session_keys": own, "meta_fields_bytes": meta_fields, "shared_per_session": shared,
            "accounted": accounted, "used_memory_growth_per_session": per_session_growth,
            "unaccounted": per_session_growth - accounted}
