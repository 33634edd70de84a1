"""Approvals the engine enforces, tried by a compromised worker under the shipped `parley-worker`
login against a dispatcher under its own (docs/protocol.md, "Approvals"; docs/guarantees.md,
"What a compromised worker can do").

A worker that takes a job (reads its token) may still post any outcome for it, so it can
forge what `decide` or the model say. These tests show that such a forgery
can no longer run a tool declared `needs_approval`: the gated `pay` of tests/apps/approvals_app.py
runs only once `alice` approved that very call, and each run appends a line to a file outside
Redis, which is what the tests count."""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.cli.appinfo import app_info
from parley.client import Client
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.leases import get_partitions
from parley.runtime import metrics
from parley.schemas.approvals import call_digest
from parley.schemas.jobs import job_id
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import JOB_SIG_FIELD, Keyring, job_outcome_signature
from parley.workers import jobs
from parley.workers.app import load_app
from tests.apps.approvals_app import PAID_LOG
from tests.integration.conftest import enqueue_tool_job, tick
from tests.integration.test_acl import (  # noqa: F401 - the fixtures, by name
    AclRedis,
    acl,
    as_producer,
    dispatcher,
    producer,
    reader,
    run_worker,
    types,
    worker,
)

pytestmark = pytest.mark.usefixtures("restore_signals")

KEYS = Keys()
APP = "tests.apps.approvals_app"
SECRETS = {"alice": "alice-secret", "mallory": "mallory-secret"}
PAY = {"to": "acme", "amount": 120}


@pytest.fixture
def paid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The evidence file, and the in-process worker running the approvals app."""
    log = tmp_path / "paid.jsonl"
    log.touch()
    monkeypatch.setenv(PAID_LOG, str(log))
    monkeypatch.setattr(jobs, "_app", load_app(APP))
    monkeypatch.setattr(jobs, "_worker_id", "acl-worker")
    yield log


def payments(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def make_dispatcher(conn: redis.Redis) -> Dispatcher:
    d = Dispatcher(conn, KEYS, app_info(load_app(APP)), block_ms=5, keyring=Keyring(SECRETS))
    d.leases.partitions = get_partitions(conn, KEYS)
    return d


def events(client: Client, session: str) -> list[dict[str, Any]]:
    return [e for _id, e in client.events(session, block_ms=1, until=time.monotonic() + 0.05)]


def of(client: Client, session: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(client, session) if e["type"] == kind]


def queued(admin: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The payloads of the jobs waiting on `queue`, read as the attacker reads them."""
    return [Job.fetch(jid.decode(), connection=admin, serializer=JSONSerializer).args[0]
            for jid in admin.lrange(f"rq:queue:{queue}", 0, -1)]


def forge(worker_conn: redis.Redis, job: dict[str, Any], kind: str, value: Any) -> None:
    """What the compromised worker posts: it takes the queued job's token (GETDEL: what a take
    does, and all a worker login may do with a token), so the engine takes it for the job's
    taker, and posts an outcome of its own making for it, never running the job. (Without the
    token, an outcome is refused: tests/integration/test_compromised_worker.py.)"""
    token = worker_conn.getdel(KEYS.job_token(job_id(job["session"], job["work"], job["attempt"])))
    assert token, "the job's token is gone"
    outcome = WorkOutcome(session=job["session"], work=job["work"], attempt=job["attempt"], kind=kind,  # type: ignore[arg-type]
                          ok=True, value=value)
    raw = outcome.model_dump_json().encode()
    sig = job_outcome_signature(token.decode(), raw)
    worker_conn.xadd(job["reply_to"], {"outcome": raw, JOB_SIG_FIELD: sig})


def to_the_decide_of_the_call(d: Dispatcher, worker_conn: redis.Redis, client: Client, session: str,
                              content: str) -> dict[str, Any]:
    """Send `content`, run the model job, and stop where the call's `tool.execute` decide job
    waits on its queue: that job's payload."""
    client.send(session, {"type": "message.create", "content": content})
    tick(d, 4)
    run_worker(worker_conn, "llm")
    tick(d, 4)
    [job] = queued(d.redis, "decide")
    assert job["trigger"]["type"] == "tool.execute", job
    return job


def resume(client: Client, session: str, iid: str, payload: Any, who: str | None = "alice") -> None:
    signed = {"principal": who, "key": SECRETS[who]} if who is not None else {}
    client.resume(session, iid, payload, **signed)


