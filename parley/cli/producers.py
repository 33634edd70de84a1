"""`parley producers`: the registry of producers (docs/operations.md, "Producers").

Each registered producer writes input streams of its own, which every dispatcher reads; its
Redis login (the line `parley producers acl` prints) may write those streams only.

A deployment of several shards holds the registry on every shard (each shard's dispatchers read
their own): `add` and `remove` write every shard, `list` shows them all and warns of shards
that disagree (a shard added later, or a command that stopped half way: `add` it again).
"""

from typing import Any

import click
import orjson
import redis

from parley.schemas.keys import Keys
from parley.schemas.producers import (
    Producer,
    ProducerError,
    acl_line,
    check_name,
    new_producer,
    parse_registry,
)


def _registries(ctx: click.Context) -> tuple[list[redis.Redis], Keys]:
    """A client of every shard, in order (plain or redis+sentinel:// URLs)."""
    from parley.client.shards import connect_checked

    obj = ctx.find_root().obj
    return [connect_checked(u) for u in obj["urls"]], Keys(obj["prefix"])


def _partitions(r: redis.Redis, keys: Keys) -> int:
    raw: Any = r.hget(keys.config, "partitions")
    return int(raw) if raw else 1


def _name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        return check_name(value)
    except ProducerError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group()
def producers() -> None:
    """The producers allowed to write inputs: each writes its own input streams, which the
    dispatchers read (a new one within a couple of seconds)."""


@producers.command("add")
@click.argument("name", callback=_name)
@click.option("--tenant", default=None,
              help="Scope the producer to one tenant: it may write only sessions `<tenant>/...`.")
@click.pass_context
def add(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Register producer NAME (1-32 of a-z 0-9 _ -). Adding one that exists changes its tenant."""
    try:
        producer = new_producer(name, tenant)
    except ProducerError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None
    shards, keys = _registries(ctx)
    for r in shards:
        r.hset(keys.producers, name, producer.to_json())
    scope = f"tenant {tenant}" if tenant else "any tenant"
    click.echo(f"producer {name} added ({scope}); it writes {keys.producer_inputs(name)}[:<partition>]")


@producers.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """The registered producers, by name, with their tenant and how many entries their streams
    hold (written and not yet applied)."""
    shards, keys = _registries(ctx)
    registered: dict[str, Producer] = {}
    where: dict[str, list[int]] = {}
    for i, r in enumerate(shards):
        held, errors = parse_registry(r.hgetall(keys.producers))  # type: ignore[arg-type]
        for error in errors:
            click.echo(f"parley: shard {i}: {error}" if len(shards) > 1 else f"parley: {error}", err=True)
        for name, p in held.items():
            known = registered.setdefault(name, p)
            where.setdefault(name, []).append(i)
            if known.tenant != p.tenant:
                click.echo(f"parley: producer {name} has tenant {known.tenant or '*'} on shard "
                           f"{where[name][0]} and {p.tenant or '*'} on shard {i}: `add` it again",
                           err=True)
    for name in sorted(registered):
        if len(where[name]) != len(shards):
            on = ", ".join(map(str, where[name]))
            click.echo(f"parley: producer {name} is registered on shard(s) {on} only: `add` it again "
                       "to register it on every shard", err=True)
    for name in sorted(registered):
        p = registered[name]
        waiting = sum(_waiting(r, keys, name, _partitions(r, keys)) for r in shards)
        if as_json:
            click.echo(orjson.dumps({"name": name, "tenant": p.tenant, "added_at": p.added_at,
                                     "waiting": waiting}).decode())
        else:
            click.echo(f"{name}\ttenant={p.tenant or '*'}\twaiting={waiting}")


@producers.command("remove")
@click.argument("name", callback=_name)
@click.option("--force", is_flag=True,
              help="Remove it even though its streams hold entries not yet applied (the dispatchers "
                   "still apply them).")
@click.pass_context
def remove(ctx: click.Context, name: str, force: bool) -> None:
    """Unregister producer NAME. Refused while its streams hold entries not yet applied."""
    shards, keys = _registries(ctx)
    if not any(r.hexists(keys.producers, name) for r in shards):
        raise click.ClickException(f"no producer {name}")
    waiting = sum(_waiting(r, keys, name, _partitions(r, keys)) for r in shards)
    if waiting and not force:
        raise click.ClickException(f"producer {name}'s streams hold {waiting} entries not yet applied; "
                                   "wait for them, or remove it with --force")
    for r in shards:
        r.hdel(keys.producers, name)
    click.echo(f"producer {name} removed" + (f" ({waiting} entries still to apply)" if waiting else ""))


@producers.command("acl")
@click.argument("name", callback=_name)
@click.option("--tenant", default=None, help="Scope the login to one tenant's sessions.")
@click.pass_context
def acl(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Print the users.acl line of producer NAME's Redis login (set its password)."""
    try:
        click.echo(acl_line(name, tenant, prefix=ctx.find_root().obj["prefix"]))
    except ProducerError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None


def _waiting(r: redis.Redis, keys: Keys, name: str, partitions: int) -> int:
    """Entries in the producer's streams: applied ones are deleted, so these are not applied yet."""
    pipe = r.pipeline(transaction=False)
    for i in range(partitions):
        pipe.xlen(keys.producer_inputs(name, i, partitions))
    return sum(int(n) for n in pipe.execute())


def register_producers(r: redis.Redis, keys: Keys, wanted: list[Producer]) -> None:
    """The dispatcher's `--register-producer`: each registration written unless the registry
    holds it already with the same tenant (its first `added_at` is kept)."""
    if not wanted:
        return
    registered, _errors = parse_registry(r.hgetall(keys.producers))  # type: ignore[arg-type]
    for p in wanted:
        known = registered.get(p.name)
        if known is not None and known.tenant == p.tenant:
            continue
        r.hset(keys.producers, p.name, p.to_json())
        scope = f"tenant {p.tenant}" if p.tenant else "any tenant"
        click.echo(f"parley: producer {p.name} registered ({scope})", err=True)
