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
from parley.web.live import Change, ChangeKind, FeedHub, event_stream
from parley.web.observe import ANSWERS, LIVE_PAGES, SIGNINS, metrics_body, observed, secured
from parley.web.present import AnswerResult, AnswerStatus
from parley.web.query import ListQuery, QueryError
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

    def principal(self, request: Request) -> str | None:
        """The signed-in principal: None without a session, or when the users file no longer
        lists it (removing a person signs them out)."""
        principal = request.session.get("principal")
        if isinstance(principal, str) and principal in self.users.current().credentials:
            return principal
        return None

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
    )

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        context = {"principal": inbox.principal(request), "csrf": csrf_token(request),
                   "now_ms": now_ms(), **context}
        return templates.TemplateResponse(request, name, context, status_code=status)

    Handler = Callable[[Request, str], Awaitable[Response]]

    def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def gate(request: Request) -> Response:
            principal = inbox.principal(request)
            if principal is None:
                if request.method != "GET" or request.url.path == "/events":
                    return PlainTextResponse("sign in first", status_code=401)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/signin?{_query(next=target)}", status_code=303)
            return await handler(request, principal)
        return gate

    def render_row(row: OpenInterrupt, principal: str) -> str:
        return templates.get_template("_row.html").render(
            row=row, may_answer=inbox.may_answer(principal, row), now_ms=now_ms(),
            duration=present.duration)

    async def raised_row(change: Change) -> OpenInterrupt | None:
        """The row of an interrupt the feed says was raised. The index is written by the
        commit's outbox flush, just after the feed entry: a row not there yet is asked again
        for a moment (and one resumed meanwhile stays None)."""
        for delay in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8):
            await asyncio.sleep(delay)
            row = await inbox.client.open_interrupt(change.session, change.interrupt_id)
            if row is not None:
                return row
        return None

    # ---- sign-in ----------------------------------------------------------------------------

    async def signin_page(request: Request) -> Response:
        return page(request, "signin.html", {"next": local_path(request.query_params.get("next")),
                                             "error": None})

    async def signin(request: Request) -> Response:
        form = await read_form(request)
        if form is None:
            return PlainTextResponse("the form is too big", status_code=413)
        if not csrf.matches(request.session.get("csrf"), _text(form.get(csrf.FIELD))):
            SIGNINS.labels("csrf").inc()
            return PlainTextResponse("the form is stale or forged (CSRF): reload the page", status_code=403)
        principal, secret = _text(form.get("principal")), _text(form.get("secret"))
        target = local_path(_text(form.get("next")))
        # scrypt costs tens of milliseconds: off the event loop, so one sign-in stalls no page
        ok = bool(principal and secret) and await asyncio.to_thread(
            inbox.users.current().check, principal or "", secret or "")
        if not ok:
            SIGNINS.labels("refused").inc()
            log.info("sign-in refused", extra=kv(principal=(principal or "")[:64]))
            return page(request, "signin.html", {"next": target, "error": "Unknown name or wrong password."},
                        status=401)
        SIGNINS.labels("ok").inc()
        request.session.clear()  # a new session: nothing of the anonymous one carries over
        request.session.update({"principal": principal, "csrf": csrf.new_token()})
        return RedirectResponse(target, status_code=303)

    async def signout(request: Request) -> Response:
        form = await read_form(request)
        if form is None or not csrf.matches(request.session.get("csrf"), _text(form.get(csrf.FIELD))):
            return PlainTextResponse("the form is stale or forged (CSRF): reload the page", status_code=403)
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
        where = query.interrupt_filter(principal)

        async def render(change: Change) -> str | None:
            if change.kind is not ChangeKind.RAISED:
                return None
            row = await raised_row(change)
            if row is None or not where.matches(row):
                return None
            return render_row(row, principal)

        async def body() -> AsyncIterator[str]:
            with LIVE_PAGES.track_inprogress():
                async for frame in event_stream(inbox.hub.subscribe(), render, request.is_disconnected):
                    yield frame

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # ---- one interrupt ------------------------------------------------------------------------

    async def interrupt_view(request: Request, principal: str, session: str, interrupt_id: str,
                             result: AnswerResult | None = None, values: dict[str, Any] | None = None,
                             errors: dict[str, str] | None = None, status: int = 200) -> Response:
        row = await inbox.client.open_interrupt(session, interrupt_id)
        view = await inbox.client.show(session)
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
        form = await read_form(request)
        if form is None:
            return PlainTextResponse("the form is too big", status_code=413)
        if not csrf.matches(request.session.get("csrf"), _text(form.get(csrf.FIELD))):
            ANSWERS.labels("csrf").inc()
            return PlainTextResponse("the form is stale or forged (CSRF): reload the page", status_code=403)
        session, interrupt_id = _text(form.get("session")), _text(form.get("interrupt_id"))
        if not session or not interrupt_id:
            return PlainTextResponse("the form names no interrupt", status_code=400)
        values: dict[str, Any] = {}
        row = await inbox.client.open_interrupt(session, interrupt_id)
        if row is None:
            return await _answered(request, principal, session, interrupt_id, present.no_longer_open())
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
            read = read_answer(row.response_schema, items)
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

    # ---- operations ---------------------------------------------------------------------------

    async def healthz(request: Request) -> Response:
        states = await asyncio.gather(*(_ping(r) for r in shards))
        ok = all(states)
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "shards": ["ok" if s else "unavailable" for s in states]},
                            status_code=200 if ok else 503)

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
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    secret = config.session_secret or secrets.token_urlsafe(32)
    middleware = [
        Middleware(observed),
        Middleware(secured),
        Middleware(SessionMiddleware, secret_key=secret, session_cookie=COOKIE,
                   max_age=config.session_max_age_s, same_site="lax", https_only=config.secure_cookies),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.inbox = inbox
    return app


async def _ping(r: Redis) -> bool:
    try:
        return bool(await asyncio.wait_for(r.ping(), timeout=2.0))
    except (TimeoutError, RedisError, OSError):
        return False


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _query(**params: str) -> str:
    return urlencode(params)