def test_a_forged_decide_that_executes_the_call_gets_the_engines_question_instead(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        paid: Path) -> None:
    """Issue 31: "a forged `decide` outcome skipped the app's confirm interrupt and `pay` ran".
    Now the forged execution is refused the only way that matters: nothing runs; the engine
    asks alice, and only her yes runs the call, once."""
    client, d = as_producer(producer), make_dispatcher(dispatcher)
    job = to_the_decide_of_the_call(d, worker, client, "ap-1", f"call pay {orjson.dumps(PAY).decode()}")
    asked_before = metrics.APPROVALS.labels("asked")._value.get()
    forge(worker, job, "decide", {"actions": [{"type": "tool.execute"}]})
    tick(d, 4)
    [raised] = of(client, "ap-1", "interrupt.raised")
    assert raised["reason"] == "approval"
    assert raised["payload"]["arguments"] == PAY and raised["payload"]["digest"] == call_digest("pay", PAY)
    assert metrics.APPROVALS.labels("asked")._value.get() == asked_before + 1
    run_worker(worker)  # the real decide job: its token taken, it is not run
    tick(d, 4)
    assert payments(paid) == [] and acl.admin.llen("rq:queue:tools") == 0
    assert "tool.started" not in types(client, "ap-1")
    # alice's yes runs it; the same yes again runs nothing more
    resume(client, "ap-1", raised["interrupt_id"], {"approved": True})
    for _ in range(4):
        tick(d, 4)
        run_worker(worker)
    tick(d, 4)
    resume(client, "ap-1", raised["interrupt_id"], {"approved": True})
    tick(d, 4)
    run_worker(worker)
    assert payments(paid) == [PAY]
    [started] = of(client, "ap-1", "tool.started")
    assert started["approval"] == {"interrupt_id": raised["interrupt_id"], "digest": call_digest("pay", PAY),
                                   "principal": "alice"}
    assert [e["code"] for e in of(client, "ap-1", "input.ignored")] == ["already_resumed"]
    assert acl.denials() == []


def test_a_forged_model_reply_asking_to_pay_someone_else_is_shown_to_the_approver_and_refused(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        paid: Path) -> None:
    """Issue 31: a forged `llm` outcome "applied as the model asking for `pay(EVIL-LLM)`". The
    engine asks about exactly those arguments; neither another principal nor an unsigned resume
    can approve; alice's no settles the call; nothing is paid."""
    client, d = as_producer(producer), make_dispatcher(dispatcher)
    client.send("ap-2", {"type": "message.create", "content": "hello"})
    tick(d, 4)
    [job] = queued(acl.admin, "llm")
    evil = {"to": "EVIL-LLM", "amount": 10_000}
    forge(worker, job, "llm", {"content": "", "tool_calls": [{"id": "x", "name": "pay", "arguments": evil}]})
    for _ in range(3):
        tick(d, 4)
        run_worker(worker)
    [raised] = of(client, "ap-2", "interrupt.raised")
    assert raised["payload"]["arguments"] == evil and raised["payload"]["digest"] == call_digest("pay", evil)
    resume(client, "ap-2", raised["interrupt_id"], {"approved": True}, who="mallory")
    resume(client, "ap-2", raised["interrupt_id"], {"approved": True}, who=None)
    tick(d, 4)
    assert [e["code"] for e in of(client, "ap-2", "input.refused")] == ["forbidden", "forbidden"]
    resume(client, "ap-2", raised["interrupt_id"], {"approved": False, "message": "not ours"})
    for _ in range(4):
        tick(d, 4)
        run_worker(worker)
    [completed] = of(client, "ap-2", "tool.completed")
    assert completed["error"] == "approval_denied: not ours"
    assert payments(paid) == [] and "tool.started" not in types(client, "ap-2")
    assert acl.denials() == []


