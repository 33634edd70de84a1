"""Scenario 10, fairness under a flood: one session flooded with inputs by one producer while
another producer's sessions send messages; the delay of those messages (bench/flood.py). Two
rows: the flood straight to the stream, and through the submit function."""

import argparse
from pathlib import Path
from typing import Any

from bench.common import dist, log, out_of_time
from bench.flood import flood_row
from bench.report import save


def flood_fairness(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 10: `out["scenario_10"]`, one row per way of flooding."""
    rows = out.setdefault("scenario_10", [])
    for submit in (False, True):
        mode = "submit function" if submit else "straight to the stream"
        why = out_of_time(args, f"scenario 10 ({mode})")
        if why:
            rows.append({"mode": mode, "inputs": args.flood_inputs, "skipped": why})
            continue
        log(f"scenario 10: {args.flood_inputs} inputs for one session ({mode}) while another "
            "producer's sessions send messages")
        rows.append(flood_row(workdir / f"s10-{'submit' if submit else 'straight'}", args.flood_inputs,
                              submit, args.timeout, dist=dist, log=log, window_s=args.flood_window))
        save(args, out)
