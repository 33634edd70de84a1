"""What every endpoint uses: rendering a page, the sign-in gate, and reading a posted form
(size-capped, CSRF-checked before anything else happens)."""

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from prometheus_client import Counter
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from parley.web import csrf
from parley.web.state import inbox_of

#: a form posted to the page is at most this big (a typed answer is at most 16 KiB as JSON)
MAX_FORM_BYTES = 256 * 1024
MAX_FORM_FIELDS = 2_000

#: an endpoint behind the sign-in: the request and the signed-in principal
Handler = Callable[[Request, str], Awaitable[Response]]


def now_ms() -> int:
    return int(time.time() * 1000)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use (the sign-in form has one too)."""
    token = request.session.get("csrf")
    if not isinstance(token, str) or not token:
        token = csrf.new_token()
        request.session["csrf"] = token
    return token


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    """Template `name`, given the signed-in principal (if any), the CSRF token and the time."""
    context = {"principal": getattr(request.state, "principal", None), "csrf": csrf_token(request),
               "now_ms": now_ms(), **context}
    return inbox_of(request).templates.TemplateResponse(request, name, context, status_code=status)


def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint `handler` for a signed-in principal only: without one, a GET page goes to
    the sign-in (and back after it), anything else (a POST, the event stream) is a 401."""
    async def gate(request: Request) -> Response:
        principal = request.state.principal = await inbox_of(request).principal(request)
        if principal is None:
            if request.method != "GET" or request.url.path == "/events":
                return PlainTextResponse("sign in first", status_code=401)
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/signin?{urlencode({'next': target})}", status_code=303)
        return await handler(request, principal)
    gate.__name__ = gate.__qualname__ = handler.__name__
    gate.__doc__ = handler.__doc__
    return gate


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
    if not csrf.matches(request.session.get("csrf"), text_of(form.get(csrf.FIELD))):
        if refusals is not None:
            refusals.labels("csrf").inc()
        return PlainTextResponse("the form is stale or forged (CSRF): reload the page", status_code=403)
    return form


def text_of(value: Any) -> str | None:
    """A form field's value when it is text (not a file, not missing)."""
    return value if isinstance(value, str) else None
