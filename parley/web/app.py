"""The inbox's web application: Starlette routes around the pure parts of parley/web/.

Every page but sign-in needs a signed-in principal (a signed session cookie). Reads go through
`AsyncClient` (every shard, merged); an answer is a signed `interrupt.resume` sent as the
signed-in principal with the first of its keys in the keys file, and the page waits for the
engine's word on it. The users file and the keys file are read again when they change on disk,
so adding a person or rotating a key needs no restart.

This module only assembles: the shared state (parley/web/state.py), the middleware, and the
table of routes, whose endpoints live in parley/web/routes/ by what they serve.
"""

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from parley.aclient import AsyncClient
from parley.client.shards import connect_async
from parley.schemas.keys import Keys
from parley.schemas.signing import Keyring
from parley.web import present
from parley.web.bulk import pick_of
from parley.web.config import InboxConfig
from parley.web.files import Reloading
from parley.web.live import FeedHub
from parley.web.observe import edge
from parley.web.routes import answers, bulk, listing, ops, signin
from parley.web.routes.history import history_page
from parley.web.signins import SignIns
from parley.web.state import Inbox
from parley.web.throttle import Throttle
from parley.web.users import Users

HERE = Path(__file__).parent
COOKIE = "parley_inbox"


def create_app(config: InboxConfig, clients: list[Redis] | None = None) -> Starlette:
    """The inbox application. `clients`: the shards' asyncio clients (default: one per URL of
    `config.redis_urls`)."""
    shards = clients if clients is not None else [connect_async(u) for u in config.redis_urls]
    keys = Keys(config.prefix)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["duration"] = present.duration
    templates.env.globals["pick_of"] = pick_of
    inbox = Inbox(
        config=config,
        shards=shards,
        redis_keys=keys,
        client=AsyncClient(shards, config.prefix, config.producer),
        users=Reloading(config.users_file, Users.load, "users file"),
        keys=Reloading(config.keys_file, lambda p: Keyring.load(p), "keys file") if config.keys_file
        else Reloading.fixed(Keyring({})),
        hub=FeedHub(shards, keys),
        templates=templates,
        signins=SignIns(shards[0], keys, config.session_max_age_s),
        throttle=Throttle(),
    )
    routes = [
        Route("/", listing.list_page),
        Route("/events", listing.events),
        Route("/interrupt", answers.interrupt_page),
        Route("/interrupt/answer", answers.answer, methods=["POST"]),
        Route("/bulk", bulk.bulk_page),
        Route("/bulk/answer", bulk.bulk_answer, methods=["POST"]),
        Route("/history", history_page),
        Route("/signin", signin.signin_page),
        Route("/signin", signin.signin, methods=["POST"]),
        Route("/signout", signin.signout, methods=["POST"]),
        Route("/healthz", ops.healthz),
        Route("/livez", ops.livez),
        Route("/metrics", ops.metrics),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    secret = config.session_secret or secrets.token_urlsafe(32)
    middleware = [
        Middleware(edge),
        Middleware(SessionMiddleware, secret_key=secret, session_cookie=COOKIE,
                   max_age=config.session_max_age_s, same_site="lax", https_only=config.secure_cookies),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={RedisError: ops.unavailable, OSError: ops.unavailable})
    app.state.inbox = inbox
    return app


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """While the app serves: one task reads every shard's feed for all open pages; at the end
    it stops, and the shards' clients are closed."""
    inbox: Inbox = app.state.inbox
    task = asyncio.create_task(inbox.hub.run(), name="parley-inbox-feed")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for r in inbox.shards:
            await r.aclose()
