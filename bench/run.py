"""Parley's benchmark: real processes on a private Redis, twelve scenarios, one table.

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

Prints a table and writes the figures, the machine, the versions and the settings to
bench/results/latest.json (see bench/README.md for what each figure means).
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from bench import peer
from bench.driver import Producer, Track, read_parked, resume_closed_loop, run_flow
from bench.fleet import Fleet, cpu_seconds, deploy_tuning, machine_busy_seconds
from bench.flood import flood_row
from bench.inbox import QUERIES, listing_rows
from bench.inbox_page import PAGES, page_row
from bench.long_sessions import long_sessions_row
from bench.noop import GO_KEY, NOOP, NOOP_LEAN, READY_KEY
from bench.sessions import QUERY_NAMES as SESSION_QUERIES
from bench.sessions import listing_rows as session_rows
from bench.shards import shards_row
from bench.soak import soak_row
from bench.sweep import backlog_row
from parley.dispatcher.enqueue import RECORD_INFLIGHT
from parley.schemas.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
FLOOR_QUEUE = "bench-floor"
# Issue 21: a parked seed session <= 2.5 KB of Redis used_memory, at P = 10,000 and 100,000
PARKED_MEMORY_GOAL_B = 2_500
PARKED_MEMORY_GOAL_FROM = 10_000


# ---- small helpers ---------------------------------------------------------------------------

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


def redis_server_version() -> str | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    text = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    return next((w[2:] for w in text.split() if w.startswith("v=")), text.strip())


def fsync_probe(directory: Path, n: int = 100) -> dict[str, Any]:
    """What `appendfsync always` pays per write on this disk: 4 KiB append + fsync, n times."""
    path = directory / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            times.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return dist(times)


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    return {"nproc": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "cpu_model": model,
            "mem_total": mem, "platform": platform.platform(), "loadavg_at_start": os.getloadavg()}


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for pkg in ("parley", "rq", "redis", "hiredis", "pydantic", "orjson", "langgraph", "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres", "psycopg"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


# ---- profiling (optional) ----------------------------------------------------------------------

class Profiler:
    """`--profile`: py-spy samples the dispatcher (and a worker) during scenario 1's first row."""

    def __init__(self, pids: dict[str, int], outdir: Path):
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            log("--profile: py-spy not found (pip install py-spy); not profiling")
            return
        for name, pid in pids.items():
            out = outdir / f"profile-{name}.raw"
            self.procs[name] = (subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw",
                                                  "--output", str(out), "--nonblocking", "--rate", "200"],
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)

    def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (proc, path) in self.procs.items():
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if path.exists():
                out[name] = summarize_profile(path)
        return out


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    return {"samples": total, "file": str(path),
            "self": [(f, round(n / total, 3)) for f, n in own.most_common(top)] if total else [],
            "inclusive": [(f, round(n / total, 3)) for f, n in incl.most_common(top + 25)
                          if not any(s in f for s in ("<module>", "runpy", "click/", "cli.py"))][:top]
            if total else []}


def out_of_time(args: argparse.Namespace, what: str) -> str | None:
    """Past the run's time budget, the remaining rows are skipped (and say so) rather than run."""
    if time.monotonic() < args.deadline:
        return None
    why = f"skipped: the run's time budget (--budget {args.budget:.0f} s) was spent"
    log(f"{what}: SKIPPED ({why})")
    return why


# ---- scenario 1 + 2 ------------------------------------------------------------------------------

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
        "latency_ms": {
            "message_to_interrupt_raised": dist([t.raised_at - t.message_ms for t in tracks
                                                 if t.raised_at is not None and t.message_ms is not None]),
            "resume_to_interrupt_resumed": dist([t.resumed_at - t.resume_ms for t in tracks
                                                 if t.resumed_at is not None and t.resume_ms is not None]),
            "session": dist([t.completed_at - t.message_ms for t in tracks
                             if t.completed_at is not None and t.message_ms is not None]),
            "driver_reaction": dist([t.resume_ms - t.raised_at for t in tracks
                                     if t.resume_ms is not None and t.raised_at is not None]),
        },
        "redis_commands_per_session": commands_per_session(commands0, commands1, sessions, reads),
        "driver_reads_per_session": {k: round(v / sessions, 2) for k, v in sorted(reads.items())},
        "redis_usec_per_session": command_usec_per_session(commands0, commands1, sessions, reads),
        "problems": len(problems), "problem_examples": problems[:5],
        "cpu_ms_per_session": {k: round(v * 1000 / sessions, 2) for k, v in used["cpu_s"].items()},
        "usage": used,
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
    skip = ("info", "hello", "client|setinfo")
    calls = {k: v for k, v in calls.items() if v > 0 and k not in skip}
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
    skip = ("info", "hello", "client|setinfo")
    total = sum(v for k, v in usec.items() if v > 0 and k not in skip)
    driver = sum(usec.get(name, 0) * min(1.0, n / calls[name])
                 for name, n in driver_reads.items() if calls.get(name))
    return {"total": round(total / sessions, 1), "driver_reads": round(driver / sessions, 1),
            "driver_share": round(driver / total, 3) if total else None}


