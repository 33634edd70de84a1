"""What the commands share: the Redis, the shards and the client a command's options name.

The `parley` group (parley/cli/main.py) puts the Redis URLs, the key prefix and the signing
and producer options in `ctx.obj`; every command reaches Redis through these, so a Redis
Cluster node is refused the same way everywhere (ClusterNotSupported, exit 78).
"""

from typing import Any

import click
import redis


def connect(ctx: click.Context, shard: int | None = None) -> redis.Redis:
    """A client of one shard (the first when not told): a plain or a redis+sentinel:// URL;
    ClusterNotSupported for a Redis Cluster node (parley/client/shards.py, `connect_checked`)."""
    from parley.client.shards import connect_checked

    return connect_checked(ctx.obj["urls"][shard or 0])


def shards_of(ctx: click.Context) -> Any:
    """Every shard of the deployment, in order (one with one URL): parley/client/shards.py."""
    from parley.client.shards import Shards
    from parley.schemas.keys import Keys

    return Shards([connect(ctx, i) for i in range(len(ctx.obj["urls"]))], Keys(ctx.obj["prefix"]))


def check_shard(ctx: click.Context, shard: int | None) -> int | None:
    """`--shard i`: a shard the URLs name (UsageError otherwise)."""
    if shard is not None and shard >= len(ctx.obj["urls"]):
        raise click.UsageError(f"--shard {shard}: there are {len(ctx.obj['urls'])} Redis URLs "
                               f"(shards 0-{len(ctx.obj['urls']) - 1})")
    return shard


def client_of(ctx: click.Context, sends: bool = False) -> Any:
    """The client of every shard: a session's calls go to its shard, listings merge them all."""
    from parley.client import Client

    if sends and len(ctx.obj["urls"]) > 1 and ctx.obj["producer"] is None:
        raise click.UsageError("a deployment of several shards takes inputs through the submit "
                               "function: name the producer (--producer or PARLEY_PRODUCER)")
    return Client(shards_of(ctx), ctx.obj["prefix"], ctx.obj["producer"])
