"""Scenario 9, the list of sessions: a page of `parley sessions` / `Client.sessions` for each
filter, as the number of sessions grows to each of `--list-sizes` (bench/sessions.py)."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, ints, log, out_of_time
from bench.report import save
from bench.sessions import listing_rows


def session_list(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 9: `out["scenario_9"]`, one row per size."""
    why = out_of_time(args, "scenario 9")
    if why:
        out["scenario_9"] = [{"sessions": n, "skipped": why} for n in args.list_sizes]
        return
    log(f"scenario 9: the list of sessions at {', '.join(ints(args.list_sizes))} sessions, "
        f"{args.list_pages} pages of {args.list_limit} per filter")
    out["scenario_9"] = listing_rows(workdir / "s9", args.list_sizes, args.list_pages, args.list_limit,
                                     dist=dist, log=log)
    save(args, out)
