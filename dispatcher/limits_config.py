"""Publish the admission limits where the submit function reads them (`parley:config`).

Each dispatcher writes its own limits at start: the last one started wins, and says so in its
log when it changes what another one published (docs/operations.md, "Limits"). Dispatchers of
one fleet are meant to run with the same flags; until they do, the submit function applies
the last values written, and each dispatcher applies its own as inputs are applied.
"""

import logging
from typing import Any

from redis import Redis

from parley.dispatcher.core import AdmissionLimits
from parley.runtime.logs import kv
from parley.schemas.keys import Keys

log = logging.getLogger("parley.dispatcher")


def publish_limits(redis: Redis, keys: Keys, limits: AdmissionLimits) -> None:
    """Write `limits` to `parley:config` (one MULTI), logging the values it replaces."""
    wanted = limits.config()
    pipe = redis.pipeline(transaction=True)
    pipe.hmget(keys.config, list(wanted))
    mapping: dict[Any, Any] = dict(wanted)
    pipe.hset(keys.config, mapping=mapping)
    before, _ = pipe.execute()
    changed = {name: (old.decode(), new) for (name, new), old in zip(wanted.items(), before, strict=True)
               if old is not None and old.decode() != str(new)}
    if changed:
        log.warning("admission limits changed in parley:config (the last dispatcher started wins)",
                    extra=kv(**{name: f"{old} -> {new}" for name, (old, new) in changed.items()}))
