"""Scenario 6, sweeps with a backlog: the dispatcher's timed sweeps run in this process
(bench/sweep.py) over `--backlog-jobs` queued jobs and no worker, every sweep due on every
tick, while a separate process PINGs Redis in a closed loop."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, log, out_of_time
from bench.fleet import deploy_tuning
from bench.report import save
from bench.sweep import backlog_row


def sweeps_with_backlog(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 6: `out["scenario_6"]`, one row."""
    rows = out.setdefault("scenario_6", [])
    why = out_of_time(args, "scenario 6")
    if why:
        rows.append({"jobs": args.backlog_jobs, "skipped": why})
        return
    log(f"scenario 6: sweeps with {args.backlog_jobs} jobs queued, no worker, {args.backlog_ticks} ticks")
    row = backlog_row(workdir / "s6", args.backlog_jobs, args.backlog_ticks, lost=args.backlog_lost,
                      settings=deploy_tuning(), dist=dist)
    rows.append(row)
    log(f"  sweeps per tick p99 {row['sweep_ms_per_tick'].get('p99')} ms, "
        f"PING p99 {row['ping_ms'].get('p99')} ms")
    save(args, out)
