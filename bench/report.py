"""What a run prints and writes: the results JSON (`save`, after every row), and `report`, the
header, one table per scenario in order (1 to 13), the goals (bench/goals.py) and, with
`--profile`, py-spy's top frames. Every table reads only the results JSON, so a saved run can
be printed again: `report(json.load(open("bench/results/latest.json")))`."""

import argparse
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from bench.goals import goal_lines
from bench.inbox import QUERIES
from bench.inbox_page import PAGES
from bench.sessions import QUERY_NAMES as SESSION_QUERIES

Row = dict[str, Any]


def save(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The results so far to `--out`, replaced whole: an interrupted run still leaves its figures."""
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
    tmp.replace(path)


# ---- cells and tables ----------------------------------------------------------------------------

def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


class Why(str):
    """The reason a row was skipped: printed under its table, not in a cell."""


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Right-aligned columns under their headers; each skipped row's reason under the table."""
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


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def section(title: str, hdr: list[str], results: list[Row], ident: Callable[[Row], list[Any]],
            cells: Callable[[Row], list[Any]]) -> list[str]:
    """A scenario's block: a blank line, its title and its table, one row per result (a skipped
    result named by `ident`, the others made by `cells`); nothing if the run has no results."""
    if not results:
        return []
    rows = [skipped_row(ident(r), len(hdr), r["skipped"]) if "skipped" in r else cells(r) for r in results]
    return ["", title, table(hdr, rows)]


# ---- the header ----------------------------------------------------------------------------------

def header_lines(out: dict[str, Any]) -> list[str]:
    """The run's wall seconds (in all and per scenario), the machine, the versions."""
    m, v = out["machine"], out["versions"]
    walls = out.get("scenario_wall_s") or {}
    lines = [f"Parley bench  {out['started_at']}  ({out.get('total_wall_s', '?')} s"
             + ("; by scenario: " + ", ".join(f"{k}: {t:.0f} s" for k, t in walls.items())
                if walls else "") + ")",
             f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total']}; fsync 4 KiB p50 "
             f"{m['fsync_ms'].get('p50')} ms p99 {m['fsync_ms'].get('p99')} ms; loadavg at start "
             f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
             f"versions: python {v['python']}, redis-server {v.get('redis-server')}, rq {v['rq']}, "
             f"redis-py {v['redis']}, langgraph {v['langgraph']} "
             f"(sqlite {v['langgraph-checkpoint-sqlite']}, "
             f"postgres {v['langgraph-checkpoint-postgres']}), dbos {v.get('dbos')}, "
             f"restate-sdk {v.get('restate-sdk')}"]
    if out.get("mode") == "smoke":
        lines.append("SMOKE RUN: tiny sizes, the figures mean nothing")
    return lines


# ---- one block per scenario ----------------------------------------------------------------------

def seed_cycle_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 1: the table, then each row's CPU and Redis commands per session."""
    s1 = out.get("scenario_1", [])
    if not s1:
        return []
    title = ("1. Seed cycle (message -> llm -> tool.execute -> interrupt -> resume -> tool.result "
             f"-> llm -> done), all sessions at once, 1 dispatcher, {out['settings']['workers']} "
             "worker(s), 1 partition; latencies in ms (p50/p99)")
    hdr = ["fsync", "sessions", "wall s", "sess/s", "jobs", "jobs/sess", "jobs/s", "trans/s",
           "msg->raised", "resume->resumed", "session", "problems", "other load"]

    def cells(r: Row) -> list[Any]:
        lat = r["latency_ms"]
        return [r["appendfsync"], r["sessions"], r["wall_s"], r["sessions_per_s"], r["jobs"],
                r["jobs_per_session"], r["jobs_per_s"], r["transitions_per_s"],
                pq(lat["message_to_interrupt_raised"]), pq(lat["resume_to_interrupt_resumed"]),
                pq(lat["session"]), r["problems"], f"{r['usage']['other_load_cores']} cores"]

    lines = section(title, hdr, s1, lambda r: [r["appendfsync"]], cells)
    for r in s1:
        if "skipped" in r:
            continue
        c = r["cpu_ms_per_session"]
        lines.append(f"  cpu ms/session ({r['appendfsync']}): "
                     + ", ".join(f"{k} {v}" for k, v in c.items() if k != "children_done")
                     + f"; redis commands/session {r['redis_commands_per_session']['total']}"
                     + driver_reads_note(r))
    return lines


def driver_reads_note(r: Row) -> str:
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


def floor_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 2: each scenario-1 row's two floors."""
    s1 = out.get("scenario_1", [])
    if not s1:
        return []
    hdr = ["fsync", "path", "jobs", "workers", "wall s", "floor jobs/s", "engine jobs/s", "engine/floor"]
    rows = [[r["appendfsync"], r[k].get("path", "rq"), r[k]["jobs"], r[k]["workers"], r[k]["wall_s"],
             r[k]["jobs_per_s"], r["jobs_per_s"], f"{r[k]['ratio']:.2f}"]
            for r in s1 for k in ("floor", "floor_lean") if k in r]
    return ["", "2. The floor: as many no-op RQ jobs, same worker class (SimpleWorker), JSONSerializer, "
            "Redis; RQ's own path and Parley's lean path", table(hdr, rows)]


def parked_memory_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 3: the table, then each P's MEMORY USAGE per key."""
    s3 = out.get("scenario_3", [])
    if not s3:
        return []
    title = ("3. Cost of a pause (memory in bytes; RSS in MiB before -> after parking; resume "
             "latency in ms, p50/p99)")
    hdr = ["parked", "parks/s", "used_memory/sess", "MEMORY USAGE/sess", "keys/sess", "dispatcher RSS",
           "worker RSS", "resumes", "resume->resumed", "resume->applied", "resume->done", "other load"]

    def rss(r: Row, prefix: str) -> str:
        return " ".join(f"{mib(r['rss_kib_before'][k])}->{mib(r['rss_kib_after'][k])}"
                        for k in r["rss_kib_before"] if k.startswith(prefix))

    def cells(r: Row) -> list[Any]:
        rs = r["resumes"]
        return [r["parked"], r["parks_per_s"], r["used_memory_delta_per_session"],
                r["memory_usage_one_session"]["total"], r["keys_per_session"],
                rss(r, "dispatcher"), rss(r, "worker"), rs["n"],
                pq(rs["resume_to_interrupt_resumed_ms"]), pq(rs["resume_to_decision_applied_ms"]),
                pq(rs["resume_to_turn_completed_ms"]), f"{r['park_usage']['other_load_cores']} cores"]

    lines = section(title, hdr, s3, lambda r: [r["parked"]], cells)
    for r in s3:
        if "skipped" not in r:
            one = r["memory_usage_one_session"]
            lines.append(f"  MEMORY USAGE of one parked session (P={r['parked']}): "
                         + ", ".join(f"{k} {v}" for k, v in one.items()))
    return lines


def scaling_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 4."""
    s4 = out.get("scenario_4", [])
    if not s4:
        return []
    st = out["settings"]
    title = (f"4. Scaling ({st['scaling_partitions']} partitions, appendfsync always, "
             f"{st['scaling_sessions']} sessions per row; latencies in ms, p50/p99)")
    hdr = ["dispatchers", "workers", "sess/s", "jobs/s", "trans/s", "msg->raised", "session", "problems",
           "other load"]
    return section(title, hdr, s4, lambda r: [r["dispatchers"], r["workers"]],
                   lambda r: [r["dispatchers"], r["workers"], r["sessions_per_s"], r["jobs_per_s"],
                              r["transitions_per_s"], pq(r["latency_ms"]["message_to_interrupt_raised"]),
                              pq(r["latency_ms"]["session"]), r["problems"],
                              f"{r['usage']['other_load_cores']} cores"])


def langgraph_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 5."""
    title = ("5. The peers: LangGraph (interrupt() before the tool, Command(resume=...)), DBOS "
             "(DBOS.recv / DBOS.send) and Restate (an awakeable); one run at a time (ms, p50/p99)")
    hdr = ["checkpointer", "threads", "park thr/s", "park ms", "resume thr/s", "resume ms",
           "row bytes/thread", "storage bytes/thread"]
    return section(title, hdr, out.get("scenario_5", []), lambda r: [r["checkpointer"]],
                   lambda r: [r["checkpointer"], r["threads"], r["park_threads_per_s"], pq(r["park_ms"]),
                              r["resume_threads_per_s"], pq(r["resume_ms"]),
                              r["row_bytes_per_parked_thread"], r["storage_growth_bytes_per_parked_thread"]])


def sweeps_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 6."""
    title = ("6. Sweeps with a backlog: jobs queued, no worker, every sweep due on every tick; "
             "a concurrent client's PING (ms, p50/p99)")
    hdr = ["queued", "ticks", "sweeps/tick ms", "max ms", "commands/tick", "losses posted", "PING ms",
           "PING max"]
    return section(title, hdr, out.get("scenario_6", []), lambda r: [r["jobs"]],
                   lambda r: [r["queued"], r["ticks"], pq(r["sweep_ms_per_tick"]), r["max_sweep_ms"],
                              r["redis_commands_per_tick"], f"{r['losses_posted']}/{r['lost_planted']}",
                              pq(r["ping_ms"]), r["ping_ms"].get("max")])


def pages_cells(r: Row, size: str, queries: Collection[str]) -> list[Any]:
    """A listing's row (scenarios 7 and 9): its size, fill time, each query's page and the
    lowest-highest Redis commands per page over the queries."""
    per_page = sorted({r[q]["redis_commands_per_page"] for q in queries})
    return [r[size], r["fill_s"], *(pq(r[q]["page_ms"]) for q in queries),
            "-".join(fmt(x) for x in (per_page[0], per_page[-1]))]


def inbox_listing_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 7."""
    s7 = out.get("scenario_7", [])
    if not s7:
        return []
    title = ("7. The inbox listing: one page (`Client.interrupt_page`, "
             f"{s7[0].get('limit', '?')} rows) per query, ms p50/p99, and Redis commands per page")
    hdr = ["open", "fill s", *(f"{q} ms" for q in QUERIES), "commands/page"]
    return section(title, hdr, s7, lambda r: [r["open"]], lambda r: pages_cells(r, "open", QUERIES))


def shard_listing_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 14."""
    s14 = [r for r in out.get("scenario_14", []) if "all" in r or "skipped" in r]
    if not s14:
        return []
    first = next((r for r in s14 if "all" in r), {})
    title = (f"14. The inbox listing at many shards: {first.get('open', '?')} open over S shards, one page "
             f"({first.get('limit', '?')} rows) per query, ms p50/p99, commands per page over every shard")

    def cells(r: Row) -> list[Any]:
        return [*pages_cells(r, "shards", QUERIES), fmt(r["all"].get("page_p50_vs_one_shard"), 2)]

    hdr = ["shards", "fill s", *(f"{q} ms" for q in QUERIES), "commands/page", "all p50 vs 1"]
    return section(title, hdr, s14, lambda r: [r["shards"]], cells)


def soak_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 8."""
    title = ("8. Soak: sessions run to their end (seed flow), closed as idle, archived, expired; "
             "Redis used_memory (bytes)")
    hdr = ["sessions", "run s", "close+expire s", "problems", "before", "with them", "after", "growth %",
           "their keys left"]
    return section(title, hdr, out.get("scenario_8", []), lambda r: [r["sessions"]],
                   lambda r: [r["sessions"], r["run_wall_s"], r["close_and_expire_wall_s"], r["problems"],
                              r["used_memory_before"], r["used_memory_run"], r["used_memory_after"],
                              r["used_memory_growth_pct"], r["session_keys_left"]])


def session_list_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 9."""
    s9 = out.get("scenario_9", [])
    if not s9:
        return []
    title = ("9. The list of sessions: one page (`Client.sessions`, "
             f"{s9[0].get('limit', '?')} rows) per filter, ms p50/p99, and Redis commands per page")
    hdr = ["sessions", "fill s", *(f"{q} ms" for q in SESSION_QUERIES), "commands/page"]
    return section(title, hdr, s9, lambda r: [r["sessions"]],
                   lambda r: pages_cells(r, "sessions", SESSION_QUERIES))


def flood_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 10."""
    title = ("10. Fairness: a flood of inputs for one session (producer `flood`) while another "
             "producer sends a message every 50 ms, each to a session of its own; that message's "
             "delay, entry written -> message.created, ms")
    hdr = ["flood", "inputs", "written", "refused", "write s", "probed s", "flood left", "messages",
           "delay p50/p99", "max"]
    return section(title, hdr, out.get("scenario_10", []), lambda r: [r["mode"], r["inputs"]],
                   lambda r: [r["mode"], r["inputs"], r.get("written"), r.get("refused"), r.get("write_s"),
                              r["probed_s"], r["flood_left"], r["delay_ms"].get("n", 0), pq(r["delay_ms"]),
                              r["delay_ms"].get("max")])


def shards_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 11."""
    title = ("11. Shards: per shard a redis-server, 1 dispatcher and workers; the seed cycle, all "
             "sessions at once, then sessions parked and left open (per shard: sessions, sess/s, "
             "parked, Redis bytes per parked session)")
    hdr = ["shards", "partitions", "procs", "sessions", "wall s", "sess/s", "cpu ms/sess", "other load",
           "problems", "parks/s", "per shard"]

    def cells(r: Row) -> list[Any]:
        each = "; ".join(f"#{x['shard']}: {x['sessions']} {fmt(x['sessions_per_s'])}/s "
                         f"{x['parked']} parked {fmt(x['used_memory_per_parked_session'])} B"
                         for x in r["per_shard"])
        return [r["shards"], r["partitions"], r["dispatchers"] + r["workers"], r["sessions"],
                r["wall_s"], r["sessions_per_s"], r["usage"]["cpu_ms_per_session"],
                r["usage"]["other_load_cores"], r["problems"], r["parks_per_s"], each]

    return section(title, hdr, out.get("scenario_11", []), lambda r: [r["shards"]], cells)


def inbox_page_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 12."""
    title = ("12. The inbox page: `parley inbox` (a real process), signed in, the list's first "
             "page as whole HTTP requests, ms p50/p95/max")
    hdr = ["open", "fill s", "rows", "first request ms", *(f"{name} ms" for name in PAGES), "inbox RSS MiB"]
    return section(title, hdr, out.get("scenario_12", []), lambda r: [r["open"]],
                   lambda r: [r["open"], r["fill_s"], r["page_size"], r["first_request_ms"],
                              *(p50_p95_max(r[name]["ms"]) for name in PAGES), mib(r["inbox_rss_kib"])])


def long_sessions_lines(out: dict[str, Any]) -> list[str]:
    """Scenario 13: three table rows (fresh, long, branched) per result."""
    s13 = out.get("scenario_13", [])
    if not s13:
        return []
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
    return ["", "13. Long sessions: a branch switch (input to its event, closed loop) and `parley show` "
            "(in-process), ms p50/p95/max", table(hdr, rows)]


# ---- the goals, the profile, the whole report ----------------------------------------------------

def goals_lines(out: dict[str, Any]) -> list[str]:
    """The goals this run has figures for (bench/goals.py), under their heading."""
    goals = goal_lines(out)
    if not goals:
        return []
    return ["", "Goals, from this run's figures"
            + (" (SMOKE RUN: tiny sizes, meaningless)" if out.get("mode") == "smoke" else ""), *goals]


def profile_lines(out: dict[str, Any]) -> list[str]:
    """`--profile`: each profiled process's top self frames, then its top inclusive frames."""
    lines: list[str] = []
    for name, d in (out.get("profile") or {}).items():
        lines.append("")
        lines.append(f"py-spy, {name} during scenario 1 ({d['samples']} samples, idle excluded): "
                     "top self frames, then top inclusive frames")
        lines += [f"  {share:6.1%}  {frame}" for frame, share in d["self"][:6]]
        lines += [f"  {share:6.1%}  {frame}" for frame, share in d["inclusive"][:12]]
    return lines


# The blocks under the header, in the order they print: the scenarios by number, whatever order
# they ran in.
BLOCKS: tuple[Callable[[dict[str, Any]], list[str]], ...] = (
    seed_cycle_lines, floor_lines, parked_memory_lines, scaling_lines, langgraph_lines, sweeps_lines,
    inbox_listing_lines, shard_listing_lines, soak_lines, session_list_lines, flood_lines, shards_lines,
    inbox_page_lines, long_sessions_lines, goals_lines, profile_lines)


def report(out: dict[str, Any]) -> str:
    """The whole printed report of a run's results."""
    lines = header_lines(out)
    for block in BLOCKS:
        lines += block(out)
    return "\n".join(lines)
