"""Redis as the project ships it: deploy/redis/redis.conf and deploy/redis/users.acl, with the
processes' logins taken from that file. Crash, restart and chaos tests start Redis this way, so
what they prove holds for a real deployment (a default user the AOF cannot be replayed with
was invisible to tests that ran without the ACL file).

The test harness itself needs one login the shipped file does not have: an admin that seeds
state, registers producers and reads anything a check needs. It is appended to a private copy
of the file; no Parley process uses it.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import redis

from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_ACL = ROOT / "deploy" / "redis" / "users.acl"
SHIPPED_CONF = ROOT / "deploy" / "redis" / "redis.conf"

ADMIN = "harness-admin"
ADMIN_PASSWORD = "test-admin-password"

DISPATCHER, WORKER = "parley-dispatcher", "parley-worker"
PRODUCER, READER = "parley-producer", "parley-reader"
#: a Sentinel-managed shard's logins: a replica's link to its primary, a sentinel's to each node
REPLICA, SENTINEL = "parley-replica", "parley-sentinel"
#: the producer the shipped producer login writes for (register it before sending)
PRODUCER_NAME = "app"


def shipped_passwords(acl_text: str | None = None) -> dict[str, str]:
    """Each enabled user of the ACL file with its (placeholder) password: `user NAME on >PW ...`."""
    text = SHIPPED_ACL.read_text() if acl_text is None else acl_text
    found = {}
    for line in text.splitlines():
        match = re.match(r"user (\S+) on >(\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def login(user: str) -> str:
    """`user:password` of a login of the shipped file (or the harness's admin)."""
    if user == ADMIN:
        return f"{ADMIN}:{ADMIN_PASSWORD}"
    return f"{user}:{shipped_passwords()[user]}"


def urls_as(servers: list[RedisServer], user: str | None) -> list[str]:
    """Every server's URL under a shipped login (None: the harness's admin), in order."""
    return [s.url if user is None else s.url_as(login(user)) for s in servers]


def acl_copy(directory: Path, acl_text: str | None = None) -> Path:
    """A private copy of the ACL file (or of `acl_text`), plus the harness's admin login."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "users.acl"
    text = SHIPPED_ACL.read_text() if acl_text is None else acl_text
    path.write_text(text.rstrip("\n") + f"\nuser {ADMIN} on >{ADMIN_PASSWORD} ~* &* +@all\n")
    return path


def conf_copy(directory: Path) -> Path:
    """A private copy of the shipped redis.conf: a Sentinel's failover ends with `CONFIG REWRITE`
    on the node it promotes, which would otherwise rewrite the repository's file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "redis.conf"
    path.write_text(SHIPPED_CONF.read_text())
    return path


def deployed_redis(directory: Path, acl_text: str | None = None, **kwargs: object) -> RedisServer:
    """A RedisServer (not started) with the shipped redis.conf and ACL file (private copies);
    its `url` is the admin's, `url_as(login(user))` any shipped login's. `appendonly` and
    `appendfsync` are those redis.conf ships (yes, always)."""
    kwargs.setdefault("appendonly", True)
    kwargs.setdefault("appendfsync", "always")
    return RedisServer(directory, config_file=conf_copy(directory), aclfile=acl_copy(directory, acl_text),
                       login=login(ADMIN), **kwargs)  # type: ignore[arg-type]


def ready_for_producers(admin: redis.Redis, dispatcher: redis.Redis) -> None:
    """What a deployment does before its first input: producer `app` registered (an operator,
    here the admin) and the submit function loaded (a dispatcher's start, under its login), so a
    producer may send before the first dispatcher is up."""
    from parley.dispatcher.functions import Functions

    admin.hset(Keys().producers, PRODUCER_NAME, orjson.dumps({"tenant": None}))
    Functions(dispatcher).ensure()


def started_for_producers(directory: Path, acl_text: str | None = None) -> RedisServer:
    """`deployed_redis` started, and `ready_for_producers`: what a test of the shipped deployment
    starts from."""
    server = deployed_redis(directory, acl_text).start()
    admin = redis.Redis.from_url(server.url)
    as_dispatcher = redis.Redis.from_url(server.url_as(login(DISPATCHER)))
    try:
        ready_for_producers(admin, as_dispatcher)
    finally:
        admin.close()
        as_dispatcher.close()
    return server
