"""The goals printed under the benchmark's table (bench/goals.py `goal_lines`) and the per-session
command figures, from made-up results: each goal says met or MISSED with its figure, only the
goals a run has figures for are printed, and the driver's reads are told apart from the
engine's commands."""

from collections import Counter
from typing import Any

import pytest

from bench.goals import cycles_per_s, goal_lines
from bench.scenarios.seed_cycle import command_usec_per_session, commands_per_session


def s1_row(fsync: str = "always", sess: float = 300.0, jobs: float = 1200.0, lean: float = 1800.0,
           share: float | None = 0.02) -> dict[str, Any]:
    row: dict[str, Any] = {
        "appendfsync": fsync, "sessions_per_s": sess, "jobs_per_s": jobs,
        "floor": {"path": "rq", "jobs_per_s": 500.0, "ratio": round(jobs / 500, 3)},
        "floor_lean": {"path": "lean", "jobs_per_s": lean, "ratio": round(jobs / lean, 3)}}
    if share is not None:
        row["redis_usec_per_session"] = {"total": 1000.0, "driver_reads": 1000 * share, "driver_share": share}
    return row


def peer_row(name: str, per_s: float) -> dict[str, Any]:
    # park and resume at twice the cycle rate: one cycle each takes 1/per_s
    return {"checkpointer": name, "park_threads_per_s": 2 * per_s, "resume_threads_per_s": 2 * per_s,
            "resume_ms": {"p50": 4.0}, "storage_growth_bytes_per_parked_thread": 6000}


def s3_row(parked: int, memory: int, applied_p50: float) -> dict[str, Any]:
    return {"parked": parked, "used_memory_delta_per_session": memory,
            "resumes": {"resume_to_interrupt_resumed_ms": {"p99": 2.0},
                        "resume_to_decision_applied_ms": {"p50": applied_p50}},
            "rss_kib_before": {"dispatcher-0": 1000}, "rss_kib_after": {"dispatcher-0": 2024}}


def goals(out: dict[str, Any]) -> dict[str, str]:
    """`what: measured (goal ...)` -> "met"/"MISSED"."""
    found = {}
    for line in goal_lines(out):
        line = line.strip()
        if line.startswith("[met]") or line.startswith("[MISSED]"):
            verdict, _, rest = line[1:].partition("] ")
            found[rest] = verdict
    return found


def test_cycles_per_s_is_one_phase_after_the_other() -> None:
    assert cycles_per_s(200, 200) == pytest.approx(100)
    assert cycles_per_s(100, 300) == pytest.approx(75)


def test_issue_36_seed_cycle_ratios_against_each_peer() -> None:
    out = {"scenario_1": [s1_row(sess=300.0)],
           "scenario_5": [peer_row("sqlite (file)", 110.0), peer_row("postgres", 80.0),
                          peer_row("dbos (postgres)", 400.0), {"checkpointer": "restate", "skipped": "why"}]}
    got = goals(out)
    assert got["seed cycles/s vs LangGraph+sqlite: 300.0 vs 110.0 = 2.73x (goal >= 2.5x)"] == "met"
    assert got["seed cycles/s vs LangGraph+postgres: 300.0 vs 80.0 = 3.75x (goal >= 4.0x)"] == "MISSED"
    # the durable-execution peers had no ratio set: the goal is to be the faster
    assert got["seed cycles/s vs DBOS+postgres: 300.0 vs 400.0 = 0.75x (goal >= 1.0x)"] == "MISSED"
    assert not any("Restate" in k for k in got)  # its row was skipped
    # issue 36's come first, under their own heading
    lines = goal_lines(out)
    assert lines[0] == "  issue 36:" and "LangGraph+sqlite" in lines[1]


def test_issue_36_engine_against_the_lean_floor_with_either_fsync() -> None:
    got = goals({"scenario_1": [s1_row(jobs=1200.0, lean=1800.0),
                                s1_row("everysec", jobs=900.0, lean=1800.0)]})
    assert got["engine jobs/s vs the lean floor (always): 1200.0 vs 1800.0 = 0.67 (goal >= 0.60)"] == "met"
    assert got["engine jobs/s vs the lean floor (everysec): 900.0 vs 1800.0 = 0.50 (goal >= 0.60)"] \
        == "MISSED"
    # the earlier 0.40 stays for RQ's own path only
    assert got["engine/floor (everysec, rq path): 1.80 (goal >= 0.40)"] == "met"
    assert not any(k.startswith("engine/floor (always, lean") for k in got)


def test_issue_36_parked_memory_at_every_p_and_the_resume_at_100000() -> None:
    out = {"scenario_3": [s3_row(1_000, 1_900, 1.0), s3_row(10_000, 2_400, 2.0),
                          s3_row(100_000, 2_000, 3.0)]}
    got = goals(out)
    memory = "Redis used_memory per parked seed session at P = "
    assert got[memory + "1,000: 1,900 B (goal <= 2,000 B)"] == "met"
    assert got[memory + "10,000: 2,400 B (goal <= 2,000 B)"] == "MISSED"
    assert got[memory + "100,000: 2,000 B (goal <= 2,000 B)"] == "met"
    assert got["resume -> decision applied p50 at P = 100,000: 3.0 ms (goal <= 2 ms)"] == "MISSED"


