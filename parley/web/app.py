"""The inbox's web application: Starlette routes around the pure parts of parley/web/.

Every page but sign-in needs a signed-in principal (a signed session cookie). Reads go through
`AsyncClient` (every shard, merged); an answer is a signed `interrupt.resume` sent as the
signed-in principal with the first of its keys in the keys file, and the page waits for the
engine's word on it. The users file and the keys file are read again when they change on disk,
so adding a person or rotating a key needs no restart.
"""

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from parley.aclient import AsyncClient
from parley.inbox import OpenInterrupt
from parley.logs import kv
from parley.producer import InvalidInput, SubmitRefused, SubmitUnavailable
from parley.schemas.keys import Keys
from parley.schemas.signing import Keyring
from parley.shards import connect_async
from parley.web import csrf, present
from parley.web.config import InboxConfig
from parley.web.conversation import path_to, pretty_json
from parley.web.files import Reloading
from parley.web.forms import APPROVE, DECLINE, answer_form, field_of_path, read_answer
from parley.web.live import Change, ChangeKind, FeedHub, event_stream, shown_by, since_of
from parley.web.observe import ANSWERS, LIVE_PAGES, SIGNINS, edge, metrics_body
from parley.web.present import AnswerResult, AnswerStatus
from parley.web.query import ListQuery, QueryError
from parley.web.signins import SignIns
from parley.web.throttle import Throttle
from parley.web.users import Users

log = logging.getLogger("parley.inbox")

HERE = Path(__file__).parent
COOKIE = "parley_inbox"
#: a form posted to the page is at most this big (a typed answer is at most 16 KiB as JSON)
MAX_FORM_BYTES = 256 * 1024
MAX_FORM_FIELDS = 2_000


@dataclass
class Inbox:
    """What the routes share, built at start-up."""

    config: InboxConfig
    client: AsyncClient
    users: Reloading[Users]
    keys: Reloading[Keyring]
    hub: FeedHub
    templates: Jinja2Templates
    signins: SignIns
    throttle: Throttle

    async def principal(self, request: Request) -> str | None:
        """The signed-in principal: None without a sign-in, or when its record is gone (signed
        out, expired), or the users file no longer has the credential it signed in with (a
        new password, a removal)."""
        principal, sid = request.session.get("principal"), request.session.get("sid")
        if not isinstance(principal, str) or not isinstance(sid, str):
            return None
        signin = await self.signins.find(sid)
        if signin is None or not signin.holds(principal, self.users.current().credentials):
            return None
        return principal

    def signing_key(self, principal: str) -> str | None:
        listed = self.keys.current().secrets_of(principal)
        return listed[0] if listed else None

    def may_answer(self, principal: str, row: OpenInterrupt) -> bool:
        """`resumable_by` allows the principal (null: anyone), and the page can sign as it."""
        return ((row.resumable_by is None or principal in row.resumable_by)
                and self.signing_key(principal) is not None)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use (the sign-in form has one too)."""
    token = request.session.get("csrf")
    if not isinstance(token, str) or not token:
        token = csrf.new_token()
        request.session["csrf"] = token
    return token


def now_ms() -> int:
    return int(time.time() * 1000)


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (never `//host` or a URL)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def read_form(request: Request) -> FormData | None:
    """The posted form, or None when it is too big (the caller answers 413)."""
    length = request.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
        return None
    return await request.form(max_files=0, max_fields=MAX_FORM_FIELDS)


async def checked_form(request: Request, refusals: Counter | None = None) -> FormData | Response:
    """The posted form, or the response refusing it: 413 when too big, 403 (counted in
    `refusals` as `csrf`) when its CSRF token is not the session's. Nothing else happens first."""
    form = await read_form(request)
    if form is None:
        return PlainTextResponse("the form is too big", status_code=413)
    if not csrf.matches(request.session.get("csrf"), _text(form.get(csrf.FIELD))):
        if refusals is not None:
            refusals.labels("csrf").inc()
        return PlainTextResponse("the form is stale or forged (CSRF): reload the page", status_code=403)
    return form