def floor(url: str, jobs: int, workers: int, timeout: float, fleet: Fleet | None = None,
          lean: bool = False) -> dict[str, Any]:
    """Scenario 2 on the same redis-server: `jobs` no-op jobs, `workers` floor worker processes.
    `lean`: enqueued with an in-flight record, as Parley's outbox does, and run by workers with
    a worker id, so that ParleyWorker's lean path takes them (bench/noop.py)."""
    r = redis.Redis.from_url(url)
    q = Queue(FLOOR_QUEUE, connection=r, serializer=JSONSerializer)
    keys = Keys()
    r.delete(READY_KEY, GO_KEY)
    for i in range(0, jobs, 500):
        pipe = r.pipeline()
        pipe.multi()
        for j in range(i, min(jobs, i + 500)):
            # the options Parley's outbox gives its jobs (dispatcher/enqueue.py)
            job = Job.create(NOOP_LEAN if lean else NOOP, args=[{"n": j}], connection=r,
                             serializer=JSONSerializer, timeout=30, result_ttl=0,
                             failure_ttl=24 * 3600, description=f"noop {j}")
            q.enqueue_job(job, pipeline=pipe)
            if lean:  # the in-flight record, numbered in its queue, as the outbox writes it
                pipe.eval(RECORD_INFLIGHT, 3, keys.inflight, keys.inflight_order(q.name), keys.stats,
                          job.id, orjson.dumps({
                              "session": f"floor-{j}", "work": f"noop-{j}", "attempt": 1, "kind": "tool",
                              "queue": q.key, "reply_to": keys.results(), "at": int(time.time() * 1000)}))
        pipe.execute()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.noop", url, FLOOR_QUEUE,
                               *([f"floor-worker-{n}"] if lean else [])], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
             for n in range(workers)]
    deadline = time.monotonic() + 60
    while int(r.llen(READY_KEY)) < workers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError("floor workers did not start")
        time.sleep(0.05)
    usage = Usage(fleet)  # the fleet's redis-server (its Parley processes are stopped by now)
    r.rpush(GO_KEY, *[1] * workers)
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        reports.append(orjson.loads(out.splitlines()[-1]))
    used = usage.stop()
    failed = int(r.zcard(f"rq:failed:{FLOOR_QUEUE}"))
    left = int(r.hlen(keys.inflight)) + int(r.hlen(keys.running)) if lean else 0
    r.close()
    seconds = max(x["end"] for x in reports) - min(x["start"] for x in reports)
    ran = sum(x["jobs"] for x in reports)
    return {"jobs": jobs, "ran": ran, "failed": failed, "records_left": left, "workers": workers,
            "path": "lean" if lean else "rq", "wall_s": round(seconds, 2),
            "jobs_per_s": round(ran / seconds, 1), "usage": used}


