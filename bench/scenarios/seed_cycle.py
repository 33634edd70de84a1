"""Scenario 1, seed cycle throughput: N seed sessions sent at once to 1 dispatcher and
`--workers` workers, one row per `--fsync-rows` appendfsync; each row followed by its floors
(scenario 2, bench/scenarios/rq_floor.py) on the same redis-server. `flow_row` is the one
measurement of a seed cycle on a started fleet; scenario 4 (scaling) uses it too."""

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Usage, dist, log, out_of_time
from bench.driver import Producer, Track, run_flow
from bench.fleet import Fleet
from bench.profiler import Profiler
from bench.report import save
from bench.scenarios.rq_floor import add_floors

# INFO commandstats entries that are the measuring's own, not the engine's
NOT_THE_ENGINES = ("info", "hello", "client|setinfo")


def seed_cycle_and_floor(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenarios 1 and 2: `out["scenario_1"]`, one row per appendfsync, its floors inside it."""
    rows = out.setdefault("scenario_1", [])
    for fsync in args.fsync_rows:
        why = out_of_time(args, f"scenario 1 ({fsync})")
        if why:
            rows.append({"appendfsync": fsync, "skipped": why})
            continue
        log(f"scenario 1: {args.sessions} sessions, appendfsync {fsync}, 1 dispatcher, "
            f"{args.workers} worker(s)")
        fleet = Fleet(workdir / f"s1-{fsync}", appendfsync=fsync, workers=args.workers).start()
        try:
            profiler = None
            if args.profile:
                pids = {f"dispatcher-{fsync}": fleet.dispatcher_procs()[0].pid,
                        f"worker-{fsync}": fleet.worker_procs()[0].pid}
                profiler = Profiler(pids, workdir)
            row = flow_row(fleet, args.sessions, args.timeout, args.idempotency_keys, f"s1{fsync[0]}")
            if profiler is not None:
                out.setdefault("profile", {}).update(profiler.stop())
            row["appendfsync"] = fsync
            row["rss_kib_after"] = fleet.rss()
            rows.append(row)
            log(f"  {row['sessions_per_s']} sessions/s, {row['jobs_per_s']} jobs/s ({row['jobs']} jobs); "
                f"floors next: {min(row['jobs'], args.floor_rq_jobs)} no-op jobs on RQ's path, "
                f"{row['jobs']} on the lean path")
            fleet.stop_parley()
            add_floors(fleet, row, args)
        finally:
            fleet.stop()
        save(args, out)


def flow_row(fleet: Fleet, sessions: int, timeout: float, idem: bool, tag: str) -> dict[str, Any]:
    """Scenario 1's measurement on a started fleet."""
    producer = Producer(fleet.redis, fleet.keys, fleet.partitions, idem)
    tracks = [Track(f"{tag}-{i}") for i in range(sessions)]
    before = fleet.counters()
    commands0 = fleet.redis.info("commandstats")
    usage = Usage(fleet)
    wall = run_flow(producer, tracks, timeout, fleet.check_alive)
    used = usage.stop()
    commands1 = fleet.redis.info("commandstats")
    reads = producer.read_counts()
    after = fleet.counters()
    delta = {k: after[k] - before[k] for k in after}
    problems = [f"{t.session}: {t.problem}" for t in tracks if t.problem]
    jobs = int(delta["jobs"])
    return {
        "sessions": sessions, "wall_s": round(wall, 2),
        "sessions_per_s": round(sessions / wall, 1), "jobs": jobs, "jobs_per_s": round(jobs / wall, 1),
        "jobs_per_session": round(jobs / sessions, 2),
        "jobs_by_kind": {k[5:]: int(v) for k, v in delta.items() if k.startswith("jobs_") and v},
        "transitions": int(delta["transitions"]), "transitions_per_s": round(delta["transitions"] / wall, 1),
        "latency_ms": latencies(tracks),
        "redis_commands_per_session": commands_per_session(commands0, commands1, sessions, reads),
        "driver_reads_per_session": {k: round(v / sessions, 2) for k, v in sorted(reads.items())},
        "redis_usec_per_session": command_usec_per_session(commands0, commands1, sessions, reads),
        "problems": len(problems), "problem_examples": problems[:5],
        "cpu_ms_per_session": {k: round(v * 1000 / sessions, 2) for k, v in used["cpu_s"].items()},
        "usage": used,
    }


def latencies(tracks: list[Track]) -> dict[str, Any]:
    """The row's latency distributions (ms): each input's entry id time to its event's `at`."""
    return {
        "message_to_interrupt_raised": dist([t.raised_at - t.message_ms for t in tracks
                                             if t.raised_at is not None and t.message_ms is not None]),
        "resume_to_interrupt_resumed": dist([t.resumed_at - t.resume_ms for t in tracks
                                             if t.resumed_at is not None and t.resume_ms is not None]),
        "session": dist([t.completed_at - t.message_ms for t in tracks
                         if t.completed_at is not None and t.message_ms is not None]),
        "driver_reaction": dist([t.resume_ms - t.raised_at for t in tracks
                                 if t.resume_ms is not None and t.raised_at is not None]),
    }


def command_deltas(before: dict[str, Any], after: dict[str, Any], field: str) -> dict[str, int]:
    """INFO commandstats `field` (calls, usec) of each command over a measurement."""
    return {k.removeprefix("cmdstat_"): int(v[field]) - int(before.get(k, {}).get(field, 0))
            for k, v in after.items()}


def commands_per_session(before: dict[str, Any], after: dict[str, Any], sessions: int,
                         driver_reads: Counter[str] | None = None) -> dict[str, Any]:
    """Redis commands the run cost per session, from INFO commandstats, without the driver's
    reads (counted by the driver as it sends them: the feed's XREADs, the XRANGE of each session
    at its end...); the driver's own XADDs (2 per session) are included. MULTI/EXEC and the
    commands inside a script (EVALSHA) are counted as Redis counts them."""
    calls = command_deltas(before, after, "calls")
    for name, n in (driver_reads or Counter()).items():
        calls[name] = calls.get(name, 0) - n
    calls = {k: v for k, v in calls.items() if v > 0 and k not in NOT_THE_ENGINES}
    total = sum(calls.values())
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:12]
    return {"total": round(total / sessions, 1), "top": {k: round(v / sessions, 2) for k, v in top}}


def command_usec_per_session(before: dict[str, Any], after: dict[str, Any], sessions: int,
                             driver_reads: Counter[str]) -> dict[str, Any]:
    """Redis's own command time per session (INFO commandstats usec: time inside commands, not
    I/O), all of it, and the driver's reads' part of it. A command the engine sends too (XRANGE)
    counts for the driver in proportion to the driver's share of its calls."""
    usec = command_deltas(before, after, "usec")
    calls = command_deltas(before, after, "calls")
    total = sum(v for k, v in usec.items() if v > 0 and k not in NOT_THE_ENGINES)
    driver = sum(usec.get(name, 0) * min(1.0, n / calls[name])
                 for name, n in driver_reads.items() if calls.get(name))
    return {"total": round(total / sessions, 1), "driver_reads": round(driver / sessions, 1),
            "driver_share": round(driver / total, 3) if total else None}
