"""Scenario 4, scaling: scenario 1's measurement (appendfsync always, `--scaling-partitions`
partitions, `--scaling-sessions` sessions per row) for each number of dispatchers
and worker processes. Run last: its rows are the ones given up when the budget runs out."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import log, out_of_time
from bench.fleet import Fleet
from bench.report import save
from bench.scenarios.seed_cycle import flow_row


def scaling(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 4: `out["scenario_4"]`, one row per (dispatchers, workers)."""
    rows = out.setdefault("scenario_4", [])
    for d in args.scaling_dispatchers:
        for w in args.scaling_workers:
            why = out_of_time(args, f"scenario 4 ({d} dispatchers, {w} workers)")
            if why:
                rows.append({"dispatchers": d, "workers": w, "skipped": why})
                continue
            log(f"scenario 4: {d} dispatcher(s), {w} worker(s), {args.scaling_partitions} partitions, "
                f"{args.scaling_sessions} sessions")
            fleet = Fleet(workdir / f"s4-{d}-{w}", dispatchers=d, workers=w,
                          partitions=args.scaling_partitions).start()
            try:
                row = flow_row(fleet, args.scaling_sessions, args.timeout, args.idempotency_keys,
                               f"s4-{d}{w}")
                row.update(dispatchers=d, workers=w, partitions=args.scaling_partitions,
                           partitions_shared_after_s=fleet.balance_s)
                rows.append(row)
                log(f"  {row['sessions_per_s']} sessions/s, {row['jobs_per_s']} jobs/s")
            finally:
                fleet.stop()
            save(args, out)
