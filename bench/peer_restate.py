"""Scenario 5's Restate row: the seed flow as a Restate workflow (bench/restate_service.py).

A private `restate-server` (npm `@restatedev/restate-server`, pinned in bench/restate/, installed
by `make bench` with `npm ci`) on free loopback ports with its own base directory, one
partition (one box, two cores), telemetry off; the service served by hypercorn in a child
process and registered with the server's admin API. The driver talks HTTP/1.1 to the ingress:

- park   = `POST /seed/<key>/run/send` (start the workflow), then the shared handler
  `awakeable` until it answers the awakeable's id (polled every millisecond: Restate tells a
  client nothing by itself, so this is what a client waiting for the question does);
- resume = `POST /restate/awakeables/<id>/resolve` with `{"approved": true}`, then
  `GET /restate/workflow/seed/<key>/attach` until the workflow's result.

Runs are parked one after another, then resumed one after another, as the other peers' rows
are. Restate writes every journal entry to its log before the service goes on (its
`default-replication = 1` on one node here).

Bytes per parked run, after every run is parked and before any resume: the journal entries
(`raw_length` in `sys_journal`) of the parked runs' `run` invocations plus their state entries
(`state`, key and value), from the server's SQL introspection (`POST /query`), averaged; and
the growth of the server's base directory (RocksDB and the log, on disk) ÷ runs."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: where `npm ci` puts the pinned server (bench/restate/package.json)
SERVER = ROOT / "bench" / "restate" / "node_modules" / ".bin" / "restate-server"


def missing() -> str | None:
    """None when the row can run; else why not (the row is then skipped)."""
    if not SERVER.exists():
        return f"no Restate server at {SERVER.relative_to(ROOT)}: `npm ci --prefix bench/restate` installs it"
    for module in ("restate", "hypercorn", "httpx"):
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} is not installed ({exc}); `pip install -e '.[bench]'` installs it"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(workdir: Path, runs: int) -> dict[str, Any]:
    import httpx

    base = workdir / "restate"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    ingress_port, admin_port, node_port, service_port = (free_port() for _ in range(4))
    env = {**os.environ, "RESTATE_BASE_DIR": str(base), "RESTATE_LISTEN_MODE": "tcp",
           "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress_port}",
           "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin_port}",
           "RESTATE_BIND_ADDRESS": f"127.0.0.1:{node_port}",
           "RESTATE_DISABLE_TELEMETRY": "true", "RESTATE_ADMIN__DISABLE_WEB_UI": "true",
           "RESTATE_DEFAULT_NUM_PARTITIONS": "1", "RESTATE_BOOTSTRAP_NUM_PARTITIONS": "1",
           "RESTATE_LOG_FILTER": "warn"}
    server = subprocess.Popen([str(SERVER), "--no-logo"], env=env, stdout=(base / "server.log").open("wb"),
                              stderr=subprocess.STDOUT)
    service = subprocess.Popen([sys.executable, "-m", "hypercorn", "bench.restate_service:app",
                                "--bind", f"127.0.0.1:{service_port}"], cwd=ROOT,
                               stdout=(base / "service.log").open("wb"), stderr=subprocess.STDOUT)
    admin, ingress = f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{ingress_port}"
    try:
        with httpx.Client(timeout=60) as http:
            up(http, admin, server, base)
            registered = http.post(f"{admin}/deployments", json={"uri": f"http://127.0.0.1:{service_port}"})
            if registered.status_code >= 300:
                raise RuntimeError(f"registering the service: {registered.status_code} "
                                   f"{registered.text[:300]}")

            def park(key: str, message: str) -> str:
                started = http.post(f"{ingress}/seed/{key}/run/send", json=message)
                if started.status_code >= 300:
                    raise RuntimeError(f"starting {key}: {started.status_code} {started.text[:300]}")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    asked = http.post(f"{ingress}/seed/{key}/awakeable")
                    if asked.status_code < 300 and asked.content and (name := asked.json()):
                        return str(name)
                    time.sleep(0.001)
                raise RuntimeError(f"run {key} did not park")

            def resume(key: str, name: str) -> Any:
                resolved = http.post(f"{ingress}/restate/awakeables/{name}/resolve", json={"approved": True})
                if resolved.status_code >= 300:
                    raise RuntimeError(f"resolving {key}: {resolved.status_code} {resolved.text[:300]}")
                return http.get(f"{ingress}/restate/workflow/seed/{key}/attach").json()

            resume("warm", park("warm", "warm up"))  # the service's imports, connections: not counted
            before = tree_bytes(base)
            keys = [f"t-{i}" for i in range(runs)]
            names, park_s = {}, []
            t0 = time.perf_counter()
            for key in keys:
                s = time.perf_counter()
                names[key] = park(key, f"Email bob@example.com: note {key}")
                park_s.append(time.perf_counter() - s)
            park_wall = time.perf_counter() - t0
            rows, total = parked_bytes(http, admin)
            growth = tree_bytes(base) - before
            resume_s = []
            t0 = time.perf_counter()
            for key in keys:
                s = time.perf_counter()
                result = resume(key, names[key])
                resume_s.append(time.perf_counter() - s)
                if result != "Done. send_email: sent":
                    raise RuntimeError(f"run {key} finished wrongly: {result!r}")
            resume_wall = time.perf_counter() - t0
    finally:
        for proc in (service, server):
            proc.terminate()
        for proc in (service, server):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    from importlib.metadata import version
    return {"threads": runs, "park_s": park_s, "park_wall_s": park_wall,
            "resume_s": resume_s, "resume_wall_s": resume_wall,
            "row_bytes_per_thread": total / runs, "rows_per_thread": rows / runs,
            "storage_growth_bytes_per_thread": growth / runs,
            "storage_growth_detail": {"base directory": growth},
            "settings": {"restate_server": "1.7.12 (bench/restate/package.json)",
                         "restate_sdk": version("restate-sdk"), "partitions": 1}}


def up(http: Any, admin: str, server: subprocess.Popen[bytes], base: Path) -> None:
    """Wait for the admin API to answer (the server provisions its one node first)."""
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"restate-server exited {server.returncode}: "
                               f"{(base / 'server.log').read_text(errors='replace')[-500:]}")
        try:
            if http.get(f"{admin}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("restate-server did not answer within 60 s")


def parked_bytes(http: Any, admin: str) -> tuple[int, int]:
    """(entries, bytes) of the parked runs' `run` invocations (still `running` until the
    invoker's inactivity timeout suspends them, a minute by default): journal and state entries.
    A column whose SUM is NULL is left out of the answer's row."""
    def query(sql: str) -> dict[str, Any]:
        answer = http.post(f"{admin}/query", json={"query": sql}, headers={"accept": "application/json"})
        if answer.status_code >= 300:
            raise RuntimeError(f"introspection query failed: {answer.status_code} {answer.text[:300]}")
        return dict(answer.json()["rows"][0])

    journal = query("SELECT COUNT(*) AS n, SUM(j.raw_length) AS b FROM sys_journal j JOIN sys_invocation i "
                    "ON j.id = i.id WHERE i.target_service_name = 'seed' AND i.target_handler_name = 'run' "
                    "AND i.target_service_key LIKE 't-%'")
    state = query("SELECT COUNT(*) AS n, SUM(key_length + value_length) AS b FROM state "
                  "WHERE service_name = 'seed' AND service_key LIKE 't-%'")
    return (int(journal.get("n") or 0) + int(state.get("n") or 0),
            int(journal.get("b") or 0) + int(state.get("b") or 0))
