"""A producer's input stream deleted under load (docs/operations.md's runbook for a stream
jammed by a huge explicit id: `DEL parley:in:<name>`) takes its consumer group with it. The
dispatcher reads all of a partition's streams with one XREADGROUP, so before issue 29 every read
then failed `NOGROUP` and every producer's inputs stopped until someone ran XGROUP CREATE by hand.
Now the dispatcher re-creates the group (from id 0: dispatcher/consume.py, `Dispatcher.regroup`)
and goes on: every other producer's inputs keep being applied, and so are the deleted one's new
ones."""

import threading
import time
from collections import Counter

import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

KEYS = Keys()
PRODUCERS = ["p0", "p1", "p2", "p3"]
DELETED = "p1"
SESSIONS_EACH = 4


def add(url: str, name: str) -> None:
    run_parley(["--redis-url", url, "producers", "add", name], text=True, check=True)


def applied(r: redis.Redis, session: str) -> int:
    """How many of the session's inputs were applied: the entries its events name (the first
    message is created; the next ones, with no worker running its turn, refused
    `turn_in_progress`: applied all the same)."""
    events = [orjson.loads(f[b"event"]) for _id, f in r.xrange(KEYS.events(session))]
    return len({e["input"]["entry"] for e in events if e.get("input")})


def test_a_deleted_producer_stream_stops_no_producer(procs: Procs, r: redis.Redis) -> None:
    for name in PRODUCERS:
        add(procs.url, name)
    procs.dispatcher()
    eventually(lambda: r.exists(KEYS.lease(0)) == 1, timeout=20)  # the submit function loaded
    sent: Counter[str] = Counter()
    new: Counter[str] = Counter()  # sent once the DEL was done (started after it)
    stop, deleted = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def produce(name: str) -> None:
        client = Client(redis.Redis.from_url(procs.url), producer=name)
        i = 0
        try:
            while not stop.is_set():
                session = f"{name}-{i % SESSIONS_EACH}"
                after = deleted.is_set()
                client.send(session, {"type": "message.create", "content": f"{name} #{i}"})
                sent[session] += 1
                new[session] += after
                i += 1
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(name,), daemon=True) for name in PRODUCERS]
    for t in threads:
        t.start()
    # served before the DEL
    eventually(lambda: errors or all(applied(r, f"{name}-0") > 0 for name in PRODUCERS), timeout=20)
    assert not errors, errors
    ours = [f"{DELETED}-{i}" for i in range(SESSIONS_EACH)]
    before = {s: applied(r, s) for s in ours}
    assert r.delete(KEYS.producer_inputs(DELETED)) == 1  # the runbook's step, producers sending
    deleted.set()
    time.sleep(2)  # the producers go on sending, the deleted one into a new stream
    stop.set()
    for t in threads:
        t.join(5)
    assert not errors, errors
    assert all(new[s] > 10 for s in ours), new
    # every other producer's inputs are all applied, before the DEL and after
    others = [s for s in sent if s not in ours]
    eventually(lambda: all(applied(r, s) == sent[s] for s in others), timeout=20)
    # the deleted producer's: what was applied before, plus every input sent after the DEL (into
    # the new stream); those the DEL took away unread are lost, by the operator's hand
    eventually(lambda: all(applied(r, s) >= before[s] + new[s] for s in ours), timeout=20)
    assert all(applied(r, s) <= sent[s] for s in ours)
    for name in PRODUCERS:  # each stream read and emptied, the new one included
        eventually(lambda name=name: r.xlen(KEYS.producer_inputs(name)) == 0, timeout=10)
