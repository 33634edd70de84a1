"""What a compromised worker can NOT do, tried under the shipped `parley-worker` login against a
dispatcher under its own (docs/guarantees.md, "What a compromised worker can do").

A worker writes the results streams (that is how it posts what it ran), so a worker can write
any outcome there; an outcome only the engine makes (an interrupt's deadline, a sub-agent's
report) is applied only with the engine's signature, whose key no worker can read."""

import time
from typing import Any

import orjson
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.client import Client
from parley.runtime import metrics
from parley.schemas.jobs import job_id
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import JOB_SIG_FIELD, job_outcome_signature, outcome_signature
from tests.integration.conftest import rewrite_job, tick
from tests.integration.test_acl import (  # noqa: F401 - the fixtures, by name
    AclRedis,
    acl,
    as_producer,
    dispatcher,
    drive,
    make_dispatcher,
    producer,
    reader,
    refused,
    run_worker,
    types,
    worker,
    worker_app,
)

pytestmark = pytest.mark.usefixtures("restore_signals")

KEYS = Keys()
#: `[deadline-hour]`: send_email asks with timeout_s 3600 and the default {"approved": False}
ASKS_FOR_AN_HOUR = "Email bob@example.com: the launch moved to Friday. [deadline-hour]"


def refused_unauthorized() -> float:
    return metrics.INPUTS.labels("outcome", "rejected", "unauthorized")._value.get()


def forged_deadline(session: str, sig: str | None = None) -> dict[str, Any]:
    outcome = WorkOutcome(session=session, work="int-1", attempt=0, kind="deadline", ok=True)
    raw = outcome.model_dump_json().encode()
    return {"outcome": raw, **({"engine_sig": sig} if sig is not None else {})}


