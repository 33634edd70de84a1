"""The AG-UI endpoint: one POST per run, answered with AG-UI events over server-sent events.

The shell around the pure parts: it parses the run input (`runs`), checks and sends what the
run asks (a user message, or resumes signed as the endpoint's principal: `interrupts`),
follows the session from the run's cursor (events and token stream in one read), and writes
what `translate` makes of them, until the run ends:

- **success** at the turn's `turn.completed` (a run that only follows: once the session is
  quiet and waits for nobody);
- **interrupt** once the session waits for a person: an interrupt is open, this run's inputs
  have been applied, and nothing new came for `settle_s`. The outcome lists every interrupt
  open in the session;
- **cancelled** when the session was closed;
- **RUN_ERROR** when the run's input was refused (its code and message), or nothing ended
  the run within `run_timeout_s` (the session goes on; the next run follows it).

Before its last event the run sends a STATE_SNAPSHOT holding `parley.cursor`, the id of the
last session event it read: AG-UI clients send their state back with the next run, which then
goes on from there, so what happened between two runs is neither lost nor repeated.
"""

import hmac
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ag_ui.core import (
    BaseEvent,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
)
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from parley.aclient import AsyncClient
from parley.agui.interrupts import agui_interrupt, answers_of
from parley.agui.messages import snapshot_messages
from parley.agui.runs import RunProblem, RunRequest, request_of, state_with
from parley.agui.translate import Ending, Translator
from parley.client.producer import InvalidInput, SubmitRefused, SubmitUnavailable
from parley.runtime.logs import kv
from parley.schemas.deltas import Delta
from parley.schemas.inputs import MessageCreate

log = logging.getLogger("parley.agui")

#: the largest run input read (AG-UI sends the whole conversation with every run)
MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class AguiConfig:
    #: the principal resumes are signed as, and its key (None: unsigned)
    principal: str | None = None
    signing_key: str | None = None
    #: the bearer token a run must carry (None: none asked)
    token: str | None = None
    #: how long the session must stay quiet, with an interrupt open, for the run to end with it
    settle_s: float = 0.2
    #: a run that nothing ends within this long ends with RUN_ERROR `run_timeout`
    run_timeout_s: float = 300.0


def sse(event: BaseEvent) -> str:
    return f"data: {event.model_dump_json(by_alias=True)}\n\n"


