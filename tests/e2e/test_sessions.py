"""The list of sessions end to end: dispatchers and workers as processes keep the sets with every
transition — created with metadata (active), a question raised (parked), answered (active
again), a sub-agent's child closed (closed) — and `parley sessions` / `parley show` say so."""

import json
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from parley.schemas.listing import listing_entries
from parley.schemas.state import Core
from tests.conftest import Procs, eventually, send, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."
KEYS = Keys()


def sessions(url: str, *args: str) -> list[str]:
    out = run_parley(["--redis-url", url, "sessions", "--json", *args], text=True, check=True)
    return [row["session"] for row in json.loads(out.stdout)["items"]]


def show(url: str, session: str) -> dict[str, Any]:
    out = run_parley(["--redis-url", url, "show", session, "--json"], text=True, check=True)
    view: dict[str, Any] = json.loads(out.stdout)
    return view


def listed(client: Client, status: str) -> list[str]:
    """What `parley sessions --status STATUS` lists, read in this process: polled until it
    holds, so that each wait spawns no `parley` per poll; the command is then run once."""
    return [row.session for row in client.sessions(status).items]


def exact(r: redis.Redis, names: list[str]) -> bool:
    """The sets hold exactly what the sessions' records say they are listed under."""
    want: set[tuple[str, str]] = set()
    for name in names:
        raw = r.hget(KEYS.meta(name), "core")
        assert raw is not None
        want |= listing_entries(KEYS, Core.model_validate_json(raw))
    held = {(k.decode(), m.decode())
            for k in r.scan_iter(match="parley:sessions:*") for m in r.zrange(k, 0, -1)}
    return held == want


def test_transitions_move_sessions_between_active_and_parked(procs: Procs, r: redis.Redis,
                                                            client: Client) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    names = ["l-a1", "l-a2", "l-b1"]
    for name in names:
        send(r, name, {"type": "session.create", "metadata": {"team": name[2], "vip": name == "l-a2"}})
        wait_for(client, name, lambda e: e["type"] == "session.created")
    eventually(lambda: listed(client, "active") == names)
    assert sessions(procs.url, "--status", "active") == names
    for name in names:
        send(r, name, {"type": "message.create", "content": SEED})
        wait_for(client, name, lambda e: e["type"] == "interrupt.raised")
    eventually(lambda: listed(client, "parked") == names)
    assert sessions(procs.url, "--status", "parked") == names
    assert sessions(procs.url, "--status", "active") == []
    assert sessions(procs.url, "--meta", "team=a", "--status", "parked") == ["l-a1", "l-a2"]
    assert sessions(procs.url, "--meta", "vip=true") == ["l-a2"]
    assert sessions(procs.url, "--newest-first", "--limit", "2") == ["l-b1", "l-a2"]
    assert show(procs.url, "l-a1")["status"] == "parked"

    send(r, "l-a1", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    wait_for(client, "l-a1", lambda e: e["type"] == "turn.completed")
    eventually(lambda: listed(client, "active") == ["l-a1"])
    assert sessions(procs.url, "--status", "active") == ["l-a1"]
    assert sessions(procs.url, "--status", "parked") == ["l-a2", "l-b1"]
    assert show(procs.url, "l-a1")["status"] == "active"
    eventually(lambda: exact(r, names))


def test_a_closed_sub_agent_child_is_listed_closed(procs: Procs, r: redis.Redis, client: Client) -> None:
    # the child is parked from its interrupt until the parent's call times out: long enough for
    # a `parley sessions` process to start and list it on a loaded machine
    procs.dispatcher("tests.apps.agents", "--subagent-timeout", "4")
    procs.worker("tests.apps.agents")
    send(r, "p-close", {"type": "message.create", "content": 'call research {"topic": "otters"}'})
    wait_for(client, "p-close:sub-1", lambda e: e["type"] == "interrupt.raised")  # nobody answers
    eventually(lambda: listed(client, "parked") == ["p-close:sub-1"])
    assert sessions(procs.url, "--status", "parked") == ["p-close:sub-1"]
    wait_for(client, "p-close:sub-1", lambda e: e["type"] == "session.closed", timeout=30)
    eventually(lambda: listed(client, "closed") == ["p-close:sub-1"])
    assert sessions(procs.url, "--status", "closed") == ["p-close:sub-1"]
    assert sessions(procs.url, "--status", "parked") == []
    out = run_parley(["--redis-url", procs.url, "sessions", "--json",
                          "--status", "closed"], text=True, check=True)
    (row,) = json.loads(out.stdout)["items"]
    assert (row["parent"], row["open_interrupts"]) == ("p-close", 0)
    assert show(procs.url, "p-close:sub-1")["status"] == "closed"
    wait_for(client, "p-close", lambda e: e["type"] == "turn.completed", timeout=30)
    eventually(lambda: exact(r, ["p-close", "p-close:sub-1"]))
