"""The goals printed under the tables: each goal this run has the figures for, `[met]` or
`[MISSED]` with its own figure and its target. First issue 21's (performance, round two, and
scenario 13's), then the earlier ones. bench/README.md, "Reading the table", lists them."""

from typing import Any

Row = dict[str, Any]

# Issue 21: a parked seed session <= 2.5 KB of Redis used_memory, at P = 10,000 and 100,000
PARKED_MEMORY_GOAL_B = 2_500
PARKED_MEMORY_GOAL_FROM = 10_000


def goal_lines(out: dict[str, Any]) -> list[str]:
    """Each goal of the issue that this run has the figures for: measured, target, met or not,
    under "issue 21:" and "earlier:" (a heading with no goal under it is left out)."""
    lines: list[str] = []
    for heading, goals in (("  issue 21:", issue_21_goals(out)), ("  earlier:", earlier_goals(out))):
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


# ---- issue 21 ------------------------------------------------------------------------------------

def issue_21_goals(out: dict[str, Any]) -> list[str]:
    """Issue 21 (performance, round two), each from this run's own figures."""
    row = seed_rows(out).get("always")
    return [*peer_ratio_goals(row, peer_rows(out)), *lean_floor_goal(row),
            *parked_goals(measured(out, "scenario_3")), *driver_share_goal(row),
            *long_session_goals(measured(out, "scenario_13"))]


def peer_ratio_goals(row: Row | None, peers: dict[str, Row]) -> list[str]:
    """Seed cycles/s (scenario 1, always) against each peer's cycles/s (scenario 5)."""
    lines = []
    for name, factor in (("sqlite (file)", 2.0), ("postgres", 3.0)):
        peer = peers.get(name)
        if row is None or peer is None:
            continue
        theirs = cycles_per_s(peer["park_threads_per_s"], peer["resume_threads_per_s"])
        ratio = row["sessions_per_s"] / theirs
        lines.append(goal(f"seed cycles/s vs LangGraph+{name.split()[0]}",
                          f"{row['sessions_per_s']} vs {theirs:.1f} = {ratio:.2f}x", f">= {factor}x",
                          ratio >= factor))
    return lines


def lean_floor_goal(row: Row | None) -> list[str]:
    if row is None or "floor_lean" not in row:
        return []
    lean = row["floor_lean"]
    return [goal("engine jobs/s vs the lean floor (always)",
                 f"{row['jobs_per_s']} vs {lean['jobs_per_s']} = {lean['ratio']:.2f}", ">= 0.60",
                 lean["ratio"] >= 0.60)]


def parked_goals(s3: list[Row]) -> list[str]:
    """Memory per parked session from P = 10,000, and the resume at the largest P run."""
    lines = []
    for r in s3:
        if r["parked"] >= PARKED_MEMORY_GOAL_FROM:
            b = r["used_memory_delta_per_session"]
            lines.append(goal(f"Redis used_memory per parked seed session at P = {r['parked']:,}", f"{b:,} B",
                              f"<= {PARKED_MEMORY_GOAL_B:,} B", b <= PARKED_MEMORY_GOAL_B))
    if s3:
        top = max(s3, key=lambda r: r["parked"])
        p50 = top["resumes"]["resume_to_decision_applied_ms"].get("p50")
        lines.append(goal(f"resume -> decision applied p50 at P = {top['parked']:,} (the largest P run)",
                          f"{p50} ms", "<= 2 ms", p50 is not None and p50 <= 2))
    return lines


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
    """The goals from before issue 21."""
    return [*floor_goals(seed_rows(out)), *flood_goals(measured(out, "scenario_10")),
            *resume_goals(measured(out, "scenario_3"), peer_rows(out).get("postgres")),
            *sweep_goals(measured(out, "scenario_6")), *inbox_page_goals(measured(out, "scenario_12")),
            *soak_goals(measured(out, "scenario_8"))]


def floor_goals(s1: dict[str, Row]) -> list[str]:
    """engine/floor on RQ's path, and on the lean path with everysec (with always: issue 21's)."""
    lines = []
    for fsync, r in s1.items():
        for key in ("floor", "floor_lean"):
            if key in r and not (fsync == "always" and key == "floor_lean"):
                lines.append(goal(f"engine/floor ({fsync}, {r[key].get('path', 'rq')} path)",
                                  f"{r[key]['ratio']:.2f}", ">= 0.40", r[key]["ratio"] >= 0.40))
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
