"""Scenario 13, long sessions: a transition (a branch switch) and `parley show` on a session of
`--long-messages` messages of ~4 KB, on one of `--long-branches` branches, and on a fresh one
(bench/long_sessions.py)."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, log, out_of_time, percentile
from bench.long_sessions import long_sessions_row
from bench.report import save


def long_sessions(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 13: `out["scenario_13"]`, one row (of three sessions)."""
    rows = out.setdefault("scenario_13", [])
    why = out_of_time(args, "scenario 13")
    if why:
        rows.append({"messages": args.long_messages, "skipped": why})
        return
    log(f"scenario 13: long sessions: {args.long_messages:,} messages, {args.long_branches:,} branches, "
        f"{args.long_transitions} branch switches on each and a fresh session")
    rows.append(long_sessions_row(workdir / "s13", args.long_messages, args.long_branches,
                                  args.long_transitions, args.long_shows, args.workers, args.timeout,
                                  dist=dist, percentile=percentile, log=log))
    save(args, out)