def scenario_1_2(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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
            # RQ's own path at up to --floor-rq-jobs jobs: a rate of no-op jobs, the same at 2,000
            # as at 8,000, and at ~200 jobs/s on this VM the whole count took 40 s of the run
            row["floor"] = floor(fleet.url, min(row["jobs"], args.floor_rq_jobs), args.workers, args.timeout,
                                 fleet)
            row["floor"]["ratio"] = round(row["jobs_per_s"] / row["floor"]["jobs_per_s"], 3)
            row["floor_lean"] = floor(fleet.url, row["jobs"], args.workers, args.timeout, fleet, lean=True)
            row["floor_lean"]["ratio"] = round(row["jobs_per_s"] / row["floor_lean"]["jobs_per_s"], 3)
            log(f"  floor (RQ's path) {row['floor']['jobs_per_s']} jobs/s, engine/floor = "
                f"{row['floor']['ratio']}; floor (lean path) {row['floor_lean']['jobs_per_s']} jobs/s, "
                f"engine/floor = {row['floor_lean']['ratio']}")
        finally:
            fleet.stop()
        save(args, out)


# ---- scenario 3 ----------------------------------------------------------------------------------

def memory_of(r: Any, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def scenario_3(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    rows = out.setdefault("scenario_3", [])
    for p_size in args.park_sizes:
        why = out_of_time(args, f"scenario 3 (P={p_size})")
        done = [r for r in rows if "skipped" not in r]
        if not why and done:
            # the next P would take about P / (parks/s so far) plus the resumes: skip it if that
            # cannot fit in the budget, rather than overrun it
            need = p_size / done[-1]["parks_per_s"] + done[-1]["resumes"]["wall_s"] + 10
            if time.monotonic() + need > args.deadline:
                why = (f"skipped: would need about {need:.0f} s at {done[-1]['parks_per_s']} parks/s, "
                       f"past the run's time budget (--budget {args.budget:.0f} s)")
                log(f"scenario 3 (P={p_size}): SKIPPED ({why})")
        if why:
            rows.append({"parked": p_size, "skipped": why})
            continue
        log(f"scenario 3: parking {p_size} sessions (appendfsync {args.park_fsync} while parking, "
            f"{args.park_workers} workers), then {min(args.resumes, p_size)} resumes (appendfsync always)")
        fleet = Fleet(workdir / f"s3-{p_size}", appendfsync=args.park_fsync,
                      workers=args.park_workers).start()
        try:
            r = fleet.redis
            producer = Producer(r, fleet.keys, 1, args.idempotency_keys)
            mem0 = r.info("memory")
            keys0 = int(r.dbsize())
            rss0 = fleet.rss()
            tracks = [Track(f"p-{i}") for i in range(p_size)]
            usage = Usage(fleet)
            t0 = time.monotonic()
            producer.send_messages(tracks)
            deadline = t0 + args.timeout * max(1, p_size // 10_000)
            while int(r.zcard(fleet.keys.interrupt_index)) < p_size:
                fleet.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {r.zcard(fleet.keys.interrupt_index)} of {p_size} "
                                       "parked in time")
                time.sleep(0.2)
            park_wall = time.monotonic() - t0
            park_usage = usage.stop()
            fleet.quiesce()
            time.sleep(0.5)  # let the last replies drain from client buffers
            mem1 = r.info("memory")
            keys1 = int(r.dbsize())
            rss1 = fleet.rss()
            one = tracks[0].session
            k = fleet.keys
            per_key = {"meta": memory_of(r, k.meta(one)), "msgs": memory_of(r, k.messages(one)),
                       "events": memory_of(r, k.events(one))}
            if args.idempotency_keys:
                per_key["idem"] = memory_of(r, k.idempotency_keys(one))
            shared = {"interrupts_zset": memory_of(r, k.interrupt_index),
                      "interrupts_info": memory_of(r, k.interrupt_info)}
            per_key["index_share"] = round(sum(shared.values()) / p_size)
            row: dict[str, Any] = {
                "parked": p_size, "park_wall_s": round(park_wall, 2),
                "parks_per_s": round(p_size / park_wall, 1), "park_usage": park_usage,
                "used_memory_delta_per_session": round((mem1["used_memory"] - mem0["used_memory"]) / p_size),
                "used_memory_dataset_delta_per_session": round(
                    (mem1["used_memory_dataset"] - mem0["used_memory_dataset"]) / p_size),
                "keys_per_session": round((keys1 - keys0) / p_size, 2),
                "memory_usage_one_session": {**per_key, "total": sum(per_key.values())},
                "memory_usage_shared_index": shared,
                "used_memory_before": mem0["used_memory"], "used_memory_after": mem1["used_memory"],
                "rss_kib_before": rss0, "rss_kib_after": rss1,
            }
            if args.park_fsync != "always":
                r.config_set("appendfsync", "always")
            n = min(args.resumes, p_size)
            step = p_size / n
            chosen = [tracks[int(i * step)] for i in range(n)]
            read_parked(producer, chosen)
            usage = Usage(fleet)
            wall = resume_closed_loop(producer, chosen, args.resume_concurrency, args.timeout,
                                      fleet.check_alive)
            row["resumes"] = {
                "n": n, "concurrency": args.resume_concurrency, "wall_s": round(wall, 2),
                "per_s": round(n / wall, 1),
                "resume_to_interrupt_resumed_ms": dist(
                    [t.resumed_at - t.resume_ms for t in chosen if t.resumed_at and t.resume_ms]),
                "resume_to_decision_applied_ms": dist(
                    [t.applied_at - t.resume_ms for t in chosen if t.applied_at and t.resume_ms]),
                "resume_to_turn_completed_ms": dist(
                    [t.completed_at - t.resume_ms for t in chosen if t.completed_at and t.resume_ms]),
                "problems": sum(1 for t in chosen if t.problem), "usage": usage.stop(),
            }
            row["rss_kib_after_resumes"] = fleet.rss()
            rows.append(row)
            log(f"  {row['parks_per_s']} parks/s; {row['used_memory_delta_per_session']} B/session; "
                f"resume p50 {row['resumes']['resume_to_interrupt_resumed_ms'].get('p50')} ms")
        finally:
            fleet.stop()
        save(args, out)


# ---- scenario 4 ----------------------------------------------------------------------------------

def scenario_4(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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


# ---- scenario 5 ----------------------------------------------------------------------------------

def peer_row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    n = result["threads"]
    return {"checkpointer": name, "threads": n,
            "park_threads_per_s": round(n / result["park_wall_s"], 1),
            "resume_threads_per_s": round(n / result["resume_wall_s"], 1),
            "park_ms": dist([x * 1000 for x in result["park_s"]]),
            "resume_ms": dist([x * 1000 for x in result["resume_s"]]),
            "row_bytes_per_parked_thread": round(result["row_bytes_per_thread"]),
            "storage_growth_bytes_per_parked_thread": round(result["storage_growth_bytes_per_thread"]),
            "rows_per_parked_thread": result["rows_per_thread"],
            "storage_growth_detail": result["storage_growth_detail"], "settings": result["settings"]}


def scenario_5(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    rows = out.setdefault("scenario_5", [])
    why = out_of_time(args, "scenario 5 (sqlite)")
    if why:
        rows.append({"checkpointer": "sqlite (file)", "skipped": why})
    else:
        log(f"scenario 5: LangGraph + SqliteSaver, {args.lg_threads} threads "
            f"(durability {args.lg_durability})")
        usage = Usage()
        res = peer.sqlite_backend(workdir / "langgraph.sqlite", args.lg_threads, args.lg_durability)
        row = peer_row("sqlite (file)", res)
        row["usage"] = usage.stop()
        rows.append(row)
        save(args, out)
    why = ("skipped (--no-postgres)" if args.no_postgres else peer.postgres_available(args.postgres_url)
           or out_of_time(args, "scenario 5 (postgres)"))
    if why is not None:
        log(f"scenario 5: Postgres row SKIPPED: {why}")
        rows.append({"checkpointer": "postgres", "skipped": why})
    else:
        log(f"scenario 5: LangGraph + PostgresSaver at {args.postgres_url}, {args.lg_threads} threads")
        usage = Usage()
        res = peer.postgres_backend(args.postgres_url, args.lg_threads, args.lg_durability)
        row = peer_row("postgres", res)
        row["usage"] = usage.stop()
        rows.append(row)
    save(args, out)


# ---- scenario 6 ----------------------------------------------------------------------------------

def scenario_6(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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


# ---- scenario 7 ----------------------------------------------------------------------------------

def scenario_7(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    why = out_of_time(args, "scenario 7")
    if why:
        out["scenario_7"] = [{"open": n, "skipped": why} for n in args.inbox_sizes]
        return
    log(f"scenario 7: the inbox listing at {', '.join(ints(args.inbox_sizes))} open interrupts, "
        f"{args.inbox_pages} pages of {args.inbox_limit} per query")
    out["scenario_7"] = listing_rows(workdir / "s7", args.inbox_sizes, args.inbox_pages, args.inbox_limit,
                                     dist=dist, log=log)
    save(args, out)


# ---- scenario 8 ----------------------------------------------------------------------------------

def scenario_8(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    rows = out.setdefault("scenario_8", [])
    why = out_of_time(args, "scenario 8")
    if why:
        rows.append({"sessions": args.soak_sessions, "skipped": why})
        return
    log(f"scenario 8: soak, {args.soak_sessions} sessions run ({args.soak_chunk} at a time), closed "
        f"as idle after {args.soak_idle_timeout} s, expired")
    row = soak_row(workdir / "s8", args.soak_sessions, args.soak_chunk, args.soak_idle_timeout,
                   args.timeout, args.workers, log)
    rows.append(row)
    log(f"  used_memory {row['used_memory_before']:,} -> {row['used_memory_after']:,} "
        f"({row['used_memory_growth_pct']:+.2f} %); their keys left: {row['session_keys_left']}")
    save(args, out)


def scenario_9(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    why = out_of_time(args, "scenario 9")
    if why:
        out["scenario_9"] = [{"sessions": n, "skipped": why} for n in args.list_sizes]
        return
    log(f"scenario 9: the list of sessions at {', '.join(ints(args.list_sizes))} sessions, "
        f"{args.list_pages} pages of {args.list_limit} per filter")
    out["scenario_9"] = session_rows(workdir / "s9", args.list_sizes, args.list_pages, args.list_limit,
                                     dist=dist, log=log)
    save(args, out)


def scenario_10(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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


# ---- scenario 11 ---------------------------------------------------------------------------------

def scenario_11(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    rows = out.setdefault("scenario_11", [])
    for shards in args.shard_counts:
        why = out_of_time(args, f"scenario 11 ({shards} shard(s))")
        if why:
            rows.append({"shards": shards, "skipped": why})
            continue
        log(f"scenario 11: {shards} shard(s), each 1 dispatcher and {args.workers} worker(s), "
            f"{args.shards_partitions} partitions: {args.shards_sessions} seed sessions, then "
            f"{args.shards_parked} parked")
        row = shards_row(workdir / f"s11-{shards}", shards, args.shards_sessions, args.shards_parked,
                         args.workers, args.shards_partitions, args.timeout, args.idempotency_keys)
        rows.append(row)
        log(f"  {row['sessions_per_s']} sessions/s; per shard: " + ", ".join(
            f"#{x['shard']} {x['sessions']} at {x['sessions_per_s']}/s, {x['parked']} parked"
            for x in row["per_shard"]))
        save(args, out)


# ---- scenario 12 ---------------------------------------------------------------------------------

def scenario_12(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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


# ---- scenario 13 ---------------------------------------------------------------------------------

def scenario_13(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
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


# ---- output --------------------------------------------------------------------------------------

def save(args: argparse.Namespace, out: dict[str, Any]) -> None:
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
    tmp.replace(path)


def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    notes = [f"  SKIPPED {' '.join(fmt(c) for c in r[:-1] if c not in ('', 'SKIPPED'))}: {r[-1]}"
             for r in rows if isinstance(r[-1], Why)]
    cells = [[("" if isinstance(c, Why) else fmt(c)) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(["  " + x for x in out] + notes)


def pq(d: dict[str, Any]) -> str:
    """p50/p99 of a distribution, for a table cell."""
    return f"{fmt(d.get('p50'))}/{fmt(d.get('p99'))}"


def p50_p95_max(d: dict[str, Any]) -> str:
    """p50/p95/max of a distribution, for a table cell."""
    return "/".join(fmt(d.get(q)) for q in ("p50", "p95", "max"))


def skipped_row(ident: list[Any], width: int, why: str) -> list[Any]:
    """A table row for a skipped measurement; `table` prints the reason under the table."""
    return [*ident, "SKIPPED", *([""] * (width - len(ident) - 2)), Why(why)]


class Why(str):
    """The reason a row was skipped: printed under its table, not in a cell."""


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def report(out: dict[str, Any]) -> str:
    lines: list[str] = []
    m, v = out["machine"], out["versions"]
    walls = out.get("scenario_wall_s") or {}
    lines.append(f"Parley bench  {out['started_at']}  ({out.get('total_wall_s', '?')} s"
                 + ("; by scenario: " + ", ".join(f"{k}: {t:.0f} s" for k, t in walls.items())
                    if walls else "") + ")")
    lines.append(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total']}; fsync 4 KiB p50 "
                 f"{m['fsync_ms'].get('p50')} ms p99 {m['fsync_ms'].get('p99')} ms; loadavg at start "
                 f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}")
    lines.append(f"versions: python {v['python']}, redis-server {v.get('redis-server')}, rq {v['rq']}, "
                 f"redis-py {v['redis']}, langgraph {v['langgraph']} "
                 f"(sqlite {v['langgraph-checkpoint-sqlite']}, "
                 f"postgres {v['langgraph-checkpoint-postgres']})")
    if out.get("mode") == "smoke":
        lines.append("SMOKE RUN: tiny sizes, the figures mean nothing")
    s1 = out.get("scenario_1", [])
    if s1:
        lines.append("")
        lines.append("1. Seed cycle (message -> llm -> tool.execute -> interrupt -> resume -> tool.result "
                     f"-> llm -> done), all sessions at once, 1 dispatcher, {out['settings']['workers']} "
                     "worker(s), 1 partition; latencies in ms (p50/p99)")
        hdr = ["fsync", "sessions", "wall s", "sess/s", "jobs", "jobs/sess", "jobs/s", "trans/s",
               "msg->raised", "resume->resumed", "session", "problems", "other load"]
        rows = []
        for r in s1:
            if "skipped" in r:
                rows.append(skipped_row([r["appendfsync"]], len(hdr), r["skipped"]))
                continue
            lat = r["latency_ms"]
            rows.append([r["appendfsync"], r["sessions"], r["wall_s"], r["sessions_per_s"], r["jobs"],
                         r["jobs_per_session"], r["jobs_per_s"], r["transitions_per_s"],
                         pq(lat["message_to_interrupt_raised"]), pq(lat["resume_to_interrupt_resumed"]),
                         pq(lat["session"]),
                         r["problems"], f"{r['usage']['other_load_cores']} cores"])
        lines.append(table(hdr, rows))
        for r in s1:
            if "skipped" in r:
                continue
            c = r["cpu_ms_per_session"]
            lines.append(f"  cpu ms/session ({r['appendfsync']}): "
                         + ", ".join(f"{k} {v}" for k, v in c.items() if k != "children_done")
                         + f"; redis commands/session {r['redis_commands_per_session']['total']}"
                         + driver_reads_note(r))
        lines.append("")
        lines.append("2. The floor: as many no-op RQ jobs, same worker class (SimpleWorker), JSONSerializer, "
                     "Redis; RQ's own path and Parley's lean path")
        hdr = ["fsync", "path", "jobs", "workers", "wall s", "floor jobs/s", "engine jobs/s", "engine/floor"]
        lines.append(table(hdr, [[r["appendfsync"], r[k].get("path", "rq"), r[k]["jobs"], r[k]["workers"],
                                  r[k]["wall_s"], r[k]["jobs_per_s"], r["jobs_per_s"],
                                  f"{r[k]['ratio']:.2f}"]
                                 for r in s1 for k in ("floor", "floor_lean") if k in r]))
    s3 = out.get("scenario_3", [])
    if s3:
        lines.append("")
        lines.append("3. Cost of a pause (memory in bytes; RSS in MiB before -> after parking; resume "
                     "latency in ms, p50/p99)")
        hdr = ["parked", "parks/s", "used_memory/sess", "MEMORY USAGE/sess", "keys/sess", "dispatcher RSS",
               "worker RSS", "resumes", "resume->resumed", "resume->applied", "resume->done", "other load"]
        rows = []
        for r in s3:
            if "skipped" in r:
                rows.append(skipped_row([r["parked"]], len(hdr), r["skipped"]))
                continue
            d = [k for k in r["rss_kib_before"] if k.startswith("dispatcher")]
            w = [k for k in r["rss_kib_before"] if k.startswith("worker")]
            rs = r["resumes"]
            rows.append([r["parked"], r["parks_per_s"], r["used_memory_delta_per_session"],
                         r["memory_usage_one_session"]["total"], r["keys_per_session"],
                         " ".join(f"{mib(r['rss_kib_before'][k])}->{mib(r['rss_kib_after'][k])}" for k in d),
                         " ".join(f"{mib(r['rss_kib_before'][k])}->{mib(r['rss_kib_after'][k])}" for k in w),
                         rs["n"],
                         pq(rs["resume_to_interrupt_resumed_ms"]), pq(rs["resume_to_decision_applied_ms"]),
                         pq(rs["resume_to_turn_completed_ms"]),
                         f"{r['park_usage']['other_load_cores']} cores"])
        lines.append(table(hdr, rows))
        for r in s3:
            if "skipped" not in r:
                one = r["memory_usage_one_session"]
                lines.append(f"  MEMORY USAGE of one parked session (P={r['parked']}): "
                             + ", ".join(f"{k} {v}" for k, v in one.items()))
    s4 = out.get("scenario_4", [])
    if s4:
        lines.append("")
        st = out["settings"]
        lines.append(f"4. Scaling ({st['scaling_partitions']} partitions, appendfsync always, "
                     f"{st['scaling_sessions']} sessions per row; latencies in ms, p50/p99)")
        hdr = ["dispatchers", "workers", "sess/s", "jobs/s", "trans/s", "msg->raised", "session", "problems",
               "other load"]
        rows = []
        for r in s4:
            if "skipped" in r:
                rows.append(skipped_row([r["dispatchers"], r["workers"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["dispatchers"], r["workers"], r["sessions_per_s"], r["jobs_per_s"],
                         r["transitions_per_s"], pq(r["latency_ms"]["message_to_interrupt_raised"]),
                         pq(r["latency_ms"]["session"]), r["problems"],
                         f"{r['usage']['other_load_cores']} cores"])
        lines.append(table(hdr, rows))
    s5 = out.get("scenario_5", [])
    if s5:
        lines.append("")
        lines.append("5. The peer: LangGraph, interrupt() before the tool, Command(resume=...); one thread "
                     "at a time in one process (ms, p50/p99)")
        hdr = ["checkpointer", "threads", "park thr/s", "park ms", "resume thr/s", "resume ms",
               "row bytes/thread", "storage bytes/thread"]
        rows = []
        for r in s5:
            if "skipped" in r:
                rows.append(skipped_row([r["checkpointer"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["checkpointer"], r["threads"], r["park_threads_per_s"],
                         pq(r["park_ms"]), r["resume_threads_per_s"], pq(r["resume_ms"]),
                         r["row_bytes_per_parked_thread"], r["storage_growth_bytes_per_parked_thread"]])
        lines.append(table(hdr, rows))
    s6 = out.get("scenario_6", [])
    if s6:
        lines.append("")
        lines.append("6. Sweeps with a backlog: jobs queued, no worker, every sweep due on every tick; "
                     "a concurrent client's PING (ms, p50/p99)")
        hdr = ["queued", "ticks", "sweeps/tick ms", "max ms", "commands/tick", "losses posted", "PING ms",
               "PING max"]
        rows = []
        for r in s6:
            if "skipped" in r:
                rows.append(skipped_row([r["jobs"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["queued"], r["ticks"], pq(r["sweep_ms_per_tick"]), r["max_sweep_ms"],
                         r["redis_commands_per_tick"], f"{r['losses_posted']}/{r['lost_planted']}",
                         pq(r["ping_ms"]), r["ping_ms"].get("max")])
        lines.append(table(hdr, rows))
    s7 = out.get("scenario_7", [])
    if s7:
        lines.append("")
        lines.append("7. The inbox listing: one page (`Client.interrupt_page`, "
                     f"{s7[0].get('limit', '?')} rows) per query, ms p50/p99, and Redis commands per page")
        hdr = ["open", "fill s", *(f"{q} ms" for q in QUERIES), "commands/page"]
        rows = []
        for r in s7:
            if "skipped" in r:
                rows.append(skipped_row([r["open"]], len(hdr), r["skipped"]))
                continue
            per_page = sorted({r[q]["redis_commands_per_page"] for q in QUERIES})
            rows.append([r["open"], r["fill_s"], *(pq(r[q]["page_ms"]) for q in QUERIES),
                         "-".join(fmt(x) for x in (per_page[0], per_page[-1]))])
        lines.append(table(hdr, rows))
    s8 = out.get("scenario_8", [])
    if s8:
        lines.append("")
        lines.append("8. Soak: sessions run to their end (seed flow), closed as idle, archived, expired; "
                     "Redis used_memory (bytes)")
        hdr = ["sessions", "run s", "close+expire s", "problems", "before", "with them", "after", "growth %",
               "their keys left"]
        rows = []
        for r in s8:
            if "skipped" in r:
                rows.append(skipped_row([r["sessions"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["sessions"], r["run_wall_s"], r["close_and_expire_wall_s"], r["problems"],
                         r["used_memory_before"], r["used_memory_run"], r["used_memory_after"],
                         r["used_memory_growth_pct"], r["session_keys_left"]])
        lines.append(table(hdr, rows))
    s9 = out.get("scenario_9", [])
    if s9:
        lines.append("")
        lines.append("9. The list of sessions: one page (`Client.sessions`, "
                     f"{s9[0].get('limit', '?')} rows) per filter, ms p50/p99, and Redis commands per page")
        hdr = ["sessions", "fill s", *(f"{q} ms" for q in SESSION_QUERIES), "commands/page"]
        rows = []
        for r in s9:
            if "skipped" in r:
                rows.append(skipped_row([r["sessions"]], len(hdr), r["skipped"]))
                continue
            per_page = sorted({r[q]["redis_commands_per_page"] for q in SESSION_QUERIES})
            rows.append([r["sessions"], r["fill_s"], *(pq(r[q]["page_ms"]) for q in SESSION_QUERIES),
                         "-".join(fmt(x) for x in (per_page[0], per_page[-1]))])
        lines.append(table(hdr, rows))
    s10 = out.get("scenario_10", [])
    if s10:
        lines.append("")
        lines.append("10. Fairness: a flood of inputs for one session (producer `flood`) while another "
                     "producer sends a message every 50 ms, each to a session of its own; that message's "
                     "delay, entry written -> message.created, ms")
        hdr = ["flood", "inputs", "written", "refused", "write s", "probed s", "flood left", "messages",
               "delay p50/p99", "max"]
        rows = []
        for r in s10:
            if "skipped" in r:
                rows.append(skipped_row([r["mode"], r["inputs"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["mode"], r["inputs"], r.get("written"), r.get("refused"), r.get("write_s"),
                         r["probed_s"], r["flood_left"], r["delay_ms"].get("n", 0), pq(r["delay_ms"]),
                         r["delay_ms"].get("max")])
        lines.append(table(hdr, rows))
    s11 = out.get("scenario_11", [])
    if s11:
        lines.append("")
        lines.append("11. Shards: per shard a redis-server, 1 dispatcher and workers; the seed cycle, all "
                     "sessions at once, then sessions parked and left open (per shard: sessions, sess/s, "
                     "parked, Redis bytes per parked session)")
        hdr = ["shards", "partitions", "procs", "sessions", "wall s", "sess/s", "cpu ms/sess", "other load",
               "problems", "parks/s", "per shard"]
        rows = []
        for r in s11:
            if "skipped" in r:
                rows.append(skipped_row([r["shards"]], len(hdr), r["skipped"]))
                continue
            each = "; ".join(f"#{x['shard']}: {x['sessions']} {fmt(x['sessions_per_s'])}/s "
                             f"{x['parked']} parked {fmt(x['used_memory_per_parked_session'])} B"
                             for x in r["per_shard"])
            rows.append([r["shards"], r["partitions"], r["dispatchers"] + r["workers"], r["sessions"],
                         r["wall_s"], r["sessions_per_s"], r["usage"]["cpu_ms_per_session"],
                         r["usage"]["other_load_cores"], r["problems"],
                         r["parks_per_s"], each])
        lines.append(table(hdr, rows))
    s12 = out.get("scenario_12", [])
    if s12:
        lines.append("")
        lines.append("12. The inbox page: `parley inbox` (a real process), signed in, the list's first "
                     "page as whole HTTP requests, ms p50/p95/max")
        hdr = ["open", "fill s", "rows", "first request ms", *(f"{name} ms" for name in PAGES),
               "inbox RSS MiB"]
        rows = []
        for r in s12:
            if "skipped" in r:
                rows.append(skipped_row([r["open"]], len(hdr), r["skipped"]))
                continue
            rows.append([r["open"], r["fill_s"], r["page_size"], r["first_request_ms"],
                         *(p50_p95_max(r[name]["ms"]) for name in PAGES),
                         mib(r["inbox_rss_kib"])])
        lines.append(table(hdr, rows))
    s13 = out.get("scenario_13", [])
    if s13:
        lines.append("")
        lines.append("13. Long sessions: a branch switch (input to its event, closed loop) and `parley show` "
                     "(in-process), ms p50/p95/max")
        hdr = ["session", "messages", "branches", "build s", "transition ms", "show ms", "msgs hash KiB",
               "meta hash KiB"]
        rows = []
        for r in s13:
            if "skipped" in r:
                rows.append(skipped_row([r["messages"]], len(hdr), r["skipped"]))
                continue
            for name in ("fresh", "long", "branched"):
                x = r[name]
                rows.append([name, x["n_msgs"], x["n_branches"], r["build_s"][name],
                             p50_p95_max(x["transition_ms"]), p50_p95_max(x["show_ms"]),
                             round(x["msgs_hash_bytes"] / 1024, 1), round(x["meta_hash_bytes"] / 1024, 1)])
        lines.append(table(hdr, rows))
    goals = goal_lines(out)
    if goals:
        lines.append("")
        lines.append("Goals, from this run's figures"
                     + (" (SMOKE RUN: tiny sizes, meaningless)" if out.get("mode") == "smoke" else ""))
        lines += goals
    prof = out.get("profile")
    if prof:
        for name, d in prof.items():
            lines.append("")
            lines.append(f"py-spy, {name} during scenario 1 ({d['samples']} samples, idle excluded): "
                         "top self frames, then top inclusive frames")
            lines += [f"  {share:6.1%}  {frame}" for frame, share in d["self"][:6]]
            lines += [f"  {share:6.1%}  {frame}" for frame, share in d["inclusive"][:12]]
    return "\n".join(lines)


def driver_reads_note(r: dict[str, Any]) -> str:
    """The driver's reads next to what they cost Redis (rows from before they were counted: nothing)."""
    usec = r.get("redis_usec_per_session")
    if not usec:
        return ""
    reads = r.get("driver_reads_per_session", {})
    share = usec.get("driver_share")
    return (f"; driver reads/session {sum(reads.values()):.1f} ("
            + ", ".join(f"{k} {v}" for k, v in reads.items())
            + f"), Redis command time/session {usec['total']} us, the driver's reads "
            + (f"{share:.0%}" if share is not None else "-") + " of it")


def cycles_per_s(park_per_s: float, resume_per_s: float) -> float:
    """Whole park + resume cycles per second of a peer that does one phase after the other."""
    return 1 / (1 / park_per_s + 1 / resume_per_s)


def goal_lines(out: dict[str, Any]) -> list[str]:
    """Each goal of the issue that this run has the figures for: measured, target, met or not."""
    lines: list[str] = []

    def say(what: str, measured: str, target: str, met: bool) -> None:
        lines.append(f"    [{'met' if met else 'MISSED'}] {what}: {measured} (goal {target})")

    s1 = {r["appendfsync"]: r for r in out.get("scenario_1", []) if "skipped" not in r}
    s3 = [r for r in out.get("scenario_3", []) if "skipped" not in r]
    peers = {r["checkpointer"]: r for r in out.get("scenario_5", []) if "skipped" not in r}
    row = s1.get("always")

    # Issue 21 (performance, round two), first: each from this run's own figures.
    lines.append("  issue 21:")
    for name, factor in (("sqlite (file)", 2.0), ("postgres", 3.0)):
        peer = peers.get(name)
        if row is None or peer is None:
            continue
        theirs = cycles_per_s(peer["park_threads_per_s"], peer["resume_threads_per_s"])
        ratio = row["sessions_per_s"] / theirs
        say(f"seed cycles/s vs LangGraph+{name.split()[0]}",
            f"{row['sessions_per_s']} vs {theirs:.1f} = {ratio:.2f}x", f">= {factor}x", ratio >= factor)
    if row is not None and "floor_lean" in row:
        say("engine jobs/s vs the lean floor (always)",
            f"{row['jobs_per_s']} vs {row['floor_lean']['jobs_per_s']} = {row['floor_lean']['ratio']:.2f}",
            ">= 0.60", row["floor_lean"]["ratio"] >= 0.60)
    for r in s3:
        if r["parked"] >= PARKED_MEMORY_GOAL_FROM:
            b = r["used_memory_delta_per_session"]
            say(f"Redis used_memory per parked seed session at P = {r['parked']:,}", f"{b:,} B",
                f"<= {PARKED_MEMORY_GOAL_B:,} B", b <= PARKED_MEMORY_GOAL_B)
    if s3:
        top = max(s3, key=lambda r: r["parked"])
        p50 = top["resumes"]["resume_to_decision_applied_ms"].get("p50")
        say(f"resume -> decision applied p50 at P = {top['parked']:,} (the largest P run)", f"{p50} ms",
            "<= 2 ms", p50 is not None and p50 <= 2)
    usec = (row or {}).get("redis_usec_per_session")
    if usec and usec.get("driver_share") is not None:
        say("the driver's reads (the feed, each session's stream at its end) in Redis's command time, "
            "scenario 1 (always)", f"{usec['driver_share']:.1%} ({usec['driver_reads']} of {usec['total']} "
            "us per session)", "not dominating: < 50 %", usec["driver_share"] < 0.5)
    # Scenario 13 (bench/long_sessions.py): long sessions at the cost of a fresh one
    for r in out.get("scenario_13", []):
        if "skipped" in r:
            continue
        for name in ("long", "branched"):
            x = r[name]
            p50, show_p50 = x["transition_ms"].get("p50"), x["show_ms"].get("p50")
            size = f"{x['n_msgs']:,} messages" if name == "long" else f"{x['n_branches']:,} branches"
            say(f"a transition at {size}, p50 (fresh: {r['fresh']['transition_ms'].get('p50')} ms)",
                f"{p50} ms", "<= 2 ms", p50 is not None and p50 <= 2)
            say(f"`parley show` at {size}, p50", f"{show_p50} ms", "<= 50 ms",
                show_p50 is not None and show_p50 <= 50)
    if lines[-1] == "  issue 21:":
        lines.pop()

    lines.append("  earlier:")
    for fsync, r in s1.items():
        for key in ("floor", "floor_lean"):
            if key in r and not (fsync == "always" and key == "floor_lean"):  # issue 21's, above
                say(f"engine/floor ({fsync}, {r[key].get('path', 'rq')} path)", f"{r[key]['ratio']:.2f}",
                    ">= 0.40", r[key]["ratio"] >= 0.40)
    for r in out.get("scenario_10", []):
        p99 = r.get("delay_ms", {}).get("p99")
        if "skipped" not in r and p99 is not None:
            say(f"another session's message delay under a flood ({r['mode']}), p99", f"{p99} ms",
                "<= 1000 ms", p99 <= 1000)
    if s3:
        p99s = [r["resumes"]["resume_to_interrupt_resumed_ms"].get("p99") for r in s3]
        say("resume -> interrupt.resumed p99 at each P", ", ".join(f"{x} ms" for x in p99s), "<= 5 ms",
            all(x is not None and x <= 5 for x in p99s))
        pg = peers.get("postgres")
        if pg is not None:
            theirs_p50 = pg["resume_ms"].get("p50") or 0
            p50s = [r["resumes"]["resume_to_decision_applied_ms"].get("p50") for r in s3]
            say("resume -> decision applied p50 at each P vs LangGraph+Postgres resume p50",
                ", ".join(f"{x} ms" for x in p50s) + f" vs {theirs_p50} ms", "below",
                all(x is not None and x < theirs_p50 for x in p50s))
            half = pg["storage_growth_bytes_per_parked_thread"] / 2
            mem = [r["used_memory_delta_per_session"] for r in s3]
            say("Redis bytes per parked session at each P vs half LangGraph+Postgres storage bytes/thread",
                ", ".join(f"{x:,}" for x in mem) + f" vs {half:,.0f}", "<=", all(x <= half for x in mem))
        growth = [max(r["rss_kib_after"][k] - r["rss_kib_before"][k] for k in r["rss_kib_before"]
                      if k.startswith("dispatcher")) for r in s3]
        each = [f"P={r['parked']:,}: {g / 1024:.1f} MiB" for r, g in zip(s3, growth, strict=True)]
        lines.append("    [see] dispatcher RSS growth while parking at each P: " + ", ".join(each)
                     + " (goal: unchanged by P)")
    for r in out.get("scenario_6", []):
        if "skipped" in r:
            continue
        # every tick, the slowest included: the sweeps run in the dispatcher's main loop
        sweep_max, ping_p99 = r["max_sweep_ms"], r["ping_ms"].get("p99")
        say(f"sweeps per tick, slowest tick, with {r['queued']:,} jobs queued", f"{sweep_max} ms", "<= 10 ms",
            sweep_max is not None and sweep_max <= 10)
        say("a concurrent PING p99 meanwhile", f"{ping_p99} ms", "<= 5 ms",
            ping_p99 is not None and ping_p99 <= 5)
    for r in out.get("scenario_12", []):
        if "skipped" in r:
            continue
        p50 = r["first page"]["ms"].get("p50")
        say(f"the inbox's first page with {r['open']:,} open interrupts, p50", f"{p50} ms", "<= 200 ms",
            p50 is not None and p50 <= 200)
    for r in out.get("scenario_8", []):
        if "skipped" in r:
            continue
        say(f"soak: used_memory after {r['sessions']:,} sessions closed and expired",
            f"{r['used_memory_growth_pct']:+.2f} %", "within 5 %", abs(r["used_memory_growth_pct"]) <= 5)
        say("soak: keys of theirs left", str(r["session_keys_left"]), "0", r["session_keys_left"] == 0)
    if lines[-1] == "  earlier:":
        lines.pop()
    return lines


# ---- main ----------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: every scenario, under a minute")
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8,9,10,11,12,13",
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
    ap.add_argument("--no-idempotency-keys", dest="idempotency_keys", action="store_false",
                    help="send inputs without an `id` (no idempotency keys in Redis)")
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
    ap.add_argument("--timeout", type=float, default=300, help="seconds any one phase may take")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds after which the remaining rows are skipped (marked SKIPPED)")
    ap.add_argument("--profile", action="store_true", help="py-spy the dispatcher and a worker in scenario 1")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, AOF files)")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/latest.json, "
                    "smoke: bench/results/smoke.json)")
    args = ap.parse_args(argv)
    if args.smoke:
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
        args.budget = max(args.budget, 600)
    args.out = args.out or str(RESULTS / ("smoke.json" if args.smoke else "latest.json"))
    args.fsync_rows = [x.strip() for x in args.fsync_rows.split(",") if x.strip()]
    args.park_sizes = parse_ints(args.park_sizes) + ([100_000] if args.park_100k else [])
    args.scaling_dispatchers = parse_ints(args.scaling_dispatchers)
    args.scaling_workers = parse_ints(args.scaling_workers)
    args.inbox_sizes = parse_ints(args.inbox_sizes)
    args.list_sizes = parse_ints(args.list_sizes)
    args.shard_counts = parse_ints(args.shard_counts)
    args.only = set(args.only.split(","))
    return args


def timed(name: str, scenario: Any, args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Run one scenario and record its wall seconds (`scenario_wall_s`): what each costs of the
    run's 10 minutes."""
    t0 = time.monotonic()
    try:
        scenario(args, workdir, out)
    finally:
        out.setdefault("scenario_wall_s", {})[name] = round(time.monotonic() - t0, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if shutil.which("redis-server") is None:
        print("redis-server is missing: apt-get install redis-server", file=sys.stderr)
        return 2
    started = time.monotonic()
    args.deadline = started + args.budget
    workdir = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    settings = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items() if k != "deadline"}
    settings["redis_server_args"] = {"appendonly": "yes", "save": "", "appendfsync": "per row (see each row)",
                                     **deploy_tuning(),
                                     "other": "redis-server defaults (parley.procs.RedisServer)"}
    out: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "mode": "smoke" if args.smoke else "full", "settings": settings,
                           "machine": {**machine_info(), "fsync_ms": fsync_probe(workdir)},
                           "versions": {**versions(), "redis-server": redis_server_version()}}
    ok = False
    try:
        if "1" in args.only or "2" in args.only:
            timed("1+2", scenario_1_2, args, workdir, out)
        # the peer before 3 and 4: it is short, and 4's rows are the ones to give up if time runs out
        if "5" in args.only:
            timed("5", scenario_5, args, workdir, out)
        if "3" in args.only:
            timed("3", scenario_3, args, workdir, out)
        # before 4: short, and 4's rows are the ones to give up if time runs out
        if "6" in args.only:
            timed("6", scenario_6, args, workdir, out)
        if "7" in args.only:
            timed("7", scenario_7, args, workdir, out)
        # before 4 too: the soak is the lifecycle's one check of memory over a whole life
        if "8" in args.only:
            timed("8", scenario_8, args, workdir, out)
        if "9" in args.only:
            timed("9", scenario_9, args, workdir, out)
        if "10" in args.only:
            timed("10", scenario_10, args, workdir, out)
        if "11" in args.only:
            timed("11", scenario_11, args, workdir, out)
        # before 4 too: short (about 10 s), and it has a goal
        if "12" in args.only:
            timed("12", scenario_12, args, workdir, out)
        # before 4 too: it has goals
        if "13" in args.only:
            timed("13", scenario_13, args, workdir, out)
        if "4" in args.only:
            timed("4", scenario_4, args, workdir, out)
        ok = True
    finally:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
