"""RQ job functions: run decide, the model or a tool, and post the outcome.

They never write session state (an LLM job reads the bodies of the messages it names, which
are never changed once written): the outcome goes to the results stream named in the
payload, where the dispatcher applies it (or drops it, when it is late or voided).
"""

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, get_current_job
from rq.timeouts import JobTimeoutException

from parley.runtime import metrics, telemetry
from parley.runtime.logs import kv
from parley.runtime.replicas import ReplicaPolicy, Replicas, ServerId
from parley.runtime.retry import backoff
from parley.schemas.actions import Decision, decision_from_app
from parley.schemas.approvals import call_digest
from parley.schemas.jobs import ALLOWED_FUNCS as ALLOWED_FUNCS  # the worker's allowlist: the one job table
from parley.schemas.jobs import KIND_OF_FUNC
from parley.schemas.keys import Keys
from parley.schemas.llm import InvalidLlmReply, parse_llm_reply
from parley.schemas.results import AppException, WorkOutcome
from parley.schemas.signing import job_outcome_signature
from parley.schemas.tracing import Attribute
from parley.schemas.triggers import Trigger
from parley.schemas.view import public_message
from parley.workers import app_errors, asking, awaiting
from parley.workers.app import App
from parley.workers.llm.limits import TimeLimit, time_limit

# the dispatcher's replica confirmation, shared rather than copied (one rule, one probe write)
from parley.workers.scripts import LUA
from parley.workers.stopping import CallVoided, Watched, void_watch
from parley.workers.streaming import DeltaSink, Write, redis_writer, streaming

log = logging.getLogger("parley.worker")

_app: App | None = None
# set by `parley worker`: the id under which this process heartbeats, so a dispatcher can tell
# when the worker running a job has died
_worker_id: str | None = None
# set by `parley worker --replica-acks K`: how many replicas must hold a posted outcome
_replicas = ReplicaPolicy()
# set by ParleyWorker (`parley worker --prefix`): the key layout of the deployment whose queues
# it serves; a job's reply_to must be one of its results streams, and its records are under it
_keys = Keys()


def set_worker_id(worker_id: str | None) -> None:
    global _worker_id
    _worker_id = worker_id


def set_replica_policy(policy: ReplicaPolicy) -> None:
    global _replicas
    _replicas = policy


def set_keys(keys: Keys) -> None:
    global _keys
    _keys = keys


def worker_id() -> str | None:
    return _worker_id


def _claimed_by_worker(job: Any) -> bool:
    """True when ParleyWorker's lean path recorded the job as running when it took it."""
    return bool(getattr(job, "parley_claimed", False))


def _claim(payload: dict[str, Any], kind: str) -> None:
    """Record the job as running on this worker (cleared in the same MULTI that posts its outcome)."""
    if _worker_id is None:
        return
    job = get_current_job()
    assert job is not None
    if _claimed_by_worker(job):
        return
    record = orjson.dumps({
        "worker": _worker_id, "session": payload["session"], "work": payload["work"],
        "attempt": payload["attempt"], "kind": kind, "reply_to": payload["reply_to"]})
    through_outages(lambda: job.connection.hset(_keys.running, job.id, record), "record a running job")


OUTAGE_PATIENCE_S = 120


def through_outages(action: Callable[[], Any], what: str) -> None:
    """Retry `action` while Redis is unreachable (restarting, loading its AOF), with backoff."""
    deadline = time.monotonic() + OUTAGE_PATIENCE_S
    failures = 0
    while True:
        try:
            action()
            return
        except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
            if time.monotonic() > deadline:
                raise
            delay = backoff(failures, base=0.1, cap=5.0, jitter=True)
            failures += 1
            log.warning(f"redis unavailable; retrying to {what}", extra=kv(error=repr(exc), backoff_s=delay))
            time.sleep(delay)


def replicas_enabled() -> bool:
    return _replicas.enabled


def confirm_take(connection: Any, took_on: ServerId) -> None:
    """`--replica-acks K`: return once K replicas hold this worker's take of a job, made on the
    server `took_on` (the run_id and master_replid in the take's reply); raise otherwise. The
    replication stream is ordered: a replica that holds the take holds the commit that enqueued
    the job too, so a failover cannot replay that commit and run the job twice.

    Asked once, never retried through an outage: a WAIT that comes after a reconnect may be
    answered by a promoted replica, where it proves nothing about a take made on the old
    primary (issue 29). The WAIT's pipeline names the server that answered it, which must be
    the take's, in the same replication history (parley.runtime.replicas, `take_confirmed`);
    the caller gives the job back otherwise."""
    if not _replicas.enabled:  # the default: nothing on a job's hot path
        return
    Replicas(connection, _keys, _replicas, on_behind="the job taken is given back, not run",
             log=log).confirm_take(took_on)


