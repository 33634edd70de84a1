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
    if shards.down:
        click.echo(f"shard(s) {shards.down} do not answer: read from the others (a majority)")
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


@partitions.command("add-shards")
@click.pass_context
def add_shards(ctx: click.Context) -> None:
    """Join new, empty shards to the deployment: give every shard's URL, in order, then the new
    shards' URLs after them. Nothing moves (the new shards hold no partition until `rebalance`
    or `move` gives them some), so the deployment runs on meanwhile; start the new shards'
    dispatchers and workers, with every URL, before moving partitions there."""
    from parley.fleet.adding import add_shards as add

    try:
        added = add(_mover(ctx))
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"shards {added.before}-{added.after - 1} added: the deployment has {added.after} shards "
               f"(table version {added.version}); no partition is on the new ones yet")


@partitions.command("rebalance")
@click.option("--drain", "drain", type=click.IntRange(0), multiple=True,
              help="A shard to empty (before removing it): it gives every partition away. Repeatable.")
@click.option("--parallel", type=click.IntRange(1, 64), default=2, show_default=True,
              help="How many moves run at once (each partition is frozen only for its own move).")
@click.option("--drain-timeout", type=click.FloatRange(0), default=DEFAULT_DRAIN_TIMEOUT_S, show_default=True,
              help="As for `move`: seconds each move waits for its partition's jobs.")
@click.option("--yes", is_flag=True, help="Apply the plan without asking.")
@click.option("--dry-run", is_flag=True, help="Show the plan and change nothing.")
@click.pass_context
def rebalance(ctx: click.Context, drain: tuple[int, ...], parallel: int, drain_timeout: float,
              yes: bool, dry_run: bool) -> None:
    """Move partitions so that every shard holds its share (N // S or one more), or so that the
    --drain shards hold none: the plan (the fewest moves that do it) is shown, then applied,
    --parallel moves at a time, while the deployment runs."""
    from parley.schemas.rebalance import plan_rebalance

    mover = _mover(ctx)
    try:
        placement = mover.shards.check()
        assert placement is not None  # a Mover is of several shards
        plan = plan_rebalance(placement, drain)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    down = set(mover.shards.down)
    if down and any(t.source in down or t.target in down for t in plan.transfers) and not dry_run:
        raise click.ClickException(f"shard(s) {sorted(down)} do not answer, and the plan moves partitions "
                                   "to or from them: run it once they are back (nothing was changed)")
    counts = enumerate(zip(plan.before, plan.after, strict=True))
    click.echo("partitions per shard: " + ", ".join(f"{s}: {b}" + (f" -> {a}" if a != b else "")
                                                    for s, (b, a) in counts))
    if plan.empty:
        click.echo("balanced already: nothing to move")
        return
    for t in plan.transfers:
        click.echo(f"  move partition {t.partition}: shard {t.source} -> {t.target}")
    if dry_run:
        click.echo(f"{len(plan.transfers)} move(s) planned; --dry-run: nothing changed")
        return
    if not yes:
        click.confirm(f"apply these {len(plan.transfers)} move(s)?", abort=True)
    try:
        results = mover.move_many([(t.partition, t.target) for t in plan.transfers], parallel=parallel,
                                  drain_timeout_s=drain_timeout)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    failed = [r for r in results if isinstance(r, Exception)]
    for r in results:
        if isinstance(r, Exception):
            click.echo(f"not moved: {r}", err=True)
        else:
            click.echo(f"partition {r.partition} moved from shard {r.source} to shard {r.target} "
                       f"({r.sessions} sessions; frozen {r.frozen_s:.3f} s)")
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(results)} move(s) not done (see above); run "
                                   "`parley partitions repair` if one says so, then rebalance again")
    slowest = max(r.frozen_s for r in results if not isinstance(r, Exception))
    click.echo(f"rebalanced: {len(results)} partition(s) moved; the longest freeze {slowest:.3f} s")


@partitions.command("resize")
@click.option("--to", "to", type=click.IntRange(2, 1024), required=True,
              help="The new partition count: a multiple of the present one.")
@click.pass_context
def resize_command(ctx: click.Context, to: int) -> None:
    """Multiply the partition count of a STOPPED deployment (every dispatcher, worker and
    producer stopped, every input applied): no session changes shard. Refused, saying why and
    changing nothing, while anything runs. Start the processes again afterwards."""
    from parley.fleet.resizing import resize

    try:
        done = resize(shards_of(ctx), to)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    table = "" if done.version is None else f" (table version {done.version})"
    click.echo(f"resized from {done.before} to {done.after} partitions{table}: {done.relisted} session(s) "
               "listed under their new partitions; start the dispatchers, workers and producers again")


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
