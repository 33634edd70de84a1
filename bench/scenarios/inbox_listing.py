"""Scenario 7, the inbox listing: a page of `parley interrupts` / `Client.interrupt_page` for
each query, as the number of open interrupts grows to each of `--inbox-sizes`
(bench/inbox.py)."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, ints, log, out_of_time
from bench.inbox import listing_rows
from bench.report import save


def inbox_listing(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 7: `out["scenario_7"]`, one row per size."""
    why = out_of_time(args, "scenario 7")
    if why:
        out["scenario_7"] = [{"open": n, "skipped": why} for n in args.inbox_sizes]
        return
    log(f"scenario 7: the inbox listing at {', '.join(ints(args.inbox_sizes))} open interrupts, "
        f"{args.inbox_pages} pages of {args.inbox_limit} per query")
    out["scenario_7"] = listing_rows(workdir / "s7", args.inbox_sizes, args.inbox_pages, args.inbox_limit,
                                     dist=dist, log=log)
    save(args, out)
