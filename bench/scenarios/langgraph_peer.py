"""Scenario 5, the peer: the seed flow as a LangGraph graph (bench/peer.py) with its SQLite and
Postgres checkpointers, threads parked one after another in this process, then resumed. The
Postgres row is skipped, with the reason, when nothing answers at `--postgres-url`."""

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from bench import peer, peer_restate
from bench.common import Usage, dist, log, out_of_time
from bench.report import save


def langgraph_peer(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 5: `out["scenario_5"]`, one row per checkpointer."""
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
    dbos_row(args, rows)
    save(args, out)
    restate_row(args, workdir, rows)
    save(args, out)


def restate_row(args: argparse.Namespace, workdir: Path, rows: list[dict[str, Any]]) -> None:
    """The Restate row (bench/peer_restate.py): a private restate-server and the service."""
    why = ("skipped (--no-restate)" if args.no_restate else peer_restate.missing()
           or out_of_time(args, "scenario 5 (restate)"))
    if why is not None:
        log(f"scenario 5: Restate row SKIPPED: {why}")
        rows.append({"checkpointer": RESTATE_ROW, "skipped": why})
        return
    log(f"scenario 5: Restate workflows (an awakeable for the human), {args.lg_threads} runs")
    usage = Usage()
    try:
        res = peer_restate.run(workdir, args.lg_threads)
    except Exception as exc:  # a peer's failure is its row's, not the run's
        log(f"scenario 5: Restate row failed: {exc!r}")
        rows.append({"checkpointer": RESTATE_ROW, "skipped": f"failed: {exc!r}"})
        return
    row = peer_row(RESTATE_ROW, res)
    row["usage"] = usage.stop()
    rows.append(row)


#: the Restate row's name in scenario 5 (bench/goals.py finds it by it)
RESTATE_ROW = "restate"


def dbos_row(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The DBOS row (bench/peer_dbos.py), in a child process, on the same PostgreSQL server."""
    why = ("skipped (--no-dbos)" if args.no_dbos else "skipped (--no-postgres)" if args.no_postgres
           else peer.postgres_available(args.postgres_url) or dbos_missing()
           or out_of_time(args, "scenario 5 (dbos)"))
    if why is not None:
        log(f"scenario 5: DBOS row SKIPPED: {why}")
        rows.append({"checkpointer": DBOS_ROW, "skipped": why})
        return
    log(f"scenario 5: DBOS workflows (DBOS.recv / DBOS.send) at {args.postgres_url}, {args.lg_threads} runs")
    usage = Usage()
    done = subprocess.run([sys.executable, "-m", "bench.peer_dbos", "--url", args.postgres_url,
                           "--runs", str(args.lg_threads)], capture_output=True, timeout=1800)
    if done.returncode != 0:
        why = f"failed: {done.stderr.decode(errors='replace').strip().splitlines()[-1:]}"
        log(f"scenario 5: DBOS row {why}")
        rows.append({"checkpointer": DBOS_ROW, "skipped": why})
        return
    row = peer_row(DBOS_ROW, orjson.loads(done.stdout))
    row["usage"] = usage.stop()
    rows.append(row)


#: the DBOS row's name in scenario 5 (bench/goals.py finds it by it)
DBOS_ROW = "dbos (postgres)"


def dbos_missing() -> str | None:
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        return f"dbos is not installed ({exc}); `pip install -e '.[bench]'` installs it"
    return None


def peer_row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """One checkpointer's row from bench/peer.py's raw figures."""
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