_agents: dict[str, App] = {}


def set_app(app: App, agents: dict[str, App] | None = None) -> None:
    global _app, _agents
    _app = app
    _agents = dict(agents or {})


def current_app(spec: str | None = None) -> App:
    """The app of a job's session: the worker's own, or one of its sub-agents' apps."""
    if _app is None:
        raise RuntimeError("no app loaded in this worker (start it with `parley worker --app ...`)")
    if spec is None:
        return _app
    if spec not in _agents:
        raise ValueError(f"app {spec!r} is not a sub-agent of this worker's app")
    return _agents[spec]


def _check_reply_to(payload: dict[str, Any]) -> None:
    reply_to = payload.get("reply_to")
    if not isinstance(reply_to, str) or not _keys.is_results_stream(reply_to):
        raise ValueError(f"refusing a job whose reply_to {reply_to!r} is not a results stream of "
                         f"prefix {_keys.prefix!r} (`{_keys.results()}` or `{_keys.results()}:<n>`)")


@dataclass(frozen=True, slots=True)
class Finish:
    """What a job on the lean path leaves for its worker instead of posting it: the worker posts
    the outcome, deletes the job's records and takes its next job in one round trip
    (workers/lua/take_job.lua, docs/design.md)."""

    reply_to: str  # the results stream; '' = no outcome to post (the floor's no-op, bench/noop.py)
    outcome: str  # the WorkOutcome's JSON
    done: Callable[[], None] | None = None  # its metrics and log line, once posted
    #: the outcome signed with the job's token ('' = none): what makes a dispatcher apply it
    sig: str = ""


def _defers(job: Any) -> bool:
    """True when the worker posts this job's outcome with its next take: a job it took on the lean
    path, which asked for it (ParleyWorker.execute_job). Not with `--replica-acks`: a post there
    is confirmed (and posted again) on its own, before the worker takes anything else."""
    return _claimed_by_worker(job) and bool(getattr(job, "parley_defer", False)) and not _replicas.enabled


_FINISH_JOB = LUA.source("finish_job")


def _finish_job(job: Any, reply_to: str, outcome: str) -> None:
    """finish_job.lua: post `outcome` to `reply_to` ('' = none), signed with the job's token,
    and delete the job's records, unless they belong to a job enqueued again under its id since
    its take (finish_lib.lua)."""
    script = job.connection.register_script(_FINISH_JOB)
    script(keys=[job.key], args=[job.id, reply_to, outcome, _keys.running, _keys.inflight,
                                 _keys.inflight_order(job.origin),
                                 # the lean path skips RQ's cleanup, which would delete the
                                 # finished job (result_ttl 0)
                                 "1" if _claimed_by_worker(job) else "0",
                                 getattr(job, "parley_record", None) or "", outcome_sig(job, outcome)])


def outcome_sig(job: Any, outcome: str) -> str:
    """The job's outcome signed with the token its take read ('' without one: a dispatcher then
    refuses it, docs/protocol.md, "Who may post an outcome")."""
    token = getattr(job, "parley_job_token", "")
    return job_outcome_signature(token, outcome.encode()) if token else ""


def unrun_outcome(job: Any) -> Finish:
    """What a worker that gives back a job it took and did not run posts (give_back.lua): the
    job's `unrun` outcome, signed with its token, so that a dispatcher issues it again. A job
    whose payload names no results stream of ours (the floor's no-op) posts nothing."""
    kind = KIND_OF_FUNC.get(getattr(job, "func_name", "") or "")
    payload = job.args[0] if kind is not None and job.args and isinstance(job.args[0], dict) else {}
    reply_to = payload.get("reply_to")
    if kind is None or not isinstance(reply_to, str) or not _keys.is_results_stream(reply_to):
        return Finish("", "")
    try:
        outcome = WorkOutcome(session=payload["session"], work=payload["work"], attempt=payload["attempt"],
                              kind=kind, ok=False, error="given_back", lost=True, unrun=True)
    except (KeyError, ValidationError):
        return Finish("", "")
    posted = outcome.model_dump_json()
    return Finish(reply_to, posted, None, outcome_sig(job, posted))