def test_an_approval_of_one_call_does_not_run_a_call_with_other_arguments(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        paid: Path) -> None:
    """alice approves pay(acme, 120); a forged decide of that resume swaps in pay(EVIL, 10000).
    The approved call never runs (settled `not_executed`), the swapped one is a new call with a
    new question, and runs only when alice approves that one."""
    client, d = as_producer(producer), make_dispatcher(dispatcher)
    to_the_decide_of_the_call(d, worker, client, "ap-3", f"call pay {orjson.dumps(PAY).decode()}")
    run_worker(worker, "decide")  # the honest decide: proposed, so the engine asks
    tick(d, 4)
    [first] = of(client, "ap-3", "interrupt.raised")
    resume(client, "ap-3", first["interrupt_id"], {"approved": True})
    tick(d, 4)
    [job] = queued(acl.admin, "decide")
    assert job["trigger"]["type"] == "interrupt.resumed" and job["trigger"]["reason"] == "approval"
    evil = {"to": "EVIL", "amount": 10_000}
    forge(worker, job, "decide", {"actions": [{"type": "tool.execute", "name": "pay", "arguments": evil}]})
    tick(d, 4)
    run_worker(worker)
    tick(d, 4)
    assert payments(paid) == []
    [settled] = of(client, "ap-3", "tool.completed")
    assert settled["call_id"] == first["payload"]["call_id"] and settled["error"] == "not_executed"
    second = of(client, "ap-3", "interrupt.raised")[-1]
    assert second["interrupt_id"] != first["interrupt_id"] and second["payload"]["arguments"] == evil
    resume(client, "ap-3", second["interrupt_id"], {"approved": True})
    for _ in range(4):
        tick(d, 4)
        run_worker(worker)
    assert payments(paid) == [evil]  # once, and only after its own approval
    assert acl.denials() == []


def test_a_worker_whose_app_gates_the_tool_refuses_a_job_without_its_approval(
        acl: AclRedis, worker: redis.Redis, paid: Path) -> None:  # noqa: F811
    """A dispatcher started with an app that does not gate `pay` (an older version) would issue
    its job unasked: the workers, whose app gates it, fail it `not_approved` and pay nothing."""
    enqueue_tool_job(acl.admin, "ap-4", "call-1", "pay", PAY)
    run_worker(worker, "tools")
    [(_id, fields)] = acl.admin.xrange(KEYS.results())
    outcome = WorkOutcome.model_validate_json(fields[b"outcome"])
    assert (outcome.ok, outcome.error) == (False, "not_approved")
    assert payments(paid) == []
    # with the approval's digest, as the engine sends it once approved, it runs
    enqueue_tool_job(acl.admin, "ap-4", "call-2", "pay", PAY, approval=call_digest("pay", PAY), seq=2)
    run_worker(worker, "tools")
    assert payments(paid) == [PAY]


def test_an_approved_call_given_back_by_its_worker_runs_once_on_its_approval(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        paid: Path) -> None:
    """The worker that took the approved `pay` gives it back unrun (as one stopping with it
    taken does): its signed `unrun` outcome makes the dispatcher issue the call again, as a new
    attempt with a new token, on the same approval; the next worker pays once. A `lost` in its
    place would have settled it `worker_lost` (a gated tool is never retried on a lost)."""
    from parley.workers.worker import make_worker

    client, d = as_producer(producer), make_dispatcher(dispatcher)
    to_the_decide_of_the_call(d, worker, client, "ap-9", f"call pay {orjson.dumps(PAY).decode()}")
    run_worker(worker, "decide")
    tick(d, 4)
    [raised] = of(client, "ap-9", "interrupt.raised")
    resume(client, "ap-9", raised["interrupt_id"], {"approved": True})
    tick(d, 4)
    run_worker(worker, "decide")
    tick(d, 4)
    [first] = queued(acl.admin, "tools")
    taker = make_worker(["tools"], worker, name="acl-worker")
    taken = taker.take("the-takes-secret")
    assert isinstance(taken, tuple) and taken[0].args[0]["attempt"] == first["attempt"]
    given_before = metrics.WORK_GIVEN_BACK.labels("tool")._value.get()
    taker.give_back_take(*taken)
    tick(d, 4)
    assert metrics.WORK_GIVEN_BACK.labels("tool")._value.get() == given_before + 1
    [again] = queued(acl.admin, "tools")
    assert again["attempt"] == first["attempt"] + 1 and again["approval"] == call_digest("pay", PAY)
    assert acl.admin.exists(KEYS.job_token(job_id("ap-9", again["work"], again["attempt"])))
    for _ in range(3):
        run_worker(worker)
        tick(d, 4)
    assert payments(paid) == [PAY]
    [completed] = of(client, "ap-9", "tool.completed")
    assert "error" not in completed
    assert acl.denials() == []
