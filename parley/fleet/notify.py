"""`parley notify`: forward the fleet-wide feed (docs/protocol.md, "Feed") to a webhook.

The pure part (what is posted, how it is signed and verified, how long to wait before the
next try) is written and unit-tested once (tests/unit/test_notify.py); `Forwarder` is the thin
loop around it: a consumer group on the feed, one POST per entry, retries with backoff, a
dead-letter stream once an entry has failed `max_attempts` times. Delivery is at least once:
an entry is acknowledged only after its POST succeeded (or it was dead-lettered), so a
receiver may see an entry twice after a forwarder crash and tells them apart by the
`Parley-Delivery` header.

With several shards each shard has its own feed (its own group and dead-letter stream there).
`TimeOrdered` forwards them all from one loop, in time order across shards within each read
round: a batch is read from every shard's feed, its entries ordered by their stream id's
milliseconds (ties by shard; a shard's own entries keep their order), posted in that order,
and each acknowledged on its own shard.
"""

import hashlib
import hmac
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley.client.feed import FeedEntry, FeedEntryError, parse_entry
from parley.client.feed import text as _text
from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.runtime.redis_errors import group_gone
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys

log = logging.getLogger("parley.notify")

SIGNATURE_HEADER = "Parley-Signature"
DELIVERY_HEADER = "Parley-Delivery"
EVENT_HEADER = "Parley-Event"
DEFAULT_GROUP = "parley-notify"
DEAD_MAXLEN = 100_000
# A receiver refuses a signature older than this: a captured request cannot be replayed later.
SIGNATURE_TOLERANCE_S = 300



def run_through_outages(stop: threading.Event, step: Callable[[], None],
                        regroup: Callable[[], list[str]] | None = None) -> None:
    """Run `step` until `stop`: a Redis outage (a connection or timeout error out of it) is
    waited out with backoff and `step` run again; nothing was acknowledged meanwhile.

    `NOGROUP` out of it (the feed deleted, and its group with it) calls `regroup`, which makes
    the group again, and runs `step` again: otherwise the process would stop for good on the
    first read. Said once a time, at warning; paced by a backoff if it keeps happening."""
    outages = nogroups = 0
    last_nogroup = float("-inf")
    while not stop.is_set():
        try:
            step()
            outages = 0
        except (RedisConnectionError, RedisTimeoutError) as exc:
            delay = backoff(outages, base=0.25, cap=5.0, jitter=True)
            outages += 1
            log.warning("redis unavailable", extra=kv(error=repr(exc), backoff_s=delay))
            stop.wait(delay)
        except ResponseError as exc:
            if regroup is None or not group_gone(exc):
                raise
            now = time.monotonic()
            nogroups = nogroups + 1 if now - last_nogroup < 60 else 0
            last_nogroup = now
            try:
                made = regroup()
            except RedisError as again:  # an outage right after the NOGROUP: back off, try again
                log.warning("could not make the feed's consumer group again",
                            extra=kv(error=repr(again)))
                stop.wait(backoff(nogroups, base=0.05, cap=5.0, jitter=True))
                continue
            log.warning("the feed's consumer group was gone (the feed deleted?): made again from "
                        "id 0, forwarding on", extra=kv(error=str(exc), made=",".join(made)))
            stop.wait(backoff(nogroups, base=0.05, cap=5.0, jitter=True) if nogroups else 0)

