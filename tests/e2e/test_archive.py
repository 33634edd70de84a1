"""Export and archive end to end (docs/protocol.md, "Export and archive"; docs/operations.md,
"Archive consumer"): a session run by real dispatcher and worker processes is archived, the
example consumer (a process, as an operator runs it) stores it in PostgreSQL, and the stored
document is what `parley export` prints."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import psycopg
import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually, send, wait_for
from tests.integration.sessions import archive_entry_of

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()
SEED = "Email bob@example.com: the launch moved to Friday."


def run(procs: Procs, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, **procs.env("examples.seed_app")}
    return subprocess.run([sys.executable, *args], capture_output=True, env=env, timeout=60, check=False)


def test_a_session_archived_to_postgresql_is_what_parley_export_prints(
        procs: Procs, r: redis.Redis, client: Client, pg_dsn: str, pg_schema: str) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    send(r, "arch-1", {"type": "message.create", "content": SEED})
    wait_for(client, "arch-1", lambda e: e["type"] == "interrupt.raised")
    send(r, "arch-1", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    wait_for(client, "arch-1", lambda e: e["type"] == "turn.completed")
    # an edit of the first message: a second root, whose email is waiting for its answer
    send(r, "arch-1", {"type": "message.create", "content": "Email alice@example.com: it is Monday.",
                       "parent_id": None})
    wait_for(client, "arch-1", lambda e: e["type"] == "interrupt.raised" and e["interrupt_id"] == "int-2")
    # closed, once producers may close a session (its dispatcher then archives it)
    send(r, "arch-1", {"type": "session.close", "reason": "done"})
    wait_for(client, "arch-1", lambda e: e["type"] in ("session.closed", "input.refused"))
    eventually(lambda: r.exists(KEYS.outbox("arch-1")) == 0)  # the close's effects are flushed
    archive_entry_of(r, "arch-1")

    stored = run(procs, str(ROOT / "examples" / "archive_postgres.py"), "--dsn", pg_dsn,
                 "--redis-url", procs.url, "--schema", pg_schema, "--burst")
    assert stored.returncode == 0, stored.stderr
    exported = run(procs, "-m", "parley", "export", "arch-1")
    assert exported.returncode == 0, exported.stderr
    with psycopg.connect(pg_dsn) as conn:
        [(session, document)] = conn.execute(
            f"SELECT session, document FROM {pg_schema}.parley_sessions").fetchall()
    assert session == "arch-1" and document == orjson.loads(exported.stdout)
    assert len(document["roots"]) == 2 and len(document["messages"]) == 6
    assert document["messages"][3]["content"] == "Done. send_email: sent"
    assert r.xlen(KEYS.archive) == 0
