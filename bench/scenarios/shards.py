"""Scenario 11, shards: the seed cycle on 1 shard and on 2 (each shard its own redis-server,
dispatcher and workers), then sessions parked and left open, per shard (bench/shards.py)."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import log, out_of_time
from bench.report import save
from bench.shards import shards_row


def shards(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 11: `out["scenario_11"]`, one row per shard count."""
    rows = out.setdefault("scenario_11", [])
    for count in args.shard_counts:
        why = out_of_time(args, f"scenario 11 ({count} shard(s))")
        if why:
            rows.append({"shards": count, "skipped": why})
            continue
        log(f"scenario 11: {count} shard(s), each 1 dispatcher and {args.workers} worker(s), "
            f"{args.shards_partitions} partitions: {args.shards_sessions} seed sessions, then "
            f"{args.shards_parked} parked")
        row = shards_row(workdir / f"s11-{count}", count, args.shards_sessions, args.shards_parked,
                         args.workers, args.shards_partitions, args.timeout, args.idempotency_keys)
        rows.append(row)
        log(f"  {row['sessions_per_s']} sessions/s; per shard: " + ", ".join(
            f"#{x['shard']} {x['sessions']} at {x['sessions_per_s']}/s, {x['parked']} parked"
            for x in row["per_shard"]))
        save(args, out)
