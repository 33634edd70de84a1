"""The goals printed under the tables: each goal this run has the figures for, `[met]` or
`[MISSED]` with its own figure and its target, or `[not run]` with the command that measures it.
First issue 36's (performance, round three), then the earlier ones. bench/README.md, "Reading
the table", lists them."""

from typing import Any

Row = dict[str, Any]

# Issue 36: a parked seed session <= 2,000 B of Redis used_memory, at every P run
PARKED_MEMORY_GOAL_B = 2_000
#: the P at which issue 36 asks for resume -> decision applied p50 <= 2 ms (`--park-100k`)
RESUME_GOAL_AT = 100_000
#: the P of issue 36's million-session goals (`make bench-million`)
MILLION = 1_000_000
#: LangGraph's checkpointers and the cycle ratio issue 36 asks for against each
LANGGRAPH_RATIOS = (("sqlite (file)", "LangGraph+sqlite", 2.5), ("postgres", "LangGraph+postgres", 4.0))
#: the durable-execution peers: no ratio was set, so the goal is to be the faster
DURABLE_PEERS = (("dbos (postgres)", "DBOS+postgres"), ("restate", "Restate"))


def goal_lines(out: dict[str, Any]) -> list[str]:
    """Each goal of the issue that this run has the figures for: measured, target, met or not,
    under "issue 36:" and "earlier:" (a heading with no goal under it is left out)."""
    lines: list[str] = []
    for heading, goals in (("  issue 36:", issue_36_goals(out)), ("  earlier:", earlier_goals(out))):
        if goals:
            lines += [heading, *goals]
    return lines


def goal(what: str, measured: str, target: str, met: bool) -> str:
    return f"    [{'met' if met else 'MISSED'}] {what}: {measured} (goal {target})"


def cycles_per_s(park_per_s: float, resume_per_s: float) -> float:
    """Whole park + resume cycles per second of a peer that does one phase after the other."""
    return 1 / (1 / park_per_s + 1 / resume_per_s)


def measured(out: dict[str, Any], scenario: str) -> list[Row]:
    """A scenario's rows that ran (not skipped)."""
    return [r for r in out.get(scenario, []) if "skipped" not in r]


def seed_rows(out: dict[str, Any]) -> dict[str, Row]:
    """Scenario 1's rows that ran, by appendfsync."""
    return {r["appendfsync"]: r for r in measured(out, "scenario_1")}


def peer_rows(out: dict[str, Any]) -> dict[str, Row]:
    """Scenario 5's rows that ran, by checkpointer."""
    return {r["checkpointer"]: r for r in measured(out, "scenario_5")}


# ---- issue 36 ------------------------------------------------------------------------------------

def issue_36_goals(out: dict[str, Any]) -> list[str]:
    """Issue 36 (performance, round three), each from this run's own figures. The goals at
    P = 100,000 and 1,000,000 say how to measure them when the run has no such row; they are
    printed only when scenario 3 ran at all."""
    rows = seed_rows(out)
    s3 = measured(out, "scenario_3")
    return [*peer_ratio_goals(rows.get("always"), peer_rows(out)), *lean_floor_goals(rows),
            *parked_goals(s3), *driver_share_goal(rows.get("always")),
            *long_session_goals(measured(out, "scenario_13"))]


def peer_ratio_goals(row: Row | None, peers: dict[str, Row]) -> list[str]:
    """Seed cycles/s (scenario 1, always) against each peer's cycles/s (scenario 5)."""
    lines = []
    targets = [*LANGGRAPH_RATIOS, *((name, label, 1.0) for name, label in DURABLE_PEERS)]
    for name, label, factor in targets:
        peer = peers.get(name)
        if row is None or peer is None:
            continue
        theirs = cycles_per_s(peer["park_threads_per_s"], peer["resume_threads_per_s"])
        ratio = row["sessions_per_s"] / theirs
        lines.append(goal(f"seed cycles/s vs {label}",
                          f"{row['sessions_per_s']} vs {theirs:.1f} = {ratio:.2f}x", f">= {factor}x",
                          ratio >= factor))
    return lines


def lean_floor_goals(rows: dict[str, Row]) -> list[str]:
    """Engine jobs/s against the lean floor, with each appendfsync run."""
    lines = []
    for fsync, row in rows.items():
        if "floor_lean" in row:
            lean = row["floor_lean"]
            lines.append(goal(f"engine jobs/s vs the lean floor ({fsync})",
                              f"{row['jobs_per_s']} vs {lean['jobs_per_s']} = {lean['ratio']:.2f}", ">= 0.60",
                              lean["ratio"] >= 0.60))
    return lines


