"""Parley's benchmark: real processes on a private Redis, fourteen scenarios, one table.

    python -m bench.run            (make bench: default sizes, 6-9 minutes on 2 cores)
    python -m bench.run --smoke    (make bench-smoke: every scenario, tiny, under a minute)

1. Seed cycle throughput (appendfsync always, plus one row with everysec)
2. The floor: as many no-op RQ jobs as scenario 1 ran, same worker class, serializer, Redis
3. Cost of a pause: Redis memory and process RSS per parked session, resume latency at P
4. Scaling: dispatchers x worker processes
5. The peer: the same flow in LangGraph with its SQLite and Postgres checkpointers
6. Sweeps with a backlog: the dispatcher's sweeps per tick with 50,000 jobs queued and no worker,
   and a concurrent client's PING
7. The inbox listing: a page of `parley interrupts` (each filter) at 1,000 / 10,000 / 100,000
   open interrupts
8. The soak: 10,000 sessions run to their end, closed (idle) and expired: Redis memory before
   and after, and their keys left
9. The list of sessions: a page of `parley sessions` (each filter) at 1,000 / 100,000 sessions
10. Fairness: 20,000 inputs for one session from one producer, and another session's messages
   from another producer: their delay (straight to the stream, and through the submit function)
11. Shards: the seed cycle on 1 shard and on 2 (each shard its own redis-server, dispatcher and
   workers), sessions/s in all and per shard, then sessions parked and left open, per shard
12. The inbox page: `parley inbox` with 10,000 open interrupts, signed in; the list's first page
   (oldest first, newest first, "answerable by me") as whole HTTP requests
13. Long sessions: a transition (a branch switch) and `parley show` on a session of 3,000
   messages of ~4 KB, on one of 1,000 branches, and on a fresh one
14. The inbox listing at many shards: a page of `Client.interrupt_page` (each filter of 7) with
   the same 10,000 open interrupts on 1, 4 and 16 shards (the client reads every shard at once)

Prints a table and writes the figures, the machine, the versions and the settings to
bench/results/latest.json (see bench/README.md for what each figure means). This module only
reads the command line and runs the scenarios in order: each is a module of bench/scenarios/,
the table and the JSON are bench/report.py's, the goals under the table bench/goals.py's.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import peer
from bench.common import RESULTS, log, parse_ints
from bench.fleet import deploy_tuning
from bench.machine import fsync_probe, machine_info, versions
from bench.report import report, save
from bench.scenarios.flood import flood_fairness
from bench.scenarios.inbox_listing import inbox_listing
from bench.scenarios.inbox_page import inbox_page
from bench.scenarios.langgraph_peer import langgraph_peer
from bench.scenarios.long_sessions import long_sessions
from bench.scenarios.parked_memory import parked_memory
from bench.scenarios.scaling import scaling
from bench.scenarios.seed_cycle import seed_cycle_and_floor
from bench.scenarios.session_list import session_list
from bench.scenarios.shard_listing import shard_listing
from bench.scenarios.shards import shards
from bench.scenarios.soak import soak
from bench.scenarios.sweeps import sweeps_with_backlog

Scenario = Callable[[argparse.Namespace, Path, dict[str, Any]], None]

# The order the scenarios run in: (its name in `scenario_wall_s`, the `--only` numbers that run
# it, the scenario). The table prints them by number whatever this order.
RUN_ORDER: tuple[tuple[str, tuple[str, ...], Scenario], ...] = (
    ("1+2", ("1", "2"), seed_cycle_and_floor),
    # the peer before 3 and 4: it is short, and 4's rows are the ones to give up if time runs out
    ("5", ("5",), langgraph_peer),
    ("3", ("3",), parked_memory),
    # before 4: short, and 4's rows are the ones to give up if time runs out
    ("6", ("6",), sweeps_with_backlog),
    ("7", ("7",), inbox_listing),
    # before 4 too: the soak is the lifecycle's one check of memory over a whole life
    ("8", ("8",), soak),
    ("9", ("9",), session_list),
    ("10", ("10",), flood_fairness),
    ("11", ("11",), shards),
    # before 4 too: short (about 10 s), and it has a goal
    ("12", ("12",), inbox_page),
    # before 4 too: it has goals
    ("13", ("13",), long_sessions),
    # before 4 too: short (about 15 s)
    ("14", ("14",), shard_listing),
    ("4", ("4",), scaling),
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line: every size and switch (`--help`), `--smoke`'s tiny sizes, the lists
    parsed."""
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_cycle_options(ap)
    add_other_options(ap)
    add_run_options(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        smoke_sizes(args)
    args.out = args.out or str(RESULTS / ("smoke.json" if args.smoke else "latest.json"))
    args.fsync_rows = [x.strip() for x in args.fsync_rows.split(",") if x.strip()]
    args.park_sizes = parse_ints(args.park_sizes) + ([100_000] if args.park_100k else [])
    args.scaling_dispatchers = parse_ints(args.scaling_dispatchers)
    args.scaling_workers = parse_ints(args.scaling_workers)
    args.inbox_sizes = parse_ints(args.inbox_sizes)
    args.list_sizes = parse_ints(args.list_sizes)
    args.shard_counts = parse_ints(args.shard_counts)
    args.listing_shard_counts = parse_ints(args.listing_shard_counts)
    if any(not 1 <= n <= args.listing_shard_partitions for n in args.listing_shard_counts):
        ap.error(f"--listing-shard-counts: each 1 to --listing-shard-partitions "
                 f"({args.listing_shard_partitions}), not {args.listing_shard_counts}")
    args.only = set(args.only.split(","))
    return args


def add_cycle_options(ap: argparse.ArgumentParser) -> None:
    """Which scenarios, and the sizes of scenarios 1 to 5 (the seed cycle, its floor, the pause,
    scaling, the peer)."""
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: every scenario, under a minute")
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8,9,10,11,12,13,14",
                    help="scenarios to run (2 runs with 1)")
    ap.add_argument("--sessions", type=int, default=2000, help="scenario 1 sessions per row")
    ap.add_argument("--workers", type=int, default=2, help="scenario 1 (and floor) worker processes")
    ap.add_argument("--fsync-rows", default="always,everysec", help="scenario 1 rows' appendfsync")
    ap.add_argument("--floor-rq-jobs", type=int, default=2000,
                    help="scenario 2: at most this many jobs on RQ's own path (the lean floor runs "
                    "as many as scenario 1 did)")
    ap.add_argument("--park-sizes", default="1000,10000", help="scenario 3 P values")
    ap.add_argument("--park-100k", action="store_true", help="add P = 100,000 to scenario 3")
    ap.add_argument("--park-fsync", default="everysec",
                    help="appendfsync while parking (resumes always run with always)")
    ap.add_argument("--park-workers", type=int, default=2, help="scenario 3 worker processes")
    ap.add_argument("--resumes", type=int, default=500, help="scenario 3 resumes measured at each P")
    ap.add_argument("--resume-concurrency", type=int, default=1, help="scenario 3 resumes in flight")
    ap.add_argument("--scaling-sessions", type=int, default=500, help="scenario 4 sessions per row")
    ap.add_argument("--scaling-dispatchers", default="1,2")
    ap.add_argument("--scaling-workers", default="1,2,4")
    ap.add_argument("--scaling-partitions", type=int, default=2)
    ap.add_argument("--lg-threads", type=int, default=500, help="scenario 5 threads per checkpointer")
    ap.add_argument("--lg-durability", default="sync", choices=["sync", "async", "exit"])
    ap.add_argument("--postgres-url", default=peer.POSTGRES_URL)
    ap.add_argument("--no-postgres", action="store_true", help="skip the Postgres row of scenario 5")
    ap.add_argument("--no-dbos", action="store_true", help="skip the DBOS row of scenario 5")
    ap.add_argument("--no-restate", action="store_true", help="skip the Restate row of scenario 5")
    ap.add_argument("--no-idempotency-keys", dest="idempotency_keys", action="store_false",
                    help="send inputs without an `id` (no idempotency keys in Redis)")


