"""Producers end to end: two producers registered with `parley producers add`, each writing its
own input stream, served by a dispatcher and a worker as processes; one registered while the
dispatcher runs; a scoped producer's entry for another tenant refused (docs/operations.md,
"Producers")."""


import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

KEYS = Keys()


def add(url: str, *args: str) -> None:
    run_parley(["--redis-url", url, "producers", "add", *args], text=True, check=True)


def write(r: redis.Redis, producer: str, session: str, text: str) -> str:
    value = {"type": "message.create", "content": text}
    entry: bytes = r.xadd(KEYS.producer_inputs(producer),  # type: ignore[assignment]
                          {"session": session, "input": orjson.dumps(value)})
    return entry.decode()


def test_two_producers_sessions_are_served(procs: Procs, r: redis.Redis, client: Client) -> None:
    add(procs.url, "web")
    add(procs.url, "crm", "--tenant", "acme")
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    write(r, "web", "p-web", "hello from web")
    write(r, "crm", "acme/p-crm", "hello from crm")
    for session in ("p-web", "acme/p-crm"):
        wait_for(client, session, lambda e: e["type"] == "turn.completed")
    # a producer registered while the dispatcher runs is read within a couple of seconds
    add(procs.url, "late")
    write(r, "late", "p-late", "hello late")
    wait_for(client, "p-late", lambda e: e["type"] == "turn.completed")
    # the scoped producer cannot reach another tenant's session, not even with a refusal
    bad = write(r, "crm", "globex/p-1", "not mine")
    eventually(lambda: any(f[b"entry"].decode() == bad for _id, f in r.xrange(KEYS.rejected)))
    assert r.exists(KEYS.events("globex/p-1"), KEYS.meta("globex/p-1")) == 0
    for name in ("web", "crm", "late"):
        assert r.xlen(KEYS.producer_inputs(name)) == 0


def test_a_dispatcher_registers_the_producers_its_deployment_names(procs: Procs, r: redis.Redis,
                                                                  client: Client) -> None:
    """`--register-producer` (PARLEY_REGISTER_PRODUCERS in deploy/): a deployment's producers
    are read without an operator's `parley producers add`."""
    procs.dispatcher("examples.seed_app", env={"PARLEY_REGISTER_PRODUCERS": "app acme-app=acme"})
    procs.worker("examples.seed_app")
    eventually(lambda: r.hlen(KEYS.producers) == 2, timeout=20)
    assert orjson.loads(r.hget(KEYS.producers, "acme-app") or b"{}")["tenant"] == "acme"
    Client(r, producer="app").send("reg-1", {"type": "message.create", "content": "hello"})
    wait_for(client, "reg-1", lambda e: e["type"] == "turn.completed")


def test_a_bad_registration_is_a_usage_error(procs: Procs) -> None:
    bad = run_parley(["--redis-url", procs.url, "dispatcher", "--app", "examples.seed_app",
                                        "--register-producer", "Not A Name"], text=True, timeout=60)
    assert bad.returncode == 2 and "--register-producer" in bad.stderr