def test_issue_36_goals_at_a_p_not_run_say_how_to_measure_them() -> None:
    lines = goal_lines({"scenario_3": [s3_row(10_000, 1_500, 1.0), {"parked": 100_000, "skipped": "budget"}]})
    not_run = [line.strip() for line in lines if "[not run]" in line]
    assert len(not_run) == 2
    assert "P = 100,000" in not_run[0] and "--park-100k" in not_run[0]
    assert "1,000,000 parked" in not_run[1] and "make bench-million" in not_run[1]
    assert not any("decision applied p50 at P = 10,000" in line for line in lines)  # not the goal's P


def test_issue_36_the_million_from_its_own_row() -> None:
    row = s3_row(1_000_000, 2_100, 1.5)
    row["resumes"]["resume_to_decision_applied_ms"]["p99"] = 4.0
    row["used_memory_after"] = 2_600_000_000
    got = goals({"scenario_3": [row]})
    assert got["resume -> interrupt.resumed p99 at P = 1,000,000: 2.0 ms (goal <= 2 ms)"] == "met"
    assert got["resume -> decision applied p99 at P = 1,000,000: 4.0 ms (goal <= 5 ms)"] == "met"
    assert got["Redis used_memory with 1,000,000 parked: 2.60 GB (goal <= 2.5 GB)"] == "MISSED"
    assert not any("[not run]" in line for line in goal_lines({"scenario_3": [row]}))


def test_issue_36_the_drivers_share_of_redis_command_time() -> None:
    got = goals({"scenario_1": [s1_row(share=0.02)]})
    assert [v for k, v in got.items() if k.startswith("the driver's reads")] == ["met"]
    got = goals({"scenario_1": [s1_row(share=0.6)]})
    assert [v for k, v in got.items() if k.startswith("the driver's reads")] == ["MISSED"]
    # a row from before the driver counted its reads: no such goal line
    assert not any(k.startswith("the driver's") for k in goals({"scenario_1": [s1_row(share=None)]}))


def test_scenario_13_prints_its_goals_with_issue_36s() -> None:
    def session(msgs: int, branches: int, p50: float, show: float) -> dict[str, Any]:
        return {"n_msgs": msgs, "n_branches": branches, "transition_ms": {"p50": p50},
                "show_ms": {"p50": show}}

    out = {"scenario_13": [{"fresh": session(1, 1, 1.1, 0.3), "long": session(3000, 1, 1.4, 61.0),
                            "branched": session(1001, 1000, 2.5, 30.0)},
                           {"messages": 3000, "skipped": "budget"}]}
    assert goal_lines(out) == [
        "  issue 36:",
        "    [met] a transition at 3,000 messages, p50 (fresh: 1.1 ms): 1.4 ms (goal <= 2 ms)",
        "    [MISSED] `parley show` at 3,000 messages, p50: 61.0 ms (goal <= 50 ms)",
        "    [MISSED] a transition at 1,000 branches, p50 (fresh: 1.1 ms): 2.5 ms (goal <= 2 ms)",
        "    [met] `parley show` at 1,000 branches, p50: 30.0 ms (goal <= 50 ms)"]


def test_nothing_run_prints_no_goals_and_skipped_rows_count_for_nothing() -> None:
    assert goal_lines({}) == []
    assert goal_lines({"scenario_1": [{"appendfsync": "always", "skipped": "budget"}],
                       "scenario_3": [{"parked": 10_000, "skipped": "budget"}]}) == []


def stats(**calls_usec: tuple[int, int]) -> dict[str, Any]:
    return {f"cmdstat_{k}": {"calls": c, "usec": u} for k, (c, u) in calls_usec.items()}


def test_commands_per_session_leave_out_the_drivers_reads_only() -> None:
    before = stats(xadd=(10, 100), xrange=(5, 50))
    after = stats(xadd=(30, 300), xrange=(25, 250), xread=(12, 600), evalsha=(40, 4000), info=(3, 9))
    reads = Counter({"xread": 12, "xrange": 10, "xrevrange": 1})
    got = commands_per_session(before, after, 10, reads)
    # xadd 20, evalsha 40, and the engine's own 10 XRANGEs; the driver's 12 XREADs and 10 XRANGEs
    # (and an XREVRANGE Redis never saw) are not the engine's
    assert got == {"total": 7.0, "top": {"evalsha": 4.0, "xadd": 2.0, "xrange": 1.0}}


def test_command_time_splits_a_shared_command_by_calls() -> None:
    before = stats(xrange=(0, 0))
    after = stats(xrange=(20, 200), xread=(10, 300), evalsha=(10, 500))
    got = command_usec_per_session(before, after, 10, Counter({"xread": 10, "xrange": 5}))
    # xread all the driver's (300), xrange a quarter of its calls (50): 350 of 1000 us
    assert got == {"total": 100.0, "driver_reads": 35.0, "driver_share": 0.35}
    assert command_usec_per_session({}, {}, 1, Counter({"xread": 1})) == {
        "total": 0.0, "driver_reads": 0.0, "driver_share": None}
