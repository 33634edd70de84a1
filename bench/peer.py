"""Scenario 5, the peer: the seed flow in LangGraph, with its SQLite and Postgres checkpointers.

The graph: llm (scripted, instant: asks for send_email) -> ask (`interrupt({"message": "Send
the email?"})`) -> tool (sends, or declines) -> llm2 (scripted: "Done. send_email: sent") -> END.

- park   = `graph.invoke({"messages": [user message]}, thread)` until it stops at the interrupt;
- resume = `graph.invoke(Command(resume={"approved": True}), thread)` until END.

Every thread is parked first (one after the other, in this process), then every thread is
resumed. Throughput is threads / wall seconds of each phase; latency is each invoke's own
duration (perf_counter). `durability="sync"` (default, `--lg-durability`): each step's
checkpoint is written before the next step runs -- the analogue of Parley committing a
transition before it enqueues the work that follows.

Bytes per parked thread, measured after all threads are parked and before any resume:
- SQLite: the sum over the thread's rows of `checkpoints` and `writes` of the length of every
  column (`length()` of text and blobs; 8 for the integer `idx`), averaged over the threads;
  and the growth of the database file (after `wal_checkpoint(TRUNCATE)` folds the WAL in:
  pages, indexes and free space included), divided by the threads.
- Postgres: the sum over the thread's rows of `checkpoints`, `checkpoint_blobs` and
  `checkpoint_writes` of `pg_column_size(row)` (stored size of the whole row, TOAST
  compression included), averaged; and the growth of `pg_total_relation_size` of the three
  tables (heap, TOAST and indexes) divided by the threads.
LangGraph keeps every step's checkpoint (no pruning by default), so a parked thread holds
the history of its steps so far, as it would in production.
"""

import operator
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

SEND = {"id": "call-1", "name": "send_email",
        "arguments": {"to": "bob@example.com", "body": "the launch moved to Friday."}}
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def build_graph(checkpointer: Any) -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def llm(state: State) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": "", "tool_calls": [SEND]}]}

    def ask(state: State) -> dict[str, Any]:
        answer = interrupt({"message": "Send the email?"})
        return {"messages": [{"role": "human", "content": "", "approval": answer}]}

    def tool(state: State) -> dict[str, Any]:
        approved = bool((state["messages"][-1].get("approval") or {}).get("approved"))
        return {"messages": [{"role": "tool", "tool_call_id": SEND["id"],
                              "content": "sent" if approved else "declined"}]}

    def llm2(state: State) -> dict[str, Any]:
        result = state["messages"][-1]["content"]
        return {"messages": [{"role": "assistant", "content": f"Done. send_email: {result}"}]}

    g = StateGraph(State)
    for name, fn in (("llm", llm), ("ask", ask), ("tool", tool), ("llm2", llm2)):
        g.add_node(name, fn)
    g.add_edge(START, "llm")
    g.add_edge("llm", "ask")
    g.add_edge("ask", "tool")
    g.add_edge("tool", "llm2")
    g.add_edge("llm2", END)
    return g.compile(checkpointer=checkpointer)


def park_all(graph: Any, threads: int, durability: str) -> dict[str, Any]:
    ids = [f"t-{i}" for i in range(threads)]
    park: list[float] = []
    t0 = time.perf_counter()
    for tid in ids:
        s = time.perf_counter()
        out = graph.invoke({"messages": [{"role": "user", "content": f"Email bob@example.com: note {tid}"}]},
                           {"configurable": {"thread_id": tid}}, durability=durability)
        park.append(time.perf_counter() - s)
        if "__interrupt__" not in out:
            raise RuntimeError(f"thread {tid} did not stop at the interrupt: {out}")
    park_wall = time.perf_counter() - t0
    return {"ids": ids, "park": park, "park_wall": park_wall}


def resume_all(graph: Any, ids: list[str], durability: str) -> tuple[list[float], float]:
    from langgraph.types import Command

    times: list[float] = []
    t0 = time.perf_counter()
    for tid in ids:
        s = time.perf_counter()
        out = graph.invoke(Command(resume={"approved": True}), {"configurable": {"thread_id": tid}},
                           durability=durability)
        times.append(time.perf_counter() - s)
        if out["messages"][-1]["content"] != "Done. send_email: sent":
            raise RuntimeError(f"thread {tid} finished wrongly: {out['messages'][-1]}")
    return times, time.perf_counter() - t0