def create_app(config: InboxConfig, clients: list[Redis] | None = None) -> Starlette:
    """The inbox application. `clients`: the shards' asyncio clients (default: one per URL of
    `config.redis_urls`)."""
    shards = clients if clients is not None else [connect_async(u) for u in config.redis_urls]
    keys = Keys(config.prefix)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["duration"] = present.duration
    inbox = Inbox(
        config=config,
        client=AsyncClient(shards, config.prefix, config.producer),
        users=Reloading(config.users_file, Users.load, "users file"),
        keys=Reloading(config.keys_file, lambda p: Keyring.load(p), "keys file") if config.keys_file
        else Reloading.fixed(Keyring({})),
        hub=FeedHub(shards, keys),
        templates=templates,
        signins=SignIns(shards[0], keys, config.session_max_age_s),
        throttle=Throttle(),
    )

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        context = {"principal": getattr(request.state, "principal", None), "csrf": csrf_token(request),
                   "now_ms": now_ms(), **context}
        return templates.TemplateResponse(request, name, context, status_code=status)

    Handler = Callable[[Request, str], Awaitable[Response]]

    def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def gate(request: Request) -> Response:
            principal = request.state.principal = await inbox.principal(request)
            if principal is None:
                if request.method != "GET" or request.url.path == "/events":
                    return PlainTextResponse("sign in first", status_code=401)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/signin?{_query(next=target)}", status_code=303)
            return await handler(request, principal)
        return gate

    async def signed_in_now(request: Request) -> bool:
        """Whether the request's sign-in still holds (for a long-lived response: an event
        stream ends when its person signs out or is removed)."""
        return await inbox.principal(request) is not None

    def render_row(row: OpenInterrupt, principal: str) -> str:
        return templates.get_template("_row.html").render(
            row=row, may_answer=inbox.may_answer(principal, row), now_ms=now_ms(),
            duration=present.duration)

    async def raised_row(change: Change) -> OpenInterrupt | None:
        """The row of an interrupt the feed says was raised, looked up once for every page of
        this process (live.RowCache: the index follows the feed entry by the outbox flush, so a
        row not there yet is asked again for a moment; one resumed meanwhile stays None)."""
        row: OpenInterrupt | None = await inbox.hub.rows.get(
            change.session, change.interrupt_id, inbox.client.open_interrupt)
        return row

    # ---- sign-in ----------------------------------------------------------------------------

    async def signin_page(request: Request) -> Response:
        return page(request, "signin.html", {"next": local_path(request.query_params.get("next")),
                                             "error": None})

    async def signin(request: Request) -> Response:
        form = await checked_form(request, SIGNINS)
        if isinstance(form, Response):
            return form
        principal, secret = _text(form.get("principal")) or "", _text(form.get("secret")) or ""
        target = local_path(_text(form.get("next")))
        address = request.client.host if request.client else "?"
        guesses = [f"principal:{principal[:256]}", f"address:{address}"]
        wait_s = inbox.throttle.wait_s(guesses, time.monotonic())
        if wait_s > 0:
            SIGNINS.labels("throttled").inc()
            return page(request, "signin.html", {"next": target, "error": "Too many failed sign-ins: try "
                                                 f"again in {present.duration(int(wait_s * 1000) + 999)}."},
                        status=429)
        users = inbox.users.current()
        # scrypt costs tens of milliseconds: off the event loop, so one sign-in stalls no page
        ok = bool(principal and secret) and await asyncio.to_thread(users.check, principal, secret)
        if not ok:
            inbox.throttle.failed(guesses, time.monotonic())
            SIGNINS.labels("refused").inc()
            log.info("sign-in refused", extra=kv(principal=principal[:64]))
            return page(request, "signin.html", {"next": target, "error": "Unknown name or wrong password."},
                        status=401)
        inbox.throttle.succeeded(guesses[0])
        sid = await inbox.signins.start(principal, users.credentials[principal])
        SIGNINS.labels("ok").inc()
        request.session.clear()  # a new session: nothing of the anonymous one carries over
        request.session.update({"principal": principal, "sid": sid, "csrf": csrf.new_token()})
        return RedirectResponse(target, status_code=303)

    async def signout(request: Request) -> Response:
        form = await checked_form(request)
        if isinstance(form, Response):
            return form
        sid = request.session.get("sid")
        if isinstance(sid, str):
            await inbox.signins.end(sid)  # for every copy of the cookie, on every replica
        request.session.clear()
        return RedirectResponse("/signin", status_code=303)

    # ---- the list -----------------------------------------------------------------------------

    async def list_page(request: Request, principal: str) -> Response:
        try:
            query = ListQuery.parse(request.query_params)
            result = await inbox.client.interrupt_page(query.interrupt_filter(principal),
                                                       limit=config.page_size, cursor=query.cursor)
        except (QueryError, ValueError) as exc:
            return page(request, "list.html", {"query": ListQuery(), "rows": [], "error": str(exc),
                                               "next_page": None, "may_answer_of": {}}, status=400)
        return page(request, "list.html", {
            "query": query, "rows": result.items, "error": None,
            "next_page": None if result.cursor is None else "/" + query.query_string(result.cursor),
            "may_answer_of": {(r.session, r.interrupt_id): inbox.may_answer(principal, r)
                          for r in result.items},
        })

    async def events(request: Request, principal: str) -> Response:
        try:
            query = ListQuery.parse(request.query_params)
        except QueryError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        try:
            since = since_of(request.query_params.get("since"))
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        where = query.interrupt_filter(principal)

        async def render(change: Change) -> str | None:
            if change.kind is not ChangeKind.RAISED or not shown_by(where, change):
                return None  # the feed's event tells: no lookup for a row this page drops
            row = await raised_row(change)
            if row is None or not where.matches(row):
                return None
            return render_row(row, principal)

        async def still_signed_in() -> bool:
            # a sign-out, a new password or a removal ends the stream too (within a ping)
            return await signed_in_now(request)

        async def body() -> AsyncIterator[str]:
            with LIVE_PAGES.track_inprogress():
                async for frame in event_stream(inbox.hub.subscribe(since), render, request.is_disconnected,
                                                still_allowed=still_signed_in):
                    yield frame

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # ---- one interrupt ------------------------------------------------------------------------

    async def interrupt_view(request: Request, principal: str, session: str, interrupt_id: str,
                             result: AnswerResult | None = None, values: dict[str, Any] | None = None,
                             errors: dict[str, str] | None = None, status: int = 200) -> Response:
        # the row and the session's messages: two reads of one shard, at once
        row, view = await asyncio.gather(inbox.client.open_interrupt(session, interrupt_id),
                                         inbox.client.show(session))
        tip = (row.anchor if row is not None else None) or (view or {}).get("head")
        conversation = path_to((view or {}).get("messages") or [], tip)
        may = row is not None and inbox.may_answer(principal, row)
        context = {
            "session": session, "interrupt_id": interrupt_id, "row": row, "conversation": conversation,
            "request_json": None if row is None else pretty_json(row.request),
            "may_answer": may, "has_key": inbox.signing_key(principal) is not None,
            "form": None if row is None else answer_form(row.response_schema),
            "values": values or {}, "errors": errors or {}, "result": result,
            "answer_id": secrets.token_urlsafe(12),
        }
        if row is None and result is None and status == 200:
            status = 404
        return page(request, "interrupt.html", context, status=status)

    async def interrupt_page(request: Request, principal: str) -> Response:
        session, interrupt_id = request.query_params.get("session"), request.query_params.get("id")
        if not session or not interrupt_id:
            return PlainTextResponse("name the interrupt: /interrupt?session=S&id=I", status_code=400)
        return await interrupt_view(request, principal, session, interrupt_id)

    async def answer(request: Request, principal: str) -> Response:
        form = await checked_form(request, ANSWERS)
        if isinstance(form, Response):
            return form
        session, interrupt_id = _text(form.get("session")), _text(form.get("interrupt_id"))
        if not session or not interrupt_id:
            return PlainTextResponse("the form names no interrupt", status_code=400)
        values: dict[str, Any] = {}
        row = await inbox.client.open_interrupt(session, interrupt_id)
        if row is None:
            answered = await resumed_event(session, interrupt_id)
            return await _answered(request, principal, session, interrupt_id,
                                   present.no_longer_open(answered, principal))
        if not inbox.may_answer(principal, row):
            ANSWERS.labels("forbidden").inc()
            return await interrupt_view(request, principal, session, interrupt_id, status=403)
        decision = _text(form.get("decision"))
        if row.response_schema is None:
            if decision not in ("approve", "decline"):
                return PlainTextResponse("decision must be approve or decline", status_code=400)
            payload: Any = APPROVE if decision == "approve" else DECLINE
        else:
            items = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
            # off the event loop: an app's `pattern` may backtrack on a hostile value, and that
            # must stall this request only, not every page and event stream of the process
            read = await asyncio.to_thread(read_answer, row.response_schema, items)
            values = read.values
            if not read.ok:
                result = AnswerResult(AnswerStatus.INVALID, "Not sent: the answer does not fit the form.")
                ANSWERS.labels(result.status.value).inc()
                return await interrupt_view(request, principal, session, interrupt_id, result, values,
                                            read.errors, status=422)
            payload = read.value
        key = inbox.signing_key(principal)
        assert key is not None  # may_answer checked it
        answer_id = _text(form.get("answer_id"))
        try:
            outcome = await inbox.client.resume(
                session, interrupt_id, payload, principal=principal, key=key, wait=True,
                timeout_s=config.resume_timeout_s,
                idempotency_key=f"inbox-{answer_id}" if answer_id and answer_id.isascii()
                and 8 <= len(answer_id) <= 64 else None)
        except InvalidInput as exc:
            result = AnswerResult(AnswerStatus.INVALID, "Not sent: the answer is not a valid input.",
                                  str(exc))
        except SubmitRefused as exc:
            result = AnswerResult(AnswerStatus.REFUSED, f"Refused ({exc.code}).", exc.message, exc.code)
        except (SubmitUnavailable, RedisError) as exc:
            log.warning("answer not sent", extra=kv(session=session, error=repr(exc)))
            result = AnswerResult(AnswerStatus.UNAVAILABLE,
                                  "Parley could not be reached: your answer may not have been sent.",
                                  "Reload the page: if the question is still open, answer again.")
        else:
            result = present.answer_result(outcome)
            log.info("answer sent", extra=kv(session=session, interrupt_id=interrupt_id, principal=principal,
                                             outcome=result.status.value, code=result.code))
        where = field_of_path(result.path, answer_form(row.response_schema))
        errors = {where: result.detail or ""} if result.path else {}
        return await _answered(request, principal, session, interrupt_id, result, values, errors)

    async def _answered(request: Request, principal: str, session: str, interrupt_id: str,
                        result: AnswerResult, values: dict[str, Any] | None = None,
                        errors: dict[str, str] | None = None) -> Response:
        ANSWERS.labels(result.status.value).inc()
        status = {AnswerStatus.UNAVAILABLE: 503, AnswerStatus.INVALID: 422}.get(result.status, 200)
        return await interrupt_view(request, principal, session, interrupt_id, result, values, errors, status)

    async def resumed_event(session: str, interrupt_id: str) -> dict[str, Any] | None:
        """The event that ended an interrupt (resumed or cancelled), among the session's latest
        events; None when not found there."""
        shard = await inbox.client.index_of_session(session)
        entries: Any = await shards[shard].xrevrange(keys.events(session), count=500)
        for _id, fields in entries or []:
            event = event_of(fields)
            if (event is not None and event.get("interrupt_id") == interrupt_id
                    and event.get("type") in ("interrupt.resumed", "interrupt.cancelled")):
                return event
        return None

    # ---- operations ---------------------------------------------------------------------------

    async def healthz(request: Request) -> Response:
        states = await asyncio.gather(*(_ping(r) for r in shards))
        ok = all(states)
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "shards": ["ok" if s else "unavailable" for s in states]},
                            status_code=200 if ok else 503)

    async def livez(request: Request) -> Response:
        """The process serves (no Redis asked): for a liveness probe, which must not restart
        every replica while one shard is down."""
        return JSONResponse({"status": "ok"})

    async def unavailable(request: Request, exc: Exception) -> Response:
        log.warning("redis unavailable", extra=kv(path=request.url.path, error=repr(exc)))
        if request.url.path == "/interrupt/answer":
            ANSWERS.labels(AnswerStatus.UNAVAILABLE.value).inc()
        return PlainTextResponse("Parley is unavailable (Redis could not be reached): try again in a moment.",
                                 status_code=503)

    async def metrics(request: Request) -> Response:
        body, content_type = metrics_body()
        return Response(body, media_type=content_type)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(inbox.hub.run(), name="parley-inbox-feed")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for r in shards:
                await r.aclose()

    routes = [
        Route("/", signed_in(list_page)),
        Route("/events", signed_in(events)),
        Route("/interrupt", signed_in(interrupt_page)),
        Route("/interrupt/answer", signed_in(answer), methods=["POST"]),
        Route("/signin", signin_page),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/livez", livez),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    secret = config.session_secret or secrets.token_urlsafe(32)
    middleware = [
        Middleware(edge),
        Middleware(SessionMiddleware, secret_key=secret, session_cookie=COOKIE,
                   max_age=config.session_max_age_s, same_site="lax", https_only=config.secure_cookies),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={RedisError: unavailable, OSError: unavailable})
    app.state.inbox = inbox
    return app


async def _ping(r: Redis) -> bool:
    try:
        return bool(await asyncio.wait_for(r.ping(), timeout=2.0))
    except (TimeoutError, RedisError, OSError):
        return False


def event_of(fields: Any) -> dict[str, Any] | None:
    """The event of a session's events entry (its `event` field holds the JSON)."""
    raw = fields.get(b"event", fields.get("event")) if isinstance(fields, dict) else None
    try:
        event = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _query(**params: str) -> str:
    return urlencode(params)

