"""A flood of one session at the submit edge, end to end (docs/protocol.md, "Limits"): a
registered producer submits far more inputs for one session than the pending limit lets in;
the excess is refused `rate_limited` synchronously and nothing of it is written, while another
session's message is served by the same dispatcher and worker processes. How long the other
session waits is measured by `make bench` (scenario 10), never asserted here."""


import orjson
import pytest
import redis

from parley.client import Client
from parley.client.producer import SubmitRefused
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

KEYS = Keys()
LIMIT = 20
FLOOD = 300


def test_a_flood_of_one_session_is_refused_at_submit_and_another_session_is_served(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    for name in ("flood", "web"):
        run_parley(["--redis-url", procs.url, "producers", "add", name], text=True, check=True)
    procs.dispatcher("examples.seed_app", "--max-pending", str(LIMIT))
    procs.worker("examples.seed_app")
    eventually(lambda: r.hget(KEYS.config, "limit_pending") == str(LIMIT).encode())
    flooder, web = Client(r, producer="flood"), Client(r, producer="web")
    flooder.send("f-1", {"type": "session.create"})
    admitted, refused = 1, []
    for i in range(FLOOD):
        try:
            flooder.send("f-1", {"type": "branch.switch", "head": f"msg-{i}"})
            admitted += 1
        except SubmitRefused as exc:
            refused.append(exc)
    # the dispatcher applies as the flood goes on, freeing room, so how many get in depends on
    # its pace; the rest are refused at once, each saying why, and none of them is written
    assert refused and {exc.code for exc in refused} == {"rate_limited"}
    assert admitted - 1 + len(refused) == FLOOD
    web.send("w-1", {"type": "message.create", "content": "Email bob@example.com: hi"})
    wait_for(client, "w-1", lambda e: e["type"] == "interrupt.raised")
    # every admitted input was applied (refused or ignored on its session), and counted off
    def answered() -> int:
        events = [orjson.loads(f[b"event"]) for _id, f in r.xrange(KEYS.events("f-1"))]
        return sum(1 for e in events if e["type"] in ("input.refused", "input.ignored"))

    eventually(lambda: answered() >= admitted - 1, timeout=30)  # the create is no switch
    eventually(lambda: not r.hget(KEYS.pending("flood"), "f-1"))
    assert answered() == admitted - 1
