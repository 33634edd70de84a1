"""One process per shard: what `parley dispatcher` / `parley worker` do when given several
Redis URLs and no `--shard` (docs/operations.md, "Processes per shard").

Each shard's processes connect to that shard only, so a command serving a deployment of S
shards starts S children (`python -m parley`, the same arguments plus `--shard i`), passes
SIGTERM and SIGINT on to them, and exits once they all have: 0 if they all did, else 1.
`--metrics-port P` becomes P+i for child i, so each child serves its own /metrics.

A process of one shard (`--shard i`) checks first that the shards agree on their placement
(`resolve_partitions`, `await_shards_placement`); one given a single URL refuses to serve a
Redis that is a shard of several (`refuse_a_lone_shard`).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from parley.cli.connect import check_shard, connect, shards_of
from parley.runtime import logs
from parley.schemas.shards import Placement, PlacementError

METRICS_OPTION = "--metrics-port"


def child_args(argv: Sequence[str], shard: int, metrics_port: int | None) -> list[str]:
    """The command line of child `shard`: `argv` (this process's arguments, after the program)
    without its `--metrics-port`, plus `--shard` and the child's own metrics port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == METRICS_OPTION:
            skip = True  # its value follows
            continue
        if arg.startswith(METRICS_OPTION + "="):
            continue
        out.append(arg)
    out += ["--shard", str(shard)]
    if metrics_port is not None:
        out += [METRICS_OPTION, str(metrics_port + shard)]
    return out


def run_per_shard(shards: int, metrics_port: int | None, argv: Sequence[str] | None = None) -> int:
    """Start a child per shard, forward SIGTERM/SIGINT to them, wait for all; the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    children: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # installed first: a signal while the children start must not leave any of them orphaned
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for i in range(shards):
        child = subprocess.Popen([sys.executable, "-m", "parley", *child_args(args, i, metrics_port)])
        children.append(child)
        if stopping:  # asked to stop before this one started
            child.send_signal(stopping[0])
    codes = [child.wait() for child in children]
    return 0 if all(code == 0 for code in codes) else 1


def await_placement(check: Callable[[], Placement | None], wait_s: float,
                    sleep: Callable[[float], None] = time.sleep, step_s: float = 0.5) -> Placement:
    """The placement a worker serves by: `check()` (the shards' agreed placement, PlacementError
    when they disagree) until one is there. A worker may start before any dispatcher has
    written the first placement, so it waits up to `wait_s`, then refuses."""
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        placement = check()
        if placement is not None:
            return placement
        if not waiting:
            waiting = True
            logging.getLogger("parley.worker").info(
                "no placement yet: waiting for a dispatcher to write it", extra=logs.kv(wait_s=wait_s))
        if time.monotonic() >= deadline:
            raise PlacementError(f"no shard holds a placement after {wait_s:g} s: start a dispatcher "
                                 "of this deployment first (it writes the placement)")
        sleep(step_s)


#: how long a worker of one shard waits for a dispatcher to write the first placement
WORKER_PLACEMENT_WAIT_S = 15.0


def shard_to_serve(ctx: click.Context, shard: int | None, metrics_port: int | None) -> int | None:
    """The shard this dispatcher or worker serves: None with one Redis URL (as before shards);
    with several and no `--shard`, one child process per shard is run instead, and this process
    exits with their outcome (`run_per_shard`)."""
    from parley.runtime import metrics

    urls = ctx.obj["urls"]
    check_shard(ctx, shard)
    if len(urls) == 1:
        return None
    if shard is None:
        ctx.exit(run_per_shard(len(urls), metrics_port))
    assert shard is not None
    metrics.set_shard(shard)
    return shard


def refuse_a_lone_shard(ctx: click.Context) -> None:
    """With one Redis URL: refuse to start (exit 1) on a Redis that is a shard of several (its
    config holds `placement` or `shard`). A pod left on one old URL would otherwise lease
    every partition of that shard, ignore moves and sweep frozen partitions. A Redis that
    cannot be used stops the process here, as it would at its first command (exit 69)."""
    from parley.schemas.keys import Keys
    from parley.schemas.shards import PLACEMENT_FIELD, SHARD_FIELD

    raw, index = connect(ctx).hmget(Keys(ctx.obj["prefix"]).config, [PLACEMENT_FIELD, SHARD_FIELD])
    if raw is None and index is None:
        return
    try:
        of = f"{Placement.from_json(raw).shards} shards" if raw is not None else "several shards"
    except PlacementError:
        of = "several shards"
    i = int(index) if index is not None else "i"
    raise click.ClickException(f"this Redis is shard {i} of a deployment of {of}: give every shard's "
                               f"URL, in order, and --shard {i}")


def resolve_partitions(ctx: click.Context, shard: int | None, partitions: int | None) -> int:
    """N to publish: as given, else 1 with one Redis (as before shards), 16 with several. A
    dispatcher of one shard checks the placement every shard holds against its URLs, writing
    the first one on a fresh deployment; one that disagrees refuses to start."""
    from parley.schemas.shards import DEFAULT_SHARDED_PARTITIONS

    if shard is None:
        return partitions or 1
    from parley.dispatcher.engine_key import share_engine_key

    shards = shards_of(ctx)
    try:
        placement = shards.check(partitions or DEFAULT_SHARDED_PARTITIONS, create=True)
    except PlacementError as exc:
        raise click.ClickException(f"shard {shard}: {exc}") from None
    try:
        share_engine_key(shards.clients, shards.keys, shard)
    except RuntimeError as exc:  # shard 0 down and no majority holding one key
        raise click.ClickException(f"shard {shard}: {exc}") from None
    return int(placement.partitions)


def await_shards_placement(ctx: click.Context) -> None:
    """A worker of one shard checks the shards' placement too (the same URLs, in the same
    order), waiting a little for a dispatcher to write the first one."""
    shards = shards_of(ctx)
    try:
        await_placement(lambda: shards.check(create=False), WORKER_PLACEMENT_WAIT_S)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