def _post(payload: dict[str, Any], kind: str, ok: bool, value: Any = None, error: str | None = None,
          started: float | None = None, lost: bool = False, exception: AppException | None = None,
          interrupt: dict[str, Any] | None = None, trace: str | None = None) -> None:
    reply_to = payload["reply_to"]
    outcome = WorkOutcome(session=payload["session"], work=payload["work"], attempt=payload["attempt"],
                          kind=kind, ok=ok, value=value, error=error, lost=lost, exception=exception,
                          interrupt=interrupt, trace=trace)
    job = get_current_job()
    assert job is not None

    def done() -> None:
        seconds = time.monotonic() - (started or time.monotonic())
        metrics.timed(kind)(seconds, "asked" if interrupt is not None else "ok" if ok else "error")
        if log.isEnabledFor(logging.INFO):
            log.info("job done", extra=kv(kind=kind, session=payload["session"], work=payload["work"],
                                          attempt=payload["attempt"], ok=ok, asked=interrupt is not None,
                                          ms=round(seconds * 1000, 1)))

    if _defers(job):
        posted = outcome.model_dump_json()
        job.parley_finish = Finish(reply_to, posted, done, outcome_sig(job, posted))  # type: ignore[attr-defined]
        return

    def post() -> None:
        _finish_job(job, reply_to, outcome.model_dump_json())
        # --replica-acks K: the outcome counts as posted once K replicas hold it. Lost in a
        # failover, the promoted replica would still hold this job's running record, of a live
        # worker: neither the lost-work nor the unclaimed sweep would fire, and the session
        # would wait for good. Short (ReplicasBehind, a ConnectionError): posted again below.
        if _replicas.enabled:
            Replicas(job.connection, _keys, _replicas,
                     on_behind="the outcome is posted again until they hold it", log=log).confirm()

    # An outcome is the only trace of work done: ride out a Redis restart (or a failover)
    # rather than lose it. Posting twice is harmless: the dispatcher drops an outcome of work
    # no longer running, or of another attempt, as already settled (dispatcher/core/outcomes.py,
    # `_running`: DropReason.ALREADY_SETTLED / STALE_ATTEMPT; `_decide`: STALE_DECISION).
    through_outages(post, "post an outcome")
    done()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, JobTimeoutException):
        return "timeout"
    return f"{type(exc).__name__}: {exc}"


class JobFailure(Exception):
    """A failure whose message is the error to report as is (no exception-type prefix)."""


class InputsLost(JobFailure):
    """What the job reads is not there (an LLM job's messages): posted as lost work, which the
    dispatcher retries, never as the call's failure. The job was enqueued by a commit that wrote
    its inputs first; missing, they were lost with that commit (a failover), whose replay
    writes them again, or the session is gone, when nobody applies the outcome anyway."""


@dataclass(frozen=True, slots=True)
class Ran:
    """What running a job's body came to: the fields of its outcome, before it is posted."""

    ok: bool
    value: Any = None
    error: str | None = None
    lost: bool = False
    exception: AppException | None = None
    #: a tool's question (parley.interrupt(), workers/asking.py), posted instead of a result
    interrupt: dict[str, Any] | None = None


def ran(payload: dict[str, Any], kind: str, body: Callable[[], Any]) -> Ran:
    """Run a job's body and say what it came to. Redis-free: `parley.testing` runs an app's
    jobs in-process through here, as a worker does."""
    try:
        value = body()
    except InputsLost as exc:
        return Ran(False, error=str(exc), lost=True)
    except JobFailure as exc:
        return Ran(False, error=str(exc))
    except JobTimeoutException:
        return Ran(False, error="timeout")
    except asking.ToolAsked as asked:
        # the tool's question, in place of its result: the branch parks until it is answered
        return Ran(False, error="asked", interrupt=asked.question)
    except Exception as exc:
        # the app's own code raised: its author needs the traceback (ERROR, in the worker's
        # log) and the app's frames with the outcome (the event, `parley show`)
        failure = app_errors.describe(exc)
        log.error("app code raised", exc_info=exc, extra=kv(
            kind=kind, session=payload["session"], work=payload["work"], error=app_errors.one_line(failure)))
        return Ran(False, error=_describe(exc), exception=failure)
    return Ran(True, value=value)


def _run(payload: dict[str, Any], kind: str, body: Callable[[App], Any]) -> None:
    """Claim the job, run `body` with the session's app, post exactly one outcome (in a span
    of the turn's trace, when the worker traces and the job carries one: docs/tracing.md)."""
    started = time.monotonic()
    _check_reply_to(payload)
    _claim(payload, kind)
    trace = payload.get("trace") if telemetry.enabled() else None
    name, attributes = job_span_of(payload, kind) if trace is not None else ("", {})
    with telemetry.job_span(name, trace, attributes) as span:
        result = ran(payload, kind, lambda: body(current_app(payload.get("app"))))
        finished_span(span, kind, result)
    _post(payload, kind, result.ok, value=result.value, error=result.error, started=started, lost=result.lost,
          exception=result.exception, interrupt=result.interrupt, trace=span.traceparent)


