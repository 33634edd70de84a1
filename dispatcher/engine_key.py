"""The engine's key: the secret dispatchers sign their own inputs with (a sub-agent's spawn and
close), kept in Redis where only dispatchers may read it (deploy/redis/users.acl).

The first dispatcher to look makes it (SET NX) and every other reads that one, so any
dispatcher verifies any other's inputs. Should Redis lose it (data lost on a restart, a failover
to a replica that never had it), the next dispatcher to look makes a new one: so the signer reads
it afresh for every input it signs (these are rare: one per spawn and per close), and a verifier
that meets an engine signature its copy rejects reads it again before refusing the entry.
"""

import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley.runtime.logs import kv
from parley.schemas.keys import Keys


class EngineKey:
    #: a verifier reads the key again at most this often (an attacker's bad engine signatures
    #: must not turn into one Redis read each)
    RELOAD_EVERY_S = 1.0

    def __init__(self, redis: Redis, keys: Keys):
        self.redis = redis
        self.keys = keys
        self._key: str | None = None
        self._loaded_at = float("-inf")
        #: the key `fresher` last handed to a verifier
        self._handed: str | None = None

    def current(self) -> str:
        """The key as this process last read it (read once at start)."""
        key = self._key if self._key is not None else self.load()
        if self._handed is None:
            self._handed = key  # the copy a verifier is made with (dispatcher/consume.py)
        return key

    def load(self) -> str:
        """The key as Redis holds it now, made first if there is none."""
        self.redis.set(self.keys.engine_key, secrets.token_hex(32), nx=True)
        raw: Any = self.redis.get(self.keys.engine_key)
        if not raw:
            # Made and gone between two commands (an eviction policy that evicts any key):
            # signing with a guessable stand-in would let anyone pose as the engine.
            raise RuntimeError(f"the engine's key {self.keys.engine_key} vanished as it was made: "
                               "Redis must not evict keys (maxmemory-policy noeviction)")
        self._key = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._loaded_at = time.monotonic()
        return self._key

    def fresher(self) -> str | None:
        """For a verifier of this process whose copy rejected an engine signature: the key this
        object holds when a signer of the same process has read a new one since it last handed a
        key out (its signatures are made with that one, and must verify at once), else
        `reload_if_due`. Without the first case a signer's reads, which reset the period, would
        keep the verifier on the old key for as long as the signer keeps signing."""
        if self._key is not None and self._key != self._handed:
            self._handed = self._key
            return self._key
        fresh = self.reload_if_due()
        if fresh is not None:
            self._handed = fresh
        return fresh

    def reload_if_due(self) -> str | None:
        """For a verifier whose copy rejected an engine signature: the key read again, or None
        when it was read less than RELOAD_EVERY_S ago."""
        if time.monotonic() - self._loaded_at < self.RELOAD_EVERY_S:
            return None
        return self.load()


def share_engine_key(shards: Sequence[Redis], keys: Keys, own: int) -> bool:
    """In a deployment of several shards, every shard holds the same engine key: shard 0's,
    made there first if needed, copied (SET NX) to shard `own` before its dispatcher signs
    anything. A partition moved to another shard (parley/fleet/moves.py) carries inputs the
    engine signed on its source, which the target must verify. False (logged) when `own`
    already holds another key (it made its own before it joined): kept, as entries signed
    with it may be pending there, and the move refuses to move a partition between shards
    whose keys differ."""
    first = deployment_engine_key(shards, keys)
    mine = shards[own]
    mine.set(keys.engine_key, first, nx=True)
    raw: Any = mine.get(keys.engine_key)
    held = raw.decode() if isinstance(raw, bytes) else raw
    if held != first:
        logging.getLogger("parley.dispatcher").warning(
            "this shard's engine key differs from shard 0's: partitions cannot be moved to or "
            "from it until they are the same (docs/operations.md, \"Moving a partition\")",
            extra=kv(shard=own))
        return False
    return True


def deployment_engine_key(shards: Sequence[Redis], keys: Keys) -> str:
    """The deployment's engine key: shard 0's (made there first if needed). With shard 0 not
    answering, the key a majority of the shards holds (each dispatcher copied it to its own
    shard as it started), so a dispatcher can start while shard 0 is down. RuntimeError when
    neither can be had: signing with a key of its own would split the deployment's."""
    try:
        return EngineKey(shards[0], keys).load()
    except (RedisConnectionError, RedisTimeoutError):
        if len(shards) == 1:
            raise
    held: dict[str, int] = {}
    for r in shards[1:]:
        try:
            raw: Any = r.get(keys.engine_key)
        except (RedisConnectionError, RedisTimeoutError):
            continue
        if raw:
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            held[key] = held.get(key, 0) + 1
    best = max(held.items(), key=lambda kv_: kv_[1], default=None)
    if best is None or best[1] < len(shards) // 2 + 1:
        raise RuntimeError("shard 0 does not answer and no majority of the other shards holds one engine "
                           "key: start this dispatcher once shard 0 is back")
    logging.getLogger("parley.dispatcher").warning(
        "shard 0 does not answer: the engine key is the one a majority of the shards holds",
        extra=kv(shards=best[1]))
    return best[0]