def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `Parley-Signature` header: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`
    (Stripe's scheme: the timestamp is signed too, so an old request cannot be replayed)."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: bytes, header: str, body: bytes, now: float | None = None,
           tolerance_s: float = SIGNATURE_TOLERANCE_S) -> bool:
    """What a receiver runs: the header is well formed, recent, and its MAC matches `body`.
    `now`: the receiver's clock, in seconds (`time.time()` when not given)."""
    if now is None:
        now = time.time()
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), f"t={timestamp},v1={parts.get('v1', '')}")


def headers(secret: bytes, entry: FeedEntry, body: bytes, now: float) -> dict[str, str]:
    return {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, int(now), body),
            DELIVERY_HEADER: entry.entry_id, EVENT_HEADER: entry.type}


def retry_delay(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds before the next POST of an entry that failed `failures` times (>= 1): exponential,
    jittered, so forwarders retrying together do not hit a recovering receiver in lockstep."""
    return backoff(failures - 1, base=base_s, cap=cap_s, jitter=True)


def is_dead(failures: int, max_attempts: int) -> bool:
    """Whether an entry that failed `failures` times goes to the dead-letter stream."""
    return failures >= max_attempts


def wanted(entry: FeedEntry, types: frozenset[str] | None) -> bool:
    """Whether the forwarder posts this entry (`--types`); others are acknowledged unposted."""
    return types is None or entry.type in types


def stream_ms(entry_id: Any) -> int:
    """The milliseconds of a stream entry id (`<ms>-<seq>`): when the shard wrote the entry."""
    return int(_text(entry_id).split("-", 1)[0])


def time_order(batches: Sequence[Sequence[tuple[Any, Any]]]) -> list[tuple[int, Any, Any]]:
    """(shard, entry id, fields) of every shard's batch (`batches[i]` read from shard i), in time
    order across shards: by the milliseconds of the entry's id, ties by shard. The sort is
    stable, so the entries of one shard keep their own order."""
    tagged = [(shard, entry_id, fields) for shard, batch in enumerate(batches) for entry_id, fields in batch]
    return sorted(tagged, key=lambda t: (stream_ms(t[1]), t[0]))


def load_secret(path: str | None, from_env: str | None) -> bytes:
    """The signing secret: the file's content (trailing newline dropped), else `from_env` (env
    PARLEY_WEBHOOK_SECRET). ValueError when there is none: an unsigned webhook could be forged."""
    if path is not None:
        with open(path, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
    else:
        secret = (from_env or "").encode()
    if not secret:
        raise ValueError("no webhook secret: set PARLEY_WEBHOOK_SECRET or pass --secret-file")
    return secret


@dataclass(frozen=True)
class NotifyConfig:
    url: str
    secret: bytes
    group: str = DEFAULT_GROUP
    consumer: str = ""
    types: frozenset[str] | None = None
    max_attempts: int = 8
    timeout_s: float = 10.0
    retry_base_s: float = 0.5
    retry_cap_s: float = 30.0
    # An entry a forwarder has not touched for this long is taken over by another. A live
    # forwarder touches the entries it holds before a POST once a quarter of this has passed,
    # and at most one POST and one wait lie between two POSTs: so it must be longer than those.
    claim_idle_ms: int = 60_000
    batch: int = 50
    block_ms: int = 1000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max attempts must be at least 1, not {self.max_attempts}")
        longest_gap_ms = (self.timeout_s + self.retry_cap_s) * 1000
        if self.claim_idle_ms <= longest_gap_ms:
            raise ValueError(
                f"the claim idle time ({self.claim_idle_ms / 1000:g} s) must exceed the POST timeout "
                f"plus the longest retry wait ({longest_gap_ms / 1000:g} s), or a live forwarder's "
                "entries would be taken over and posted twice")

    def __repr__(self) -> str:  # the secret never reaches a log line
        return f"NotifyConfig(url={self.url!r}, group={self.group!r}, consumer={self.consumer!r})"


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Forwarder:
    """One forwarder process: reads the feed with a consumer group, posts, acknowledges."""

    def __init__(self, redis: Redis, keys: Keys, config: NotifyConfig,
                 http: httpx.Client | None = None):
        self.redis = redis
        self.keys = keys
        self.config = config
        self.consumer = config.consumer or consumer_name()
        self.http = http or httpx.Client(timeout=config.timeout_s)
        self.health: metrics.Health | None = None
        self.held: deque[Any] = deque()  # ids of the current batch not yet acknowledged, in order
        self.touched_at = time.monotonic()
        #: what a POST's loop calls to keep the held entries this forwarder's: its own, or, when
        #: shards are forwarded together (`TimeOrdered`), every shard's held entries
        self.keep: Callable[[], None] = self.keep_held
        #: take the entries this consumer read and has not finished before anything else: set at
        #: each (re)start of the loop, so that after an outage mid-batch nothing read later is
        #: posted before them (otherwise they would wait out the claim idle time, and every later
        #: entry would overtake them: feed order is promised, docs/operations.md)
        self.own_first = True
        metrics.init_notify_metrics()

    def ensure_group(self) -> None:
        """The group starts at the feed's end: a first forwarder posts what happens from now on."""
        try:
            self.redis.xgroup_create(self.keys.feed, self.config.group, id="$", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def regroup(self) -> list[str]:
        """After `NOGROUP`: the group made again, from id 0 this time, not the end: the feed was
        deleted (its group went with it), so all it holds now was written after the DEL and
        none of it was posted; `$` would skip what the commits wrote before the group was made
        again. Only when the group alone was destroyed (`XGROUP DESTROY`, the feed kept) is the
        feed's content posted again: delivery is at least once, and the receiver tells a second
        delivery by the entry's `id`. The feed when the group was made now, else nothing."""
        try:
            self.redis.xgroup_create(self.keys.feed, self.config.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return []
        return [self.keys.feed]

    def run(self, stop: threading.Event) -> None:
        """Until `stop`; a Redis outage is waited out with backoff (nothing is acknowledged
        meanwhile, so nothing is lost), a deleted feed's group made again (`regroup`)."""
        def step() -> None:
            self.ensure_group()
            self.own_first = True
            self.tick(stop)

        run_through_outages(stop, step, self.regroup)

    def tick(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.beat()
            batch = self.take_own() or self.reclaim() or self.read()
            self.held = deque(entry_id for entry_id, _fields in batch)
            self.touched_at = time.monotonic()
            for entry_id, fields in batch:
                if stop.is_set():
                    return  # left pending: another forwarder (or this one restarted) takes it
                self.forward(entry_id, fields, stop)
                self.held.popleft()

    def beat(self) -> None:
        if self.health is not None:
            self.health.beat()

    def read(self, block_ms: int | None = -1) -> Sequence[tuple[Any, Any]]:
        """New entries: blocking `block_ms` (-1: the configured time; None: not at all)."""
        block = self.config.block_ms if block_ms == -1 else block_ms
        reply: Any = self.redis.xreadgroup(self.config.group, self.consumer, {self.keys.feed: ">"},
                                           count=self.config.batch, block=block)
        return reply[0][1] if reply else []

    def take_own(self) -> Sequence[tuple[Any, Any]]:
        """While `own_first`: the next entries this consumer read earlier and has not finished
        (XREADGROUP from 0, in feed order), else nothing. A trimmed one (it comes back without
        fields) is acknowledged: there is nothing left to post. Fewer than a batch: all taken."""
        while self.own_first:
            reply: Any = self.redis.xreadgroup(self.config.group, self.consumer, {self.keys.feed: "0"},
                                               count=self.config.batch)
            entries = reply[0][1] if reply else []
            if len(entries) < self.config.batch:
                self.own_first = False
            gone = [entry_id for entry_id, fields in entries if not fields]
            if gone:
                self.redis.xack(self.keys.feed, self.config.group, *gone)
            kept = [(entry_id, fields) for entry_id, fields in entries if fields]
            if kept:
                return kept
        return []

    def reclaim(self) -> Sequence[tuple[Any, Any]]:
        """Entries a dead forwarder read and never acknowledged (XAUTOCLAIM)."""
        reply: Any = self.redis.xautoclaim(self.keys.feed, self.config.group, self.consumer,
                                           min_idle_time=self.config.claim_idle_ms, start_id="0-0",
                                           count=self.config.batch)
        claimed = [(i, f) for i, f in reply[1] if f]  # a trimmed entry comes back without fields
        if claimed:
            metrics.NOTIFY_RECLAIMED.inc(len(claimed))
        return claimed

    def forward(self, entry_id: Any, fields: dict[Any, Any], stop: threading.Event) -> None:
        try:
            entry = parse_entry(entry_id, fields)
        except FeedEntryError as exc:
            self.dead_letter(entry_id, fields, str(exc), 0)
            return
        if not wanted(entry, self.config.types):
            self.redis.xack(self.keys.feed, self.config.group, entry_id)
            return
        body = entry.body()
        failures = 0
        while True:
            self.beat()  # retrying a receiver that is down is the loop turning, not stalled
            self.keep()
            error = self.post(entry, body)
            if error is None:
                self.redis.xack(self.keys.feed, self.config.group, entry_id)
                metrics.NOTIFY_FORWARDED.labels(entry.type).inc()
                return
            failures += 1
            log.warning("webhook failed", extra=kv(entry=entry.entry_id, session=entry.session,
                                                   error=error, failures=failures))
            if is_dead(failures, self.config.max_attempts):
                self.dead_letter(entry_id, fields, error, failures)
                return
            if stop.wait(retry_delay(failures, self.config.retry_base_s, self.config.retry_cap_s)):
                return

    def post(self, entry: FeedEntry, body: bytes) -> str | None:
        """None when the receiver took the entry (2xx), else why not."""
        started = time.perf_counter()
        try:
            response = self.http.post(self.config.url, content=body,
                                      headers=headers(self.config.secret, entry, body, time.time()))
        except httpx.TimeoutException:
            metrics.NOTIFY_FAILED.labels("timeout").inc()
            return "timeout"
        except httpx.HTTPError as exc:
            metrics.NOTIFY_FAILED.labels("connection").inc()
            return f"connection: {exc}"
        finally:
            metrics.NOTIFY_SECONDS.observe(time.perf_counter() - started)
        if 200 <= response.status_code < 300:
            return None
        metrics.NOTIFY_FAILED.labels("status").inc()
        return f"status {response.status_code}"

    def keep_held(self) -> None:
        """Reset the idle time of the entries this forwarder holds and has not finished (the
        one it posts and the rest of its batch) once a quarter of the claim idle time has
        passed: it is alive, so nobody else takes them over and posts them twice."""
        if not self.held or time.monotonic() - self.touched_at < self.config.claim_idle_ms / 4000:
            return
        # Only entries idle for an eighth of the claim time: ours are (a quarter has passed since
        # we last touched them); one another forwarder took over a moment ago is not, so a
        # forwarder waking from a pause does not take it back and post it a second time.
        self.redis.xclaim(self.keys.feed, self.config.group, self.consumer,
                          self.config.claim_idle_ms // 8, list(self.held), justid=True)
        self.touched_at = time.monotonic()

    def dead_letter(self, entry_id: Any, fields: dict[Any, Any], error: str, failures: int) -> None:
        """Copy the entry with why it failed to the dead-letter stream and acknowledge it, in
        one MULTI: it is in one of the two streams' hands, never in neither."""
        copy: dict[Any, Any] = {**{_text(k): v for k, v in fields.items()},
                "feed_id": _text(entry_id), "error": error, "attempts": failures}
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.keys.feed_dead, copy, maxlen=DEAD_MAXLEN, approximate=True)
        pipe.xack(self.keys.feed, self.config.group, entry_id)
        pipe.execute()
        metrics.NOTIFY_DEAD.inc()
        log.error("feed entry dead-lettered", extra=kv(entry=_text(entry_id), error=error,
                                                       attempts=failures))


#: when no shard's feed has anything, `TimeOrdered` blocks on one shard's feed at a time, in
#: turn, this long: an entry on any shard waits about this long at most before it is read
TURN_BLOCK_MS = 100


class TimeOrdered:
    """The forwarders of every shard's feed, in one loop that posts each read round in time
    order across shards (see the module's account). A shard that is down holds the others up
    until it is back (nothing is acknowledged meanwhile, so nothing is lost): a deployment
    that would rather keep them apart runs one forwarder per shard (`--shard`)."""

    def __init__(self, forwarders: Sequence[Forwarder], turn_block_ms: int = TURN_BLOCK_MS):
        if not forwarders:
            raise ValueError("no feed to forward")
        self.forwarders = list(forwarders)
        self.turn_block_ms = turn_block_ms
        self.turn = 0
        for forwarder in self.forwarders:
            # a POST to one shard's entry may take long: every shard's batch must stay ours
            forwarder.keep = self.keep_held

    def keep_held(self) -> None:
        for forwarder in self.forwarders:
            forwarder.keep_held()

    def run(self, stop: threading.Event) -> None:
        """Until `stop`; a Redis outage is waited out with backoff, as `Forwarder.run`."""
        def step() -> None:
            for forwarder in self.forwarders:
                forwarder.ensure_group()
                forwarder.own_first = True
            self.tick(stop)

        def regroup() -> list[str]:  # whichever shard's feed it was: BUSYGROUP on the others
            return [feed for forwarder in self.forwarders for feed in forwarder.regroup()]

        run_through_outages(stop, step, regroup)

    def read_round(self) -> list[Sequence[tuple[Any, Any]]]:
        """One batch of every shard (entries taken over from a dead forwarder first). When all
        are empty, one shard's feed is read blocking, in turn, then the others' again, so that
        an idle loop neither spins nor leaves one shard's entries waiting behind another's.
        After a (re)start, every shard's unfinished entries come first, in one round."""
        if any(f.own_first for f in self.forwarders):
            own = [f.take_own() for f in self.forwarders]
            if any(own):
                return own
        batches = [f.reclaim() or f.read(block_ms=None) for f in self.forwarders]
        if any(batches):
            return batches
        i = self.turn % len(self.forwarders)
        self.turn += 1
        woke = self.forwarders[i].read(block_ms=self.turn_block_ms)
        if not woke:
            return batches
        return [woke if j == i else f.read(block_ms=None) for j, f in enumerate(self.forwarders)]

    def tick(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.forwarders[0].beat()
            batches = self.read_round()
            now = time.monotonic()
            for forwarder, batch in zip(self.forwarders, batches, strict=True):
                forwarder.held = deque(entry_id for entry_id, _fields in batch)
                forwarder.touched_at = now
            for shard, entry_id, fields in time_order(batches):
                if stop.is_set():
                    return  # left pending on its shard: taken over later, as by `Forwarder`
                forwarder = self.forwarders[shard]
                forwarder.forward(entry_id, fields, stop)
                forwarder.held.popleft()
