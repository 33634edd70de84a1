"""Scenario 5's DBOS row: the seed flow as a DBOS durable workflow on the local PostgreSQL.

The workflow: `llm` (a step, scripted: asks for send_email) -> `set_event("parked")` (what a
client watches for, as Parley's `interrupt.raised`) -> `DBOS.recv("approval")` (waits for the
human) -> `send_email` (a step: sends, or declines) -> `llm2` (a step: "Done. send_email: sent").

- park   = `DBOS.start_workflow(seed, message)`, until `DBOS.get_event(id, "parked")` answers;
- resume = `DBOS.send(id, {"approved": True}, topic="approval")`, until the workflow's result.

Runs are parked one after another, then resumed one after another, in one process, as the
LangGraph rows are (bench/peer.py). DBOS records every step's output and the workflow's status
in its system database before it goes on: the analogue of Parley's commit before the next hop.

Bytes per parked run, after every run is parked and before any resume: the sum over the run's
rows of `pg_column_size(row)` in the system tables that hold a run (status, inputs, step
outputs, events), averaged; and the growth of `pg_total_relation_size` of every table of the
`dbos` schema (heap, TOAST, indexes), divided by the runs.

DBOS is a process-wide singleton that starts threads and configures logging, so the row runs in
a child process (`python -m bench.peer_dbos`), in a database of its own, dropped afterwards."""

import argparse
import sys
import time
import uuid
from typing import Any

import orjson

SEND = {"id": "call-1", "name": "send_email",
        "arguments": {"to": "bob@example.com", "body": "the launch moved to Friday."}}
#: the tables a parked run has rows in (its notification comes with the resume)
RUN_TABLES = ("workflow_status", "workflow_input", "operation_outputs", "workflow_events",
              "workflow_events_history")


def admin_url(url: str, database: str) -> str:
    """`url` with its database replaced."""
    head, _, tail = url.rpartition("/")
    query = tail.partition("?")[2]
    return f"{head}/{database}" + (f"?{query}" if query else "")


def relation_sizes(conn: Any) -> dict[str, int]:
    rows = conn.execute("SELECT table_name, pg_total_relation_size(quote_ident(table_schema) || '.' || "
                        "quote_ident(table_name)) FROM information_schema.tables "
                        "WHERE table_schema = 'dbos'").fetchall()
    return {name: int(size) for name, size in rows}


def row_bytes(conn: Any, ids: list[str]) -> tuple[int, int]:
    """(rows, bytes) of the runs `ids` over RUN_TABLES."""
    rows = total = 0
    for table in RUN_TABLES:
        n, b = conn.execute(f"SELECT COUNT(*), COALESCE(SUM(pg_column_size(t.*)), 0) FROM dbos.{table} t "
                            "WHERE workflow_uuid = ANY(%s)", (ids,)).fetchone()
        rows += n
        total += b
    return rows, total


def run(url: str, runs: int) -> dict[str, Any]:
    import psycopg
    from dbos import DBOS, SetWorkflowID

    database = f"parley_bench_dbos_{uuid.uuid4().hex[:8]}"
    scoped = admin_url(url, database)
    DBOS(config={"name": "parley-bench", "system_database_url": scoped, "log_level": "WARNING"})

    @DBOS.step()
    def llm(message: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [SEND]}

    @DBOS.step()
    def send_email(approved: bool) -> str:
        return "sent" if approved else "declined"

    @DBOS.step()
    def llm2(result: str) -> str:
        return f"Done. send_email: {result}"

    @DBOS.workflow()
    def seed(message: str) -> str:
        llm(message)
        DBOS.set_event("parked", {"message": "Send the email?"})
        answer = DBOS.recv("approval", timeout_seconds=3600)
        return llm2(send_email(bool(answer and answer.get("approved"))))

    def park(run_id: str, message: str) -> Any:
        with SetWorkflowID(run_id):
            handle = DBOS.start_workflow(seed, message)
        if DBOS.get_event(run_id, "parked", timeout_seconds=60) is None:
            raise RuntimeError(f"run {run_id} did not park")
        return handle

    try:
        DBOS.launch()
        warm = park(f"warm-{uuid.uuid4().hex[:6]}", "warm up")  # imports, pools: not counted
        DBOS.send(warm.workflow_id, {"approved": True}, topic="approval")
        warm.get_result()
        with psycopg.connect(scoped) as conn:
            before = relation_sizes(conn)
        ids = [f"t-{i}" for i in range(runs)]
        handles, park_s = [], []
        t0 = time.perf_counter()
        for run_id in ids:
            s = time.perf_counter()
            handles.append(park(run_id, f"Email bob@example.com: note {run_id}"))
            park_s.append(time.perf_counter() - s)
        park_wall = time.perf_counter() - t0
        with psycopg.connect(scoped) as conn:
            after = relation_sizes(conn)
            rows, total = row_bytes(conn, ids)
            server = {"server_version": conn.execute("SHOW server_version").fetchone()[0],
                      "synchronous_commit": conn.execute("SHOW synchronous_commit").fetchone()[0],
                      "fsync": conn.execute("SHOW fsync").fetchone()[0]}
        resume_s = []
        t0 = time.perf_counter()
        for handle in handles:
            s = time.perf_counter()
            DBOS.send(handle.workflow_id, {"approved": True}, topic="approval")
            result = handle.get_result()
            resume_s.append(time.perf_counter() - s)
            if result != "Done. send_email: sent":
                raise RuntimeError(f"run {handle.workflow_id} finished wrongly: {result!r}")
        resume_wall = time.perf_counter() - t0
    finally:
        DBOS.destroy(destroy_registry=True)
        with psycopg.connect(admin_url(url, "postgres"), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    growth = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    from importlib.metadata import version
    return {"threads": runs, "park_s": park_s, "park_wall_s": park_wall,
            "resume_s": resume_s, "resume_wall_s": resume_wall,
            "row_bytes_per_thread": total / runs, "rows_per_thread": rows / runs,
            "storage_growth_bytes_per_thread": sum(growth.values()) / runs,
            "storage_growth_detail": {k: v for k, v in growth.items() if v},
            "settings": {**server, "dbos": version("dbos")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="a PostgreSQL URL (its server; the database is ours)")
    ap.add_argument("--runs", type=int, required=True)
    args = ap.parse_args(argv)
    sys.stdout.buffer.write(orjson.dumps(run(args.url, args.runs)))


if __name__ == "__main__":
    main()
