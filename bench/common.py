"""What every scenario uses: the log line, distributions, the CPU a measurement cost and the
run's time budget."""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.fleet import Fleet, cpu_seconds, machine_busy_seconds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist(values: list[float]) -> dict[str, Any]:
    """p50/p90/p99/max/mean of milliseconds."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 0.5), 2),
            "p90": round(percentile(values, 0.9), 2), "p99": round(percentile(values, 0.99), 2),
            "max": round(max(values), 2),
            "mean": round(sum(values) / len(values), 2)}


def ints(values: list[int]) -> list[str]:
    return [str(v) for v in values]


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Usage:
    """CPU seconds of our processes and of the whole machine over a measurement, to report what
    the measured system cost and how much of the machine something else was using meanwhile."""

    def __init__(self, fleet: Fleet | None = None):
        self.fleet = fleet
        self.t0 = time.monotonic()
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.fleet is not None:
            out = {k: v for k, v in self.fleet.cpu().items() if v is not None}
        else:
            out["driver"] = cpu_seconds() or 0.0
            out["machine"] = machine_busy_seconds()
        t = os.times()
        out["children_done"] = t.children_user + t.children_system
        return out

    def stop(self) -> dict[str, Any]:
        end = self._read()
        wall = time.monotonic() - self.t0
        delta = {k: round(end[k] - self.start.get(k, 0.0), 2) for k in end}
        ours = sum(v for k, v in delta.items() if k != "machine")
        other = max(0.0, delta["machine"] - ours)
        return {"cpu_s": {k: v for k, v in delta.items() if k not in ("machine", "children_done")
                          or (k == "children_done" and v)},
                "machine_busy_s": delta["machine"], "wall_s": round(wall, 2),
                "other_load_cores": round(other / wall, 2) if wall > 0 else 0.0}


def out_of_time(args: argparse.Namespace, what: str) -> str | None:
    """Past the run's time budget, the remaining rows are skipped (and say so) rather than run."""
    if time.monotonic() < args.deadline:
        return None
    why = f"skipped: the run's time budget (--budget {args.budget:.0f} s) was spent"
    log(f"{what}: SKIPPED ({why})")
    return why

