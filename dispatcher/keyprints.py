"""A dispatcher's fingerprints of the keys it verifies with, kept in its shard's
`parley:keyprints` (schemas/keyprints.py says what they are and why), so that the inbox can say
at its start when it signs with a key the dispatchers do not have.

Written at start and whenever the keyring's keys change (a reload on SIGHUP or a change of the
file: dispatcher/keys_reload.py), from the consume loop, so an outage at start only delays it;
deleted at a clean stop. A dispatcher that dies leaves its record behind: every dispatcher
deletes, once a minute, the records of those that stopped registering as live
(`parley:dispatchers`), and writes its own again should it be missing or stale (deleted by
hand, or by another that took this one for dead through a long pause; or a publish that failed).
"""

import logging
import time
from collections.abc import Mapping

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley.runtime.logs import kv
from parley.schemas.keyprints import Keyprints, departed, read_published, text_of
from parley.schemas.keys import Keys

log = logging.getLogger("parley.dispatcher")


class KeyprintsPublisher:
    #: how often the records of departed dispatchers are deleted (and ours checked)
    PRUNE_EVERY_S = 60.0
    #: a record is departed once its dispatcher has not registered, nor published, for this long
    #: (several leases: a dispatcher registers every third of one)
    GRACE_MS = 60_000

    def __init__(self, redis: Redis, keys: Keys, name: str):
        self.redis, self.keys, self.name = redis, keys, name
        #: the keys last published (None: not yet)
        self._published: Mapping[str, tuple[str, ...]] | None = None
        self._pruned_at = time.monotonic()
        self._failing = False

    def maintain(self, keys: Mapping[str, tuple[str, ...]]) -> None:
        """Publish `keys` (the keyring's) when they are not what was published last; once a
        minute, delete departed dispatchers' records. An outage propagates (the loop waits it
        out and this runs again); any other refusal (an ACL without the grant, the key made
        another type) is logged and retried a minute later: a fingerprint never stops the
        dispatcher from applying entries."""
        due = self._published is None or (keys is not self._published and keys != self._published)
        if not due and time.monotonic() - self._pruned_at < self.PRUNE_EVERY_S:
            return
        try:
            if due:
                self._publish(keys)
            else:
                self._prune(keys)
        except (RedisConnectionError, RedisTimeoutError):
            raise
        except RedisError as exc:
            self._published, self._pruned_at = keys, time.monotonic()  # again at the next prune
            if not self._failing:
                log.warning("signing keys' fingerprints not published: the inbox cannot check its keys "
                            "against this dispatcher's", extra=kv(key=self.keys.keyprints, error=str(exc)))
            self._failing = True
            return
        if self._failing:
            log.info("signing keys' fingerprints published again", extra=kv(key=self.keys.keyprints))
        self._failing = False

    def _publish(self, keys: Mapping[str, tuple[str, ...]]) -> None:
        record = Keyprints.of(keys, int(time.time() * 1000))
        self.redis.hset(self.keys.keyprints, self.name, record.encode())
        self._published, self._pruned_at = keys, time.monotonic()
        log.info("signing keys' fingerprints published", extra=kv(key=self.keys.keyprints,
                                                                   principals=len(keys)))

    def _prune(self, keys: Mapping[str, tuple[str, ...]]) -> None:
        self._pruned_at = time.monotonic()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.keyprints)
        pipe.zrange(self.keys.dispatchers, 0, -1, withscores=True)
        fields, registered = pipe.execute()
        found = read_published(fields)
        now_ms = int(time.time() * 1000)
        live = {text_of(n): s for n, s in registered}
        gone = [name for name in departed(found, live, now_ms, self.GRACE_MS) if name != self.name]
        if gone:
            self.redis.hdel(self.keys.keyprints, *gone)
            log.info("fingerprints of departed dispatchers deleted",
                     extra=kv(key=self.keys.keyprints, dispatchers=",".join(gone)))
        ours = next((r.prints for r in found.records if r.dispatcher == self.name), None)
        if ours is None or ours.principals != Keyprints.of(keys, 0).principals:
            self._publish(keys)  # deleted meanwhile, or a publish that failed

    def withdraw(self) -> None:
        """At a clean stop: this dispatcher verifies nothing any more."""
        self.redis.hdel(self.keys.keyprints, self.name)
