"""`parley partitions`: where each partition lives, and moving one to another shard
(docs/operations.md, "Moving a partition"). The move itself is parley/fleet/moves.py."""

from typing import Any

import click

from parley.cli.connect import shards_of
from parley.schemas.moves import DEFAULT_DRAIN_TIMEOUT_S, MoveStep, partition_states
from parley.schemas.shards import PlacementError


def _mover(ctx: click.Context) -> Any:
    from parley.fleet.moves import Mover

    def say(step: MoveStep, text: str) -> None:
        click.echo(f"{step}: {text}")

    return Mover(shards_of(ctx), say)


@click.group()
def partitions() -> None:
    """The partitions of a deployment of several Redis shards: where each is, and moving one."""


@partitions.command("list")
@click.pass_context
def list_partitions(ctx: click.Context) -> None:
    """The placement table: each partition's shard, and whether it is being moved."""
    shards = shards_of(ctx)
    if not shards.sharded:
        raw = shards.clients[0].hget(shards.keys.config, "partitions")
        click.echo(f"one Redis: all {int(raw) if raw else 1} partition(s) on it (no placement table)")
        return
    try:
        placement = shards.check()
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    if placement is None:
        click.echo("no placement yet: start a dispatcher to write the first one")
        return
    click.echo(f"placement version {placement.version}: {placement.partitions} partitions "
               f"over {placement.shards} shards")
    for p, shard, state in partition_states(placement):
        click.echo(f"{p:>4}  shard {shard}  {state}")


@partitions.command("move")
@click.argument("partition", type=click.IntRange(0))
@click.option("--to", "to", type=click.IntRange(0), required=True, help="The target shard's index.")
@click.option("--drain-timeout", type=click.FloatRange(0), default=DEFAULT_DRAIN_TIMEOUT_S, show_default=True,
              help="Seconds to wait for the partition's queued and running jobs; those left then "
                   "are recorded lost and retried on the target by the engine's rules.")
@click.pass_context
def move(ctx: click.Context, partition: int, to: int, drain_timeout: float) -> None:
    """Move PARTITION to shard --to, while the deployment runs: its inputs are refused `moved`
    (clients retry) until the move is done."""
    try:
        report = _mover(ctx).move(partition, to, drain_timeout_s=drain_timeout)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"partition {report.partition} moved from shard {report.source} to shard {report.target} "
               f"({report.sessions} sessions, {report.keys} keys, {report.members} members; "
               f"frozen {report.frozen_s:.3f} s)")


@partitions.command("index")
@click.pass_context
def index(ctx: click.Context) -> None:
    """List every session of each shard in its partition's list, so that a move copies exactly
    its partition's keys instead of scanning the whole shard. Needed once, for shards that held
    sessions before this release, after every dispatcher runs it; safe while the deployment
    runs, and again."""
    from parley.fleet.copying import Copier

    shards = shards_of(ctx)
    copier = Copier(shards.keys)
    for i, r in enumerate(shards.clients):
        raw = r.hget(shards.keys.config, "partitions")
        if raw is None:
            # its first dispatcher marks it indexed as it starts (dispatcher/leases.py)
            click.echo(f"shard {i}: no dispatcher has served it yet: nothing to index")
            continue
        added = copier.index(r, int(raw))
        click.echo(f"shard {i}: {added} session(s) added to their partitions' lists; indexed")


@partitions.command("repair")
@click.pass_context
def repair(ctx: click.Context) -> None:
    """Finish or undo a move that stopped half way (its process died): flip it when its copy
    was done, else serve the partition on its source again. Refused while a move runs (the
    move lock)."""
    try:
        steps = _mover(ctx).repair()
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    if not steps:
        click.echo("nothing to repair")
    for step in steps:
        click.echo(f"partition {step.partition}: {step.action} (shard {step.target})")
