"""An archive consumer: store each closed session's document in PostgreSQL before it expires.

    python examples/archive_postgres.py --redis-url redis://localhost:6379/0 \\
        --dsn "host=127.0.0.1 dbname=app user=parley"

When a session closes, the dispatcher writes its whole document to the stream `parley:archive`
(docs/protocol.md, "Export and archive"). This consumer reads that stream through a consumer
group and upserts each document into a table (created if missing):

    parley_sessions(session text primary key, closed_at timestamptz, document jsonb,
                    archived_at timestamptz)

`document` is the session's export, exactly what `parley export S` prints while the session is
still in Redis. A batch of entries is stored in one transaction, and only once it is committed
are the entries acknowledged and deleted from the stream (XACK + XDEL in one MULTI), so the
stream does not keep what PostgreSQL holds. A consumer that dies between the two leaves its
entries pending: another consumer of the group (or this one, restarted) takes them over after
`--claim-idle` seconds (XAUTOCLAIM) and stores them again, which upserts the same row. An entry
that cannot be stored as it is (not an archive entry; a document PostgreSQL refuses, e.g. a
NUL character, which jsonb cannot hold) goes to `parley_sessions_rejected` with the error,
as bytes, so nothing is lost: docs/operations.md, "Archive consumer".

This file is an example to copy and adapt (examples/ is not installed with the package); it
needs `psycopg[binary]>=3.2` (psycopg 3).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
import redis
from psycopg import sql
from redis.exceptions import ResponseError

from parley.client.export import ExportError, archive_entry
from parley.runtime.redis_errors import group_gone
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys

log = logging.getLogger("parley.archive")

DEFAULT_GROUP = "parley-archive"
DEFAULT_TABLE = "parley_sessions"
IDENTIFIER = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,62}\Z")

Entry = tuple[Any, dict[Any, Any]]


@dataclass(frozen=True)
class ArchiveConfig:
    dsn: str
    schema: str = "public"
    table: str = DEFAULT_TABLE
    group: str = DEFAULT_GROUP
    consumer: str = ""
    #: entries stored in one transaction
    batch: int = 100
    block_ms: int = 2000
    #: an entry another consumer read and has not acknowledged for this long is taken over
    claim_idle_ms: int = 60_000

    def __post_init__(self) -> None:
        for what, name in (("schema", self.schema), ("table", self.table)):
            # the rejected table is named after the table, so leave it room under 63 characters
            if not IDENTIFIER.match(name) or len(name) > 54:
                raise ValueError(f"{what} {name!r}: use 1-54 letters, digits or '_', not starting "
                                 "with a digit")
        if self.batch < 1 or self.claim_idle_ms < 1:
            raise ValueError("batch and claim idle time must be positive")

    def __repr__(self) -> str:  # a DSN may hold a password: it never reaches a log line
        return f"ArchiveConfig(schema={self.schema!r}, table={self.table!r}, group={self.group!r})"


@dataclass(frozen=True)
class Stored:
    """What one batch did: entries upserted, entries set aside as rejected."""

    upserted: int
    rejected: int


class ArchiveConsumer:
    """Reads `parley:archive` with a consumer group and keeps PostgreSQL up to date with it."""

    def __init__(self, r: redis.Redis, keys: Keys, config: ArchiveConfig):
        self.redis = r
        self.keys = keys
        self.config = config
        self.consumer = config.consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.pg: psycopg.Connection[Any] | None = None
        #: read this consumer's own pending entries first (after a start or a failed batch): they
        #: are not new to the group, and would otherwise wait `claim_idle_ms` to be taken back
        self.own_pending_first = True
        self.group_ready = False
        self.table = sql.Identifier(config.schema, config.table)
        self.rejected_table = sql.Identifier(config.schema, f"{config.table}_rejected")

    # ---- setting up ------------------------------------------------------------------------------

    def ensure_group(self) -> None:
        """The group starts at the stream's first entry: every session not yet stored is."""
        try:
            self.redis.xgroup_create(self.keys.archive, self.config.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def connection(self) -> psycopg.Connection[Any]:
        if self.pg is None or self.pg.closed:
            self.pg = psycopg.connect(self.config.dsn)
            self.ensure_tables(self.pg)
        return self.pg

    def ensure_tables(self, pg: psycopg.Connection[Any]) -> None:
        """Create what is missing. Only what is missing: `CREATE ... IF NOT EXISTS` asks for the
        CREATE privilege even when there is nothing to create, and a consumer whose tables were
        made for it needs no more than INSERT, UPDATE and SELECT on them."""
        schema = sql.Identifier(self.config.schema)
        with pg.transaction():
            if not self._exists(pg, "to_regnamespace", schema):
                pg.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            if not self._exists(pg, "to_regclass", self.table):
                pg.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (session text PRIMARY KEY, "
                    "closed_at timestamptz NOT NULL, document jsonb NOT NULL, "
                    "archived_at timestamptz NOT NULL)").format(self.table))
            if not self._exists(pg, "to_regclass", self.rejected_table):
                pg.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (entry_id text PRIMARY KEY, error text NOT NULL, "
                    "fields bytea NOT NULL, rejected_at timestamptz NOT NULL)").format(self.rejected_table))

    @staticmethod
    def _exists(pg: psycopg.Connection[Any], lookup: str, name: sql.Identifier) -> bool:
        row = pg.execute(sql.SQL("SELECT {}(%s)").format(sql.Identifier(lookup)),
                         (name.as_string(pg),)).fetchone()
        return row is not None and row[0] is not None

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
            self.pg = None

    # ---- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, burst: bool = False) -> None:
        """Until `stop` (with `burst`, until the stream has nothing for this consumer). Redis or
        PostgreSQL unavailable is waited out with backoff: nothing is acknowledged meanwhile."""
        outages = 0
        while not stop.is_set():
            try:
                done = self.tick()
                outages = 0
                if burst and done == 0:
                    return
            except redis.ResponseError as exc:
                if not group_gone(exc):
                    raise
                # `parley:archive` deleted, its group with it: made again from id 0
                # (`ensure_group`), so nothing written to it since is skipped, and what it held
                # before the DEL is gone with it, never stored twice
                self.own_pending_first = True
                self.group_ready = False
                log.warning("the archive's consumer group was gone (the stream deleted?): "
                            "making it again from id 0: %s", exc)
                stop.wait(backoff(outages, base=0.05, cap=5.0))
                outages += 1
            except (redis.ConnectionError, redis.TimeoutError, psycopg.OperationalError) as exc:
                self.close()  # a broken PostgreSQL connection is opened anew
                self.own_pending_first = True
                self.group_ready = False  # a Redis restarted without its data has no group
                delay = backoff(outages, base=0.25, cap=10.0)
                outages += 1
                log.warning("archive store unavailable: %r; again in %.1f s", exc, delay)
                stop.wait(delay)

    def tick(self) -> int:
        """One batch: the entries a dead consumer left, else new ones; stored, then acknowledged.
        Returns how many entries it handled."""
        self.connection()  # PostgreSQL first: while it is down, entries stay with the group
        if not self.group_ready:
            self.ensure_group()
            self.group_ready = True
        batch = self.reclaim() or self.read()
        if not batch:
            return 0
        stored = self.store(batch)
        self.forget([entry_id for entry_id, _fields in batch])
        log.info("archived %d session(s), rejected %d", stored.upserted, stored.rejected)
        return len(batch)

    def read(self) -> Sequence[Entry]:
        reply: Any
        while self.own_pending_first:
            reply = self.redis.xreadgroup(self.config.group, self.consumer, {self.keys.archive: "0"},
                                          count=self.config.batch)
            entries = reply[0][1] if reply else []
            gone = [i for i, f in entries if not f]  # deleted from the stream: nothing to store
            if gone:
                self.redis.xack(self.keys.archive, self.config.group, *gone)
            if live := [(i, f) for i, f in entries if f]:
                return live
            self.own_pending_first = bool(entries)
        reply = self.redis.xreadgroup(self.config.group, self.consumer, {self.keys.archive: ">"},
                                      count=self.config.batch, block=self.config.block_ms)
        return reply[0][1] if reply else []

    def reclaim(self) -> Sequence[Entry]:
        """Entries another consumer read and never acknowledged (it died, or lost its
        PostgreSQL connection for good)."""
        reply: Any = self.redis.xautoclaim(self.keys.archive, self.config.group, self.consumer,
                                           min_idle_time=self.config.claim_idle_ms, start_id="0-0",
                                           count=self.config.batch)
        return [(i, f) for i, f in reply[1] if f]  # a deleted entry comes back without fields

    def store(self, batch: Sequence[Entry]) -> Stored:
        """Upsert the batch in one transaction. A row keeps the latest close of its session (a
        session id used again after expiry): an older entry delivered late changes nothing."""
        pg = self.connection()
        upserted = rejected = 0
        with pg.transaction():
            for entry_id, fields in batch:
                try:
                    entry = archive_entry(fields)
                except ExportError as exc:
                    self.reject(pg, entry_id, fields, str(exc))
                    rejected += 1
                    continue
                try:
                    with pg.transaction():  # a savepoint: one refused document spoils nothing else
                        pg.execute(sql.SQL(
                            "INSERT INTO {t} (session, closed_at, document, archived_at) "
                            "VALUES (%s, %s, %s::jsonb, now()) ON CONFLICT (session) DO UPDATE SET "
                            "closed_at = EXCLUDED.closed_at, document = EXCLUDED.document, "
                            "archived_at = EXCLUDED.archived_at WHERE {t}.closed_at <= EXCLUDED.closed_at"
                        ).format(t=self.table), (entry.session, _time(entry.closed_at),
                                                 entry.export.to_json().decode()))
                    upserted += 1
                except psycopg.DataError as exc:
                    self.reject(pg, entry_id, fields, f"PostgreSQL refused the document: {exc}")
                    rejected += 1
        return Stored(upserted, rejected)

    def reject(self, pg: psycopg.Connection[Any], entry_id: Any, fields: dict[Any, Any], error: str) -> None:
        log.error("archive entry %s rejected: %s", _text(entry_id), error)
        raw = orjson.dumps({_text(k): _text(v) for k, v in fields.items()})
        pg.execute(sql.SQL("INSERT INTO {} (entry_id, error, fields, rejected_at) VALUES (%s, %s, %s, now()) "
                           "ON CONFLICT (entry_id) DO NOTHING").format(self.rejected_table),
                   (_text(entry_id), error, raw))

    def forget(self, entry_ids: list[Any]) -> None:
        """Acknowledge and delete, in one MULTI: PostgreSQL has them now."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(self.keys.archive, self.config.group, *entry_ids)
        pipe.xdel(self.keys.archive, *entry_ids)
        pipe.execute()


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _text(value: Any) -> str:
    # bytes that are not UTF-8 are kept as \x escapes rather than lost
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("PARLEY_REDIS_URL", "redis://localhost:6379/0"),
                        help="Redis to read (env PARLEY_REDIS_URL)")
    parser.add_argument("--prefix", default=os.environ.get("PARLEY_PREFIX", "parley"),
                        help="Parley's key prefix (env PARLEY_PREFIX)")
    parser.add_argument("--dsn", default=os.environ.get("PARLEY_ARCHIVE_DSN"),
                        help="PostgreSQL connection string (env PARLEY_ARCHIVE_DSN)")
    parser.add_argument("--schema", default="public", help="schema of the tables (created if missing)")
    parser.add_argument("--table", default=DEFAULT_TABLE, help="table of the sessions (created if missing)")
    parser.add_argument("--group", default=DEFAULT_GROUP, help="consumer group on the archive stream")
    parser.add_argument("--name", default="", help="consumer name (default: host-pid)")
    parser.add_argument("--batch", type=int, default=100, help="entries stored per transaction")
    parser.add_argument("--claim-idle", type=float, default=60.0,
                        help="seconds before another consumer's unacknowledged entries are taken over")
    parser.add_argument("--burst", action="store_true", help="exit once the stream is drained")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.dsn:
        parser.error("--dsn (or env PARLEY_ARCHIVE_DSN) is required")
    try:
        config = ArchiveConfig(dsn=args.dsn, schema=args.schema, table=args.table, group=args.group,
                               consumer=args.name, batch=args.batch,
                               claim_idle_ms=int(args.claim_idle * 1000))
        keys = Keys(args.prefix)
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    consumer = ArchiveConsumer(redis.Redis.from_url(args.redis_url), keys, config)
    log.info("archive consumer %s started (stream %s, group %s, table %s.%s)", consumer.consumer,
             keys.archive, config.group, config.schema, config.table)
    try:
        consumer.run(stop, burst=args.burst)
    except (psycopg.Error, redis.RedisError) as exc:  # e.g. a refused login or a missing grant
        log.error("archive consumer stopped: %s", exc)
        return 1
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