def job_span_of(payload: dict[str, Any], kind: str) -> tuple[str, dict[str, Attribute]]:
    """A job's span name and attributes: the GenAI conventions' where they have one (a model
    call is `chat <model>`, a tool call `execute_tool <name>`), Parley's own otherwise."""
    attributes: dict[str, Attribute] = {"parley.session": payload["session"], "parley.work": payload["work"],
                                        "parley.attempt": payload["attempt"]}
    if kind == "llm":
        request = payload.get("request") or {}
        model = request.get("model") or _model_of(payload)
        attributes["gen_ai.operation.name"] = "chat"
        if isinstance(model, str):
            attributes["gen_ai.request.model"] = model
        return (f"chat {model}" if isinstance(model, str) else "chat"), attributes
    if kind == "tool":
        attributes.update({"gen_ai.operation.name": "execute_tool",
                           "gen_ai.tool.name": str(payload.get("name")),
                           "gen_ai.tool.call.id": payload["work"]})
        return f"execute_tool {payload.get('name')}", attributes
    trigger = payload.get("trigger") or {}
    attributes["parley.trigger.type"] = str(trigger.get("type"))
    return "parley.decide", attributes


def _model_of(payload: dict[str, Any]) -> str | None:
    """The model the session's app calls, when its `llm` says (OpenAICompatible's `model`)."""
    try:
        model = getattr(current_app(payload.get("app")).llm, "model", None)
    except (RuntimeError, ValueError):  # no such app: the job's own run reports it
        return None
    return model if isinstance(model, str) else None


def finished_span(span: telemetry.JobSpan, kind: str, result: "Ran") -> None:
    """What the job came to, on its span: the error, a tool's question, a model's tokens."""
    span.set("parley.job.ok", result.ok)
    span.set("error.type", None if result.ok or result.interrupt is not None else (
        result.exception.type if result.exception is not None else result.error))
    span.set("parley.job.asked", result.interrupt is not None or None)
    if kind == "llm" and result.ok and isinstance(result.value, dict):
        usage = result.value.get("usage") or {}
        span.set("gen_ai.usage.input_tokens", usage.get("input_tokens"))
        span.set("gen_ai.usage.output_tokens", usage.get("output_tokens"))
        span.set("parley.usage.tokens", usage.get("tokens"))


def decision_of(app: App, payload: dict[str, Any]) -> dict[str, Any]:
    """A decide job's body: the app's decision about the payload's trigger, as the wire holds it."""
    trigger = Trigger.model_validate(payload["trigger"])
    proposed = Decision.model_validate(payload["proposed"])
    returned = awaiting.resolved(app.decide(trigger, proposed)) if app.decide else proposed
    try:
        return decision_from_app(returned).to_wire()
    except (ValidationError, ValueError) as exc:
        raise JobFailure(f"invalid decision: {exc}") from None


def run_decide(payload: dict[str, Any]) -> None:
    _run(payload, "decide", lambda app: decision_of(app, payload))


def check_response(response: Any) -> dict[str, Any]:
    """The app's reply in the shape the engine records (parley.schemas.llm), checked here so
    that an app's mistake fails its own job, with the same error the dispatcher would give."""
    try:
        return parse_llm_reply(response).to_wire()
    except InvalidLlmReply as exc:
        raise JobFailure(str(exc)) from None


# Of a model job's time limit, what is kept for posting the outcome once the model call gave up.
POST_RESERVE_S = 1.0


def _model_time_limit(started: float) -> TimeLimit:
    """The job's time limit (the dispatcher's `--llm-timeout`, RQ's death penalty), less a moment
    to post the outcome: an adapter's retries end inside it with the adapter's own error."""
    job = get_current_job()
    seconds = float((job.timeout if job is not None else None) or Queue.DEFAULT_TIMEOUT)
    return TimeLimit(seconds, started + seconds - min(POST_RESERVE_S, seconds / 10))


def run_llm(payload: dict[str, Any]) -> None:
    started = time.monotonic()

    def call(app: App) -> Any:
        request = llm_request(payload)
        with time_limit(_model_time_limit(started)), _stopped_if_voided(), streaming(_delta_sink(payload)):
            return reply_of(app, request)

    try:
        _run(payload, "llm", call)
    except CallVoided:
        _stopped(payload, "llm", started)