def create_app(client: AsyncClient, config: AguiConfig) -> Starlette:
    async def run(request: Request) -> Response:
        if config.token is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), f"Bearer {config.token}".encode()):
            return JSONResponse({"error": "unauthorized", "message": "a run needs the endpoint's bearer "
                                 "token (Authorization: Bearer ...)"}, 401)
        if config.token is None and not is_loopback_host(request.headers.get("host")):
            # without a token only this machine may post; a page that points a name of its own
            # at 127.0.0.1 (DNS rebinding) arrives with that name as its Host
            return JSONResponse({"error": "forbidden_host", "message": "an endpoint without a token "
                                 "takes runs addressed to 127.0.0.1, localhost or [::1] only"}, 403)
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            # a web page can post text/plain anywhere without asking; application/json makes
            # the browser ask first (CORS), and this endpoint allows no other origin
            return JSONResponse({"error": "unsupported_media_type", "message": "a run input is "
                                 "posted as Content-Type: application/json"}, 415)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return JSONResponse({"error": "too_large", "message": f"a run input is at most "
                                     f"{MAX_BODY_BYTES} bytes"}, 413)
        try:
            run_input = RunAgentInput.model_validate_json(bytes(body))
        except ValidationError as exc:
            return JSONResponse({"error": "invalid_run_input", "message": _first_error(exc)}, 422)
        return StreamingResponse(Run(client, config, run_input).events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def healthz(_request: Request) -> Response:
        try:
            await client.redis.ping()
        except RedisError as exc:
            return JSONResponse({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 503)
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/", run, methods=["POST"]), Route("/healthz", healthz)])


def is_loopback_host(host: str | None) -> bool:
    """Whether a request's Host header names this machine's loopback (any port)."""
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.strip("[]").lower() in {"127.0.0.1", "localhost", "::1"}


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "the body"
    return f"not an AG-UI run input: {where}: {error['msg']} ({exc.error_count()} problem(s) in all)"


class Run:
    """One AG-UI run: its events, as `events()` yields them (SSE text)."""

    def __init__(self, client: AsyncClient, config: AguiConfig, run_input: RunAgentInput):
        self.client, self.config, self.input = client, config, run_input

    async def events(self) -> AsyncIterator[str]:
        run = self.input
        yield sse(RunStartedEvent(thread_id=run.thread_id, run_id=run.run_id))
        try:
            request = request_of(run)
            async for event in self._run(request):
                yield sse(event)
        except RunProblem as problem:
            log.info("run refused", extra=kv(thread=run.thread_id, run=run.run_id, code=problem.code))
            yield sse(RunErrorEvent(message=str(problem), code=problem.code))
        except (RedisError, OSError, SubmitUnavailable) as exc:
            log.warning("run failed", extra=kv(thread=run.thread_id, run=run.run_id,
                                               error=f"{type(exc).__name__}: {exc}"))
            yield sse(RunErrorEvent(message=f"Parley is unavailable: {type(exc).__name__}: {exc}",
                                    code="unavailable"))

    async def _run(self, request: RunRequest) -> AsyncIterator[BaseEvent]:
        client, session = self.client, request.session
        cursor = request.cursor or await client.last_event_id(session)
        view = await client.show(session)
        open_now = {row["interrupt_id"] for row in (view or {}).get("interrupts") or []}
        translator = Translator(session, frozenset(await self._send(request)), open_interrupts=open_now)
        deadline = time.monotonic() + self.config.run_timeout_s
        ending: Ending | RunFinishedInterruptOutcome | None = None
        block_ms = max(1, int(self.config.settle_s * 1000))
        async for batch in client.batches(session, after=cursor, block_ms=block_ms, deltas=True):
            for entry_id, item in batch:
                if isinstance(item, Delta):
                    for event in translator.delta(item):
                        yield event
                    continue
                cursor = entry_id
                for event in translator.event(item):
                    yield event
                if translator.ending is not None:
                    break
            ending = translator.ending
            if ending is None and not batch:
                ending = await self._quiet(request, translator)
            if ending is None and time.monotonic() > deadline:
                ending = Ending("error", "run_timeout", "nothing ended the run within "
                                f"{self.config.run_timeout_s:g} s; the session goes on, and the next run "
                                "follows it")
            if ending is not None:
                break
        for event in translator.close():
            yield event
        if translator.needs_snapshot and (view := await client.show(session)) is not None:
            yield MessagesSnapshotEvent(messages=snapshot_messages(view))
        yield StateSnapshotEvent(snapshot=state_with(self.input.state, session, cursor))
        yield self._last(ending)

    async def _send(self, request: RunRequest) -> list[str]:
        """Send what the run asks; the stream entries of what was sent."""
        client, session, config = self.client, request.session, self.config
        principal, key = config.principal, config.signing_key
        try:
            if request.resumes:
                rows = {entry.interrupt_id: await client.open_interrupt(session, entry.interrupt_id)
                        for entry in request.resumes}
                entries = []
                for answer in answers_of(request.resumes, rows, config.principal):
                    entries.append(await client.resume(
                        session, answer.interrupt_id, answer.payload,
                        idempotency_key=f"agui:{self.input.run_id}:{answer.interrupt_id}"[:256],
                        principal=principal, key=key))
                return entries
            if request.message is not None:
                value = MessageCreate(type="message.create", content=request.message.content,
                                      message_id=request.message.message_id)
                return [await client.send(session, value, request.message.idempotency_key, principal, key)]
        except InvalidInput as exc:
            raise RunProblem("invalid_input", str(exc)) from None
        except SubmitRefused as exc:
            raise RunProblem(exc.code, str(exc)) from None
        return []

    async def _quiet(self, request: RunRequest,
                     translator: Translator) -> Ending | RunFinishedInterruptOutcome | None:
        """Nothing new for `settle_s`: the run ends if the session waits for a person (or, for
        a run that only follows, for nobody)."""
        if not translator.applied:
            return None  # the run's own inputs are not applied yet
        follows = request.follows_only or translator.repeated  # nothing new was sent after all
        if not translator.open_interrupts and not follows:
            return None
        view = await self.client.show(request.session)
        open_ids = [row["interrupt_id"] for row in (view or {}).get("interrupts") or []]
        rows = [row for iid in open_ids
                if (row := await self.client.open_interrupt(request.session, iid)) is not None]
        if rows:
            return RunFinishedInterruptOutcome(
                interrupts=[agui_interrupt(row, translator.raised.get(row.interrupt_id)) for row in rows])
        translator.open_interrupts.clear()
        return Ending("success") if follows else None

    def _last(self, ending: Ending | RunFinishedInterruptOutcome | None) -> BaseEvent:
        run = self.input
        if isinstance(ending, RunFinishedInterruptOutcome):
            return RunFinishedEvent(thread_id=run.thread_id, run_id=run.run_id, outcome=ending)
        if ending is None or ending.outcome == "error":
            code = ending.code if ending is not None else "stopped"
            message = ending.message if ending is not None and ending.message else "the run stopped"
            return RunErrorEvent(message=message, code=code)
        outcome = (RunFinishedCancelledOutcome() if ending.outcome == "cancelled"
                   else RunFinishedSuccessOutcome())
        return RunFinishedEvent(thread_id=run.thread_id, run_id=run.run_id, outcome=outcome)
