"""Retention on real processes (docs/operations.md, "Retention and archive"): sessions run to
the end, are closed as idle, archived, and expired — and no key of theirs is left; a session
waiting on an interrupt with a deadline is never closed as idle."""

import time

import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, all_events, eventually, send, wait_for

pytestmark = pytest.mark.e2e
KEYS = Keys()


def session_keys_left(r: redis.Redis, sessions: list[str]) -> list[str]:
    """Every key naming one of the sessions, found by SCAN over the whole prefix."""
    tags = tuple(f"{{{s}}}" for s in sessions)
    names = (k.decode() for k in r.scan_iter(match="parley:*", count=1000))
    return [k for k in names if any(t in k for t in tags)]


def test_sessions_closed_as_idle_are_archived_then_expire_leaving_no_key(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("tests.apps.scenarios", "--retention", "1", "--idle-timeout", "1")
    procs.worker("tests.apps.scenarios")
    done = [f"ret-{i}" for i in range(10)]
    for s in done:
        send(r, s, {"type": "message.create", "content": "Email bob@example.com: hi"}, id=f"m-{s}")
    waiting = "ret-deadline"
    send(r, waiting, {"type": "message.create", "content": "Email bob@example.com: [deadline-hour]"})
    for s in done:
        raised = wait_for(client, s, lambda e: e["type"] == "interrupt.raised")[-1]
        client.resume(s, raised["interrupt_id"], {"approved": True})
    wait_for(client, waiting, lambda e: e["type"] == "interrupt.raised")
    for s in done:
        wait_for(client, s, lambda e: e["type"] == "session.closed")
    assert session_keys_left(r, done)  # closed, archived, kept for their retention (1 s)
    eventually(lambda: not session_keys_left(r, done), timeout=15)
    # nothing names them any more: not the expiry or idle sets, not the interrupt index
    assert not r.exists(KEYS.expiring)
    assert [m.decode() for m in r.zrange(KEYS.idle, 0, -1)] == []
    assert r.zcard(KEYS.interrupt_index) == 1  # the deadline's
    # the archive kept each one's whole document
    archived = {f[b"session"].decode(): orjson.loads(f[b"document"]) for _i, f in r.xrange(KEYS.archive)}
    assert set(archived) == set(done)
    for s in done:
        doc = archived[s]
        assert doc["core"]["status"] == "closed" and doc["events"][-1]["event"]["type"] == "session.closed"
        assert doc["events"][-1]["event"]["reason"] == "idle"
        assert "turn.completed" in [e["event"]["type"] for e in doc["events"]]
    # the session waiting on a deadline is still open, its interrupt still to answer
    time.sleep(1.5)
    assert r.exists(KEYS.meta(waiting))
    assert [e["type"] for e in all_events(client, waiting)][-1] == "interrupt.raised"


def test_without_the_archive_closed_sessions_still_expire(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("tests.apps.scenarios", "--retention", "0", "--idle-timeout", "1", "--no-archive",
                     "--events-maxlen", "50")
    procs.worker("tests.apps.scenarios")
    send(r, "quiet", {"type": "message.create", "content": "hello"})
    wait_for(client, "quiet", lambda e: e["type"] == "session.closed")
    eventually(lambda: not session_keys_left(r, ["quiet"]), timeout=10)
    assert not r.exists(KEYS.archive)
