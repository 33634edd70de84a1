"""Scenario 8, the soak: sessions run the seed flow to their end, are closed as idle, archived
and expired (bench/soak.py); Redis memory before and after, and their keys left."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import log, out_of_time
from bench.report import save
from bench.soak import soak_row


def soak(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 8: `out["scenario_8"]`, one row."""
    rows = out.setdefault("scenario_8", [])
    why = out_of_time(args, "scenario 8")
    if why:
        rows.append({"sessions": args.soak_sessions, "skipped": why})
        return
    log(f"scenario 8: soak, {args.soak_sessions} sessions run ({args.soak_chunk} at a time), closed "
        f"as idle after {args.soak_idle_timeout} s, expired")
    row = soak_row(workdir / "s8", args.soak_sessions, args.soak_chunk, args.soak_idle_timeout,
                   args.timeout, args.workers, log)
    rows.append(row)
    log(f"  used_memory {row['used_memory_before']:,} -> {row['used_memory_after']:,} "
        f"({row['used_memory_growth_pct']:+.2f} %); their keys left: {row['session_keys_left']}")
    save(args, out)
