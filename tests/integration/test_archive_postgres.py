"""The archive consumer (examples/archive_postgres.py) on a real Redis and a real PostgreSQL
(docs/operations.md, "Archive consumer"): what it stores is what `parley export` prints, the
stream keeps nothing it stored, a second delivery upserts the same row, a dead consumer's
entries are taken over, and an entry it cannot store is set aside with its error."""

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import redis

from examples.archive_postgres import ArchiveConfig, ArchiveConsumer
from parley.client import Client
from parley.runtime.procs import RedisServer, free_port
from tests.forkserver import run_parley
from tests.integration.conftest import KEYS, MakeDispatcher, send, tick
from tests.integration.sessions import APP, archive_entry_of, make_session, write_archive_entry

ROOT = Path(__file__).resolve().parents[2]
GROUP = "parley-archive"


def consumer(r: redis.Redis, dsn: str, pg_schema: str, name: str = "c-1", **config: Any) -> ArchiveConsumer:
    config.setdefault("block_ms", 10)
    return ArchiveConsumer(r, KEYS, ArchiveConfig(dsn=dsn, schema=pg_schema, consumer=name, **config))


def rows(dsn: str, pg_schema: str) -> list[tuple[str, datetime, Any]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT session, closed_at, document FROM {pg_schema}.parley_sessions "
                            "ORDER BY session").fetchall()


def rejected(dsn: str, pg_schema: str) -> list[tuple[str, str, bytes]]:
    with psycopg.connect(dsn) as conn:
        return [(i, e, bytes(f)) for i, e, f in conn.execute(
            f"SELECT entry_id, error, fields FROM {pg_schema}.parley_sessions_rejected ORDER BY entry_id")]


def drain(c: ArchiveConsumer) -> None:
    while c.tick():
        pass


def pending(r: redis.Redis) -> int:
    return int(r.xpending(KEYS.archive, GROUP)["pending"])


