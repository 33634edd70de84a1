"""Scenario 12, the inbox page: `parley inbox` as a real process with `--page-open` open
interrupts, signed in as a browser does; its list's pages timed as whole HTTP requests
(bench/inbox_page.py)."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, log, out_of_time, percentile
from bench.inbox_page import page_row
from bench.report import save


def inbox_page(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 12: `out["scenario_12"]`, one row."""
    rows = out.setdefault("scenario_12", [])
    why = out_of_time(args, "scenario 12")
    if why:
        rows.append({"open": args.page_open, "skipped": why})
        return
    log(f"scenario 12: the inbox page (`parley inbox`) with {args.page_open:,} open interrupts, "
        f"{args.page_requests} requests of each page")
    rows.append(page_row(workdir / "s12", args.page_open, args.page_requests, dist=dist,
                         percentile=percentile, log=log))
    save(args, out)