def add_other_options(ap: argparse.ArgumentParser) -> None:
    """The sizes of scenarios 6 to 14."""
    ap.add_argument("--backlog-jobs", type=int, default=50_000, help="scenario 6 jobs queued")
    ap.add_argument("--backlog-ticks", type=int, default=500, help="scenario 6 ticks measured")
    ap.add_argument("--backlog-lost", type=int, default=250,
                    help="scenario 6 jobs popped by workers that died before recording them")
    ap.add_argument("--inbox-sizes", default="1000,10000,100000", help="scenario 7 open interrupts")
    ap.add_argument("--inbox-pages", type=int, default=100, help="scenario 7 pages walked per query")
    ap.add_argument("--inbox-limit", type=int, default=50, help="scenario 7 rows per page")
    ap.add_argument("--soak-sessions", type=int, default=5_000, help="scenario 8 sessions")
    ap.add_argument("--soak-chunk", type=int, default=1000, help="scenario 8 sessions run at a time")
    ap.add_argument("--soak-idle-timeout", type=int, default=20,
                    help="scenario 8 dispatcher's --idle-timeout: how sessions get closed")
    ap.add_argument("--list-sizes", default="1000,100000", help="scenario 9 sessions listed")
    ap.add_argument("--list-pages", type=int, default=100, help="scenario 9 pages walked per filter")
    ap.add_argument("--list-limit", type=int, default=50, help="scenario 9 rows per page")
    ap.add_argument("--flood-inputs", type=int, default=20_000,
                    help="scenario 10 inputs of the flooded session")
    ap.add_argument("--flood-window", type=float, default=15.0,
                    help="scenario 10 seconds the other producer's messages are sent (at most)")
    ap.add_argument("--shard-counts", default="1,2", help="scenario 11 rows: shards in each")
    ap.add_argument("--shards-sessions", type=int, default=1000, help="scenario 11 seed sessions per row")
    ap.add_argument("--shards-parked", type=int, default=1000,
                    help="scenario 11 sessions parked and left open per row")
    ap.add_argument("--shards-partitions", type=int, default=16,
                    help="scenario 11 partitions, the same in every row (16: the default of shards)")
    ap.add_argument("--page-open", type=int, default=10_000, help="scenario 12 open interrupts")
    ap.add_argument("--page-requests", type=int, default=50, help="scenario 12 requests of each page")
    ap.add_argument("--long-messages", type=int, default=3_000, help="scenario 13 long session's messages")
    ap.add_argument("--long-branches", type=int, default=1_000, help="scenario 13 branches")
    ap.add_argument("--long-transitions", type=int, default=200, help="scenario 13 branch switches each")
    ap.add_argument("--long-shows", type=int, default=10, help="scenario 13 `parley show` runs per session")
    ap.add_argument("--listing-shard-counts", default="1,4,16", help="scenario 14 rows: shards in each")
    ap.add_argument("--listing-shard-open", type=int, default=10_000,
                    help="scenario 14 open interrupts, the same in every row")
    ap.add_argument("--listing-shard-partitions", type=int, default=64,
                    help="scenario 14 partitions placed over the shards (p mod S)")
    ap.add_argument("--listing-shard-pages", type=int, default=100, help="scenario 14 pages walked per query")
    ap.add_argument("--listing-shard-limit", type=int, default=50, help="scenario 14 rows per page")