def test_the_stored_document_is_the_export_and_the_stream_keeps_nothing(
        r: redis.Redis, client: Client, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    d = make_dispatcher(app=APP)
    make_session(r, d)
    # Closed when the engine lets a producer close it (its dispatcher then archives it);
    # until then the entry is written here by the same Lua function.
    send(r, "s-exp", {"type": "session.close", "reason": "done"})
    tick(d)
    entry = archive_entry_of(r, "s-exp")
    closed_at = int(r.xrange(KEYS.archive, entry, entry)[0][1][b"closed_at"])
    drain(consumer(r, pg_dsn, pg_schema))
    [(session, at, document)] = rows(pg_dsn, pg_schema)
    assert (session, at) == ("s-exp", datetime.fromtimestamp(closed_at / 1000, tz=UTC))
    assert document == client.export("s-exp").model_dump(mode="json")
    assert document["interrupts"] or document["status"] == "closed"  # open until closing cancels it
    assert r.xlen(KEYS.archive) == 0 and pending(r) == 0


def test_parley_export_matches_what_was_archived(
        r: redis.Redis, make_dispatcher: MakeDispatcher, redis_server: RedisServer, pg_dsn: str,
        pg_schema: str) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    drain(consumer(r, pg_dsn, pg_schema))
    env = {**os.environ, "PARLEY_REDIS_URL": redis_server.url,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = run_parley(["export", "s-exp"],
                         env=env, timeout=60, check=True)
    [(_session, _at, document)] = rows(pg_dsn, pg_schema)
    assert orjson.loads(out.stdout) == document
    assert [i["interrupt_id"] for i in document["interrupts"]] == ["int-1"]
    assert document["roots"] == ["msg-1", "msg-4"] and len(document["events"]) == r.xlen(KEYS.events("s-exp"))


def test_a_second_delivery_upserts_the_same_row(
        r: redis.Redis, client: Client, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    """A dispatcher that crashed after writing the entry writes it again; a consumer that
    crashed after committing and before acknowledging has the entry delivered again."""
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp", closed_at=7_000)
    write_archive_entry(r, "s-exp", closed_at=7_000)
    crashed = consumer(r, pg_dsn, pg_schema, name="crashed", claim_idle_ms=1)
    crashed.ensure_group()
    batch = crashed.read()
    crashed.store(batch)  # committed in PostgreSQL, then the process dies: nothing acknowledged
    crashed.close()
    assert pending(r) == 2 and len(rows(pg_dsn, pg_schema)) == 1
    time.sleep(0.01)
    drain(consumer(r, pg_dsn, pg_schema, name="heir", claim_idle_ms=1))
    [(session, _at, document)] = rows(pg_dsn, pg_schema)
    assert session == "s-exp" and document == client.export("s-exp").model_dump(mode="json")
    assert r.xlen(KEYS.archive) == 0 and pending(r) == 0


def test_a_dead_consumers_entries_are_taken_over(
        r: redis.Redis, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    c = consumer(r, pg_dsn, pg_schema, name="heir", claim_idle_ms=60_000)
    c.ensure_group()  # the group as a consumer made it before
    # read, then the reader died
    [(_stream, [(entry, _fields)])] = r.xreadgroup(GROUP, "dead", {KEYS.archive: ">"})
    assert c.tick() == 0 and rows(pg_dsn, pg_schema) == []  # not yet idle long enough: left alone
    # the dead reader's entry as it is two minutes on (XCLAIM's IDLE sets its idle time, kept
    # by the same consumer): no wall-clock wait, and a slow machine cannot cross the limit early
    r.xclaim(KEYS.archive, GROUP, "dead", 0, [entry], idle=120_000)
    drain(c)
    assert [s for s, _at, _doc in rows(pg_dsn, pg_schema)] == ["s-exp"]
    assert r.xlen(KEYS.archive) == 0 and pending(r) == 0


def test_a_restarted_consumer_stores_what_it_held_at_once(
        r: redis.Redis, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    first = consumer(r, pg_dsn, pg_schema, name="same")
    first.ensure_group()
    first.read()  # read, then the process died
    drain(consumer(r, pg_dsn, pg_schema, name="same"))  # restarted under its name: no idle wait
    assert len(rows(pg_dsn, pg_schema)) == 1 and r.xlen(KEYS.archive) == 0 and pending(r) == 0


def test_a_late_older_entry_does_not_replace_a_newer_close(
        r: redis.Redis, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    """A session id used again after its first life expired: each close archives it; the row
    keeps the latest, whatever order the entries arrive in."""
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp", closed_at=9_000)
    write_archive_entry(r, "s-exp", closed_at=8_000)
    drain(consumer(r, pg_dsn, pg_schema))
    [(_session, at, _document)] = rows(pg_dsn, pg_schema)
    assert at == datetime.fromtimestamp(9, tz=UTC)


def test_an_entry_it_cannot_store_is_set_aside_with_its_error_and_the_rest_is_stored(
        r: redis.Redis, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    d = make_dispatcher(app=APP)
    make_session(r, d)
    bad = r.xadd(KEYS.archive, {"session": "s-bad", "closed_at": "1"}).decode()  # type: ignore[union-attr]
    # jsonb cannot hold a NUL character: PostgreSQL refuses this one document
    send(r, "s-nul", {"type": "message.create", "content": "a\u0000b"})
    tick(d)
    nul = write_archive_entry(r, "s-nul")
    write_archive_entry(r, "s-exp")
    drain(consumer(r, pg_dsn, pg_schema))
    assert [s for s, _at, _doc in rows(pg_dsn, pg_schema)] == ["s-exp"]
    [(bad_id, bad_error, bad_fields), (nul_id, nul_error, nul_fields)] = rejected(pg_dsn, pg_schema)
    assert (bad_id, bad_error) == (bad, "the archive entry lacks document")
    assert orjson.loads(bad_fields) == {"session": "s-bad", "closed_at": "1"}
    assert nul_id == nul and nul_error.startswith("PostgreSQL refused the document: ")
    assert "a\\u0000b" in orjson.loads(nul_fields)["document"]  # kept whole, as bytes
    assert r.xlen(KEYS.archive) == 0 and pending(r) == 0


def test_while_postgresql_is_down_nothing_is_taken_from_the_stream(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    down = consumer(r, f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=2", "public")
    with pytest.raises(psycopg.OperationalError):
        down.tick()
    assert r.xlen(KEYS.archive) == 1 and r.xinfo_groups(KEYS.archive) == []  # nothing read


def test_the_example_runs_as_a_script(
        r: redis.Redis, client: Client, make_dispatcher: MakeDispatcher, redis_server: RedisServer,
        pg_dsn: str, pg_schema: str) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    script = [sys.executable, str(ROOT / "examples" / "archive_postgres.py"), "--redis-url", redis_server.url]
    out = subprocess.run([*script, "--dsn", pg_dsn, "--schema", pg_schema, "--burst"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "archived 1 session(s), rejected 0" in out.stderr
    [(_session, _at, document)] = rows(pg_dsn, pg_schema)
    assert document == client.export("s-exp").model_dump(mode="json")
    assert r.xlen(KEYS.archive) == 0
    # a bad option is one line, not a traceback, and a password in the DSN is never printed
    out = subprocess.run([*script, "--dsn", "password=hunter2", "--table", "no-dashes"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "hunter2" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("table 'no-dashes': use 1-54 letters, digits "
                                                         "or '_', not starting with a digit")


@pytest.fixture
def pg_role(pg_dsn: str) -> Iterator[str]:
    """A login role of this test's own, with no privilege at all; dropped after."""
    role = f"parley_role_{secrets.token_hex(6)}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def with_user(dsn: str, role: str) -> str:
    return " ".join([*(p for p in dsn.split() if not p.startswith("user=")), f"user={role}"])


def test_a_user_granted_only_its_tables_is_enough_and_without_grants_it_stops(
        r: redis.Redis, client: Client, make_dispatcher: MakeDispatcher, redis_server: RedisServer,
        pg_dsn: str, pg_schema: str, pg_role: str) -> None:
    make_session(r, make_dispatcher(app=APP))
    write_archive_entry(r, "s-exp")
    script = [sys.executable, str(ROOT / "examples" / "archive_postgres.py"), "--redis-url", redis_server.url,
              "--dsn", with_user(pg_dsn, pg_role), "--schema", pg_schema, "--burst"]
    out = subprocess.run(script, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "archive consumer stopped: permission denied for schema" in out.stderr
    assert r.xlen(KEYS.archive) == 1  # nothing taken from the stream
    # the tables made by an administrator, and only what the consumer does granted on them
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        consumer(r, pg_dsn, pg_schema).ensure_tables(conn)
        conn.execute(f"GRANT USAGE ON SCHEMA {pg_schema} TO {pg_role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON {pg_schema}.parley_sessions, "
                     f"{pg_schema}.parley_sessions_rejected TO {pg_role}")
    out = subprocess.run(script, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    [(_session, _at, document)] = rows(pg_dsn, pg_schema)
    assert document == client.export("s-exp").model_dump(mode="json")
