"""workers.worker and workers.jobs in-process against a real Redis: the allowlist, real jobs,
outcomes on the results stream, timeouts, and a whole turn driven through dispatcher + worker.
"""

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from parley.cli.appinfo import app_info
from parley.dispatcher.core import Enqueue
from parley.dispatcher.enqueue import Outbox
from parley.runtime import metrics
from parley.runtime.procs import RedisServer
from parley.schemas.jobs import JobKind, job_id
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.schemas.state import Core
from parley.workers import jobs
from parley.workers.app import App, load_app
from parley.workers.jobs import Finish
from parley.workers.worker import ParleyJob, make_worker
from tests.conftest import eventually
from tests.integration.conftest import (
    RESULTS,
    MakeDispatcher,
    enqueue_tool_job,
    events,
    issue,
    queue_ids,
    rewrite_job,
    send,
    tick,
    types,
)

KEYS = Keys()
pytestmark = pytest.mark.usefixtures("restore_signals")


@pytest.fixture
def scenarios(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The worker's app for this test (restored afterwards)."""
    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.scenarios"))
    yield


def run_burst(r: redis.Redis, *queues: str) -> None:
    make_worker(list(queues or ("decide", "llm", "tools")), r).work(burst=True)


def outcomes(r: redis.Redis, stream: str = RESULTS) -> list[WorkOutcome]:
    return [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in r.xrange(stream)]


def tool_job(r: redis.Redis, name: str, arguments: dict[str, Any], *, work: str = "call-1",
             timeout: int = 30, reply_to: str = RESULTS, queue: str = "tools",
             answers: list[Any] | None = None) -> Job:
    payload: dict[str, Any] = {"session": "s-w", "work": work, "attempt": 1, "reply_to": reply_to,
                               "name": name, "arguments": arguments}
    if answers is not None:
        payload["answers"] = answers
    job = Job.create("parley.workers.jobs.run_tool", args=[payload], id=job_id("s-w", work, 1), connection=r,
                     serializer=JSONSerializer, timeout=timeout, result_ttl=0)
    return issue(r, Queue(queue, connection=r, serializer=JSONSerializer).enqueue_job(job))


# ---- the allowlist (docs/design.md, Workers: a worker runs only Parley's own job functions) ----


@pytest.mark.parametrize(("func", "args"), [
    ("os.system", lambda target: [f"touch {target}"]),
    ("subprocess.call", lambda target: [["touch", str(target)]]),
    ("pathlib.Path.touch", lambda target: [str(target)]),
])
def test_a_job_naming_a_foreign_function_is_refused(
        r: redis.Redis, tmp_path: Path, scenarios: None, func: str, args: Any) -> None:
    target = tmp_path / "pwned"
    # issued as if by a dispatcher (in-flight record and digest): the allowlist is the second
    # wall, behind the take's check that a dispatcher issued the job at all (test below)
    decide = Queue("decide", connection=r, serializer=JSONSerializer)
    planted = issue(r, decide.enqueue_call(func, args=args(target)))
    run_burst(r, "decide")
    assert not target.exists()
    job = Job.fetch(planted.id, connection=r, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FAILED
    assert planted.id in FailedJobRegistry("decide", connection=r, serializer=JSONSerializer).get_job_ids()
    result = job.latest_result()
    assert result is not None and result.type == result.Type.FAILED
    assert "RefusedJob" in (result.exc_string or "")
    assert f"names {func!r}, which is not a Parley job" in (result.exc_string or "")
    assert r.exists(RESULTS) == 0


def test_parley_job_class_refuses_before_importing(r: redis.Redis) -> None:
    job = ParleyJob.create("os.getcwd", connection=r, serializer=JSONSerializer)
    with pytest.raises(Exception, match="not a Parley job"):
        _ = job.func
    allowed = ParleyJob.create("parley.workers.jobs.run_tool", args=[{}], connection=r,
                               serializer=JSONSerializer)
    assert allowed.func is jobs.run_tool
    assert frozenset({"parley.workers.jobs.run_decide", "parley.workers.jobs.run_llm",
                      "parley.workers.jobs.run_tool"}) == jobs.ALLOWED_FUNCS


def test_parley_job_restores_a_job_hash_as_rq_does(r: redis.Redis) -> None:
    """ParleyJob reads the timestamps with fromisoformat instead of RQ's strptime: same values
    (UTC-aware), the older second-precision form included, the rest of the hash untouched."""
    jid = enqueue_tool_job(r, "s-w", "call-1", "add", {"a": 1, "b": 2})
    raw = r.hgetall(f"rq:job:{jid}")
    raw[b"started_at"] = b"2026-12-01T18:00:00Z"  # RQ's older form, without microseconds
    theirs, ours = Job(jid, connection=r, serializer=JSONSerializer), ParleyJob(
        jid, connection=r, serializer=JSONSerializer)
    theirs.restore(dict(raw))
    ours.restore(dict(raw))
    fields = ("created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat", "origin",
              "timeout", "result_ttl", "args", "func_name")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    assert ours.enqueued_at is not None and ours.enqueued_at.tzinfo is not None
    assert ours.func is jobs.run_tool
    raw[b"enqueued_at"] = b"yesterday"
    with pytest.raises(ValueError):  # what RQ's own parser raises for it
        ParleyJob(jid, connection=r, serializer=JSONSerializer).restore(dict(raw))


# ---- real jobs post WorkOutcomes ---------------------------------------------------------------


def test_tool_job_posts_its_outcome_and_leaves_nothing_behind(r: redis.Redis, scenarios: None) -> None:
    job = tool_job(r, "add", {"a": 2, "b": 40})
    run_burst(r, "tools")
    assert outcomes(r) == [WorkOutcome(session="s-w", work="call-1", attempt=1, kind="tool", ok=True,
                                       value=42)]
    assert r.exists(job.key) == 0  # finished jobs leave nothing behind (docs/operations.md, Redis)
    assert r.keys("rq:results:*") == []
    assert queue_ids(r, "tools") == []


def test_tool_errors_and_unknown_tools_are_outcomes(r: redis.Redis, scenarios: None) -> None:
    tool_job(r, "boom", {}, work="call-1")
    tool_job(r, "no_such_tool", {}, work="call-2")
    tool_job(r, "add", {"a": 1}, work="call-3")  # missing argument
    run_burst(r, "tools")
    got = {o.work: o for o in outcomes(r)}
    assert (got["call-1"].ok, got["call-1"].error) == (False, "RuntimeError: boom")
    assert (got["call-2"].ok, got["call-2"].error) == (False, "unknown_tool")
    assert got["call-3"].ok is False and got["call-3"].error.startswith("TypeError")
    assert all(o.kind == "tool" and o.value is None for o in got.values())


def test_a_tool_that_raises_is_logged_at_error_with_its_traceback_and_its_outcome_names_the_apps_frame(
        r: redis.Redis, scenarios: None, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32: a failing app function used to leave one INFO line (`job done ... ok=False`)."""
    import logging

    tool_job(r, "boom", {}, work="call-1")
    with caplog.at_level(logging.ERROR, logger="parley.worker"):
        run_burst(r, "tools")
    [outcome] = outcomes(r)
    assert outcome.exception is not None
    assert (outcome.exception.type, outcome.exception.message) == ("RuntimeError", "boom")
    assert [f.split(":")[0] for f in outcome.exception.frames] == ["tests/apps/scenarios.py"]
    assert outcome.exception.frames[-1].endswith(" in boom")
    [record] = [rec for rec in caplog.records if rec.getMessage() == "app code raised"]
    assert record.levelno == logging.ERROR and record.exc_info and record.exc_info[0] is RuntimeError
    assert "tests/apps/scenarios.py" in caplog.text and "raise RuntimeError(\"boom\")" in caplog.text


def test_async_tools_run_on_the_workers_event_loop(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: an `async def` tool failed with `Type is not JSON serializable: coroutine`. It
    runs on one event loop kept for the worker's life; a time limit cancels it; its failure is
    the app's exception like any other."""
    from tests.apps import async_app

    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.async_app"))
    async_app.LOOPS.clear()
    tool_job(r, "add", {"a": 2, "b": 3}, work="call-1")
    tool_job(r, "add", {"a": 4, "b": 5}, work="call-2")
    tool_job(r, "fail", {}, work="call-3")
    tool_job(r, "nap", {"seconds": 30}, work="call-4", timeout=1)
    tool_job(r, "add", {"a": 1, "b": 1}, work="call-5")  # the loop still serves after a timeout
    run_burst(r, "tools")
    got = {o.work: o for o in outcomes(r)}
    assert [(got[w].ok, got[w].value) for w in ("call-1", "call-2", "call-5")] == [
        (True, 5), (True, 9), (True, 2)]
    assert (got["call-3"].ok, got["call-3"].error) == (False, "LookupError: no such invoice")
    assert got["call-3"].exception is not None and got["call-3"].exception.frames[-1].endswith(" in fail")
    assert (got["call-4"].ok, got["call-4"].error) == (False, "timeout")
    assert len(async_app.LOOPS) == 3 and len(set(async_app.LOOPS)) == 1


def test_a_tool_that_asks_posts_its_question_and_runs_on_with_its_answers(
        r: redis.Redis, scenarios: None, tmp_path: Path) -> None:
    """Issue 32: `parley.interrupt()` inside a tool. Each run starts from the beginning; the
    answers its job carries return in order; the first question past them is the outcome."""
    log = tmp_path / "runs"
    tool_job(r, "transfer", {"amount": 5, "log": str(log)}, work="call-1")
    tool_job(r, "transfer", {"amount": 5, "log": str(log)}, work="call-2", answers=["checking"])
    tool_job(r, "transfer", {"amount": 5, "log": str(log)}, work="call-3", answers=["checking", True])
    run_burst(r, "tools")
    got = {o.work: o for o in outcomes(r)}
    first, second, done = got["call-1"], got["call-2"], got["call-3"]
    assert (first.ok, first.error, first.value) == (False, "asked", None)
    assert first.interrupt == {"reason": "which_account", "payload": {"amount": 5},
                               "response_schema": {"type": "string", "enum": ["checking", "savings"]}}
    assert first.exception is None
    # its `except Exception` around the second question did not swallow it
    assert second.interrupt == {"reason": "confirm", "payload": {"account": "checking", "amount": 5}}
    assert (done.ok, done.value, done.interrupt) == (True, "moved 5 from checking", None)
    assert log.read_text() == "run\n" * 3


def test_an_async_tool_asks_too_and_interrupt_outside_a_tool_is_an_app_error(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.async_app"))
    tool_job(r, "pick", {"options": ["a", "b"]}, work="call-1")
    tool_job(r, "pick", {"options": ["a", "b"]}, work="call-2", answers=["b"])
    run_burst(r, "tools")
    got = {o.work: o for o in outcomes(r)}
    assert got["call-1"].interrupt == {"reason": "pick", "payload": {"options": ["a", "b"]}}
    assert (got["call-2"].ok, got["call-2"].value) == (True, "picked b")
    from parley import interrupt

    with pytest.raises(RuntimeError, match="inside a tool"):
        interrupt("outside")


def test_an_async_decide_and_an_async_llm_run_too(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.async_app"))
    app = jobs.current_app()
    from parley.schemas.actions import Decision
    from parley.workers import awaiting

    assert app.decide is not None and app.llm is not None
    assert awaiting.resolved(app.decide(None, Decision())) == Decision()
    reply = awaiting.resolved(app.llm({"messages": [{"role": "user", "content": "hi"}], "tools": []}))
    assert isinstance(reply, dict) and "content" in reply


def test_a_job_cannot_post_outside_a_results_stream(r: redis.Redis, scenarios: None) -> None:
    events_key = "parley:{s-w}:events"
    job = tool_job(r, "add", {"a": 1, "b": 1}, reply_to=events_key)
    run_burst(r, "tools")
    assert r.exists(events_key) == 0
    assert r.exists(RESULTS) == 0
    assert Job.fetch(job.id, connection=r, serializer=JSONSerializer).get_status() == JobStatus.FAILED


def test_llm_and_decide_jobs_post_outcomes(r: redis.Redis, scenarios: None) -> None:
    base = {"session": "s-w", "attempt": 1, "reply_to": RESULTS}
    llm = Job.create("parley.workers.jobs.run_llm", args=[{**base, "work": "llm-1", "request": {
        "messages": [{"id": "msg-1", "parent_id": None, "role": "user", "content": 'call add {"a": 1}'}]}}],
        connection=r, serializer=JSONSerializer, result_ttl=0)
    decide = Job.create("parley.workers.jobs.run_decide", args=[{**base, "work": "dec-1", "trigger": {
        "type": "tool.execute", "session": "s-w", "head": "msg-2", "call_id": "call-1", "name": "send_email",
        "arguments": {"to": "a@b", "body": "hi"}}, "proposed": {"actions": [{"type": "tool.execute"}]}}],
        connection=r, serializer=JSONSerializer, result_ttl=0)
    issue(r, Queue("llm", connection=r, serializer=JSONSerializer).enqueue_job(llm))
    issue(r, Queue("decide", connection=r, serializer=JSONSerializer).enqueue_job(decide))
    run_burst(r, "decide", "llm")
    got = {o.work: o for o in outcomes(r)}
    assert got["llm-1"].kind == "llm" and got["llm-1"].ok
    assert got["llm-1"].value["tool_calls"] == [{"id": "s1", "name": "add", "arguments": {"a": 1}}]
    assert got["dec-1"].kind == "decide" and got["dec-1"].ok
    assert got["dec-1"].value["actions"][0]["type"] == "interrupt"
    assert got["dec-1"].value["actions"][0]["reason"] == "confirm"


def test_an_llm_job_reads_the_bodies_of_the_messages_it_names(
        r: redis.Redis, scenarios: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job carries the branch's ids (`chain`, root first); the worker reads their bodies, one
    HMGET, and hands the app's `llm` the same request the bodies would have made: public fields,
    root first, then the call's `model`."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(jobs, "_app", dataclasses.replace(
        jobs.current_app(None), llm=lambda request: seen.append(request) or {"content": "ok"}))
    stored = {"msg-1": {"id": "msg-1", "parent_id": None, "role": "user", "content": "one", "turn": "msg-1",
                        "order": 1},
              "msg-2": {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "two",
                        "turn": "msg-1", "order": 2},
              "msg-3": {"id": "msg-3", "parent_id": "msg-1", "role": "user", "content": "three",
                        "turn": "msg-3", "order": 3}}
    r.hset("parley:{s-w}:msgs", mapping={k: orjson.dumps(v) for k, v in stored.items()})
    base = {"session": "s-w", "attempt": 1, "reply_to": RESULTS}
    queue = Queue("llm", connection=r, serializer=JSONSerializer)
    for work, chain in (("llm-1", ["msg-1", "msg-3"]), ("llm-2", ["msg-1", "msg-9"])):
        issue(r, queue.enqueue_job(Job.create("parley.workers.jobs.run_llm", args=[{
            **base, "work": work, "chain": chain, "request": {"model": "m"}}],
            connection=r, serializer=JSONSerializer, result_ttl=0)))
    run_burst(r, "llm")
    assert seen[0]["messages"] == [
        {"id": "msg-1", "parent_id": None, "role": "user", "content": "one"},
        {"id": "msg-3", "parent_id": "msg-1", "role": "user", "content": "three"}]
    assert seen[0]["model"] == "m" and "tools" in seen[0] and len(seen) == 1
    got = {o.work: o for o in outcomes(r)}
    assert got["llm-1"].ok
    # a message gone (its session expired meanwhile, or the commit that wrote it lost in a
    # failover): the model is not called, and the job is posted lost, so that the dispatcher
    # retries the call rather than fail it (issue 29)
    assert (got["llm-2"].ok, got["llm-2"].error, got["llm-2"].lost) == (
        False, "the branch's messages are gone", True)


# ---- timeouts (docs/protocol.md, Tools): SimpleWorker's SIGALRM death penalty in the main thread ---


def test_a_tool_over_its_time_limit_posts_a_timeout(r: redis.Redis, scenarios: None) -> None:
    tool_job(r, "slow", {"seconds": 3}, timeout=1)
    started = time.monotonic()
    run_burst(r, "tools")
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, elapsed  # stopped at its limit, not after 3 s
    assert outcomes(r) == [WorkOutcome(session="s-w", work="call-1", attempt=1, kind="tool", ok=False,
                                       error="timeout")]


def test_tool_timeout_from_the_app_reaches_the_job_and_the_session(
        r: redis.Redis, make_dispatcher: MakeDispatcher, scenarios: None) -> None:
    """`fn.timeout_s` (here 1 s on `slow`) becomes the job's limit; running over it is a tool error."""
    d = make_dispatcher()  # its app shape marks `slow` with timeout_s=1
    send(r, "s-t", {"type": "message.create", "content": 'call slow {"seconds": 3}'})
    tick(d)
    run_burst(r, "llm")
    tick(d)
    tid = job_id("s-t", "call-1", 1)
    assert queue_ids(r, "tools") == [tid]
    assert Job.fetch(tid, connection=r, serializer=JSONSerializer).timeout == 1
    run_burst(r, "tools")
    tick(d)
    completed = [e for e in events(r, "s-t") if e["type"] == "tool.completed"]
    assert completed == [{**completed[0], "call_id": "call-1", "name": "slow", "error": "timeout"}]
    tool_msg = [e["message"] for e in events(r, "s-t") if e["type"] == "message.created"][2]
    assert tool_msg["role"] == "tool" and tool_msg["content"] == "timeout" and tool_msg["error"] is True


# ---- a whole turn, dispatcher and worker in one process ---------------------------------------


def test_a_turn_runs_through_the_outbox_workers_and_results(
        r: redis.Redis, make_dispatcher: MakeDispatcher, scenarios: None) -> None:
    d = make_dispatcher(app=app_info(load_app("tests.apps.scenarios")))
    send(r, "s-loop", {"type": "message.create",
                       "content": 'call add {"a": 1, "b": 2}\ncall add {"a": 3, "b": 4}'})
    for _ in range(20):
        tick(d, 2)
        if "turn.completed" in types(r, "s-loop"):
            break
        run_burst(r)
    evs = events(r, "s-loop")
    kinds = [e["type"] for e in evs]
    assert kinds[-1] == "turn.completed", kinds
    assert kinds.count("llm.started") == 2
    assert sorted(e["call_id"] for e in evs if e["type"] == "tool.completed") == ["call-1", "call-2"]
    msgs = [e["message"] for e in evs if e["type"] == "message.created"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["3", "7"]
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["content"] == "Done. add: 3; add: 7"
    # nothing is left anywhere: streams trimmed, queues drained, no job hashes
    assert r.xlen("parley:inputs") == 0 and r.xlen(RESULTS) == 0
    assert [k for k in r.keys("rq:job:*")] == []
    assert all(queue_ids(r, q) == [] for q in ("decide", "llm", "tools"))
    assert r.hlen("parley:{s-loop}:outbox") == 0
    core = Core.model_validate_json(r.hget("parley:{s-loop}:meta", "core"))
    assert core.work == {} and core.deciding is None and core.queue == []


def test_a_running_job_is_recorded_for_its_worker_and_cleared_with_its_outcome(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lost-work detection: while a job runs, `parley:running` names the worker running it."""
    seen: list[Any] = []

    def probe() -> str:
        """Look at Redis while running."""
        seen.append(orjson.loads(r.hget("parley:running", job_id("s-w", "call-1", 1)) or b"null"))
        return "looked"

    monkeypatch.setattr(jobs, "_app", App(spec="probe", tools={"probe": probe}))
    monkeypatch.setattr(jobs, "_worker_id", None)
    jobs.set_worker_id("w-7")
    tool_job(r, "probe", {})
    run_burst(r, "tools")
    # the in-flight record the take read, with who runs it
    named = ("worker", "session", "work", "attempt", "kind", "reply_to")
    assert [{k: v for k, v in rec.items() if k in named} for rec in seen] == [
        {"worker": "w-7", "session": "s-w", "work": "call-1", "attempt": 1, "kind": "tool",
         "reply_to": RESULTS}]
    assert r.hlen("parley:running") == 0
    assert [(o.work, o.ok, o.value) for o in outcomes(r)] == [("call-1", True, "looked")]


def test_callbacks_named_in_a_planted_job_hash_are_never_imported(r: redis.Redis) -> None:
    """docs/design.md, Workers: the allowlist is the boundary; RQ callback names in a job hash are
    ignored too."""
    queue = Queue("decide", connection=r, serializer=JSONSerializer)
    job = issue(r, queue.enqueue_call("os.getcwd"))
    r.hset(job.key, mapping={"failure_callback_name": "tests.apps.planted_callback.boom",
                             "success_callback_name": "tests.apps.planted_callback.boom"})
    make_worker(["decide"], r).work(burst=True)
    assert r.get("planted-callback-ran") is None
    assert "PARLEY_PLANTED_CALLBACK_IMPORTED" not in os.environ
    assert Job.fetch(job.id, connection=r, serializer=JSONSerializer).get_status() == JobStatus.FAILED


# ---- the lean path: jobs a dispatcher enqueued (they have an in-flight record) -------------------


def outbox_tool_job(r: redis.Redis, name: str, arguments: dict[str, Any], *, work: str = "call-1",
                    reply_to: str = RESULTS) -> str:
    return enqueue_tool_job(r, "s-w", work, name, arguments, reply_to=reply_to)


def commands_total(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def test_lean_path_records_the_job_when_it_takes_it_and_leaves_nothing(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    jid = job_id("s-w", "call-1", 1)

    def probe() -> str:
        seen.append((orjson.loads(r.hget("parley:running", jid) or b"null"),
                     r.hexists("parley:inflight", jid)))
        return "looked"

    monkeypatch.setattr(jobs, "_app", App(spec="probe", tools={"probe": probe}))
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    outbox_tool_job(r, "probe", {})
    inflight = orjson.loads(r.hget("parley:inflight", jid))
    run_burst(r, "tools")
    # while it ran: the in-flight record plus who runs it (what a dispatcher needs to post its loss)
    assert seen == [({"worker": "w-9", **inflight}, True)]
    assert [(o.work, o.ok, o.value) for o in outcomes(r)] == [("call-1", True, "looked")]
    # afterwards: no job hash, no records, nothing in any RQ registry, no RQ result
    assert r.exists(f"rq:job:{jid}") == 0
    assert r.hlen("parley:running") == 0 and r.hlen("parley:inflight") == 0
    assert r.keys("rq:results:*") == [] and r.keys("rq:execution*") == []
    assert [k for k in r.keys("rq:*") if b"registry" in k or b"wip" in k] == []


def test_lean_path_costs_a_few_commands_per_job(r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
                                                scenarios: None) -> None:
    """The point of the lean path: RQ's per-job bookkeeping (about 50 commands) is skipped. The
    worker's start-up and shutdown are the same whatever the number of jobs, so the difference
    between 1 and 21 jobs is the per-job cost."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")

    def commands_for(n: int) -> int:
        for i in range(n):
            outbox_tool_job(r, "add", {"a": i, "b": 1}, work=f"call-{n}-{i}")
        before = commands_total(r)
        run_burst(r, "tools")
        return commands_total(r) - before

    per_job = (commands_for(21) - commands_for(1)) / 20
    # take_job.lua finishing one job and taking the next: EVALSHA + GET, XADD, HGET (are the
    # records still that job's: finish_lib.lua), HDEL x2, ZREM, DEL, LPOP, HGETALL, HGET, HSET,
    # SET, GETDEL (the job's token) inside it: 14; RQ's own path costs about 60
    assert per_job <= 15, per_job
    assert r.xlen(RESULTS) == 22 and r.hlen("parley:running") == 0 and r.keys("rq:job:*") == []


def test_lean_path_is_one_round_trip_per_job(r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
                                            scenarios: None) -> None:
    """A job's outcome is posted by the same take_job.lua call that takes the next job: per job,
    one EVALSHA and no MULTI (the two round trips of a take and an outcome MULTI before)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")

    def calls(name: str) -> int:
        return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))

    def round_trips_for(n: int) -> tuple[int, int]:
        for i in range(n):
            outbox_tool_job(r, "add", {"a": i, "b": 1}, work=f"call-{n}-{i}")
        evalsha, execs = calls("evalsha"), calls("exec")
        run_burst(r, "tools")
        return calls("evalsha") - evalsha, calls("exec") - execs

    round_trips_for(0)  # loads the script (a first EVALSHA answered NOSCRIPT counts as a call)
    (evalsha_1, exec_1), (evalsha_21, exec_21) = round_trips_for(1), round_trips_for(21)
    assert (evalsha_21 - evalsha_1, exec_21 - exec_1) == (20, 0)
    assert r.xlen(RESULTS) == 22 and r.hlen("parley:running") == 0 and r.hlen("parley:inflight") == 0


def _finish_of(r: redis.Redis, job: Job, value: Any) -> Finish:
    payload = job.args[0]
    outcome = WorkOutcome(session=payload["session"], work=payload["work"], attempt=payload["attempt"],
                          kind="tool", ok=True, value=value)
    return Finish(payload["reply_to"], outcome.model_dump_json())


def two_jobs_first_taken(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, str]:
    """Two tool jobs queued and the first taken by worker w-9: (worker, what it took, the second's id)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    first = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    second = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken and taken[0].id == first
    return worker, taken, second


def test_lean_path_loads_its_script_again_after_redis_forgot_it(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A restarted Redis (here SCRIPT FLUSH) answers NOSCRIPT: the worker loads take_job.lua and
    calls it again, once, finishing and taking as before."""
    worker, taken, second = two_jobs_first_taken(r, monkeypatch)
    r.script_flush()
    nxt = worker.take("token-2", finish=(taken[0], _finish_of(r, taken[0], 2)))
    assert nxt and nxt[0].id == second
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 2)]


def test_lean_path_a_finish_retried_after_a_lost_reply_posts_once_and_gets_the_job_it_took(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The finish's reply is lost (Redis went away after running it): the retry with the same
    secret does not post the outcome a second time, and gets the job that call took, with the
    job's token (kept masked in the worker's last-take record), so it runs."""
    worker, taken, second = two_jobs_first_taken(r, monkeypatch)
    first = taken[0].id
    done = taken[0]
    lost = worker.take("token-2", finish=(done, _finish_of(r, done, 2)))
    assert lost and lost[0].id == second and r.hexists("parley:running", second)
    again = worker.take("token-2", finish=(done, _finish_of(r, done, 2)))
    assert again and again[0].id == second and r.hexists("parley:running", second)
    assert again[0].parley_job_token == lost[0].parley_job_token != ""
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 2)]
    assert not r.hexists("parley:running", first) and not r.hexists("parley:inflight", first)
    assert r.exists(f"rq:job:{first}") == 0 and r.zscore("parley:inflight:rq:queue:tools", first) is None


def test_the_last_take_record_holds_neither_the_secret_nor_the_token(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """Every worker may read every last-take record (one login): it must not tell the token of
    the job taken, nor the secret that unmasks it. A retry with another secret gets nothing."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    token = r.get(KEYS.job_token(jid))
    assert token
    taken = make_worker(["tools"], r).take("secret-of-the-take")
    assert taken and taken[0].parley_job_token == token.decode()
    record = r.get(KEYS.last_take("w-9"))
    assert record and token not in record and b"secret-of-the-take" not in record
    assert r.get(KEYS.job_token(jid)) is None  # read once
    other = make_worker(["tools"], r)
    assert other.take("a-guessed-secret") is None  # not the retry: a new take, nothing queued


@pytest.mark.parametrize("take_next", [True, False])
def test_lean_path_a_finish_that_took_nothing_retried_posts_once(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None, take_next: bool) -> None:
    """Nothing queued (or a stop requested: take_next False, the job queued stays queued): the
    finish leaves its token all the same, and its retry posts nothing again."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    queued = [] if take_next else [outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")]
    done = _finish_of(r, taken[0], 2)
    assert worker.take("token-2", finish=(taken[0], done), take_next=take_next) is None
    assert worker.take("token-2", finish=(taken[0], done), take_next=take_next) is None
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 2)]
    assert r.lrange("rq:queue:tools", 0, -1) == [q.encode() for q in queued]
    assert r.hlen("parley:running") == 0


def test_lean_path_a_finish_that_popped_a_cancelled_job_retried_posts_once(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    cancelled = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    r.delete(f"rq:job:{cancelled}")
    done = _finish_of(r, taken[0], 2)
    assert worker.take("token-2", finish=(taken[0], done)) is False
    assert worker.take("token-2", finish=(taken[0], done)) is False
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 2)]
    assert r.hlen("parley:running") == 0


def given_back(r: redis.Redis, stream: str = RESULTS) -> list[tuple[str, bool]]:
    """(work, signed by its job's token) of each unrun outcome posted to `stream`."""
    from parley.dispatcher.engine_key import EngineKey
    from parley.schemas.signing import job_signed

    engine_key = EngineKey(r, KEYS).load()
    out = []
    for _id, f in r.xrange(stream):
        o = WorkOutcome.model_validate_json(f[b"outcome"])
        if o.unrun:
            jid, sig = job_id(o.session, o.work, o.attempt), f.get(b"job_sig", b"").decode()
            out.append((o.work, job_signed(engine_key, jid, f[b"outcome"], sig)))
    return out


def test_lean_path_a_worker_stopping_with_a_job_taken_gives_it_back(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The finish of the last job took the next one, and the worker stops before running it
    (here `max_jobs`; a stop request during the finish is the same): it posts the job's unrun
    outcome, signed with the job's token, and deletes its records, so that a dispatcher issues
    it again. It is not pushed back: its token went with the take, and nobody but a dispatcher
    may write one."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    second = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    third = outbox_tool_job(r, "add", {"a": 3, "b": 3}, work="call-3")
    make_worker(["tools"], r).work(burst=True, max_jobs=1)
    assert [(o.work, o.value) for o in outcomes(r) if not o.unrun] == [("call-1", 2)]
    assert given_back(r) == [("call-2", True)]
    assert r.lrange("rq:queue:tools", 0, -1) == [third.encode()]
    assert r.hlen("parley:running") == 0 and not r.hexists("parley:inflight", second)
    assert not r.exists(f"rq:job:{second}") and r.zscore(KEYS.inflight_order("tools"), second) is None
    run_burst(r, "tools")  # and another worker runs the third
    assert [(o.work, o.value) for o in outcomes(r) if not o.unrun] == [("call-1", 2), ("call-3", 6)]
    assert r.hlen("parley:running") == 0 and r.hlen("parley:inflight") == 0


def test_lean_path_a_job_settled_while_held_is_not_given_back(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The worker holds a job its last finish took, and a dispatcher settles it meanwhile (its
    heartbeat lapsed: the loss posted, the in-flight and running records gone, the job hash
    left). Stopping, the worker must not push it back (another worker would run it beside its
    retry): it deletes the job hash and leaves the queue as it is."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    held = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken and taken[0].id == held
    worker._next = taken  # as a finish that took it leaves it
    r.hdel("parley:inflight", held)  # what settle_lost.lua does when it posts the loss
    r.hdel("parley:running", held)
    worker.give_back()
    assert r.llen("rq:queue:tools") == 0 and not r.exists(f"rq:job:{held}")
    assert r.hlen("parley:running") == 0


def test_lean_path_an_outcome_left_before_the_time_limit_struck_is_posted(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The time limit strikes after the job left its outcome, before its time-limit block is
    left: the work is done, and its outcome is posted (not dropped for a loss posted later)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    real = worker.death_penalty_class

    class LateAlarm(real):  # type: ignore[misc,valid-type]
        def __exit__(self, *exc: Any) -> Any:
            super().__exit__(*exc)
            raise self._exception("the time limit, struck on the way out")

    worker.death_penalty_class = LateAlarm
    worker.work(burst=True)
    assert [(o.work, o.ok, o.value) for o in outcomes(r)] == [("call-1", True, 2)]
    assert r.hlen("parley:running") == 0 and r.hlen("parley:inflight") == 0


def test_lean_path_a_stop_requested_while_a_job_runs_takes_nothing_after_it(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while a job runs: its finish posts the outcome and takes nothing; the worker stops
    and the next job stays queued."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    worker = make_worker(["tools"], r)

    def stop() -> str:
        worker.request_stop(signal.SIGTERM, None)
        return "stopping"

    monkeypatch.setattr(jobs, "_app", App(spec="stop", tools={"stop": stop}))
    outbox_tool_job(r, "stop", {}, work="call-1")
    second = outbox_tool_job(r, "stop", {}, work="call-2")
    worker.work(burst=True)
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", "stopping")]
    assert r.lrange("rq:queue:tools", 0, -1) == [second.encode()] and r.hlen("parley:running") == 0


def test_lean_path_a_worker_that_cannot_post_for_its_whole_patience_exits(
        r: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """Past the outage patience the worker cannot know whether its last call ran (and took a job
    it does not know of): it exits, so that its heartbeat lapses and a dispatcher posts the loss
    of every job recorded on it."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    monkeypatch.setattr(jobs, "OUTAGE_PATIENCE_S", 0.5)
    outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    exits: list[int] = []

    def exit_(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr("parley.workers.worker.os._exit", exit_)
    redis_server.stop(kill=True)
    try:
        with pytest.raises(SystemExit):
            worker.execute_job(*taken)  # type: ignore[misc]
    finally:
        redis_server.start()
    assert exits == [75]
    assert r.xlen(RESULTS) == 0 and r.hexists("parley:running", taken[0].id)


def test_lean_path_skips_a_job_cancelled_while_queued(r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
                                                      scenarios: None) -> None:
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    cancelled = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    r.delete(f"rq:job:{cancelled}")  # what the outbox's cancel does, racing the worker's pop
    run_burst(r, "tools")
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-2", 4)]
    assert r.hlen("parley:running") == 0


def test_lean_path_a_job_that_raises_goes_to_rqs_failed_registry_and_its_loss_can_be_posted(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A job that raises instead of posting an outcome: RQ keeps it as failed, and its running
    record goes, so that the in-flight record lets a dispatcher post its loss (the session
    never waits forever on it)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, reply_to="parley:{s-w}:events")
    run_burst(r, "tools")
    assert r.xlen("parley:{s-w}:events") == 0
    assert jid in FailedJobRegistry("tools", connection=r, serializer=JSONSerializer).get_job_ids()
    assert r.hexists("parley:running", jid) == 0 and r.hexists("parley:inflight", jid) == 1


def test_lean_path_a_take_retried_after_a_lost_reply_gets_the_job_it_took(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """Redis answers nothing (it went away after running the script): the worker calls again with
    the same secret and gets the job that call popped and recorded as running on it, token
    included, so a live worker is never left recorded with a job it does not know it has, and
    the job runs (a Redis restart mid-take loses nothing). Nothing else is popped."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    first = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    second = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    worker = make_worker(["tools"], r)
    lost = worker.take("token-1")  # its reply "lost": the job is popped and recorded as running
    assert lost and lost[0].id == first and r.hexists("parley:running", first)
    again = worker.take("token-1")
    assert again and again[0].id == first and again[0].parley_job_token == lost[0].parley_job_token != ""
    assert r.hexists("parley:running", first) and r.hexists("parley:inflight", first)
    assert r.lrange("rq:queue:tools", 0, -1) == [second.encode()]  # nothing else was popped
    nxt = worker.take("token-2")
    assert nxt and nxt[0].id == second
    assert worker.take("token-3") is None


def test_a_take_that_finds_no_token_runs_nothing_and_leaves_the_job_to_a_dispatcher(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """Its token read by another take first (or expired): the job is not run, its running
    record goes and its in-flight record stays, for the unclaimed-work sweep."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    r.delete(KEYS.job_token(jid))
    before = metrics.JOBS_REFUSED.labels("no_token")._value.get()
    assert make_worker(["tools"], r).take("token-1") is False
    assert metrics.JOBS_REFUSED.labels("no_token")._value.get() == before + 1
    assert not r.hexists("parley:running", jid) and r.hexists("parley:inflight", jid)
    assert outcomes(r) == []


def test_lean_path_a_retried_take_of_a_job_cancelled_since_clears_its_record(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1})
    worker = make_worker(["tools"], r)
    assert worker.take("token-1")
    r.delete(f"rq:job:{jid}")  # the dispatcher cancels it meanwhile
    assert worker.take("token-1") is False
    assert r.hexists("parley:running", jid) == 0


def test_lean_path_an_outcome_rides_out_an_outage_longer_than_the_jobs_time_limit(
        r: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis dies while a job runs and stays away past the job's time limit. The time limit
    covers the job's own code, not its post (the worker's finish, after it): the outcome is
    posted once Redis is back, exactly once, and the job leaves no record behind."""
    def slow() -> str:
        time.sleep(1.0)
        return "late"

    monkeypatch.setattr(jobs, "_app", App(spec="slow", tools={"slow": slow}))
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = enqueue_tool_job(r, "s-w", "call-1", "slow", {}, timeout=2)

    def outage() -> None:
        time.sleep(0.5)  # the job is in its tool
        redis_server.stop(kill=True)
        time.sleep(3.0)  # longer than what is left of the job's 2 s limit
        redis_server.start()

    thread = threading.Thread(target=outage)
    thread.start()
    run_burst(r, "tools")
    thread.join()
    assert [(o.work, o.ok, o.value) for o in outcomes(r)] == [("call-1", True, "late")]
    assert r.hexists("parley:running", jid) == 0 and r.hexists("parley:inflight", jid) == 0
    assert r.exists(f"rq:job:{jid}") == 0


def test_a_stop_request_while_idle_is_taken_between_jobs(r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
                                                          scenarios: None) -> None:
    """SIGTERM on an idle worker: RQ would raise StopRequested wherever the main thread is, also
    right after a take; ParleyWorker notes it and stops between jobs, running what it took."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 2})
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    worker.request_stop(signal.SIGTERM, None)  # idle: RQ's own _shutdown raises StopRequested here
    assert worker._stop_requested
    worker.execute_job(*taken)  # type: ignore[misc]
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 3)]
    assert r.hexists("parley:running", jid) == 0
    assert worker.dequeue_job_and_maintain_ttl(timeout=5) is None  # and then it stops


def test_lean_path_a_job_hash_rq_cannot_read_is_skipped(r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
                                                        scenarios: None) -> None:
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    broken = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    r.hdel(f"rq:job:{broken}", "data")  # a hash without its payload
    run_burst(r, "tools")
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-2", 4)]
    assert r.hexists("parley:running", broken) == 0 and r.hexists("parley:inflight", broken) == 1


# ---- a prefix other than `parley` ---------------------------------------------------------------


def test_a_worker_under_a_prefix_with_colons_runs_its_jobs_and_refuses_another_prefixs(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The reply stream a job may name is built from the worker's own key layout: with the prefix
    `acme:parley`, `acme:parley:results[:n]`; a job naming another prefix's stream is refused."""
    keys = Keys("acme:parley")
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    monkeypatch.setattr(jobs, "_keys", Keys(), raising=False)  # restored after the test: the worker sets it
    outbox = Outbox(r, keys)
    ours = [Enqueue(seq=i, job=JobKind.TOOL, work=f"call-{i}", attempt=1, timeout=30, reply_to=reply_to,
                    app=None, args={"name": "add", "arguments": {"a": i, "b": 1}})
            for i, reply_to in enumerate([keys.results(), keys.results(2, 4)], 1)]
    foreign = Enqueue(seq=3, job=JobKind.TOOL, work="call-3", attempt=1, timeout=30,
                      reply_to="parley:results", app=None,
                      args={"name": "add", "arguments": {"a": 3, "b": 1}})
    outbox.flush_many([("s-w", [*ours, foreign])])
    make_worker([keys.queue("tools")], r, keys=keys).work(burst=True)
    assert [(o.work, o.value) for o in outcomes(r, keys.results())] == [("call-1", 2)]
    assert [(o.work, o.value) for o in outcomes(r, keys.results(2, 4))] == [("call-2", 3)]
    assert r.exists("parley:results") == 0  # the foreign job posted nothing
    foreign_id = job_id("s-w", "call-3", 1)
    assert foreign_id in FailedJobRegistry(keys.queue("tools"), connection=r,
                                           serializer=JSONSerializer).get_job_ids()
    assert r.hlen(keys.running) == 0 and r.hkeys(keys.inflight) == [foreign_id.encode()]


# ---- issue 29: a take or an outcome the failover made stale -----------------------------------------


def _enqueued_again(r: redis.Redis, jid: str) -> bytes:
    """What a dispatcher's replay of the transition a failover lost does: the job enqueued
    again under the same id (derived from session, work, attempt), with an in-flight record of
    its own (another enqueue time). Returns that record."""
    record = orjson.loads(r.hget("parley:inflight", jid) or b"{}")
    again = orjson.dumps({**record, "at": record.get("at", 0) + 5000})
    r.hset("parley:inflight", jid, again)
    r.hset(f"rq:job:{jid}", "replayed", "1")
    return again


@pytest.mark.parametrize("path", ["take_job", "finish_job"])
def test_a_stale_outcome_leaves_the_records_of_the_job_enqueued_again_under_its_id(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None, path: str) -> None:
    """The outcome of a job whose take a failover lost, posted after the dispatcher's replay
    enqueued the job again (same id): it must not delete that job's in-flight record, its place
    in the queue's order or its job hash (which another worker is about to run). Both ways an
    outcome is posted: with the next take (take_job.lua), and on its own (finish_job.lua:
    --replica-acks, or a stopped job)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken and taken[0].id == jid
    job = taken[0]
    again = _enqueued_again(r, jid)
    r.hdel("parley:running", jid)  # the promoted replica never saw the take
    finish = _finish_of(r, job, 2)
    if path == "take_job":
        assert worker.take("token-2", finish=(job, finish), take_next=False) is None
    else:
        jobs._finish_job(job, finish.reply_to, finish.outcome)
    assert [o.work for o in outcomes(r)] == ["call-1"]  # the outcome is posted all the same
    assert r.hget("parley:inflight", jid) == again
    assert r.hget(f"rq:job:{jid}", "replayed") == b"1"
    assert r.zscore(KEYS.inflight_order("tools"), jid) is not None


def test_an_outcome_still_deletes_the_records_of_its_own_job(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The guard keeps what a normal outcome does: its own records and hash are deleted, and so
    are those of a job cancelled while it ran (its in-flight record gone: nothing to protect)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    first = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    second = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    worker = make_worker(["tools"], r)
    for jid, cancelled in ((first, False), (second, True)):
        taken = worker.take(f"token-{jid}")
        assert taken and taken[0].id == jid
        if cancelled:
            r.hdel("parley:inflight", jid)
        jobs._finish_job(taken[0], RESULTS, _finish_of(r, taken[0], 1).outcome)
        assert not r.hexists("parley:inflight", jid) and not r.hexists("parley:running", jid)
        assert not r.exists(f"rq:job:{jid}") and r.zscore(KEYS.inflight_order("tools"), jid) is None


def test_a_take_this_server_does_not_hold_is_not_given_back(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A take not confirmed is given back, on whatever server the worker reaches then. After a
    failover that lost the take, the promoted replica still has the job queued (or enqueued it
    again with a replay, or another worker runs it): pushing it would queue it twice, and its
    records are not this take's. Nothing is touched; the job runs once, from its queue."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    job, queue = taken
    # the promoted replica, as it was before the take: queued, not running, no last take
    r.delete(KEYS.last_take("w-9"))
    r.hdel("parley:running", jid)
    r.rpush("rq:queue:tools", jid)
    record = r.hget("parley:inflight", jid)
    worker.give_back_take(job, queue)
    assert queue_ids(r, "tools") == [jid]
    assert r.hget("parley:inflight", jid) == record and r.exists(f"rq:job:{jid}")
    assert outcomes(r) == []  # nothing posted


def test_a_take_given_back_twice_is_posted_once(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The server holds the take: it is given back (its unrun outcome posted, its records gone);
    a retry of that call after a lost reply posts nothing a second time."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    worker = make_worker(["tools"], r)
    taken = worker.take("token-1")
    assert taken
    worker.give_back_take(*taken)
    worker.give_back_take(*taken)
    assert given_back(r) == [("call-1", True)]
    assert queue_ids(r, "tools") == [] and not r.hexists("parley:running", jid)
    assert not r.hexists("parley:inflight", jid) and not r.exists(f"rq:job:{jid}")


# ---- a job popped by BLPOP, claimed by a separate call (review of issue 29) ---------------------


def _lost_pop(r: redis.Redis) -> tuple[str, str]:
    """A worker's BLPOP pops the head of the tools queue on the primary; the primary dies before
    the pop reaches the replica, which is promoted with the job still queued (here: pushed back
    where it was). Returns (queue key, job id) as BLPOP handed them to the worker."""
    reply = r.blpop(["rq:queue:tools"], 1)
    assert reply is not None
    queue, popped = reply
    r.lpush(queue, popped)
    return queue.decode(), popped.decode()


def test_a_job_whose_blpop_a_failover_lost_is_popped_by_its_claim(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The claim of a BLPOP'd job reaches a server that never saw the pop: claimed there as it
    stood, it would run (its take confirmed by a WAIT on that server) while still queued, and
    run again on the next worker. The claim pops it from the queue BLPOP named, atomically."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    behind = outbox_tool_job(r, "add", {"a": 2, "b": 2}, work="call-2")
    worker = make_worker(["tools"], r)
    queue, popped = _lost_pop(r)
    assert popped == jid
    taken = worker.take("token-1", popped, popped_from=queue)
    assert taken and taken[0].id == jid and taken[0].parley_claimed
    assert taken[1].key == queue
    assert queue_ids(r, "tools") == [behind]  # off its queue: the claim was the pop
    assert orjson.loads(r.hget(KEYS.running, jid) or b"{}")["worker"] == "w-9"
    # and the next worker takes the job behind it, not this one again
    monkeypatch.setattr(jobs, "_worker_id", "w-2")
    other = make_worker(["tools"], r)
    nxt = other.take("token-2")
    assert nxt and nxt[0].id == behind
    assert other.take("token-3") is None
    assert orjson.loads(r.hget(KEYS.running, jid) or b"{}")["worker"] == "w-9"


@pytest.mark.parametrize("first", ["w-1", "w-2"])
def test_a_job_two_workers_popped_after_a_lost_pop_is_claimed_by_one(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None, first: str) -> None:
    """w-1 popped the job on the old primary (a pop the failover lost), w-2 popped it again on
    the promoted replica; both claim it there. Whichever comes first has it; the other is
    refused and touches nothing (its running record, the queue)."""
    jid = outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1")
    queue, popped = _lost_pop(r)  # w-1's pop, lost
    assert r.blpop([queue], 1) == (queue.encode(), jid.encode())  # w-2's, on the promoted replica
    second = {"w-1": "w-2", "w-2": "w-1"}[first]
    workers = {name: make_worker(["tools"], r) for name in ("w-1", "w-2")}
    monkeypatch.setattr(jobs, "_worker_id", first)
    taken = workers[first].take(f"token-{first}", popped, popped_from=queue)
    assert taken and taken[0].id == jid and taken[0].parley_claimed
    held = r.hget(KEYS.running, jid)
    monkeypatch.setattr(jobs, "_worker_id", second)
    assert workers[second].take(f"token-{second}", popped, popped_from=queue) is False
    assert r.hget(KEYS.running, jid) == held and orjson.loads(held or b"{}")["worker"] == first
    assert queue_ids(r, "tools") == [] and r.exists(f"rq:job:{jid}")


def test_a_worker_blocked_in_blpop_runs_the_job_it_popped_once(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """The ordinary path through BLPOP (every queue empty when the worker looked): the pop was
    seen by the server, the claim's LREM finds nothing, and the job runs once."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    worker = make_worker(["tools"], r)
    enqueued: list[str] = []

    def enqueue_later() -> None:
        time.sleep(0.3)
        enqueued.append(outbox_tool_job(r, "add", {"a": 1, "b": 1}, work="call-1"))

    thread = threading.Thread(target=enqueue_later, daemon=True)
    thread.start()
    worker.work(burst=False, max_jobs=1, max_idle_time=10)
    thread.join(5)
    assert [(o.work, o.value) for o in outcomes(r)] == [("call-1", 2)]
    assert queue_ids(r, "tools") == [] and r.hlen(KEYS.running) == 0 and r.hlen(KEYS.inflight) == 0


def test_a_job_no_dispatcher_issued_is_dropped_unrun_and_counted(
        r: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """Issue 31's first attack: a `run_tool` job pushed onto a queue by someone who may write RQ's
    keys (any worker may) ran the real tool. A job with no in-flight record (which dispatchers
    alone write) is dropped at the take: never run, its hash deleted, counted and logged."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    before = metrics.JOBS_REFUSED.labels("not_issued")._value.get()
    payload = {"session": "EVIL-JOB", "work": "call-1", "attempt": 1, "reply_to": RESULTS, "name": "add",
               "arguments": {"a": 1, "b": 1}}
    made_up = Queue("tools", connection=r, serializer=JSONSerializer).enqueue_job(Job.create(
        "parley.workers.jobs.run_tool", args=[payload], id=job_id("EVIL-JOB", "call-1", 1), connection=r,
        serializer=JSONSerializer, result_ttl=0))
    worker = make_worker(["tools"], r)
    assert worker.take("token-1") is False
    assert metrics.JOBS_REFUSED.labels("not_issued")._value.get() == before + 1
    assert not r.exists(made_up.key) and queue_ids(r, "tools") == [] and r.hlen(KEYS.running) == 0
    run_burst(r, "tools")
    assert outcomes(r) == []  # nothing ran, nothing was posted


def test_a_job_changed_after_its_dispatcher_issued_it_is_dropped_and_handed_back_as_lost(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A queued job whose function or arguments were rewritten after the dispatcher issued it
    (its hash no longer matches the digest in its in-flight record) is dropped unrun; its
    in-flight record stays, so the unclaimed-work sweep hands it back as lost."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    before = metrics.JOBS_REFUSED.labels("changed")._value.get()
    jid = enqueue_tool_job(r, "s-w", "call-1", "add", {"a": 1, "b": 1})
    key = rewrite_job(r, jid, arguments={"a": 1000, "b": 1})
    worker = make_worker(["tools"], r)
    assert worker.take("token-1") is False
    assert metrics.JOBS_REFUSED.labels("changed")._value.get() == before + 1
    assert not r.exists(key) and r.hexists(KEYS.inflight, jid) and r.hlen(KEYS.running) == 0
    run_burst(r, "tools")
    assert outcomes(r) == []


def test_a_retried_take_checks_again_what_it_had_claimed(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A take whose reply was lost is called again with its token and gets the job it claimed
    (take_job.lua's last take). Were the job's hash rewritten in between, the retry would hand
    over the rewritten job: it checks the digest again, drops it, and lets go of its running
    record (issue 31's review)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = enqueue_tool_job(r, "s-w", "call-1", "add", {"a": 1, "b": 1})
    worker = make_worker(["tools"], r)
    first = worker.take("token-1")
    assert first and first[0].parley_claimed and r.hexists(KEYS.running, jid)
    key = rewrite_job(r, jid, name="boom")
    before = metrics.JOBS_REFUSED.labels("changed")._value.get()
    assert worker.take("token-1") is False  # the same token: the retry of that take
    assert metrics.JOBS_REFUSED.labels("changed")._value.get() == before + 1
    assert not r.exists(key) and not r.hexists(KEYS.running, jid) and r.hexists(KEYS.inflight, jid)


def test_a_job_issued_by_an_older_dispatcher_without_a_digest_is_dropped_not_run(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, scenarios: None) -> None:
    """A record without a digest (a dispatcher of an earlier version enqueued the job) proves
    nothing of the hash either: the job is dropped as not issued, and its record stays for the
    unclaimed-work sweep (docs/operations.md, upgrading)."""
    monkeypatch.setattr(jobs, "_worker_id", "w-9")
    jid = enqueue_tool_job(r, "s-w", "call-1", "add", {"a": 1, "b": 1})
    record = orjson.loads(r.hget(KEYS.inflight, jid) or b"{}")
    r.hset(KEYS.inflight, jid, orjson.dumps({k: v for k, v in record.items() if k != "digest"}))
    assert make_worker(["tools"], r).take("token-1") is False
    assert r.hexists(KEYS.inflight, jid) and outcomes(r) == []


# ---- --idle-block-ms ------------------------------------------------------------------------------


def test_an_idle_worker_blocks_for_its_idle_block_and_then_acts_on_a_stop(r: redis.Redis) -> None:
    """`parley worker --idle-block-ms` (docs/operations.md, "Processes"): each BLPOP of an idle
    worker waits that long, and a stop requested meanwhile ends the wait loop after it."""
    worker = make_worker([KEYS.queue("decide")], r, keys=KEYS, block_s=0.05)
    blocks: list[float] = []
    real_blpop = worker.connection.blpop

    def blpop(keys: Any, timeout: float) -> Any:
        blocks.append(timeout)
        if len(blocks) == 2:
            worker._stop_requested = True  # as SIGTERM's handler does
        return real_blpop(keys, timeout)

    worker.connection.blpop = blpop  # type: ignore[method-assign]
    assert worker.dequeue_job_and_maintain_ttl(timeout=10) is None
    assert blocks == [0.05, 0.05]
    assert make_worker([KEYS.queue("decide")], r, keys=KEYS).block_s == 1.0  # the default


def test_a_stopping_worker_ends_its_command_channel_reader_at_once(r: redis.Redis) -> None:
    """RQ's reader of the worker's command channel waits 60 s per read, and redis-py 8.2's
    `PubSubWorkerThread.stop()` waits for it to end: a SIGTERM'd worker could take a minute to
    exit (past a Kubernetes grace period). The reader has already seen the channel unsubscribed
    here (its next read is a wait for a subscription), the case that held the stop."""
    worker = make_worker(["decide"], r)
    worker.subscribe()
    try:
        worker.pubsub.unsubscribe()
        eventually(lambda: not worker.pubsub.subscribed)  # the reader took the reply
        stopping = threading.Thread(target=worker.pubsub_thread.stop, daemon=True)
        stopping.start()
        stopping.join(timeout=10)
        assert not stopping.is_alive() and not worker.pubsub_thread.is_alive()
    finally:
        worker.pubsub.close()