@pytest.mark.parametrize("signature", [None, "0" * 64, "made with a key of its own"])
def test_a_worker_cannot_post_an_interrupts_deadline(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        reader: redis.Redis, worker_app: None, signature: str | None) -> None:  # noqa: F811
    """Issue 31's third attack: a `kind: deadline` outcome posted by the worker login resumed an
    interrupt whose deadline was an hour away, with its default. Now it is refused, counted
    (`parley_inputs_total{type="outcome",outcome="rejected",code="unauthorized"}`) and kept in
    the rejected stream; the interrupt stays open for its human."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-1", {"type": "message.create", "content": ASKS_FOR_AN_HOUR})
    drive(d, worker, client, "cw-1", "interrupt.raised")
    before = refused_unauthorized()
    sig = outcome_signature("a key of the worker's own", b"x") if signature == "made with a key of its own" \
        else signature
    worker.xadd(KEYS.results(), forged_deadline("cw-1", sig))
    tick(d, 4)
    seen = types(client, "cw-1")
    # nothing on the session's events (a results entry names no session the worker could prove)
    assert "interrupt.resumed" not in seen and seen[-1] == "interrupt.raised", seen
    assert [i["interrupt_id"] for i in Client(reader).interrupts()] == ["int-1"]
    assert refused_unauthorized() == before + 1
    [(_id, kept)] = acl.admin.xrange("parley:inputs:rejected")
    assert b"engine's signature" in kept[b"error"]
    assert acl.admin.xlen(KEYS.results()) == 0  # acknowledged and gone: nothing left behind
    # the human still answers it, once, and the session goes on
    client.send("cw-1", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    seen = drive(d, worker, client, "cw-1", "turn.completed")
    assert seen.count("interrupt.resumed") == 1
    assert acl.denials() == []


def test_a_deadline_the_dispatcher_fires_is_applied_with_its_default(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """The control: the same interrupt's deadline, made due and fired by the dispatcher's own
    sweep (signed with the engine's key), resumes it with its default."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-2", {"type": "message.create", "content": ASKS_FOR_AN_HOUR})
    drive(d, worker, client, "cw-2", "interrupt.raised")
    acl.admin.zadd(KEYS.deadlines, {KEYS.index_member("cw-2", "int-1"): 1})  # due now
    d.sweeps.deadlines_checked = 0.0
    d.sweeps.fire_deadlines()
    [(_id, fields)] = acl.admin.xrange(KEYS.results())
    key = d.outbox.engine_key.current()
    assert fields[b"engine_sig"] == outcome_signature(key, fields[b"outcome"]).encode()
    seen = drive(d, worker, client, "cw-2", "turn.completed")
    resumed = [e for _id, e in client.events("cw-2", block_ms=1, until=time.monotonic() + 0.05)
               if e["type"] == "interrupt.resumed"]
    assert len(resumed) == 1 and resumed[0]["timed_out"] is True, seen
    assert acl.admin.xlen("parley:inputs:rejected") == 0
    assert acl.denials() == []


def test_a_worker_cannot_answer_a_sub_agent_call_as_its_child(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """A sub-agent's report (an outcome with `source`, the child session) is the engine's too: one
    a worker writes is refused the same way, whatever call it names."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-3", {"type": "message.create", "content": ASKS_FOR_AN_HOUR})
    drive(d, worker, client, "cw-3", "interrupt.raised")
    before = refused_unauthorized()
    report = WorkOutcome(session="cw-3", work="call-1", attempt=1, kind="tool", ok=True, value="sent",
                         source="cw-3:sub-1")
    worker.xadd(KEYS.results(), {"outcome": report.model_dump_json()})
    tick(d, 4)
    assert refused_unauthorized() == before + 1
    assert "tool.completed" not in types(client, "cw-3")
    [(_id, kept)] = acl.admin.xrange("parley:inputs:rejected")
    assert b"sub-agent report outcome without the engine's signature" in kept[b"error"]
    assert orjson.loads(kept[b"outcome"])["source"] == "cw-3:sub-1"  # what was refused, kept
    assert acl.denials() == []


def test_a_job_a_worker_makes_up_is_never_run_by_another(
        acl: AclRedis, worker: redis.Redis, worker_app: None) -> None:  # noqa: F811
    """Issue 31's first attack, under the worker login: a made-up `run_tool` job (`add`, for a
    session that does not exist). The login may write its hash (rq:* keys) but push no id onto
    a queue (no LPUSH or RPUSH: workers only pop); and a job that got onto one all the same
    (pushed here by the admin: a queue holds what a dispatcher or RQ put there) is taken by
    another worker (the same login) and dropped unrun: no in-flight record, which a worker
    cannot write."""
    before = metrics.JOBS_REFUSED.labels("not_issued")._value.get()
    payload = {"session": "EVIL-JOB", "work": "call-1", "attempt": 1, "reply_to": KEYS.results(),
               "name": "add", "arguments": {"a": 1, "b": 2}}
    made_up = Job.create("parley.workers.jobs.run_tool", args=[payload], id=job_id("EVIL-JOB", "call-1", 1),
                         connection=worker, serializer=JSONSerializer, result_ttl=0)
    made_up.save()
    for push in (worker.lpush, worker.rpush):
        refused(lambda push=push: push("rq:queue:tools", made_up.id))  # type: ignore[misc]
    acl.admin.lpush("rq:queue:tools", made_up.id)
    refused(lambda: worker.hset(KEYS.inflight, made_up.id, orjson.dumps({**payload, "digest": "0" * 40})))
    acl.reset_denials()
    run_worker(worker, "tools")
    assert metrics.JOBS_REFUSED.labels("not_issued")._value.get() == before + 1
    assert acl.admin.xlen(KEYS.results()) == 0 and not acl.admin.exists(made_up.key)
    assert acl.denials() == []


def test_a_worker_cannot_change_what_a_queued_job_runs(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """A queued job's hash is RQ's, which workers may write: one rewritten to run another function
    (or the same with other arguments) no longer matches the digest its dispatcher recorded, and
    the worker that takes it drops it unrun."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-4", {"type": "message.create", "content": "hello"})
    tick(d)
    [(queue, jid)] = [(q, j.decode()) for q in ("decide", "llm")
                      for j in acl.admin.lrange(f"rq:queue:{q}", 0, -1)]
    rewrite_job(worker, jid, name="add", arguments={"a": 1, "b": 2})  # as the worker login: rq:* keys
    before = metrics.JOBS_REFUSED.labels("changed")._value.get()
    run_worker(worker, queue)
    assert metrics.JOBS_REFUSED.labels("changed")._value.get() == before + 1
    assert acl.admin.xlen(KEYS.results()) == 0
    assert acl.admin.hexists(KEYS.inflight, jid)  # for the unclaimed-work sweep to hand it back
    assert not acl.admin.exists(KEYS.job_token(jid))  # dropped with its hash
    assert acl.denials() == []


