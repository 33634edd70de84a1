"""The seed app's `pay` (declared `needs_approval`) end to end, as deployed: Redis with the shipped
redis.conf and users.acl, `parley dispatcher` and `parley worker` as processes under their
logins, answers from the producer login, and the attacker under the worker login.

What ran is read outside Redis too: each worker's log line `job done kind=tool` for a tool job
it ran (a lost or forged entry in Redis cannot add or erase one)."""

import re
import time
from typing import Any

import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.approvals import call_digest
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import JOB_SIG_FIELD, job_outcome_signature
from tests.conftest import Procs, all_events, eventually, of_type, wait_for
from tests.deployed import WORKER, login

pytestmark = pytest.mark.e2e

APP = "examples.seed_app"
PAY = {"to": "acme", "amount": "120 EUR"}
EVIL = {"to": "EVIL", "amount": "9999 EUR"}


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def approval_raised(n: int) -> Any:
    return lambda e: e["type"] == "interrupt.raised" and e["interrupt_id"] == f"int-{n}"


def tool_runs(procs: Procs) -> int:
    """Tool jobs the workers ran, from their own logs."""
    return sum(len(re.findall(r"'job done' kind=tool ", log.read_text(errors="replace")))
               for kind, _proc, log in procs.started if kind == "worker" and log.exists())


def stop(procs: Procs, kind: str) -> None:
    for k, proc, _log in procs.started:
        if k == kind and proc.poll() is None:
            proc.terminate()
            assert proc.wait(20) == 0


def test_pay_runs_only_on_the_approval_of_that_very_call_once(
        procs: Procs, r: redis.Redis, producer_client: Client, redis_server: RedisServer) -> None:
    client = producer_client
    procs.dispatcher(APP)
    procs.worker(APP)
    # 1. The seed's decide returns pay's execution without any interrupt: the engine asks.
    client.send("pay-1", {"type": "message.create", "content": "pay acme 120 EUR"})
    seen = wait_for(client, "pay-1", approval_raised(1))
    raised = seen[-1]
    assert raised["reason"] == "approval"
    assert raised["payload"] == {"message": "Pay this invoice?", "call_id": "call-1", "tool": "pay",
                                 "arguments": PAY, "digest": call_digest("pay", PAY)}
    assert of_type(seen, "tool.started") == []
    # what the inbox lists: the index is written by the settle that follows the commit
    eventually(lambda: len(Client(r).interrupts()) == 1, timeout=10)
    [listed] = Client(r).interrupts()
    assert listed["interrupt_id"] == "int-1" and listed["response_schema"]["required"] == ["approved"]

    # 2. The approval of call-1, pay(acme), with a compromised worker swapping the call for
    #    pay(EVIL) in the resume's decision: with the fleet stopped, it forges that decide outcome.
    stop(procs, "worker")
    client.resume("pay-1", "int-1", {"approved": True})
    eventually(lambda: r.llen("rq:queue:decide") == 1, timeout=10)
    attacker = redis.Redis.from_url(redis_server.url_as(login(WORKER)))
    [jid] = attacker.lrange("rq:queue:decide", 0, -1)
    job = Job.fetch(jid.decode(), connection=attacker, serializer=JSONSerializer).args[0]
    assert job["trigger"]["type"] == "interrupt.resumed" and job["trigger"]["reason"] == "approval"
    forged = WorkOutcome(session="pay-1", work=job["work"], attempt=job["attempt"], kind="decide", ok=True,
                         value={"actions": [{"type": "tool.execute", "name": "pay", "arguments": EVIL}]})
    # it takes the job's token (GETDEL, as a take does), so it counts as the job's taker
    token = attacker.getdel(Keys().job_token(jid.decode()))
    assert token
    raw = forged.model_dump_json().encode()
    sig = job_outcome_signature(token.decode(), raw)
    attacker.xadd(job["reply_to"], {"outcome": raw, JOB_SIG_FIELD: sig})
    seen = wait_for(client, "pay-1", approval_raised(2))
    assert seen[-1]["payload"]["arguments"] == EVIL and seen[-1]["payload"]["call_id"] == "call-2"
    [settled] = of_type(all_events(client, "pay-1"), "tool.completed")  # in the same transition
    assert (settled["call_id"], settled["error"]) == ("call-1", "not_executed")
    procs.worker(APP)  # takes the honest decide job, finds no token, and does not run it
    eventually(lambda: r.llen("rq:queue:decide") == 0, timeout=10)
    time.sleep(0.5)
    assert of_type(all_events(client, "pay-1"), "tool.started") == [] and tool_runs(procs) == 0

    # 3. The approval of call-2 itself runs it, once; the same answer again runs nothing more.
    client.resume("pay-1", "int-2", {"approved": True}, idempotency_key="first")
    seen = wait_for(client, "pay-1", lambda e: e["type"] == "turn.completed")
    [started] = of_type(seen, "tool.started")
    assert started["call_id"] == "call-2"
    assert started["approval"] == {"interrupt_id": "int-2", "digest": call_digest("pay", EVIL)}
    client.resume("pay-1", "int-2", {"approved": True}, idempotency_key="again")
    wait_for(client, "pay-1", lambda e: e["type"] == "input.ignored" and e["code"] == "already_resumed")
    stop(procs, "worker")
    assert tool_runs(procs) == 1
    view = Client(r).show("pay-1")
    assert [m["content"] for m in view["messages"] if m["role"] == "tool"] == ["not_executed",
                                                                             "paid 9999 EUR to EVIL"]
    attacker.close()
