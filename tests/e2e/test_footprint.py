"""Nothing grows without bound (docs/guarantees.md; docs/operations.md, Redis): finished sessions
leave only their own state."""

import time

import orjson
import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, wait_for

pytestmark = pytest.mark.e2e


def test_finished_sessions_leave_only_their_own_keys(procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    procs.worker("examples.seed_app")
    sessions = [f"f{i}" for i in range(30)]
    for s in sessions:
        r.xadd("parley:inputs", {"session": s, "id": f"m-{s}", "input": orjson.dumps(
            {"type": "message.create", "content": "Email bob@example.com: hi"})})
    for s in sessions:
        raised = wait_for(client, s, lambda e: e["type"] == "interrupt.raised")[-1]
        resume = {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                  "payload": {"approved": True}}
        r.xadd("parley:inputs", {"session": s, "input": orjson.dumps(resume)})
    for s in sessions:
        wait_for(client, s, lambda e: e["type"] == "turn.completed")
    time.sleep(0.5)
    keys = {k.decode() for k in r.keys("*")}
    per_session = {k for k in keys if "{" in k}
    for s in sessions:  # meta, messages, events, and its used idempotency keys (24 h each)
        mine = {k for k in per_session if k.startswith(f"parley:{{{s}}}:")}
        assert mine == {f"parley:{{{s}}}:meta", f"parley:{{{s}}}:msgs", f"parley:{{{s}}}:events",
                        f"parley:{{{s}}}:idem"}
        assert set(mine) <= set(Keys().session_keys(s))  # all of them deleted when it expires
    until = r.zscore(f"parley:{{{sessions[0]}}}:idem", f"m-{sessions[0]}")
    assert until is not None and 0 < until - time.time() * 1000 <= 24 * 3600 * 1000
    assert not [k for k in keys if k.startswith("rq:job:")]  # finished jobs leave nothing behind
    assert r.xlen("parley:inputs") == 0 and r.xlen("parley:results") == 0  # acked entries trimmed
    assert r.hlen("parley:running") == 0 and r.zcard("parley:interrupts") == 0
    # the in-flight records and their numbers, and the interrupt counts, go with the work
    assert r.hlen("parley:inflight") == 0 and not [k for k in keys if k.startswith("parley:inflight:")]
    assert r.hlen("parley:interrupts:anchors") == 0 and int(r.hget("parley:stats", "parked") or 0) == 0
    global_keys = keys - per_session
    # fixed bookkeeping, not per session: the same names whatever the number of sessions
    # (RQ's workers, queues and registries are RQ's own, named by worker and queue)
    ours = {k for k in global_keys if k.startswith("parley:")}
    assert ours <= {"parley:config", "parley:dispatchers", "parley:engine:key", "parley:feed",
                    "parley:inputs", "parley:results", "parley:stats", "parley:deadlines",
                    "parley:interrupts", "parley:interrupts:info",
                    # the session lifecycle: closed sessions' archive, their expiry, idle sessions
                    "parley:archive", "parley:expiring", "parley:idle",
                    # the list of sessions: one set per status (and one per metadata pair in use)
                    "parley:sessions:active", "parley:sessions:parked", "parley:sessions:closed",
                    # the producer registry; each producer's input streams and pending counts
                    "parley:producers",
                    # the fingerprints of the dispatchers' signing keys (one record per dispatcher)
                    "parley:keyprints"} | {
        k for k in ours if k.startswith(("parley:lease:", "parley:worker:", "parley:took:", "parley:in:",
                                         "parley:pending:"))} | {
        # each partition's list of its sessions (one per partition, whatever the sessions)
        f"parley:partition:{p}:sessions" for p in range(1024)}, sorted(ours)
    assert len(global_keys - ours) < 15, sorted(global_keys - ours)