def parked_goals(s3: list[Row]) -> list[str]:
    """Memory per parked session at every P, the resume at P = 100,000, and the million."""
    if not s3:
        return []
    lines = []
    for r in s3:
        b = r["used_memory_delta_per_session"]
        lines.append(goal(f"Redis used_memory per parked seed session at P = {r['parked']:,}", f"{b:,} B",
                          f"<= {PARKED_MEMORY_GOAL_B:,} B", b <= PARKED_MEMORY_GOAL_B))
    at = [r for r in s3 if r["parked"] >= RESUME_GOAL_AT]
    if at:
        p50 = at[0]["resumes"]["resume_to_decision_applied_ms"].get("p50")
        lines.append(goal(f"resume -> decision applied p50 at P = {at[0]['parked']:,}", f"{p50} ms",
                          "<= 2 ms", p50 is not None and p50 <= 2))
    else:
        lines.append(not_run(f"resume -> decision applied p50 <= 2 ms at P = {RESUME_GOAL_AT:,}",
                             "make bench ARGS=\"--only 3 --park-100k --budget 3600\""))
    million = [r for r in s3 if r["parked"] >= MILLION]
    if million:
        r = million[0]
        resumed = r["resumes"]["resume_to_interrupt_resumed_ms"].get("p99")
        applied = r["resumes"]["resume_to_decision_applied_ms"].get("p99")
        lines.append(goal(f"resume -> interrupt.resumed p99 at P = {r['parked']:,}", f"{resumed} ms",
                          "<= 2 ms", resumed is not None and resumed <= 2))
        lines.append(goal(f"resume -> decision applied p99 at P = {r['parked']:,}", f"{applied} ms",
                          "<= 5 ms", applied is not None and applied <= 5))
        used = r["used_memory_after"]
        lines.append(goal(f"Redis used_memory with {r['parked']:,} parked", f"{used / 1e9:.2f} GB",
                          "<= 2.5 GB", used <= 2.5e9))
    else:
        lines.append(not_run(f"{MILLION:,} parked: <= 2.5 GB, resume p99 <= 5 ms, "
                             "resume -> interrupt.resumed p99 <= 2 ms", "make bench-million"))
    return lines


def not_run(what: str, how: str) -> str:
    return f"    [not run] {what}: this run has no such row ({how} measures it)"


def driver_share_goal(row: Row | None) -> list[str]:
    usec = (row or {}).get("redis_usec_per_session")
    if not usec or usec.get("driver_share") is None:
        return []
    return [goal("the driver's reads (the feed, each session's stream at its end) in Redis's command time, "
                 "scenario 1 (always)", f"{usec['driver_share']:.1%} ({usec['driver_reads']} of "
                 f"{usec['total']} us per session)", "not dominating: < 50 %", usec["driver_share"] < 0.5)]


def long_session_goals(s13: list[Row]) -> list[str]:
    """Scenario 13 (bench/long_sessions.py): long sessions at the cost of a fresh one."""
    lines = []
    for r in s13:
        for name in ("long", "branched"):
            x = r[name]
            p50, show_p50 = x["transition_ms"].get("p50"), x["show_ms"].get("p50")
            size = f"{x['n_msgs']:,} messages" if name == "long" else f"{x['n_branches']:,} branches"
            fresh = r["fresh"]["transition_ms"].get("p50")
            lines.append(goal(f"a transition at {size}, p50 (fresh: {fresh} ms)", f"{p50} ms", "<= 2 ms",
                              p50 is not None and p50 <= 2))
            lines.append(goal(f"`parley show` at {size}, p50", f"{show_p50} ms", "<= 50 ms",
                              show_p50 is not None and show_p50 <= 50))
    return lines


# ---- earlier -------------------------------------------------------------------------------------

def earlier_goals(out: dict[str, Any]) -> list[str]:
    """The goals from before issue 36 that it did not restate."""
    return [*floor_goals(seed_rows(out)), *flood_goals(measured(out, "scenario_10")),
            *resume_goals(measured(out, "scenario_3"), peer_rows(out).get("postgres")),
            *sweep_goals(measured(out, "scenario_6")), *inbox_page_goals(measured(out, "scenario_12")),
            *soak_goals(measured(out, "scenario_8"))]