def run_backend(open_saver: Callable[[], AbstractContextManager[Any]],
                measure: Callable[[Any, list[str]], dict[str, Any]], threads: int, durability: str,
                before: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    with open_saver() as saver:
        graph = build_graph(saver)
        # one warm-up thread (imports, prepared statements), not counted
        warm = f"warm-{uuid.uuid4().hex[:6]}"
        graph.invoke({"messages": [{"role": "user", "content": "warm up"}]},
                     {"configurable": {"thread_id": warm}}, durability=durability)
        sizes_before = before(saver)
        parked = park_all(graph, threads, durability)
        sizes = measure(saver, parked["ids"])
        growth = {k: (sizes["total_bytes"][k] - sizes_before[k]) for k in sizes_before}
        resume, resume_wall = resume_all(graph, parked["ids"], durability)
    return {"threads": threads, "park_s": parked["park"], "park_wall_s": parked["park_wall"],
            "resume_s": resume, "resume_wall_s": resume_wall,
            "row_bytes_per_thread": sizes["row_bytes_per_thread"],
            "storage_growth_bytes_per_thread": sum(growth.values()) / threads,
            "storage_growth_detail": growth, "rows_per_thread": sizes["rows_per_thread"],
            "settings": sizes.get("settings", {})}


# ---- SQLite --------------------------------------------------------------------------------

def sqlite_backend(path: Path, threads: int, durability: str) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    def files_size(saver: Any) -> dict[str, int]:
        # Fold the WAL into the database first: the WAL file only grows until a checkpoint,
        # so its size says little about what the threads occupy.
        with saver.lock:
            saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {path.name: path.stat().st_size if path.exists() else 0}

    def measure(saver: Any, ids: list[str]) -> dict[str, Any]:
        conn: sqlite3.Connection = saver.conn
        marks = ",".join("?" * len(ids))
        row_bytes = 0
        rows = 0
        for sql in (
            "SELECT COUNT(*), SUM(length(thread_id) + length(checkpoint_ns) + length(checkpoint_id)"
            " + IFNULL(length(parent_checkpoint_id), 0) + IFNULL(length(type), 0)"
            " + IFNULL(length(checkpoint), 0) + IFNULL(length(metadata), 0))"
            f" FROM checkpoints WHERE thread_id IN ({marks})",
            "SELECT COUNT(*), SUM(length(thread_id) + length(checkpoint_ns) + length(checkpoint_id)"
            " + length(task_id) + length(task_path) + 8 + length(channel) + IFNULL(length(type), 0)"
            f" + IFNULL(length(value), 0)) FROM writes WHERE thread_id IN ({marks})",
        ):
            n, b = conn.execute(sql, ids).fetchone()
            rows += n or 0
            row_bytes += b or 0
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        return {"row_bytes_per_thread": row_bytes / len(ids), "rows_per_thread": rows / len(ids),
                "total_bytes": files_size(saver),
                "settings": {"journal_mode": journal, "synchronous": sync,
                             "sqlite_version": sqlite3.sqlite_version}}

    return run_backend(lambda: SqliteSaver.from_conn_string(str(path)), measure, threads, durability,
                       files_size)


# ---- Postgres ------------------------------------------------------------------------------

def postgres_available(url: str = POSTGRES_URL) -> str | None:
    """None when a server answers at `url`; else why not (the row is then skipped)."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"no PostgreSQL at {url}: {str(exc).strip().splitlines()[0]}"
    return None


PG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def postgres_backend(url: str, threads: int, durability: str) -> dict[str, Any]:
    """In a fresh schema (search_path), dropped afterwards."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    schema = f"parley_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        server = {"server_version": admin.execute("SHOW server_version").fetchone()[0],  # type: ignore[index]
                  "synchronous_commit": admin.execute("SHOW synchronous_commit").fetchone()[0],  # type: ignore[index]
                  "fsync": admin.execute("SHOW fsync").fetchone()[0]}  # type: ignore[index]
    sep = "&" if "?" in url else "?"
    scoped = f"{url}{sep}options=-csearch_path%3D{schema}"

    @contextmanager
    def open_saver() -> Iterator[Any]:
        with PostgresSaver.from_conn_string(scoped) as saver:
            saver.setup()
            yield saver

    def sizes(saver: Any) -> dict[str, int]:
        with saver.conn.cursor() as cur:
            return {t: int(cur.execute("SELECT pg_total_relation_size(%s::regclass) AS n",
                                       (f"{schema}.{t}",)).fetchone()["n"]) for t in PG_TABLES}

    def measure(saver: Any, ids: list[str]) -> dict[str, Any]:
        row_bytes = 0
        rows = 0
        with saver.conn.cursor() as cur:
            for t in PG_TABLES:
                r = cur.execute(f"SELECT COUNT(*) AS n, COALESCE(SUM(pg_column_size(x.*)), 0) AS b "
                                f"FROM {t} x WHERE thread_id = ANY(%s)", (ids,)).fetchone()
                rows += int(r["n"])
                row_bytes += int(r["b"])
        return {"row_bytes_per_thread": row_bytes / len(ids), "rows_per_thread": rows / len(ids),
                "total_bytes": sizes(saver), "settings": server}

    try:
        return run_backend(open_saver, measure, threads, durability, sizes)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
