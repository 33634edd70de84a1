"""The inbox's metrics and the headers every response carries (ASGI middleware).

The metrics live in a registry of their own, so `/metrics` shows the page's series only."""

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry()
REQUESTS = Counter("parley_inbox_requests", "HTTP requests the inbox answered, by route, method and status",
                   ["route", "method", "status"], registry=REGISTRY)
ANSWERS = Counter("parley_inbox_answers", "Answers posted, by outcome (delivered, not_delivered, refused, "
                  "already_answered, ignored, timeout, invalid, unavailable, forbidden, csrf)",
                  ["outcome"], registry=REGISTRY)
SIGNINS = Counter("parley_inbox_signins", "Sign-in attempts, by outcome (ok, refused, csrf)", ["outcome"],
                  registry=REGISTRY)
# Every outcome's series exists from the start (at 0), so the first failure of a process is
# an increase an alert's rate() sees.
for _outcome in ("delivered", "not_delivered", "refused", "already_answered", "ignored", "timeout", "invalid",
                 "unavailable", "forbidden", "csrf"):
    ANSWERS.labels(_outcome)
for _outcome in ("ok", "refused", "throttled", "csrf"):
    SIGNINS.labels(_outcome)
LIVE_PAGES = Gauge("parley_inbox_live_pages", "Pages following live updates (open event streams)",
                   registry=REGISTRY)

#: the routes a request is counted under (anything else is `other`: the label stays bounded)
ROUTES = frozenset({"/", "/events", "/interrupt", "/interrupt/answer", "/bulk", "/bulk/answer", "/history",
                    "/signin", "/signout", "/healthz", "/livez", "/metrics"})


def route_of(path: str) -> str:
    if path in ROUTES:
        return path
    return "/static" if path.startswith("/static/") else "other"


def metrics_body() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


#: no inline script or style, no framing, no other origin: a field an app filled with HTML
#: (escaped by the templates anyway) can run nothing
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; "
                                 b"img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
                                 b"base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
#: every page but the static files shows session data (a question's payload, a transcript, who
#: is signed in) or is a sign-in form: none may be kept by a browser or a proxy, where the next
#: user of the machine would find it in the history or the cache
NO_STORE = (b"cache-control", b"no-store")


def secured(headers: list[tuple[bytes, bytes]], scheme: str) -> list[tuple[bytes, bytes]]:
    """`headers` with every cookie marked Secure when the request came over HTTPS (its own, or
    a proxy's that uvicorn trusts, by X-Forwarded-Proto): behind TLS the cookie must never go
    out in clear text, whatever --secure-cookies says, even to a page that listens on loopback
    behind its proxy."""
    if scheme != "https":
        return headers
    out = []
    for name, value in headers:
        if name.lower() == b"set-cookie" and b"; secure" not in value.lower():
            value += b"; Secure"
        out.append((name, value))
    return out


class edge:
    """Every HTTP response of the page: counted by route, method and status (an unhandled error
    too, which Starlette turns into a 500 outside this middleware), and given `HEADERS`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def on_start(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                REQUESTS.labels(route_of(scope["path"]), scope["method"], str(message["status"])).inc()
                headers = secured(list(message.get("headers", [])), scope.get("scheme", "http")) + HEADERS
                if not scope["path"].startswith("/static/") and not any(
                        name.lower() == b"cache-control" for name, _ in headers):
                    headers.append(NO_STORE)
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, on_start)
        except Exception:
            if not started:
                REQUESTS.labels(route_of(scope["path"]), scope["method"], "500").inc()
            raise