def floor_goals(s1: dict[str, Row]) -> list[str]:
    """engine/floor on RQ's path (the lean path's, with either fsync, is issue 36's)."""
    lines = []
    for fsync, r in s1.items():
        if "floor" in r:
            lines.append(goal(f"engine/floor ({fsync}, {r['floor'].get('path', 'rq')} path)",
                              f"{r['floor']['ratio']:.2f}", ">= 0.40", r["floor"]["ratio"] >= 0.40))
    return lines


def flood_goals(s10: list[Row]) -> list[str]:
    lines = []
    for r in s10:
        p99 = r.get("delay_ms", {}).get("p99")
        if p99 is not None:
            lines.append(goal(f"another session's message delay under a flood ({r['mode']}), p99",
                              f"{p99} ms", "<= 1000 ms", p99 <= 1000))
    return lines


def resume_goals(s3: list[Row], pg: Row | None) -> list[str]:
    """Resume latencies at each P, against LangGraph+Postgres when it ran, and the dispatcher's RSS."""
    if not s3:
        return []
    p99s = [r["resumes"]["resume_to_interrupt_resumed_ms"].get("p99") for r in s3]
    lines = [goal("resume -> interrupt.resumed p99 at each P", ", ".join(f"{x} ms" for x in p99s), "<= 5 ms",
                  all(x is not None and x <= 5 for x in p99s))]
    if pg is not None:
        theirs_p50 = pg["resume_ms"].get("p50") or 0
        p50s = [r["resumes"]["resume_to_decision_applied_ms"].get("p50") for r in s3]
        lines.append(goal("resume -> decision applied p50 at each P vs LangGraph+Postgres resume p50",
                          ", ".join(f"{x} ms" for x in p50s) + f" vs {theirs_p50} ms", "below",
                          all(x is not None and x < theirs_p50 for x in p50s)))
        half = pg["storage_growth_bytes_per_parked_thread"] / 2
        mem = [r["used_memory_delta_per_session"] for r in s3]
        lines.append(goal("Redis bytes per parked session at each P vs half LangGraph+Postgres storage "
                          "bytes/thread", ", ".join(f"{x:,}" for x in mem) + f" vs {half:,.0f}", "<=",
                          all(x <= half for x in mem)))
    growth = [max(r["rss_kib_after"][k] - r["rss_kib_before"][k] for k in r["rss_kib_before"]
                  if k.startswith("dispatcher")) for r in s3]
    each = [f"P={r['parked']:,}: {g / 1024:.1f} MiB" for r, g in zip(s3, growth, strict=True)]
    lines.append("    [see] dispatcher RSS growth while parking at each P: " + ", ".join(each)
                 + " (goal: unchanged by P)")
    return lines


def sweep_goals(s6: list[Row]) -> list[str]:
    """Every tick, the slowest included: the sweeps run in the dispatcher's main loop."""
    lines = []
    for r in s6:
        sweep_max, ping_p99 = r["max_sweep_ms"], r["ping_ms"].get("p99")
        lines.append(goal(f"sweeps per tick, slowest tick, with {r['queued']:,} jobs queued",
                          f"{sweep_max} ms", "<= 10 ms", sweep_max is not None and sweep_max <= 10))
        lines.append(goal("a concurrent PING p99 meanwhile", f"{ping_p99} ms", "<= 5 ms",
                          ping_p99 is not None and ping_p99 <= 5))
    return lines


def inbox_page_goals(s12: list[Row]) -> list[str]:
    lines = []
    for r in s12:
        p50 = r["first page"]["ms"].get("p50")
        lines.append(goal(f"the inbox's first page with {r['open']:,} open interrupts, p50", f"{p50} ms",
                          "<= 200 ms", p50 is not None and p50 <= 200))
    return lines


def soak_goals(s8: list[Row]) -> list[str]:
    lines = []
    for r in s8:
        lines.append(goal(f"soak: used_memory after {r['sessions']:,} sessions closed and expired",
                          f"{r['used_memory_growth_pct']:+.2f} %", "within 5 %",
                          abs(r["used_memory_growth_pct"]) <= 5))
        lines.append(goal("soak: keys of theirs left", str(r["session_keys_left"]), "0",
                          r["session_keys_left"] == 0))
    return lines
