"""Signing in and out: `GET /signin` (the form), `POST /signin`, `POST /signout`.

A sign-in is checked against the users file (scrypt, off the event loop), throttled per name
and per address after failures, and recorded in Redis (parley/web/signins.py) so a sign-out
ends every copy of the cookie on every replica.
"""

import asyncio
import logging
import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from parley.runtime.logs import kv
from parley.web import csrf, present
from parley.web.observe import SIGNINS
from parley.web.routes.common import checked_form, page, text_of
from parley.web.state import inbox_of

log = logging.getLogger("parley.inbox")


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (never `//host` or a URL)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def signin_page(request: Request) -> Response:
    return page(request, "signin.html", {"next": local_path(request.query_params.get("next")),
                                         "error": None, "name": ""})


async def signin(request: Request) -> Response:
    inbox = inbox_of(request)
    form = await checked_form(request, SIGNINS)
    if isinstance(form, Response):
        return form
    principal, secret = text_of(form.get("principal")) or "", text_of(form.get("secret")) or ""
    target = local_path(text_of(form.get("next")))
    address = request.client.host if request.client else "?"
    guesses = [f"principal:{principal[:256]}", f"address:{address}"]
    wait_s = inbox.throttle.wait_s(guesses, time.monotonic())
    if wait_s > 0:
        SIGNINS.labels("throttled").inc()
        return page(request, "signin.html", {"next": target, "error": "Too many failed sign-ins: try "
                                             f"again in {present.duration(int(wait_s * 1000) + 999)}.",
                                             "name": principal[:256]}, status=429)
    users = inbox.users.current()
    # scrypt costs tens of milliseconds: off the event loop, so one sign-in stalls no page
    ok = bool(principal and secret) and await asyncio.to_thread(users.check, principal, secret)
    if not ok:
        inbox.throttle.failed(guesses, time.monotonic())
        SIGNINS.labels("refused").inc()
        log.info("sign-in refused", extra=kv(principal=principal[:64]))
        # the name is kept (a mistyped password should not cost typing the name again); the
        # password never is
        return page(request, "signin.html", {"next": target, "error": "Unknown name or wrong password.",
                                             "name": principal[:256]}, status=401)
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
        await inbox_of(request).signins.end(sid)  # for every copy of the cookie, on every replica
    request.session.clear()
    return RedirectResponse("/signin", status_code=303)