def add_run_options(ap: argparse.ArgumentParser) -> None:
    """The run's own: time limits, profiling, the work directory, the output."""
    ap.add_argument("--timeout", type=float, default=300, help="seconds any one phase may take")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds after which the remaining rows are skipped (marked SKIPPED)")
    ap.add_argument("--profile", action="store_true", help="py-spy the dispatcher and a worker in scenario 1")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, AOF files)")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/latest.json, "
                    "smoke: bench/results/smoke.json)")


def smoke_sizes(args: argparse.Namespace) -> None:
    """`--smoke`: every scenario at tiny sizes, under a minute; the figures mean nothing."""
    args.sessions, args.park_sizes, args.resumes = 20, "50", 20
    args.scaling_sessions, args.lg_threads, args.timeout = 10, 20, 120
    args.backlog_jobs, args.backlog_ticks, args.backlog_lost = 500, 20, 5
    args.inbox_sizes, args.inbox_pages = "100,300", 5
    args.soak_sessions, args.soak_chunk, args.soak_idle_timeout = 200, 100, 3
    args.list_sizes, args.list_pages = "100,300", 5
    args.flood_inputs, args.flood_window = 500, 5.0
    args.shards_sessions, args.shards_parked, args.shards_partitions = 20, 20, 4
    args.page_open, args.page_requests = 300, 5
    args.long_messages, args.long_branches, args.long_transitions, args.long_shows = 200, 50, 20, 3
    args.listing_shard_counts, args.listing_shard_open, args.listing_shard_pages = "1,4", 200, 5
    args.budget = max(args.budget, 600)


def timed(name: str, scenario: Scenario, args: argparse.Namespace, workdir: Path,
          out: dict[str, Any]) -> None:
    """Run one scenario and record its wall seconds (`scenario_wall_s`): what each costs of the
    run's 10 minutes."""
    t0 = time.monotonic()
    try:
        scenario(args, workdir, out)
    finally:
        out.setdefault("scenario_wall_s", {})[name] = round(time.monotonic() - t0, 1)


def header(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The results JSON before any scenario: when, which mode, every setting, the machine, the
    versions."""
    settings = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items() if k != "deadline"}
    settings["redis_server_args"] = {"appendonly": "yes", "save": "", "appendfsync": "per row (see each row)",
                                     **deploy_tuning(),
                                     "other": "redis-server defaults (parley.procs.RedisServer)"}
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "mode": "smoke" if args.smoke else "full", "settings": settings,
            "machine": {**machine_info(), "fsync_ms": fsync_probe(workdir)},
            "versions": versions()}


def finish(args: argparse.Namespace, workdir: Path, out: dict[str, Any], started: float, ok: bool) -> None:
    """Whatever happened: the JSON written (`complete` says whether every scenario ran), the work
    directory removed unless kept or failed, the report printed."""
    out["total_wall_s"] = round(time.monotonic() - started, 1)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    out["complete"] = ok
    save(args, out)
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log(f"work directory (logs, AOF): {workdir}")
    try:
        print(report(out))
    except Exception as exc:  # a partial run's report must not hide the run's own error
        log(f"could not print the report: {exc!r}")
    print(f"\n{'wrote' if ok else 'INCOMPLETE RUN: wrote partial results to'} {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if shutil.which("redis-server") is None:
        print("redis-server is missing: apt-get install redis-server", file=sys.stderr)
        return 2
    started = time.monotonic()
    args.deadline = started + args.budget
    workdir = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    out = header(args, workdir)
    ok = False
    try:
        for name, numbers, scenario in RUN_ORDER:
            if any(n in args.only for n in numbers):
                timed(name, scenario, args, workdir, out)
        ok = True
    finally:
        finish(args, workdir, out, started, ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
