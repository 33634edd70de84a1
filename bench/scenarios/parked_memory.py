"""Scenario 3, the cost of a pause: for each P (`--park-sizes`), a fresh fleet parks P seed
sessions on their interrupt and goes idle; then Redis memory per parked session (used_memory,
MEMORY USAGE of one session's keys), keys per session and each process's RSS; then
`--resumes` of them resumed closed-loop under appendfsync always, timed to the resumed
transition, to the decision applied and to the turn's end."""

import argparse
import time
from pathlib import Path
from typing import Any

from bench.bytes import bytes_table
from bench.common import Usage, dist, log, out_of_time
from bench.driver import Producer, Track, read_parked, resume_closed_loop
from bench.fleet import Fleet
from bench.report import save


def parked_memory(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 3: `out["scenario_3"]`, one row per P."""
    rows = out.setdefault("scenario_3", [])
    for p_size in args.park_sizes:
        why = out_of_time(args, f"scenario 3 (P={p_size})") or no_time_for(args, rows, p_size)
        if why:
            rows.append({"parked": p_size, "skipped": why})
            continue
        log(f"scenario 3: parking {p_size} sessions (appendfsync {args.park_fsync} while parking, "
            f"{args.park_workers} workers), then {min(args.resumes, p_size)} resumes (appendfsync always)")
        fleet = Fleet(workdir / f"s3-{p_size}", appendfsync=args.park_fsync,
                      workers=args.park_workers).start()
        try:
            producer = Producer(fleet.redis, fleet.keys, 1, args.idempotency_keys)
            tracks = [Track(f"p-{i}") for i in range(p_size)]
            row = park(fleet, producer, tracks, args)
            if args.park_fsync != "always":
                fleet.redis.config_set("appendfsync", "always")
            row["resumes"] = resume_some(fleet, producer, tracks, args)
            row["rss_kib_after_resumes"] = fleet.rss()
            rows.append(row)
            log(f"  {row['parks_per_s']} parks/s; {row['used_memory_delta_per_session']} B/session; "
                f"resume p50 {row['resumes']['resume_to_interrupt_resumed_ms'].get('p50')} ms")
        finally:
            fleet.stop()
        save(args, out)


def no_time_for(args: argparse.Namespace, rows: list[dict[str, Any]], p_size: int) -> str | None:
    """The next P would take about P / (parks/s so far) plus the resumes: skipped if that cannot
    fit in the budget, rather than overrun it."""
    done = [r for r in rows if "skipped" not in r]
    if not done:
        return None
    need = p_size / done[-1]["parks_per_s"] + done[-1]["resumes"]["wall_s"] + 10
    if time.monotonic() + need <= args.deadline:
        return None
    why = (f"skipped: would need about {need:.0f} s at {done[-1]['parks_per_s']} parks/s, "
           f"past the run's time budget (--budget {args.budget:.0f} s)")
    log(f"scenario 3 (P={p_size}): SKIPPED ({why})")
    return why


def park(fleet: Fleet, producer: Producer, tracks: list[Track], args: argparse.Namespace) -> dict[str, Any]:
    """Send every session's message, wait until all are parked and the fleet idle: the row's
    parking rate, memory, keys and RSS."""
    r, p_size = fleet.redis, len(tracks)
    mem0 = r.info("memory")
    keys0 = int(r.dbsize())
    rss0 = fleet.rss()
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
    per_key, shared = memory_of_one(fleet, tracks[0].session, p_size, args.idempotency_keys)
    growth = round((mem1["used_memory"] - mem0["used_memory"]) / p_size)
    return {
        "bytes_table": bytes_table(r, fleet.keys, tracks[0].session, p_size, growth),
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


def memory_of(r: Any, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def memory_of_one(fleet: Fleet, one: str, p_size: int, idem: bool) -> tuple[dict[str, int], dict[str, int]]:
    """MEMORY USAGE of one parked session's keys, with its share of the open-interrupt index;
    and the index's own keys, whole."""
    r, k = fleet.redis, fleet.keys
    per_key = {"meta": memory_of(r, k.meta(one)), "msgs": memory_of(r, k.messages(one)),
               "events": memory_of(r, k.events(one))}
    if idem:
        per_key["idem"] = memory_of(r, k.idempotency_keys(one))
    shared = {"interrupts_zset": memory_of(r, k.interrupt_index),
              "interrupts_info": memory_of(r, k.interrupt_info)}
    per_key["index_share"] = round(sum(shared.values()) / p_size)
    return per_key, shared


def resume_some(fleet: Fleet, producer: Producer, tracks: list[Track],
                args: argparse.Namespace) -> dict[str, Any]:
    """`--resumes` parked sessions, evenly spread over the P, resumed closed-loop."""
    p_size = len(tracks)
    n = min(args.resumes, p_size)
    step = p_size / n
    chosen = [tracks[int(i * step)] for i in range(n)]
    read_parked(producer, chosen)
    usage = Usage(fleet)
    wall = resume_closed_loop(producer, chosen, args.resume_concurrency, args.timeout,
                              fleet.check_alive)
    return {
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
