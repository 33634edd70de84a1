"""The run's header in the results JSON: the machine, its disk's fsync latency, the versions."""

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import dist


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
                "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres", "psycopg", "dbos",
                "restate-sdk"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    out["redis-server"] = redis_server_version()
    return out
