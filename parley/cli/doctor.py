"""`parley doctor`: ask each Redis of the deployment what the guarantees depend on, and say
what to change (the rules are parley/fleet/doctor.py's). Also the check a dispatcher makes at start."""

import logging
from typing import Any

import click
import redis

from parley.fleet.doctor import (
    DefaultUser,
    Finding,
    Level,
    ServerFacts,
    default_user_finding,
    examine,
    failed,
)
from parley.runtime.logins import may_ask_acl, may_ask_info
from parley.runtime.logs import kv

log = logging.getLogger("parley.doctor")


def _asked(question: Any) -> Any:
    """The answer, or None where this login may not ask (NOPERM) or the server does not know
    the command (an older Redis, a proxy)."""
    try:
        return question()
    except (redis.exceptions.NoPermissionError, redis.exceptions.ResponseError):
        return None


def default_user(connection: redis.Redis) -> DefaultUser | None:
    reply = _asked(lambda: connection.acl_getuser("default"))
    return None if reply is None else DefaultUser.from_reply(reply)


def server_facts(connection: redis.Redis, name: str) -> ServerFacts:
    """What `connection`'s server says of itself. A shipped login is not asked what it is
    refused (parley/runtime/logins.py: the refusal would land in the ACL LOG): those facts stay None."""
    username = connection.connection_pool.connection_kwargs.get("username")
    admin = may_ask_acl(username)  # ACL GETUSER and CONFIG GET: no shipped login has either

    def config(parameter: str) -> str | None:
        reply = _asked(lambda: connection.config_get(parameter)) if admin else None
        return None if not reply else str(reply.get(parameter))

    info = may_ask_info(username)
    server = (_asked(lambda: connection.info("server")) if info else None) or {}
    cluster = (_asked(lambda: connection.info("cluster")) if info else None) or {}
    return ServerFacts(name=name, version=server.get("redis_version"),
                       cluster_enabled=None if not cluster else bool(cluster.get("cluster_enabled")),
                       default_user=default_user(connection) if admin else None,
                       appendonly=config("appendonly"), appendfsync=config("appendfsync"),
                       maxmemory_policy=config("maxmemory-policy"))


def format_finding(finding: Finding) -> str:
    return f"  {finding.level:<7} {finding.check}: {finding.text}"


def warn_if_aof_unsafe(connection: redis.Redis) -> Finding | None:
    """At a dispatcher's start: where its login may read the default user, log an error when
    Redis would drop transactions replaying its AOF. Returns the finding when it failed.

    A login named like the shipped ones (`parley-…`) is not asked: it may not run ACL GETUSER,
    and the refusal would land in Redis's ACL LOG at every start, where a refused command is
    something an operator should be able to treat as an alarm. `parley doctor` asks instead."""
    if not may_ask_acl(connection.connection_pool.connection_kwargs.get("username")):
        return None
    finding = default_user_finding(default_user(connection))
    if finding.level is Level.FAIL:
        log.error(f"Redis cannot replay its AOF whole: {finding.text}", extra=kv(check=finding.check))
        return finding
    return None


@click.command()
@click.pass_context
def doctor(ctx: click.Context) -> None:
    """Check each Redis (every --redis-url) for what Parley's guarantees need: a default user
    Redis can replay the AOF with, appendonly and appendfsync, noeviction, not a Cluster node.

    Run it with an admin login: what the login may not read is reported `unknown`. Exit 1 when
    anything FAILs, else 0."""
    from parley.cli.main import masked_url
    from parley.client.shards import connect_checked

    urls: list[str] = ctx.find_root().obj["urls"]
    bad = False
    for url in urls:
        # a Cluster node stops here as it stops every command (exit 78, one line)
        facts = server_facts(connect_checked(url), masked_url(url))
        findings = examine(facts)
        click.echo(f"{facts.name} (Redis {facts.version or 'version unknown'})")
        for finding in findings:
            click.echo(format_finding(finding))
        bad = bad or failed(findings)
    if bad:
        raise click.exceptions.Exit(1)