FORGED = {"decide": {"actions": [{"type": "message", "content": "forged"}]},
          "llm": {"content": "forged", "tool_calls": []}}


def forged(session: str, job: dict[str, Any]) -> bytes:
    """An outcome of the worker's own making for a queued decide or model job."""
    kind = "decide" if "trigger" in job else "llm"
    return WorkOutcome(session=session, work=job["work"], attempt=job["attempt"], kind=kind, ok=True,
                       value=FORGED[kind]).model_dump_json().encode()


def queued_job(admin: redis.Redis) -> dict[str, Any]:
    """The one job queued (a session's first: its decide or its model call)."""
    [jid] = [j for q in ("decide", "llm") for j in admin.lrange(f"rq:queue:{q}", 0, -1)]
    payload: dict[str, Any] = Job.fetch(jid.decode(), connection=admin, serializer=JSONSerializer).args[0]
    return payload


@pytest.mark.parametrize("signature", [None, "made with a token of its own"])
def test_a_worker_cannot_post_an_outcome_for_a_job_it_did_not_take(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None, signature: str | None) -> None:  # noqa: F811
    """Issue 31's second attack: with no worker running, the worker login read a queued model
    job and posted its outcome. Now an outcome is applied only signed with the job's token,
    which only the take that claims the job reads: refused `unauthorized`, counted, kept in the
    rejected stream; the job still runs, and its taker's outcome is applied."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-5", {"type": "message.create", "content": "hello"})
    tick(d)
    job = queued_job(acl.admin)
    before = refused_unauthorized()
    raw = forged("cw-5", job)
    fields: dict[str, Any] = {"outcome": raw}
    if signature is not None:
        fields[JOB_SIG_FIELD] = job_outcome_signature("a token of the worker's own", raw)
    worker.xadd(KEYS.results(), fields)
    tick(d, 4)
    assert refused_unauthorized() == before + 1
    [(_id, kept)] = acl.admin.xrange("parley:inputs:rejected")
    assert b"not signed by the worker that took its job" in kept[b"error"]
    assert types(client, "cw-5") == ["session.created", "message.created"]
    seen = drive(d, worker, client, "cw-5", "turn.completed")  # the real job runs, and counts
    assert seen.count("llm.completed") == 1
    view = Client(acl.admin).show("cw-5")
    assert view is not None
    assert "forged" not in [m["content"] for m in view["messages"] if m["role"] == "assistant"]
    assert acl.denials() == []


def test_a_worker_cannot_read_a_jobs_token_and_a_token_it_takes_stops_the_job_not_another(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """A token can only be taken (GETDEL), never read: taking one is taking the job (its real
    taker finds none, does not run it and counts `no_token`; the job's in-flight record stays,
    for a dispatcher to hand it back), and once taken by its worker, it is gone for anyone else."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-6", {"type": "message.create", "content": "hello"})
    tick(d)
    job = queued_job(acl.admin)
    token_key = KEYS.job_token(job_id("cw-6", job["work"], job["attempt"]))
    refused(lambda: worker.get(token_key))
    refused(lambda: worker.execute_command("STRLEN", token_key))
    acl.reset_denials()
    assert worker.getdel(token_key)  # what a take does: the job is now this login's
    before = metrics.JOBS_REFUSED.labels("no_token")._value.get()
    run_worker(worker)
    assert metrics.JOBS_REFUSED.labels("no_token")._value.get() == before + 1
    assert acl.admin.xlen(KEYS.results()) == 0
    assert acl.admin.hexists(KEYS.inflight, job_id("cw-6", job["work"], job["attempt"]))
    assert worker.getdel(token_key) is None  # read once
    assert acl.denials() == []


