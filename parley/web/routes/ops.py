"""For operations: `GET /healthz` (every shard answers a PING), `GET /livez` (the process
serves, no Redis asked), `GET /metrics` (the page's own Prometheus series), and the 503 page
any route answers when Redis cannot be reached."""

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from parley.runtime.logs import kv
from parley.web.observe import ANSWERS, metrics_body
from parley.web.present import AnswerStatus
from parley.web.state import inbox_of

log = logging.getLogger("parley.inbox")


async def healthz(request: Request) -> Response:
    states = await asyncio.gather(*(_ping(r) for r in inbox_of(request).shards))
    ok = all(states)
    return JSONResponse({"status": "ok" if ok else "unavailable",
                         "shards": ["ok" if s else "unavailable" for s in states]},
                        status_code=200 if ok else 503)


async def livez(request: Request) -> Response:
    """The process serves (no Redis asked): for a liveness probe, which must not restart
    every replica while one shard is down."""
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    body, content_type = metrics_body()
    return Response(body, media_type=content_type)


async def unavailable(request: Request, exc: Exception) -> Response:
    """The exception handler for RedisError and OSError: one line, 503 (an answer counts as
    `unavailable`)."""
    log.warning("redis unavailable", extra=kv(path=request.url.path, error=repr(exc)))
    if request.url.path == "/interrupt/answer":
        ANSWERS.labels(AnswerStatus.UNAVAILABLE.value).inc()
    return PlainTextResponse("Parley is unavailable (Redis could not be reached): try again in a moment.",
                             status_code=503)


async def _ping(r: Redis) -> bool:
    try:
        return bool(await asyncio.wait_for(r.ping(), timeout=2.0))
    except (TimeoutError, RedisError, OSError):
        return False