def _delta_sink(payload: dict[str, Any]) -> DeltaSink:
    """Where the call's streamed pieces go: the session's deltas stream, on the connection the
    job came from (the session's shard), capped and expiring (schemas/deltas.py)."""
    job = get_current_job()
    write: Write = (lambda _batch: None) if job is None else redis_writer(job.connection,
                                                                          _keys.deltas(payload["session"]))
    return DeltaSink(call_id=payload["work"], attempt=int(payload["attempt"]), write=write)


def reply_of(app: App, request: dict[str, Any]) -> dict[str, Any]:
    """A model job's body: the app's `llm` asked `request` (the branch's messages, the call's
    `model` and `params`), with the app's tools and instructions, its reply checked."""
    if app.llm is None:
        raise JobFailure("the app has no `llm`")
    extra = {"instructions": app.instructions} if app.instructions else {}
    return check_response(awaiting.resolved(app.llm({**request, "tools": app.tool_schemas(), **extra})))


def llm_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The app's `llm` request of an LLM job: the branch's messages, root first, then the call's
    `model` and `params`. The job names the messages (`chain`); their bodies are read here, with
    one HMGET of the session's messages hash on the connection the job came from (the session's
    shard). Messages are never changed once written, and the commit that made the job wrote
    them first, so this is the branch as the transition saw it (docs/design.md, "Storage").
    A job without `chain` (enqueued before jobs named their messages) carries them whole."""
    if "chain" not in payload:
        return dict(payload["request"])
    chain: list[str] = payload["chain"]
    job = get_current_job()
    if job is None:
        raise JobFailure("an LLM job runs as an RQ job (it reads its messages on the job's connection)")
    read: list[Any] = []

    def hmget() -> None:
        read[:] = job.connection.hmget(_keys.messages(payload["session"]), chain) if chain else []

    through_outages(hmget, "read the branch's messages")
    if any(body is None for body in read):
        # a session deleted meanwhile (expired, retired: nobody applies the outcome), or the
        # commit that wrote them lost in a failover: lost work, retried (InputsLost)
        raise InputsLost("the branch's messages are gone")
    messages = [public_message(orjson.loads(body)) for body in read]
    return {"messages": messages, **payload["request"]}


def _stopped_if_voided() -> AbstractContextManager[None]:
    """A job taken on the lean path had an in-flight record when it was taken; the dispatcher's
    cancel deletes it when a park voids the call, and the call is then stopped (workers/stopping.py).
    Other jobs (enqueued by hand, RQ's path) have no record to watch and run to their end."""
    job = get_current_job()
    if job is None or not _claimed_by_worker(job):
        return nullcontext()
    return void_watch.watching(Watched(job.connection, _keys.inflight, job.id))


def _stopped(payload: dict[str, Any], kind: str, started: float) -> None:
    """A voided job was stopped: nobody waits for its outcome (the dispatcher settled the work as
    voided, or posted its loss), so none is posted; its records and job hash go, as with one."""
    job = get_current_job()
    assert job is not None

    def clear() -> None:
        _finish_job(job, "", "")

    through_outages(clear, "clear the records of a stopped job")
    seconds = time.monotonic() - started
    metrics.JOB_SECONDS.labels(kind).observe(seconds)
    metrics.JOBS.labels(kind, "stopped").inc()
    log.info("job stopped: its work was voided", extra=kv(
        kind=kind, session=payload["session"], work=payload["work"], attempt=payload["attempt"],
        ms=round(seconds * 1000, 1)))


def tool_result_of(app: App, payload: dict[str, Any]) -> Any:
    """A tool job's body: the tool run with the call's arguments (and the answers to its own
    questions so far), its result checked to be JSON."""
    fn = app.tools.get(payload["name"])
    if fn is None:
        raise JobFailure("unknown_tool")
    if getattr(fn, "needs_approval", None) not in (None, False) \
            and payload.get("approval") != call_digest(payload["name"], payload["arguments"]):
        # The dispatcher sends a gated call only once approved, with its digest: a job
        # without it came from a dispatcher whose app does not gate this tool (an older
        # app, another module). The workers' app says it needs approval: it does not run.
        raise JobFailure("not_approved")
    # the answers to the questions this call asked before (parley.interrupt(), workers/asking.py)
    with asking.answering(payload.get("answers") or []):
        result = awaiting.resolved(fn(**payload["arguments"]))
    orjson.dumps(result)  # a result the transcript cannot hold is a tool error, here
    return result


def run_tool(payload: dict[str, Any]) -> None:
    _run(payload, "tool", lambda app: tool_result_of(app, payload))