def test_a_worker_cannot_put_a_token_back_so_a_token_it_reads_is_no_job_of_anyone_else(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """Found in review: with SET on token keys, a worker could GETDEL a queued job's token and SET
    it back (or do both in one script of its own, which runs with its rights): its real taker
    would run the job unaware while the reader posts its outcome first. Or SET a token of its
    own making, so that the real taker's outcome is refused and the call hangs. No worker may
    write a token key, by command or by script."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-7", {"type": "message.create", "content": "hello"})
    tick(d)
    job = queued_job(acl.admin)
    jid = job_id("cw-7", job["work"], job["attempt"])
    token_key = KEYS.job_token(jid)
    # (the key an argument, not one of KEYS, as the worker's own scripts do: its login may name
    # only rq:* keys in KEYS, and Redis checks each command a script runs against the caller)
    peek_and_restore = worker.script_load(
        "local t = redis.call('GETDEL', ARGV[1]); redis.call('SET', ARGV[1], t); return t")
    with pytest.raises(redis.exceptions.ResponseError, match="can't access at least one of the keys"):
        worker.evalsha(peek_and_restore, 0, token_key)
    # the script's GETDEL ran (Redis undoes no write of a script that fails): the token is gone,
    # so the job's taker runs nothing, and the reader holds a token nobody else can answer with
    assert not acl.admin.exists(token_key)
    for write in (lambda: worker.set(token_key, b"a token of its own"),
                  lambda: worker.set(KEYS.job_token("parley-not-yet-enqueued"), b"planted"),
                  lambda: worker.execute_command("SETEX", token_key, 60, b"x"),
                  lambda: worker.execute_command("APPEND", token_key, b"x"),
                  lambda: worker.execute_command("COPY", "rq:queue:llm", token_key)):
        refused(write)
    acl.reset_denials()
    assert not acl.admin.exists(token_key)
    run_worker(worker)  # its taker finds no token: not run, left to a dispatcher (lost, retried)
    assert acl.admin.xlen(KEYS.results()) == 0 and acl.admin.hexists(KEYS.inflight, jid)
    assert acl.denials() == []


def test_a_worker_cannot_give_back_a_job_it_did_not_take(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,  # noqa: F811
        worker_app: None) -> None:  # noqa: F811
    """An `unrun` outcome makes the engine issue a job again whatever its tool (its taker's word
    that nothing ran): one not signed with the job's token is refused `unauthorized`, where a
    plain `lost` (which only retries what is safe to run again) needs no signature."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("cw-8", {"type": "message.create", "content": "hello"})
    tick(d)
    job = queued_job(acl.admin)
    kind = "decide" if "trigger" in job else "llm"
    before = refused_unauthorized()
    unrun = WorkOutcome(session="cw-8", work=job["work"], attempt=job["attempt"], kind=kind, ok=False,
                        error="given_back", lost=True, unrun=True).model_dump_json().encode()
    worker.xadd(KEYS.results(), {"outcome": unrun})
    worker.xadd(KEYS.results(), {"outcome": unrun, JOB_SIG_FIELD: job_outcome_signature("its own", unrun)})
    tick(d, 4)
    assert refused_unauthorized() == before + 2
    assert [b"not signed by the worker that took its job" in kept[b"error"]
            for _id, kept in acl.admin.xrange("parley:inputs:rejected")] == [True, True]
    assert acl.admin.hexists(KEYS.inflight, job_id("cw-8", job["work"], job["attempt"]))  # not re-issued
    seen = drive(d, worker, client, "cw-8", "turn.completed")
    assert seen.count("llm.completed") == 1
    assert acl.denials() == []
